"""The background audit of ``serve``: ``audit`` every ``--audit-interval-seconds``, as gauges.

One replica audits at a time: the one holding the ``coordination.k8s.io/v1`` Lease
(``webhook.lease``); the others keep answering admissions and export
``rocm_isolation_audit_leader 0`` and no audit figures. A replica that loses the lease drops
the labelled audit gauges it exported, so that only the leader's figures are scraped.

The audit runs in its own thread with its own API client (a list of 100,000s of pods must not
hold up the namespace/node watch), and a failed run only counts
``rocm_isolation_audit_runs_total{result="failure"}``: the last success's timestamp then ages,
which is what the "audit stale" alert watches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from webhook.audit import Report, run_audit
from webhook.inventory import POOLS
from webhook.kubeapi import ApiError, KubeApi
from webhook.lease import LeaderElector
from webhook.metrics import Metrics
from webhook.policy import Policy

log = logging.getLogger("webhook.auditloop")

LEASE_NAME = "rocm-isolation-webhook-audit"


def publish(report: Report, metrics: Metrics) -> None:
    """The report as gauges (the pool gauges replaced: classes come and go)."""
    for rule, count in report.counts().items():
        metrics.audit_findings.labels(rule).set(count)
    for gauge in (metrics.pool_gpus_requested, metrics.pool_pending_pods, metrics.pool_oldest_pending_seconds):
        gauge.clear()
    for pool in POOLS:
        capacity = report.capacity[pool]
        metrics.pool_nodes.labels(pool).set(capacity.nodes)
        metrics.pool_gpus_allocatable.labels(pool).set(capacity.gpus_allocatable)
        for cls, gpus in capacity.gpus_requested.items():
            metrics.pool_gpus_requested.labels(pool, cls).set(gpus)
        for cls, pending in capacity.pending.items():
            metrics.pool_pending_pods.labels(pool, cls).set(pending.pods)
            metrics.pool_oldest_pending_seconds.labels(pool, cls).set(pending.wait_seconds(report.now))


def withdraw(metrics: Metrics) -> None:
    """Stop exporting audit figures (this replica no longer audits)."""
    for gauge in (
        metrics.audit_findings,
        metrics.pool_nodes,
        metrics.pool_gpus_allocatable,
        metrics.pool_gpus_requested,
        metrics.pool_pending_pods,
        metrics.pool_oldest_pending_seconds,
    ):
        gauge.clear()


class BackgroundAudit:
    def __init__(
        self,
        api: KubeApi,
        policy: Callable[[], Policy],
        metrics: Metrics,
        *,
        interval: float,
        elector: LeaderElector | None = None,
        poll: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.policy = policy
        self.metrics = metrics
        self.interval = interval
        self.elector = elector
        self.poll = poll
        self._clock = clock
        self._next_run = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.runs = 0
        self.last_report: Report | None = None
        metrics.audit_leader.set(0 if elector is not None else 1)

    def _leadership(self, leader: bool) -> None:
        self.metrics.audit_leader.set(1 if leader else 0)
        if leader:
            self._next_run = 0.0  # a new leader audits at once
        else:
            withdraw(self.metrics)

    def start(self) -> None:
        if self.elector is not None:
            self.elector.on_change = self._leadership
            self.elector.start()
        self._thread = threading.Thread(target=self._run, name="background-audit", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0, *, release: bool = True) -> None:
        """Stop auditing; ``release`` gives the lease up at once (False: it expires, as on a crash)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.elector is not None:
            self.elector.stop(release=release)
        self.api.close()

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def run_once(self) -> bool:
        started = time.perf_counter()
        try:
            report = run_audit(self.api, self.policy())
        except ApiError as err:
            self.metrics.audit_runs.labels("failure").inc()
            log.warning("background audit failed", extra={"error": str(err)})
            return False
        except Exception:  # never let the thread die: count it and try again next interval
            self.metrics.audit_runs.labels("failure").inc()
            log.exception("background audit failed")
            return False
        if not self.leading:
            return False  # lost the lease while auditing: the new leader publishes
        publish(report, self.metrics)
        self.metrics.audit_runs.labels("success").inc()
        self.metrics.audit_last_success.set(self._clock())
        self.last_report = report
        log.info(
            "background audit",
            extra={
                "findings": len(report.findings),
                "pods_checked": report.pods_checked,
                "seconds": round(time.perf_counter() - started, 2),
            },
        )
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self._clock()
            if self.leading and now >= self._next_run:
                self._next_run = now + self.interval
                self.run_once()
                self.runs += 1
            self._stop.wait(self.poll)
