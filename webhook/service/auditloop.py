"""The background audit of ``serve``: ``audit`` every ``--audit-interval-seconds``, as gauges.

One replica audits at a time: the one holding the ``coordination.k8s.io/v1`` Lease
(``webhook.cluster.lease``, elected in a thread of the serving process); the others keep answering
admissions and export ``rocm_isolation_audit_leader 0`` and no audit figures. A replica that loses
the lease drops the labelled audit gauges it exported, so that only the leader's are scraped.

The audit itself runs as a **child process** (``rocm-isolation-webhook audit -o json``, at a lower
CPU priority with ``nice`` when the image has it), not in a thread: decoding a page of 500 pods
holds the GIL for tens of milliseconds, which in a thread would stall the event loop that answers
admission reviews (the latency budget is 5 ms at p99). The child reads the policy file the server
reads, and its JSON report (``findings``, ``capacity``) becomes the gauges. A failed run (the
child exits 2: cluster unreadable, RBAC, invalid policy file) counts
``rocm_isolation_audit_runs_total{result="failure"}``; the last success's timestamp then ages,
which is what an "audit stale" alert watches.

The findings are also written to the cluster as reports (``webhook.service.reportwriter``: PolicyReport /
ClusterPolicyReport and openreports.io Report / ClusterReport, whichever the cluster serves) by the
leader, after each successful run, unless ``serve --no-audit-reports``.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webhook.cluster.inventory import POOLS
from webhook.cluster.lease import LeaderElector
from webhook.ops.audit.command import EXIT_CLEAN, EXIT_FINDINGS
from webhook.ops.audit.findings import RULES
from webhook.ops.audit.reports import finding_from_json
from webhook.service.metrics import Metrics

if TYPE_CHECKING:
    from webhook.service.reportwriter import ReportWriter

log = logging.getLogger("webhook.auditloop")

LEASE_NAME = "rocm-isolation-webhook-audit"


def audit_command(kubeconfig: str | None, policy: str | None, extra: Sequence[str] = ()) -> list[str]:
    """The child process: this interpreter running ``audit -o json`` with the server's settings (``extra``: its
    ``--gpu-metrics`` options)."""
    command = [sys.executable, "-m", "webhook", "audit", "-o", "json"]
    if kubeconfig:
        command += ["--kubeconfig", kubeconfig]
    if policy:
        command += ["--policy", policy]
    command += list(extra)
    nice = shutil.which("nice")
    return [nice, "-n", "10", *command] if nice else command


def publish(document: Mapping[str, Any], metrics: Metrics) -> None:
    """An ``audit -o json`` report as gauges (the per-class gauges replaced: classes come and go; the split
    devices' gauges absent while no device-level reservation is active)."""
    counts = dict.fromkeys(RULES, 0)
    for finding in document.get("findings") or []:
        rule = str(finding.get("rule", ""))
        counts[rule] = counts.get(rule, 0) + 1
    for rule, count in counts.items():
        metrics.audit_findings.labels(rule).set(count)
    for gauge in (
        metrics.pool_gpus_requested,
        metrics.pool_pending_pods,
        metrics.pool_oldest_pending_seconds,
        metrics.pool_split_devices,
        metrics.pool_split_devices_allocated,
    ):
        gauge.clear()
    capacity = document.get("capacity") or {}
    for pool in POOLS:
        figures = capacity.get(pool) or {}
        metrics.pool_nodes.labels(pool).set(figures.get("nodes", 0))
        metrics.pool_gpus_allocatable.labels(pool).set(figures.get("gpusAllocatable", 0))
        for cls, gpus in (figures.get("gpusRequested") or {}).items():
            metrics.pool_gpus_requested.labels(pool, cls).set(gpus)
        for cls, pending in (figures.get("pendingPods") or {}).items():
            metrics.pool_pending_pods.labels(pool, cls).set(pending.get("pods", 0))
            metrics.pool_oldest_pending_seconds.labels(pool, cls).set(pending.get("oldestWaitSeconds", 0))
    metrics.reserved_gpu_activity.clear()
    gpus = document.get("gpuMetrics")
    if gpus is None:
        metrics.audit_gpu_metrics_read.clear()
    else:
        metrics.audit_gpu_metrics_read.set(1 if gpus.get("read") else 0)
        for gpu in gpus.get("reservedGpus") or []:
            metrics.reserved_gpu_activity.labels(
                str(gpu.get("node", "")), str(gpu.get("gpu", "")), "true" if gpu.get("inference") else "false"
            ).set(gpu.get("activityPercent", 0))
    devices = capacity.get("devices")
    if devices:  # a device-level reservation is active
        metrics.pool_split_devices.labels("reserved").set(devices.get("reservedDevices", 0))
        metrics.pool_split_devices.labels("shared").set(devices.get("sharedDevices", 0))
        for side, per_class in (devices.get("devicesAllocated") or {}).items():
            for cls, count in (per_class or {}).items():
                metrics.pool_split_devices_allocated.labels(side, cls).set(count)


def withdraw(metrics: Metrics) -> None:
    """Stop exporting audit figures (this replica no longer audits)."""
    for gauge in (
        metrics.audit_findings,
        metrics.pool_nodes,
        metrics.pool_gpus_allocatable,
        metrics.pool_gpus_requested,
        metrics.pool_pending_pods,
        metrics.pool_oldest_pending_seconds,
        metrics.pool_split_devices,
        metrics.pool_split_devices_allocated,
        metrics.reserved_gpu_activity,
        metrics.audit_gpu_metrics_read,
    ):
        gauge.clear()


class BackgroundAudit:
    def __init__(
        self,
        command: Sequence[str],
        metrics: Metrics,
        *,
        interval: float,
        elector: LeaderElector | None = None,
        timeout: float | None = None,
        poll: float = 1.0,
        clock: Callable[[], float] = time.time,
        reports: ReportWriter | None = None,
        view_dump: Callable[[Path], bool] | None = None,
    ) -> None:
        self.command = list(command)
        # The Lease holder's watched view (the lending keeper's), dumped for the child to audit instead of
        # listing the cluster; False while it is not synced: the child lists, as without a view.
        self.view_dump = view_dump
        self.metrics = metrics
        self.interval = interval
        self.elector = elector
        self.timeout = timeout if timeout is not None else max(interval, 600.0)
        self.poll = poll
        self._clock = clock
        self.reports = reports
        self._next_run = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._child: subprocess.Popen[str] | None = None
        self.runs = 0
        self.last_report: dict[str, Any] | None = None
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
        """Stop auditing (a child still running is terminated); ``release`` gives the lease up at
        once (False: it is left to expire, as after a crash)."""
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.terminate()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.elector is not None:
            self.elector.stop(release=release)
            self.elector.api.close()
        if self.reports is not None:
            self.reports.close()

    def reports_status(self) -> dict[str, Any]:
        """For ``/readyz``: whether and where the findings are written as reports."""
        if self.reports is None:
            return {"apis": [], "detail": "off (serve --no-audit-reports)"}
        if not self.leading:
            return {"apis": [], "detail": "written by the replica holding the audit Lease"}
        return self.reports.status()

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def run_once(self) -> bool:
        with tempfile.TemporaryDirectory(prefix="rocm-isolation-audit-") as scratch:
            dump = Path(scratch) / "view.json"
            command = list(self.command)
            if self.view_dump is not None:
                try:
                    if self.view_dump(dump):
                        command += ["--from-view", str(dump)]
                except OSError as err:  # a full disk: the child lists the cluster itself
                    log.warning("background audit: cannot dump the view", extra={"error": str(err)})
            return self._run_child(command, "--from-view" in command)

    def _run_child(self, command: list[str], from_view: bool) -> bool:
        started = time.perf_counter()
        try:
            child = self._child = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
            )
            try:
                stdout, stderr = child.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
                return self._failed(f"the audit took longer than {self.timeout:.0f} s")
        except OSError as err:
            return self._failed(f"cannot start the audit: {err}")
        finally:
            self._child = None
        if child.returncode not in (EXIT_CLEAN, EXIT_FINDINGS):
            if self._stop.is_set():
                return False
            return self._failed(stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {child.returncode}")
        try:
            document = json.loads(stdout)
        except ValueError as err:
            return self._failed(f"the audit's output is not JSON: {err}")
        if not self.leading:
            return False  # lost the lease while auditing: the new leader publishes
        publish(document, self.metrics)
        self.metrics.audit_runs.labels("success").inc()
        self.metrics.audit_last_success.set(self._clock())
        self.last_report = document
        if self.reports is not None and self.leading:
            findings = [finding_from_json(f) for f in document.get("findings") or [] if isinstance(f, dict)]
            try:
                self.reports.write(findings)
            except Exception:  # reports never fail the audit (or stop the loop)
                log.exception("audit reports: unexpected error")
        log.info(
            "background audit",
            extra={
                "findings": len(document.get("findings") or []),
                "seconds": round(time.perf_counter() - started, 2),
                "read": "the watched view" if from_view else "the apiserver",
            },
        )
        return True

    def _failed(self, why: str) -> bool:
        self.metrics.audit_runs.labels("failure").inc()
        log.warning("background audit failed", extra={"error": why})
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self._clock()
            if self.leading and now >= self._next_run:
                self._next_run = now + self.interval
                self.run_once()
                self.runs += 1
            self._stop.wait(self.poll)
