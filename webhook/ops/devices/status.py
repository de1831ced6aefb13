"""The device section of ``pool status``: the reservation the classes record, each device's state and the
pods holding it, what is out of date, and the split nodes' share of each pool; as text and JSON.

Pure: built from what ``pool/read.py`` read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.cluster.slices import Device
from webhook.core.policy import Policy
from webhook.deploy import device_taint_rules
from webhook.deploy.device_classes import (
    MANAGED_BY_LABEL,
    RELEASED_RESERVATION,
    DeviceReservation,
    pinned_memory_partition,
    with_tainted,
)
from webhook.ops.capacity import RESERVED, SHARED, GpuView, device_state
from webhook.ops.capacity import gpu_views as capacity_gpu_views
from webhook.ops.devices.memory_mode import unpinned, unpinned_message
from webhook.ops.devices.ownership import (
    ClassInfo,
    Ownership,
    current_reservation,
    desired_classes,
    mapped_elsewhere,
    owner_fix,
    ownership,
    ownership_json,
    replace_body,
)
from webhook.ops.devices.plan import Hold, NodeSplit, _pod_text, hold_json, reservation_json, reservation_text
from webhook.ops.devices.split import label_action, split_label
from webhook.ops.reservation import PoolNode, PoolPod, columns


@dataclass(frozen=True)
class DeviceStatus:
    driver: str
    reserved_class: str
    reservation: DeviceReservation | None
    foreign: tuple[str, ...]  # our class names taken by classes that are not ours
    published: Mapping[str, tuple[Device, ...]]
    held: tuple[Hold, ...]
    owner: Ownership
    out_of_date: tuple[str, ...]  # what the classes say differs from the recorded reservation
    memory_partition: str = ""  # the memory mode the classes pin while the reservation is active
    # The split nodes publishing several memory modes while the active reservation pins none (a finding)
    unpinned: Mapping[str, tuple[str, ...]] | None = None


def device_status(
    policy: Policy,
    published: Mapping[str, tuple[Device, ...]],
    classes: Mapping[str, ClassInfo],
    held: Sequence[Hold],
    nodes: Mapping[str, PoolNode] | None = None,
    rules: Sequence[Mapping[str, Any]] = (),
) -> DeviceStatus:
    devices = policy.spec.reserved_devices
    foreign = tuple(
        name
        for name in (devices.reserved_class_name, devices.shared_class_name)
        if name in classes and not classes[name].ours
    )
    reservation = None if foreign else current_reservation(policy, classes)
    if reservation is not None:
        reservation = with_tainted(reservation, device_taint_rules.tainted_keys(rules))
    owner = ownership(policy, classes)
    stale: list[str] = []
    open_modes: dict[str, tuple[str, ...]] = {}
    if reservation is not None:
        again = (
            "pool apply --devices-per-node " + str(reservation.devices_per_node)
            if reservation.active
            else ("pool release --devices --all")
        )
        for desired in desired_classes(policy, reservation, owner):
            name = desired["metadata"]["name"]
            info = classes.get(name)
            if info is None:
                stale.append(f"deviceclass/{name} is missing: {again} writes it")
            elif replace_body(info.raw, desired) is not None:
                stale.append(f"deviceclass/{name} does not say what the reservation records: {again} rewrites it")
        elsewhere = mapped_elsewhere(policy, owner) if reservation.active else None
        if elsewhere is not None and not owner.recreate:
            stale.append(f"{elsewhere}; {again} {owner_fix(owner)}")
        if owner.recreate:
            stale.append(
                f"deviceclass/{owner.owner_now.name if owner.owner_now else '?'} is newer than deviceclass/"
                f"{owner.shared_class}: {owner.name} maps to it; {again} re-creates ours"
            )
        label = split_label(policy)
        by_key = {d.key: d for found in published.values() for d in found}
        split_nodes = set(published)
        if reservation.by_taints:
            split_nodes = {by_key[key].node for key in reservation.tainted if key in by_key}
            again += " --nodes " + ",".join(sorted(split_nodes)) if split_nodes else ""
            for key in sorted(reservation.tainted - set(by_key)):
                stale.append(
                    f"a DeviceTaintRule taints {key[1]} of pool {key[0]}, which no ResourceSlice publishes (a device "
                    f"renamed after a reboot, or a node gone): {again} derives the rules from the slices again"
                )
        elif rules and device_taint_rules.tainted_keys(rules):
            stale.append(f"DeviceTaintRules of ours are left from a split by taints: {again} deletes them")
        for name in published:
            node = (nodes or {}).get(name)
            in_split = reservation.active and name in split_nodes
            action = label_action(node, label, release=not in_split) if node is not None else "-"
            if action in ("add", "replace"):
                stale.append(
                    f"node/{name} lacks the label {label[0]}={label[1]}: inference is not placed there; {again} "
                    "labels it"
                )
            elif action == "remove":
                stale.append(
                    f"node/{name} still carries the label {label[0]}={label[1]} of a released split: {again} removes it"
                )
        # AutoPartition: a split node whose devices publish several memory modes, none pinned (issue 42).
        open_modes = unpinned(policy, reservation, published, split_nodes)
        stale += [unpinned_message(policy, name, found, again) for name, found in open_modes.items()]
    return DeviceStatus(
        devices.driver,
        devices.reserved_class_name,
        reservation,
        foreign,
        published,
        tuple(held),
        owner,
        tuple(stale),
        pinned_memory_partition(policy, reservation),
        open_modes,
    )


def _holders(status: DeviceStatus) -> dict[tuple[str, str], list[PoolPod]]:
    found: dict[tuple[str, str], list[PoolPod]] = {}
    for hold in status.held:
        for device in hold.devices:
            found.setdefault(device.key, []).append(hold.pod)
    return found


def _by_class(pods: Iterable[PoolPod]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in {(p.namespace, p.name): p for p in pods}.values():
        name = pod.class_name or "(out of scope)"
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def gpu_views(devices: Sequence[Device], status: DeviceStatus) -> list[GpuView]:
    """The node's GPUs, in the order of their first device (PCI order)."""
    return capacity_gpu_views(devices, status.reservation, _holders(status))


def status_json(status: DeviceStatus) -> dict[str, Any]:
    holders = _holders(status)
    nodes = []
    for node, devices in status.published.items():
        by_state: dict[str, list[PoolPod]] = {}
        for d in devices:
            by_state.setdefault(device_state(d, status.reservation), []).extend(holders.get(d.key, []))
        split_node = NodeSplit(node, devices, (), status.reservation, status.reservation or RELEASED_RESERVATION)
        nodes.append(
            {
                "name": node,
                "gpus": split_node.gpus,
                "reserved": split_node.count(RESERVED, status.reservation),
                "shared": split_node.count(SHARED, status.reservation),
                "podsByClass": {state: _by_class(pods) for state, pods in sorted(by_state.items())},
                "gpuList": [
                    {
                        "pciBusId": g.pci_bus_id or None,
                        "state": g.state,
                        "devices": len(g.devices),
                        "allocated": [d.name for d in g.allocated],
                        "pods": [
                            {"namespace": p.namespace, "name": p.name, "class": p.class_name}
                            for d in g.allocated
                            for p in holders.get(d.key, [])
                        ],
                    }
                    for g in gpu_views(devices, status)
                ],
                "devices": [
                    {
                        "name": d.name,
                        "pciBusId": d.pci_bus_id or None,
                        "state": device_state(d, status.reservation),
                        "pods": [
                            {"namespace": p.namespace, "name": p.name, "class": p.class_name}
                            for p in holders.get(d.key, [])
                        ],
                    }
                    for d in devices
                ],
            }
        )
    strays = [
        h
        for h in status.held
        if not h.pod.inference and any(device_state(d, status.reservation) == RESERVED for d in h.devices)
    ]
    return {
        "driver": status.driver,
        "reservedClass": status.reserved_class,
        "reservation": reservation_json(status.reservation),
        "notOurs": list(status.foreign),
        "nodes": nodes,
        "nonInferenceOnReserved": [hold_json(h) for h in strays],
        "extendedResource": ownership_json(status.owner),
        "memoryPartition": {
            "pinned": status.memory_partition or None,
            "unpinnedNodes": {name: list(found) for name, found in (status.unpinned or {}).items()},
        },
        "outOfDate": list(status.out_of_date),
    }


def status_lines(status: DeviceStatus) -> list[str]:
    lines = [f"Device-level reservation (driver {status.driver}): {reservation_text(status.reservation)}"]
    if status.memory_partition:
        lines.append(f"  memory mode {status.memory_partition} pinned: both classes select only devices of it")
    for name in status.foreign:
        lines.append(f"  deviceclass/{name} exists and is not ours ({MANAGED_BY_LABEL}): pool will not edit it")
    lines.append("")
    holders = _holders(status)
    rows = [["NODE", "DEVICE", "PCI BUS ID", "STATE", "PODS"]]
    for node, devices in status.published.items():
        for view in gpu_views(devices, status):
            # A GPU published as several devices (partitions, AutoPartition layouts): one row, the devices
            # allocated (the layout it is in) or how many it has; a whole GPU: its device, as before.
            name = view.text()
            pods = [p for d in view.devices for p in holders.get(d.key, [])]
            rows.append([node, name, view.pci_bus_id or "-", view.state, ", ".join(_pod_text(p) for p in pods) or "-"])
    lines += columns(rows)
    if status.reservation is not None and status.reservation.active:
        lines.append("")
        rows = [["NODE", "RESERVED", "SHARED", "PODS ON RESERVED", "PODS ON SHARED"]]
        for node, devices in status.published.items():
            split_node = NodeSplit(node, devices, (), status.reservation, status.reservation)
            on: dict[str, list[PoolPod]] = {RESERVED: [], SHARED: []}
            for d in devices:
                on[device_state(d, status.reservation)].extend(holders.get(d.key, []))
            rows.append(
                [
                    node,
                    str(split_node.count(RESERVED, status.reservation)),
                    str(split_node.count(SHARED, status.reservation)),
                    ", ".join(f"{k} {v}" for k, v in _by_class(on[RESERVED]).items()) or "-",
                    ", ".join(f"{k} {v}" for k, v in _by_class(on[SHARED]).items()) or "-",
                ]
            )
        lines += columns(rows)
        strays = [
            h
            for h in status.held
            if not h.pod.inference and any(device_state(d, status.reservation) == RESERVED for d in h.devices)
        ]
        if strays:
            lines += [
                "",
                "Non-inference pods holding reserved devices (pool apply --devices-per-node "
                f"{status.reservation.devices_per_node} --evict moves them):",
            ]
            lines += [
                f"  {_pod_text(h.pod)} on {h.devices[0].node}: {', '.join(d.name for d in h.devices)}" for h in strays
            ]
    lines.append("")
    owner = status.owner
    if owner.name:
        lines.append(
            f"{owner.name} maps to "
            + (f"deviceclass/{owner.owner_now.name}" if owner.owner_now else "no class")
            + " (the newest DeviceClass naming it)"
            + (f"; also named by {', '.join('deviceclass/' + c.name for c in owner.others)}" if owner.others else "")
        )
    lines += [f"warning: {text}" for text in status.out_of_date]
    return lines
