"""``audit`` of device-level reservation: the reservation the reserved DeviceClass records against the
driver's devices (PCI bus IDs, taints) in the ResourceSlices, the split nodes' label, who ``amd.com/gpu``
maps to, and who holds which reserved device. Its capacity is the capacity model's (``capacity.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.cluster.inventory import NodeInfo, Snapshot
from webhook.cluster.kubeapi import Forbidden, KubeApi, NotFound, api_path
from webhook.cluster.slices import Device, Taint, gpu_count, gpu_ids
from webhook.core.claims import RESERVED_DEVICE_TAINT_EFFECT, RESERVED_DEVICE_TAINT_KEY
from webhook.core.decision import Decision
from webhook.core.lending import is_borrower
from webhook.core.policy import Policy
from webhook.deploy import device_taint_rules
from webhook.deploy.device_classes import DeviceReservation, with_tainted
from webhook.deploy.device_taint_rules import TaintedDevice
from webhook.ops.audit.findings import Finding
from webhook.ops.capacity import RESERVED, device_state, split_node_names, split_nodes
from webhook.ops.devices import ownership as device_ownership
from webhook.ops.devices.memory_mode import unpinned, unpinned_message
from webhook.ops.devices.split import split_label

# Device taint effects that keep a device from the claims that do not tolerate them (None does not).
_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


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


def _taint_text(taint: Taint) -> str:
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
    tainted: dict[tuple[str, str], tuple[Taint, ...]]
    nodes: Mapping[str, NodeInfo]
    classes: dict[str, device_ownership.ClassInfo]
    # The nodes the active reservation splits, as the capacity counts them (None: not judged)
    split: frozenset[str] | None = None
    # (namespace, pod) -> [(claim, the pod's uid in reservedFor, the driver's devices allocated to it)]
    held: dict[tuple[str, str], list[tuple[str, str, tuple[Device, ...]]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # By taints: the devices our DeviceTaintRules taint, as the rules name them (node from the annotation)
    rule_devices: tuple[TaintedDevice, ...] = ()

    @classmethod
    def of(cls, snapshot: Snapshot, rules: TaintRuleReading | None = None) -> DeviceAudit:
        policy = snapshot.policy
        devices = policy.spec.reserved_devices
        classes = device_ownership.class_infos(snapshot.device_class_objects.values())
        info = classes.get(devices.reserved_class_name)
        reservation = device_ownership.current_reservation(policy, classes)
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
        audit.published = snapshot.published.per_node(devices.driver)
        audit.tainted = snapshot.published.tainted(devices.driver)
        audit.split = audit._split(reservation)
        audit.held = audit._held(snapshot)
        return audit

    def chosen_nodes(self) -> set[str]:
        """The nodes the reservation splits: every node publishing the driver's devices by classes; by taints,
        the nodes of our rules' devices (as published, or as the rules name them)."""
        if self.reservation is None or not self.reservation.by_taints:
            return set(self.published)
        return split_nodes(self.published, self.reservation) | {_rule_node(d) for d in self.rule_devices}

    def split_nodes(self) -> list[str]:
        """The nodes the reservation splits, and the nodes labelled split."""
        key, value = split_label(self.policy)
        labelled = {name for name, node in self.nodes.items() if node.labels.get(key) == value}
        return sorted(self.chosen_nodes() | labelled)

    def _split(self, reservation: DeviceReservation) -> frozenset[str]:
        """The split nodes the capacity counts on both sides (``capacity.split_node_names``)."""
        key, value = split_label(self.policy)
        return split_node_names(
            self.published,
            reservation,
            labelled=(name for name, node in self.nodes.items() if node.labels.get(key) == value),
            rule_nodes=(_rule_node(d) for d in self.rule_devices),
            whole=(name for name, node in self.nodes.items() if node.labelled),
        )

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
            found += self._memory(self.reservation)
        return found

    def _memory(self, reservation: DeviceReservation) -> list[Finding]:
        """AutoPartition: split nodes publishing several memory modes while the reservation pins none (the
        mode is node-wide: either side's first allocation sets it for both)."""
        open_modes = unpinned(self.policy, reservation, self.published, self.chosen_nodes())
        return [
            Finding(
                "reserved-device-memory-mode-unpinned",
                "Node",
                name,
                unpinned_message(self.policy, name, found, self._again(reservation)),
            )
            for name, found in open_modes.items()
        ]

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
            ids = gpu_ids(reserved)
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
            reserved = gpu_ids(d for d in devices if device_state(d, reservation) == RESERVED)
            short = len(reserved) < min(n, gpu_count(devices))
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
        owner = device_ownership.ownership(self.policy, self.classes)
        now = device_ownership.mapped_elsewhere(self.policy, owner)
        if now is None:
            return []
        return [
            Finding(
                "extended-resource-not-on-shared-class",
                "DeviceClass",
                owner.shared_class,
                f"{now}; {self._again(reservation)} {device_ownership.owner_fix(owner)} (AMD's chart stops its "
                'class naming it with deviceClass.extendedResourceName: "")',
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

    def pod(self, pod: Mapping[str, Any], namespace: str, decision: Decision) -> Finding | None:
        """A finding when the pod is of a class other than inference and holds GPUs reserved for inference."""
        if self.split is None or self.reservation is None:
            return None
        metadata = pod.get("metadata") or {}
        name, uid = str(metadata.get("name", "")), str(metadata.get("uid", ""))
        reserved: list[tuple[str, list[Device]]] = []
        for claim, devices in self._entries(namespace, name, uid):
            on_reserved = [d for d in devices if device_state(d, self.reservation) == RESERVED]
            if on_reserved:
                reserved.append((claim, on_reserved))
        cls = self.policy.spec.classes.get(decision.workload_class or "")
        if not reserved or cls is None or cls.placement == "reserved" or metadata.get("deletionTimestamp"):
            return None
        if is_borrower(pod, self.policy):
            return None  # lent (lending on): the keeper takes it back when inference needs it
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
