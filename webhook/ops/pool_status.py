"""``pool status``: the pool as it is, as text or JSON: each member node's label and taint and what is
wrong with them, the reserved and the shared pool's nodes, GPUs and pods by class (a split node counted on
both sides), the non-inference pods on reserved nodes, and the device section (``device_status.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from webhook.core.policy import Policy
from webhook.ops.capacity import RESERVED, SHARED, split_nodes
from webhook.ops.device_plan import holds
from webhook.ops.device_split import split_labelled
from webhook.ops.device_status import (
    DeviceStatus,
    SplitCapacity,
    device_status,
    split_capacity,
    status_json,
    status_lines,
)
from webhook.ops.pool_output import EXIT_OK, Output, pod_ref
from webhook.ops.pool_read import Cluster, DraState, PoolRead
from webhook.ops.reservation import Capacity, PoolNode, PoolPod, Reservation, columns, plural, taint_text


def show(args: argparse.Namespace, policy: Policy, read: PoolRead, reservation: Reservation, out: Output) -> int:
    """``pool status``: the DRA state's warnings first (it is shown without DRA permissions too)."""
    state = read.devices
    for warning in state.warnings:
        out.warning(warning)
    split_value = policy.spec.reserved_devices.node_label_value
    return status(read.cluster, reservation, args, out, device_section(policy, read.cluster, state), split_value)


def device_section(policy: Policy, cluster: Cluster, state: DraState) -> DeviceStatus | None:
    """The device section of ``status``: when nodes publish the driver's devices, or our classes exist."""
    devices = policy.spec.reserved_devices
    ours = [n for n in (devices.reserved_class_name, devices.shared_class_name) if n in state.classes]
    if not state.published and not ours:
        return None
    held, _ = holds(state.claims, devices.driver, state.published, cluster.pods, cluster.uids)
    return device_status(policy, state.published, state.classes, held, {n.name: n for n in cluster.nodes}, state.rules)


def node_state(node: PoolNode, reservation: Reservation) -> str:
    labelled, tainted = node.labelled(reservation), node.tainted(reservation)
    other = [t for t in node.taints if reservation.has_our_key(t) and not reservation.is_our_taint(t)]
    if other:
        return f"taint {taint_text(other[0])} is not the policy's: pool apply --nodes {node.name} replaces it"
    key, _ = reservation.label
    if not labelled and key in node.labels:
        return f"label {key}={node.labels[key]} is not the policy's: pool apply or release --nodes {node.name}"
    if reservation.taint is None:
        return "ok" if labelled else "not reserved"
    if labelled and tainted:
        return "no allocatable GPUs" if node.gpus == 0 else "ok"
    if labelled:
        return (
            f"label without taint: pods without the webhook's placement can land here (pool apply --nodes {node.name})"
        )
    return f"taint without label: inference placement cannot select it (pool apply or release --nodes {node.name})"


def _split_capacity(
    cluster: Cluster,
    reservation: Reservation,
    whole: set[str],
    devices: DeviceStatus | None,
    split_value: str | None,
) -> SplitCapacity:
    """The split nodes of an active device reservation (publishing the driver's devices, or labelled split;
    never a node reserved whole) and their share of each pool, as the audit counts them."""
    if devices is None or devices.reservation is None or not devices.reservation.active:
        return SplitCapacity(frozenset(), {RESERVED: 0, SHARED: 0}, {RESERVED: (), SHARED: ()})
    labelled = {
        n.name for n in cluster.nodes if split_value is not None and split_labelled(n, reservation, split_value)
    }
    chosen = split_nodes(devices.published, devices.reservation) | labelled
    return split_capacity(devices, chosen - whole)


def _by_class(pods: Iterable[PoolPod]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for pod in pods:
        entry = out.setdefault(pod.class_name or "(out of scope)", {"pods": 0, "gpus": 0})
        entry["pods"] += 1
        entry["gpus"] += pod.gpus
    return dict(sorted(out.items()))


def status(
    cluster: Cluster,
    reservation: Reservation,
    args: argparse.Namespace,
    out: Output,
    devices: DeviceStatus | None = None,
    split_value: str | None = None,
) -> int:
    # Split nodes (the device reservation's label value) are shown in the device section.
    members = sorted(
        (
            n
            for n in cluster.nodes
            if n.marked(reservation) and (split_value is None or not split_labelled(n, reservation, split_value))
        ),
        key=lambda n: n.name,
    )
    names = {n.name for n in members if n.labelled(reservation)}
    requested: dict[str, int] = {}
    for pod in cluster.pods:
        requested[pod.node] = requested.get(pod.node, 0) + pod.gpus
    split = _split_capacity(cluster, reservation, names, devices, split_value)
    on_reserved = [p for p in cluster.pods if p.node in names]
    pooled = names | split.nodes
    shared_nodes = [n for n in cluster.nodes if n.name not in pooled and n.gpus > 0]
    shared_names = {n.name for n in shared_nodes}
    # A split node's pods that hold none of the driver's GPUs count in the shared pool with their own.
    held = {(p.namespace, p.name) for pods in split.pods.values() for p in pods}
    on_shared = [
        p
        for p in cluster.pods
        if p.node in shared_names or (p.node in split.nodes and (p.namespace, p.name) not in held)
    ]
    strays = sorted((p for p in on_reserved if not p.inference), key=lambda p: (p.node, p.namespace, p.name))
    on_reserved += split.pods[RESERVED]
    on_shared += split.pods[SHARED]
    reserved_cap = Capacity(
        len(names) + len(split.nodes),
        sum(n.gpus for n in members if n.name in names) + split.gpus[RESERVED],
        sum(p.gpus for p in on_reserved),
    )
    shared_cap = Capacity(
        len(shared_nodes) + len(split.nodes),
        sum(n.gpus for n in shared_nodes) + split.gpus[SHARED],
        sum(p.gpus for p in on_shared),
    )
    if args.output == "json":
        out.json(
            {
                "reservation": {
                    "label": {"key": reservation.label[0], "value": reservation.label[1]},
                    "taint": reservation.taint,
                },
                "nodes": [
                    {
                        "name": n.name,
                        "labelled": n.labelled(reservation),
                        "tainted": n.tainted(reservation),
                        "gpusAllocatable": n.gpus,
                        "gpusRequested": requested.get(n.name, 0),
                        "state": node_state(n, reservation),
                    }
                    for n in members
                ],
                "reserved": {**reserved_cap.as_json(), "podsByClass": _by_class(on_reserved)},
                "shared": {**shared_cap.as_json(), "podsByClass": _by_class(on_shared)},
                "nonInferenceOnReserved": [{**pod_ref(p), "class": p.class_name} for p in strays],
                "devices": status_json(devices) if devices is not None else None,
            }
        )
        return EXIT_OK
    out.line(f"Reserved pool: label {reservation.label_text}, taint {reservation.taint_text}")
    out.line()
    if members:
        rows = [["NODE", "LABEL", "TAINT", "GPUS", "REQUESTED", "STATE"]]
        rows += [
            [
                n.name,
                "yes" if n.labelled(reservation) else "no",
                "yes" if n.tainted(reservation) else "no",
                str(n.gpus),
                str(requested.get(n.name, 0)),
                node_state(n, reservation),
            ]
            for n in members
        ]
        for line in columns(rows):
            out.line(line)
    else:
        out.line("No node carries the reserved label or taint (pool plan shows how to set the pool up).")
    for title, cap, pods in (("Reserved", reserved_cap, on_reserved), ("Shared", shared_cap, on_shared)):
        classes = ", ".join(
            f"{name} {plural(v['pods'], 'pod')} / {plural(v['gpus'], 'GPU')}" for name, v in _by_class(pods).items()
        )
        out.line()
        out.line(
            f"{title}: {plural(cap.nodes, 'node')}, {plural(cap.gpus_allocatable, 'GPU')} allocatable, "
            f"{cap.gpus_requested} requested" + (f" ({classes})" if classes else "")
        )
    if strays:
        out.line()
        out.line("Non-inference pods on reserved nodes (pool apply --nodes NODE --evict moves them):")
        rows = [["NODE", "NAMESPACE", "POD", "CLASS", "GPUS"]]
        rows += [[p.node, p.namespace, p.name, p.class_name or "-", str(p.gpus)] for p in strays]
        for line in columns(rows):
            out.line(line)
    if devices is not None:
        out.line()
        for line in status_lines(devices):
            out.line(line)
    return EXIT_OK
