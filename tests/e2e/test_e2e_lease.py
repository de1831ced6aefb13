"""Scenario 7: the background audit of ``serve`` with two replicas and a real coordination.k8s.io
Lease (the webhook's ServiceAccount RBAC, its namespace). One replica audits, exports the audit gauges and
keeps the backstop's reserved node names in step with the labelled nodes; killed without a chance to give
the lease up, the other takes both over once the lease expires. At no moment do both write: a sampler
reads each replica's ``rocm_isolation_audit_leader``, its audits and names writes, and the Lease's
``holderIdentity`` all along.

The bounds come from the code: the Lease's duration and the candidates' retry period are
``LeaderElector``'s defaults (webhook/cluster/lease.py, the ones ``serve`` uses); the audit and names-sync
intervals are the replicas' flags. A candidate counts the lease's duration from when it *saw* the
holder's last renewal (its own clock, client-go's algorithm), up to one retry period after it was
written, and tries every retry period: the other replica holds the Lease at most duration + 2 retry
periods after the kill, then audits within one audit interval and syncs the names within one names-sync
interval."""

from __future__ import annotations

import http.client
import inspect
import signal
import threading
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from webhook.cluster.lease import LeaderElector
from webhook.deploy import reserved_names
from webhook.service.auditloop import LEASE_NAME, BackgroundAudit

from .harness import WEBHOOK_NAMESPACE, Cluster, Webhook, metric_value
from .kube import Obj, wait_until

LEASE = LEASE_NAME
POOL = "rocm-isolation.io/pool"
AUDIT_INTERVAL = 4.0  # longer than one audit run (a child process) on a busy 2-core machine
NAMES_SYNC_INTERVAL = 1.0
SLACK = 1.0  # the election rounds' own time, a busy machine

_ELECTOR = inspect.signature(LeaderElector).parameters
LEASE_DURATION = float(_ELECTOR["lease_duration"].default)
RETRY_PERIOD = float(_ELECTOR["retry_period"].default)
AUDIT_POLL = float(inspect.signature(BackgroundAudit).parameters["poll"].default)


def _identity(webhook: Webhook) -> str:
    return f"_{webhook.component.process.pid}"


def _lease(cluster: Cluster) -> Obj | None:
    return cluster.kube.get_or_none("Lease", LEASE, WEBHOOK_NAMESPACE)


def _holder_identity(cluster: Cluster) -> str:
    return str(((_lease(cluster) or {}).get("spec") or {}).get("holderIdentity") or "")


def _holder(cluster: Cluster, replicas: list[Webhook]) -> Webhook | None:
    holder = _holder_identity(cluster)
    return next((r for r in replicas if holder.endswith(_identity(r))), None)


def _names(cluster: Cluster) -> set[str]:
    configmap = cluster.kube.get("ConfigMap", reserved_names.PARAMS_CONFIGMAP, reserved_names.NAMESPACE)
    return set(configmap.get("data") or {})


@dataclass(frozen=True)
class Reading:
    leader: float
    audits: float  # successful background audits (each followed by the reports' write)
    names: float  # writes of the reserved-node-names ConfigMap


@dataclass
class Sample:
    at: float
    holder: str  # the Lease's holderIdentity
    readings: dict[str, Reading]  # replica identity -> its metrics (absent: not answering)


@dataclass
class Sampler:
    """Every 0.2 s: the Lease's holder and each replica's leadership gauge and write counters."""

    cluster: Cluster
    replicas: list[Webhook]
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _read(self, replica: Webhook) -> Reading | None:
        try:
            _, text = replica.get("/metrics")
        except (OSError, urllib.error.URLError, http.client.HTTPException):  # not answering (killed)
            return None
        return Reading(
            metric_value(text, "rocm_isolation_audit_leader"),
            metric_value(text, "rocm_isolation_audit_runs_total", result="success"),
            metric_value(text, "rocm_isolation_reserved_names_syncs_total", result="updated"),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            holder = _holder_identity(self.cluster)
            readings = {}
            for replica in self.replicas:
                if replica.component.process.poll() is None and (reading := self._read(replica)) is not None:
                    readings[_identity(replica)] = reading
            self.samples.append(Sample(time.monotonic(), holder, readings))
            self._stop.wait(0.2)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def check_one_writer_at_a_time(self) -> None:
        assert len(self.samples) > 50, len(self.samples)
        previous: Sample | None = None
        for sample in self.samples:
            leaders = [identity for identity, reading in sample.readings.items() if reading.leader == 1]
            assert len(leaders) <= 1, f"two replicas lead at once: {sample}"
            if previous is not None:
                for identity, reading in sample.readings.items():
                    before = previous.readings.get(identity)
                    if before is None or (reading.audits == before.audits and reading.names == before.names):
                        continue
                    # A write since the previous sample: this replica held the Lease then or now.
                    assert any(h.endswith(identity) for h in (previous.holder, sample.holder)), (
                        f"{identity} wrote while the Lease named {previous.holder!r} then {sample.holder!r}"
                    )
            previous = sample

    def holders(self) -> list[str]:
        """The Lease's holders in turn (each change once)."""
        history: list[str] = []
        for sample in self.samples:
            if not history or history[-1] != sample.holder:
                history.append(sample.holder)
        return history


@pytest.fixture
def replicas(cluster: Cluster) -> Iterator[list[Webhook]]:
    started = [
        cluster.start_webhook(
            f"audit-replica-{i}",
            "--audit-interval-seconds",
            f"{AUDIT_INTERVAL:g}",
            "--names-sync-seconds",
            f"{NAMES_SYNC_INTERVAL:g}",
            cert_dir=cluster.webhook.cert_dir,
        )
        for i in range(2)
    ]
    yield started
    for replica in started:
        cluster.plane.processes.stop_one(replica.component)
    cluster.kube.delete("Lease", LEASE, WEBHOOK_NAMESPACE)


def _label(cluster: Cluster, node: str, value: str | None) -> None:
    cluster.kube.patch("Node", node, {"metadata": {"labels": {POOL: value}}})


def test_one_replica_audits_and_syncs_names_and_the_other_takes_both_over_when_it_dies(
    cluster: Cluster, replicas: list[Webhook]
) -> None:
    names_before = _names(cluster)
    node = cluster.pool_nodes[0]
    assert node not in names_before
    try:
        with Sampler(cluster, replicas) as sampler:
            leader = wait_until(
                lambda: _holder(cluster, replicas), timeout=60, what="one replica to hold the audit Lease"
            )
            follower = next(r for r in replicas if r is not leader)
            leader_identity = _holder_identity(cluster)
            wait_until(
                lambda: leader.metric("rocm_isolation_audit_runs_total", result="success") >= 1,
                timeout=90,
                what="the leader's first background audit",
            )
            # A node reserved by another tool: the leader, and only it, writes the names.
            _label(cluster, node, "inference")
            wait_until(lambda: node in _names(cluster), timeout=30, what=f"{node} in the backstop's names")
            assert leader.metric("rocm_isolation_audit_leader") == 1
            assert leader.metric("rocm_isolation_pool_gpus_allocatable", pool="reserved") == 16
            assert leader.metric("rocm_isolation_reserved_names_syncs_total", result="updated") >= 1
            assert follower.metric("rocm_isolation_audit_leader") == 0
            assert follower.metric("rocm_isolation_audit_runs_total") == 0
            assert follower.metric("rocm_isolation_reserved_names_syncs_total") == 0
            assert follower.metric("rocm_isolation_pool_gpus_allocatable") == 0  # only the leader's are scraped
            lease = _lease(cluster)
            assert lease is not None
            transitions = lease["spec"].get("leaseTransitions", 0)
            assert lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION

            # SIGKILL: no graceful release, the lease has to expire. The node leaves the pool meanwhile:
            # nobody syncs the names until the other replica holds the Lease.
            leader.component.process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            leader.component.process.wait(timeout=10)
            _label(cluster, node, None)
            wait_until(
                lambda: _holder(cluster, replicas) is follower,
                timeout=LEASE_DURATION * 4,
                interval=0.1,
                what="the follower to take the audit Lease over",
            )
            took_over = time.monotonic() - killed
            wait_until(lambda: node not in _names(cluster), timeout=60, interval=0.1, what=f"{node} out of the names")
            names_synced = time.monotonic() - killed
            wait_until(
                lambda: follower.metric("rocm_isolation_audit_runs_total", result="success") >= 1,
                timeout=90,
                interval=0.1,
                what="the new leader's background audit",
            )
            audited = time.monotonic() - killed
            time.sleep(1)  # a few more samples with the new leader alone
        print(
            f"\nlease {LEASE_DURATION:g} s, retry {RETRY_PERIOD:g} s; after the SIGKILL: Lease taken "
            f"{took_over:.1f} s, names synced {names_synced:.1f} s, audited {audited:.1f} s"
        )
        takeover_bound = LEASE_DURATION + 2 * RETRY_PERIOD + SLACK
        assert took_over <= takeover_bound, (took_over, takeover_bound)
        assert names_synced <= took_over + NAMES_SYNC_INTERVAL + SLACK, (names_synced, took_over)
        assert audited <= took_over + AUDIT_INTERVAL + SLACK, (audited, took_over)
        assert (_lease(cluster) or {})["spec"].get("leaseTransitions", 0) == transitions + 1
        assert follower.metric("rocm_isolation_audit_leader") == 1
        assert follower.metric("rocm_isolation_pool_gpus_allocatable", pool="reserved") == 16
        assert follower.metric("rocm_isolation_reserved_names_syncs_total", result="updated") >= 1
        sampler.check_one_writer_at_a_time()
        # Held by the first leader, then by the other, nobody in between (the killed one released nothing).
        history = sampler.holders()
        assert leader_identity in history, history
        follower_identity = _holder_identity(cluster)
        assert follower_identity.endswith(_identity(follower)), follower_identity
        assert history[history.index(leader_identity) :] == [leader_identity, follower_identity], history
    finally:
        _label(cluster, node, None)
        if _names(cluster) != names_before:
            result = cluster.cli("pool", "apply", "--nodes", ",".join(sorted(names_before)))
            assert result.returncode == 0, result.stdout + result.stderr
