"""A pure model of ``make bench-lending``'s policy (no control plane), to see how the cost of taking lent GPUs back
grows with the cluster: ``python -m bench.lending_model [--nodes 16,64,256,1000]``.

Same trace as the bench (bench/lending_trace.py: the daily curve, the seeded backlog, checkpoints), same
cluster shape scaled (half the nodes device-plugin nodes of 4 GPUs reserved whole, half DRA nodes split 2 + 2),
same policy, stepped every trace minute:

- **inference** (one 4-GPU replica per whole node, one 2-device replica per split node, replicas from the curve):
  a new replica takes a reserved node (or a split node's reserved pair) nobody borrows if there is one, at
  once; otherwise the scheduler's preemption (whole nodes) or the product's eviction (devices, when lent):
  the node with the fewest borrowed GPUs, its borrowers evicted, the replica bound ``grace`` later. A scale-down
  removes the newest replicas.
- **the keeper**: while a replica waits, every reserved node is closed to new borrowers (the no-borrowers taint).
- **training**: jobs of the backlog in order, at most ``pending`` waiting per route and kind, placed first-fit on
  a random feasible node (kube-scheduler scores cpu and memory, not GPUs: ties are broken at random):
  non-borrowers first (their priority is higher), on shared devices only; borrowers on shared devices first,
  then (lending on) on an open reserved node (``lendFrom: idleNodes``: none beside inference, on split nodes
  either) or, with ``lend_devices`` (what the reclaim of devices adds), on a split node's reserved devices.
  A job runs its hours, checkpoints every ``checkpoint_hours`` and loses the rest when evicted (queued again,
  first).

What it leaves out, by design: scheduling latency (the real control plane binds in about a second), the
PodDisruptionBudgets, the no-borrowers taint's round (1 s), the kubelet. So its bind times are 0 or the grace
period, and its figures are the policy's, not the control plane's.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from bench.lending_trace import (
    DEVICE_PLUGIN,
    DRA,
    BacklogShape,
    DailyCurve,
    Progress,
    RunResult,
    Sample,
    make_backlog,
)

GPUS = 4
RESERVED_SPLIT = 2


@dataclass
class Pod:
    progress: Progress
    node: int  # index into the model's nodes
    reserved: int  # reserved GPUs it holds
    started: float


@dataclass
class Node:
    whole: bool
    free_shared: int
    free_reserved: int
    inference: bool = False
    # the hour an inference replica waiting for this node's borrowers to go binds (None: nobody waits)
    reclaim_until: float | None = None
    # reserved GPUs its evicted borrowers still hold until then (their grace period)
    reclaiming: int = 0
    pods: list[Pod] = field(default_factory=list)


@dataclass(frozen=True)
class ModelSettings:
    nodes: int = 16
    hours: float = 24.0
    step_minutes: float = 1.0
    grace_hours: float = 5 * 240 / 3600  # the bench's 5 s at its time factor 240: 20 trace minutes
    checkpoint_hours: float = 0.5
    seed: int = 1
    pending: int = 4
    lend_devices: bool = False
    mean: float = 0.4


class Model:
    def __init__(self, settings: ModelSettings, lending: bool) -> None:
        self.s, self.lending = settings, lending
        half = settings.nodes // 2
        self.nodes = [Node(True, 0, GPUS) for _ in range(half)] + [
            Node(False, GPUS - RESERVED_SPLIT, RESERVED_SPLIT) for _ in range(settings.nodes - half)
        ]
        self.whole = [i for i, n in enumerate(self.nodes) if n.whole]
        self.split = [i for i, n in enumerate(self.nodes) if not n.whole]
        self.rng = random.Random(settings.seed)
        self.curve = DailyCurve(settings.mean)
        # the bench's backlog, scaled with the cluster (300 jobs per route for 16 nodes)
        shape = BacklogShape(jobs_per_route=max(300, 300 * settings.nodes // 16))
        self.queues: dict[tuple[str, bool], collections.deque[Progress]] = collections.defaultdict(collections.deque)
        for job in make_backlog(settings.seed, shape):
            self.queues[job.route, job.borrower].append(Progress(job, settings.checkpoint_hours))
        self.replicas: dict[bool, list[int]] = {True: [], False: []}  # whole? -> nodes, oldest first
        self.waiting = 0
        self.result = RunResult("lending" if lending else "strict")
        self.evictions_per_reclaim: list[int] = []
        self.waits: list[float] = []
        self.closed_hours = 0.0

    # --- inference ---

    def _bind(self, index: int, now: float) -> None:
        node = self.nodes[index]
        node.inference = True
        node.free_reserved = 0
        self.replicas[node.whole].append(index)

    def _evict(self, index: int, now: float) -> int:
        node = self.nodes[index]
        victims = list(node.pods)
        for pod in victims:
            self.result.lost_gpu_hours += pod.progress.interrupt()
            self.result.interruptions += 1
            self.queues[pod.progress.job.route, pod.progress.job.borrower].appendleft(pod.progress)
            self._free(pod)
        node.pods = []
        return len(victims)

    def _free(self, pod: Pod) -> None:
        node = self.nodes[pod.node]
        node.free_reserved += pod.reserved
        node.free_shared += pod.progress.job.gpus - pod.reserved

    def _holds_borrowed(self, node: Node) -> int:
        return sum(p.reserved for p in node.pods)

    def scale(self, now: float) -> None:
        for whole, group in ((True, self.whole), (False, self.split)):
            wanted = self.curve.replicas(now, len(group))
            placed = self.replicas[whole]
            pending = [i for i in group if self.nodes[i].reclaim_until is not None]
            while len(placed) + len(pending) > wanted and (placed or pending):
                if pending:  # a waiting replica goes first (the ReplicaSet deletes unscheduled pods first)
                    gone = self.nodes[pending.pop()]
                    gone.reclaim_until, gone.reclaiming = None, 0
                    continue
                node = self.nodes[placed.pop()]
                node.inference = False
                node.free_reserved = GPUS if node.whole else RESERVED_SPLIT
            while len(placed) + len(pending) < wanted:
                free = [i for i in group if self._open_for_inference(i)]
                if free:
                    self._bind(self.rng.choice(free), now)
                    self.waits.append(0.0)
                    continue
                candidates = [i for i in group if not self.nodes[i].inference and self.nodes[i].reclaim_until is None]
                if not candidates:
                    break
                victim = min(candidates, key=lambda i: (self._holds_borrowed(self.nodes[i]), -len(self.nodes[i].pods)))
                held = self._holds_borrowed(self.nodes[victim])
                self.evictions_per_reclaim.append(self._evict_for(victim))
                self.nodes[victim].reclaim_until = now + self.s.grace_hours
                self.nodes[victim].reclaiming = held
                pending.append(victim)
            for index in list(pending):
                node = self.nodes[index]
                if node.reclaim_until is not None and now >= node.reclaim_until:
                    node.reclaim_until = None
                    node.reclaiming = 0
                    self._bind(index, now)
                    self.waits.append(self.s.grace_hours)
                    pending.remove(index)
        self.waiting = sum(1 for n in self.nodes if n.reclaim_until is not None)

    def _open_for_inference(self, index: int) -> bool:
        node = self.nodes[index]
        if node.inference or node.reclaim_until is not None:
            return False
        if node.whole:
            return not node.pods
        # a split node: its reserved pair free, and (lendFrom idleNodes) no borrower beside it
        return node.free_reserved == RESERVED_SPLIT and not (
            self.lending and any(p.progress.job.borrower for p in node.pods)
        )

    def _evict_for(self, index: int) -> int:
        """The borrowers in the way of an inference replica on ``index``: on a whole node all of them; on a split
        node those holding its reserved devices, and (idleNodes) every borrower beside it."""
        node = self.nodes[index]
        if node.whole:
            return self._evict(index, 0.0)
        victims = [p for p in node.pods if p.reserved or p.progress.job.borrower]
        for pod in victims:
            node.pods.remove(pod)
            self.result.lost_gpu_hours += pod.progress.interrupt()
            self.result.interruptions += 1
            self.queues[pod.progress.job.route, pod.progress.job.borrower].appendleft(pod.progress)
            self._free(pod)
        return len(victims)

    # --- training ---

    def _feasible(self, job: Any, borrower: bool) -> list[tuple[int, int]]:
        """(node, reserved GPUs it would take) where the job fits."""
        out: list[tuple[int, int]] = []
        closed = self.waiting > 0
        if job.route == DEVICE_PLUGIN:
            if not (self.lending and borrower) or closed:
                return out
            return [
                (i, job.gpus)
                for i in self.whole
                if not self.nodes[i].inference
                and self.nodes[i].reclaim_until is None
                and self.nodes[i].free_reserved >= job.gpus
            ]
        for i in self.split:
            node = self.nodes[i]
            beside_inference = node.inference or node.reclaim_until is not None
            if self.lending and borrower and beside_inference:
                continue  # lendFrom idleNodes: never beside inference
            if node.free_shared >= job.gpus:
                out.append((i, 0))
            elif (
                self.lending
                and borrower
                and self.s.lend_devices
                and not closed
                and not beside_inference
                and node.free_reserved >= job.gpus
            ):
                out.append((i, job.gpus))
        return out

    def place(self, now: float) -> None:
        """The first ``pending`` jobs of each queue wait as pods; any of them that fits is placed (and the queue
        tops the waiting pods up again), non-borrowers first (their priority is higher)."""
        order = [(DRA, False), (DRA, True), (DEVICE_PLUGIN, True), (DEVICE_PLUGIN, False)]
        for key in order:
            queue = self.queues[key]
            placed = True
            while placed:
                placed = False
                for position in range(min(self.s.pending, len(queue))):
                    progress = queue[position]
                    feasible = self._feasible(progress.job, key[1])
                    if not feasible:
                        continue
                    del queue[position]
                    shared = [f for f in feasible if f[1] == 0]  # a borrower prefers shared devices
                    index, reserved = self.rng.choice(shared or feasible)
                    node = self.nodes[index]
                    node.free_reserved -= reserved
                    node.free_shared -= progress.job.gpus - reserved
                    node.pods.append(Pod(progress, index, reserved, now))
                    placed = True
                    break

    def work(self, hours: float) -> None:
        for node in self.nodes:
            for pod in list(node.pods):
                pod.progress.run(hours)
                if pod.progress.finished:
                    node.pods.remove(pod)
                    self._free(pod)
                    self.result.jobs_finished += 1

    def sample(self, now: float, span: float) -> Sample:
        reserved = len(self.whole) * GPUS + len(self.split) * RESERVED_SPLIT
        inference = sum((GPUS if n.whole else RESERVED_SPLIT) for n in self.nodes if n.inference)
        borrowers = sum(p.reserved for n in self.nodes for p in n.pods)
        training = sum(p.progress.job.gpus for n in self.nodes for p in n.pods)
        reclaiming = sum(n.reclaiming for n in self.nodes)
        return Sample(now, span, reserved, inference, borrowers, reclaiming, training, 0)

    def run(self) -> RunResult:
        step = self.s.step_minutes / 60.0
        steps = round(self.s.hours / step)
        for k in range(steps):
            now = k * step
            self.scale(now)
            self.place(now)
            self.result.samples.append(self.sample(now, step))
            if self.waiting:
                self.closed_hours += step
            self.work(step)
        return self.result


def compare(settings: ModelSettings) -> dict[str, Any]:
    strict = Model(settings, lending=False)
    strict.run()
    lent = Model(settings, lending=True)
    lent.run()
    s, lend = strict.result.figures(), lent.result.figures()
    reserved = (settings.nodes // 2) * GPUS + (settings.nodes - settings.nodes // 2) * RESERVED_SPLIT
    reclaims = len(lent.evictions_per_reclaim)
    waited = sum(1 for w in lent.waits if w > 0)
    return {
        "nodes": settings.nodes,
        "reserved_gpus": reserved,
        "idle_reserved_gpu_hours": s["idle_reserved_gpu_hours"],
        "borrowed_gpu_hours": lend["borrowed_gpu_hours"],
        "borrowed_ratio": round(lend["borrowed_gpu_hours"] / s["idle_reserved_gpu_hours"], 3),
        "training_gpu_hours_strict": s["training_gpu_hours"],
        "training_gpu_hours_lending": lend["training_gpu_hours"],
        "jobs_finished_strict": s["jobs_finished"],
        "jobs_finished_lending": lend["jobs_finished"],
        "reclaims": reclaims,
        "borrowers_evicted": lend["interruptions"],
        "evicted_per_reclaim": round(lend["interruptions"] / reclaims, 2) if reclaims else 0.0,
        "inference_replicas_that_waited": f"{waited}/{len(lent.waits)}",
        "lost_gpu_hours": lend["lost_gpu_hours"],
        "lost_per_reserved_gpu": round(lend["lost_gpu_hours"] / reserved, 3),
        "lost_per_borrowed_gpu_hour": round(lend["lost_gpu_hours"] / lend["borrowed_gpu_hours"], 4)
        if lend["borrowed_gpu_hours"]
        else None,
        "closed_to_borrowers_hours": round(lent.closed_hours, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", default="16,64,256,1000")
    parser.add_argument("--grace-minutes", type=float, default=20.0, help="trace minutes (the bench's 5 s at 240x)")
    parser.add_argument("--checkpoint-minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lend-devices", action="store_true", help="borrowers may take split nodes' reserved devices")
    args = parser.parse_args(argv)
    for nodes in (int(n) for n in args.nodes.split(",")):
        settings = ModelSettings(
            nodes=nodes,
            grace_hours=args.grace_minutes / 60.0,
            checkpoint_hours=args.checkpoint_minutes / 60.0,
            seed=args.seed,
            lend_devices=args.lend_devices,
        )
        print(json.dumps(compare(settings)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
