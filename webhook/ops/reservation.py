"""The reserved pool as data: which nodes to reserve or release, the exact node patches, the plan.

Pure: ``pool/read.py`` reads the cluster and passes nodes and pods in as ``PoolNode``/``PoolPod``;
nothing here does I/O, so every choice and every patch is tested without a cluster.

Patch format. A node is changed with a JSON merge patch (RFC 7386,
``application/merge-patch+json``) that carries only this project's label, the whole taint list,
and ``metadata.resourceVersion``:

- ``metadata.labels`` is a map: a merge patch touches only the keys it names (``null`` deletes
  one), so other labels are never sent, let alone changed.
- ``spec.taints`` is ``x-kubernetes-list-type: atomic`` with no patch strategy in the Kubernetes
  1.37 OpenAPI (``NodeSpec.taints``), so a strategic merge patch would replace the list whole
  too; a JSON Patch would address taints by index, which a concurrent edit shifts. The list is
  therefore rebuilt from the one just read (other taints byte for byte, in their order; ours in
  place of a same-key taint, or appended) and sent whole: identical results with either patch
  type, and merge patch needs no schema knowledge on either side.
- Sending the list whole is only safe if nobody changed it since it was read: the patch carries
  the ``resourceVersion`` that was read, and the apiserver answers 409 Conflict when the node has
  moved on (a precondition the apiserver checks for any patch that sets it). The caller then reads
  the node again and rebuilds the patch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.inventory import same_taint
from webhook.core.policy import Policy

_SELECTOR_TERM = re.compile(r"^\s*([^=!\s,]+)\s*==?\s*([^=!\s,]*)\s*$")


class SelectionError(Exception):
    """The nodes asked for cannot be chosen (unknown node, empty selector match, too few): bad input."""


@dataclass(frozen=True)
class Reservation:
    """What makes a node reserved: the policy's ``reservedNodes`` label and (optional) taint."""

    label: tuple[str, str]
    taint: dict[str, str] | None  # as in Node.spec.taints: key, value (omitted when empty), effect

    @classmethod
    def from_policy(cls, policy: Policy) -> Reservation:
        reserved = policy.spec.reserved_nodes
        taint = reserved.taint
        if taint is None:
            return cls(reserved.label, None)
        as_k8s = {"key": taint.key, "effect": taint.effect}
        if taint.value:
            as_k8s["value"] = taint.value
        return cls(reserved.label, as_k8s)

    @property
    def label_text(self) -> str:
        return f"{self.label[0]}={self.label[1]}"

    @property
    def taint_text(self) -> str:
        return taint_text(self.taint) if self.taint is not None else "(none: the policy sets no taint)"

    def is_our_taint(self, taint: Mapping[str, Any]) -> bool:
        return self.taint is not None and same_taint(taint, self.taint)

    def has_our_key(self, taint: Mapping[str, Any]) -> bool:
        return self.taint is not None and taint.get("key") == self.taint["key"]


def taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value") or ""
    return f"{taint.get('key', '')}{'=' + value if value else ''}:{taint.get('effect', '')}"


@dataclass(frozen=True)
class PoolNode:
    """What the pool needs of a Node."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    resource_version: str
    gpus: int  # allocatable GPUs (amd.com/gpu and partition resources)
    unschedulable: bool = False
    unhealthy: bool = False  # tainted amd-gpu-unhealthy by the AMD GPU operator

    def labelled(self, reservation: Reservation) -> bool:
        key, value = reservation.label
        return self.labels.get(key) == value

    def tainted(self, reservation: Reservation) -> bool:
        return any(reservation.is_our_taint(t) for t in self.taints)

    def marked(self, reservation: Reservation) -> bool:
        """Carries our label key or a taint with our key: what ``release`` removes."""
        return reservation.label[0] in self.labels or any(reservation.has_our_key(t) for t in self.taints)

    def reserved(self, reservation: Reservation) -> bool:
        """Labelled, and tainted when the policy has a taint: nothing left to do."""
        return self.labelled(reservation) and (reservation.taint is None or self.tainted(reservation))


@dataclass(frozen=True)
class PoolPod:
    """A GPU pod bound to a node and not finished, as the pool sees it."""

    namespace: str
    name: str
    node: str
    owner: str  # "Kind/name" of the controller, "" for a bare pod
    gpus: int
    class_name: str  # "" when the policy does not apply to it (excluded namespace)
    inference: bool  # its class is placed on reserved nodes
    daemonset: bool = False
    mirror: bool = False

    @property
    def skip_reason(self) -> str | None:
        """Why ``--evict`` leaves the pod alone, as ``kubectl drain`` does, or None."""
        if not self.class_name:
            return "outside the policy's scope (excluded namespace)"
        if self.mirror:
            return "mirror pod (static, managed by the kubelet)"
        if self.daemonset:
            return "DaemonSet pod (its controller would recreate it)"
        return None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_selector(text: str) -> dict[str, str]:
    """``KEY=VALUE[,KEY=VALUE...]`` (``==`` accepted, as kubectl does) into a dict."""
    selector: dict[str, str] = {}
    for term in text.split(","):
        match = _SELECTOR_TERM.match(term)
        if not match:
            raise SelectionError(f"--selector {text!r}: {term.strip()!r} is not KEY=VALUE")
        key, value = match.groups()
        if key in selector and selector[key] != value:
            raise SelectionError(f"--selector {text!r}: {key} is given twice with different values")
        selector[key] = value
    return selector


def parse_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise SelectionError(f"--nodes {text!r}: empty node name (give NAME[,NAME...])")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Chosen:
    node: PoolNode
    reason: str


@dataclass(frozen=True)
class Selection:
    """The nodes to reserve, and the candidates that were passed over (with why)."""

    chosen: tuple[Chosen, ...]
    passed_over: tuple[Chosen, ...] = ()


def non_inference_gpus(pods: Iterable[PoolPod]) -> dict[str, int]:
    """GPUs requested by non-inference pods, per node."""
    out: dict[str, int] = {}
    for pod in pods:
        if not pod.inference:
            out[pod.node] = out.get(pod.node, 0) + pod.gpus
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _gpus(n: int) -> str:
    return plural(n, "GPU")


def choose_nodes(
    nodes: Sequence[PoolNode],
    pods: Iterable[PoolPod],
    reservation: Reservation,
    *,
    names: Sequence[str] | None = None,
    selector: Mapping[str, str] | None = None,
    count: int | None = None,
    gpus: int | None = None,
) -> Selection:
    """The nodes to reserve: named ones, or the best ``count`` nodes / enough nodes for ``gpus``.

    Candidates are the nodes matching ``selector`` (all nodes without one) that have allocatable
    GPUs. The order is deterministic: nodes already reserved first (choosing them again changes
    nothing, which keeps ``apply`` idempotent), then healthy before cordoned or
    ``amd-gpu-unhealthy`` nodes, then the fewest GPUs requested by non-inference pods (the fewest
    pods the taint leaves stranded), then the name.
    """
    by_name = {node.name: node for node in nodes}
    if names is not None:
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise SelectionError(f"node{'s' if len(unknown) > 1 else ''} not found: {', '.join(unknown)}")
        return Selection(tuple(Chosen(by_name[name], "named with --nodes") for name in names))
    if count is not None and count < 1:
        raise SelectionError(f"--count {count}: give at least 1")
    if gpus is not None and gpus < 1:
        raise SelectionError(f"--gpus {gpus}: give at least 1")
    matching = [n for n in nodes if selector is None or all(n.labels.get(k) == v for k, v in selector.items())]
    where = f"--selector {','.join(f'{k}={v}' for k, v in selector.items())}" if selector else "the cluster"
    if not matching:
        raise SelectionError(f"no node matches {where}")
    candidates = [n for n in matching if n.gpus > 0]
    if not candidates:
        raise SelectionError(f"{where}: {len(matching)} matching node(s), none with allocatable GPUs")
    busy = non_inference_gpus(pods)
    candidates.sort(
        key=lambda n: (not n.reserved(reservation), n.unhealthy or n.unschedulable, busy.get(n.name, 0), n.name)
    )
    without_gpus = len(matching) - len(candidates)
    also = f" ({without_gpus} more without allocatable GPUs)" if without_gpus else ""
    if gpus is not None:
        total = sum(n.gpus for n in candidates)
        if total < gpus:
            raise SelectionError(
                f"--gpus {gpus}: the {len(candidates)} candidate node(s) of {where} hold only {_gpus(total)}{also}"
            )
        take, held = 0, 0
        while held < gpus:
            held += candidates[take].gpus
            take += 1
    elif count is not None:
        if count > len(candidates):
            raise SelectionError(
                f"--count {count}: {where} has only {len(candidates)} candidate node(s) with allocatable GPUs{also}"
            )
        take = count
    else:
        take = len(candidates)
    chosen, passed = candidates[:take], candidates[take:]
    first_passed = passed[0] if passed else None

    def why(node: PoolNode, picked: bool) -> str:
        if node.reserved(reservation):
            return "already reserved"
        used = busy.get(node.name, 0)
        text = f"{_gpus(used)} requested by non-inference pods"
        if node.unhealthy or node.unschedulable:
            text += "; " + ("tainted amd-gpu-unhealthy" if node.unhealthy else "cordoned") + ", taken last"
        elif picked and first_passed is not None and (first_passed.unhealthy or first_passed.unschedulable):
            text += f" ({first_passed.name} is {'unhealthy' if first_passed.unhealthy else 'cordoned'})"
        elif picked and first_passed is not None and not first_passed.reserved(reservation):
            other = busy.get(first_passed.name, 0)
            if other == used:
                text += f"; tied with {first_passed.name}, chosen by name"
            else:
                text += f" (fewer than {first_passed.name}: {other})"
        return text

    held_so_far = 0
    out: list[Chosen] = []
    for node in chosen:
        held_so_far += node.gpus
        reason = why(node, True)
        if gpus is not None:
            reason += f"; {_gpus(held_so_far)} of {gpus} wanted"
        out.append(Chosen(node, reason))
    return Selection(tuple(out), tuple(Chosen(n, why(n, False)) for n in passed))


# --- patches ----------------------------------------------------------------------------------


def reserve_taints(node: PoolNode, reservation: Reservation) -> list[Mapping[str, Any]] | None:
    """The node's taint list with ours in it, or None when it already is exactly that.

    Taints with our key but another value or effect are replaced (the key is this project's);
    every other taint is kept as read, in its place.
    """
    ours = reservation.taint
    if ours is None:
        return None
    same_key = [t for t in node.taints if reservation.has_our_key(t)]
    if len(same_key) == 1 and same_taint(same_key[0], ours):
        return None
    out: list[Mapping[str, Any]] = []
    placed = False
    for taint in node.taints:
        if not reservation.has_our_key(taint):
            out.append(taint)
        elif not placed:
            out.append(dict(ours))
            placed = True
    if not placed:
        out.append(dict(ours))
    return out


def reserve_patch(node: PoolNode, reservation: Reservation) -> dict[str, Any] | None:
    """The merge patch that reserves ``node`` (label and taint only), or None: nothing to change."""
    key, value = reservation.label
    metadata: dict[str, Any] = {}
    if node.labels.get(key) != value:
        metadata["labels"] = {key: value}
    taints = reserve_taints(node, reservation)
    if not metadata and taints is None:
        return None
    metadata["resourceVersion"] = node.resource_version
    patch: dict[str, Any] = {"metadata": metadata}
    if taints is not None:
        patch["spec"] = {"taints": [dict(t) for t in taints]}
    return patch


def release_patch(node: PoolNode, reservation: Reservation) -> dict[str, Any] | None:
    """The merge patch that removes our label and every taint with our key, or None."""
    key, _ = reservation.label
    metadata: dict[str, Any] = {}
    if key in node.labels:
        metadata["labels"] = {key: None}
    kept = [t for t in node.taints if not reservation.has_our_key(t)]
    if not metadata and len(kept) == len(node.taints):
        return None
    metadata["resourceVersion"] = node.resource_version
    patch: dict[str, Any] = {"metadata": metadata}
    if len(kept) != len(node.taints):
        # An empty list is sent as null: the field is removed, as if the node had never been tainted.
        patch["spec"] = {"taints": [dict(t) for t in kept] or None}
    return patch


# --- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePlan:
    node: PoolNode
    reason: str
    label_action: str  # "add", "keep"
    taint_action: str  # "add", "replace", "keep", "none" (the policy has no taint)
    replaced: tuple[Mapping[str, Any], ...]  # same-key taints that ours replaces
    staying: tuple[PoolPod, ...]  # non-inference pods the NoSchedule taint does not move
    patch: dict[str, Any] | None

    @property
    def changes(self) -> bool:
        return self.patch is not None


@dataclass(frozen=True)
class Capacity:
    nodes: int
    gpus_allocatable: int
    gpus_requested: int  # by pods of the classes that use these nodes

    def as_json(self) -> dict[str, int]:
        return {
            "nodes": self.nodes,
            "gpusAllocatable": self.gpus_allocatable,
            "gpusRequested": self.gpus_requested,
            "gpusFree": max(self.gpus_allocatable - self.gpus_requested, 0),
        }


@dataclass(frozen=True)
class Plan:
    reservation: Reservation
    nodes: tuple[NodePlan, ...]
    passed_over: tuple[Chosen, ...]
    reserved_before: Capacity
    reserved_after: Capacity
    training_after: Capacity  # the shared GPU nodes left for everything but inference
    displaced_gpus: int  # GPUs of the staying pods: what they need elsewhere once they leave
    notes: tuple[str, ...] = field(default=())

    @property
    def changes(self) -> bool:
        return any(n.changes for n in self.nodes)


def _capacity(nodes: Iterable[PoolNode], pods: Sequence[PoolPod], inference: bool) -> Capacity:
    members = [n for n in nodes if n.gpus > 0]
    names = {n.name for n in members}
    requested = sum(p.gpus for p in pods if p.node in names and p.inference == inference)
    return Capacity(len(members), sum(n.gpus for n in members), requested)


def build_plan(
    selection: Selection, nodes: Sequence[PoolNode], pods: Sequence[PoolPod], reservation: Reservation
) -> Plan:
    chosen_names = {c.node.name for c in selection.chosen}
    node_plans: list[NodePlan] = []
    notes: list[str] = []
    for chosen in selection.chosen:
        node = chosen.node
        replaced: tuple[Mapping[str, Any], ...] = ()
        if reservation.taint is None:
            taint_action = "none"
        else:
            replaced = tuple(t for t in node.taints if reservation.has_our_key(t) and not reservation.is_our_taint(t))
            taint_action = "keep" if reserve_taints(node, reservation) is None else "replace" if replaced else "add"
        staying = tuple(
            sorted((p for p in pods if p.node == node.name and not p.inference), key=lambda p: (p.namespace, p.name))
        )
        node_plans.append(
            NodePlan(
                node=node,
                reason=chosen.reason,
                label_action="keep" if node.labelled(reservation) else "add",
                taint_action=taint_action,
                replaced=replaced,
                staying=staying,
                patch=reserve_patch(node, reservation),
            )
        )
        if node.gpus == 0:
            notes.append(f"{node.name} has no allocatable GPUs: it adds nothing to the pool")
        if node.unhealthy:
            notes.append(f"{node.name} is tainted amd-gpu-unhealthy: its GPUs fail the AMD GPU operator's checks")
        if node.unschedulable:
            notes.append(f"{node.name} is cordoned (spec.unschedulable): inference pods cannot land there either")
    before = [n for n in nodes if n.labelled(reservation)]
    after = [n for n in nodes if n.labelled(reservation) or n.name in chosen_names]
    after_names = {n.name for n in after}
    shared = [n for n in nodes if n.name not in after_names]
    if reservation.taint is None:
        notes.append(
            "the policy sets no reservedNodes.taint: only the label is added, nothing keeps unmutated pods off"
        )
    return Plan(
        reservation=reservation,
        nodes=tuple(node_plans),
        passed_over=selection.passed_over,
        reserved_before=_capacity(before, pods, True),
        reserved_after=_capacity(after, pods, True),
        training_after=_capacity(shared, pods, False),
        displaced_gpus=sum(p.gpus for n in node_plans for p in n.staying if p.skip_reason is None),
        notes=tuple(notes),
    )


# --- release ------------------------------------------------------------------------------------


def room_after_release(
    releasing: Iterable[str], nodes: Sequence[PoolNode], pods: Sequence[PoolPod], reservation: Reservation
) -> list[PoolPod]:
    """The inference pods on ``releasing`` nodes that would find no room on the reserved nodes left.

    Room is allocatable minus requested per remaining reserved node (labelled and schedulable).
    Pods are placed largest first on the node with the most room left (first-fit decreasing):
    a pod that fits nowhere is returned. An empty list means every one of them has room.
    """
    gone = set(releasing)
    remaining = [n for n in nodes if n.labelled(reservation) and n.name not in gone and not n.unschedulable]
    free = {n.name: n.gpus for n in remaining}
    for pod in pods:
        if pod.node in free:
            free[pod.node] -= pod.gpus
    moving = sorted(
        (p for p in pods if p.node in gone and p.inference and p.gpus > 0), key=lambda p: (-p.gpus, p.namespace, p.name)
    )
    homeless: list[PoolPod] = []
    for pod in moving:
        best = max(free, key=lambda name: (free[name], name), default=None)
        if best is None or free[best] < pod.gpus:
            homeless.append(pod)
        else:
            free[best] -= pod.gpus
    return homeless


# --- output ---------------------------------------------------------------------------------------


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as kubectl prints them: left-aligned columns three spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _pod_json(pod: PoolPod) -> dict[str, Any]:
    out: dict[str, Any] = {
        "namespace": pod.namespace,
        "name": pod.name,
        "owner": pod.owner or None,
        "gpus": pod.gpus,
        "class": pod.class_name,
        "evictable": pod.skip_reason is None,
    }
    if pod.skip_reason is not None:
        out["skipReason"] = pod.skip_reason
    return out


def plan_json(plan: Plan) -> dict[str, Any]:
    res = plan.reservation
    return {
        "reservation": {"label": {"key": res.label[0], "value": res.label[1]}, "taint": res.taint},
        "changes": plan.changes,
        "nodes": [
            {
                "name": n.node.name,
                "reason": n.reason,
                "gpus": n.node.gpus,
                "label": n.label_action,
                "taint": n.taint_action,
                "replacesTaints": [dict(t) for t in n.replaced],
                "podsStaying": [_pod_json(p) for p in n.staying],
                "patch": n.patch,
            }
            for n in plan.nodes
        ],
        "passedOver": [{"name": c.node.name, "gpus": c.node.gpus, "reason": c.reason} for c in plan.passed_over],
        "reserved": {"before": plan.reserved_before.as_json(), "after": plan.reserved_after.as_json()},
        "training": plan.training_after.as_json(),
        "displacedGpus": plan.displaced_gpus,
        "notes": list(plan.notes),
    }


def _nodes(n: int) -> str:
    return plural(n, "node")


def plan_lines(plan: Plan) -> list[str]:
    res = plan.reservation
    lines = [f"Reserved pool: label {res.label_text}, taint {res.taint_text}", ""]
    rows = [["NODE", "GPUS", "LABEL", "TAINT", "WHY"]]
    rows += [[n.node.name, str(n.node.gpus), n.label_action, n.taint_action, n.reason] for n in plan.nodes]
    lines += columns(rows)
    for n in plan.nodes:
        for taint in n.replaced:
            lines.append(f"  {n.node.name}: {taint_text(taint)} is replaced by {res.taint_text}")
    if plan.passed_over:
        lines += ["", "Not chosen:"]
        lines += columns(
            [["NODE", "GPUS", "WHY"]] + [[c.node.name, str(c.node.gpus), c.reason] for c in plan.passed_over]
        )
    staying = [(n.node.name, p) for n in plan.nodes for p in n.staying]
    lines.append("")
    if staying:
        lines.append(
            "Running non-inference pods that the NoSchedule taint will not move (pool apply --evict evicts them):"
        )
        rows = [["NODE", "NAMESPACE", "POD", "OWNER", "GPUS", "EVICT"]]
        rows += [
            [
                node,
                p.namespace,
                p.name,
                p.owner or "-",
                str(p.gpus),
                "yes" if p.skip_reason is None else f"no: {p.skip_reason}",
            ]
            for node, p in staying
        ]
        lines += columns(rows)
    else:
        lines.append("No non-inference pods run on these nodes.")
    before, after, training = plan.reserved_before, plan.reserved_after, plan.training_after
    lines += [
        "",
        f"Reserved pool: {_nodes(before.nodes)}, {_gpus(before.gpus_allocatable)} now; "
        f"{_nodes(after.nodes)}, {_gpus(after.gpus_allocatable)} after ({after.gpus_requested} requested by inference).",
        f"Left for training: {_nodes(training.nodes)}, {_gpus(training.gpus_allocatable)} allocatable, "
        f"{training.gpus_requested} requested by non-inference pods "
        f"({max(training.gpus_allocatable - training.gpus_requested, 0)} free).",
    ]
    if plan.displaced_gpus:
        lines.append(
            f"The evictable pods above request {_gpus(plan.displaced_gpus)}: once evicted, they need that room "
            "on the shared nodes."
        )
    lines += [f"note: {note}" for note in plan.notes]
    if not plan.changes:
        lines.append("Nothing to change: every node is already reserved.")
    return lines
