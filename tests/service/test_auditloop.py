"""The background audit of ``serve`` and its Lease election, against the stateful fake API
(tests/fake_cluster.py: a real HTTP server keeping the Lease, answering 409 on a stale
resourceVersion like kube-apiserver, which cannot run here). The audits run as the real child
process (``python -m webhook audit -o json``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from audit_cluster import running_devices
from cluster_objects import inference_pod, namespace, node, pod
from conftest import ServerFactory, make_pki, wait_for
from fake_cluster import FakeCluster

from webhook.cluster.kubeapi import KubeApi
from webhook.cluster.lease import LeaderElector
from webhook.core.policy import default_policy
from webhook.ops.audit.command import RULES, run_audit
from webhook.service import serve
from webhook.service.auditloop import LEASE_NAME, BackgroundAudit, audit_command, publish
from webhook.service.metrics import Metrics

POLICY = default_policy()
NS = "rocm-isolation-system"


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster().start()
    cluster.add(node("r1", reserved=True), node("s1"), namespace("serve", {"rocm-isolation.io/class": "inference"}))
    cluster.add(
        inference_pod("llm", "serve", node="r1"),
        inference_pod("waiting", "serve", node=None, created="2026-12-01T08:20:00Z"),
        pod("trainer", "ml", node="r1", affinity=None),  # on a reserved node: a finding
    )
    yield cluster
    cluster.stop()


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_publish_exports_the_fixed_metric_names(fake: FakeCluster) -> None:
    report = run_audit(KubeApi(fake.api_client()), POLICY, now=datetime(2026, 12, 1, 8, 30, tzinfo=UTC))
    metrics = Metrics()
    publish(report.to_json(), metrics)
    assert sample(metrics, "rocm_isolation_audit_findings", rule="pod-on-reserved-node") == 1
    assert sample(metrics, "rocm_isolation_audit_findings", rule="node-label-without-taint") == 0
    assert {rule for rule in RULES if sample(metrics, "rocm_isolation_audit_findings", rule=rule) is not None} == set(
        RULES
    )
    assert sample(metrics, "rocm_isolation_pool_nodes", pool="reserved") == 1
    assert sample(metrics, "rocm_isolation_pool_nodes", pool="shared") == 1
    assert sample(metrics, "rocm_isolation_pool_gpus_allocatable", pool="reserved") == 8
    assert sample(metrics, "rocm_isolation_pool_gpus_requested", pool="reserved", **{"class": "inference"}) == 2
    assert sample(metrics, "rocm_isolation_pool_gpus_requested", pool="reserved", **{"class": "training"}) == 2
    assert sample(metrics, "rocm_isolation_pool_pending_pods", pool="reserved", **{"class": "inference"}) == 1
    assert (
        sample(metrics, "rocm_isolation_pool_oldest_pending_seconds", pool="reserved", **{"class": "inference"}) == 600
    )
    # Classes that no longer have pods disappear from the next publication.
    fake.delete_object("pods", "waiting", "serve")
    publish(run_audit(KubeApi(fake.api_client()), POLICY).to_json(), metrics)
    assert sample(metrics, "rocm_isolation_pool_pending_pods", pool="reserved", **{"class": "inference"}) is None


def device_report() -> dict[str, Any]:
    """The JSON report of the audit of the device-level reservation's cluster (tests/audit_cluster.py)."""
    devices = running_devices()
    cluster = next(devices)
    try:
        return run_audit(KubeApi(cluster.api_client()), POLICY).to_json()
    finally:
        next(devices, None)


def test_publish_exports_the_split_devices_while_a_reservation_is_active() -> None:
    """Device-level reservation: the split nodes' reserved and shared GPUs, and the GPUs allocated per side
    and class; absent once no reservation is active (the next publication clears them)."""
    document = device_report()
    metrics = Metrics()
    publish(document, metrics)
    assert sample(metrics, "rocm_isolation_pool_split_devices", pool="reserved") == 7
    assert sample(metrics, "rocm_isolation_pool_split_devices", pool="shared") == 8
    allocated = "rocm_isolation_pool_split_devices_allocated"
    assert sample(metrics, allocated, pool="reserved", **{"class": "inference"}) == 1
    assert sample(metrics, allocated, pool="reserved", **{"class": "training"}) == 1
    assert sample(metrics, allocated, pool="shared", **{"class": "training"}) == 1
    assert sample(metrics, allocated, pool="shared", **{"class": "unclassified"}) == 1
    assert sample(metrics, "rocm_isolation_audit_findings", rule="reserved-device-held-by-other-class") == 1
    publish({**document, "capacity": {k: v for k, v in document["capacity"].items() if k != "devices"}}, metrics)
    assert sample(metrics, "rocm_isolation_pool_split_devices", pool="reserved") is None
    assert sample(metrics, allocated, pool="reserved", **{"class": "inference"}) is None


def test_the_pool_gauges_count_a_split_nodes_gpus_on_their_side() -> None:
    """Device-level reservation only (no node reserved whole): the reserved pool's allocatable GPUs are the
    split nodes' reserved GPUs (RocmIsolationReservedPoolEmpty reads them), the GPUs allocated there are
    requested in it (RocmIsolationReservedPoolSaturated); pool = whole reserved nodes + split reserved GPUs."""
    metrics = Metrics()
    publish(device_report(), metrics)
    for pool, gpus in (("reserved", 7), ("shared", 8)):
        assert sample(metrics, "rocm_isolation_pool_gpus_allocatable", pool=pool) == gpus
        assert sample(metrics, "rocm_isolation_pool_split_devices", pool=pool) == gpus
        assert sample(metrics, "rocm_isolation_pool_nodes", pool=pool) == 4  # a split node is in both pools
    requested = "rocm_isolation_pool_gpus_requested"
    assert sample(metrics, requested, pool="reserved", **{"class": "inference"}) == 1
    assert sample(metrics, requested, pool="reserved", **{"class": "training"}) == 1
    assert sample(metrics, requested, pool="shared", **{"class": "training"}) == 1
    assert sample(metrics, requested, pool="shared", **{"class": "unclassified"}) == 1
    assert sample(metrics, requested, pool="shared", **{"class": "inference"}) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(fake: FakeCluster, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(KubeApi(fake.api_client()), namespace=NS, name=LEASE_NAME, identity=identity, monotonic=clock)


def test_lease_one_leader_renewals_and_failover_after_expiry(fake: FakeCluster) -> None:
    clock = Clock()
    a, b = elector(fake, "pod-a_1", clock), elector(fake, "pod-b_1", clock)
    assert a.try_acquire_or_renew() is True  # created the Lease
    lease = fake.get_object("leases", LEASE_NAME, NS, group="coordination.k8s.io")
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-a_1"
    assert lease["spec"]["leaseDurationSeconds"] == 15 and lease["spec"]["renewTime"].endswith("Z")
    assert b.try_acquire_or_renew() is False
    clock.now += 5
    assert a.try_acquire_or_renew() is True  # renewed
    clock.now += 10
    assert b.try_acquire_or_renew() is False  # B saw a renewal 10 s ago (its own clock): still held
    clock.now += 16  # A stopped renewing (crashed); B has seen no change for 16 s > 15 s
    assert not a.is_leader  # A's own renew deadline (10 s) passed long before
    assert b.try_acquire_or_renew() is True
    lease = fake.get_object("leases", LEASE_NAME, NS, group="coordination.k8s.io")
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-b_1" and lease["spec"]["leaseTransitions"] == 1
    assert a.try_acquire_or_renew() is False and not a.is_leader
    updates = [r for r in fake.requests if r.method == "PUT"]
    assert all(r.body["metadata"]["resourceVersion"] for r in updates)  # every write is conditional


def test_a_stale_write_is_a_conflict_and_not_leadership(fake: FakeCluster) -> None:
    clock = Clock()
    a, b = elector(fake, "pod-a_1", clock), elector(fake, "pod-b_1", clock)
    assert a.try_acquire_or_renew()
    clock.now += 20
    a.release()  # holder emptied: anyone may take it
    # B reads the released lease; A renews first in between: B's update carries a stale resourceVersion.
    stale = fake.get_object("leases", LEASE_NAME, NS, group="coordination.k8s.io")
    assert stale is not None and stale["spec"]["holderIdentity"] == ""
    assert a.try_acquire_or_renew()
    original_get = b.api.get
    b.api.get = lambda path, **kwargs: stale  # type: ignore[method-assign]
    try:
        assert b.try_acquire_or_renew() is False
    finally:
        b.api.get = original_get  # type: ignore[method-assign]
    assert [r for r in fake.requests if r.method == "PUT"][-1].body["spec"]["holderIdentity"] == "pod-b_1"
    lease = fake.get_object("leases", LEASE_NAME, NS, group="coordination.k8s.io")
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-a_1"


def background(fake: FakeCluster, kubeconfig: Path, identity: str, metrics: Metrics) -> BackgroundAudit:
    lease = LeaderElector(
        KubeApi(fake.api_client()),
        namespace=NS,
        name=LEASE_NAME,
        identity=identity,
        lease_duration=1.5,
        renew_deadline=1.0,
        retry_period=0.1,
    )
    return BackgroundAudit(audit_command(str(kubeconfig), None), metrics, interval=0.3, elector=lease, poll=0.05)


def test_two_replicas_one_audits_and_the_other_takes_over(fake: FakeCluster, tmp_path: Path) -> None:
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    metrics_a, metrics_b = Metrics(), Metrics()
    a = background(fake, kubeconfig, "pod-a_1", metrics_a)
    a.start()
    wait_for(lambda: a.runs >= 1, what="the first replica's first audit")
    b = background(fake, kubeconfig, "pod-b_1", metrics_b)
    b.start()
    try:
        wait_for(lambda: a.runs >= 2, what="more audits on the leader")
        assert b.runs == 0
        assert sample(metrics_a, "rocm_isolation_audit_leader") == 1
        assert sample(metrics_b, "rocm_isolation_audit_leader") == 0
        assert sample(metrics_a, "rocm_isolation_audit_runs_total", result="success") == a.runs
        assert (sample(metrics_a, "rocm_isolation_audit_last_success_timestamp_seconds") or 0) > 0
        assert sample(metrics_a, "rocm_isolation_audit_findings", rule="pod-on-reserved-node") == 1
        assert sample(metrics_b, "rocm_isolation_audit_findings", rule="pod-on-reserved-node") is None
        a.stop(release=False)  # a crash: the lease is left to expire
        wait_for(lambda: b.runs >= 1, what="the second replica taking over after the lease expired")
        assert sample(metrics_b, "rocm_isolation_audit_leader") == 1
        assert sample(metrics_b, "rocm_isolation_audit_findings", rule="pod-on-reserved-node") == 1
        lease = fake.get_object("leases", LEASE_NAME, NS, group="coordination.k8s.io")
        assert lease is not None and lease["spec"]["holderIdentity"] == "pod-b_1"
    finally:
        a.stop(release=False)
        b.stop()
    lease = fake.get_object("leases", LEASE_NAME, NS, group="coordination.k8s.io")
    assert lease is not None and lease["spec"]["holderIdentity"] == ""  # released on a clean stop


def test_a_failed_audit_counts_a_failure_and_keeps_going(fake: FakeCluster, tmp_path: Path) -> None:
    fake.forbid("pods")
    metrics = Metrics()
    command = audit_command(str(fake.write_kubeconfig(tmp_path / "kubeconfig")), None)
    loop = BackgroundAudit(command, metrics, interval=0.1, poll=0.02)
    loop.start()
    try:
        wait_for(
            lambda: (sample(metrics, "rocm_isolation_audit_runs_total", result="failure") or 0) >= 2, what="failures"
        )
        assert sample(metrics, "rocm_isolation_audit_last_success_timestamp_seconds") == 0
        assert sample(metrics, "rocm_isolation_audit_leader") == 1  # no lease: a single replica audits
    finally:
        loop.stop()


def test_the_background_audit_reads_the_lending_keepers_view_and_finds_what_a_listing_audit_finds(
    tmp_path: Path,
) -> None:
    """With the Lease holder's view synced, the child audits its dump: the same findings and capacity as an
    audit that lists the cluster, and not one list of the cluster."""
    from audit_cluster import populate

    from webhook.cluster.view import ClusterView

    cluster = FakeCluster().start()
    try:
        cluster.serve_discovery()
        populate(cluster)
        populate_devices(cluster)
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        view = ClusterView(cluster.api_client(), lambda: POLICY)
        view.start()
        wait_for(lambda: view.synced, what="the view synced")
        listing = BackgroundAudit(audit_command(str(kubeconfig), None), Metrics(), interval=60)
        assert listing.run_once() and listing.last_report is not None
        dumped: list[bool] = []

        def dump(path: Path) -> bool:
            dumped.append(view.dump(path))
            return dumped[-1]

        reading = BackgroundAudit(audit_command(str(kubeconfig), None), Metrics(), interval=60, view_dump=dump)
        before = len(cluster.requests)
        assert reading.run_once() and reading.last_report is not None
        assert dumped == [True]
        lists = [r.path for r in cluster.requests[before:] if r.method == "GET" and "watch" not in r.query]
        assert lists == ["/api/v1/namespaces/rocm-isolation-system/configmaps/rocm-isolation-reserved-node-names"]
        assert reading.last_report["findings"] == listing.last_report["findings"]
        assert without_waits(reading.last_report["capacity"]) == without_waits(listing.last_report["capacity"])
        view.stop()
        # Not synced (a new Lease holder): the child lists the cluster itself.
        assert view.dump(tmp_path / "unused.json") is False
    finally:
        cluster.stop()


@pytest.mark.parametrize(("minor", "written_for"), [("1.35", "1.35"), ("1.36", "1.35"), ("1.35", "1.36")])
def test_the_background_audit_on_the_view_judges_the_device_reservation_as_the_clusters_minor_holds_it(
    tmp_path: Path, minor: str, written_for: str
) -> None:
    """A split made on 1.35, where the apiserver drops a DeviceClass's extendedResourceName (pool apply writes the
    classes without it): the background audit reading the keeper's view judges it as 1.35 can hold it, as the
    ``audit`` command does, every run, and adds no request for it. The same classes on 1.36, which keeps the name,
    are a finding (amd.com/gpu maps to no class). A 1.35 whose administrator turned DRAExtendedResource on (pool,
    reading the gates as an admin, wrote the name, and the apiserver kept it): serve's audit cannot read the gates
    (its account may not read /metrics) and judges with 1.35's stock defaults, which ask nothing of the classes'
    name: no false finding (what it cannot say there: a class that lost the name while the gate is on)."""
    from audit_cluster import RESERVATION, SPLIT_LABELS, four_gpus, split_node_slice
    from cluster_objects import reservation_classes

    from webhook.cluster.view import ClusterView
    from webhook.deploy import minors
    from webhook.ops.devices.minor import policy_for

    as_written, notes = policy_for(POLICY, minors.for_minor(written_for))
    assert bool(notes) == (written_for == "1.35")
    assert bool(as_written.spec.reserved_devices.extended_resource_name) == (written_for == "1.36")
    cluster = FakeCluster().start()
    try:
        cluster.serve_discovery(minor=minor)
        cluster.add(
            node("d1", labels=SPLIT_LABELS, allocatable={}),
            split_node_slice("d1", *four_gpus()),
            *reservation_classes(RESERVATION, policy=as_written),
        )
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        listing = BackgroundAudit(audit_command(str(kubeconfig), None), Metrics(), interval=60)
        assert listing.run_once() and listing.last_report is not None
        view = ClusterView(cluster.api_client(), lambda: POLICY)
        view.start()
        wait_for(lambda: view.synced, what="the view synced")
        dumped: list[bool] = []

        def dump(path: Path) -> bool:
            dumped.append(view.dump(path))
            return dumped[-1]

        reading = BackgroundAudit(audit_command(str(kubeconfig), None), Metrics(), interval=60, view_dump=dump)
        for _ in range(2):  # every run, not once
            before = len(cluster.requests)
            assert reading.run_once() and reading.last_report is not None
            sent = [r.path for r in cluster.requests[before:] if r.method == "GET" and "watch" not in r.query]
            assert sent == ["/api/v1/namespaces/rocm-isolation-system/configmaps/rocm-isolation-reserved-node-names"]
            rules = [f["rule"] for f in reading.last_report["findings"]]
            assert ("extended-resource-not-on-shared-class" in rules) == ((minor, written_for) == ("1.36", "1.35")), (
                rules
            )
            assert reading.last_report["findings"] == listing.last_report["findings"]
            assert reading.last_report["capacity"]["devices"]["reservedDevices"] == 2
        assert dumped == [True, True]
        view.stop()
    finally:
        cluster.stop()


def without_waits(document: Any) -> Any:
    """The capacity section but for how long pending pods have waited (the two audits ran a second apart)."""
    if isinstance(document, dict):
        return {k: without_waits(v) for k, v in document.items() if k != "oldestWaitSeconds"}
    if isinstance(document, list):
        return [without_waits(v) for v in document]
    return document


def populate_devices(cluster: FakeCluster) -> None:
    from audit_cluster import populate_devices as devices

    devices(cluster)


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(extra))


def test_serve_flag_builds_the_background_audit(
    fake: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = str(fake.write_kubeconfig(tmp_path / "kubeconfig"))
    assert serve.settings_from_args(_args("--kubeconfig", kubeconfig)).audit_interval_seconds == 300
    settings = serve.settings_from_args(_args("--kubeconfig", kubeconfig, "--audit-interval-seconds", "60"))
    monkeypatch.setenv("POD_NAMESPACE", "gpu-admission")
    auditor = serve.build_auditor(settings, Metrics())
    assert auditor.interval == 60
    assert auditor.command[-5:] == ["audit", "-o", "json", "--kubeconfig", kubeconfig]
    assert auditor.elector is not None and auditor.elector.namespace == "gpu-admission"
    assert auditor.elector.name == LEASE_NAME and auditor.elector.identity.endswith(f"_{__import__('os').getpid()}")
    off = serve.settings_from_args(_args("--kubeconfig", kubeconfig, "--audit-interval-seconds", "0"))
    assert off.audit_interval_seconds == 0


def test_serve_rejects_a_negative_interval(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main(_args("--no-cluster", "--audit-interval-seconds", "-1")) == 2
    assert "intervals must be positive" in capsys.readouterr().err


def test_serve_audits_in_the_background_and_exports_the_gauges(
    fake: FakeCluster, tmp_path: Path, running_server: ServerFactory
) -> None:
    """The real ``serve`` process: cluster cache and background audit against the fake API."""
    pki = make_pki(tmp_path / "certs")
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    server = running_server(
        cert_dir=pki.dir,
        ca_file=pki.ca_file,
        cluster=True,
        args=["--kubeconfig", str(kubeconfig), "--audit-interval-seconds", "1"],
        env={"POD_NAMESPACE": "ops"},
    )

    def exported() -> bool:
        text = server.metrics()
        return 'rocm_isolation_audit_findings{rule="pod-on-reserved-node"} 1.0' in text

    wait_for(exported, timeout=60, what="the background audit's findings in /metrics")
    text = server.metrics()
    assert "rocm_isolation_audit_leader 1.0" in text
    assert 'rocm_isolation_audit_runs_total{result="success"}' in text
    assert 'rocm_isolation_pool_gpus_allocatable{pool="reserved"} 8.0' in text
    assert 'rocm_isolation_pool_pending_pods{class="inference",pool="reserved"} 1.0' in text
    lease = fake.get_object("leases", LEASE_NAME, "ops", group="coordination.k8s.io")
    assert lease is not None and lease["spec"]["holderIdentity"].endswith(f"_{server.process.pid}")
    server.stop()  # SIGTERM: graceful shutdown
    lease = fake.get_object("leases", LEASE_NAME, "ops", group="coordination.k8s.io")
    assert lease is not None and lease["spec"]["holderIdentity"] == ""  # released at shutdown
