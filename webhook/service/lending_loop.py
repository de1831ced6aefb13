"""Lending, kept by ``serve``: the reserved nodes closed to new borrowers, and what operators see of lending.

The replica holding the background audit's Lease (one at a time) runs a round every ``interval`` seconds
while the policy's lending is on:

1. reads the cluster as ``pool`` does into its one capacity model (``ops/capacity.py``: whole and split
   nodes, every pod holding GPUs; from the watched view in ``serve``: ``cluster/view.py``), and, by label,
   the borrowers (``rocm-isolation.io/borrow=true``, judged with ``core/lending.is_borrower``) and the
   inference pods (the placed label ``rocm-isolation.io/placed=<an inference class>``): who waits, who was
   preempted, who bound since;
2. closes reserved nodes to new borrowers with the no-borrowers taint, and opens the others
   (``ops/lending.closed_nodes``: every one while an inference pod waits for reserved GPUs, else the idle
   ones that keep ``headroomGPUs`` free). A merge patch of ``spec.taints`` with the ``resourceVersion``
   read: a node that changed meanwhile is a 409, written next round. Only our taint is ever added or
   removed. The taint is NoSchedule: running borrowers stay; inference takes their GPUs back by the
   scheduler's preemption (borrowers run at a priority below every inference pod);
3. exports what it saw: reserved GPUs lent, closed nodes, inference pods waiting, borrowers preempted
   (the scheduler's ``DisruptionTarget`` condition), and, per inference pod that waited while borrowers held
   reserved GPUs, the seconds from its creation to its binding.

4. lends and takes back the reserved devices of split nodes (DRA), where the scheduler cannot preempt:
   the lendable DeviceClass opened or closed, borrowers evicted for waiting inference pods
   (``service/device_lending.py``).

With lending off, a round removes the taint from any node still carrying it and closes the lendable class
(turning lending off leaves running borrowers alone and lends nothing new: admission stops making
borrowers) and exports nothing; but while a borrower admitted before the switch is still pending (and no
inference pod waits), every reserved node keeps the taint (``ops/lending.closed_after_lending``, issue 42).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from webhook.cluster.inventory import gpu_request, parse_time
from webhook.cluster.kubeapi import ApiError, Conflict, KubeApi, api_path
from webhook.cluster.view import ClusterView, NotSynced
from webhook.core.lending import is_borrower, settings
from webhook.core.policy import Policy
from webhook.ops.capacity import RESERVED, CapacityModel
from webhook.ops.lending.decisions import Waiting, closed_after_lending, closed_nodes
from webhook.ops.lending.demand import WHOLE, Demand, reserved_demand
from webhook.ops.pool.read import PoolRead
from webhook.service.device_lending import DeviceLending, DeviceRound
from webhook.service.periodic import Periodic

log = logging.getLogger("webhook.lending")

PLACED_LABEL = "rocm-isolation.io/placed"
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class Observed:
    """What one round saw and did."""

    lent: int = 0
    closed: tuple[str, ...] = ()
    waiting: int = 0
    written: tuple[str, ...] = ()  # nodes whose taint was added or removed
    conflicts: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()  # borrowers seen leaving under the scheduler's preemption (uids)
    bound: tuple[float, ...] = ()  # seconds from creation to binding of inference pods that waited on borrowers
    devices: DeviceRound = field(
        default_factory=DeviceRound
    )  # the reserved devices of split nodes (service/device_lending.py)
    synced: bool = True  # the view of the cluster the round read was synced (else nothing was decided)
    seconds: float | None = None  # how long the round took (None: not timed, e.g. not leading)
    demand: Demand = field(default_factory=Demand)  # the nodes reserved whole (ops/lending/demand.py; issue 43)


def _conditions(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found: dict[str, Mapping[str, Any]] = {}
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping):
            found[str(condition.get("type", ""))] = condition
    return found


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Not bound, and the scheduler said why (``PodScheduled=False``, reason ``Unschedulable``)."""
    if (pod.get("spec") or {}).get("nodeName"):
        return False
    scheduled = _conditions(pod).get("PodScheduled")
    return scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"


def preempted(pod: Mapping[str, Any]) -> bool:
    target = _conditions(pod).get("DisruptionTarget")
    return target is not None and target.get("status") == "True" and target.get("reason") == "PreemptionByScheduler"


def bound_at(pod: Mapping[str, Any]) -> datetime | None:
    scheduled = _conditions(pod).get("PodScheduled")
    if scheduled is None or scheduled.get("status") != "True":
        return None
    return parse_time(scheduled.get("lastTransitionTime"))


def taint_patch(node: Mapping[str, Any], taint: Mapping[str, str], *, present: bool) -> dict[str, Any] | None:
    """The merge patch that adds or removes our taint (key and effect), keeping every other taint and
    guarded by the node's resourceVersion; None when the node is already so."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, Mapping)]
    ours = [t for t in taints if t.get("key") == taint["key"] and t.get("effect") == taint["effect"]]
    if present == bool(ours) and (not present or ours[0].get("value") == taint["value"]):
        return None
    kept = [dict(t) for t in taints if t not in ours]
    if present:
        kept.append(dict(taint))
    metadata = node.get("metadata") or {}
    return {"metadata": {"resourceVersion": metadata.get("resourceVersion")}, "spec": {"taints": kept}}


@dataclass
class LendingKeeper:
    """The rounds, and what they remember between them (preempted borrowers counted once, inference pods
    seen waiting on borrowers).

    With a ``view`` (what ``serve`` runs), ``api`` is the view's ``ViewApi``: the keeper starts the view when
    its replica holds the Lease, stops it when it does not, and decides nothing until it is synced (after a
    handover, a relist, a policy reload). Without one (tests, tools), every round reads ``api`` itself."""

    api: KubeApi  # a ViewApi with a view
    policy: Callable[[], Policy]
    leading: Callable[[], bool]
    interval: float = 5.0
    on_round: Callable[[Observed], None] = lambda observed: None
    view: ClusterView | None = None
    _preempted: set[str] = field(default_factory=set)
    _waited: dict[str, datetime | None] = field(default_factory=dict)  # uid -> creation, of inference pods
    _rounds: Periodic | None = None
    _devices: DeviceLending | None = None
    _syncing: bool = False  # rounds found the view not synced since the last synced one

    def __post_init__(self) -> None:
        self._devices = DeviceLending(self.api, self.leading)

    def start(self) -> None:
        self._rounds = Periodic("lending", self.interval, self._round, log)
        self._rounds.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._rounds is not None:
            self._rounds.stop(timeout)
        if self.view is not None:
            self.view.stop()

    def _round(self) -> None:
        try:
            self.on_round(self.tick())
        except ApiError as err:
            log.warning("lending: cannot read or write the cluster", extra={"error": str(err)})

    def tick(self) -> Observed:
        """One round as ``serve`` runs it: nothing but zeros off the Lease (another replica keeps lending; the
        alerts take the maximum), nothing decided before the view is synced, else ``run_once``, timed."""
        if not self.leading():
            if self.view is not None:
                self.view.stop()
            self._preempted.clear()
            self._waited.clear()
            return Observed(synced=self.view is None)
        started = time.monotonic()
        if self.view is not None:
            self.view.start()
            self.view.follow(self.policy())
            self.view.refresh_discovery()
            if not self.view.synced:
                return self._not_synced("the view of the cluster is syncing")
            if self._syncing:
                # The view just listed the cluster: 100,000s of objects that live until the Lease goes, none in a
                # reference cycle. Out of the collector's reach, as serve's app_factory does with what it loads,
                # so that no full collection walks them again (in this process, which answers the reviews).
                gc.collect()
                gc.freeze()
        try:
            observed = self.run_once()
        except NotSynced as err:
            return self._not_synced(str(err))
        self._syncing = False
        return replace(observed, seconds=time.monotonic() - started)

    def dump_view(self, path: Path) -> bool:
        """The view, for the background audit's child (``audit --from-view``); False while none is synced (not
        holding the Lease, syncing)."""
        return self.view is not None and self.leading() and self.view.dump(path)

    def _not_synced(self, why: str) -> Observed:
        if not self._syncing:
            log.info("lending: nothing decided until the view is synced", extra={"why": why})
            self._syncing = True
        return Observed(synced=False)

    def _list(self, path: str, selector: str, fields: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for obj in self.api.list(path, label_selector=selector, field_selector=fields, on_restart=found.clear):
            found.append(obj)
        return found

    def run_once(self, now: datetime | None = None) -> Observed:
        policy = self.policy()
        lending = settings(policy)
        key, value = policy.spec.reserved_nodes.label
        nodes = self._list(api_path("v1", "nodes"), f"{key}={value}")  # what the taint patches are made from
        taint = {k: str(v) for k, v in lending.no_borrowers_toleration.items() if k != "operator"}
        inference = sorted(n for n, c in policy.spec.classes.items() if c.placement == "reserved")
        # The borrowers and the inference pods, by label: who waits, who was preempted, who bound since.
        pods = self._list(api_path("v1", "pods"), f"{lending.pod_label}=true", ACTIVE_PODS)
        if inference and (lending.enabled or pods):
            pods += self._list(api_path("v1", "pods"), f"{PLACED_LABEL} in ({','.join(inference)})", ACTIVE_PODS)
        if not lending.enabled:
            # Pending borrowers of before the switch keep the reserved nodes closed (ops/lending).
            keep = closed_after_lending(pods, lending.borrower.name, inference)
            closed = {str((n.get("metadata") or {}).get("name", "")) for n in nodes} if keep else set()
            written, conflicts = self._taint(nodes, taint, closed=closed)
            devices = self._device_round(policy, [])
            return Observed(written=tuple(written), conflicts=tuple(conflicts), devices=devices)
        assert self._devices is not None
        seen_cluster = self._devices.read(policy)  # the one capacity model of whole and split nodes
        model = seen_cluster[1]
        whole = [node for node in model.pool_nodes(RESERVED) if not node.split]
        borrowers_hold = any(holder.borrows for node in whole for holder, _ in node.side(RESERVED).holders)
        waiting: list[Waiting] = []
        waiting_devices: list[dict[str, Any]] = []  # unschedulable inference pods with claims
        seen: set[str] = set()
        preempted_now: list[str] = []
        for pod in pods:
            metadata = pod.get("metadata") or {}
            uid = str(metadata.get("uid", ""))
            if uid in seen:
                continue
            seen.add(uid)
            if is_borrower(pod, policy) and preempted(pod) and uid not in self._preempted:
                self._preempted.add(uid)
                preempted_now.append(uid)
            if (metadata.get("labels") or {}).get(PLACED_LABEL) not in inference or not unschedulable(pod):
                continue
            if (pod.get("spec") or {}).get("resourceClaims"):
                waiting_devices.append(pod)
            gpus = sum(gpu_request(pod, policy).values())
            if gpus:
                created = parse_time(metadata.get("creationTimestamp"))
                waiting.append(
                    Waiting(str(metadata.get("namespace", "")), str(metadata.get("name", "")), uid, gpus, created)
                )
        demand = reserved_demand(model, waiting)[WHOLE]
        devices = self._device_round(policy, waiting_devices, seen_cluster)
        # Inference pods waiting while borrowers hold reserved GPUs: their creation-to-binding seconds.
        tracked = waiting if borrowers_hold or demand.lent else []
        if devices.lent or devices.evicted or devices.blocked:
            tracked = tracked + [self._waiting(pod) for pod in waiting_devices]
        bound = self._bind_times(pods, policy, tracked)
        closed = closed_nodes(model, policy.spec.lending.headroom_gpus, waiting)
        written, conflicts = self._taint(nodes, taint, closed=closed)
        self._preempted &= seen  # forget the borrowers that are gone
        return Observed(
            demand.lent,
            tuple(sorted(closed)),
            len(waiting),
            tuple(written),
            tuple(conflicts),
            tuple(preempted_now),
            bound,
            devices,
            demand=demand,
        )

    def _device_round(
        self, policy: Policy, waiting: list[dict[str, Any]], seen: tuple[PoolRead, CapacityModel] | None = None
    ) -> DeviceRound:
        """The reserved devices of split nodes: lent, closed, taken back (``service/device_lending.py``). A
        failure there is logged and leaves the node part of the round alone."""
        assert self._devices is not None
        try:
            return self._devices.run(policy, waiting, seen)
        except ApiError as err:
            log.warning("lending: cannot read or write the devices' lending", extra={"error": str(err)})
            return DeviceRound()

    @staticmethod
    def _waiting(pod: Mapping[str, Any]) -> Waiting:
        metadata = pod.get("metadata") or {}
        return Waiting(
            str(metadata.get("namespace", "")),
            str(metadata.get("name", "")),
            str(metadata.get("uid", "")),
            0,
            parse_time(metadata.get("creationTimestamp")),
            devices=True,
        )

    def _bind_times(
        self, pods: Iterable[Mapping[str, Any]], policy: Policy, waiting: list[Waiting]
    ) -> tuple[float, ...]:
        """Remember the inference pods waiting while borrowers hold reserved GPUs; for those seen bound since,
        the seconds from their creation to their binding."""
        for waits in waiting:
            self._waited.setdefault(waits.uid, waits.created)
        times: list[float] = []
        for pod in pods:
            metadata = pod.get("metadata") or {}
            uid = str(metadata.get("uid", ""))
            if uid not in self._waited:
                continue
            at = bound_at(pod)
            if at is None:
                continue
            created = self._waited.pop(uid)
            if created is not None:
                times.append(max(0.0, (at - created).total_seconds()))
        live = {str((p.get("metadata") or {}).get("uid", "")) for p in pods}
        for uid in [u for u in self._waited if u not in live]:
            del self._waited[uid]  # deleted while waiting
        return tuple(times)

    def _taint(
        self, nodes: Iterable[Mapping[str, Any]], taint: Mapping[str, str], *, closed: set[str]
    ) -> tuple[list[str], list[str]]:
        written: list[str] = []
        conflicts: list[str] = []
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name", ""))
            body = taint_patch(node, taint, present=name in closed)
            if body is None:
                continue
            try:
                self.api.patch(api_path("v1", "nodes", name=name), body)
            except Conflict:
                conflicts.append(name)
                continue
            written.append(name)
            log.info(
                "lending: reserved node " + ("closed to" if name in closed else "open to") + " new borrowers",
                extra={"node": name, "taint": f"{taint['key']}={taint['value']}:{taint['effect']}"},
            )
        return written, conflicts
