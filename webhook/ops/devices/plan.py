"""The plan of ``pool apply --devices-per-node N`` and ``pool release --devices``: which pod holds which
device, the DeviceTaintRules to write or delete, each node's split, and the plan as text and JSON.

Pure: built from what ``pool/read.py`` read (``build_device_plan``); ``pool/write.py`` carries it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.cluster.inventory import reserved_for
from webhook.cluster.slices import Device, device_order, gpu_count, gpu_ids
from webhook.core.claims import (
    MODE_CLASSES,
    MODE_TAINTS,
    RESERVED_DEVICE_TAINT_EFFECT,
    RESERVED_DEVICE_TAINT_KEY,
    MalformedClaim,
    allocated_results,
)
from webhook.core.policy import Policy
from webhook.deploy import device_taint_rules
from webhook.deploy.device_classes import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PCI_BUS_ID_ATTRIBUTE,
    DeviceReservation,
    with_tainted,
)
from webhook.deploy.device_taint_rules import TaintedDevice
from webhook.ops.capacity import RESERVED, SHARED, CapacityModel, device_state, gpu_views, gpus_in_state
from webhook.ops.devices.memory_mode import Pin, every_mode
from webhook.ops.devices.ownership import (
    ClassChange,
    ClassInfo,
    Ownership,
    class_changes,
    current_reservation,
    desired_classes,
    owner_change,
    ownership,
    ownership_json,
    ownership_lines,
)
from webhook.ops.devices.split import label_action, split_label, tainted_devices
from webhook.ops.raw import mapping, text
from webhook.ops.reservation import PoolNode, PoolPod, SelectionError, columns, plural

TAINT_TEXT = f"{RESERVED_DEVICE_TAINT_KEY}:{RESERVED_DEVICE_TAINT_EFFECT}"


# --- who holds which device --------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """A pod and the driver's devices it holds (the allocations of the claims reserved for it)."""

    pod: PoolPod
    devices: tuple[Device, ...]


def holds(model: CapacityModel, pods: Iterable[PoolPod]) -> list[Hold]:
    """Which pod holds which of the driver's devices, as the capacity model read them (``CapacityModel.held``:
    the claims of each pod, allocated to it)."""
    by_ref = {(p.namespace, p.name): p for p in pods}
    out = [
        Hold(by_ref[ref], tuple(sorted(devices, key=device_order)))
        for ref, devices in model.held.items()
        if ref in by_ref and devices
    ]
    out.sort(key=lambda h: (h.devices[0].node, h.pod.namespace, h.pod.name))
    return out


def claims_of_pods_gone(
    claims: Iterable[Mapping[str, Any]],
    driver: str,
    pods: Iterable[PoolPod],
    uids: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """Notes about claims holding the driver's devices reserved for pods that are not among the running
    pods read (finished or deleted meanwhile): their devices free up when the claim is deallocated."""
    by_ref = {(p.namespace, p.name) for p in pods}
    notes: list[str] = []
    for claim in claims:
        metadata = mapping(claim.get("metadata"))
        namespace, claim_name = text(metadata.get("namespace")), text(metadata.get("name"))
        try:
            results = allocated_results(claim)
        except MalformedClaim:
            continue
        if not any(on == driver for on, _, _ in results):
            continue
        for pod_name, uid in reserved_for(claim):
            pod_ref = (namespace, pod_name)
            if pod_ref not in by_ref or (uids is not None and uid and uids.get(pod_ref, uid) != uid):
                notes.append(
                    f"resourceclaim/{claim_name} -n {namespace} is reserved for pod {pod_name}, which is not "
                    "among the running pods read (finished or deleted meanwhile)"
                )
    return notes


# --- the DeviceTaintRules ----------------------------------------------------------------------


@dataclass(frozen=True)
class RuleChange:
    name: str
    action: str  # create, replace, unchanged, delete
    device: TaintedDevice
    desired: dict[str, Any] | None  # None: delete
    current: Mapping[str, Any] | None


def rule_changes(
    policy: Policy, devices: Sequence[TaintedDevice], rules: Iterable[Mapping[str, Any]], version: str | None
) -> tuple[RuleChange, ...]:
    """What writing the rules does: one rule per device to taint (created, or replaced when it says
    something else), and our rules for other devices deleted. SelectionError when a rule of our name is
    not ours, or rules are wanted and the cluster serves none."""
    current: dict[str, Mapping[str, Any]] = {}
    for obj in rules:
        name = text(mapping(obj.get("metadata")).get("name"))
        if name:
            current[name] = obj
    if devices and version is None:
        raise SelectionError("the cluster serves no devicetaintrules (resource.k8s.io): cannot taint devices")
    changes = []
    wanted = set()
    for device in devices:
        desired = device_taint_rules.rule(policy, device, version or device_taint_rules.VERSIONS[0])
        name = desired["metadata"]["name"]
        wanted.add(name)
        found = current.get(name)
        if found is None:
            changes.append(RuleChange(name, "create", device, desired, None))
        elif not device_taint_rules.is_ours(found):
            raise SelectionError(
                f"devicetaintrule/{name} exists and is not managed by rocm-isolation-webhook ({MANAGED_BY_LABEL}="
                f"{MANAGED_BY}): pool never edits a rule that is not its own; delete it if it is a leftover"
            )
        else:
            action = "replace" if device_taint_rules.spec_differs(found, desired) else "unchanged"
            changes.append(RuleChange(name, action, device, desired, found))
    for name, found in sorted(current.items()):
        tainted = device_taint_rules.tainted_device(found)
        if name not in wanted and tainted is not None:
            changes.append(RuleChange(name, "delete", tainted, None, found))
    return tuple(changes)


# --- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSplit:
    node: str
    devices: tuple[Device, ...]
    wanted: tuple[str, ...]  # its own N lowest PCI bus IDs
    before: DeviceReservation | None
    after: DeviceReservation
    label: str = "-"  # what happens to its split label: label_action

    @property
    def gpus(self) -> int:
        return gpu_count(self.devices)

    def count(self, state: str, reservation: DeviceReservation | None) -> int:
        """GPUs of the node in ``state`` (``capacity.gpus_in_state``)."""
        return gpus_in_state(self.devices, state, reservation)

    @property
    def reserved_after(self) -> int:
        return self.count(RESERVED, self.after)

    @property
    def shared_after(self) -> int:
        return self.count(SHARED, self.after)


@dataclass(frozen=True)
class DevicePlan:
    driver: str
    before: DeviceReservation | None  # as the reserved class records it; None: no class yet
    after: DeviceReservation
    nodes: tuple[NodeSplit, ...]
    evicting: tuple[Hold, ...]  # pods of other classes holding devices reserved after
    keeping: tuple[Hold, ...]  # inference pods holding devices that stop being reserved (they keep them)
    owner: Ownership
    classes: tuple[ClassChange, ...]  # in the order they are written
    notes: tuple[str, ...] = ()

    label: tuple[str, str] = ("", "")  # the split nodes' label (key, value)
    rules: tuple[RuleChange, ...] = ()  # our DeviceTaintRules: created first, deleted after the classes
    rule_version: str | None = None  # the resource.k8s.io version they are written in
    memory: Pin | None = None  # the memory mode pinned (ops/devices/memory_mode.py); None: a release, or not worked out

    @property
    def changes(self) -> bool:
        return (
            any(c.action != "unchanged" for c in self.classes)
            or any(n.label in ("add", "replace", "remove") for n in self.nodes)
            or any(r.action != "unchanged" for r in self.rules)
        )

    @property
    def release(self) -> bool:
        return not self.after.active


def _node_notes(
    node: str,
    devices: Sequence[Device],
    wanted: Sequence[str],
    after: DeviceReservation,
    wanted_by: Mapping[str, list[str]],
) -> list[str]:
    notes = []
    n = after.devices_per_node
    bare = [d.name for d in devices if not d.pci_bus_id]
    if bare:
        notes.append(
            f"{node}: {', '.join(bare)} publish{'es' if len(bare) == 1 else ''} no {PCI_BUS_ID_ATTRIBUTE}: "
            "never reserved (the classes select PCI bus IDs), always shared"
        )
    ids = gpu_ids(devices)
    if len(ids) < n:
        notes.append(
            f"{node} has {plural(len(ids), 'GPU')} with a PCI bus ID, fewer than {n}: all of them are reserved"
        )
    extra = [i for i in ids if i in after.pci_bus_ids and i not in wanted]
    if extra and after.by_taints:
        by = ", ".join(
            f"{i} ({', '.join(d.name for d in devices if d.pci_bus_id == i)}, reserved on "
            f"{', '.join(wanted_by.get(i, []))})"
            for i in extra
        )
        notes.append(
            f"{node}: only its own {plural(len(wanted), 'GPU')} {'is' if len(wanted) == 1 else 'are'} tainted, but "
            f"the inference class selects one list of PCI bus IDs on every node (CEL cannot see the node): {by} "
            f"{'stays' if len(extra) == 1 else 'stay'} shared here and an inference claim may also get "
            f"{'it' if len(extra) == 1 else 'them'} when {node}'s reserved devices are taken"
        )
    elif extra:
        by = ", ".join(
            f"{i} ({', '.join(d.name for d in devices if d.pci_bus_id == i)}, reserved on "
            f"{', '.join(wanted_by.get(i, []))})"
            for i in extra
        )
        notes.append(
            f"CEL cannot see the node: {node} gets {plural(len(wanted) + len(extra), 'reserved GPU')}, not "
            f"{len(wanted)}: the classes select the same PCI bus IDs on every node, and {by} "
            f"{'is' if len(extra) == 1 else 'are'} in the reserved set"
        )
    reserved_here = wanted if after.by_taints else after.pci_bus_ids
    if len(ids) >= n and not bare and all(i in reserved_here for i in ids):
        notes.append(f"{node} keeps no shared GPU: other classes get none of its devices")
    return notes


def build_device_plan(
    policy: Policy,
    published: Mapping[str, Sequence[Device]],
    after: DeviceReservation,
    wanted: Mapping[str, Sequence[str]],
    classes: Mapping[str, ClassInfo],
    held: Sequence[Hold],
    notes: Sequence[str] = (),
    *,
    ensure_owner: bool = True,
    nodes: Mapping[str, PoolNode] | None = None,
    rules: Sequence[Mapping[str, Any]] = (),
    rule_version: str | None = None,
    memory: Pin | None = None,
) -> DevicePlan:
    """The plan of ``apply --devices-per-node`` (``after`` from ``split``: ``wanted`` names the split
    nodes) or of ``release --devices`` (``after`` = ``RELEASED_RESERVATION``, nothing wanted,
    ``ensure_owner`` off: a release deletes no class). ``rules``: our DeviceTaintRules as read."""
    devices = policy.spec.reserved_devices
    # Now: the reservation our reserved class records, with the devices our rules taint.
    current = current_reservation(policy, classes)
    before = with_tainted(current, device_taint_rules.tainted_keys(rules)) if current is not None else None
    # After: both classes as deploy/device_classes renders them, then one DeviceTaintRule per device to taint.
    owner = ownership(policy, classes)
    changes = class_changes(desired_classes(policy, after, owner), classes, owner, ensure_owner=ensure_owner)
    to_taint = tainted_devices(published, wanted) if after.active and after.by_taints else []
    rule_plan = rule_changes(policy, to_taint, rules, rule_version)
    wanted_by: dict[str, list[str]] = {}
    for node, ids in sorted(wanted.items()):
        for i in ids:
            wanted_by.setdefault(i, []).append(node)
    all_notes: list[str] = []
    label = split_label(policy)
    splits = []
    for node, found in sorted(published.items()):
        own = tuple(wanted.get(node, ()))
        known = (nodes or {}).get(node)
        in_split = after.active and node in wanted
        action = label_action(known, label, release=not in_split) if nodes is not None else "-"
        splits.append(NodeSplit(node, tuple(found), own, before, after, action))
        if in_split:
            all_notes += _node_notes(node, found, own, after, wanted_by)
        if nodes is not None and known is None:
            all_notes.append(
                f"{node} publishes {devices.driver} devices but no Node of that name was read: not labelled"
            )
    evicting = tuple(
        h for h in held if not h.pod.inference and any(device_state(d, after) == RESERVED for d in h.devices)
    )
    keeping = tuple(
        h
        for h in held
        if h.pod.inference
        and any(device_state(d, before) == RESERVED and device_state(d, after) != RESERVED for d in h.devices)
    )
    all_notes += list(notes)
    return DevicePlan(
        devices.driver,
        before,
        after,
        tuple(splits),
        evicting,
        keeping,
        owner,
        changes,
        tuple(all_notes),
        label,
        rule_plan,
        rule_version,
        memory,
    )


# --- output ------------------------------------------------------------------------------------


def reservation_text(reservation: DeviceReservation | None) -> str:
    if reservation is None:
        return "no device reservation (the classes do not exist)"
    if not reservation.active:
        return "released (both classes select every device)"
    if reservation.by_taints:
        return (
            f"{plural(reservation.devices_per_node, 'device')} per chosen node, "
            f"{plural(len(reservation.tainted), 'device')} tainted by DeviceTaintRules (PCI bus IDs "
            f"{', '.join(reservation.pci_bus_ids)})"
        )
    return (
        f"{plural(reservation.devices_per_node, 'device')} per node, PCI bus IDs {', '.join(reservation.pci_bus_ids)}"
    )


def reservation_json(reservation: DeviceReservation | None) -> dict[str, Any] | None:
    if reservation is None:
        return None
    return {
        "active": reservation.active,
        "mode": MODE_TAINTS if reservation.by_taints else MODE_CLASSES,
        "devicesPerNode": reservation.devices_per_node,
        "pciBusIds": list(reservation.pci_bus_ids),
        "taintedDevices": [{"pool": pool, "device": name} for pool, name in sorted(reservation.tainted)],
        "memoryPartition": reservation.memory_partition or None,  # as the reserved class records it
    }


def memory_lines(pin: Pin | None, driver: str) -> list[str]:
    """What the plan says of the memory mode: pinned, and why (nothing where no node publishes several and
    the policy pins none)."""
    if pin is None or not pin.mode:
        return []
    nodes = (
        f" ({plural(len(pin.mixed), 'node')} publish{'es' if len(pin.mixed) == 1 else ''} several: "
        f"{', '.join(every_mode(pin.mixed))})"
    )
    return [
        f"Memory mode: {pin.mode}, pinned on every node of {driver}{nodes if pin.mixed else ''}, from {pin.why}: "
        f"both classes select only devices of it (or without the attribute), so neither side can switch a node's "
        f"mode; another mode: set reservedDevices.memoryPartition in the policy, then apply again."
    ]


def memory_json(pin: Pin | None) -> dict[str, Any] | None:
    if pin is None:
        return None
    return {
        "mode": pin.mode or None,
        "source": pin.source or None,
        "mixedNodes": {n: list(m) for n, m in pin.mixed.items()},
    }


def _pod_text(pod: PoolPod) -> str:
    return f"{pod.namespace}/{pod.name} ({pod.class_name or 'out of scope'})"


def plan_lines(plan: DevicePlan, policy: Policy) -> list[str]:
    devices = policy.spec.reserved_devices
    lines = [
        f"Device-level reservation (driver {plan.driver}): deviceclass/{devices.reserved_class_name} for inference, "
        f"deviceclass/{devices.shared_class_name} for every other class"
        + (
            f"; {devices.extended_resource_name}: deviceclass/{devices.shared_extended_class_name} (inference: "
            f"deviceclass/{devices.reserved_extended_class_name})"
            if plan.owner.extended
            else f" and {devices.extended_resource_name}"
            if devices.extended_resource_name
            else ""
        ),
        f"Now: {reservation_text(plan.before)}.",
        f"After {'release' if plan.release else 'apply'}: {reservation_text(plan.after)}"
        + (
            f" (each chosen node's {plan.after.devices_per_node} lowest, in ROCm's order, tainted by name)."
            if plan.after.by_taints
            else f" (each node's {plan.after.devices_per_node} lowest, in ROCm's order; one list for every node)."
            if plan.after.active
            else "."
        ),
        f"Split nodes are labelled {plan.label[0]}={plan.label[1]} (inference is placed on them, no node taint: "
        "every class uses their shared devices).",
        *memory_lines(plan.memory if plan.after.active else None, plan.driver),
    ]
    if plan.after.by_taints:
        lines += [
            f"DeviceTaintRules (resource.k8s.io/{plan.rule_version}) taint the reserved devices {TAINT_TEXT}: a request "
            "that does not tolerate it never gets them (adminAccess included); the webhook adds the toleration to "
            f"inference requests for deviceclass/{devices.reserved_class_name}, the backstop denies it elsewhere. "
            f"deviceclass/{devices.shared_class_name} selects every device.",
        ]
        if devices.extended_resource_name:
            lines.append(
                f"{devices.extended_resource_name}: the scheduler's claims for it carry no tolerations, so every pod "
                f"asking for it, inference included, gets a shared device; inference gets reserved devices through a "
                f"ResourceClaimTemplate of deviceclass/{devices.reserved_class_name}."
            )
    lines.append("")
    rows = [["NODE", "GPUS", "RESERVED", "SHARED", "LABEL"]]
    rows += [
        [
            n.node,
            str(n.gpus),
            *((str(n.reserved_after), str(n.shared_after)) if plan.after.active else ("-", "-")),
            n.label,
        ]
        for n in plan.nodes
    ]
    lines += columns(rows)
    lines.append("")
    # One row per GPU: a whole GPU's device, or how many devices (partitions, AutoPartition layouts) a GPU
    # published as several has; every one of them changes side with its GPU (the PCI bus ID).
    rows = [["NODE", "DEVICE", "PCI BUS ID", "NOW", "AFTER"]]
    rows += [
        [
            n.node,
            f"({len(view.devices)} devices)" if view.layouts else view.text(),
            view.pci_bus_id or "-",
            view.state,
            device_state(view.devices[0], plan.after),
        ]
        for n in plan.nodes
        for view in gpu_views(n.devices, plan.before, ())
    ]
    lines += columns(rows)
    lines.append("")
    if plan.evicting:
        lines.append(
            "Running pods of other classes that hold devices that become reserved (they keep them until they end; "
            "pool apply --evict evicts them):"
        )
        rows = [["NODE", "NAMESPACE", "POD", "OWNER", "CLASS", "RESERVED DEVICES", "EVICT"]]
        rows += [
            [
                h.devices[0].node,
                h.pod.namespace,
                h.pod.name,
                h.pod.owner or "-",
                h.pod.class_name or "-",
                ",".join(d.name for d in h.devices if device_state(d, plan.after) == RESERVED),
                "yes" if h.pod.skip_reason is None else f"no: {h.pod.skip_reason}",
            ]
            for h in plan.evicting
        ]
        lines += columns(rows)
    elif plan.after.active:
        lines.append("No pod of another class holds a device that becomes reserved.")
    if plan.keeping:
        if lines[-1]:
            lines.append("")
        lines.append("Inference pods holding devices that stop being reserved (they keep them):")
        rows = [["NODE", "NAMESPACE", "POD", "DEVICES NO LONGER RESERVED"]]
        rows += [
            [h.devices[0].node, h.pod.namespace, h.pod.name, ",".join(d.name for d in _unreserved(h, plan))]
            for h in plan.keeping
        ]
        lines += columns(rows)
    if lines[-1]:
        lines.append("")
    owning = owner_change(plan.classes, plan.owner)
    creating = owning is not None and owning.action == "create"
    recreating = owning is not None and owning.action == "recreate"
    lines += ownership_lines(plan.owner, recreate_planned=recreating, creating=creating)
    lines.append("")
    for change in plan.classes:
        lines.append(f"deviceclass/{change.name} ({change.role}): {_action_text(change)}")
    for rule in plan.rules:
        lines.append(
            f"devicetaintrule/{rule.name} ({rule.device.node or '?'} {rule.device.device} "
            f"{rule.device.pci_bus_id or '-'}): {rule.action}"
            + (
                " (after the classes)"
                if rule.action == "delete"
                else " (before the classes)"
                if rule.action != "unchanged"
                else ""
            )
        )
    lines += [f"note: {note}" for note in plan.notes]
    if not plan.changes:
        lines.append("Nothing to change: the classes" + (", the rules" if plan.rules else "") + " already say this.")
    return lines


def _unreserved(hold: Hold, plan: DevicePlan) -> list[Device]:
    """The devices of ``hold`` that are reserved now and not after."""
    return [
        d for d in hold.devices if device_state(d, plan.before) == RESERVED and device_state(d, plan.after) != RESERVED
    ]


def _action_text(change: ClassChange) -> str:
    return {
        "create": "create",
        "replace": "replace",
        "unchanged": "unchanged",
        "recreate": "delete and create again (see above)",
    }[change.action]


def _device_json(device: Device, before: DeviceReservation | None, after: DeviceReservation) -> dict[str, Any]:
    return {
        "name": device.name,
        "pciBusId": device.pci_bus_id or None,
        "now": device_state(device, before),
        "after": device_state(device, after),
    }


def hold_json(hold: Hold) -> dict[str, Any]:
    pod = hold.pod
    out: dict[str, Any] = {
        "namespace": pod.namespace,
        "name": pod.name,
        "node": hold.devices[0].node,
        "owner": pod.owner or None,
        "class": pod.class_name,
        "devices": [d.name for d in hold.devices],
        "evictable": pod.skip_reason is None,
    }
    if pod.skip_reason is not None:
        out["skipReason"] = pod.skip_reason
    return out


def plan_json(plan: DevicePlan) -> dict[str, Any]:
    return {
        "driver": plan.driver,
        "label": {"key": plan.label[0], "value": plan.label[1]},
        "before": reservation_json(plan.before),
        "after": reservation_json(plan.after),
        "nodes": [
            {
                "name": n.node,
                "gpus": n.gpus,
                "reserved": n.reserved_after,
                "shared": n.shared_after,
                "wanted": list(n.wanted),
                "label": n.label,
                "devices": [_device_json(d, plan.before, plan.after) for d in n.devices],
            }
            for n in plan.nodes
        ],
        "podsHoldingReserved": [hold_json(h) for h in plan.evicting],
        "inferenceKeeping": [hold_json(h) for h in plan.keeping],
        "extendedResource": ownership_json(plan.owner),
        "classes": [{"name": c.name, "role": c.role, "action": c.action, "object": c.desired} for c in plan.classes],
        "taintRuleVersion": plan.rule_version,
        "taintRules": [
            {
                "name": r.name,
                "action": r.action,
                "node": r.device.node or None,
                "pool": r.device.pool,
                "device": r.device.device,
                "pciBusId": r.device.pci_bus_id or None,
            }
            for r in plan.rules
        ],
        "memoryPartition": memory_json(plan.memory if plan.after.active else None),
        "changes": plan.changes,
        "notes": list(plan.notes),
    }
