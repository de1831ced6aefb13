"""The dry run's decisions: each document (a pod, a workload's templates, an AdmissionReview, a
ResourceClaim) through the engine, the patch moved to where the pod sits in the object and applied."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import jsonpatch

from webhook.core import claims, patch, pods
from webhook.core.decision import Decision
from webhook.core.device_claims import decide_claim
from webhook.core.engine import LABELS_UNKNOWN, RULE_MALFORMED, decide, route_matcher_for
from webhook.offline import workloads
from webhook.offline.documents import (
    Document,
    Facts,
    InputError,
    Location,
    api_group,
    as_mapping,
    metadata_of,
    object_items,
)

RULE_PASSED = "passed-through"
RULE_PATCH_FAILED = "patch-not-applicable"
REVIEW_PATH = ("request", "object")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


Verdict = Literal["mutated", "unchanged", "denied", "passed through"]


@dataclass(frozen=True)
class Outcome:
    """One object's result: the object printed, the patch that leads to it, and what to report."""

    where: Location
    body: dict[str, Any]
    namespace: str | None
    name: str
    output: dict[str, Any]
    verdict: Verdict
    rule: str
    message: str
    pod_path: str | None = None
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    templates: tuple[TemplateOutcome, ...] = ()  # one per template of a workload CRD (named templates)
    uncovered: tuple[str, ...] = ()  # GPU requests in an object the table does not cover

    @property
    def allowed(self) -> bool:
        return self.verdict != "denied"


# --- decision -------------------------------------------------------------------------------


def process_document(doc: Document, facts: Facts) -> tuple[dict[str, Any], list[Outcome]]:
    """The document to print, and one outcome per object in it (one, or one per List item)."""
    items = list(object_items(doc))
    if len(items) == 1 and items[0] is doc:
        outcome = process_object(doc, facts)
        return outcome.output, [outcome]
    outcomes = [process_object(item, facts) for item in items]
    return {**doc.body, "items": [o.output for o in outcomes]}, outcomes


def process_object(doc: Document, facts: Facts) -> Outcome:
    body = doc.body
    kind, group = body["kind"], api_group(body["apiVersion"])
    if kind == "AdmissionReview" and group == "admission.k8s.io":
        return _review(doc, facts)
    if claims.is_claim_kind(body["apiVersion"], kind) and facts.devices.devices_reserved:
        return _claim(doc, facts)
    found = workloads.workload(body["apiVersion"], kind)
    if found is None:
        return _passed(doc, _pass_reason(body, facts), _uncovered(body, facts))
    namespace = str(metadata_of(body).get("namespace") or facts.default_namespace)
    try:
        templates = workloads.templates(body, found)
    except pods.MalformedPod as err:
        return _malformed(doc, namespace, err)
    if not templates:
        patterns = ", ".join(rule.pattern for rule in found.templates)
        if all(rule.shape == workloads.OVERRIDE for rule in found.templates):
            # A TrainJob without overrides: its pods are the runtime's, checked where the runtime is.
            return _passed(doc, f"nothing shapes its pods here (looked at {patterns}); they are its runtime's", ())
        return _passed(doc, f"no pod template found (looked at {patterns})", _uncovered(body, facts))
    label_keys = facts.spread_label_keys
    results = []
    for template in templates:
        try:
            pod = workloads.predicted_pod(body, template, label_keys)
        except pods.MalformedPod as err:
            return _malformed(doc, namespace, err, template)
        decision = decide(
            operation="CREATE",
            pod=pod,
            namespace=facts.namespace(namespace),
            nodes=facts.nodes,
            policy=facts.policy,
            claims=facts.claims_in(namespace),
            devices=facts.devices,
        )
        results.append((template, pod, decision))
    return _apply_templates(doc, namespace, pods.pod_name(body), results)


def _uncovered(body: Mapping[str, Any], facts: Facts) -> tuple[str, ...]:
    kind, api_version = body["kind"], body["apiVersion"]
    if claims.is_claim_kind(api_version, kind) or claims.is_device_class_kind(api_version, kind) or kind == "Namespace":
        return ()
    # The GPU-route catalogue, with what the input's DeviceClasses add.
    routes = route_matcher_for(facts.policy, facts.devices)
    is_gpu = routes.resources if routes.resources is not None else _no_resource
    return tuple(workloads.uncovered_gpu_paths(body, is_gpu, routes))


def _no_resource(name: str) -> bool:
    return False


def _pass_reason(body: Mapping[str, Any], facts: Facts) -> str:
    if body["kind"] == "Namespace" and api_group(body["apiVersion"]) == "":
        if facts.given_labels is None:
            return "its labels are used for the objects in it"
        return "its labels are not used (--namespace-label given)"
    if claims.is_claim_kind(body["apiVersion"], body["kind"]):
        return "used to resolve the resource claims of the pods in its namespace"
    if claims.is_device_class_kind(body["apiVersion"], body["kind"]):
        why = "used to tell which DeviceClasses hand out GPUs"
        if metadata_of(body).get("name") != facts.policy.spec.reserved_devices.reserved_class_name:
            return why
        if claims.device_class_info(body).reservation_active:
            return f"{why}; it says a device-level reservation is active"
        assumed = " (assumed active: --device-reservation-active)" if facts.devices.devices_reserved else ""
        return f"{why}; it says no device-level reservation is active{assumed}"
    return f"{body['apiVersion']} {body['kind']} is not a pod or a known workload with a pod template"


def _claim(doc: Document, facts: Facts) -> Outcome:
    """A ResourceClaim(Template) while a device-level reservation is active: decided as the webhook decides
    its CREATE, in resource.k8s.io/v1 only (the version the webhook is called with)."""
    body = doc.body
    namespace = str(metadata_of(body).get("namespace") or facts.default_namespace)
    api_version, kind = body["apiVersion"], body["kind"]
    if api_version != f"{claims.GROUP}/v1":
        return _claim_not_in_v1(doc, facts)
    namespace_facts = facts.namespace(namespace)
    decision = decide_claim(
        operation="CREATE",
        claim=body,
        kind=kind,
        namespace=namespace_facts,
        policy=facts.policy,
        devices=facts.devices,
    )
    warnings = decision.warnings
    if namespace_facts.labels is None:
        # As the engine says it for a pod (said once per run by main()).
        source = facts.policy.namespace_classes(namespace, None).source
        warnings += (
            f"namespace {namespace}{LABELS_UNKNOWN}{source}; label rules, the mode label and Pod Security labels "
            "were not checked",
        )
    common: dict[str, Any] = {
        "where": doc.where,
        "body": body,
        "namespace": namespace,
        "name": pods.pod_name(body),
        "warnings": warnings,
    }
    if not decision.allowed:
        return Outcome(**common, output=body, verdict="denied", rule=decision.rule, message=decision.message)
    return _patched(doc, common, [dict(op) for op in decision.patch], decision.rule, decision.message)


def _claim_not_in_v1(doc: Document, facts: Facts) -> Outcome:
    """A claim of an older version: the webhook is called with it converted to v1 (matchPolicy: Equivalent),
    a conversion the dry run does not guess. Said plainly; a GPU request in it is unchecked (--strict)."""
    body = doc.body
    try:
        names = sorted(claims.device_classes(body))
    except claims.MalformedClaim:
        names = []  # claim_documents() has already refused it (exit 2)
    policy, devices = facts.policy, facts.devices
    gpu = [name for name in names if policy.gpu_device_classes(name) or name in devices.gpu_classes]
    why = (
        f"not decided: the webhook decides a claim as {claims.GROUP}/v1 (the apiserver converts this "
        f"{body['apiVersion']} object before calling it), a conversion the dry run does not make; write it as "
        f"{claims.GROUP}/v1 to see how it is admitted (as written, it resolves the claims of the pods in its namespace)"
    )
    outcome = _passed(doc, why)
    if not gpu:
        return outcome
    where = f"{'spec.spec' if body['kind'] == claims.TEMPLATE_KIND else 'spec'}.devices.requests ({', '.join(gpu)})"
    warning = (
        f"a GPU request at {where}, in a {body['apiVersion']} {body['kind']}: checked only in the cluster "
        "(--strict makes this an error)"
    )
    return replace(outcome, warnings=(warning,), uncovered=(where,))


def _review(doc: Document, facts: Facts) -> Outcome:
    request = doc.body.get("request")
    if not isinstance(request, Mapping):
        raise InputError(f"{doc.where}: AdmissionReview: request must be an object")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise InputError(f"{doc.where}: AdmissionReview: request.operation must be one of {', '.join(OPERATIONS)}")
    obj, old = request.get("object"), request.get("oldObject")
    request_kind = as_mapping(request.get("kind")).get("kind") or as_mapping(obj).get("kind")
    if request_kind != "Pod":
        return _passed(doc, f"the AdmissionReview is for a {request_kind or 'non-pod object'}, not a pod")
    namespace = str(
        request.get("namespace") or metadata_of(as_mapping(obj)).get("namespace") or facts.default_namespace
    )
    decision = decide(
        operation=str(operation),
        pod=obj,
        old_pod=old,
        namespace=facts.namespace(namespace),
        nodes=facts.nodes,
        policy=facts.policy,
        devices=facts.devices,
        sub_resource=str(request.get("subResource") or ""),
    )
    name = str(request.get("name") or pods.pod_name(as_mapping(obj)))
    return _apply(doc, namespace, name, REVIEW_PATH, decision)


def _apply(doc: Document, namespace: str, name: str, pod_path: tuple[str, ...], decision: Decision) -> Outcome:
    common: dict[str, Any] = {
        "where": doc.where,
        "body": doc.body,
        "namespace": namespace,
        "name": name,
        "pod_path": patch.pointer(*pod_path),
        "warnings": decision.warnings,
    }
    if not decision.allowed:
        return Outcome(**common, output=doc.body, verdict="denied", rule=decision.rule, message=decision.message)
    operations = prefixed(decision.patch, doc.body, pod_path)
    return _patched(doc, common, operations, decision.rule, decision.message)


def _patched(
    doc: Document, common: dict[str, Any], operations: list[dict[str, Any]], rule: str, message: str
) -> Outcome:
    """The object with ``operations`` applied, or denied as the apiserver would when they do not apply."""
    try:
        output, operations = _with_missing_maps(doc.body, operations)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
        # The apiserver fails the request when a webhook's patch does not apply.
        return Outcome(
            **common,
            output=doc.body,
            verdict="denied",
            rule=RULE_PATCH_FAILED,
            message=f"the webhook's patch does not apply to this object ({str(err)[:200]}); please report this as a bug",
        )
    return Outcome(
        **common,
        output=output,
        verdict="mutated" if operations else "unchanged",
        rule=rule,
        message=message,
        patch=tuple(operations),
    )


def _with_missing_maps(
    body: Mapping[str, Any], operations: Sequence[Mapping[str, Any]]
) -> tuple[Any, list[dict[str, Any]]]:
    """``body`` patched, and the operations that did it: an ``add`` into object members that the body
    lacks (a template without ``metadata.labels``, which the engine saw on the pod its controller makes)
    is preceded by ``add``s of those members as empty objects: a patch must create what it fills in."""
    output: Any = jsonpatch.apply_patch(body, [])
    done: list[dict[str, Any]] = []
    for operation in operations:
        wanted = [dict(operation)]
        if operation["op"] == "add":
            wanted[:0] = _missing_parents(output, operation["path"].split("/")[1:-1])
        output = jsonpatch.apply_patch(output, wanted, in_place=True)
        done.extend(wanted)
    return output, done


def _missing_parents(document: Any, tokens: list[str]) -> list[dict[str, Any]]:
    """``add``s of empty objects for the object members along ``tokens`` that ``document`` lacks."""
    node = document
    for depth, token in enumerate(tokens):
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            if key not in node:
                return [patch.add("/" + "/".join(tokens[: end + 1]), {}) for end in range(depth, len(tokens))]
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return []  # not an object: the patch fails as the apiserver's would
    return []


@dataclass(frozen=True)
class TemplateOutcome:
    """The decision on one pod template of a workload (CRDs have several)."""

    name: str | None
    pod_path: str
    fields: str  # where the fields a message names are: "relative to spec.x.template", "the pod made from ..."
    allowed: bool
    rule: str
    message: str
    warnings: tuple[str, ...]
    patch: tuple[dict[str, Any], ...]


def template_operations(
    template: workloads.Template, pod: Mapping[str, Any], operations: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The engine's operations on the predicted pod, as operations on the object."""
    out: list[dict[str, Any]] = []
    if not template.path:
        return [dict(op) for op in operations]
    if (
        template.rule.shape == workloads.TEMPLATE
        and not isinstance(template.node.get("metadata"), Mapping)
        and "metadata" in pod
    ):
        # The engine saw the metadata that carries the controller's labels; the real template has none.
        operations = _created_metadata(operations, patch.pointer(*template.path, "metadata"), out)
    for operation in operations:
        path = workloads.operation_path(template, operation["path"])
        if path is None:
            continue
        moved = {**operation, "path": path}
        if "from" in operation:
            source = workloads.operation_path(template, operation["from"])
            if source is None:
                continue
            moved["from"] = source
        out.append(moved)
    return out


def _created_metadata(
    operations: Sequence[Mapping[str, Any]], pointer: str, out: list[dict[str, Any]]
) -> list[Mapping[str, Any]]:
    """The operations on ``/metadata/...`` folded into one that creates the template's metadata (appended
    to ``out``); the other operations are returned."""
    inside = [op for op in operations if op["path"].startswith("/metadata/")]
    rest = [op for op in operations if not op["path"].startswith("/metadata/")]
    if not inside:
        return rest
    relative = [{**op, "path": op["path"].removeprefix("/metadata")} for op in inside]
    try:
        metadata, _ = _with_missing_maps({}, relative)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
        out.append(patch.add(pointer, {}))
        return list(operations)
    out.append(patch.add(pointer, metadata))
    return rest


def _template_outcome(template: workloads.Template, pod: Mapping[str, Any], decision: Decision) -> TemplateOutcome:
    operations: list[dict[str, Any]] = []
    message = decision.message
    if decision.allowed:
        operations = template_operations(template, pod, decision.patch)
        if template.rule.shape == workloads.OVERRIDE and decision.patch:
            message = (
                f"checked, class {decision.workload_class}: not mutated (an override has no place for what the "
                "webhook adds; it adds it to the pods in the cluster)"
            )
    if template.rule.shape == workloads.INLINE:
        where = f"the pod made from {template.dotted}"
    else:
        where = f"relative to {template.dotted}" if template.path else ""
    return TemplateOutcome(
        name=template.name,
        pod_path=patch.pointer(*template.path),
        fields=where,
        allowed=decision.allowed,
        rule=decision.rule,
        message=message,
        warnings=decision.warnings,
        patch=tuple(operations),
    )


def _apply_templates(
    doc: Document,
    namespace: str,
    name: str,
    results: Sequence[tuple[workloads.Template, Mapping[str, Any], Decision]],
) -> Outcome:
    """One outcome for the object: denied when any template is, else every template's patch applied."""
    done = tuple(_template_outcome(template, pod, decision) for template, pod, decision in results)
    named = any(t.name is not None for t in done)
    denied = [t for t in done if not t.allowed]
    first = denied[0] if denied else done[0]
    common: dict[str, Any] = {
        "where": doc.where,
        "body": doc.body,
        "namespace": namespace,
        "name": name,
        "pod_path": None if named else first.pod_path,
        "warnings": () if named else first.warnings,
        "templates": done if named else (),
    }
    message = "; ".join(f"{t.name}: {t.message}" for t in (denied or done)) if named else first.message
    if denied:
        return Outcome(**common, output=doc.body, verdict="denied", rule=first.rule, message=message)
    operations = [op for t in done for op in t.patch]
    return _patched(doc, common, operations, first.rule, message)


def prefixed(
    operations: Sequence[Mapping[str, Any]], body: Mapping[str, Any], pod_path: Sequence[str]
) -> list[dict[str, Any]]:
    """The pod's operations made relative to the object, creating the pod's parents when absent."""
    if not operations:
        return []
    prefix = patch.pointer(*pod_path)
    out: list[dict[str, Any]] = []
    if pod_path and not isinstance(patch.resolve(body, pod_path), Mapping):
        out.extend(patch.set_map_entries(pods.mapping(body, "the document"), tuple(pod_path[:-1]), {pod_path[-1]: {}}))
    for operation in operations:
        moved = {**operation, "path": prefix + operation["path"]}
        if "from" in operation:
            moved["from"] = prefix + operation["from"]
        out.append(moved)
    return out


def _passed(doc: Document, why: str, uncovered: tuple[str, ...] = ()) -> Outcome:
    namespace = metadata_of(doc.body).get("namespace")
    warnings = tuple(
        f"a GPU request at {where}, outside any pod template the dry run knows for this kind: "
        "its pods are only checked in the cluster (--strict makes this an error)"
        for where in uncovered
    )
    return Outcome(
        where=doc.where,
        body=doc.body,
        namespace=namespace if isinstance(namespace, str) else None,
        name=pods.pod_name(doc.body),
        output=doc.body,
        verdict="passed through",
        rule=RULE_PASSED,
        message=why,
        warnings=warnings,
        uncovered=uncovered,
    )


def _malformed(
    doc: Document, namespace: str, err: pods.MalformedPod, template: workloads.Template | None = None
) -> Outcome:
    pod_path = template.path if template is not None and template.path else ()
    return Outcome(
        where=doc.where,
        body=doc.body,
        namespace=namespace,
        name=pods.pod_name(doc.body),
        output=doc.body,
        verdict="denied",
        rule=RULE_MALFORMED,
        message=f"the pod template cannot be checked: {err}",
        pod_path=patch.pointer(*pod_path) if pod_path else None,
    )
