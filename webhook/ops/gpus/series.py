"""The exporter's series, normalised: per node and physical GPU, what it reported at each instant. Pure.

Names. The exporter has no name prefix by default (``gpu_gfx_activity``: the GPU Operator's install); its own
Helm chart configures ``amd_`` (``amd_gpu_gfx_activity``). Both are read; other names are ignored.

Labels. ``hostname`` is the node (the exporter's ``NODE_NAME``). A physical GPU is its ``serial_number`` (every
partition of one GPU shares it; its ``gpu_id`` is a per-partition index, not a PCI address), else its ``gpu_id``.
The pod the kubelet allocated a GPU to is ``pod``/``namespace``/``container``, empty (so absent, once Prometheus
has it) for a GPU no pod was allocated. Scraped with ``honorLabels`` (the operator's ServiceMonitor) they stay;
scraped without it Prometheus renames them ``exported_pod``/``exported_namespace``/``exported_container`` and
sets ``pod``/``namespace`` to the exporter's own pod. So: a series with ``exported_pod`` names that pod; on a
scrape target (``instance``) where any series has an ``exported_*`` label, ``pod`` is the exporter's own and
names nobody; otherwise ``pod`` names the pod. ``kfd_process_id`` (optional: comma-joined PIDs) is kept.

Per instant, a GPU's figures over its partitions: activity the highest (the exporter reports it on partition 0
only), VRAM in use summed, health the lowest, temperature the highest of edge, junction and memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webhook.ops.gpus.exposition import Sample

PREFIXES = ("amd_gpu_", "gpu_")
ACTIVITY = "gfx_activity"
VRAM = "used_vram"
HEALTH = "health"
TEMPERATURES = ("edge_temperature", "junction_temperature", "memory_temperature")
FIELDS = (ACTIVITY, VRAM, HEALTH, *TEMPERATURES)
# The PromQL selecting every series read, under both prefixes (one query_range).
SELECTOR = '{__name__=~"(amd_)?gpu_(' + "|".join(FIELDS) + ')"}'
EXPORTED = ("exported_pod", "exported_namespace", "exported_container")


def field_of(name: str) -> str | None:
    """The exporter's field a metric name is (``gfx_activity``...), under either prefix; None: not one read."""
    for prefix in PREFIXES:
        if name.startswith(prefix) and name[len(prefix) :] in FIELDS:
            return name[len(prefix) :]
    return None


@dataclass(frozen=True, order=True)
class PodRef:
    namespace: str
    name: str
    container: str = ""

    @property
    def ref(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def text(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Point:
    """One GPU at one instant."""

    activity: float | None = None  # % gfx activity
    vram: float | None = None  # MB in use
    health: float | None = None  # 1 healthy, 0 unhealthy
    temperature: float | None = None  # °C, the hottest sensor
    pods: set[PodRef] = field(default_factory=set)
    pids: set[str] = field(default_factory=set)

    def add(self, name: str, value: float, pod: PodRef | None, pids: str) -> None:
        if name == ACTIVITY:
            self.activity = value if self.activity is None else max(self.activity, value)
        elif name == VRAM:
            self.vram = value + (self.vram or 0.0)
        elif name == HEALTH:
            self.health = value if self.health is None else min(self.health, value)
        else:
            self.temperature = value if self.temperature is None else max(self.temperature, value)
        if pod is not None:
            self.pods.add(pod)
        self.pids.update(p.strip() for p in pids.split(",") if p.strip())


@dataclass
class GpuSeries:
    """One physical GPU of a node as the exporter reports it: its points by instant (Unix seconds)."""

    node: str
    key: str  # serial number, else "gpu_id N"
    gpu_ids: set[str] = field(default_factory=set)
    card_model: str = ""
    points: dict[float, Point] = field(default_factory=dict)

    def times(self) -> list[float]:
        return sorted(self.points)

    @property
    def newest(self) -> float:
        return max(self.points)

    def text(self) -> str:
        ids = ",".join(sorted(self.gpu_ids, key=lambda g: (len(g), g)))
        return f"gpu_id {ids} (serial {self.key})" if not self.key.startswith("gpu_id ") else self.key

    def pods(self) -> set[PodRef]:
        return {pod for point in self.points.values() for pod in point.pods}


@dataclass
class Readings:
    """Every GPU read, the instant they are judged at (``end``) and what could not be read (one line each)."""

    end: float
    gpus: dict[tuple[str, str], GpuSeries] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def nodes(self) -> dict[str, list[GpuSeries]]:
        out: dict[str, list[GpuSeries]] = {}
        for (node, _), gpu in sorted(self.gpus.items()):
            out.setdefault(node, []).append(gpu)
        return out

    def newest(self, node: str) -> float:
        return max(gpu.newest for gpu in self.nodes().get(node, ()))


def attribution(labels: Mapping[str, str], unhonored: bool) -> PodRef | None:
    """The pod a series names (see the module's docstring), None for a GPU no pod was allocated."""
    if labels.get("exported_pod"):
        return PodRef(
            labels.get("exported_namespace", ""), labels["exported_pod"], labels.get("exported_container", "")
        )
    if unhonored or not labels.get("pod"):
        return None
    return PodRef(labels.get("namespace", ""), labels["pod"], labels.get("container", ""))


def collect(samples: Iterable[Sample], end: float | None = None) -> Readings:
    """The GPUs of ``samples`` (any other series ignored); ``end``: the instant judged, by default the newest
    sample's (a file read offline)."""
    kept = [(f, s) for s in samples if (f := field_of(s.name)) is not None]
    unhonored = {_target(s.labels) for _, s in kept if any(name in s.labels for name in EXPORTED)}
    readings = Readings(end if end is not None else max((s.timestamp for _, s in kept), default=0.0))
    nameless = 0
    for name, sample in kept:
        node = sample.labels.get("hostname", "")
        if not node:
            nameless += 1
            continue
        gpu_id = sample.labels.get("gpu_id", "")
        key = sample.labels.get("serial_number") or f"gpu_id {gpu_id}"
        gpu = readings.gpus.get((node, key))
        if gpu is None:
            gpu = readings.gpus[(node, key)] = GpuSeries(node, key, card_model=sample.labels.get("card_model", ""))
        if gpu_id:
            gpu.gpu_ids.add(gpu_id)
        at = round(sample.timestamp, 3)
        point = gpu.points.get(at)
        if point is None:
            point = gpu.points[at] = Point()
        point.add(
            name,
            sample.value,
            attribution(sample.labels, _target(sample.labels) in unhonored),
            sample.labels.get("kfd_process_id", ""),
        )
    if nameless:
        readings.problems.append(
            f"{nameless} GPU samples have no hostname label (the exporter's NODE_NAME): not mapped to a node"
        )
    return readings


def _target(labels: Mapping[str, str]) -> str:
    return labels.get("instance") or labels.get("hostname", "")
