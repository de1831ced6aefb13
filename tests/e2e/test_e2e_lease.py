"""Scenario 7: the background audit of ``serve`` with two replicas and a real coordination.k8s.io
Lease (the webhook's ServiceAccount RBAC, its namespace). One replica audits and exports the audit
gauges; killed without a chance to give the lease up, the other takes over once the lease expires."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from .harness import WEBHOOK_NAMESPACE, Cluster, Webhook
from .kube import Obj, wait_until

LEASE = "rocm-isolation-webhook-audit"


def _identity(webhook: Webhook) -> str:
    return f"_{webhook.component.process.pid}"


def _lease(cluster: Cluster) -> Obj | None:
    return cluster.kube.get_or_none("Lease", LEASE, WEBHOOK_NAMESPACE)


def _holder(cluster: Cluster, replicas: list[Webhook]) -> Webhook | None:
    lease = _lease(cluster)
    holder = (lease or {}).get("spec", {}).get("holderIdentity") or ""
    return next((r for r in replicas if holder.endswith(_identity(r))), None)


@pytest.fixture
def replicas(cluster: Cluster) -> Iterator[list[Webhook]]:
    started = [
        cluster.start_webhook(f"audit-replica-{i}", "--audit-interval-seconds", "2", cert_dir=cluster.webhook.cert_dir)
        for i in range(2)
    ]
    yield started
    for replica in started:
        cluster.plane.processes.stop_one(replica.component)
    cluster.kube.delete("Lease", LEASE, WEBHOOK_NAMESPACE)


def test_one_replica_audits_and_the_other_takes_over_when_it_dies(cluster: Cluster, replicas: list[Webhook]) -> None:
    leader = wait_until(lambda: _holder(cluster, replicas), timeout=60, what="one replica to hold the audit Lease")
    follower = next(r for r in replicas if r is not leader)
    wait_until(
        lambda: leader.metric("rocm_isolation_audit_runs_total", result="success") >= 1,
        timeout=90,
        what="the leader's first background audit",
    )
    assert leader.metric("rocm_isolation_audit_leader") == 1
    assert leader.metric("rocm_isolation_pool_gpus_allocatable", pool="reserved") == 16
    assert follower.metric("rocm_isolation_audit_leader") == 0
    assert follower.metric("rocm_isolation_audit_runs_total") == 0
    assert follower.metric("rocm_isolation_pool_gpus_allocatable") == 0  # only the leader's are scraped
    lease = _lease(cluster)
    assert lease is not None
    transitions = lease["spec"].get("leaseTransitions", 0)
    duration = lease["spec"]["leaseDurationSeconds"]
    assert duration > 0

    # SIGKILL: no graceful release, the lease has to expire.
    leader.component.process.send_signal(signal.SIGKILL)
    leader.component.process.wait(timeout=10)
    wait_until(
        lambda: _holder(cluster, replicas) is follower,
        timeout=duration * 4,
        what="the follower to take the audit Lease over",
    )
    assert (_lease(cluster) or {})["spec"].get("leaseTransitions", 0) == transitions + 1
    wait_until(
        lambda: follower.metric("rocm_isolation_audit_runs_total", result="success") >= 1,
        timeout=90,
        what="the new leader's background audit",
    )
    assert follower.metric("rocm_isolation_audit_leader") == 1
    assert follower.metric("rocm_isolation_pool_gpus_allocatable", pool="reserved") == 16
