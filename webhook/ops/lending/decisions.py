"""Lending idle reserved GPUs, as decisions on the capacity model: which reserved nodes take no new borrowers,
and which borrowers make room for an inference pod that waits. Pure: the Lease holder of ``serve`` reads the
cluster, asks here, and writes (``service/lending_loop.py``); ``pool status`` and ``audit`` show the same.

Who may be lent what. Admission makes a borrower (``core/lending.py``): a training pod at the borrowers'
PriorityClass, tolerating the reserved taint and preferring shared nodes. On reserved nodes it takes what
inference leaves idle; inference takes it back first, by the scheduler's own preemption on nodes whose GPUs
kubelet counts, and by ``reclaim`` (evictions) where the scheduler cannot preempt (DRA devices, up to 1.37).

Which reserved nodes are closed to new borrowers (they carry the no-borrowers taint, which inference
tolerates and borrowers never do): every one while an inference pod of the pool waits (no lending while
inference waits: what is freed goes to inference, not to the next borrower), and otherwise enough of the
idle ones to keep ``headroom`` GPUs free for an inference burst: nodes without borrowers, the emptiest
first, until their free GPUs cover the headroom. The rest are open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook.core import scheduling
from webhook.core.pods import MalformedPod
from webhook.core.rules import PLACED_LABEL
from webhook.ops.capacity import RESERVED, CapacityModel, Holder, NodeCapacity


@dataclass(frozen=True)
class Waiting:
    """An inference pod that cannot be scheduled for lack of reserved GPUs."""

    namespace: str
    name: str
    uid: str
    gpus: int
    created: datetime | None = None
    devices: bool = False  # its GPUs are DRA devices (claims): only evictions make room
    # The nodes its nodeSelector and required node affinity admit (``node_admits``); None: any node. Room is
    # made only there: evicting a borrower from a node the pod cannot go to frees nothing for it.
    nodes: frozenset[str] | None = None


@dataclass(frozen=True)
class Reclaim:
    """Borrowers to evict from one node so that ``pod`` fits there."""

    pod: Waiting
    node: str
    victims: tuple[Holder, ...]


def _requirement_holds(expression: Mapping[str, Any], value: str | None) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            number, bound = int(value), int(values[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def node_admits(pod: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """Whether the pod's ``nodeSelector`` and required node affinity admit the node (the scheduler's
    NodeAffinity filter: every selector label, and one of the terms, each requirement of it; ``matchFields``
    on ``metadata.name``). A pod whose terms cannot be read is admitted everywhere (the plan then may evict
    for a node it cannot use, as before, rather than never make room)."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if isinstance(selector, Mapping) and any(labels.get(str(k)) != str(v) for k, v in selector.items()):
        return False
    try:
        terms = scheduling.required_terms(spec)
    except MalformedPod:
        return True
    if terms is None:
        return True
    for term in terms:
        if term.empty:
            continue
        if all(_requirement_holds(e, labels.get(str(e.get("key")))) for e in term.expressions) and all(
            _requirement_holds(f, name if f.get("key") == "metadata.name" else None) for f in term.fields
        ):
            return True
    return False


def lent(node: NodeCapacity) -> int:
    """Reserved GPUs of the node that borrowers hold."""
    side = node.sides.get(RESERVED)
    return sum(gpus for holder, gpus in side.holders if holder.borrows) if side is not None else 0


def lent_per_node(model: CapacityModel) -> dict[str, int]:
    return {node.name: lent(node) for node in model.pool_nodes(RESERVED)}


def closed_nodes(model: CapacityModel, headroom: int, waiting: Sequence[Waiting]) -> set[str]:
    """The nodes reserved whole that take no new borrowers (see the module's docstring). Split nodes are
    never tainted: a node's taint would close its shared GPUs to every training pod too."""
    nodes = [node for node in model.pool_nodes(RESERVED) if not node.split]
    if waiting:
        return {node.name for node in nodes}
    idle = sorted(
        (node for node in nodes if lent(node) == 0),
        key=lambda node: (-node.side(RESERVED).free, node.name),
    )
    closed: set[str] = set()
    kept = 0
    for node in idle:
        if kept >= headroom:
            break
        closed.add(node.name)
        kept += max(node.side(RESERVED).free, 0)
    return closed


def _created(holder: Holder) -> float:
    return holder.created.timestamp() if holder.created is not None else 0.0


def victims_on(
    model: CapacityModel, node: NodeCapacity, pod: Waiting, spared: Iterable[tuple[str, str]]
) -> tuple[Holder, ...] | None:
    """The fewest borrowers of ``node``'s reserved side whose leaving lets ``pod`` fit, the youngest among
    equals; never an inference pod or a non-borrower, never one of ``spared`` (a PodDisruptionBudget refused
    its eviction). None when no set of borrowers makes room."""
    side = node.sides.get(RESERVED)
    if side is None:
        return None
    skip = set(spared)
    if model.fits(node.name, RESERVED, pod.gpus):
        return ()
    candidates = sorted(
        ((holder, gpus) for holder, gpus in side.holders if holder.borrows and holder.ref not in skip),
        key=lambda entry: (-entry[1], -_created(entry[0]), entry[0].ref),
    )
    chosen: list[Holder] = []
    for holder, _ in candidates:
        chosen.append(holder)
        if model.fits(node.name, RESERVED, pod.gpus, leaving=[h.ref for h in chosen]):
            return tuple(chosen)
    return None


def plan_reclaims(
    model: CapacityModel,
    waiting: Sequence[Waiting],
    leaving: Iterable[tuple[str, str]] = (),
    spared: Iterable[tuple[str, str]] = (),
) -> list[Reclaim]:
    """Room for every waiting pod whose GPUs are devices of split nodes, the oldest first: on each node, what
    is free once the ``leaving`` pods are gone (borrowers already evicted, terminating), less what was
    promised to older waiting pods this round; where that is not enough, the fewest borrowers to evict,
    the youngest among equals, on the nodes the pod can go to (``Waiting.nodes``) (never an inference pod, a
    non-borrower, one leaving already or one of
    ``spared``: its PodDisruptionBudget refused). A pod the freed devices already cover gets a plan with no
    victims: nothing more is evicted for it (this is what makes a new Lease holder pick up a reclaim in
    flight without evicting twice: the plan is a function of the cluster, not of memory). A pod that fits
    nowhere even with every borrower gone gets no plan."""
    gone = set(leaving)
    skip = gone | set(spared)
    promised: dict[str, int] = {}
    plans: list[Reclaim] = []
    for pod in sorted(waiting, key=lambda w: (w.created.timestamp() if w.created else 0.0, w.namespace, w.name)):
        best: tuple[tuple[int, float, str], Reclaim] | None = None
        for node in model.pool_nodes(RESERVED):
            if not node.split or (pod.nodes is not None and node.name not in pod.nodes):
                continue
            free = model.free_without(node.name, RESERVED, gone) - promised.get(node.name, 0)
            chosen: list[Holder] = []
            if free < pod.gpus:
                candidates = sorted(
                    (
                        (holder, gpus)
                        for holder, gpus in node.side(RESERVED).holders
                        if holder.borrows and holder.ref not in skip
                    ),
                    key=lambda entry: (-entry[1], -_created(entry[0]), entry[0].ref),
                )
                for holder, gpus in candidates:
                    chosen.append(holder)
                    free += gpus
                    if free >= pod.gpus:
                        break
                if free < pod.gpus:
                    continue
            key = (len(chosen), -max((_created(h) for h in chosen), default=0.0), node.name)
            if best is None or key < best[0]:
                best = (key, Reclaim(pod, node.name, tuple(chosen)))
        if best is None:
            continue
        plan = best[1]
        plans.append(plan)
        promised[plan.node] = promised.get(plan.node, 0) + pod.gpus
        gone |= {victim.ref for victim in plan.victims}
        skip |= {victim.ref for victim in plan.victims}
    return plans


def reclaim(model: CapacityModel, pod: Waiting, spared: Iterable[tuple[str, str]] = ()) -> Reclaim | None:
    """Where to make room for ``pod``: the node needing the fewest evictions, then the youngest victims, then
    by name. ``devices``: only split nodes' reserved devices; else the nodes reserved whole. None when the
    pod fits nowhere even with every borrower gone (or fits already: nothing to evict)."""
    spared = set(spared)
    best: tuple[tuple[int, float, str], Reclaim] | None = None
    for node in model.pool_nodes(RESERVED):
        if node.split != pod.devices:
            continue
        found = victims_on(model, node, pod, spared)
        if found is None:
            continue
        if not found:
            return None  # it fits here already: the scheduler will place it
        key = (len(found), -max(_created(h) for h in found), node.name)
        if best is None or key < best[0]:
            best = (key, Reclaim(pod, node.name, found))
    return best[1] if best is not None else None


def closed_after_lending(pods: Iterable[Mapping[str, Any]], borrower_class: str, inference: Iterable[str]) -> bool:
    """Lending off (issue 42): whether the reserved nodes stay closed to borrowers (the no-borrowers taint).
    A borrower admitted before the switch, still pending, tolerates the reserved taint and would bind to an
    idle reserved node afterwards: while one exists (``spec.priorityClassName`` the borrowers' class, not
    bound, not terminating; judged by the class alone, since ``core/lending.is_borrower`` says no borrower
    with lending off), every reserved node stays closed. Inference pods tolerate that taint only while
    lending is on, so an inference pod waiting (a pod placed as one of ``inference``, not bound, not
    terminating) opens them (a pending borrower may bind first; inference then preempts it: a borrower's
    priority is below every inference pod's). ``pods``: the pods labelled
    to borrow and those placed as inference; running borrowers are left alone either way."""
    names = set(inference)
    pending_borrower = False
    for pod in pods:
        spec = pod.get("spec") or {}
        metadata = pod.get("metadata") or {}
        if spec.get("nodeName") or metadata.get("deletionTimestamp"):
            continue
        if (metadata.get("labels") or {}).get(PLACED_LABEL) in names:
            return False
        pending_borrower = pending_borrower or spec.get("priorityClassName") == borrower_class
    return pending_borrower
