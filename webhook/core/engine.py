"""``decide``: the pure decision core shared by the webhook and the offline ``mutate`` command.

classify (scope, class, mode) -> check (reachability of reserved nodes) -> plan (JSON patch).
No I/O: everything it needs is passed in, so what CI dry-runs is exactly what the cluster does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, cast, get_args

from webhook.core import lending, patch, pods, scheduling
from webhook.core.claims import RESERVED_DEVICE_TAINT_KEY
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
from webhook.core.policy import Mode, Policy, PolicySpec, Taint, WorkloadClass, route_catalogue, route_matcher

CLASS_ANNOTATION = "rocm-isolation.io/class"
MUTATIONS_ANNOTATION = "rocm-isolation.io/mutations"
# The class a pod was placed as, by the webhook or the placement MutatingAdmissionPolicy: a label, so that
# the policy's binding skips, in Go, a pod already placed (in the apiserver's second pass of the mutating
# chain it would otherwise evaluate its match condition again). Nothing trusts it: a pod created with it
# is still placed by the webhook and judged by the backstop; it is left out of topology spread selectors.
PLACED_LABEL = "rocm-isolation.io/placed"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PSS_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
KFD_TOPOLOGY_PATH = "/sys/class/kfd/kfd/topology/nodes"
KFD_VOLUME_NAME = "rocm-kfd-topology"
KFD_VOLUME = {"name": KFD_VOLUME_NAME, "hostPath": {"path": KFD_TOPOLOGY_PATH, "type": "Directory"}}
KFD_MOUNT = {"name": KFD_VOLUME_NAME, "mountPath": KFD_TOPOLOGY_PATH, "readOnly": True}
# The AMD GPU operator's own taints: warn when a pod tolerates them, never add them.
AMD_OPERATOR_TAINT_KEYS = ("amd-gpu-unhealthy", "amd-dcm")

# Stable rule identifiers (metrics labels, docs/policy.md).
RULE_MUTATED = "mutated"
RULE_COMPLIANT = "compliant"
RULE_CHECKED = "update-checked"
RULE_EXCLUDED = "excluded-namespace"
RULE_NOT_GPU = "not-gpu-pod"
RULE_MIRROR = "mirror-pod"
RULE_OPERATION = "operation-ignored"
RULE_DELETING = "pod-terminating"
RULE_MALFORMED = "malformed-pod"
DENY_NODE_NAME = "deny-node-name"
DENY_NODE_SELECTOR = "deny-node-selector"
DENY_NODE_AFFINITY = "deny-node-affinity"
DENY_TOLERATION = "deny-toleration"
DENY_CLASS = "deny-class-not-allowed"
DENY_DIRECT_ACCESS = "deny-direct-gpu-access"
DENY_EPHEMERAL = "deny-ephemeral-gpu-access"
DENY_RESERVED_DEVICES = "deny-reserved-devices"
DENY_RULES = (
    DENY_NODE_NAME, DENY_NODE_SELECTOR, DENY_NODE_AFFINITY, DENY_TOLERATION, DENY_CLASS, DENY_DIRECT_ACCESS,
    DENY_EPHEMERAL, DENY_RESERVED_DEVICES,
)  # fmt: skip
# Lending (webhook.core.lending): a borrower prefers shared nodes with this weight (the maximum).
BORROWER_PREFERENCE_WEIGHT = 100
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
HOSTNAME_KEY = "kubernetes.io/hostname"
# The one subresource the engine reads: kubectl debug adds containers to a running pod through it.
EPHEMERAL_CONTAINERS = "ephemeralcontainers"

_MODES: frozenset[str] = frozenset(get_args(Mode))
# Phrases of two warnings that the offline dry run recognises (it says them its own way): one source.
CLAIM_UNRESOLVED = "could not be resolved (not known to the webhook yet)"
LABELS_UNKNOWN = ": labels unknown (no cluster connection); class from "


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


@lru_cache(maxsize=64)
def _reserved(policy: Policy, node_names: frozenset[str] | None) -> scheduling.Reserved:
    key, value = policy.spec.reserved_nodes.label
    return scheduling.Reserved(key, value, node_names)


class _Review:
    """Working state of one decision."""

    __slots__ = (
        "direct", "done", "metadata", "namespace", "operations", "pod", "policy", "reserved", "spec", "terms",
        "tolerations", "violations", "warnings",
    )  # fmt: skip

    def __init__(
        self,
        *,
        pod: dict[str, Any],
        spec: dict[str, Any],
        metadata: dict[str, Any],
        policy: Policy,
        namespace: NamespaceFacts,
        reserved: scheduling.Reserved,
        warnings: list[str],
    ) -> None:
        self.pod: Final = pod
        self.spec: Final = spec
        self.metadata: Final = metadata
        self.policy: Final = policy
        self.namespace: Final = namespace
        self.reserved: Final = reserved
        self.warnings: Final = warnings
        self.operations: Final[list[dict[str, Any]]] = []
        self.done: Final[list[str]] = []
        self.violations: Final[list[Violation]] = []
        # Read once by the check (in the order its errors are reported), reused by the plan.
        self.terms: list[scheduling.Term] | None = None
        self.tolerations: list[tuple[int, dict[str, Any]]] = []
        # The routes by which the pod reaches GPUs without the device plugin or DRA (named in denials).
        self.direct: list[pods.Route] = []


def _start_review(
    pod: dict[str, Any],
    spec: dict[str, Any],
    metadata: dict[str, Any],
    policy: Policy,
    namespace: NamespaceFacts,
    nodes: NodeFacts,
    mode_warnings: list[str],
    routes: list[pods.Route],
) -> _Review:
    review = _Review(
        pod=pod,
        spec=spec,
        metadata=metadata,
        policy=policy,
        namespace=namespace,
        reserved=_reserved(policy, nodes.reserved_node_names),
        warnings=list(mode_warnings),
    )
    # The routes by which the pod reaches GPUs without the device plugin or DRA (named in denials).
    review.direct = [route for route in routes if route.direct]
    return review


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
    review = _start_review(pod, spec, metadata, policy, namespace, nodes, mode_warnings, routes)
    if operation == "UPDATE":
        old = pods.mapping(old_pod, "oldObject")
        old_metadata = pods.mapping(old.get("metadata"), "oldObject.metadata")
        old_labels = pods.string_map(old_metadata.get("labels"), "oldObject.metadata.labels")
        class_name = _classify(review, labels, old_labels)
        cls = policy.spec.classes[class_name]
        _check_update(review, cls, class_name, old, _stored_borrower(review, cls))
        return _finish(review, mode, class_name, RULE_CHECKED)
    class_name = _classify(review, labels, None)
    cls = policy.spec.classes[class_name]
    borrower = False
    if cls.placement == "unreserved" and policy.spec.lending.enabled:
        borrower, why_not = lending.borrow_choice(policy, namespace.name, namespace.labels, labels)
        if why_not:
            review.warnings.append(why_not)
    if cls.direct_gpu_access == "deny":
        review.direct.extend(pods.unscanned_runtime_routes(routes, matcher))
    _check_direct_access(review, cls, class_name)
    _check_create(review, cls, class_name, borrower)
    if devices.devices_reserved:
        _check_reserved_devices(review, cls, class_name, claims)
    if mirror:
        # The kubelet owns mirror pods (a changed one no longer matches its static pod): never
        # mutate them. Anyone can set the annotation, so they are still checked.
        return _finish(review, mode, class_name, RULE_MIRROR)
    if devices.devices_reserved:
        _plan_device_resources(review, cls, devices)
    _plan(review, cls, class_name, gpu, labels, borrower)
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
    review = _start_review(pod, spec, metadata, policy, namespace, nodes, mode_warnings, added)
    old_labels = pods.string_map(pods.mapping(old.get("metadata"), "oldObject.metadata").get("labels"), "labels")
    class_name = _classify(review, labels, old_labels)
    cls = policy.spec.classes[class_name]
    if cls.direct_gpu_access == "deny":
        _check_direct_access(review, cls, class_name)
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


def _ephemeral_reach(review: _Review, spec: dict[str, Any]) -> str:
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


def _classify(review: _Review, labels: Mapping[str, str], old_labels: Mapping[str, str] | None) -> str:
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
    hint = _class_hint(spec, requested)
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


def _class_hint(spec: PolicySpec, class_name: str) -> str:
    if class_name not in spec.classes:
        return ""
    return f", or run the pod in a namespace labelled {spec.labels.namespace_class}={class_name}"


@lru_cache(maxsize=64)
def _reserved_hint(policy: Policy) -> str:
    spec = policy.spec
    reserved = [name for name, cls in spec.classes.items() if cls.placement == "reserved"]
    if not reserved:
        return ""
    return f"; to use them, run the pod in a namespace labelled {spec.labels.namespace_class}={reserved[0]}"


def _denied(review: _Review, class_name: str, rule: str, where: str, what: str) -> None:
    key, value = review.reserved.key, review.reserved.value
    review.violations.append(
        Violation(
            rule,
            where,
            f"{class_name} pods may not use the reserved nodes ({key}={value}): {where} {what}"
            + _direct_note(review.direct)
            + _reserved_hint(review.policy),
        )
    )


def _direct_note(direct: list[pods.Route]) -> str:
    """Why a pod that asks for no GPU is a GPU pod: the route and the field (first one found)."""
    if not direct:
        return ""
    route = direct[0]
    return f" (a GPU pod through {route.field}: {route.describe()})"


def _check_direct_access(review: _Review, cls: WorkloadClass, class_name: str) -> None:
    """A container that takes GPUs itself bypasses the device plugin's and DRA's accounting: warned, or
    denied where the class says so."""
    for route in review.direct:
        if cls.direct_gpu_access == "deny":
            review.violations.append(
                Violation(
                    DENY_DIRECT_ACCESS,
                    route.field,
                    f"{class_name} pods may not reach GPUs directly: {route.field} ({route.describe()}); "
                    "request amd.com/gpu or a DRA claim instead",
                )
            )
        else:
            review.warnings.append(
                f"{route.field}: {route.describe()}, bypassing GPU accounting (the device plugin and DRA do not "
                f"count it); the pod is placed and checked as a {class_name} GPU pod"
            )


def _deny_node_selector(review: _Review, class_name: str) -> None:
    key, value = review.reserved.key, review.reserved.value
    _denied(review, class_name, DENY_NODE_SELECTOR, "spec.nodeSelector", f"selects {key}={value}")


def _deny_node_affinity(review: _Review, class_name: str) -> None:
    where = f"spec.affinity.nodeAffinity.{scheduling.REQUIRED}"
    _denied(review, class_name, DENY_NODE_AFFINITY, where, "selects reserved nodes in every term")


def _reserved_taint(review: _Review) -> Taint | None:
    return review.policy.spec.reserved_nodes.taint


def _tolerations(spec: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    found = pods.objects(spec.get("tolerations"), "spec.tolerations")
    for index, tol in found:
        if (
            type(tol.get("key")) in _STRING_OR_NULL
            and type(tol.get("operator")) in _STRING_OR_NULL
            and type(tol.get("value")) in _STRING_OR_NULL
            and type(tol.get("effect")) in _STRING_OR_NULL
        ):
            continue
        for name in ("key", "operator", "value", "effect"):
            pods.string(tol.get(name), f"spec.tolerations[{index}].{name}")
    return found


_STRING_OR_NULL = (str, type(None))


def _check_create(review: _Review, cls: WorkloadClass, class_name: str, borrower: bool = False) -> None:
    """Reachability of reserved nodes for a class that may not use them (a borrower may: lending)."""
    spec = review.spec
    reserved = review.reserved
    node_name = pods.string(spec.get("nodeName"), "spec.nodeName")
    node_selector = pods.string_map(spec.get("nodeSelector"), "spec.nodeSelector")
    terms = review.terms = scheduling.required_terms(spec)
    tolerations = review.tolerations = _tolerations(spec)
    _warn_operator_taints(review, tolerations)
    if cls.placement != "reserved" and review.policy.spec.lending.enabled:
        _check_no_borrowers(review, class_name, tolerations)
    if cls.placement != "unreserved" or borrower:
        known = reserved.node_names
        if cls.placement == "reserved" and node_name and known is not None and node_name not in known:
            review.warnings.append(
                f"spec.nodeName {node_name} is not a reserved node: the kubelet will reject the pod "
                f"because of the required {reserved.key}={reserved.value} node affinity"
            )
        return
    if node_name:
        if reserved.node_names is None:
            review.warnings.append(
                f"spec.nodeName {node_name} could not be checked (reserved nodes unknown, no cluster "
                f"connection); the added {reserved.key} NotIn affinity makes the kubelet reject it on a reserved node"
            )
        elif node_name in reserved.node_names:
            _denied(review, class_name, DENY_NODE_NAME, "spec.nodeName", f"is {node_name}, a reserved node")
    if node_selector.get(reserved.key) == reserved.value:
        _deny_node_selector(review, class_name)
    if scheduling.affinity_only_reserved(terms, reserved):
        _deny_node_affinity(review, class_name)
    elif terms and reserved.node_names is None and any(t.fields for t in terms):
        review.warnings.append(
            "matchFields on node names could not be checked against the reserved nodes (no cluster connection)"
        )
    _check_tolerations(review, class_name, tolerations)


def _check_tolerations(
    review: _Review, class_name: str, tolerations: list[tuple[int, dict[str, Any]]], old: Any = None
) -> None:
    taint = _reserved_taint(review)
    if taint is None:
        return
    previous = old or []
    for index, tol in tolerations:
        if scheduling.tolerates(tol, taint.key, taint.value, taint.effect) and tol not in previous:
            what = (
                "tolerates every taint" if not tol.get("key") else f"tolerates {taint.key}={taint.value}:{taint.effect}"
            )
            _denied(review, class_name, DENY_TOLERATION, f"spec.tolerations[{index}]", what)


def _check_no_borrowers(
    review: _Review, class_name: str, tolerations: list[tuple[int, dict[str, Any]]], old: Any = None
) -> None:
    """Lending on: the taint of reserved nodes that take no new borrowers (headroom, pausing) is for
    inference only; any other pod tolerating it (borrowers included) is denied."""
    taint = review.policy.spec.lending.no_borrowers_taint
    previous = old or []
    for index, tol in tolerations:
        if scheduling.tolerates(tol, taint.key, taint.value, taint.effect) and tol not in previous:
            what = (
                "tolerates every taint" if not tol.get("key") else f"tolerates {taint.key}={taint.value}:{taint.effect}"
            )
            review.violations.append(
                # The rule of every forbidden toleration (lending on: the no-borrowers taint is inference's).
                Violation(
                    DENY_TOLERATION,
                    f"spec.tolerations[{index}]",
                    f"{class_name} pods may not tolerate the taint of reserved nodes that take no borrowers "
                    f"({taint.key}={taint.value}:{taint.effect}): spec.tolerations[{index}] {what}; remove that toleration",
                )
            )


def _stored_borrower(review: _Review, cls: WorkloadClass) -> bool:
    """An UPDATE of a pod that is a borrower (``lending.is_borrower``) in a namespace that may borrow."""
    if cls.placement != "unreserved" or not review.policy.spec.lending.enabled:
        return False
    namespace = review.namespace
    return lending.is_borrower(review.pod, review.policy) and lending.namespace_may_borrow(
        review.policy, namespace.name, namespace.labels
    )


def _warn_operator_taints(review: _Review, tolerations: list[tuple[int, dict[str, Any]]]) -> None:
    for index, tol in tolerations:
        if tol.get("key") in AMD_OPERATOR_TAINT_KEYS:
            review.warnings.append(
                f"spec.tolerations[{index}] tolerates {tol.get('key')}: the AMD GPU operator uses that taint to keep "
                "pods off unhealthy or re-partitioning GPUs"
            )


def _check_update(
    review: _Review, cls: WorkloadClass, class_name: str, old: dict[str, Any], borrower: bool = False
) -> None:
    """On UPDATE only what the update introduces is checked: rejecting a pod that was admitted
    before the policy would block its finalizers and status changes. A borrower (lending) may reach
    reserved nodes; no pod but inference may newly tolerate the no-borrowers taint."""
    if cls.placement != "reserved" and review.policy.spec.lending.enabled:
        old_spec = pods.mapping(old.get("spec"), "oldObject.spec")
        previous = [tol for _, tol in pods.objects(old_spec.get("tolerations"), "oldObject.spec.tolerations")]
        _check_no_borrowers(review, class_name, _tolerations(review.spec), previous)
    if cls.placement != "unreserved" or borrower:
        return
    old_spec = pods.mapping(old.get("spec"), "oldObject.spec")
    reserved = review.reserved
    old_tolerations = [tol for _, tol in pods.objects(old_spec.get("tolerations"), "oldObject.spec.tolerations")]
    review.tolerations = _tolerations(review.spec)
    _check_tolerations(review, class_name, review.tolerations, old_tolerations)
    selector = pods.string_map(review.spec.get("nodeSelector"), "spec.nodeSelector")
    old_selector = pods.string_map(old_spec.get("nodeSelector"), "oldObject.spec.nodeSelector")
    if selector.get(reserved.key) == reserved.value and old_selector.get(reserved.key) != reserved.value:
        _deny_node_selector(review, class_name)
    review.terms = scheduling.required_terms(review.spec)
    if scheduling.affinity_only_reserved(review.terms, reserved) and not scheduling.affinity_only_reserved(
        scheduling.required_terms(old_spec), reserved
    ):
        _deny_node_affinity(review, class_name)


# --- device-level reservation (webhook.core.device_claims steers the claims themselves) --------------


def _reserved_resource(policy: Policy) -> str:
    return pods.DEVICE_CLASS_RESOURCE_PREFIX + policy.spec.reserved_devices.reserved_class_name


def _check_reserved_devices(review: _Review, cls: WorkloadClass, class_name: str, claims: ClaimFacts) -> None:
    """A pod of a class other than inference asks for the reserved DeviceClass by name: through its implicit
    extended resource, or through a claim of the namespace that names it (the backstop cannot read claims;
    the claim itself is only admitted in a namespace that also allows the inference class)."""
    if cls.placement == "reserved":
        return
    devices = review.policy.spec.reserved_devices
    reserved = _reserved_resource(review.policy)
    hint = _reserved_hint(review.policy)
    for container in pods.containers(review.spec):
        for field, values in zip(("requests", "limits"), pods.resource_maps(container), strict=True):
            if values is not None and reserved in values:
                where = f"{container.field}.resources.{field}[{reserved}]"
                review.violations.append(
                    Violation(
                        DENY_RESERVED_DEVICES,
                        where,
                        f"{class_name} pods may not use the GPUs reserved for inference: {where} asks for the "
                        f"reserved DeviceClass {devices.reserved_class_name}; request {devices.extended_resource_name or pods.DEVICE_CLASS_RESOURCE_PREFIX + devices.shared_class_name} instead{hint}",
                    )
                )
    for ref in pods.resource_claims(review.spec.get("resourceClaims")):
        if ref.template_name:
            kind, target, classes = "ResourceClaimTemplate", ref.template_name, claims.templates.get(ref.template_name)
        else:
            kind, target, classes = "ResourceClaim", ref.claim_name, claims.claims.get(ref.claim_name or "")
        if classes is not None and devices.reserved_class_name in classes:
            review.violations.append(
                Violation(
                    DENY_RESERVED_DEVICES,
                    ref.field,
                    f"{class_name} pods may not use the GPUs reserved for inference: {ref.field} ({ref.name}) names "
                    f"{kind} {target}, which asks for the reserved DeviceClass {devices.reserved_class_name}; use a "
                    f"claim of {devices.shared_class_name}{hint}",
                )
            )


# A whole-number resource quantity as the apiserver writes one (extended resources must be whole numbers).
_WHOLE_QUANTITY: Final = re.compile(r"^([0-9]{1,18})(?:(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)|[eE]\+?([0-9]{1,2}))?$")
_QUANTITY_FACTORS: Final = {
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def _whole_quantity(value: Any) -> int | None:
    """``value`` as a whole number when it is one written as a Kubernetes quantity (``2``, ``1k``, ``1e3``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = _WHOLE_QUANTITY.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    number, suffix, exponent = match.groups()
    factor = _QUANTITY_FACTORS[suffix] if suffix else 10 ** int(exponent) if exponent else 1
    return int(number) * factor


def _pinned_to_whole_reserved_nodes(review: _Review) -> bool:
    key, value = review.reserved.key, review.reserved.value
    selector = review.spec.get("nodeSelector")
    if type(selector) is dict and selector.get(key) == value:
        return True
    return scheduling.affinity_only_reserved(review.terms, review.reserved)


def _plan_device_resources(review: _Review, cls: WorkloadClass, devices: DeviceFacts) -> None:
    """DRA extended resources steered to the class's DeviceClass: an inference pod's ``amd.com/gpu`` (the
    shared class's extendedResourceName), any class's ``deviceclass.resource.kubernetes.io/<GPU class>``
    and any other GPU class's extendedResourceName (the policy's ``extendedResourceNames``, the cluster's
    GPU DeviceClasses') become the reserved class's implicit name for inference, the shared class's for
    every other class. An extended resource maps to exactly one DeviceClass, with no fallback: "reserved
    first" cannot be said for it, so inference gets reserved devices only
    (``reservedDevices.inferenceSpillover`` is for claims), unless the pod pins itself to the whole
    reserved nodes (device-plugin nodes in a mixed cluster). Several such names in one map (or one next
    to the target name) are summed into the target name; quantities that are not whole numbers (which
    the apiserver refuses for extended resources) are then left as they are.

    When DeviceTaintRules hold the reservation (``devices.devices_tainted``), the reserved devices are
    tainted and the scheduler's claim for an extended resource carries no tolerations: the reserved
    class's implicit name could never be served there (the pod would stay Pending). An inference pod is
    then steered as every other class (its ``amd.com/gpu`` kept, other GPU names to the shared class) and
    warned that it gets shared GPUs, and how to get reserved ones (a claim of the reserved class, which
    the webhook gives the toleration)."""
    policy = review.policy
    settings = policy.spec.reserved_devices
    prefix = pods.DEVICE_CLASS_RESOURCE_PREFIX
    inference = cls.placement == "reserved"
    tainted = inference and devices.devices_tainted
    to_reserved = inference and not tainted
    target = prefix + (settings.reserved_class_name if to_reserved else settings.shared_class_name)
    own = (prefix + settings.reserved_class_name, prefix + settings.shared_class_name)
    other_names = (frozenset(policy.spec.scope.extended_resource_names) | devices.extended_resources) - {
        settings.extended_resource_name
    }
    # An inference pod that pins itself to the whole reserved nodes (nodeSelector, or required affinity
    # whose every term selects only them) keeps amd.com/gpu: in a mixed cluster those are device-plugin
    # nodes, where the reserved class's DRA-only name could never be served.
    pinned = inference and _pinned_to_whole_reserved_nodes(review)
    keep_extended = tainted or pinned

    def steered(key: str) -> bool:
        if key in own:
            return False
        if key.startswith(prefix):
            name = key[len(prefix) :]
            return bool(policy.gpu_device_classes(name)) or name in devices.gpu_classes
        return (inference and not keep_extended and key == settings.extended_resource_name) or key in other_names

    changed = False
    # Tainted reservation: the GPU names of an inference pod that get shared GPUs (said in a warning).
    shared_only: list[str] = []
    for container in pods.containers(review.spec):
        for field, values in zip(("requests", "limits"), pods.resource_maps(container), strict=True):
            if values is None:
                continue
            if tainted and not pinned:
                for key in values:
                    gpu = key == settings.extended_resource_name or key == own[0] or steered(key)
                    if gpu and key not in shared_only:
                        shared_only.append(key)
            keys = [key for key in values if steered(key)]
            if not keys:
                continue
            merged = [target, *keys] if target in values else keys
            quantity: Any = values[keys[0]]
            if len(merged) > 1:
                amounts = [_whole_quantity(values[key]) for key in merged]
                if None in amounts:
                    continue
                quantity = str(sum(amount or 0 for amount in amounts))
            path = f"{container.pointer}/resources/{field}"
            review.operations.extend(patch.remove(path + "/" + patch.escape(key)) for key in keys)
            review.operations.append(patch.add(path + "/" + patch.escape(target), quantity))
            changed = True
    if changed:
        review.done.append("device-class")
    if shared_only:
        review.warnings.append(_tainted_reservation_warning(settings.reserved_class_name, shared_only, own[0]))


def _tainted_reservation_warning(reserved_class: str, names: list[str], reserved_name: str) -> str:
    said = ", ".join(sorted(names))
    stuck = (
        f"; {reserved_name} can only get an untainted device, none on the nodes whose reserved GPUs are tainted"
        if reserved_name in names
        else ""
    )
    return (
        f"device-level reservation by DeviceTaintRules: this inference pod's {said} cannot get the reserved "
        f"GPUs (tainted {RESERVED_DEVICE_TAINT_KEY}; the scheduler's claim for an extended resource carries no "
        f"tolerations), only shared ones{stuck}; for reserved GPUs, name a ResourceClaimTemplate of DeviceClass "
        f"{reserved_class} in spec.resourceClaims (the webhook adds the toleration)"
    )


def _plan(
    review: _Review,
    cls: WorkloadClass,
    class_name: str,
    gpu: list[pods.ContainerRef],
    labels: Mapping[str, str],
    borrower: bool = False,
) -> None:
    if borrower:
        plan = borrower_plan(review.policy, class_name)
        _plan_borrower_affinity(review, plan)
    else:
        plan = _class_plan(review.policy, class_name)
        _plan_affinity(review, plan)
    _plan_tolerations(review, plan)
    _plan_priority(review, plan)
    _plan_grace(review, plan)
    _plan_spread(review, cls, labels)
    _plan_env(review, plan, gpu)
    _plan_kfd_mount(review, cls, gpu)
    # The class annotation and the placed label land even when nothing else changes; the list of what
    # was done only when something was (so that a reinvocation on our own output yields no operation).
    entries = {CLASS_ANNOTATION: class_name}
    if review.operations:
        recorded = _recorded_mutations(review.metadata.get("annotations"), review.done)
        if recorded is not None:
            entries[MUTATIONS_ANNOTATION] = recorded
    review.operations.extend(patch.set_map_entries(review.pod, ("metadata", "annotations"), entries))
    review.operations.extend(
        patch.set_map_entries(
            review.pod,
            ("metadata", "labels"),
            {PLACED_LABEL: class_name, **dict(plan.labels)} if plan.labels else {PLACED_LABEL: class_name},
        )
    )


_PLACED_POINTER = patch.pointer("metadata", "labels", PLACED_LABEL)


def records_only(operation: Mapping[str, Any]) -> bool:
    """Whether a patch operation only records what was decided (the class and mutations annotations, the
    placed label) rather than changing how the pod runs or where."""
    path = str(operation["path"])
    if path.startswith("/metadata/annotations") or path == _PLACED_POINTER:
        return True
    value = operation.get("value")
    return path == "/metadata/labels" and isinstance(value, Mapping) and set(value) == {PLACED_LABEL}


def _recorded_mutations(annotations: Any, done: list[str]) -> str | None:
    """The mutations annotation with ``done`` merged in, or None when it already lists all of it.

    The MutatingAdmissionPolicy records what it did in the same annotation before the webhook is
    called (``mutating_policy._mutations_annotation_patch``, the same merge in CEL): the entries are a
    union, the existing ones first and in their order, nothing listed twice, so that neither
    overwrites the other's record and a reinvocation adds nothing."""
    current = annotations.get(MUTATIONS_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not current:
        return ",".join(done)
    listed = current.split(",")
    added = [entry for entry in done if entry not in listed]
    return current + "," + ",".join(added) if added else None


@dataclass(frozen=True)
class _ClassPlan:
    """What a class adds to a pod, built once per policy and class (the pods only decide which parts)."""

    requirements: tuple[scheduling.Requirement, ...]  # ANDed into every node-selector term
    reserved_toleration: dict[str, Any] | None  # a reserved class tolerates the reserved taint
    tolerations: tuple[dict[str, Any], ...]
    env: tuple[tuple[str, dict[str, str], bool], ...]  # (name, the env entry, override)
    env_names: tuple[str, ...]  # compared, not hashed: hashing every name of every env list costs more
    # Lending (webhook.core.lending): a borrower's preferred node-affinity term (shared nodes) and required
    # pod anti-affinity term (no inference pod on its node, lendFrom idleNodes); the priority fields of a
    # borrower (always) or of an inference pod (when its resolved priority is not above the borrowers');
    # the labels written next to the placed label (a borrower's borrow label).
    preferred: dict[str, Any] | None = None
    anti_affinity: dict[str, Any] | None = None
    priority: dict[str, Any] | None = None
    priority_at_most: int | None = None  # the priority fields are set when spec.priority <= this (None: always)
    labels: tuple[tuple[str, str], ...] = ()
    # A borrower's terminationGracePeriodSeconds at most this (lending.reclaimGraceSeconds): the scheduler's
    # preemption deletes a victim with its own grace period, so this bounds how long inference waits.
    grace_cap: int | None = None


@lru_cache(maxsize=256)
def _class_plan(policy: Policy, class_name: str) -> _ClassPlan:
    reserved = _reserved(policy, None)
    cls = policy.spec.classes[class_name]
    requirements: list[scheduling.Requirement] = []
    if cls.placement == "reserved":
        # Whole reserved nodes, or nodes whose devices are split (device-level reservation: the reserved
        # DeviceClass then decides which of their GPUs the pod gets).
        values = [reserved.value, policy.spec.reserved_devices.node_label_value]
        requirements.append(scheduling.Requirement(({"key": reserved.key, "operator": "In", "values": values},)))
    elif cls.placement == "unreserved":
        requirements.append(
            scheduling.Requirement(
                ({"key": reserved.key, "operator": "NotIn", "values": [reserved.value]},),
                satisfied_by_exclusion=reserved,
            )
        )
    for extra in cls.node_selector_requirements:
        keys = (extra.key, *extra.key_aliases)
        requirements.append(scheduling.Requirement(tuple(extra.expression(key) for key in keys)))
    taint = policy.spec.reserved_nodes.taint
    reserved_toleration = None
    if cls.placement == "reserved" and taint is not None:
        reserved_toleration = {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
    tolerations = [extra.as_k8s() for extra in cls.tolerations]
    priority = None
    priority_at_most = None
    if cls.placement == "reserved" and policy.spec.lending.enabled:
        # Inference tolerates the taint of reserved nodes that take no new borrowers, and outranks borrowers.
        settings = lending.settings(policy)
        tolerations.append(dict(settings.no_borrowers_toleration))
        priority = lending.priority_fields(settings.inference)
        priority_at_most = settings.borrower.value
    return _ClassPlan(
        requirements=tuple(requirements),
        reserved_toleration=reserved_toleration,
        tolerations=tuple(tolerations),
        env=tuple((var.name, {"name": var.name, "value": var.value}, var.on_conflict == "override") for var in cls.env),
        env_names=tuple(var.name for var in cls.env),
        priority=priority,
        priority_at_most=priority_at_most,
    )


@lru_cache(maxsize=256)
def borrower_plan(policy: Policy, class_name: str) -> _ClassPlan:
    """What a borrower of an unreserved class gets instead of its class's placement: the class's own node
    requirements without the one that keeps it off reserved nodes, the reserved toleration, a preference for
    shared nodes, the borrowers' priority (all three fields), its borrow label; with ``lendFrom: idleNodes``
    a required anti-affinity to the nodes where inference pods run (the placed label of the reserved classes)."""
    plan = _class_plan(policy, class_name)
    settings = lending.settings(policy)
    reserved = _reserved(policy, None)
    taint = policy.spec.reserved_nodes.taint
    reserved_toleration = None
    if taint is not None:
        reserved_toleration = {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
    anti_affinity = None
    if settings.lend_from == "idleNodes":
        inference = [name for name, cls in policy.spec.classes.items() if cls.placement == "reserved"]
        anti_affinity = {
            "labelSelector": {"matchExpressions": [{"key": PLACED_LABEL, "operator": "In", "values": inference}]},
            # Every namespace: a term without a namespace selector counts only the pod's own namespace.
            "namespaceSelector": {},
            "topologyKey": HOSTNAME_KEY,
        }
    return _ClassPlan(
        requirements=tuple(r for r in plan.requirements if r.satisfied_by_exclusion is None),
        reserved_toleration=reserved_toleration,
        tolerations=plan.tolerations,
        env=plan.env,
        env_names=plan.env_names,
        preferred={
            "weight": BORROWER_PREFERENCE_WEIGHT,
            "preference": {
                "matchExpressions": [{"key": reserved.key, "operator": "NotIn", "values": [reserved.value]}]
            },
        },
        anti_affinity=anti_affinity,
        priority=lending.priority_fields(settings.borrower),
        labels=((settings.pod_label, lending.BORROWING),),
        grace_cap=policy.spec.lending.reclaim_grace_seconds,
    )


def _plan_borrower_affinity(review: _Review, plan: _ClassPlan) -> None:
    """A borrower's affinity in one operation (the required terms narrowed by the class's own
    requirements, the preferred term, the pod anti-affinity term), each part only when missing."""
    current = review.spec.get("affinity")
    affinity: dict[str, Any] = dict(current) if type(current) is dict else {}
    node_affinity: dict[str, Any] = dict(affinity.get("nodeAffinity") or {})
    changed_node = False
    terms = review.terms
    if plan.requirements:
        new_terms = scheduling.narrow_terms(terms, plan.requirements)
        old_terms = [t.body for t in terms] if terms is not None else None
        if new_terms != old_terms:
            required = dict(node_affinity.get(scheduling.REQUIRED) or {})
            required["nodeSelectorTerms"] = new_terms
            node_affinity[scheduling.REQUIRED] = required
            changed_node = True
    preferred = node_affinity.get(PREFERRED)
    preferred = list(preferred) if type(preferred) is list else []
    if plan.preferred is not None and plan.preferred not in preferred:
        node_affinity[PREFERRED] = [*preferred, plan.preferred]
        changed_node = True
    if changed_node:
        affinity["nodeAffinity"] = node_affinity
        review.done.append("node-affinity")
    changed_anti = False
    if plan.anti_affinity is not None:
        anti: dict[str, Any] = dict(affinity.get("podAntiAffinity") or {})
        required_anti = anti.get(scheduling.REQUIRED)
        required_anti = list(required_anti) if type(required_anti) is list else []
        if plan.anti_affinity not in required_anti:
            anti[scheduling.REQUIRED] = [*required_anti, plan.anti_affinity]
            affinity["podAntiAffinity"] = anti
            review.done.append("pod-anti-affinity")
            changed_anti = True
    if changed_node or changed_anti:
        review.operations.extend(patch.set_map_entries(review.pod, ("spec",), {"affinity": affinity}))


def _plan_grace(review: _Review, plan: _ClassPlan) -> None:
    """A borrower's termination grace period capped at ``lending.reclaimGraceSeconds`` (absent: the
    apiserver's default of 30 s would apply, so it is written too)."""
    cap = plan.grace_cap
    if cap is None:
        return
    current = review.spec.get("terminationGracePeriodSeconds")
    if type(current) is int and current <= cap:
        return
    review.operations.extend(patch.set_map_entries(review.pod, ("spec",), {"terminationGracePeriodSeconds": cap}))
    review.done.append("termination-grace")


def _plan_priority(review: _Review, plan: _ClassPlan) -> None:
    """The PriorityClass of a borrower, or of an inference pod not above the borrowers (lending): all three
    fields, or the apiserver's Priority plugin forbids the CREATE (lending-facts.md §5)."""
    wanted = plan.priority
    if wanted is None:
        return
    current = review.spec.get("priority")
    if plan.priority_at_most is not None:
        resolved = current if type(current) is int else 0
        if resolved > plan.priority_at_most:
            return
        review.warnings.append(
            f"the pod's priority ({resolved}) is not above the borrowers' ({plan.priority_at_most}): it gets the "
            f"PriorityClass {wanted['priorityClassName']} ({wanted['priority']}), so that it takes reserved "
            "capacity back from borrowers"
        )
    operations = patch.set_map_entries(review.pod, ("spec",), wanted)
    if operations:
        review.operations.extend(operations)
        review.done.append("priority")


def _plan_affinity(review: _Review, plan: _ClassPlan) -> None:
    requirements = plan.requirements
    if not requirements:
        return
    terms = review.terms
    if terms is None:
        # No required affinity (or no terms): one new term, its missing parents created.
        required_path = scheduling.TERMS_PATH[:-1]
        new_terms = scheduling.narrow_terms(None, requirements)
        review.operations.extend(patch.set_map_entries(review.pod, required_path, {"nodeSelectorTerms": new_terms}))
        review.done.append("node-affinity")
        return
    if scheduling.splits(terms, requirements):
        new_terms = scheduling.narrow_terms(terms, requirements)
        review.operations.append(patch.replace(patch.pointer(*scheduling.TERMS_PATH), new_terms))
        review.done.append("node-affinity")
        return
    changed = False
    for term in terms:
        added = scheduling.missing_requirements(term, requirements)
        if added:
            path = patch.pointer(*scheduling.TERMS_PATH, term.index, "matchExpressions")
            review.operations.extend(patch.append_to_list(term.body.get("matchExpressions"), path, added))
            changed = True
    if changed:
        review.done.append("node-affinity")


def _plan_tolerations(review: _Review, plan: _ClassPlan) -> None:
    existing = [tol for _, tol in review.tolerations]
    wanted: list[dict[str, Any]] = []
    reserved = plan.reserved_toleration
    if reserved is not None:
        key, value, effect = reserved["key"], reserved["value"], reserved["effect"]
        if not any(scheduling.tolerates(t, key, value, effect) for t in existing):
            wanted.append(dict(reserved))
    for body in plan.tolerations:
        if body not in existing and body not in wanted:
            wanted.append(dict(body))
    if wanted:
        review.operations.extend(patch.append_to_list(review.spec.get("tolerations"), "/spec/tolerations", wanted))
        review.done.append("tolerations")


def _plan_spread(review: _Review, cls: WorkloadClass, labels: Mapping[str, str]) -> None:
    spread = cls.topology_spread
    if spread is None:
        return
    current = review.spec.get("topologySpreadConstraints")
    if any(
        c.get("topologyKey") == spread.topology_key for _, c in pods.objects(current, "spec.topologySpreadConstraints")
    ):
        return
    match_labels, match_label_keys = _spread_selector(review.policy, labels)
    if not match_labels and not match_label_keys:
        review.warnings.append(
            f"no topology spread on {spread.topology_key} added: the pod has no labels to select its peers by "
            "(a constraint without a selector counts nothing, and per-pod labels such as a StatefulSet's pod-name "
            "select only the pod itself); give the pod labels"
        )
        return
    constraint: dict[str, Any] = {
        "maxSkew": spread.max_skew,
        "topologyKey": spread.topology_key,
        "whenUnsatisfiable": spread.when_unsatisfiable,
        # An empty selector matches every pod; matchLabelKeys then narrows it to the pod's own revision.
        "labelSelector": {"matchLabels": match_labels} if match_labels else {},
    }
    if match_label_keys:
        constraint["matchLabelKeys"] = match_label_keys
    if spread.min_domains is not None:
        constraint["minDomains"] = spread.min_domains
    review.operations.extend(patch.append_to_list(current, "/spec/topologySpreadConstraints", [constraint]))
    review.done.append("topology-spread")


def _spread_selector(policy: Policy, labels: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The spread constraint's matchLabels and matchLabelKeys: per-pod identity labels left out,
    revision and controller-instance labels as keys (``spec.spreadSelector``); our placed label left out
    (it names the class, not the workload's peers, and the placement policy may have written it first)."""
    excluded, by_key = _spread_keys(policy)
    match_labels = {
        key: value for key, value in labels.items() if key not in excluded and key not in by_key and key != PLACED_LABEL
    }
    return match_labels, [key for key in by_key if key in labels]


@lru_cache(maxsize=64)
def _spread_keys(policy: Policy) -> tuple[frozenset[str], tuple[str, ...]]:
    selector = policy.spec.spread_selector
    return frozenset(selector.excluded_label_keys), tuple(selector.match_label_keys)


def _plan_env(review: _Review, plan: _ClassPlan, gpu: list[pods.ContainerRef]) -> None:
    if not plan.env:
        return
    changed = False
    for container in gpu:
        current = container.body.get("env")
        entries, found = _env_indexes(current, plan.env_names, container)
        missing: list[dict[str, Any]] = []
        for name, wanted, override in plan.env:
            indexes = found.get(name)
            if indexes is None:
                missing.append(dict(wanted))
            elif override:
                for i in indexes:
                    if entries[i] != wanted:
                        review.operations.append(patch.replace(f"{container.pointer}/env/{i}", dict(wanted)))
                        changed = True
        if missing:
            review.operations.extend(patch.append_to_list(current, container.pointer + "/env", missing))
            changed = True
    if changed:
        review.done.append("env")


def _env_indexes(
    env: Any, names: tuple[str, ...], container: pods.ContainerRef
) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """A container's env entries, and where each of ``names`` is set in them (env lists of a hundred
    variables are common, and every GPU container is read)."""
    if type(env) is list and all(type(entry) is dict for entry in env):
        entries: list[dict[str, Any]] = env
    else:  # the field name is only formatted for a list that is not plain JSON objects
        entries = [entry for _, entry in pods.objects(env, f"{container.field}.env")]
    found: dict[str, list[int]] = {}
    for index, entry in enumerate(entries):
        name = entry.get("name")
        if isinstance(name, str):
            for wanted in names:  # a class sets a few variables: compared one by one, never hashed
                if name == wanted:
                    found.setdefault(name, []).append(index)
    return entries, found


def _plan_kfd_mount(review: _Review, cls: WorkloadClass, gpu: list[pods.ContainerRef]) -> None:
    if not cls.kfd_topology_mount or not gpu:
        return
    labels = review.namespace.labels
    if labels is None:
        review.warnings.append(
            f"KFD topology mount skipped: the Pod Security level of namespace {review.namespace.name} is unknown "
            "(no cluster connection), and a hostPath volume is rejected under baseline and restricted"
        )
        return
    level = labels.get(PSS_ENFORCE_LABEL)
    if level in ("baseline", "restricted"):
        review.warnings.append(
            f"KFD topology mount skipped: namespace {review.namespace.name} enforces Pod Security {level}, "
            "which forbids hostPath volumes"
        )
        return
    volumes = review.spec.get("volumes")
    same_name = [v for _, v in pods.objects(volumes, "spec.volumes") if v.get("name") == KFD_VOLUME_NAME]
    if same_name and dict(same_name[0]) != KFD_VOLUME:
        review.warnings.append(f"KFD topology mount skipped: the pod already has a different volume {KFD_VOLUME_NAME}")
        return
    changed = False
    if not same_name:
        review.operations.extend(patch.append_to_list(volumes, "/spec/volumes", [dict(KFD_VOLUME)]))
        changed = True
    for container in gpu:
        mounts = container.body.get("volumeMounts")
        if any(
            m.get("mountPath") == KFD_TOPOLOGY_PATH for _, m in pods.objects(mounts, f"{container.field}.volumeMounts")
        ):
            continue
        review.operations.extend(patch.append_to_list(mounts, container.pointer + "/volumeMounts", [dict(KFD_MOUNT)]))
        changed = True
    if changed:
        review.done.append("kfd-topology-mount")


def _finish(review: _Review, mode: Mode, class_name: str, quiet_rule: str) -> Decision:
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
