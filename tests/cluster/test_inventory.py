"""webhook.cluster.inventory: nodes -> pools, pods -> GPUs (as the scheduler counts them), and the Snapshot
read from the stateful fake API (tests/fake_cluster.py; kube-apiserver cannot run here)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from cluster_objects import namespace, node, pod, resource_claim
from fake_cluster import FakeCluster

from webhook.cluster.inventory import Snapshot, gpu_request, node_info, pod_info, quantity
from webhook.cluster.kubeapi import KubeApi
from webhook.core.policy import default_policy

POLICY = default_policy()


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster().start()
    yield cluster
    cluster.stop()


def test_quantities() -> None:
    assert [quantity(v) for v in ("8", 8, "1k", "2000m", "0", "", "x", True)] == [8, 8, 1000, 2, 0, 0, 0, 0]


def test_node_pool_membership_taints_and_gpus() -> None:
    reserved = node_info(node("a", reserved=True), POLICY)
    assert (reserved.pool, reserved.labelled, reserved.tainted, reserved.gpus) == ("reserved", True, True, 8)
    shared = node_info(node("b"), POLICY)
    assert (shared.pool, shared.labelled, shared.tainted, shared.unhealthy) == ("shared", False, False, False)
    partitioned = node_info(node("c", allocatable={"amd.com/cpx_nps4": "64"}), POLICY)
    assert partitioned.gpus == 64 and partitioned.gpu_resources == {"amd.com/cpx_nps4": 64}
    unhealthy = node_info(
        node("d", reserved=True, taints=[{"key": "amd-gpu-unhealthy", "value": "0", "effect": "NoSchedule"}]), POLICY
    )
    assert unhealthy.unhealthy and unhealthy.labelled
    # A taint with the reserved key but another value or effect is not the reserved taint.
    other = node_info(
        node("e", taints=[{"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "PreferNoSchedule"}]),
        POLICY,
    )
    assert not other.tainted
    cpu_only = node_info(node("f", allocatable={}, unschedulable=True), POLICY)
    assert cpu_only.gpus == 0 and cpu_only.unschedulable


def _container(name: str, gpus: str, *, sidecar: bool = False) -> dict[str, object]:
    body: dict[str, object] = {"name": name, "image": "x", "resources": {"limits": {"amd.com/gpu": gpus}}}
    if sidecar:
        body["restartPolicy"] = "Always"
    return body


def test_effective_gpu_request_counts_init_containers_and_sidecars_like_the_scheduler() -> None:
    plain = pod("p", "ns", gpus={"amd.com/gpu": "2"})
    assert gpu_request(plain, POLICY) == {"amd.com/gpu": 2}
    # An init container that needs more than the app: the pod needs the larger of the two.
    big_init = pod("p", "ns", gpus={"amd.com/gpu": "2"}, init_containers=[_container("warm", "4")])
    assert gpu_request(big_init, POLICY) == {"amd.com/gpu": 4}
    # A sidecar (restartable init container) runs with the app and with every later init container.
    sidecar = pod(
        "p",
        "ns",
        gpus={"amd.com/gpu": "2"},
        init_containers=[_container("proxy", "1", sidecar=True), _container("warm", "2")],
    )
    assert gpu_request(sidecar, POLICY) == {"amd.com/gpu": 3}
    partitions = pod("p", "ns", gpus={"amd.com/cpx_nps4": "3"})
    assert gpu_request(partitions, POLICY) == {"amd.com/cpx_nps4": 3}
    assert gpu_request(pod("p", "ns", gpus={}), POLICY) == {}
    # Requests defaulted from limits (only limits written).
    limits_only = pod("p", "ns", gpus={})
    limits_only["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/gpu": "1"}}
    assert gpu_request(limits_only, POLICY) == {"amd.com/gpu": 1}


def test_pod_info() -> None:
    bound = pod_info(pod("t", "ml", node="n1"), POLICY)
    assert (bound.node, bound.phase, bound.gpus, bound.bound, bound.pending) == ("n1", "Running", 2, True, False)
    assert bound.owner == ("ReplicaSet", "trainer-7d9c8b6f5")
    waiting = pod_info(pod("w", "ml", node=None, created="2026-12-01T08:00:00Z"), POLICY)
    assert waiting.pending and waiting.created == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def test_snapshot_reads_nodes_namespaces_and_v1_claims(fake: FakeCluster) -> None:
    fake.add(node("a", reserved=True), node("b"))
    fake.add(namespace("serve", {"rocm-isolation.io/class": "inference"}), namespace("ml"))
    fake.add(
        resource_claim("gpu", "ml"),
        resource_claim("tpl", "ml", template=True),
        resource_claim("nic", "serve", "nic.example.com"),
    )
    snapshot = Snapshot.read(KubeApi(fake.api_client(), page_size=1), POLICY)
    assert set(snapshot.nodes) == {"a", "b"} and snapshot.reserved_node_names == frozenset({"a"})
    assert snapshot.namespace_facts("serve").labels == {
        "kubernetes.io/metadata.name": "serve",
        "rocm-isolation.io/class": "inference",
    }
    assert snapshot.namespace_facts("gone").labels is None
    assert snapshot.claims_version == "v1"
    assert snapshot.claim_facts("ml").claims == {"gpu": frozenset({"gpu.amd.com"})}
    assert snapshot.claim_facts("ml").templates == {"tpl": frozenset({"gpu.amd.com"})}
    assert snapshot.claim_facts("serve").claims == {"nic": frozenset({"nic.example.com"})}
    assert snapshot.claim_facts("nowhere").claims == {}


def test_snapshot_falls_back_to_older_dra_versions_and_to_none() -> None:
    beta = FakeCluster(served_versions={"resource.k8s.io": ("v1beta1",)}).start()
    try:
        claim = resource_claim("gpu", "ml")
        claim["apiVersion"] = "resource.k8s.io/v1beta1"
        claim["spec"] = {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.amd.com"}]}}
        beta.add(claim)
        snapshot = Snapshot.read(KubeApi(beta.api_client()), POLICY)
        assert snapshot.claims_version == "v1beta1"
        assert snapshot.claim_facts("ml").claims == {"gpu": frozenset({"gpu.amd.com"})}
        tried = [r.path for r in beta.requests if "resource.k8s.io" in r.path]
        assert tried[:3] == [
            "/apis/resource.k8s.io/v1/resourceclaims",
            "/apis/resource.k8s.io/v1beta2/resourceclaims",
            "/apis/resource.k8s.io/v1beta1/resourceclaims",
        ]
    finally:
        beta.stop()
    none = FakeCluster(served_versions={"resource.k8s.io": ()}).start()
    try:
        snapshot = Snapshot.read(KubeApi(none.api_client()), POLICY)
        assert snapshot.claims_version is None and snapshot.claims == {}
    finally:
        none.stop()


def test_snapshot_without_rights_on_claims_warns(fake: FakeCluster) -> None:
    fake.forbid("resourceclaims")
    snapshot = Snapshot.read(KubeApi(fake.api_client()), POLICY)
    assert snapshot.claims_version is None
    assert len(snapshot.warnings) == 1 and "count as GPU pods" in snapshot.warnings[0]


def test_pods_are_streamed_with_a_field_selector(fake: FakeCluster) -> None:
    fake.add(pod("a", "ml", node="n1"), pod("b", "ml", node="n1", phase="Failed"), pod("c", "ml", node="n2"))
    api = KubeApi(fake.api_client(), page_size=1)
    assert [p["metadata"]["name"] for p in Snapshot.pods(api)] == ["a", "c"]
    assert fake.requests_to("/api/v1/pods")[0].query["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed"
    on_n1 = Snapshot.pods(api, field_selector="spec.nodeName=n1")
    assert [p["metadata"]["name"] for p in on_n1] == ["a", "b"]
