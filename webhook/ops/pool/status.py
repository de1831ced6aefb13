"""``pool status``: the pool as it is, as text or JSON: each member node's label and taint and what is
wrong with them, the reserved and the shared pool's nodes, GPUs and pods by class (a split node counted on
both sides), the non-inference pods on reserved nodes, the device section (``devices/status.py``) and, with
``--gpu-metrics``, the reserved GPUs as AMD's device metrics exporter reports them (``gpus/status.py``: read and
judged as ``audit --gpu-metrics`` does; unreadable, one warning and the rest as without it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable

from webhook.core.policy import Policy
from webhook.ops.capacity import RESERVED, SHARED, CapacityModel, Holder, NodeCapacity
from webhook.ops.devices.plan import holds
from webhook.ops.devices.split import split_labelled
from webhook.ops.devices.status import (
    DeviceStatus,
    device_status,
    status_json,
    status_lines,
)
from webhook.ops.gpus import source as gpu_source
from webhook.ops.gpus.judge import judge, kept_off, thresholds
from webhook.ops.gpus.status import GpuStatus
from webhook.ops.gpus.status import status_json as gpu_status_json
from webhook.ops.gpus.status import status_lines as gpu_status_lines
from webhook.ops.lending.decisions import lent
from webhook.ops.pool.output import EXIT_OK, Output, pod_ref
from webhook.ops.pool.read import Cluster, DraState, PoolRead, capacity_model
from webhook.ops.reservation import Capacity, PoolNode, Reservation, columns, plural, taint_text


def show(args: argparse.Namespace, policy: Policy, read: PoolRead, reservation: Reservation, out: Output) -> int:
    """``pool status``: the DRA state's warnings first (it is shown without DRA permissions too)."""
    state = read.devices
    for warning in state.warnings:
        out.warning(warning)
    split_value = policy.spec.reserved_devices.node_label_value
    model = capacity_model(policy, read, reservation)
    lending = policy.spec.lending.enabled
    return status(
        read.cluster,
        reservation,
        args,
        out,
        model,
        device_section(policy, read.cluster, state, model),
        split_value,
        lending=lending,
        gpus=gpu_section(args, policy, model, out),
    )


def gpu_section(args: argparse.Namespace, policy: Policy, model: CapacityModel, out: Output) -> GpuStatus | None:
    """``--gpu-metrics``: the exporter's series judged on the capacity model (``ops/gpus``), their notes as warnings;
    unreadable, one warning. None without the option."""
    given = getattr(args, "gpu_metrics", None)
    if not given:
        return None
    limits = thresholds(policy)
    read = gpu_source.reader(
        given, args.token, args.token_file, args.certificate_authority, bool(args.insecure_skip_tls_verify)
    )
    try:
        readings = read(time.time(), limits)
    except gpu_source.GpuSourceError as err:
        out.warning(f"{err}: the reserved GPUs' activity is not shown")
        return GpuStatus(limits, error=str(err))
    judged = judge(readings, model, limits, kept_off(policy))
    for line in judged.lines:
        out.warning(f"GPU metrics: {line}")
    return GpuStatus(limits, judged)


def device_section(policy: Policy, cluster: Cluster, state: DraState, model: CapacityModel) -> DeviceStatus | None:
    """The device section of ``status``: when nodes publish the driver's devices, or our classes exist."""
    devices = policy.spec.reserved_devices
    ours = [n for n in (devices.reserved_class_name, devices.shared_class_name) if n in state.classes]
    if not state.published and not ours:
        return None
    held = holds(model, cluster.pods)
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


def _by_class(entries: Iterable[tuple[Holder, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for holder, gpus in entries:
        entry = out.setdefault(holder.class_name or "(out of scope)", {"pods": 0, "gpus": 0})
        entry["pods"] += 1
        entry["gpus"] += gpus
    return dict(sorted(out.items()))


def _lent(node: NodeCapacity | None) -> int:
    return lent(node) if node is not None else 0


def status(
    cluster: Cluster,
    reservation: Reservation,
    args: argparse.Namespace,
    out: Output,
    model: CapacityModel,
    devices: DeviceStatus | None = None,
    split_value: str | None = None,
    *,
    lending: bool = False,
    gpus: GpuStatus | None = None,
) -> int:
    """The pools as the capacity model counts them (the same numbers as ``audit``'s capacity section)."""
    # Split nodes (the device reservation's label value) are shown in the device section.
    members = sorted(
        (
            n
            for n in cluster.nodes
            if n.marked(reservation) and (split_value is None or not split_labelled(n, reservation, split_value))
        ),
        key=lambda n: n.name,
    )
    requested = {name: sum(side.allocated for side in node.sides.values()) for name, node in model.nodes.items()}
    by_ref = {(p.namespace, p.name): p for p in cluster.pods}
    strays = sorted(
        (
            by_ref[holder.ref]
            for node in model.nodes.values()
            if not node.split and node.whole == RESERVED and RESERVED in node.sides
            for holder, _ in node.sides[RESERVED].holders
            if not holder.inference and holder.ref in by_ref
        ),
        key=lambda p: (p.node, p.namespace, p.name),
    )
    on_reserved, on_shared = model.holders(RESERVED), model.holders(SHARED)
    reserved_cap = Capacity(len(model.pool_nodes(RESERVED)), model.capacity(RESERVED), model.allocated(RESERVED))
    shared_cap = Capacity(len(model.pool_nodes(SHARED)), model.capacity(SHARED), model.allocated(SHARED))
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
                        **({"gpusLent": _lent(model.nodes.get(n.name))} if lending else {}),
                        "state": node_state(n, reservation),
                    }
                    for n in members
                ],
                "reserved": {**reserved_cap.as_json(), "podsByClass": _by_class(on_reserved)},
                "shared": {**shared_cap.as_json(), "podsByClass": _by_class(on_shared)},
                "nonInferenceOnReserved": [{**pod_ref(p), "class": p.class_name} for p in strays],
                "devices": status_json(devices) if devices is not None else None,
                **({"gpuMetrics": gpu_status_json(gpus)} if gpus is not None else {}),
            }
        )
        return EXIT_OK
    out.line(f"Reserved pool: label {reservation.label_text}, taint {reservation.taint_text}")
    out.line()
    if members:
        rows = [["NODE", "LABEL", "TAINT", "GPUS", "REQUESTED", *(["LENT"] if lending else []), "STATE"]]
        rows += [
            [
                n.name,
                "yes" if n.labelled(reservation) else "no",
                "yes" if n.tainted(reservation) else "no",
                str(n.gpus),
                str(requested.get(n.name, 0)),
                *([str(_lent(model.nodes.get(n.name)))] if lending else []),
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
    gpu_lines = gpu_status_lines(gpus) if gpus is not None else []
    if gpu_lines:
        out.line()
        for line in gpu_lines:
            out.line(line)
    return EXIT_OK
