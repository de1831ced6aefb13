"""Lending the reserved devices of split nodes, and taking them back: a part of the lending keeper's round.

Inside a split node (devices reserved through DRA) the scheduler cannot preempt (no DRA preemption up to
1.37: lending-facts.md §2), so the keeper of ``serve`` (the replica holding the audit Lease) does it:

1. it reads the reservation (the reserved DeviceClass ``pool`` writes), then, only while one is active and
   lending is on, the cluster as ``pool`` reads it (nodes, pods, ResourceSlices, ResourceClaims) into the
   capacity model (``ops/capacity.py``): which borrowers hold which reserved devices;
2. for every inference pod the scheduler left ``Unschedulable`` whose claims are not allocated, it plans the
   evictions that make room (``ops/lending.plan_reclaims``: the oldest pod first, the node needing the fewest
   victims, the youngest victims; borrowers already terminating count as gone, so a new Lease holder picks a
   reclaim in flight up without evicting twice) and evicts them through the Eviction API: their grace period
   (capped at ``lending.reclaimGraceSeconds`` by admission) and PodDisruptionBudgets are honoured. A victim
   whose budget refuses (429) is spared for ``SPARED_SECONDS`` and the plan is made again without it, once in
   the same round; the refusal is logged and counted (``rocm_isolation_lending_evictions_total{result=
   "blocked"}``). Once a victim is gone the resourceclaim controller deallocates its claim and the scheduler
   binds the inference pod (0.6 s on v1.36.2, lending-facts.md §5);
3. it opens or closes the lendable class (``deploy/device_classes.lendable_class``): closed while an
   inference pod waits for devices (what is freed goes to inference, not to the next borrower) and while the
   free reserved devices are ``headroomGPUs`` or fewer; open otherwise. The class can only select by PCI slot,
   the same on every node (CEL cannot see the node), so the headroom is kept over all split nodes, and a round
   (``--lending-seconds``) may lend a little past it: the scheduler allocates between two rounds.

Evictions are made only by the Lease holder and re-checked against ``leading()`` before each one. With
lending off, or no active reservation, or one held by DeviceTaintRules, the class is kept closed (it is
created only while a reservation is active and lending is on; never deleted: a pending borrower's claim
naming a class that is gone could not be allocated at all).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.inventory import claim_names, parse_time
from webhook.cluster.kubeapi import Conflict, KubeApi, NotFound, api_path
from webhook.core import claims as dra
from webhook.core.lending import settings
from webhook.core.policy import Policy
from webhook.deploy import device_classes
from webhook.ops.capacity import RESERVED, CapacityModel
from webhook.ops.lending.decisions import Reclaim, Waiting, node_admits, plan_reclaims
from webhook.ops.lending.demand import SPLIT, Demand, reserved_demand
from webhook.ops.pool.read import PodMemo, PoolRead, capacity_model, read_cluster, read_dra, reservation_now
from webhook.ops.pool.write import evictor
from webhook.ops.reservation import Reservation

log = logging.getLogger("webhook.lending")

# How long a victim whose PodDisruptionBudget refused its eviction is left out of the plans.
SPARED_SECONDS = 30.0
DEVICE_CLASSES = api_path(f"{dra.GROUP}/v1", "deviceclasses")


@dataclass(frozen=True)
class DeviceRound:
    """What one round did with devices."""

    open: bool = False  # the lendable class selects the reserved devices after this round
    waiting: int = 0  # inference pods waiting for devices
    lent: int = 0  # reserved devices (GPUs) borrowers hold
    evicted: tuple[str, ...] = ()  # namespace/name of the borrowers evicted this round
    blocked: tuple[str, ...] = ()  # namespace/name of those whose PodDisruptionBudget refused
    demand: Demand = field(default_factory=Demand)  # the split nodes' reserved devices (ops/lending/demand.py)


def requested_devices(claim: Mapping[str, Any]) -> int:
    """How many devices a ResourceClaim asks for: each request's ``count`` (1 when absent; 1 for
    ``allocationMode: All``, whose number only the allocator knows), a ``firstAvailable`` request by its first
    subrequest."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    total = 0
    for request in devices.get("requests") or []:
        if not isinstance(request, Mapping):
            continue
        body = request.get("exactly")
        if not isinstance(body, Mapping):
            subrequests = request.get("firstAvailable") or []
            body = subrequests[0] if subrequests and isinstance(subrequests[0], Mapping) else {}
        count = body.get("count")
        total += count if isinstance(count, int) and count > 0 and body.get("allocationMode") != "All" else 1
    return total


def waiting_for_devices(
    pods: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    driver_classes: set[str],
    nodes: Mapping[str, Mapping[str, str]] | None = None,
) -> list[Waiting]:
    """The pods (unschedulable inference pods, as the keeper found them) waiting for devices: with claims of
    ours (``driver_classes``: the classes that hand out reserved devices) not allocated yet, how many, and
    (given the ``nodes``' labels) which of the nodes their selector and required affinity admit."""
    by_name = {
        (str((c.get("metadata") or {}).get("namespace")), str((c.get("metadata") or {}).get("name"))): c for c in claims
    }
    found: list[Waiting] = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        namespace = str(metadata.get("namespace", ""))
        needed = 0
        for name in claim_names(pod, extended=False):
            claim = by_name.get((namespace, name))
            if claim is None or dra.allocated_results(claim):
                continue
            if not _claim_classes(claim) & driver_classes:
                continue
            needed += requested_devices(claim)
        if needed:
            found.append(
                Waiting(
                    namespace,
                    str(metadata.get("name", "")),
                    str(metadata.get("uid", "")),
                    needed,
                    parse_time(metadata.get("creationTimestamp")),
                    devices=True,
                    nodes=None
                    if nodes is None
                    else frozenset(name for name, labels in nodes.items() if node_admits(pod, name, labels)),
                )
            )
    return found


def _evicted(answer: tuple[int, Mapping[str, Any]], ref: tuple[str, str], plan: Reclaim) -> str:
    """What an eviction's answer means for the reclaim: evicted, gone (404), blocked (429: a
    PodDisruptionBudget, or API throttling: another victim is chosen) or failed."""
    status, body = answer
    where = {"pod": "/".join(ref), "for": f"{plan.pod.namespace}/{plan.pod.name}", "node": plan.node}
    if status == 404:
        return "gone"
    if status == 429:
        log.warning("lending: a PodDisruptionBudget refused the eviction of a borrower; another is chosen",
                    extra={**where, "error": body.get("message", "")})  # fmt: skip
        return "blocked"
    if status >= 300:
        log.warning("lending: cannot evict a borrower", extra={**where, "error": body.get("message", "")})
        return "failed"
    log.info("lending: borrower evicted to give reserved devices back to inference", extra=where)
    return "evicted"


def _claim_classes(claim: Mapping[str, Any]) -> frozenset[str]:
    try:
        return dra.device_classes(claim, dra.CLAIM_KIND)
    except dra.MalformedClaim:
        return frozenset()


@dataclass
class DeviceLending:
    """The device part of the lending keeper's round, with what it remembers: the spared victims."""

    api: KubeApi
    leading: Callable[[], bool]
    clock: Callable[[], float] = time.monotonic
    _spared: dict[tuple[str, str], float] = field(default_factory=dict)  # victim -> spared until
    # Victims this keeper evicted, counted as leaving until the view shows them terminating (a watch event
    # a few milliseconds behind the eviction): never evicted twice, never a second victim for one slot.
    _evicted: dict[tuple[str, str], float] = field(default_factory=dict)  # victim -> counted until
    _memo: PodMemo = field(default_factory=PodMemo)  # each unchanged pod of the view read and classed once

    def read(self, policy: Policy) -> tuple[PoolRead, CapacityModel]:
        """The cluster as ``pool`` reads it, and its one capacity model (whole and split nodes): what the whole
        round decides on. From the keeper's view, memory (each unchanged pod decided once: ``PodMemo``)."""
        read = PoolRead(
            read_cluster(self.api, policy, self._memo), read_dra(self.api, policy, claims=True, required=False)
        )
        return read, capacity_model(policy, read, Reservation.from_policy(policy))

    def run(
        self,
        policy: Policy,
        unschedulable_inference: Sequence[Mapping[str, Any]],
        seen: tuple[PoolRead, CapacityModel] | None = None,
    ) -> DeviceRound:
        """The device part of a round, on what the round read (``seen``; read here when not given)."""
        devices = policy.spec.reserved_devices
        classes = {name: self._class(name) for name in (devices.reserved_class_name, devices.lendable_class_name)}
        lendable = classes[devices.lendable_class_name]
        if not self._lends(policy, classes[devices.reserved_class_name]) and (lendable is None or _closed(lendable)):
            return DeviceRound()  # the usual case without device lending: nothing written
        read, model = seen or self.read(policy)
        reservation = reservation_now(policy, read.dra)
        active = settings(policy).enabled and reservation is not None and reservation.active
        if reservation is None or not active or reservation.by_taints:
            self._write_class(policy, reservation, read, open_=False)
            return DeviceRound()
        waiting = waiting_for_devices(
            unschedulable_inference,
            read.devices.claims,
            {devices.reserved_class_name, devices.lendable_class_name},
            {node.name: node.labels for node in read.cluster.nodes},
        )
        evicted: list[str] = []
        blocked: list[str] = []
        if waiting:
            self._reclaim(policy, model, read, waiting, evicted, blocked)
        free = sum(node.side(RESERVED).free for node in model.pool_nodes(RESERVED) if node.split)
        open_ = not waiting and free > policy.spec.lending.headroom_gpus
        self._write_class(policy, reservation, read, open_=open_)
        demand = reserved_demand(model, waiting)[SPLIT]
        return DeviceRound(open_, len(waiting), demand.lent, tuple(evicted), tuple(blocked), demand)

    def _class(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get(api_path(f"{dra.GROUP}/v1", "deviceclasses", name=name))
        except NotFound:
            return None

    @staticmethod
    def _lends(policy: Policy, reserved: Mapping[str, Any] | None) -> bool:
        """Lending on and the reserved class says a reservation by classes is active."""
        if not settings(policy).enabled or reserved is None:
            return False
        info = dra.device_class_info(reserved)
        return info.reservation_active and not info.reserved_by_taints

    # -- taking devices back --------------------------------------------------------------------------

    def _reclaim(
        self,
        policy: Policy,
        model: CapacityModel,
        read: PoolRead,
        waiting: list[Waiting],
        evicted: list[str],
        blocked: list[str],
    ) -> None:
        now = self.clock()
        self._spared = {ref: until for ref, until in self._spared.items() if until > now}
        self._evicted = {ref: until for ref, until in self._evicted.items() if until > now}
        leaving = {ref for ref, usage in read.cluster.usage.items() if usage.terminating}
        leaving |= {ref for ref in self._evicted if ref in read.cluster.usage}
        pods = {(pod.namespace, pod.name): pod for pod in read.cluster.pods}
        evict = evictor(self.api, dry_run=False)  # pool's transport: the Eviction API, answers as HTTP statuses
        for _attempt in range(2):  # once more without the victims a budget protected
            refused = False
            plans = plan_reclaims(model, waiting, leaving, self._spared)
            for plan in plans:
                for victim in plan.victims:
                    if victim.ref in leaving:
                        continue
                    if not self.leading():
                        return  # the Lease moved: the new holder plans from what it reads
                    outcome = _evicted(evict(pods[victim.ref]), victim.ref, plan)
                    if outcome == "blocked":
                        self._spared[victim.ref] = now + SPARED_SECONDS
                        blocked.append("/".join(victim.ref))
                        refused = True
                    else:
                        leaving.add(victim.ref)
                        self._evicted[victim.ref] = now + SPARED_SECONDS
                        if outcome == "evicted":
                            evicted.append("/".join(victim.ref))
            if not refused:
                return

    # -- the lendable class ---------------------------------------------------------------------------

    def _write_class(
        self,
        policy: Policy,
        reservation: device_classes.DeviceReservation | None,
        read: PoolRead,
        *,
        open_: bool,
    ) -> None:
        """Create or update the lendable class as ``open_`` says (nothing when it already is so). Created
        only while lending is on and a reservation is active; one of that name not ours is left alone."""
        name = policy.spec.reserved_devices.lendable_class_name
        current = read.devices.classes.get(name)
        if current is not None and not current.ours:
            log.warning("lending: a DeviceClass of the lendable class's name is not ours; devices are not lent",
                        extra={"deviceclass": name})  # fmt: skip
            return
        if reservation is None:
            if current is None:
                return
            reservation = device_classes.DeviceReservation(0, ())
        if current is None and not (settings(policy).enabled and reservation.active):
            return
        wanted = device_classes.lendable_class(policy, reservation, open_=open_)
        if current is not None and _same(current.raw, wanted):
            return
        try:
            if current is None:
                self.api.create(DEVICE_CLASSES, wanted)
            else:
                version = (current.raw.get("metadata") or {}).get("resourceVersion")
                body = {"metadata": {**wanted["metadata"], "resourceVersion": version}, "spec": wanted["spec"]}
                self.api.patch(api_path(f"{dra.GROUP}/v1", "deviceclasses", name=name), body)
        except Conflict:
            return  # changed meanwhile: next round
        state = "not lent" if _closed(wanted) else "lent"
        log.info(f"lending: reserved devices {state} to new borrowers", extra={"deviceclass": name})


def _closed(device_class: Mapping[str, Any]) -> bool:
    annotations = (device_class.get("metadata") or {}).get("annotations") or {}
    return annotations.get(device_classes.LENDING_ANNOTATION) == device_classes.LENDING_CLOSED


def _same(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    metadata = current.get("metadata") or {}
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    return (
        (current.get("spec") or {}).get("selectors") == wanted["spec"]["selectors"]
        and all(labels.get(k) == v for k, v in wanted["metadata"]["labels"].items())
        and all(annotations.get(k) == v for k, v in wanted["metadata"]["annotations"].items())
    )
