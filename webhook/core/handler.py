"""``handle(request) -> response``: guard clauses first (Gatekeeper's shape), then the engine.

No I/O: the namespace and node facts come from a ``ClusterFacts`` (the watch cache, or nothing),
the policy from the caller. The same function serves the HTTPS app and any offline caller.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from webhook.core import lending, review
from webhook.core.decision import NO_CLAIMS, NO_DEVICES, ClaimFacts, Decision, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.device_claims import decide_claim
from webhook.core.engine import EPHEMERAL_CONTAINERS, decide
from webhook.core.policy import Policy
from webhook.core.review import AdmissionRequest, AdmissionResponse


class ClusterFacts(Protocol):
    """Where namespace labels, reserved node names, the namespace's DRA claims and the cluster's GPU
    DeviceClasses come from."""

    def namespace(self, name: str) -> NamespaceFacts: ...

    def nodes(self, policy: Policy) -> NodeFacts: ...

    def claims(self, namespace: str) -> ClaimFacts: ...

    def devices(self, policy: Policy) -> DeviceFacts: ...

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as stored (a live read: the caller runs it off the event loop), None when unknown."""
        ...


_UNKNOWN_NODES = NodeFacts(reserved_node_names=None)


class NoCluster:
    """No cluster connection: namespace labels and reserved nodes are unknown.

    Namespace rules by name still work; the engine says in a warning what it could not check.
    """

    def namespace(self, name: str) -> NamespaceFacts:
        return NamespaceFacts(name=name, labels=None)

    def nodes(self, policy: Policy) -> NodeFacts:
        return _UNKNOWN_NODES

    def claims(self, namespace: str) -> ClaimFacts:
        return NO_CLAIMS

    def devices(self, policy: Policy) -> DeviceFacts:
        return NO_DEVICES

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


class Handled:
    """The response and what to record about it (log line, metrics)."""

    __slots__ = ("decision", "mode", "response", "rule", "violations", "workload_class")

    def __init__(
        self,
        *,
        response: AdmissionResponse,
        workload_class: str,
        decision: str,  # allowed | patched | denied | skipped
        rule: str,
        mode: str,
        violations: tuple[str, ...] = (),  # the rule of every violation found (in any mode)
    ) -> None:
        self.response: Final = response
        self.workload_class: Final = workload_class
        self.decision: Final = decision
        self.rule: Final = rule
        self.mode: Final = mode
        self.violations: Final = violations


def _skip(rule: str, mode: str) -> Handled:
    return Handled(response=review.allowed(), workload_class="", decision="skipped", rule=rule, mode=mode)


def _names_claims(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec")
    return type(spec) is dict and bool(spec.get("resourceClaims"))


def owner_to_read(request: AdmissionRequest, *, policy: Policy, facts: ClusterFacts) -> tuple[str, str] | None:
    """The pod (name, uid) whose claim this CREATE is, when it must be read before ``handle`` decides (a
    claim that may borrow reserved devices: ``core/lending.owner_to_read``), else None."""
    if request.is_pod or not request.is_claim or request.operation != "CREATE" or request.sub_resource:
        return None
    devices = policy.spec.reserved_devices
    namespace = facts.namespace(request.namespace)
    lendable = devices.lendable_class_name in facts.devices(policy).gpu_classes
    return lending.owner_to_read(policy, request.namespace, namespace.labels, request.object, lendable)


def handle(
    request: AdmissionRequest, *, policy: Policy, facts: ClusterFacts, owner: dict[str, Any] | None = None
) -> Handled:
    """``owner``: the pod a claim was made for, read by the caller when ``owner_to_read`` asked."""
    mode = policy.spec.mode
    if not request.is_pod:
        # Pods are nearly every review: the claim check comes only after the pod one.
        if request.is_claim:
            return _handle_claim(request, policy=policy, facts=facts, owner=owner)
        return _skip("skip.not-a-pod", mode)
    if request.sub_resource and request.sub_resource != EPHEMERAL_CONTAINERS:
        # pods/status, pods/binding, ...: not the pod spec we place. pods/ephemeralcontainers (kubectl
        # debug) is checked: an added container may reach the GPUs of the node the pod is on.
        return _skip("skip.subresource", mode)
    if request.operation not in ("CREATE", "UPDATE"):
        return _skip("skip.operation", mode)
    pod = request.object
    if pod is None:
        return Handled(
            response=review.denied(
                f"request.object is null on {request.operation}: there is no pod to check", code=400
            ),
            workload_class="",
            decision="denied",
            rule="request.object-missing",
            mode=mode,
        )
    namespace = request.namespace
    if not namespace:
        meta = pod.get("metadata")
        value = meta.get("namespace") if isinstance(meta, dict) else None
        namespace = value if isinstance(value, str) else ""

    decision = decide(
        operation=request.operation,
        pod=pod,
        old_pod=request.old_object,
        namespace=facts.namespace(namespace),
        nodes=facts.nodes(policy),
        policy=policy,
        # Read only for pods that name claims: the cache lookup is skipped for every other pod.
        claims=facts.claims(namespace) if _names_claims(pod) else NO_CLAIMS,
        devices=facts.devices(policy),
        sub_resource=request.sub_resource,
    )
    return _handled(decision)


def _handle_claim(
    request: AdmissionRequest, *, policy: Policy, facts: ClusterFacts, owner: dict[str, Any] | None
) -> Handled:
    """A ResourceClaim or ResourceClaimTemplate: steered while a device-level reservation is active."""
    mode = policy.spec.mode
    if request.sub_resource:
        return _skip("skip.subresource", mode)
    if request.object is None and request.operation == "CREATE":
        return Handled(
            response=review.denied("request.object is null on CREATE: there is no claim to check", code=400),
            workload_class="",
            decision="denied",
            rule="request.object-missing",
            mode=mode,
        )
    decision = decide_claim(
        operation=request.operation,
        claim=request.object,
        kind=request.kind.get("kind", ""),
        namespace=facts.namespace(request.namespace),
        policy=policy,
        devices=facts.devices(policy),
        owner=owner,
    )
    return _handled(decision)


def _handled(decision: Decision) -> Handled:
    if not decision.allowed:
        response = review.denied(
            decision.message,
            code=decision.code,
            warnings=decision.warnings,
            audit_annotations=decision.audit_annotations,
        )
    elif decision.patch:
        response = review.patched(
            decision.patch, warnings=decision.warnings, audit_annotations=decision.audit_annotations
        )
    else:
        response = review.allowed(warnings=decision.warnings, audit_annotations=decision.audit_annotations)
    return Handled(
        response=response,
        workload_class=decision.workload_class or "",
        decision=decision.outcome,
        rule=decision.rule,
        mode=decision.mode,
        violations=tuple(v.rule for v in decision.violations),
    )
