"""The reserved GPUs judged on what they report. Pure.

Use is sustained: a GPU is busy at an instant when its activity or its VRAM in use reaches the policy's
threshold (``spec.gpuMetrics``), and a finding needs it busy, the same way (no pod, or that pod), at every
instant of the last ``windowSeconds`` read, without a gap longer than ``maxGapSeconds``: one busy sample is
not use. A node whose newest sample is older than ``staleSeconds`` before the instant judged (its exporter
stopped, or its scrape fails) is stale: its GPUs are not judged at all, never read as idle.

Rule ids are those of ``ops/findings.py``:

- ``reserved-gpu-used-unallocated``: a reserved GPU busy with no pod the cluster gave it (the incident); on a split
  node, also a busy GPU no pod holds whose side cannot be told (one of the node's unheld GPUs, some of them
  reserved): use nobody was allocated is the incident itself, so it is reported, worded "may be reserved",
  rather than left unjudged;
- ``reserved-gpu-used-by-other-class``: a reserved GPU busy, held by a pod of a class the policy keeps off
  reserved capacity (a borrower, while lending lends it, is not one);
- ``reserved-gpu-unhealthy`` / ``reserved-gpu-hot``: the newest ``gpu_health`` 0, the hottest sensor over
  ``temperatureCelsius``;
- ``reserved-gpu-inference-load-high``: inference keeps a reserved GPU busier, on average over the window,
  than ``inferenceLoadPercent`` (the runbook's 40 %).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from webhook.core.policy import Policy
from webhook.ops.capacity import RESERVED, CapacityModel, Holder
from webhook.ops.gpus.mapping import UNKNOWN, Placed, place
from webhook.ops.gpus.series import PodRef, Point, Readings


@dataclass(frozen=True)
class Thresholds:
    activity_percent: float = 20.0
    vram_mb: float = 1024.0
    window_seconds: float = 300.0
    max_gap_seconds: float = 120.0
    stale_seconds: float = 300.0
    temperature_celsius: float = 95.0
    inference_load_percent: float = 40.0


def thresholds(policy: Policy) -> Thresholds:
    """The policy's ``spec.gpuMetrics`` (defaulted when absent)."""
    metrics = policy.spec.gpu_metrics
    return Thresholds(
        metrics.activity_percent,
        metrics.vram_mb,
        float(metrics.window_seconds),
        float(metrics.max_gap_seconds),
        float(metrics.stale_seconds),
        metrics.temperature_celsius,
        metrics.inference_load_percent,
    )


def kept_off(policy: Policy) -> frozenset[str]:
    """The classes the policy keeps off reserved capacity."""
    return frozenset(name for name, cls in policy.spec.classes.items() if cls.placement == "unreserved")


@dataclass(frozen=True)
class Observation:
    rule: str
    node: str
    message: str
    pod: PodRef | None = None  # a Pod finding's pod; None: a Node finding


# The background audit's gauge of each reserved GPU's mean activity (``Load.activity_percent``), labelled node, gpu
# and inference; ``service/metrics.py`` exports it, ``pool recommend`` reads its history back.
ACTIVITY_GAUGE: Final = "rocm_isolation_reserved_gpu_activity_percent"


@dataclass(frozen=True)
class Load:
    """How busy a reserved GPU was over the window (gauges, ``pool status``), and whether inference held it."""

    node: str
    gpu: str
    pci_bus_id: str
    activity_percent: float  # the mean over the window
    inference: bool  # inference pods held it at some instant of the window
    peak_percent: float = 0.0  # the highest activity over the window
    vram_mb: float | None = None  # VRAM in use at the newest instant
    holders: tuple[Holder, ...] = ()  # the pods the cluster gave it, as the exporter names them at the newest instant


@dataclass
class Judgement:
    observations: list[Observation] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # what could not be read or judged, one line each
    loads: list[Load] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    gpus_judged: int = 0


def when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def busy(point: Point, limits: Thresholds) -> bool:
    return (point.activity is not None and point.activity >= limits.activity_percent) or (
        point.vram is not None and point.vram >= limits.vram_mb
    )


def sustained(placed: Placed, test: Callable[[Point], bool], limits: Thresholds) -> float | None:
    """Since when ``test`` held at every instant up to the newest, when that is at least the window."""
    times = placed.gpu.times()
    since = None
    for i in range(len(times) - 1, -1, -1):
        if not test(placed.gpu.points[times[i]]):
            break
        if i < len(times) - 1 and times[i + 1] - times[i] > limits.max_gap_seconds:
            break
        since = times[i]
    if since is None or times[-1] - since < limits.window_seconds:
        return None
    return since


def judge(readings: Readings, model: CapacityModel, limits: Thresholds, kept_off: Container[str]) -> Judgement:
    """``kept_off``: the classes the policy keeps off reserved capacity (placement ``unreserved``)."""
    out = Judgement(lines=list(readings.problems))
    stale = {node for node in readings.nodes() if readings.newest(node) < readings.end - limits.stale_seconds}
    for node in sorted(stale):
        out.lines.append(
            f"exporter series of node {node} stopped at {when(readings.newest(node))}: its GPUs are not judged "
            "(not read as idle)"
        )
    out.stale = sorted(stale)
    placement = place(readings, model)
    out.lines.extend(placement.problems)
    seen = set(readings.nodes())
    missing = [n.name for n in model.pool_nodes(RESERVED) if n.side(RESERVED).capacity > 0 and n.name not in seen]
    if missing:
        out.lines.append(
            f"no exporter series for {len(missing)} node(s) with reserved GPUs ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}): their GPUs are not judged"
        )
    for placed in placement.placed:
        if placed.gpu.node in stale:
            continue
        if placed.side == UNKNOWN and placed.reserved_candidates:
            _judge_unplaced(placed, limits, out)
        if placed.side != RESERVED:
            continue
        out.gpus_judged += 1
        _judge_gpu(placed, limits, kept_off, out)
    return out


def _held(point: Point, holders: dict[tuple[str, str], Holder]) -> list[Holder]:
    return [holders[p.ref] for p in sorted(point.pods) if p.ref in holders]


def _unallocated(placed: Placed, limits: Thresholds) -> str | None:
    """When the GPU has been busy with no pod the cluster gave it for the window: since when, its figures, the
    PIDs and the pod the exporter names that holds nothing here (one clause); None otherwise."""
    gpu = placed.gpu
    since = sustained(placed, lambda p: busy(p, limits) and not _held(p, placed.holders), limits)
    if since is None:
        return None
    newest = gpu.points[gpu.newest]
    named = sorted(p.text() for p in newest.pods)
    pids = (
        f"; PIDs {', '.join(sorted(newest.pids, key=lambda p: (len(p), p)))}"
        if newest.pids
        else ("; PIDs not reported (turn on the exporter's kfd_process_id label)")
    )
    by = f"; the exporter names {', '.join(named)}, which holds no GPU of this node in the cluster" if named else ""
    return (
        f"is in use with no pod allocated it since {when(since)} (activity {_num(newest.activity)} %, VRAM "
        f"{_num(newest.vram)} MB){pids}{by}"
    )


_ROUTES = "a process outside Kubernetes, or a container that reached it through AMD_VISIBLE_DEVICES"


def _judge_unplaced(placed: Placed, limits: Thresholds, out: Judgement) -> None:
    """A split node's GPU no pod holds whose side cannot be told: busy, it is reported as possibly reserved."""
    use = _unallocated(placed, limits)
    if use is None:
        return
    out.observations.append(
        Observation(
            "reserved-gpu-used-unallocated",
            placed.gpu.node,
            f"GPU on {placed.where()} {use}: it is one of the node's {placed.candidates} GPUs no pod holds, "
            f"{placed.reserved_candidates} of which are reserved, so it may be a reserved one (the exporter names no "
            f"PCI bus ID to tell which); {_ROUTES}",
        )
    )


def _judge_gpu(placed: Placed, limits: Thresholds, kept_off: Container[str], out: Judgement) -> None:
    gpu, holders = placed.gpu, placed.holders
    newest = gpu.points[gpu.newest]
    use = _unallocated(placed, limits)
    if use is not None:
        out.observations.append(
            Observation("reserved-gpu-used-unallocated", gpu.node, f"reserved GPU on {placed.where()} {use}: {_ROUTES}")
        )
    for holder in _held(newest, holders):
        if holder.class_name not in kept_off or holder.borrows:
            continue
        since = sustained(placed, _busy_with(holder.ref, limits), limits)
        if since is not None:
            out.observations.append(
                Observation(
                    "reserved-gpu-used-by-other-class",
                    gpu.node,
                    f"pod {holder.namespace}/{holder.name} (class {holder.class_name}) is using the reserved GPU on "
                    f"{placed.where()} since {when(since)} (activity {_num(newest.activity)} %, VRAM "
                    f"{_num(newest.vram)} MB), confirmed by the GPU",
                    PodRef(holder.namespace, holder.name),
                )
            )
    if newest.health is not None and newest.health == 0:
        out.observations.append(
            Observation("reserved-gpu-unhealthy", gpu.node, f"reserved GPU on {placed.where()} reports gpu_health 0")
        )
    if newest.temperature is not None and newest.temperature > limits.temperature_celsius:
        out.observations.append(
            Observation(
                "reserved-gpu-hot",
                gpu.node,
                f"reserved GPU on {placed.where()} is at {_num(newest.temperature)} °C, over the policy's "
                f"{_num(limits.temperature_celsius)} °C (spec.gpuMetrics.temperatureCelsius)",
            )
        )
    window = [gpu.points[t] for t in gpu.times() if t >= gpu.newest - limits.window_seconds]
    activity = [p.activity for p in window if p.activity is not None]
    inference = [p.activity for p in window if p.activity is not None and any(h.inference for h in _held(p, holders))]
    mean = sum(activity) / len(activity) if activity else 0.0
    out.loads.append(
        Load(
            gpu.node,
            gpu.text(),
            placed.pci_bus_id,
            mean,
            bool(inference),
            max(activity, default=0.0),
            newest.vram,
            tuple(_held(newest, holders)),
        )
    )
    if inference and len(inference) == len(window):
        load = sum(inference) / len(inference)
        if load > limits.inference_load_percent:
            out.observations.append(
                Observation(
                    "reserved-gpu-inference-load-high",
                    gpu.node,
                    f"inference keeps the reserved GPU on {placed.where()} {_num(load)} % busy on average over the "
                    f"last {_num(limits.window_seconds)} s, over the expected {_num(limits.inference_load_percent)} % "
                    "(spec.gpuMetrics.inferenceLoadPercent)",
                )
            )


def _busy_with(ref: tuple[str, str], limits: Thresholds) -> Callable[[Point], bool]:
    return lambda point: busy(point, limits) and ref in {pod.ref for pod in point.pods}


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"
