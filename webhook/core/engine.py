"""``decide``: the pure decision core shared by the webhook and the offline ``mutate`` command.

classify (scope, class, mode) -> check (reachability of reserved nodes) -> plan (JSON patch).
No I/O: everything it needs is passed in, so what CI dry-runs is exactly what the cluster does.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, cast, get_args

from webhook.core import lending, pods, scheduling
from webhook.core.assessment import Assessment, class_hint, start_assessment
from webhook.core.checks import (
    check_create,
    check_direct_access,
    check_lent_claims,
    check_reserved_devices,
    check_update,
    stored_borrower,
)
from webhook.core.decision import (
    NO_CLAIMS,
    NO_DEVICES,
    ClaimFacts,
    Decision,
    DeviceFacts,
    NamespaceFacts,
    NodeFacts,
    Violation,
)
from webhook.core.placement import plan, plan_device_resources
from webhook.core.placement import records_only as records_only
from webhook.core.policy import Mode, Policy, PolicySpec, route_catalogue, route_matcher
from webhook.core.rules import AMD_OPERATOR_TAINT_KEYS as AMD_OPERATOR_TAINT_KEYS
from webhook.core.rules import BORROWER_PREFERENCE_WEIGHT as BORROWER_PREFERENCE_WEIGHT
from webhook.core.rules import CLAIM_UNRESOLVED as CLAIM_UNRESOLVED
from webhook.core.rules import CLASS_ANNOTATION as CLASS_ANNOTATION
from webhook.core.rules import DENY_CLASS as DENY_CLASS
from webhook.core.rules import DENY_DIRECT_ACCESS as DENY_DIRECT_ACCESS
from webhook.core.rules import DENY_EPHEMERAL as DENY_EPHEMERAL
from webhook.core.rules import DENY_NODE_AFFINITY as DENY_NODE_AFFINITY
from webhook.core.rules import DENY_NODE_NAME as DENY_NODE_NAME
from webhook.core.rules import DENY_NODE_SELECTOR as DENY_NODE_SELECTOR
from webhook.core.rules import DENY_RESERVED_DEVICES as DENY_RESERVED_DEVICES
from webhook.core.rules import DENY_RULES as DENY_RULES
from webhook.core.rules import DENY_TOLERATION as DENY_TOLERATION
from webhook.core.rules import EPHEMERAL_CONTAINERS as EPHEMERAL_CONTAINERS
from webhook.core.rules import HOSTNAME_KEY as HOSTNAME_KEY
from webhook.core.rules import KFD_MOUNT as KFD_MOUNT
from webhook.core.rules import KFD_TOPOLOGY_PATH as KFD_TOPOLOGY_PATH
from webhook.core.rules import KFD_VOLUME as KFD_VOLUME
from webhook.core.rules import KFD_VOLUME_NAME as KFD_VOLUME_NAME
from webhook.core.rules import LABELS_UNKNOWN as LABELS_UNKNOWN
from webhook.core.rules import MIRROR_ANNOTATION as MIRROR_ANNOTATION
from webhook.core.rules import MUTATIONS_ANNOTATION as MUTATIONS_ANNOTATION
from webhook.core.rules import PLACED_LABEL as PLACED_LABEL
from webhook.core.rules import PREFERRED as PREFERRED
from webhook.core.rules import PSS_ENFORCE_LABEL as PSS_ENFORCE_LABEL
from webhook.core.rules import RULE_CHECKED as RULE_CHECKED
from webhook.core.rules import RULE_COMPLIANT as RULE_COMPLIANT
from webhook.core.rules import RULE_DELETING as RULE_DELETING
from webhook.core.rules import RULE_EXCLUDED as RULE_EXCLUDED
from webhook.core.rules import RULE_MALFORMED as RULE_MALFORMED
from webhook.core.rules import RULE_MIRROR as RULE_MIRROR
from webhook.core.rules import RULE_MUTATED as RULE_MUTATED
from webhook.core.rules import RULE_NOT_GPU as RULE_NOT_GPU
from webhook.core.rules import RULE_OPERATION as RULE_OPERATION

_MODES: frozenset[str] = frozenset(get_args(Mode))


def decide(
    *,
    operation: str,
    pod: Any,
    old_pod: Any = None,
    namespace: NamespaceFacts,
    nodes: NodeFacts,
    policy: Policy,
    claims: ClaimFacts = NO_CLAIMS,
    devices: DeviceFacts = NO_DEVICES,
    sub_resource: str = "",
) -> Decision:
    """Decide what to do with one pod. Pure; never raises for any input.

    ``claims`` resolves the pod's Dynamic Resource Allocation claims (default: none resolvable, so a
    pod that references a claim counts as a GPU pod); ``devices`` is what the cluster's DeviceClasses
    add to the GPU routes. ``sub_resource`` ``ephemeralcontainers``: an UPDATE adding debug containers
    (checked, never patched); any other subresource is not the engine's."""
    spec = policy.spec
    mode, mode_warnings = namespace_mode(spec, namespace)
    if operation not in ("CREATE", "UPDATE"):
        return _allow(RULE_OPERATION, f"{operation} is not checked", mode)
    if namespace.name in spec.excluded_namespaces:
        return _allow(RULE_EXCLUDED, f"namespace {namespace.name} is excluded by the policy", mode)
    matcher = route_matcher_for(policy, devices)
    try:
        if sub_resource:
            if sub_resource != EPHEMERAL_CONTAINERS or operation != "UPDATE":
                return _allow(RULE_OPERATION, f"{operation} of pods/{sub_resource} is not checked", mode)
            return _decide_ephemeral(pod, old_pod, namespace, nodes, policy, matcher, mode, mode_warnings)
        return _decide_pod(
            operation, pod, old_pod, namespace, nodes, policy, claims, devices, matcher, mode, mode_warnings
        )
    except pods.MalformedPod as err:
        return Decision(
            allowed=False,
            rule=RULE_MALFORMED,
            message=f"the pod cannot be checked: {err}",
            mode=mode,
            code=400,
            violations=(Violation(RULE_MALFORMED, err.field, str(err)),),
        )


def route_matcher_for(policy: Policy, devices: DeviceFacts) -> pods.RouteMatcher:
    """The policy's catalogue of GPU routes with what the cluster's DeviceClasses add to it. Most
    clusters (and every review without a DeviceClass watch) add nothing: no cache lookup then."""
    if not devices.gpu_classes and not devices.extended_resources:
        return policy.routes
    return _cluster_route_matcher(policy, devices)


@lru_cache(maxsize=64)
def _cluster_route_matcher(policy: Policy, devices: DeviceFacts) -> pods.RouteMatcher:
    extra = sorted(devices.extended_resources) + [
        pods.DEVICE_CLASS_RESOURCE_PREFIX + name for name in sorted(devices.gpu_classes)
    ]
    return route_matcher(route_catalogue(policy.spec, extra))


def _allow(rule: str, message: str, mode: Mode) -> Decision:
    return Decision(allowed=True, rule=rule, message=message, mode=mode)


def namespace_mode(spec: PolicySpec, namespace: NamespaceFacts) -> tuple[Mode, list[str]]:
    if namespace.labels is None:
        return spec.mode, []
    value = namespace.labels.get(spec.labels.namespace_mode)
    if value is None:
        return spec.mode, []
    if value in _MODES:
        return cast(Mode, value), []
    return spec.mode, [
        f"namespace label {spec.labels.namespace_mode}={value!r} is not enforce, warn or audit; "
        f"using the policy's mode {spec.mode}"
    ]


def _decide_pod(
    operation: str,
    pod: Any,
    old_pod: Any,
    namespace: NamespaceFacts,
    nodes: NodeFacts,
    policy: Policy,
    claims: ClaimFacts,
    devices: DeviceFacts,
    matcher: pods.RouteMatcher,
    mode: Mode,
    mode_warnings: list[str],
) -> Decision:
    pod = pods.mapping(pod, "the pod")
    metadata = pods.mapping(pod.get("metadata"), "metadata")
    raw_spec = pod.get("spec")
    spec = pods.mapping(raw_spec, "spec")
    annotations = pods.string_map(metadata.get("annotations"), "metadata.annotations")
    labels = pods.string_map(metadata.get("labels"), "metadata.labels")
    if operation == "UPDATE" and metadata.get("deletionTimestamp"):
        return _allow(RULE_DELETING, "the pod is terminating", mode)
    mirror = MIRROR_ANNOTATION in annotations
    gpu, routes = pods.gpu_routes(spec, matcher)
    raw_claims = spec.get("resourceClaims")
    if raw_claims is not None and policy.spec.scope.routes.resource_claims:
        # Dynamic Resource Allocation: GPUs reached through claims
        gpu_claim_names = _gpu_claims(pods.resource_claims(raw_claims), claims, devices, policy, mode_warnings)
        if gpu_claim_names:
            routes.append(pods.Route(pods.ROUTE_CLAIM, "spec.resourceClaims"))
            gpu = pods.claim_containers(spec, gpu_claim_names, gpu)
    if not routes and not policy.spec.scope.all_pods:
        return _allow(RULE_NOT_GPU, "the pod reaches no GPU by any route the policy knows", mode)

    if raw_spec is None:
        # Only reachable with scope.allPods: every patch below needs /spec to exist.
        raise pods.MalformedPod("spec", "an object")
    review = start_assessment(pod, spec, metadata, policy, namespace, nodes, mode_warnings, routes)
    if operation == "UPDATE":
        old = pods.mapping(old_pod, "oldObject")
        old_metadata = pods.mapping(old.get("metadata"), "oldObject.metadata")
        old_labels = pods.string_map(old_metadata.get("labels"), "oldObject.metadata.labels")
        class_name = _classify(review, labels, old_labels)
        cls = policy.spec.classes[class_name]
        check_update(review, cls, class_name, old, stored_borrower(review, cls))
        return _finish(review, mode, class_name, RULE_CHECKED)
    class_name = _classify(review, labels, None)
    cls = policy.spec.classes[class_name]
    borrower = switching = False
    if cls.placement == "unreserved" and policy.spec.lending.enabled:
        borrower, why_not = lending.borrow_choice(policy, namespace.name, namespace.labels, labels)
        if why_not:
            review.warnings.append(why_not)
        if borrower and lending.placed_without_lending(policy, labels, spec):
            # A switch on, the apiserver's objects not yet re-rendered: a borrower's toleration would be
            # denied by their backstop. Placed as training (shared capacity) instead.
            borrower = False
            review.warnings.append(
                "lending is on in the webhook's policy but the apiserver's placement policy placed the pod as a "
                "non-borrower (its manifests still have lending off): the pod runs on shared capacity only"
            )
    elif cls.placement == "unreserved":
        # A switch off, the apiserver's objects not yet re-rendered: what their placement policy wrote for a
        # borrower is not denied; the training placement keeps the pod off the reserved nodes.
        switching = lending.placed_as_borrower_before(policy, namespace.name, namespace.labels, spec)
    if cls.direct_gpu_access == "deny":
        review.direct.extend(pods.unscanned_runtime_routes(routes, matcher))
    check_direct_access(review, cls, class_name)
    check_create(review, cls, class_name, borrower, switching)
    if devices.devices_reserved:
        check_reserved_devices(review, cls, class_name, claims)
    if raw_claims is not None:
        check_lent_claims(review, claims)
    if mirror:
        # The kubelet owns mirror pods (a changed one no longer matches its static pod): never
        # mutate them. Anyone can set the annotation, so they are still checked.
        return _finish(review, mode, class_name, RULE_MIRROR)
    if devices.devices_reserved:
        plan_device_resources(review, cls, devices)
    plan(review, cls, class_name, gpu, labels, borrower)
    return _finish(review, mode, class_name, RULE_COMPLIANT)


def _decide_ephemeral(
    pod: Any,
    old_pod: Any,
    namespace: NamespaceFacts,
    nodes: NodeFacts,
    policy: Policy,
    matcher: pods.RouteMatcher,
    mode: Mode,
    mode_warnings: list[str],
) -> Decision:
    """``kubectl debug`` adds containers to a pod that is already placed: one that reaches GPUs
    (privileged, the AMD runtime's variables) gets the GPUs of whatever node the pod is on, so a pod of a
    class kept off the reserved nodes may not get one there. Checked, never patched: the subresource
    takes nothing but ephemeralContainers."""
    pod = pods.mapping(pod, "the pod")
    old = pods.mapping(old_pod, "oldObject")
    metadata = pods.mapping(pod.get("metadata"), "metadata")
    spec = pods.mapping(pod.get("spec"), "spec")
    old_spec = pods.mapping(old.get("spec"), "oldObject.spec")
    labels = pods.string_map(metadata.get("labels"), "metadata.labels")
    before = {
        pods.string(body.get("name"), f"oldObject.spec.{pods.EPHEMERAL}[{index}].name")
        for index, body in pods.objects(old_spec.get(pods.EPHEMERAL), f"oldObject.spec.{pods.EPHEMERAL}")
    }
    added: list[pods.Route] = []
    for container in pods.containers(spec, ephemeral=True):
        name = pods.string(container.body.get("name"), f"{container.field}.name")
        if container.list_name == pods.EPHEMERAL and name not in before:
            added.extend(pods.container_routes(container, matcher))
    if not added:
        return _allow(RULE_NOT_GPU, "no added ephemeral container reaches a GPU", mode)
    review = start_assessment(pod, spec, metadata, policy, namespace, nodes, mode_warnings, added)
    old_labels = pods.string_map(pods.mapping(old.get("metadata"), "oldObject.metadata").get("labels"), "labels")
    class_name = _classify(review, labels, old_labels)
    cls = policy.spec.classes[class_name]
    if cls.direct_gpu_access == "deny":
        check_direct_access(review, cls, class_name)
    if cls.placement == "unreserved":
        reach = _ephemeral_reach(review, spec)
        if reach:
            route = added[0]
            key, value = review.reserved.key, review.reserved.value
            review.violations.append(
                Violation(
                    DENY_EPHEMERAL,
                    route.field,
                    f"{class_name} pods may not use the GPUs of the reserved nodes ({key}={value}): {route.field} "
                    f"({route.describe()}) would be added to a pod that {reach}; debug with an unprivileged "
                    "ephemeral container, or from a copy of the pod (kubectl debug --copy-to)",
                )
            )
    return _finish(review, mode, class_name, RULE_CHECKED)


def _ephemeral_reach(review: Assessment, spec: dict[str, Any]) -> str:
    """How the pod is (or may get) on a reserved node, in words; '' when it is kept off them."""
    reserved = review.reserved
    node_name = pods.string(spec.get("nodeName"), "spec.nodeName")
    if node_name and reserved.node_names is not None:
        return f"runs on the reserved node {node_name}" if node_name in reserved.node_names else ""
    if scheduling.affinity_excludes_reserved(scheduling.required_terms(spec), reserved):
        return ""
    if node_name:
        return f"runs on {node_name}, which could not be checked (reserved nodes unknown, no cluster connection)"
    return "is not scheduled yet and is not kept off the reserved nodes by its node affinity"


def _gpu_claims(
    refs: list[pods.ClaimRef], claims: ClaimFacts, devices: DeviceFacts, policy: Policy, warnings: list[str]
) -> set[str]:
    """The names (as containers use them) of the pod's claims that reach a GPU device class. A claim that
    cannot be resolved counts as one: failing toward isolation is the safe side."""
    names: set[str] = set()
    for ref in refs:
        if ref.template_name:
            kind, target, classes = "ResourceClaimTemplate", ref.template_name, claims.templates.get(ref.template_name)
        elif ref.claim_name:
            kind, target, classes = "ResourceClaim", ref.claim_name, claims.claims.get(ref.claim_name)
        else:
            warnings.append(
                f"{ref.field} ({ref.name}) names neither a ResourceClaim nor a ResourceClaimTemplate; "
                "counted as a GPU request"
            )
            names.add(ref.name)
            continue
        if classes is None:
            warnings.append(
                f"{ref.field} ({ref.name}): {kind} {target} {CLAIM_UNRESOLVED}; "
                "counted as a GPU request: the pod is placed and checked as a GPU pod"
            )
            names.add(ref.name)
        elif any(policy.gpu_device_classes(name) or name in devices.gpu_classes for name in classes):
            names.add(ref.name)
    return names


def _classify(review: Assessment, labels: Mapping[str, str], old_labels: Mapping[str, str] | None) -> str:
    spec = review.policy.spec
    namespace = review.namespace
    classes = review.policy.namespace_classes(namespace.name, namespace.labels)
    if namespace.labels is None:
        review.warnings.append(_labels_unknown(namespace.name, classes.source))
    requested = labels.get(spec.labels.pod_class)
    if requested is None or requested == classes.default:
        return classes.default
    if requested in classes.allowed:
        return requested
    if old_labels is not None and old_labels.get(spec.labels.pod_class) == requested:
        # An UPDATE that does not introduce the request: the pod was admitted before (audit or
        # warn mode, or before a relabel); blocking it would wedge its finalizers and status.
        return classes.default
    hint = class_hint(spec, requested)
    known = "" if requested in spec.classes else " (no such class in the policy)"
    review.violations.append(
        Violation(
            DENY_CLASS,
            f"metadata.labels[{spec.labels.pod_class}]",
            f"the pod asks for class {requested!r}{known} but namespace {namespace.name} allows only "
            f"{', '.join(classes.allowed)} ({classes.source}); remove the label{hint}",
        )
    )
    return classes.default


@lru_cache(maxsize=1024)
def _labels_unknown(namespace: str, source: str) -> str:
    # The same warning for every pod of a namespace while there is no cluster connection.
    return (
        f"namespace {namespace}{LABELS_UNKNOWN}{source}; label rules, the mode label and Pod Security labels "
        "were not checked"
    )


def _finish(review: Assessment, mode: Mode, class_name: str, quiet_rule: str) -> Decision:
    """The Decision in ``mode``. ``quiet_rule`` names an outcome with neither violation nor patch."""
    violations = tuple(review.violations)
    operations = tuple(review.operations)
    warnings = list(review.warnings)
    audit = {"class": class_name, "mode": mode}
    if violations:
        audit["violations"] = ",".join(sorted({v.rule for v in violations}))
    denial = "; ".join(v.message for v in violations)
    rule = violations[0].rule if violations else (RULE_MUTATED if operations else quiet_rule)
    allowed, code, patch_out = True, 200, operations
    if mode == "audit":
        audit["would-patch-operations"] = str(len(operations))
        if violations:
            audit["would-deny"] = denial[:1000]
        message = "audit mode: nothing changed" + (f"; would deny: {denial}" if violations else "")
        patch_out = ()
    elif violations and mode == "enforce":
        audit["decision"] = "denied"
        allowed, code, message, patch_out = False, 403, denial, ()
    else:
        if violations:  # warn mode: the denial becomes a warning, the pod is still mutated
            warnings = [f"would be denied in enforce mode: {v.message}" for v in violations] + warnings
        audit["decision"] = "patched" if operations else "allowed"
        if operations:
            audit["patch-operations"] = str(len(operations))
            message = f"class {class_name}: " + (", ".join(review.done) or "annotated")
        else:
            message = f"class {class_name}: compliant"
    return Decision(
        allowed=allowed,
        rule=rule,
        message=message,
        mode=mode,
        workload_class=class_name,
        patch=patch_out,
        warnings=tuple(warnings),
        audit_annotations=audit,
        violations=violations,
        code=code,
    )
