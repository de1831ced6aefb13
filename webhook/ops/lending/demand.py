"""Inference's demand on the reserved pool, per kind of node: the figures that size the reservation (issue 43).

Pure: the lending keeper of ``serve`` builds the capacity model and finds the inference pods waiting (however
it reads the cluster), asks here, and exports the answer as gauges (``service/metrics.py``);
``pool recommend`` (``ops/recommend/sizing.py``) reads their history back from Prometheus.

Two kinds of node, two demands: the nodes reserved whole (inference asks for ``amd.com/gpu``, the scheduler
preempts borrowers there) and the split nodes' reserved devices (inference asks through claims, the keeper
evicts borrowers). An inference pod lands on one kind or the other, never both, so each kind is sized on its
own: reserved nodes on whole ones, devices per node on split ones.

Per kind, on the reserved side of its nodes:

- ``inference``: GPUs inference pods hold;
- ``waiting``: GPUs inference pods asked for and did not get (``Unschedulable``; on split nodes the devices
  of their claims not yet allocated): held + waiting is the demand a reservation must cover;
- ``lent``: GPUs borrowers hold; ``idle``: GPUs nobody holds; whatever else holds reserved GPUs (a pod of
  another class, which ``audit`` reports) is ``reserved - inference - lent - idle``;
- ``reserved``, ``nodes`` and ``node_gpus`` (every GPU of those nodes, both sides of a split node): today's
  size, and what a different size can be made of (devices per node cannot exceed a node's GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from webhook.ops.capacity import RESERVED, CapacityModel
from webhook.ops.lending.decisions import Waiting, lent

WHOLE: Final = "whole"
SPLIT: Final = "split"
KINDS: Final = (WHOLE, SPLIT)
POOL: Final = "reserved"  # the pool label of the gauges: the policy's one reserved pool

# The gauge of each figure (``serve`` exports them, labelled pool and nodes; ``pool recommend`` reads them back).
GAUGES: Final = {
    "nodes": "rocm_isolation_reserved_nodes",
    "node_gpus": "rocm_isolation_reserved_nodes_gpus",
    "reserved": "rocm_isolation_reserved_gpus",
    "inference": "rocm_isolation_reserved_gpus_inference",
    "waiting": "rocm_isolation_reserved_gpus_inference_waiting",
    "lent": "rocm_isolation_reserved_gpus_lent",
    "idle": "rocm_isolation_reserved_gpus_idle",
}


@dataclass(frozen=True)
class Demand:
    """One kind of node's reserved GPUs and who holds or wants them, at one round (see the module)."""

    nodes: int = 0
    node_gpus: int = 0
    reserved: int = 0
    inference: int = 0
    waiting: int = 0
    lent: int = 0
    idle: int = 0


def reserved_demand(model: CapacityModel, waiting: Iterable[Waiting]) -> dict[str, Demand]:
    """The demand on the nodes reserved whole and on the split nodes' reserved devices, from the capacity model
    and the inference pods waiting (``Waiting.devices``: they wait for split nodes' devices, else for whole
    nodes' GPUs). A kind with no node in the model is all zeros."""
    counts = {kind: dict.fromkeys(("nodes", "node_gpus", "reserved", "inference", "lent", "idle"), 0) for kind in KINDS}
    for node in model.pool_nodes(RESERVED):
        found = counts[SPLIT if node.split else WHOLE]
        side = node.side(RESERVED)
        found["nodes"] += 1
        found["node_gpus"] += sum(s.capacity for s in node.sides.values())  # a split node's both sides
        found["reserved"] += side.capacity
        found["inference"] += sum(gpus for holder, gpus in side.holders if holder.inference)
        found["lent"] += lent(node)
        # A side over-allocated (readings that disagree) has nothing idle, not less than nothing.
        found["idle"] += max(side.free, 0)
    wanted = dict.fromkeys(KINDS, 0)
    for pod in waiting:
        wanted[SPLIT if pod.devices else WHOLE] += pod.gpus
    return {kind: Demand(waiting=wanted[kind], **counts[kind]) for kind in KINDS}
