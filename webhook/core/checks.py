"""The checks of ``decide``: every way a pod of a class that may not use the reserved capacity could reach it
(node name, selectors, required affinity, tolerations, the reserved devices, direct GPU access), on CREATE
and on UPDATE. Each denial is recorded on the ``Assessment``; nothing here patches."""

from __future__ import annotations

from typing import Any

from webhook.core import lending, pods, scheduling
from webhook.core.assessment import Assessment, denied, read_tolerations, reserved_hint, reserved_taint
from webhook.core.decision import (
    ClaimFacts,
    Violation,
)
from webhook.core.policy import WorkloadClass
from webhook.core.rules import (
    AMD_OPERATOR_TAINT_KEYS,
    DENY_DIRECT_ACCESS,
    DENY_NODE_AFFINITY,
    DENY_NODE_NAME,
    DENY_NODE_SELECTOR,
    DENY_RESERVED_DEVICES,
    DENY_TOLERATION,
)


def check_direct_access(review: Assessment, cls: WorkloadClass, class_name: str) -> None:
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


def deny_node_selector(review: Assessment, class_name: str) -> None:
    key, value = review.reserved.key, review.reserved.value
    denied(review, class_name, DENY_NODE_SELECTOR, "spec.nodeSelector", f"selects {key}={value}")


def deny_node_affinity(review: Assessment, class_name: str) -> None:
    where = f"spec.affinity.nodeAffinity.{scheduling.REQUIRED}"
    denied(review, class_name, DENY_NODE_AFFINITY, where, "selects reserved nodes in every term")


def check_create(
    review: Assessment, cls: WorkloadClass, class_name: str, borrower: bool = False, switching: bool = False
) -> None:
    """Reachability of reserved nodes for a class that may not use them (a borrower may: lending).
    ``switching``: lending off, the pod made a borrower by the apiserver's placement policy still rendered with
    lending on (``lending.placed_as_borrower_before``): its reserved toleration is not denied (that state
    admits it); the training placement's ``NotIn`` keeps it off the reserved nodes."""
    spec = review.spec
    reserved = review.reserved
    node_name = pods.string(spec.get("nodeName"), "spec.nodeName")
    node_selector = pods.string_map(spec.get("nodeSelector"), "spec.nodeSelector")
    terms = review.terms = scheduling.required_terms(spec)
    tolerations = review.tolerations = read_tolerations(spec)
    warn_operator_taints(review, tolerations)
    if cls.placement != "reserved" and review.policy.spec.lending.enabled:
        check_no_borrowers(review, class_name, tolerations)
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
            denied(review, class_name, DENY_NODE_NAME, "spec.nodeName", f"is {node_name}, a reserved node")
    if node_selector.get(reserved.key) == reserved.value:
        deny_node_selector(review, class_name)
    if scheduling.affinity_only_reserved(terms, reserved):
        deny_node_affinity(review, class_name)
    elif terms and reserved.node_names is None and any(t.fields for t in terms):
        review.warnings.append(
            "matchFields on node names could not be checked against the reserved nodes (no cluster connection)"
        )
    if not switching:
        check_tolerations(review, class_name, tolerations)


def check_tolerations(
    review: Assessment, class_name: str, tolerations: list[tuple[int, dict[str, Any]]], old: Any = None
) -> None:
    taint = reserved_taint(review)
    if taint is None:
        return
    previous = old or []
    for index, tol in tolerations:
        if scheduling.tolerates(tol, taint.key, taint.value, taint.effect) and tol not in previous:
            what = (
                "tolerates every taint" if not tol.get("key") else f"tolerates {taint.key}={taint.value}:{taint.effect}"
            )
            denied(review, class_name, DENY_TOLERATION, f"spec.tolerations[{index}]", what)


def check_no_borrowers(
    review: Assessment, class_name: str, tolerations: list[tuple[int, dict[str, Any]]], old: Any = None
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


def stored_borrower(review: Assessment, cls: WorkloadClass) -> bool:
    """An UPDATE of a pod that is a borrower (``lending.is_borrower``) in a namespace that may borrow."""
    if cls.placement != "unreserved" or not review.policy.spec.lending.enabled:
        return False
    namespace = review.namespace
    return lending.is_borrower(review.pod, review.policy) and lending.namespace_may_borrow(
        review.policy, namespace.name, namespace.labels
    )


def warn_operator_taints(review: Assessment, tolerations: list[tuple[int, dict[str, Any]]]) -> None:
    for index, tol in tolerations:
        if tol.get("key") in AMD_OPERATOR_TAINT_KEYS:
            review.warnings.append(
                f"spec.tolerations[{index}] tolerates {tol.get('key')}: the AMD GPU operator uses that taint to keep "
                "pods off unhealthy or re-partitioning GPUs"
            )


def check_update(
    review: Assessment, cls: WorkloadClass, class_name: str, old: dict[str, Any], borrower: bool = False
) -> None:
    """On UPDATE only what the update introduces is checked: rejecting a pod that was admitted
    before the policy would block its finalizers and status changes. A borrower (lending) may reach
    reserved nodes; no pod but inference may newly tolerate the no-borrowers taint."""
    if cls.placement != "reserved" and review.policy.spec.lending.enabled:
        old_spec = pods.mapping(old.get("spec"), "oldObject.spec")
        previous = [tol for _, tol in pods.objects(old_spec.get("tolerations"), "oldObject.spec.tolerations")]
        check_no_borrowers(review, class_name, read_tolerations(review.spec), previous)
    if cls.placement != "unreserved" or borrower:
        return
    old_spec = pods.mapping(old.get("spec"), "oldObject.spec")
    reserved = review.reserved
    old_tolerations = [tol for _, tol in pods.objects(old_spec.get("tolerations"), "oldObject.spec.tolerations")]
    review.tolerations = read_tolerations(review.spec)
    check_tolerations(review, class_name, review.tolerations, old_tolerations)
    selector = pods.string_map(review.spec.get("nodeSelector"), "spec.nodeSelector")
    old_selector = pods.string_map(old_spec.get("nodeSelector"), "oldObject.spec.nodeSelector")
    if selector.get(reserved.key) == reserved.value and old_selector.get(reserved.key) != reserved.value:
        deny_node_selector(review, class_name)
    review.terms = scheduling.required_terms(review.spec)
    if scheduling.affinity_only_reserved(review.terms, reserved) and not scheduling.affinity_only_reserved(
        scheduling.required_terms(old_spec), reserved
    ):
        deny_node_affinity(review, class_name)


def check_reserved_devices(review: Assessment, cls: WorkloadClass, class_name: str, claims: ClaimFacts) -> None:
    """A pod of a class other than inference asks for the reserved DeviceClass by name: through its implicit
    extended resource, or through a claim of the namespace that names it (the backstop cannot read claims;
    the claim itself is only admitted in a namespace that also allows the inference class)."""
    if cls.placement == "reserved":
        return
    devices = review.policy.spec.reserved_devices
    hint = reserved_hint(review.policy)
    for container in pods.containers(review.spec):
        for field, values in zip(("requests", "limits"), pods.resource_maps(container), strict=True):
            for reserved_class in (devices.reserved_class_name, devices.reserved_extended_class_name):
                reserved = pods.DEVICE_CLASS_RESOURCE_PREFIX + reserved_class
                if values is None or reserved not in values:
                    continue
                where = f"{container.field}.resources.{field}[{reserved}]"
                review.violations.append(
                    Violation(
                        DENY_RESERVED_DEVICES,
                        where,
                        f"{class_name} pods may not use the GPUs reserved for inference: {where} asks for the "
                        f"reserved DeviceClass {reserved_class}; request {devices.extended_resource_name or pods.DEVICE_CLASS_RESOURCE_PREFIX + devices.shared_class_name} instead{hint}",
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


def check_lent_claims(review: Assessment, claims: ClaimFacts) -> None:
    """A pod naming, by ``resourceClaimName``, a claim that names the lendable DeviceClass: the claim the
    resourceclaim controller made from a borrower's template (only the webhook writes that class into a
    claim, only for a borrower's, and the backstop lets only the controller create one), which may hold a
    reserved GPU lent to that borrower. A ResourceClaim is shared by every pod naming it, so another pod
    would use the lent GPU without being a borrower (the keeper evicts borrowers only, and the GPU would stay
    allocated after the borrower left). Every pod is refused, whatever its class: the borrower itself names
    its claim through its template, never by name. The backstop refuses the same when the scheduler would
    reserve the claim for such a pod (``rocm-isolation-lent-claim-consumers``)."""
    lendable = review.policy.spec.reserved_devices.lendable_class_name
    for ref in pods.resource_claims(review.spec.get("resourceClaims")):
        if ref.template_name or not ref.claim_name:
            continue
        classes = claims.claims.get(ref.claim_name)
        if classes is None or lendable not in classes:
            continue
        review.violations.append(
            Violation(
                DENY_RESERVED_DEVICES,
                ref.field,
                f"{ref.field} ({ref.name}) names ResourceClaim {ref.claim_name}, which was made for a borrower "
                f"(it names the DeviceClass {lendable}: it may hold a reserved GPU lent to that pod only); "
                "a borrower's claim serves its own pod: give this pod a claim of its own "
                "(resourceClaimTemplateName)",
            )
        )
