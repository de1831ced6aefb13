"""``audit``: running pods, nodes and namespaces against the policy, and the pools' capacity.

The webhook only sees pods as they are admitted; this reads what is already there. Pods are judged
by the admission engine itself (``engine.decide`` on a CREATE of the pod as it is now, with the
reserved nodes, the namespace labels and the namespace's DRA claims read from the cluster): its
violations and the patch it would still send are the findings, so the audit can never disagree
with admission. Two readings of the decision:

- the policy is judged in ``enforce`` mode, and the namespace mode label is left out: in ``audit``
  mode ``decide`` sends no patch, and the point here is what the policy *would* do;
- only patch operations outside ``/metadata/annotations`` count as "missing mutations": the
  annotations are the webhook's record, not isolation.

Rule ids are stable (metrics labels, PolicyReport rules, docs/operations.md).
Exit codes: 0 no finding, 1 findings, 2 the cluster or the policy could not be read.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final, TextIO, get_args

import yaml

from webhook.cluster import dra_capacity
from webhook.cluster.inventory import (
    POOLS,
    NodeInfo,
    PodInfo,
    Pool,
    Snapshot,
    claim_names,
    extended_resource_claim,
    pod_info,
)
from webhook.cluster.kubeapi import ApiError, Forbidden, KubeApi, NotFound, api_path
from webhook.core import engine, patch
from webhook.core.claims import MODE_CLASSES, MODE_TAINTS, RESERVED_DEVICE_TAINT_EFFECT, RESERVED_DEVICE_TAINT_KEY
from webhook.core.decision import Decision, NamespaceFacts, NodeFacts
from webhook.core.policy import Mode, Policy, PolicyError, compile_policy, default_policy, load_policy
from webhook.deploy import device_classes, device_taint_rules, reserved_names
from webhook.deploy.device_classes import DeviceReservation, with_tainted
from webhook.deploy.device_taint_rules import TaintedDevice
from webhook.ops import device_reservation
from webhook.ops.device_reservation import RESERVED, SHARED, Device, device_state, split_label

EXIT_CLEAN: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_ERROR: Final = 2

POLICY_NAME: Final = "rocm-isolation"  # the "policy" of PolicyReport results
SOURCE: Final = "rocm-isolation-webhook"
UNCLASSIFIED: Final = "unclassified"  # GPU pods of excluded namespaces: no class
# Pages decoded ahead while the previous one is judged (bounded: each holds ~500 pods).
PREFETCH_PAGES: Final = 2


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
            "split-node-label-out-of-date",
            "Node",
            "medium",
            "a node's split label (the reserved-nodes key = reservedDevices.nodeLabelValue) disagrees with the "
            "device reservation",
        ),
        Rule(
            "extended-resource-not-on-shared-class",
            "DeviceClass",
            "high",
            "while GPUs are reserved, the shared class's extendedResourceName (amd.com/gpu) maps to another "
            "DeviceClass",
        ),
    )
}
PSS_ENFORCE_LABEL: Final = "pod-security.kubernetes.io/enforce"

_REACH_RULES: Final = frozenset({engine.DENY_NODE_SELECTOR, engine.DENY_NODE_AFFINITY, engine.DENY_TOLERATION})
_ANNOTATIONS: Final = "/metadata/annotations"
_MUTATIONS_POINTER: Final = f"{_ANNOTATIONS}/{patch.escape(engine.MUTATIONS_ANNOTATION)}"
_MODES: Final = get_args(Mode)


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


@dataclass
class PoolCapacity:
    nodes: int = 0
    gpus_allocatable: int = 0
    gpus_requested: dict[str, int] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpusAllocatable": self.gpus_allocatable,
            "gpusRequested": dict(sorted(self.gpus_requested.items())),
            "pendingPods": {
                cls: {"pods": p.pods, "oldestWaitSeconds": round(p.wait_seconds(now))}
                for cls, p in sorted(self.pending.items())
            },
        }


_STATES: Final = (RESERVED, SHARED)


@dataclass
class SplitNodeCapacity:
    """A split node's GPUs under device-level reservation (one per PCI bus ID, partitions counting as their
    GPU; a device without one counts alone and is always shared), and the GPUs the claims of its pods were
    allocated, per side and class of the pods holding them.

    The physical GPU is the unit on both sides and in the pools they add to, not the ``dra_capacity`` slot:
    the reservation is made and enforced per PCI bus ID (``--devices-per-node N`` reserves N of them; the
    classes select, the rules taint, every device of a reserved ID), so a partition is always on its GPU's
    side, N reads as N, and what is allocated is counted in the same unit as what is allocatable."""

    reserved: int = 0
    shared: int = 0
    # reserved / shared -> class -> the GPUs (PCI bus IDs, or pool/device) allocated to claims its pods hold
    allocated: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def allocated_counts(self) -> dict[str, dict[str, int]]:
        return {
            state: {cls: len(gpus) for cls, gpus in sorted(self.allocated.get(state, {}).items())} for state in _STATES
        }


@dataclass
class DeviceCapacity:
    """The split nodes of an active device reservation (the nodes publishing the driver's devices, and the
    nodes labelled split), for the capacity section."""

    driver: str
    reservation: DeviceReservation
    nodes: dict[str, SplitNodeCapacity] = field(default_factory=dict)

    def clear_allocated(self) -> None:
        for node in self.nodes.values():
            node.allocated.clear()

    def add_allocatable(self, pools: Mapping[Pool, PoolCapacity]) -> None:
        """Each split node counts in both pools (it has GPUs on both sides): its reserved GPUs are the
        reserved pool's, its shared ones the shared pool's."""
        for node in self.nodes.values():
            sides: tuple[tuple[Pool, int], ...] = (("reserved", node.reserved), ("shared", node.shared))
            for pool, gpus in sides:
                pools[pool].nodes += 1
                pools[pool].gpus_allocatable += gpus

    def add_requested(self, pools: Mapping[Pool, PoolCapacity]) -> None:
        """The GPUs allocated on each side are requested in that side's pool, per class (the side's names
        are the pools')."""
        allocated = self.totals()[2]
        for pool in POOLS:
            requested = pools[pool].gpus_requested
            for cls, count in allocated[pool].items():
                requested[cls] = requested.get(cls, 0) + count

    def totals(self) -> tuple[int, int, dict[str, dict[str, int]]]:
        allocated: dict[str, dict[str, int]] = {state: {} for state in _STATES}
        for node in self.nodes.values():
            for state, per_class in node.allocated_counts().items():
                for cls, count in per_class.items():
                    allocated[state][cls] = allocated[state].get(cls, 0) + count
        return (
            sum(n.reserved for n in self.nodes.values()),
            sum(n.shared for n in self.nodes.values()),
            {state: dict(sorted(per_class.items())) for state, per_class in allocated.items()},
        )

    def to_json(self) -> dict[str, Any]:
        reserved, shared, allocated = self.totals()
        return {
            "driver": self.driver,
            "mode": MODE_TAINTS if self.reservation.by_taints else MODE_CLASSES,
            "devicesPerNode": self.reservation.devices_per_node,
            "pciBusIds": list(self.reservation.pci_bus_ids),
            "reservedDevices": reserved,
            "sharedDevices": shared,
            "devicesAllocated": allocated,
            "nodes": [
                {
                    "name": name,
                    "reservedDevices": node.reserved,
                    "sharedDevices": node.shared,
                    "devicesAllocated": node.allocated_counts(),
                }
                for name, node in sorted(self.nodes.items())
            ],
        }


@dataclass
class Report:
    now: datetime
    findings: list[Finding] = field(default_factory=list)
    capacity: dict[Pool, PoolCapacity] = field(default_factory=lambda: {pool: PoolCapacity() for pool in POOLS})
    pods_checked: int = 0
    warnings: list[str] = field(default_factory=list)
    # The split nodes while a device-level reservation is active; None otherwise.
    devices: DeviceCapacity | None = None

    def to_json(self) -> dict[str, Any]:
        capacity: dict[str, Any] = {pool: self.capacity[pool].to_json(self.now) for pool in POOLS}
        if self.devices is not None:
            capacity["devices"] = self.devices.to_json()
        return {"findings": [f.to_json() for f in self.findings], "capacity": capacity}

    def counts(self) -> dict[str, int]:
        """Findings per rule, every rule present (0 when none)."""
        counts = dict.fromkeys(RULES, 0)
        for finding in self.findings:
            counts[finding.rule] += 1
        return counts


# -- judging --------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def enforcing(policy: Policy) -> Policy:
    """The policy in enforce mode (in audit mode ``decide`` sends no patch: nothing to compare)."""
    if policy.spec.mode == "enforce":
        return policy
    spec = policy.document.spec.model_copy(update={"mode": "enforce"})
    return compile_policy(policy.document.model_copy(update={"spec": spec}), source=policy.source)


def judge_node(node: NodeInfo, policy: Policy) -> list[Finding]:
    key, value = policy.spec.reserved_nodes.label
    taint = policy.spec.reserved_nodes.taint
    found = []

    def add(rule: str, message: str) -> None:
        found.append(Finding(rule, "Node", node.name, message))

    if node.labelled and taint is not None and not node.tainted:
        add(
            "node-label-without-taint",
            f"node {node.name} is labelled {key}={value} but lacks the taint {taint.key}={taint.value}:{taint.effect}: "
            f"any pod that does not avoid the label can be scheduled onto it; taint it "
            f"(kubectl taint nodes {node.name} {taint.key}={taint.value}:{taint.effect})",
        )
    if node.tainted and not node.labelled and taint is not None:
        add(
            "node-taint-without-label",
            f"node {node.name} has the taint {taint.key}={taint.value}:{taint.effect} but not the label {key}={value}: "
            f"inference pods require the label and other pods do not tolerate the taint, so nothing GPU-bound runs "
            f"there; label it (kubectl label nodes {node.name} {key}={value}) or remove the taint",
        )
    if node.labelled and node.gpus == 0:
        add(
            "reserved-node-without-gpus",
            f"node {node.name} is in the reserved pool ({key}={value}) but has no allocatable AMD GPU: no GPU "
            "resource in its allocatable, no device of the GPU drivers in its ResourceSlices (is the AMD device "
            "plugin or DRA driver running there?)",
        )
    if node.labelled and node.unhealthy:
        add(
            "reserved-node-gpu-unhealthy",
            f"node {node.name} is in the reserved pool and tainted amd-gpu-unhealthy by the AMD GPU operator: its GPUs "
            "take no new inference pods until the operator clears the taint",
        )
    return found


def judge_namespace(name: str, labels: Mapping[str, str], policy: Policy) -> list[Finding]:
    spec = policy.spec
    found = []
    value = labels.get(spec.labels.namespace_class)
    if value is not None and value not in spec.classes:
        found.append(
            Finding(
                "namespace-unknown-class",
                "Namespace",
                name,
                f"namespace {name} is labelled {spec.labels.namespace_class}={value}, which is no class of the policy "
                f"({', '.join(spec.classes)}); its GPU pods get the default class {spec.default_class}",
            )
        )
    mode = labels.get(spec.labels.namespace_mode)
    if mode is not None and mode not in _MODES:
        found.append(
            Finding(
                "namespace-unknown-mode",
                "Namespace",
                name,
                f"namespace {name} is labelled {spec.labels.namespace_mode}={mode}, which is not enforce, warn or "
                f"audit; the policy's mode {spec.mode} applies",
            )
        )
    return found


def judge_namespace_pod_security(name: str, labels: Mapping[str, str], policy: Policy) -> list[Finding]:
    """Pod Security baseline closes the privileged route at admission: a namespace whose classes are all
    kept off the reserved nodes should enforce it (docs/operations.md, "Pod Security"). Judged for the
    namespaces a class label or rule classifies, and those running GPU pods (not every namespace that
    falls to the default class)."""
    if name in policy.spec.excluded_namespaces or not policy.spec.scope.routes.privileged_containers:
        return []
    classes = policy.namespace_classes(name, labels)
    if any(policy.spec.classes[cls].placement != "unreserved" for cls in classes.allowed):
        return []
    level = labels.get(PSS_ENFORCE_LABEL)
    if level in ("baseline", "restricted"):
        return []
    return [
        Finding(
            "namespace-allows-privileged",
            "Namespace",
            name,
            f"namespace {name} (class {', '.join(classes.allowed)}, {classes.source}) "
            + (f"enforces Pod Security {level}" if level else "enforces no Pod Security level")
            + ": its pods may be privileged, and a privileged container sees every GPU of its node; label it "
            f"(kubectl label namespace {name} {PSS_ENFORCE_LABEL}=baseline)",
        )
    ]


def judge_device_classes(snapshot: Snapshot, policy: Policy) -> list[Finding]:
    """GPU DeviceClasses (by driver) that the CEL cannot know: named neither in gpuDeviceClasses nor, for
    their extendedResourceName, in extendedResourceNames."""
    scope = policy.spec.scope
    devices = snapshot.devices
    found = []
    for name in sorted(devices.gpu_classes):
        info = snapshot.device_classes[name]
        missing = []
        if not policy.gpu_device_classes(name):
            missing.append(f"add {name} to spec.scope.gpuDeviceClasses")
        extended = info.extended_resource_name
        if extended and extended not in scope.extended_resource_names and not policy.gpu(extended):
            missing.append(f"add {extended} (its extendedResourceName) to spec.scope.extendedResourceNames")
        if missing:
            found.append(
                Finding(
                    "deviceclass-not-in-policy",
                    "DeviceClass",
                    name,
                    f"DeviceClass {name} hands out devices of a GPU driver ({', '.join(scope.gpu_drivers)}), but the "
                    "ValidatingAdmissionPolicy and the webhook's matchConditions cannot look DeviceClasses up: "
                    + "; ".join(missing),
                )
            )
    return found


# -- device-level reservation ----------------------------------------------------------------------

# Device taint effects that keep a device from the claims that do not tolerate them (None does not).
_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


@dataclass
class DeviceReading:
    """What the audit reads of the ResourceSlices for device-level reservation, besides the GPU slots: the
    reservation driver's devices (PCI bus IDs) and their taints (``Snapshot.read(slice_readers=...)``)."""

    published: device_reservation.PublishedDevices
    taints: dra_capacity.DeviceTaints

    @classmethod
    def of(cls, policy: Policy) -> DeviceReading:
        driver = policy.spec.reserved_devices.driver
        return cls(device_reservation.PublishedDevices(driver), dra_capacity.DeviceTaints(driver))

    @property
    def readers(self) -> tuple[device_reservation.PublishedDevices, dra_capacity.DeviceTaints]:
        return (self.published, self.taints)


@dataclass
class TaintRuleReading:
    """Our DeviceTaintRules (device-level reservation by taints), from the newest resource.k8s.io version
    whose API discovery lists ``devicetaintrules``: none when no version does. ``read`` False: discovery
    or the list was refused (a warning says so), and a split by taints cannot be judged."""

    rules: list[dict[str, Any]] = field(default_factory=list)
    version: str | None = None
    read: bool = True


def read_taint_rules(api: KubeApi, warnings: list[str]) -> TaintRuleReading:
    """Our DeviceTaintRules; a refusal (RBAC) is a warning, as for the other DRA reads."""
    group = device_taint_rules.GROUP
    try:
        versions = api.serving_versions(group, device_taint_rules.VERSIONS, device_taint_rules.RESOURCE)
    except Forbidden as err:
        warnings.append(f"DeviceTaintRules not read (API discovery of {group}: {err})")
        return TaintRuleReading(read=False)
    if not versions:
        return TaintRuleReading()
    version = versions[0]
    found: list[dict[str, Any]] = []
    try:
        for obj in api.list(api_path(f"{group}/{version}", device_taint_rules.RESOURCE), on_restart=found.clear):
            if device_taint_rules.is_ours(obj):
                found.append(obj)
    except NotFound:
        return TaintRuleReading(version=version)
    except Forbidden as err:
        warnings.append(
            f"DeviceTaintRules not read ({err}): the ClusterRole needs get and list on {group} devicetaintrules"
        )
        return TaintRuleReading(version=version, read=False)
    return TaintRuleReading(found, version)


def _rule_node(device: TaintedDevice) -> str:
    """The node a rule's device is on: its annotation (AMD's driver names the pool after the node)."""
    return device.node or device.pool


def _device_text(device: Device) -> str:
    pci = f"PCI bus ID {device.pci_bus_id}" if device.pci_bus_id else "no PCI bus ID"
    return f"{device.name} ({pci}, node {device.node}, pool {device.pool})"


def _taint_text(taint: dra_capacity.Taint) -> str:
    key, value, effect = taint
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


@dataclass
class DeviceAudit:
    """Device-level reservation against the cluster: the reservation the reserved DeviceClass records, the
    driver's devices (PCI bus IDs, taints) in the ResourceSlices, the split nodes' label, who ``amd.com/gpu``
    maps to, and who holds which device (the claims' allocations and ``reservedFor``)."""

    policy: Policy
    # None: no reserved class of ours, or an active one whose devices could not be read (not judged)
    reservation: DeviceReservation | None
    published: dict[str, tuple[Device, ...]]
    tainted: dict[tuple[str, str], tuple[dra_capacity.Taint, ...]]
    nodes: Mapping[str, NodeInfo]
    classes: dict[str, device_reservation.ClassInfo]
    capacity: DeviceCapacity | None = None
    # (namespace, pod) -> [(claim, the pod's uid in reservedFor, the driver's devices allocated to it)]
    held: dict[tuple[str, str], list[tuple[str, str, tuple[Device, ...]]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # By taints: the devices our DeviceTaintRules taint, as the rules name them (node from the annotation)
    rule_devices: tuple[TaintedDevice, ...] = ()

    @classmethod
    def of(cls, snapshot: Snapshot, reading: DeviceReading, rules: TaintRuleReading | None = None) -> DeviceAudit:
        policy = snapshot.policy
        devices = policy.spec.reserved_devices
        classes = device_reservation.class_infos(snapshot.device_class_objects.values())
        info = classes.get(devices.reserved_class_name)
        reservation = device_reservation.current_reservation(policy, classes)
        audit = cls(policy, reservation, {}, {}, snapshot.nodes, classes)
        if info is not None and not info.ours:
            audit.warnings.append(
                f"deviceclass/{info.name} is not managed by rocm-isolation-webhook: device-level reservation not "
                "audited (reservedDevices.reservedClassName names a class pool does not write)"
            )
            audit.reservation = None
            return audit
        if reservation is None or not reservation.active:
            return audit  # released: only the split label is judged
        if not snapshot.slices_read:
            audit.warnings.append(
                f"device-level reservation not audited: deviceclass/{devices.reserved_class_name} records one, but "
                "the ResourceSlices were not read"
            )
            audit.reservation = None
            return audit
        found = rules.rules if rules is not None else []
        if reservation.by_taints:
            if rules is None or not rules.read:
                audit.warnings.append(
                    f"device-level reservation not audited: deviceclass/{devices.reserved_class_name} records a "
                    "split by DeviceTaintRules, but the DeviceTaintRules were not read"
                )
                audit.reservation = None
                return audit
            reservation = with_tainted(reservation, device_taint_rules.tainted_keys(found))
            audit.reservation = reservation
            audit.rule_devices = tuple(
                sorted(
                    (d for obj in found if (d := device_taint_rules.tainted_device(obj)) is not None),
                    key=lambda d: (_rule_node(d), d.pool, d.device),
                )
            )
        elif device_taint_rules.tainted_keys(found):
            audit.warnings.append(
                f"DeviceTaintRules of ours are left from a split by taints: they keep devices from every class while "
                f"the DeviceClasses hold the split; {audit._again(reservation)} deletes them"
            )
        audit.published = reading.published.per_node()
        audit.tainted = reading.taints.tainted()
        audit.capacity = audit._capacity(reservation)
        audit.held = audit._held(snapshot)
        return audit

    def chosen_nodes(self) -> set[str]:
        """The nodes the reservation splits: every node publishing the driver's devices by classes; by taints,
        the nodes of our rules' devices (as published, or as the rules name them)."""
        if self.reservation is None or not self.reservation.by_taints:
            return set(self.published)
        return device_reservation.split_nodes(self.published, self.reservation) | {
            _rule_node(d) for d in self.rule_devices
        }

    def split_nodes(self) -> list[str]:
        """The nodes the reservation splits, and the nodes labelled split."""
        key, value = split_label(self.policy)
        labelled = {name for name, node in self.nodes.items() if node.labels.get(key) == value}
        return sorted(self.chosen_nodes() | labelled)

    def _capacity(self, reservation: DeviceReservation) -> DeviceCapacity:
        capacity = DeviceCapacity(self.policy.spec.reserved_devices.driver, reservation)
        for name in self.split_nodes():
            node = self.nodes.get(name)
            if node is not None and node.labelled:
                continue  # reserved whole (pool apply never splits it): the taint keeps others off all its GPUs
            devices = self.published.get(name, ())
            split = device_reservation.NodeSplit(name, devices, (), reservation, reservation)
            capacity.nodes[name] = SplitNodeCapacity(
                split.count(RESERVED, reservation), split.count(SHARED, reservation)
            )
        return capacity

    def _held(self, snapshot: Snapshot) -> dict[tuple[str, str], list[tuple[str, str, tuple[Device, ...]]]]:
        driver = self.policy.spec.reserved_devices.driver
        by_key = {d.key: d for devices in self.published.values() for d in devices}
        held: dict[tuple[str, str], list[tuple[str, str, tuple[Device, ...]]]] = {}
        for namespace, claims in snapshot.claim_holders.items():
            allocated = snapshot.allocations.get(namespace, {})
            for claim, pods in claims.items():
                devices = tuple(
                    by_key[(pool, name)]
                    for result_driver, pool, name in allocated.get(claim, ())
                    if result_driver == driver and (pool, name) in by_key
                )
                if devices:
                    for pod, uid in pods:
                        held.setdefault((namespace, pod), []).append((claim, uid, devices))
        return held

    # -- nodes and classes ----------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        if self.reservation is None:
            return []
        found = self._label_findings(self.reservation)
        if self.reservation.active:
            found += self._missing(self.reservation)
            found += self._unhealthy(self.reservation)
            found += self._ownership(self.reservation)
        return found

    def _again(self, reservation: DeviceReservation) -> str:
        again = f"rocm-isolation-webhook pool apply --devices-per-node {reservation.devices_per_node}"
        chosen = self.chosen_nodes() if reservation.by_taints else set()
        return f"{again} --nodes {','.join(sorted(chosen))}" if chosen else again

    def _label_findings(self, reservation: DeviceReservation) -> list[Finding]:
        key, value = split_label(self.policy)
        whole = self.policy.spec.reserved_nodes.label[1]
        driver = self.policy.spec.reserved_devices.driver
        found = []
        if reservation.active:
            chosen = self.chosen_nodes()
            for name in sorted(set(self.published) - chosen) if reservation.by_taints else ():
                node = self.nodes.get(name)
                if node is not None and node.labels.get(key) == value:
                    found.append(
                        Finding(
                            "split-node-label-out-of-date",
                            "Node",
                            name,
                            f"node {name} carries the split label {key}={value}, but no DeviceTaintRule of ours "
                            f"taints a device of it (the device reservation by taints splits "
                            f"{', '.join(sorted(chosen)) or 'no node'}): inference pods are placed there with no "
                            f"reserved GPU; {self._again(reservation)} removes the label",
                        )
                    )
            for name in sorted(chosen & set(self.published)):
                node = self.nodes.get(name)
                current = node.labels.get(key) if node is not None else value
                if current == value:
                    continue
                if current is None:
                    why = f"lacks the label {key}={value}: inference pods are not placed there, so its reserved GPUs sit idle"
                elif current == whole:
                    why = (
                        f"is labelled {key}={whole} (reserved whole): a node is reserved whole or split, never both; "
                        f"release it first (rocm-isolation-webhook pool release --nodes {name})"
                    )
                else:
                    why = f"is labelled {key}={current}, not {value}: inference pods are not placed there"
                found.append(
                    Finding(
                        "split-node-label-out-of-date",
                        "Node",
                        name,
                        f"node {name} publishes {driver} devices, which the active device reservation splits, but "
                        f"{why}; {self._again(reservation)} labels it",
                    )
                )
            return found
        for name, node in sorted(self.nodes.items()):
            if node.labels.get(key) == value:
                found.append(
                    Finding(
                        "split-node-label-out-of-date",
                        "Node",
                        name,
                        f"node {name} carries the split label {key}={value}, but the device reservation is released "
                        f"(deviceclass/{self.policy.spec.reserved_devices.reserved_class_name}): inference pods are "
                        "still placed there; rocm-isolation-webhook pool release --devices --all removes the label",
                    )
                )
        return found

    def _missing(self, reservation: DeviceReservation) -> list[Finding]:
        if reservation.by_taints:
            return self._missing_tainted(reservation)
        key, value = split_label(self.policy)
        n = reservation.devices_per_node
        found = []
        for name in self.split_nodes():
            devices = self.published.get(name, ())
            reserved = [d for d in devices if device_state(d, reservation) == RESERVED]
            ids = device_reservation.gpu_ids(reserved)
            if len(ids) >= n:
                continue
            published_ids = {d.pci_bus_id for d in devices}
            absent = [i for i in reservation.pci_bus_ids if i not in published_ids]
            node = self.nodes.get(name)
            why = (
                f"labelled {key}={value}"
                if node is not None and node.labels.get(key) == value
                else f"publishes {self.policy.spec.reserved_devices.driver} devices"
            )
            have = (
                ", ".join(f"{i} ({', '.join(d.name for d in reserved if d.pci_bus_id == i)})" for i in ids)
                if ids
                else "none"
            )
            found.append(
                Finding(
                    "reserved-device-missing",
                    "Node",
                    name,
                    f"node {name} is split ({why}) but has {len(ids)} reserved GPU{'' if len(ids) == 1 else 's'}, "
                    f"not {n}: reserved there: {have}; the driver publishes no device there with the reserved PCI bus "
                    f"ID{'' if len(absent) == 1 else 's'} {', '.join(absent) or '-'} (a GPU that fell off the bus or "
                    "was unbound, a driver that stopped publishing, or a node whose GPUs sit in other PCI slots). "
                    "Check the node's GPUs and the DRA driver; rocm-isolation-webhook pool plan --devices-per-node "
                    f"{n} shows the split of the devices published now",
                )
            )
        return found

    def _missing_tainted(self, reservation: DeviceReservation) -> list[Finding]:
        """By taints: per node (as the rules name it), our rules naming a device no ResourceSlice publishes (its
        name changed after a reboot, a GPU gone, a node gone), and a chosen node whose rules taint fewer of its
        GPUs than N (or all it has, when fewer)."""
        n = reservation.devices_per_node
        published = {d.key for devices in self.published.values() for d in devices}
        lost: dict[str, list[TaintedDevice]] = {}
        for device in self.rule_devices:
            if device.key not in published:
                lost.setdefault(_rule_node(device), []).append(device)
        found = []
        # A node labelled split that no rule names is the label's finding (split-node-label-out-of-date).
        for name in sorted(self.chosen_nodes()):
            devices = self.published.get(name, ())
            reserved = device_reservation.gpu_ids(d for d in devices if device_state(d, reservation) == RESERVED)
            short = len(reserved) < min(n, device_reservation.gpu_count(devices))
            if not lost.get(name) and not short:
                continue
            why = []
            if lost.get(name):
                gone = lost[name]
                why.append(
                    f"DeviceTaintRule{'' if len(gone) == 1 else 's'} "
                    + ", ".join(
                        f"{device_taint_rules.rule_name(d.pool, d.device)} ({d.device} of pool {d.pool}, PCI bus ID "
                        f"{d.pci_bus_id or '-'})"
                        for d in gone
                    )
                    + f" taint{'s' if len(gone) == 1 else ''} a device no ResourceSlice publishes (a device renamed "
                    "after a reboot, a GPU that fell off the bus or was unbound, or a node gone)"
                )
            if short:
                why.append(
                    f"its rules taint {len(reserved)} GPU{'' if len(reserved) == 1 else 's'} "
                    f"({', '.join(reserved) or 'none'}), not {n}"
                )
            found.append(
                Finding(
                    "reserved-device-missing",
                    "Node",
                    name,
                    f"node {name} is split by DeviceTaintRules but: {'; '.join(why)}. Check the node's GPUs and the "
                    f"DRA driver; {self._again(reservation)} derives the rules from the devices published now",
                )
            )
        return found

    def _unhealthy(self, reservation: DeviceReservation) -> list[Finding]:
        found = []
        for name in sorted(self.published):
            bad = []
            for device in self.published[name]:
                taints = [t for t in self.tainted.get(device.key, ()) if t[2] in _BLOCKING_EFFECTS]
                if taints and device_state(device, reservation) == RESERVED:
                    bad.append(f"{_device_text(device)} tainted {', '.join(_taint_text(t) for t in taints)}")
            if bad:
                found.append(
                    Finding(
                        "reserved-device-unhealthy",
                        "Node",
                        name,
                        f"node {name}: GPU{'' if len(bad) == 1 else 's'} reserved for inference "
                        f"{'is' if len(bad) == 1 else 'are'} tainted in the driver's ResourceSlice: {'; '.join(bad)}. "
                        "The scheduler gives a tainted device only to claims that tolerate the taint: reserved "
                        "capacity lost until the driver clears it (check the GPU and the driver's log)",
                    )
                )
        return found

    def _ownership(self, reservation: DeviceReservation) -> list[Finding]:
        owner = device_reservation.ownership(self.policy, self.classes)
        if not owner.name or (owner.owner_now is not None and owner.owner_now.name == owner.shared_class):
            return []
        if owner.owner_now is None:
            now = f"no DeviceClass names {owner.name}: pods asking for it on DRA nodes get no device"
        else:
            now = (
                f"{owner.name} maps to deviceclass/{owner.owner_now.name} (the newest DeviceClass naming it, created "
                f"{owner.owner_now.created or 'at an unknown time'}), not to deviceclass/{owner.shared_class}: pods "
                f"asking for {owner.name} on DRA nodes can get GPUs reserved for inference"
            )
        return [
            Finding(
                "extended-resource-not-on-shared-class",
                "DeviceClass",
                owner.shared_class,
                f"{now}; {self._again(reservation)} makes deviceclass/{owner.shared_class} the newest class naming "
                f'it (AMD\'s chart stops its class naming it with deviceClass.extendedResourceName: "")',
            )
        ]

    # -- pods ---------------------------------------------------------------------------------------------

    def _entries(self, namespace: str, name: str, uid: str) -> list[tuple[str, tuple[Device, ...]]]:
        """The pod's claims holding the driver's devices, and those devices (a claim reserved for an earlier
        pod of the same name, another uid, is not its)."""
        return [
            (claim, devices)
            for claim, holder, devices in self.held.get((namespace, name), ())
            if not holder or not uid or holder == uid
        ]

    def split_pools(self) -> frozenset[tuple[str, str]]:
        """(driver, pool) of the split nodes' devices: ``pod`` counts what is allocated there, per side."""
        if self.capacity is None:
            return frozenset()
        driver = self.policy.spec.reserved_devices.driver
        return frozenset((driver, d.pool) for name in self.capacity.nodes for d in self.published.get(name, ()))

    def counts_claim(self, namespace: str, name: str, uid: str, claim: str) -> bool:
        """Whether ``pod`` counts the devices of the pod's ``claim`` (allocated on a split node)."""
        nodes = self.capacity.nodes if self.capacity is not None else {}
        return any(
            found == claim and any(d.node in nodes for d in devices)
            for found, devices in self._entries(namespace, name, uid)
        )

    def pod(self, pod: Mapping[str, Any], namespace: str, decision: Decision) -> Finding | None:
        """Counts the devices the pod holds in the capacity; a finding when it is of a class other than
        inference and holds reserved ones."""
        if self.capacity is None or self.reservation is None:
            return None
        metadata = pod.get("metadata") or {}
        name, uid = str(metadata.get("name", "")), str(metadata.get("uid", ""))
        entries = self._entries(namespace, name, uid)
        if not entries:
            return None
        class_name = decision.workload_class or UNCLASSIFIED
        reserved: list[tuple[str, list[Device]]] = []
        for claim, devices in entries:
            on_reserved = []
            for device in devices:
                state = device_state(device, self.reservation)
                node = self.capacity.nodes.get(device.node)
                if node is not None:
                    node.allocated.setdefault(state, {}).setdefault(class_name, set()).add(
                        device_reservation.gpu_key(device)
                    )
                if state == RESERVED:
                    on_reserved.append(device)
            if on_reserved:
                reserved.append((claim, on_reserved))
        cls = self.policy.spec.classes.get(decision.workload_class or "")
        if not reserved or cls is None or cls.placement == "reserved" or metadata.get("deletionTimestamp"):
            return None
        claims = "; ".join(
            f"ResourceClaim {claim} was allocated {', '.join(_device_text(d) for d in devices)}"
            for claim, devices in reserved
        )
        return Finding(
            "reserved-device-held-by-other-class",
            "Pod",
            name,
            f"pod {namespace}/{name} (class {decision.workload_class}) holds GPUs reserved for inference: {claims} "
            + (
                "(allocated before the reservation, or through a claim that tolerates the taint "
                f"{RESERVED_DEVICE_TAINT_KEY}:{RESERVED_DEVICE_TAINT_EFFECT})"
                if self.reservation.by_taints
                else "(allocated before the reservation, or through a DeviceClass that selects every device of "
                f"{self.policy.spec.reserved_devices.driver})"
            )
            + f"; {self._again(self.reservation)} --evict evicts it (its "
            "controller recreates it through the webhook, onto shared GPUs)",
            namespace,
            uid,
        )


def _running(info: PodInfo) -> bool:
    """Bound to a node and not finished: its GPUs are taken."""
    return info.bound and info.phase not in ("Succeeded", "Failed")


def missing_mutations(decision: Decision) -> list[str]:
    """What the policy would still add to the pod (the webhook's own names: node-affinity,
    tolerations, topology-spread, env, kfd-topology-mount); empty when only the records differ (the class
    and mutations annotations, the placed label: pods admitted before it existed lack it)."""
    if all(engine.records_only(op) for op in decision.patch):
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
    """Judges pods one by one into a Report (the pods are streamed, never all held)."""

    snapshot: Snapshot
    report: Report
    devices: DeviceAudit | None = None
    policy: Policy = field(init=False)
    nodes: NodeFacts = field(init=False)
    reserved: frozenset[str] = field(init=False)
    # Where a placement: reserved class (inference) belongs: the reserved nodes, and the nodes labelled split
    # (its placement requires either value of the reserved-nodes label).
    inference_nodes: frozenset[str] = field(init=False)
    # Namespaces with GPU pods: their Pod Security level is judged (docs/operations.md, "Pod Security").
    gpu_namespaces: set[str] = field(default_factory=set)
    # The DRA GPU slots already counted as requested (a claim several pods share counts once).
    dra_counted: set[dra_capacity.Slot] = field(default_factory=set)
    # The split nodes' pools of the reservation driver: counted per side by ``devices``, not as slots.
    split_pools: frozenset[tuple[str, str]] = field(init=False)
    _start: tuple[list[Finding], int] = field(init=False)

    def __post_init__(self) -> None:
        self.policy = enforcing(self.snapshot.policy)
        self.reserved = self.snapshot.reserved_node_names
        self.nodes = NodeFacts(reserved_node_names=self.reserved)
        key, value = split_label(self.policy)
        split = {name for name, node in self.snapshot.nodes.items() if node.labels.get(key) == value}
        self.inference_nodes = self.reserved | split
        self.split_pools = self.devices.split_pools() if self.devices is not None else frozenset()
        self._start = (list(self.report.findings), 0)

    def restart(self) -> None:
        """The pod list started over (expired continue token): forget what it counted."""
        self.report.findings = list(self._start[0])
        for pool in POOLS:
            self.report.capacity[pool].gpus_requested.clear()
            self.report.capacity[pool].pending.clear()
        self.report.pods_checked = 0
        self.dra_counted.clear()
        if self.report.devices is not None:
            self.report.devices.clear_allocated()

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
                self.report.findings.append(held)
        if decision.rule == engine.RULE_NOT_GPU:
            if self.snapshot.allocations.get(namespace):
                self.judge_allocations(pod, namespace)
            return  # most pods of a cluster: nothing more to read
        in_scope = decision.rule != engine.RULE_EXCLUDED
        info = pod_info(pod, self.policy)
        if not in_scope and not info.gpus:
            return
        self.report.pods_checked += 1
        self.gpu_namespaces.add(namespace)
        class_name = decision.workload_class or UNCLASSIFIED
        if _running(info):
            gpus = self._resource_gpus(pod, info) + self.snapshot.dra_gpus_held(pod, self.dra_counted, self.split_pools)
            if gpus:
                requested = self._requested(info.node)
                requested[class_name] = requested.get(class_name, 0) + gpus
        elif info.pending:
            placement = self.policy.spec.classes[class_name].placement if class_name in self.policy.spec.classes else ""
            pool: Pool = "reserved" if placement == "reserved" else "shared"
            self.report.capacity[pool].pending.setdefault(class_name, Pending()).add(info.created)
        if in_scope and not metadata.get("deletionTimestamp"):
            self.report.findings.extend(self.judge(pod, info.namespace, info.name, info.uid, info.node, decision))

    def judge_allocations(self, pod: Mapping[str, Any], namespace: str) -> None:
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
        self.report.findings.append(
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
        # Taken all the same: capacity counts them, as class unclassified.
        running = _running(pod_info(pod, self.policy))
        gpus = self.snapshot.dra_gpus_held(pod, self.dra_counted, self.split_pools) if running else 0
        if gpus:
            requested = self._requested(node)
            requested[UNCLASSIFIED] = requested.get(UNCLASSIFIED, 0) + gpus

    def _resource_gpus(self, pod: Mapping[str, Any], info: PodInfo) -> int:
        """The GPUs of the pod's resources, unless they are the devices of its extended resources' claim on a
        split node (counted per side by ``devices``)."""
        made = extended_resource_claim(pod)
        if made and self.devices is not None and self.devices.counts_claim(info.namespace, info.name, info.uid, made):
            return 0
        return info.gpus

    def _requested(self, node: str) -> dict[str, int]:
        """GPUs requested per class in the pool of ``node`` (shared when the node is unknown)."""
        info = self.snapshot.nodes.get(node)
        pool: Pool = info.pool if info is not None else "shared"
        return self.report.capacity[pool].gpus_requested

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


def _judge_reserved_node_names(api: KubeApi, labelled: list[str], report: Report) -> None:
    """The backstop's params ConfigMap against the labelled nodes (reserved_names.py)."""
    path = f"{reserved_names.CONFIGMAP_PATH}/{reserved_names.PARAMS_CONFIGMAP}"
    try:
        data: dict[str, str] = api.get(path).get("data") or {}
    except NotFound:
        # Until the first pool apply (or on a cluster reserved by hand): said, not a finding.
        report.warnings.extend(reserved_names.disagreement(None, labelled))
        return
    except Forbidden as err:
        report.warnings.append(f"the backstop's reserved node names were not checked: {err}")
        return
    for message in reserved_names.disagreement(data, labelled):
        report.findings.append(
            Finding(
                "reserved-node-names-out-of-date",
                "ConfigMap",
                reserved_names.PARAMS_CONFIGMAP,
                message,
                namespace=reserved_names.NAMESPACE,
            )
        )


def _taint_rules(api: KubeApi, snapshot: Snapshot, report: Report) -> TaintRuleReading | None:
    """Our DeviceTaintRules, read only while our reserved class records an active reservation (none
    otherwise: nothing of them is judged)."""
    obj = snapshot.device_class_objects.get(snapshot.policy.spec.reserved_devices.reserved_class_name)
    reservation = device_classes.reservation_of(obj)
    if reservation is None or not reservation.active:
        return None
    return read_taint_rules(api, report.warnings)


def run_audit(api: KubeApi, policy: Policy, *, now: datetime | None = None) -> Report:
    """Read the cluster and judge it. Raises ``ApiError`` when it cannot be read."""
    reading = DeviceReading.of(policy)
    snapshot = Snapshot.read(api, policy, slice_readers=reading.readers)
    report = Report(now=now or datetime.now(UTC), warnings=list(snapshot.warnings))
    for node in snapshot.nodes.values():
        report.findings.extend(judge_node(node, policy))
    _judge_reserved_node_names(api, [n.name for n in snapshot.nodes.values() if n.labelled], report)
    # A namespace being deleted is not judged itself (its pods are).
    namespaces = {name: labels for name, labels in snapshot.namespaces.items() if name not in snapshot.terminating}
    for name, labels in namespaces.items():
        report.findings.extend(judge_namespace(name, labels, policy))
    report.findings.extend(judge_device_classes(snapshot, policy))
    devices = DeviceAudit.of(snapshot, reading, _taint_rules(api, snapshot, report))
    report.warnings.extend(devices.warnings)
    report.findings.extend(devices.findings())
    report.devices = devices.capacity
    split = devices.capacity.nodes if devices.capacity is not None else {}
    for node in snapshot.nodes.values():
        if node.name not in split and (node.labelled or node.gpus):
            capacity = report.capacity[node.pool]
            capacity.nodes += 1
            capacity.gpus_allocatable += node.gpus
    pods = PodAudit(snapshot, report, devices if devices.capacity is not None else None)
    with _collector_paused():
        for pod in Snapshot.pods(api, on_restart=pods.restart):
            pods.add(pod)
    if devices.capacity is not None:
        # One model: the split nodes' sides in the pools (pool = whole nodes + the split nodes' side).
        devices.capacity.add_allocatable(report.capacity)
        devices.capacity.add_requested(report.capacity)
    for name, labels in sorted(namespaces.items()):
        explicit = policy.namespace_classes(name, labels).source != "the policy's defaultClass"
        if explicit or name in pods.gpu_namespaces:
            report.findings.extend(judge_namespace_pod_security(name, labels, policy))
    return report


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cycle collector while pods stream through. A page of JSON holds no reference cycle
    (reference counting frees it), yet its ~100,000 new containers trigger collections that walk
    them for nothing: with the collector on, decoding a page takes up to twice as long."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# -- output ---------------------------------------------------------------------------------------


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        out.write(
            "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "   " + row[-1] + "\n"
        )


def _per_class(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{cls}={value}" for cls, value in sorted(values.items())) or "-"


def write_table(report: Report, out: TextIO) -> None:
    if report.findings:
        rows = [["RULE", "KIND", "NAME", "MESSAGE"]]
        for f in report.findings:
            rows.append([f.rule, f.kind, f"{f.namespace}/{f.name}" if f.namespace else f.name, f.message])
        _table(rows, out)
    else:
        out.write(f"No findings ({report.pods_checked} GPU pods checked).\n")
    out.write("\n")
    rows = [["POOL", "NODES", "GPUS", "REQUESTED", "PENDING (OLDEST WAIT)"]]
    for pool in POOLS:
        capacity = report.capacity[pool]
        pending = {cls: f"{p.pods} ({round(p.wait_seconds(report.now))}s)" for cls, p in capacity.pending.items()}
        rows.append(
            [
                pool,
                str(capacity.nodes),
                str(capacity.gpus_allocatable),
                _per_class(capacity.gpus_requested),
                _per_class(pending),
            ]
        )
    _table(rows, out)
    if report.devices is not None:
        write_device_table(report.devices, out)


def write_device_table(devices: DeviceCapacity, out: TextIO) -> None:
    """The split nodes of the active device reservation: their reserved and shared GPUs, and the GPUs
    allocated on each side per class."""
    out.write(
        f"\nSplit nodes (device-level reservation, driver {devices.driver}): "
        f"{device_reservation.reservation_text(devices.reservation)}\n"
    )
    rows = [["NODE", "RESERVED", "SHARED", "ALLOCATED ON RESERVED", "ALLOCATED ON SHARED"]]
    for name, node in sorted(devices.nodes.items()):
        counts = node.allocated_counts()
        rows.append(
            [name, str(node.reserved), str(node.shared), _per_class(counts[RESERVED]), _per_class(counts[SHARED])]
        )
    reserved, shared, allocated = devices.totals()
    rows.append(["(all)", str(reserved), str(shared), _per_class(allocated[RESERVED]), _per_class(allocated[SHARED])])
    _table(rows, out)


def policy_reports(report: Report) -> list[dict[str, Any]]:
    """A PolicyReport per namespace with findings, and one ClusterPolicyReport (nodes, namespaces,
    DeviceClasses), in ``wgpolicyk8s.io/v1alpha2`` as Kyverno and Policy Reporter read them: what the
    background audit writes to the cluster (``webhook.ops.reports``)."""
    from webhook.ops import reports

    return reports.documents(report.findings, int(report.now.timestamp()), reports.WGPOLICY)


def write_output(report: Report, output: str, out: TextIO) -> None:
    if output == "json":
        out.write(json.dumps(report.to_json(), indent=2) + "\n")
    elif output == "policyreport":
        yaml.safe_dump_all(policy_reports(report), out, sort_keys=False, explicit_start=True)
    else:
        write_table(report, out)


# -- command --------------------------------------------------------------------------------------

EPILOG = (
    """\
rules:
"""
    + "\n".join(f"  {rule.id:38} {rule.title}" for rule in RULES.values())
    + """

exit codes: 0 no finding, 1 findings, 2 the cluster or the policy could not be read
"""
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "--kubeconfig", help="kubeconfig to read the cluster with (default: in-cluster, $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    parser.add_argument(
        "-n",
        "--namespace",
        help="report the pods and the Namespace of this namespace only (nodes are cluster-scoped: all reported)",
    )
    parser.add_argument("--policy", metavar="FILE", help="IsolationPolicy YAML (default: the built-in policy)")
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "policyreport"),
        default="table",
        help="table (default), json, or policyreport (wgpolicyk8s.io/v1alpha2 PolicyReport/ClusterPolicyReport YAML)",
    )
    parser.add_argument(
        "--page-size", type=int, default=500, help="objects per list request (limit/continue; default: 500)"
    )


def _in_namespace(finding: Finding, namespace: str) -> bool:
    """As kubectl's ``-n``: namespaced objects of that namespace, the Namespace itself, cluster-scoped objects."""
    if finding.namespace is not None:
        return finding.namespace == namespace
    return finding.kind != "Namespace" or finding.name == namespace


def _explain(err: ApiError) -> str:
    text = f"audit: cannot read the cluster: {err}"
    if isinstance(err, Forbidden):
        text += (
            "\n  the audit needs get/list on nodes, namespaces and pods, and on resource.k8s.io "
            "resourceclaims and resourceclaimtemplates"
        )
    return text


def main(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy) if args.policy else default_policy()
    except PolicyError as err:
        print(f"audit: {err}", file=sys.stderr)
        return EXIT_ERROR
    if args.page_size < 1:
        print("audit: --page-size must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    try:
        api = KubeApi.connect(args.kubeconfig, context=args.context, page_size=args.page_size, prefetch=PREFETCH_PAGES)
        try:
            report = run_audit(api, policy)
        finally:
            api.close()
        if args.namespace:
            report.findings = [f for f in report.findings if _in_namespace(f, args.namespace)]
    except ApiError as err:
        print(_explain(err), file=sys.stderr)
        return EXIT_ERROR
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    write_output(report, args.output, sys.stdout)
    return EXIT_FINDINGS if report.findings else EXIT_CLEAN
