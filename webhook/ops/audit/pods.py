"""``audit`` of pods: each judged with the admission engine itself (``engine.decide`` on a CREATE of the pod
as it is now), what it holds counted in the capacity model, what waits counted per pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from webhook.cluster.inventory import PodInfo, Pool, Snapshot, claim_names, pod_info
from webhook.core import engine, patch, placement
from webhook.core.decision import Decision, NamespaceFacts, NodeFacts
from webhook.core.lending import BORROWING, is_borrower, settings
from webhook.core.policy import Policy
from webhook.ops.audit.devices import DeviceAudit
from webhook.ops.audit.findings import Finding
from webhook.ops.capacity import RESERVED, CapacityModel, Holder
from webhook.ops.devices.split import split_label

UNCLASSIFIED: Final = "unclassified"  # GPU pods of excluded namespaces: no class
_REACH_RULES: Final = frozenset({engine.DENY_NODE_SELECTOR, engine.DENY_NODE_AFFINITY, engine.DENY_TOLERATION})
_ANNOTATIONS: Final = "/metadata/annotations"
_MUTATIONS_POINTER: Final = f"{_ANNOTATIONS}/{patch.escape(engine.MUTATIONS_ANNOTATION)}"


@dataclass
class Pending:
    pods: int = 0
    oldest: datetime | None = None

    def add(self, created: datetime | None) -> None:
        self.pods += 1
        if created is not None and (self.oldest is None or created < self.oldest):
            self.oldest = created

    def wait_seconds(self, now: datetime) -> float:
        return max(0.0, (now - self.oldest).total_seconds()) if self.oldest else 0.0


def _running(info: PodInfo) -> bool:
    """Bound to a node and not finished: its GPUs are taken."""
    return info.bound and info.phase not in ("Succeeded", "Failed")


def missing_mutations(decision: Decision) -> list[str]:
    """What the policy would still add to the pod (the webhook's own names: node-affinity,
    tolerations, topology-spread, env, kfd-topology-mount); empty when only the records differ (the class
    and mutations annotations, the placed label: pods admitted before it existed lack it)."""
    if all(placement.records_only(op) for op in decision.patch):
        return []
    for op in decision.patch:
        value = op.get("value")
        if op["path"] == _MUTATIONS_POINTER and isinstance(value, str):
            return value.split(",")
        if op["path"] == _ANNOTATIONS and isinstance(value, Mapping):
            return str(value.get(engine.MUTATIONS_ANNOTATION, "")).split(",")
    return ["changes"]  # pragma: no cover - decide always records what it did


@dataclass
class PodAudit:
    """Judges pods one by one into findings, the capacity model and the pending pods per pool (the pods are
    streamed, never all held)."""

    snapshot: Snapshot
    policy: Policy
    capacity: CapacityModel
    devices: DeviceAudit | None = None
    findings: list[Finding] = field(default_factory=list)
    pending: dict[Pool, dict[str, Pending]] = field(default_factory=lambda: {"reserved": {}, "shared": {}})
    pods_checked: int = 0
    nodes: NodeFacts = field(init=False)
    reserved: frozenset[str] = field(init=False)
    # Where a placement: reserved class (inference) belongs: the reserved nodes, and the nodes labelled split
    # (its placement requires either value of the reserved-nodes label).
    inference_nodes: frozenset[str] = field(init=False)
    # Namespaces with GPU pods: their Pod Security level is judged (docs/operations.md, "Pod Security").
    gpu_namespaces: set[str] = field(default_factory=set)
    # Pending pods of a class placed on the reserved pool (judged once the borrowers are counted).
    waiting: list[PodInfo] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reserved = self.snapshot.reserved_node_names
        self.nodes = NodeFacts(reserved_node_names=self.reserved)
        key, value = split_label(self.policy)
        split = {name for name, node in self.snapshot.nodes.items() if node.labels.get(key) == value}
        self.inference_nodes = self.reserved | split

    def restart(self) -> None:
        """The pod list started over (expired continue token): forget what it counted."""
        self.findings.clear()
        for pending in self.pending.values():
            pending.clear()
        self.pods_checked = 0
        self.gpu_namespaces.clear()
        self.waiting.clear()
        self.capacity.clear_pods()

    def namespace(self, name: str) -> NamespaceFacts:
        labels = self.snapshot.namespaces.get(name)
        if labels is not None and self.policy.spec.labels.namespace_mode in labels:
            labels = {k: v for k, v in labels.items() if k != self.policy.spec.labels.namespace_mode}
        return NamespaceFacts(name=name, labels=labels)

    def add(self, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        namespace = str(metadata.get("namespace", ""))
        decision = engine.decide(
            operation="CREATE",
            pod=pod,
            namespace=self.namespace(namespace),
            nodes=self.nodes,
            policy=self.policy,
            claims=self.snapshot.claim_facts(namespace),
            devices=self.snapshot.devices,
        )
        if self.devices is not None:
            held = self.devices.pod(pod, namespace, decision)
            if held is not None:
                self.findings.append(held)
        info = pod_info(pod, self.policy)
        if decision.rule == engine.RULE_NOT_GPU:
            if self.snapshot.allocations.get(namespace):
                self.judge_allocations(pod, namespace, info)
            return  # most pods of a cluster: nothing more to read
        in_scope = decision.rule != engine.RULE_EXCLUDED
        if not in_scope and not info.gpus:
            self.count(pod, info, decision.workload_class or "", 0)  # its claims may hold reserved devices all the same
            return
        self.pods_checked += 1
        self.gpu_namespaces.add(namespace)
        class_name = decision.workload_class or UNCLASSIFIED
        if _running(info):
            self.count(pod, info, decision.workload_class or "", info.gpus)
        elif info.pending:
            placement = self.policy.spec.classes[class_name].placement if class_name in self.policy.spec.classes else ""
            pool: Pool = "reserved" if placement == "reserved" else "shared"
            self.pending[pool].setdefault(class_name, Pending()).add(info.created)
            if pool == "reserved":
                self.waiting.append(info)
        if in_scope and not metadata.get("deletionTimestamp"):
            self.findings.extend(self.judge(pod, info.namespace, info.name, info.uid, info.node, decision))
            borrowing = self.judge_borrowing(pod, info)
            if borrowing is not None:
                self.findings.append(borrowing)

    def judge_borrowing(self, pod: Mapping[str, Any], info: PodInfo) -> Finding | None:
        """A pod on a reserved node that says it borrows (the borrow label the webhook and the placement policy
        write) but is no borrower the scheduler would preempt for inference: not at the borrowers' priority, or
        lending is off."""
        lending = settings(self.policy)
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if info.node not in self.reserved or labels.get(lending.pod_label) != BORROWING:
            return None
        where = f"pod {info.namespace}/{info.name} runs on the reserved node {info.node} as a borrower ({lending.pod_label}=true)"
        if not lending.enabled:
            return Finding(
                "borrower-while-lending-off",
                "Pod",
                info.name,
                f"{where}, but lending is off in the policy: its GPUs are not lent any more; delete it so that its "
                "controller recreates it through the webhook, onto shared nodes (or turn lending on again)",
                info.namespace,
                info.uid,
            )
        if is_borrower(pod, self.policy):
            return None
        spec = pod.get("spec") or {}
        borrower = lending.borrower
        return Finding(
            "borrower-above-borrower-priority",
            "Pod",
            info.name,
            f"{where} at priority {spec.get('priority', 0)} (PriorityClass {spec.get('priorityClassName') or 'none'}), "
            f"not the borrowers' {borrower.name} ({borrower.value}): inference cannot take its GPUs back by "
            "preemption; delete it so that its controller recreates it through the webhook",
            info.namespace,
            info.uid,
        )

    def judge_waiting(self, now: datetime) -> list[Finding]:
        """Inference pods pending longer than the reclaim grace period while borrowers hold reserved GPUs: the
        GPUs lent are not coming back (the borrowers' grace period, a PodDisruptionBudget, a request no node
        fits even without them)."""
        lending = settings(self.policy)
        lent = sum(gpus for holder, gpus in self.capacity.holders(RESERVED) if holder.borrows)
        if not lending.enabled or not lent:
            return []
        grace = self.policy.spec.lending.reclaim_grace_seconds
        found = []
        for info in self.waiting:
            waited = (now - info.created).total_seconds() if info.created is not None else 0.0
            if waited <= grace:
                continue
            found.append(
                Finding(
                    "inference-waits-on-borrowers",
                    "Pod",
                    info.name,
                    f"pod {info.namespace}/{info.name} has waited {round(waited)}s for the reserved pool, longer than "
                    f"the borrowers' grace period ({grace}s), while borrowers hold {lent} reserved GPU"
                    f"{'' if lent == 1 else 's'}: kubectl describe pod -n {info.namespace} {info.name} shows the "
                    "scheduler's reason (docs/operations.md, RocmIsolationInferenceWaitsOnBorrowers)",
                    info.namespace,
                    info.uid,
                )
            )
        return found

    def count(self, pod: Mapping[str, Any], info: PodInfo, class_name: str, resource_gpus: int) -> None:
        """What a running pod holds, in the capacity model (``class_name`` "": unclassified)."""
        if not _running(info):
            return
        cls = self.policy.spec.classes.get(class_name)
        inference = cls is not None and cls.placement == "reserved"
        holder = Holder(
            info.namespace,
            info.name,
            class_name,
            inference=inference,
            uid=info.uid,
            borrower=is_borrower(pod, self.policy),
            created=info.created,
        )
        self.capacity.add_pod(
            holder,
            info.node,
            resource_gpus,
            self.snapshot.claim_results(pod),
            self.snapshot.claim_results(pod, extended=True),
            self.snapshot.published.gpus_by_result(),
        )

    def judge_allocations(self, pod: Mapping[str, Any], namespace: str, info: PodInfo) -> None:
        """The ground truth for a pod the policy sees as no GPU pod: the drivers of the devices its claims
        were allocated. A GPU driver there means a DeviceClass the policy does not recognise."""
        allocated = self.snapshot.allocations.get(namespace, {})
        drivers = set(self.policy.spec.scope.gpu_drivers)
        held = [
            (claim, sorted({driver for driver, _, _ in allocated[claim]} & drivers))
            for claim in claim_names(pod)
            if claim in allocated
        ]
        held = [(claim, found) for claim, found in held if found]
        if not held:
            return
        metadata = pod.get("metadata") or {}
        name, uid = str(metadata.get("name", "")), str(metadata.get("uid", ""))
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        where = f" on the reserved node {node}" if node in self.reserved else (f" on {node}" if node else "")
        claims = ", ".join(f"{claim} ({', '.join(found)})" for claim, found in held)
        self.findings.append(
            Finding(
                "pod-gpu-allocation-not-recognised",
                "Pod",
                name,
                f"pod {namespace}/{name}{where} holds GPU devices through ResourceClaim {claims}, but the policy does "
                "not count its claims as GPU requests, so it was neither placed nor checked: add the claim's "
                "DeviceClass to spec.scope.gpuDeviceClasses (or its driver to gpuDrivers)",
                namespace,
                uid,
            )
        )
        # Taken all the same: the capacity counts them, as class unclassified.
        self.count(pod, info, "", 0)

    def judge(
        self, pod: Mapping[str, Any], namespace: str, name: str, uid: str, node: str, decision: Decision
    ) -> list[Finding]:
        found: dict[str, list[str]] = {}
        where = f"pod {namespace}/{name}"
        for violation in decision.violations:
            if violation.rule == engine.DENY_NODE_NAME:
                rule = "pod-on-reserved-node"
                text = f"{violation.message}; it was admitted before the policy or while the webhook was down: evict it"
            elif violation.rule in _REACH_RULES and node in self.reserved:
                rule, text = "pod-on-reserved-node", violation.message
            elif violation.rule in _REACH_RULES and not node:
                rule, text = "pod-can-reach-reserved-nodes", violation.message
            else:
                rule = "pod-would-be-denied"
                text = f"{violation.message} ({violation.rule}; the pod's controller cannot recreate it)"
            found.setdefault(rule, []).append(text)
        cls = self.policy.spec.classes.get(decision.workload_class or "")
        missing = missing_mutations(decision)
        if cls is not None and cls.placement == "reserved" and node and node not in self.inference_nodes:
            found.setdefault("inference-pod-outside-reserved-pool", []).append(
                f"class {decision.workload_class} pods belong on the reserved nodes, but it runs on {node}: it was "
                "admitted without the reserved placement (webhook down or namespace relabelled); delete it so that "
                "its controller recreates it through the webhook"
            )
        if cls is not None and cls.placement == "unreserved" and not node and "node-affinity" in missing:
            taint = self.policy.spec.reserved_nodes.taint
            if taint is None or taint.effect == "PreferNoSchedule":
                found.setdefault("pod-can-reach-reserved-nodes", []).append(
                    f"class {decision.workload_class} pod lacks the node affinity that keeps it off the reserved nodes "
                    "and no NoSchedule taint stops it; delete it so that its controller recreates it through the webhook"
                )
        if missing:
            found.setdefault("pod-missing-mutations", []).append(
                f"class {decision.workload_class}: the policy would add {', '.join(missing)} (admitted while the "
                "webhook was down, in audit mode, or before the policy changed); recreate the pod to apply them"
            )
        return [
            Finding(rule, "Pod", name, f"{where}: " + "; ".join(texts), namespace, uid) for rule, texts in found.items()
        ]
