"""Each GPU the exporter reports, placed on the capacity model: its node, its side, and the cluster's GPU
(PCI bus ID) when that can be told. Pure.

- The node is the series' ``hostname``. A node the cluster does not have is not placed (said in one line).
- A node reserved whole (the reserved label; device plugin or DRA alike) or not reserved at all has one side:
  every GPU of it is on that side, whichever it is.
- A split node (device-level reservation) has both, and the exporter names no PCI bus ID (``gpu_id`` is an index
  whose order nothing documents against the DRA driver's devices): a GPU is placed by the pods holding it.
  A series naming a pod places the GPU among the GPUs that pod was allocated there (the exporter's attribution
  is the kubelet's allocation); a series naming none, among the GPUs of the node no pod holds. When that leaves
  one GPU, it is that one (and, by elimination, removed from the other GPUs' candidates); when every candidate is
  on one side, the side is known without the GPU. Otherwise the side is ``UNKNOWN``: the GPU is reported as not
  placed, never guessed (e.g. a split node with free GPUs on both sides and an unattributed busy GPU); its
  candidates are kept (how many, how many of them reserved), which the judgement words its finding with.
- A pod the exporter names that holds no GPU of that node in the cluster (finished meanwhile, or the exporter's
  own pod under a scheme not recognised) places nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.ops.capacity import RESERVED, CapacityModel, Holder
from webhook.ops.gpus.series import GpuSeries, Readings

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Placed:
    gpu: GpuSeries
    side: str  # capacity.RESERVED / SHARED / UNRESERVED, or UNKNOWN
    pci_bus_id: str  # "" unless the GPU is pinned to one of the cluster's
    holders: dict[tuple[str, str], Holder]  # the pods holding GPUs of its node, by (namespace, name)
    # Split nodes: how many of the node's GPUs it may be, and how many of those are reserved (0, 0 elsewhere).
    candidates: int = 0
    reserved_candidates: int = 0

    def where(self) -> str:
        bus = f", PCI {self.pci_bus_id}" if self.pci_bus_id else ""
        return f"node {self.gpu.node} {self.gpu.text()}{bus}"


@dataclass
class Placement:
    placed: list[Placed]
    problems: list[str]


def node_holders(model: CapacityModel, node: str) -> dict[tuple[str, str], Holder]:
    found = model.nodes.get(node)
    if found is None:
        return {}
    return {holder.ref: holder for side in found.sides.values() for holder, _ in side.holders}


def place(readings: Readings, model: CapacityModel) -> Placement:
    out = Placement([], [])
    unknown_nodes = []
    for node, gpus in readings.nodes().items():
        capacity = model.nodes.get(node)
        if capacity is None or not capacity.known:
            unknown_nodes.append(node)
            continue
        holders = node_holders(model, node)
        if not capacity.split:
            out.placed.extend(Placed(gpu, capacity.whole, "", holders) for gpu in gpus)
            continue
        out.placed.extend(_place_split(model, node, gpus, holders, out.problems))
    if unknown_nodes:
        out.problems.append(
            f"exporter series for {len(unknown_nodes)} node(s) the cluster does not have "
            f"({', '.join(unknown_nodes[:5])}{', ...' if len(unknown_nodes) > 5 else ''}): not judged"
        )
    return out


def _place_split(
    model: CapacityModel, node: str, gpus: list[GpuSeries], holders: dict[tuple[str, str], Holder], problems: list[str]
) -> list[Placed]:
    views = {view.key: view for view in model.gpu_views(node)}
    held: dict[tuple[str, str], set[str]] = {}
    for ref, devices in model.held.items():
        keys = {d.gpu for d in devices if d.node == node}
        if keys:
            held[ref] = keys
    free = {key for key, view in views.items() if not view.allocated}
    candidates: dict[int, set[str]] = {}
    for index, gpu in enumerate(gpus):
        pods = [pod.ref for pod in gpu.pods() if pod.ref in held]
        if pods:
            found = set(views)
            for ref in pods:
                found &= held[ref]
        else:
            found = set(free)
        candidates[index] = found
    changed = True
    while changed:  # elimination: a GPU pinned to one candidate is no other GPU's
        changed = False
        pinned = {next(iter(c)) for c in candidates.values() if len(c) == 1}
        for c in candidates.values():
            if len(c) > 1 and c & pinned:
                c -= pinned
                changed = True
    placed = []
    unplaced = []
    for index, gpu in enumerate(gpus):
        found = candidates[index]
        sides = {views[key].state for key in found}
        side = next(iter(sides)) if len(sides) == 1 else UNKNOWN
        bus = views[next(iter(found))].pci_bus_id if len(found) == 1 else ""
        if side == UNKNOWN:
            unplaced.append(gpu.text())
        reserved = sum(1 for key in found if views[key].state == RESERVED)
        placed.append(Placed(gpu, side, bus, holders, len(found), reserved))
    if unplaced:
        problems.append(
            f"split node {node}: {len(unplaced)} GPU(s) the exporter reports could not be placed on a side "
            f"({'; '.join(unplaced[:4])}): the exporter names no PCI bus ID, and the pods holding them do not tell"
        )
    return placed
