"""What ``audit`` finds: the rule table (stable ids: metrics labels, PolicyReport rules, docs/operations.md)
and the finding itself. Its own module so that the reports (``reports.py``), the background audit
(``service/``) and the audit read the same table without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

POLICY_NAME: Final = "rocm-isolation"  # the "policy" of PolicyReport results
SOURCE: Final = "rocm-isolation-webhook"


@dataclass(frozen=True)
class Rule:
    id: str
    kind: str  # the kind of object the finding is about
    severity: str  # PolicyReport severity
    title: str  # what it means (docs, table)


RULES: Final[dict[str, Rule]] = {
    rule.id: rule
    for rule in (
        Rule("pod-on-reserved-node", "Pod", "high", "a pod of a class that may not use reserved nodes runs on one"),
        Rule(
            "pod-can-reach-reserved-nodes",
            "Pod",
            "high",
            "a pending pod of a class that may not use reserved nodes can be scheduled onto one",
        ),
        Rule(
            "inference-pod-outside-reserved-pool",
            "Pod",
            "medium",
            "a pod of a reserved class (inference) runs on a node outside the reserved pool",
        ),
        Rule("pod-missing-mutations", "Pod", "medium", "a GPU pod lacks what the policy would add to it today"),
        Rule("pod-would-be-denied", "Pod", "medium", "a running pod that the policy would deny if it were created now"),
        Rule(
            "node-label-without-taint", "Node", "high", "a node labelled for the reserved pool lacks the reserved taint"
        ),
        Rule("node-taint-without-label", "Node", "medium", "a node has the reserved taint without the pool label"),
        Rule("reserved-node-without-gpus", "Node", "medium", "a reserved node has no allocatable AMD GPU"),
        Rule(
            "reserved-node-gpu-unhealthy",
            "Node",
            "high",
            "a reserved node is tainted amd-gpu-unhealthy by the AMD GPU operator: capacity lost",
        ),
        Rule(
            "namespace-unknown-class", "Namespace", "medium", "a namespace's class label names no class of the policy"
        ),
        Rule("namespace-unknown-mode", "Namespace", "low", "a namespace's mode label is not enforce, warn or audit"),
        Rule(
            "reserved-node-names-out-of-date",
            "ConfigMap",
            "high",
            "the reserved node names the backstop reads (ConfigMap rocm-isolation-reserved-node-names) disagree with "
            "the nodes labelled for the reserved pool",
        ),
        Rule(
            "namespace-allows-privileged",
            "Namespace",
            "low",
            "a namespace of a class kept off the reserved nodes does not enforce Pod Security baseline or restricted: "
            "its pods may be privileged and see every GPU of their node",
        ),
        Rule(
            "deviceclass-not-in-policy",
            "DeviceClass",
            "medium",
            "a DeviceClass that hands out GPUs is not named in the policy's scope: the backstop and the webhook's "
            "matchConditions do not see pods that ask for it by its extended resource",
        ),
        Rule(
            "pod-gpu-allocation-not-recognised",
            "Pod",
            "high",
            "a pod holds devices of a GPU driver through a claim that the policy does not count as a GPU request",
        ),
        # Device-level reservation (pool apply --devices-per-node N), judged while the reserved DeviceClass
        # records one (the split label also once it is released).
        Rule(
            "reserved-device-held-by-other-class",
            "Pod",
            "high",
            "a pod of a class other than inference holds a GPU reserved for inference (device-level reservation)",
        ),
        Rule(
            "reserved-device-missing",
            "Node",
            "high",
            "a split node has fewer reserved GPUs than the device reservation's devices per node",
        ),
        Rule(
            "reserved-device-unhealthy",
            "Node",
            "high",
            "a GPU reserved for inference is tainted NoSchedule or NoExecute in its driver's ResourceSlice",
        ),
        Rule(
            "reserved-device-memory-mode-unpinned",
            "Node",
            "high",
            "a split node's GPUs are published in several memory partition modes (AMD AutoPartition) and the device "
            "reservation pins none: either side's claim can set the node-wide mode and lock the other out",
        ),
        Rule(
            "split-node-label-out-of-date",
            "Node",
            "medium",
            "a node's split label (the reserved-nodes key = reservedDevices.nodeLabelValue) disagrees with the "
            "device reservation",
        ),
        # Lending (policy spec.lending).
        Rule(
            "borrower-above-borrower-priority",
            "Pod",
            "high",
            "a pod borrowing a reserved node is not at the borrowers' priority: inference cannot preempt it",
        ),
        Rule(
            "borrower-while-lending-off",
            "Pod",
            "medium",
            "a pod borrowing a reserved node runs while lending is off in the policy",
        ),
        Rule(
            "inference-waits-on-borrowers",
            "Pod",
            "high",
            "an inference pod has waited longer than the borrowers' grace period while borrowers hold reserved GPUs",
        ),
        Rule(
            "extended-resource-not-on-shared-class",
            "DeviceClass",
            "high",
            "while GPUs are reserved, the shared class's extendedResourceName (amd.com/gpu) maps to another "
            "DeviceClass",
        ),
        # The GPUs' own word (AMD's device metrics exporter, audit --gpu-metrics; issue 48): judged on reserved GPUs.
        Rule(
            "reserved-gpu-used-unallocated",
            "Node",
            "critical",
            "a reserved GPU (on a split node: one that may be reserved) has been in use (activity or VRAM) for the "
            "policy's window with no pod allocated it: a process outside Kubernetes, or a container that reached it "
            "through AMD_VISIBLE_DEVICES",
        ),
        Rule(
            "reserved-gpu-used-by-other-class",
            "Pod",
            "high",
            "a running pod of a class kept off reserved capacity is using a reserved GPU, confirmed by the GPU",
        ),
        Rule("reserved-gpu-unhealthy", "Node", "high", "a reserved GPU reports gpu_health 0"),
        Rule(
            "reserved-gpu-hot",
            "Node",
            "medium",
            "a reserved GPU is hotter than the policy's spec.gpuMetrics.temperatureCelsius",
        ),
        Rule(
            "reserved-gpu-inference-load-high",
            "Node",
            "low",
            "inference keeps a reserved GPU busier than the policy's spec.gpuMetrics.inferenceLoadPercent",
        ),
    )
}


@dataclass(frozen=True)
class Finding:
    rule: str
    kind: str
    name: str
    message: str
    namespace: str | None = None
    uid: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "kind": self.kind}
        if self.namespace is not None:
            out["namespace"] = self.namespace
        out["name"] = self.name
        out["message"] = self.message
        if self.uid:
            out["uid"] = self.uid
        return out
