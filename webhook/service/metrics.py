"""Prometheus metrics of the webhook (``GET /metrics``).

Each ``Metrics`` has its own registry, so several apps can live in one process (tests). With
``--workers N`` uvicorn runs N processes: ``serve`` then sets ``PROMETHEUS_MULTIPROC_DIR`` before
the workers start, and ``/metrics`` aggregates the files every worker writes (prometheus-client's
multiprocess mode), so a scrape of any worker sees the whole pod. With one worker (the default)
nothing sets it and the values are plain floats in memory: the mmapped files of multiprocess mode
cost about twice as much per update (docs/benchmarks.md, "Metrics").
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from webhook.ops.gpus.judge import ACTIVITY_GAUGE
from webhook.ops.lending.demand import GAUGES, POOL, SPLIT, WHOLE

if TYPE_CHECKING:
    from webhook.ops.lending.demand import Demand
    from webhook.service.lending_loop import Observed

PREFIX = "rocm_isolation"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Server-side latency: the apiserver's own histogram starts at 5 ms, ours has finer buckets below it
# (a small review takes ~0.1 ms in the server).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[object, ...], Counter] = {}
        r = self.registry
        self.reviews = Counter(
            f"{PREFIX}_admission_reviews",
            "Admission reviews answered, by operation, workload class, decision and mode.",
            ["operation", "workload_class", "decision", "mode"],
            registry=r,
        )
        self.latency = Histogram(
            f"{PREFIX}_admission_review_duration_seconds",
            "Time to answer one admission review, from the first body byte read to the reply encoded.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.patch_operations = Counter(
            f"{PREFIX}_patch_operations", "JSON Patch operations sent back to the apiserver.", registry=r
        )
        self.denials = Counter(f"{PREFIX}_denials", "Pods denied, by rule.", ["rule"], registry=r)
        self.violations = Counter(
            f"{PREFIX}_violations",
            "Policy violations found, by rule and mode (in warn and audit modes they do not deny).",
            ["rule", "mode"],
            registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_errors",
            "Requests that could not be answered normally, by kind "
            "(body_too_large, unsupported_media_type, malformed, disconnected, internal).",
            ["kind"],
            registry=r,
        )
        # Exported at 0 from the start: increase() in the alert rules needs a sample before the first error.
        self.errors.labels("internal")
        self.policy_reloads = Counter(f"{PREFIX}_policy_reloads", "Policy files loaded after a change.", registry=r)
        self.policy_reload_failures = Counter(
            f"{PREFIX}_policy_reload_failures",
            "Changed policy files that were invalid (the last good policy stays in force).",
            registry=r,
        )
        self.policy_last_reload_ok = Gauge(
            f"{PREFIX}_policy_last_reload_success",
            "1 when the policy file on disk is the policy in force, 0 when its last change was rejected.",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.certificate_expiry = Gauge(
            f"{PREFIX}_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as a Unix time.",
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.certificate_reloads = Counter(
            f"{PREFIX}_certificate_reloads", "Serving certificates loaded after a change on disk.", registry=r
        )
        self.certificate_reload_failures = Counter(
            f"{PREFIX}_certificate_reload_failures",
            "Changed certificate files that could not be used (the last good pair stays in use).",
            registry=r,
        )
        self.cluster_synced = Gauge(
            f"{PREFIX}_cluster_cache_synced",
            "1 when the namespace/node cache has listed the resource, by resource.",
            ["resource"],
            registry=r,
            multiprocess_mode="livemin",
        )
        self.cluster_watch_restarts = Counter(
            f"{PREFIX}_cluster_watch_restarts",
            "Cluster watch restarts, by resource and reason (closed, expired, error).",
            ["resource", "reason"],
            registry=r,
        )

        # The background audit (webhook/service/auditloop.py): set by the replica holding the audit Lease only.
        # The names are fixed: the monitoring pack's alerts and dashboard read them.
        self.audit_findings = Gauge(
            f"{PREFIX}_audit_findings",
            "Findings of the last background audit, by rule (docs/operations.md).",
            ["rule"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.reserved_names_syncs = Counter(
            f"{PREFIX}_reserved_names_syncs",
            "Rounds of the Lease holder keeping the reserved-node-names ConfigMap in step with the labelled "
            "nodes that wrote or failed, by result (updated, conflict, missing, failed).",
            ["result"],
            registry=r,
        )
        self.audit_runs = Counter(
            f"{PREFIX}_audit_runs", "Background audits run, by result (success, failure).", ["result"], registry=r
        )
        self.audit_last_success = Gauge(
            f"{PREFIX}_audit_last_success_timestamp_seconds",
            "When the last background audit succeeded, as a Unix time.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.audit_leader = Gauge(
            f"{PREFIX}_audit_leader",
            "1 on the replica holding the audit Lease (it runs the background audit), else 0.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.pool_nodes = Gauge(
            f"{PREFIX}_pool_nodes",
            "Nodes per pool (reserved, shared) at the last audit; a node split by device-level reservation counts "
            "in both.",
            ["pool"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.pool_gpus_allocatable = Gauge(
            f"{PREFIX}_pool_gpus_allocatable",
            "Allocatable GPUs (amd.com/gpu and partitions, or the GPU slots of DRA ResourceSlices) per pool at the last "
            "audit; a split node's GPUs (one per PCI bus ID) count in the pool of their side.",
            ["pool"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.pool_gpus_requested = Gauge(
            f"{PREFIX}_pool_gpus_requested",
            "GPUs requested by pods bound to the pool's nodes, by workload class, at the last audit; on a split "
            "node, the GPUs allocated to claims count in the pool of their side.",
            ["pool", "class"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.pool_pending_pods = Gauge(
            f"{PREFIX}_pool_pending_pods",
            "Unscheduled GPU pods by the pool their class is placed on (reserved for placement reserved, "
            "else shared) and class, at the last audit.",
            ["pool", "class"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.pool_oldest_pending_seconds = Gauge(
            f"{PREFIX}_pool_oldest_pending_seconds",
            "How long the oldest unscheduled GPU pod of the pool and class had waited, at the last audit.",
            ["pool", "class"],
            registry=r,
            multiprocess_mode="livemax",
        )
        # Device-level reservation (pool apply --devices-per-node N): the split nodes' GPUs, absent while none
        # is active. pool is the side of the split: reserved (inference) or shared. They are part of the pool
        # gauges above: pool_gpus_allocatable{pool} = the whole nodes' GPUs + pool_split_devices{pool}.
        self.pool_split_devices = Gauge(
            f"{PREFIX}_pool_split_devices",
            "GPUs of the split nodes of the active device-level reservation, reserved or shared, at the last audit.",
            ["pool"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.pool_split_devices_allocated = Gauge(
            f"{PREFIX}_pool_split_devices_allocated",
            "GPUs of the split nodes allocated to the claims of pods, by side (reserved, shared) and the class of "
            "the pods holding them, at the last audit.",
            ["pool", "class"],
            registry=r,
            multiprocess_mode="livemax",
        )

        # The GPUs' own word (audit --gpu-metrics, serve --audit-gpu-metrics; issue 48): absent without it.
        self.audit_gpu_metrics_read = Gauge(
            f"{PREFIX}_audit_gpu_metrics_read",
            "1 when the last background audit read AMD's device metrics exporter's series, 0 when it could not.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.reserved_gpu_activity = Gauge(
            ACTIVITY_GAUGE,
            "Mean gfx activity of each reserved GPU over the policy's window (spec.gpuMetrics.windowSeconds) as "
            "the exporter reports it, at the last audit; inference: whether inference pods held it.",
            ["node", "gpu", "inference"],
            registry=r,
            multiprocess_mode="livemax",
        )
        # Lending (policy spec.lending), kept by the replica holding the audit Lease (service/lending_loop.py).
        self.lending_gpus_lent = Gauge(
            f"{PREFIX}_lending_gpus_lent",
            "Reserved GPUs that borrowers hold now, per pool (reserved: nodes reserved whole; reserved-devices: the "
            "reserved devices of split nodes).",
            ["pool"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.lending_closed_nodes = Gauge(
            f"{PREFIX}_lending_closed_nodes",
            "Reserved nodes closed to new borrowers (the no-borrowers taint: headroom, or inference waiting).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.lending_inference_waiting = Gauge(
            f"{PREFIX}_lending_inference_waiting",
            "Inference pods the scheduler could not place (PodScheduled=False, Unschedulable), seen by lending.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.lending_borrowers_taken_back = Counter(
            f"{PREFIX}_lending_borrowers_taken_back",
            "Borrowers whose reserved GPUs inference took back, by how (preempted: the scheduler's preemption; "
            "evicted: the keeper's eviction of borrowers holding reserved devices; blocked: an eviction a "
            "PodDisruptionBudget refused, another victim chosen).",
            ["how"],
            registry=r,
        )
        self.lending_inference_bind_seconds = Histogram(
            f"{PREFIX}_lending_inference_bind_seconds",
            "Seconds from an inference pod's creation to its binding, for inference pods that waited while "
            "borrowers held reserved GPUs.",
            buckets=(1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600),
            registry=r,
        )
        self.lending_devices_open = Gauge(
            f"{PREFIX}_lending_devices_open",
            "1 while the lendable DeviceClass lends the reserved devices of split nodes to new borrowers, else 0.",
            registry=r,
            multiprocess_mode="livemax",
        )
        # A round's duration and whether its view of the cluster was synced (issue 41: a round reads memory,
        # never the apiserver; one that outlasts --lending-seconds delays every reclaim).
        self.lending_round_seconds = Histogram(
            f"{PREFIX}_lending_round_seconds",
            "Seconds one round of the lending keeper took (the Lease holder; reads its watched view of the cluster).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.lending_view_synced = Gauge(
            f"{PREFIX}_lending_view_synced",
            "1 while the Lease holder's watched view of the cluster is synced (lending decides), 0 while it syncs "
            "(no eviction, no opening of the lendable class), absent on other replicas.",
            registry=r,
            multiprocess_mode="livemax",
        )

        # Inference's demand on the reservation, per kind of node (issue 43: ``pool recommend`` sizes the
        # reservation from their history). Set by the lending keeper (the Lease holder; 0 on other replicas: read
        # them with max by (pool, nodes)); nodes is whole (reserved whole) or split (the split nodes' reserved
        # devices). pool is the reserved pool (one today: the policy's reserved label). The names: ops/demand.GAUGES.
        def demand(figure: str, text: str) -> Gauge:
            return Gauge(GAUGES[figure], text, ["pool", "nodes"], registry=r, multiprocess_mode="livemax")

        self.reserved_nodes = demand(
            "nodes",
            "Nodes of the reserved pool, by kind (whole: reserved whole; split: a device-level reservation splits "
            "them), seen by the lending keeper.",
        )
        self.reserved_nodes_gpus = demand(
            "node_gpus",
            "Every GPU of those nodes (a split node's reserved and shared ones): what a larger reservation can take.",
        )
        self.reserved_gpus = demand(
            "reserved", "Reserved GPUs (the reserved side of those nodes): the reservation's size."
        )
        self.reserved_gpus_inference = demand("inference", "Reserved GPUs that inference pods hold.")
        self.reserved_gpus_inference_waiting = demand(
            "waiting",
            "GPUs that inference pods asked for and did not get (Unschedulable; on split nodes, the devices of "
            "their claims not allocated): held + waiting is the demand the reservation must cover.",
        )
        self.reserved_gpus_lent = demand("lent", "Reserved GPUs that borrowers hold.")
        self.reserved_gpus_idle = demand("idle", "Reserved GPUs that nobody holds.")
        self.lending_view_bytes = Counter(
            f"{PREFIX}_lending_view_bytes",
            "Bytes the Lease holder's watched view of the cluster received from the apiserver, by resource and how "
            "(list: a page of a full list; watch: an event), as read off the wire (JSON).",
            ["resource", "how"],
            registry=r,
        )
        self.lending_taint_writes = Counter(
            f"{PREFIX}_lending_taint_writes",
            "Writes of the no-borrowers taint on reserved nodes, by result (written, conflict).",
            ["result"],
            registry=r,
        )

    def labelled(self, metric: Counter, *values: str) -> Counter:
        """``metric.labels(*values)``, remembered: ``labels()`` validates and locks on every call, and
        the label values of the per-review counters come from small fixed sets (the policy's classes
        and rules, the decisions, the modes)."""
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def lending_round(self, observed: Observed) -> None:
        """What a round of lending saw and did, as metrics."""
        if observed.seconds is not None:
            self.lending_round_seconds.observe(observed.seconds)
        self.lending_view_synced.set(1 if observed.synced else 0)
        self.lending_gpus_lent.labels("reserved").set(observed.lent)
        self.lending_closed_nodes.set(len(observed.closed))
        self.lending_inference_waiting.set(observed.waiting + observed.devices.waiting)
        self.lending_gpus_lent.labels("reserved-devices").set(observed.devices.lent)
        self.lending_devices_open.set(1 if observed.devices.open else 0)
        if observed.devices.evicted:
            self.lending_borrowers_taken_back.labels("evicted").inc(len(observed.devices.evicted))
        if observed.devices.blocked:
            self.lending_borrowers_taken_back.labels("blocked").inc(len(observed.devices.blocked))
        if observed.preempted:
            self.lending_borrowers_taken_back.labels("preempted").inc(len(observed.preempted))
        for kind, demand in ((WHOLE, observed.demand), (SPLIT, observed.devices.demand)):
            self.reserved_demand(kind, demand)
        for seconds in observed.bound:
            self.lending_inference_bind_seconds.observe(seconds)
        if observed.written:
            self.lending_taint_writes.labels("written").inc(len(observed.written))
        if observed.conflicts:
            self.lending_taint_writes.labels("conflict").inc(len(observed.conflicts))

    def reserved_demand(self, kind: str, demand: Demand) -> None:
        """One kind of node's demand figures (``ops/lending/demand.py``), under the reserved pool."""
        for gauge, value in (
            (self.reserved_nodes, demand.nodes),
            (self.reserved_nodes_gpus, demand.node_gpus),
            (self.reserved_gpus, demand.reserved),
            (self.reserved_gpus_inference, demand.inference),
            (self.reserved_gpus_inference_waiting, demand.waiting),
            (self.reserved_gpus_lent, demand.lent),
            (self.reserved_gpus_idle, demand.idle),
        ):
            gauge.labels(POOL, kind).set(value)

    def render(self) -> bytes:
        if multiprocess_dir():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)
