"""webhook.cluster.kubeapi against the stateful fake API (tests/fake_cluster.py): a real HTTP server that
pages, filters and fails the way kube-apiserver does (kube-apiserver itself cannot run here). The
``kubernetes`` ApiClient does the HTTP, unpatched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_objects import namespace, node, pod
from fake_cluster import FakeCluster

from webhook.cluster.kubeapi import (
    ApiError,
    Conflict,
    Expired,
    Forbidden,
    KubeApi,
    NotFound,
    TooManyRequests,
    Unreachable,
    api_path,
)


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster().start()
    yield cluster
    cluster.stop()


def api_for(fake: FakeCluster, **kwargs: object) -> KubeApi:
    return KubeApi(fake.api_client(), **kwargs)  # type: ignore[arg-type]


def test_paths() -> None:
    assert api_path("v1", "pods") == "/api/v1/pods"
    assert api_path("v1", "pods", namespace="team a", name="p/1") == "/api/v1/namespaces/team%20a/pods/p%2F1"
    assert (
        api_path("v1", "pods", namespace="a", name="p", subresource="eviction")
        == "/api/v1/namespaces/a/pods/p/eviction"
    )
    assert (
        api_path("coordination.k8s.io/v1", "leases", namespace="x")
        == "/apis/coordination.k8s.io/v1/namespaces/x/leases"
    )


@pytest.mark.parametrize("prefetch", [0, 2])
def test_list_pages_with_limit_and_continue_and_sends_the_token(fake: FakeCluster, prefetch: int) -> None:
    fake.add(*(node(f"n{i:03d}") for i in range(23)))
    api = api_for(fake, page_size=10, prefetch=prefetch)
    pages = list(api.pages("/api/v1/nodes"))
    assert [len(p) for p in pages] == [10, 10, 3]
    names = [item["metadata"]["name"] for page in pages for item in page]
    assert names == [f"n{i:03d}" for i in range(23)]
    requests = fake.requests_to("/api/v1/nodes")
    assert [r.query.get("limit") for r in requests] == ["10", "10", "10"]
    assert "continue" not in requests[0].query
    assert requests[1].query["continue"] and requests[2].query["continue"] != requests[1].query["continue"]
    # Raw JSON, as the apiserver sends list items: no kind on items, every field kept.
    assert "kind" not in pages[0][0]
    assert pages[0][0]["status"]["allocatable"]["amd.com/gpu"] == "8"


def test_a_list_is_a_consistent_snapshot(fake: FakeCluster) -> None:
    """Objects added after the first page do not appear in later pages (same resourceVersion)."""
    fake.add(*(namespace(f"ns-{i}") for i in range(4)))
    api = api_for(fake, page_size=2)
    seen = []
    for item in api.list("/api/v1/namespaces"):
        seen.append(item["metadata"]["name"])
        if len(seen) == 1:
            fake.add(namespace("ns-9"))
    assert seen == ["ns-0", "ns-1", "ns-2", "ns-3"]
    assert [i["metadata"]["name"] for i in api.list("/api/v1/namespaces")][-1] == "ns-9"


def test_label_and_field_selectors_are_sent_and_applied(fake: FakeCluster) -> None:
    fake.add(node("a", reserved=True), node("b"), node("c", labels={"rocm-isolation.io/pool": "other"}))
    fake.add(
        pod("p1", "team", node="a"),
        pod("p2", "team", node="b"),
        pod("p3", "team", node="b", phase="Succeeded"),
        pod("p4", "team", node=None),
    )
    api = api_for(fake)
    assert [
        n["metadata"]["name"] for n in api.list("/api/v1/nodes", label_selector="rocm-isolation.io/pool=inference")
    ] == ["a"]
    assert [n["metadata"]["name"] for n in api.list("/api/v1/nodes", label_selector="rocm-isolation.io/pool")] == [
        "a",
        "c",
    ]
    assert [n["metadata"]["name"] for n in api.list("/api/v1/nodes", label_selector="!rocm-isolation.io/pool")] == ["b"]
    assert [
        n["metadata"]["name"]
        for n in api.list("/api/v1/nodes", label_selector="rocm-isolation.io/pool notin (inference)")
    ] == ["b", "c"]
    on_b = api.list("/api/v1/pods", field_selector="spec.nodeName=b")
    assert sorted(p["metadata"]["name"] for p in on_b) == ["p2", "p3"]
    active = api.list("/api/v1/pods", field_selector="status.phase!=Succeeded,status.phase!=Failed")
    assert sorted(p["metadata"]["name"] for p in active) == ["p1", "p2", "p4"]
    unscheduled = api.list("/api/v1/namespaces/team/pods", field_selector="spec.nodeName=")
    assert [p["metadata"]["name"] for p in unscheduled] == ["p4"]
    assert fake.requests_to("/api/v1/pods")[0].query["fieldSelector"] == "spec.nodeName=b"


def test_an_unsupported_field_selector_is_a_bad_request(fake: FakeCluster) -> None:
    with pytest.raises(ApiError) as caught:
        list(api_for(fake).list("/api/v1/pods", field_selector="spec.priority=0"))
    assert caught.value.status == 400
    assert "not a known field selector" in caught.value.message


@pytest.mark.parametrize("prefetch", [0, 2])
def test_expired_continue_raises_without_on_restart_like_client_go_each_list_item(
    fake: FakeCluster, prefetch: int
) -> None:
    fake.add(*(node(f"n{i}") for i in range(5)))
    api = api_for(fake, page_size=2, prefetch=prefetch)
    fake.expire_after(1)
    items = api.list("/api/v1/nodes")
    next(items)
    next(items)
    with pytest.raises(Expired) as caught:
        next(items)
    assert caught.value.status == 410 and caught.value.reason == "Expired"
    assert "too old to display a consistent list result" in caught.value.message
    assert caught.value.continue_token  # the inconsistent token the apiserver offers (not used)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_expired_continue_restarts_the_list_with_on_restart(fake: FakeCluster, prefetch: int) -> None:
    fake.add(*(node(f"n{i}") for i in range(5)))
    api = api_for(fake, page_size=2, prefetch=prefetch)
    seen: list[str] = []
    restarts = []

    def restart() -> None:
        restarts.append(len(seen))
        seen.clear()

    fake.expire_after(1)  # the first page's continue token expires
    for item in api.list("/api/v1/nodes", on_restart=restart):
        seen.append(item["metadata"]["name"])
    assert restarts == [2]
    assert seen == ["n0", "n1", "n2", "n3", "n4"]  # no duplicates, nothing missing
    queries = [r.query for r in fake.requests_to("/api/v1/nodes")]
    assert "continue" in queries[1] and "continue" not in queries[2]  # restarted from the first page


def test_typed_errors_carry_the_status_reason_and_message(fake: FakeCluster) -> None:
    api = api_for(fake)
    with pytest.raises(NotFound) as not_found:
        api.get("/api/v1/nodes/missing")
    assert not_found.value.reason == "NotFound"
    assert not_found.value.message == 'nodes "missing" not found'
    assert str(not_found.value) == 'Error from server (NotFound): nodes "missing" not found'
    fake.forbid("pods")
    with pytest.raises(Forbidden) as forbidden:
        list(api.list("/api/v1/pods"))
    assert forbidden.value.status == 403
    assert 'cannot list resource "pods" in API group "" at the cluster scope' in forbidden.value.message
    with pytest.raises(NotFound) as unserved:
        list(api.list("/apis/resource.k8s.io/v1alpha3/resourceclaims"))
    assert unserved.value.message == "the server could not find the requested resource"


def test_create_and_replace_with_conflicts(fake: FakeCluster) -> None:
    api = api_for(fake)
    path = api_path("coordination.k8s.io/v1", "leases", namespace="ops")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "ops"},
        "spec": {"holderIdentity": "a"},
    }
    created = api.create(path, lease)
    assert created["kind"] == "Lease" and created["metadata"]["resourceVersion"]
    with pytest.raises(Conflict) as exists:
        api.create(path, lease)
    assert exists.value.reason == "AlreadyExists"
    updated = api.replace(path + "/l", {**created, "spec": {"holderIdentity": "b"}})
    assert updated["spec"]["holderIdentity"] == "b"
    with pytest.raises(Conflict) as stale:
        api.replace(path + "/l", {**created, "spec": {"holderIdentity": "c"}})  # the old resourceVersion
    assert stale.value.reason == "Conflict" and "the object has been modified" in stale.value.message


def test_throttled_reads_are_retried_after_retry_after(fake: FakeCluster) -> None:
    fake.add(node("a"))
    waits: list[float] = []
    api = api_for(fake, sleep=waits.append)
    fake.throttle(2, retry_after=3)
    assert api.get("/api/v1/nodes/a")["metadata"]["name"] == "a"
    assert waits == [3.0, 3.0]
    fake.throttle(5, retry_after=1)
    with pytest.raises(TooManyRequests) as caught:
        api.get("/api/v1/nodes/a")
    assert caught.value.retry_after == 1.0
    assert len(waits) == 2 + 3  # max_retries


@pytest.mark.parametrize("prefetch", [0, 2])
def test_unreachable_mid_list(fake: FakeCluster, prefetch: int) -> None:
    fake.add(*(node(f"n{i}") for i in range(6)))
    api = api_for(fake, page_size=2, prefetch=prefetch)
    fake.drop_after(1)
    items = api.list("/api/v1/nodes")
    assert next(items)["metadata"]["name"] == "n0"
    next(items)
    with pytest.raises(Unreachable) as caught:
        next(items)
    assert caught.value.status == 0
    assert str(caught.value).startswith(f"cannot reach the Kubernetes API at {fake.url}")


def test_nothing_listens(tmp_path: Path) -> None:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    configuration.retries = 0
    with pytest.raises(Unreachable) as caught:
        KubeApi(client.ApiClient(configuration)).get("/api/v1/nodes")
    assert "Connection refused" in str(caught.value) or "refused" in str(caught.value).lower()


def test_connect_from_a_kubeconfig(fake: FakeCluster, tmp_path: Path) -> None:
    fake.add(node("a"))
    api = KubeApi.connect(str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    assert api.get("/api/v1/nodes/a")["metadata"]["name"] == "a"
    assert fake.requests[-1].method == "GET"
    with pytest.raises(Unreachable, match="cannot load the kubeconfig"):
        KubeApi.connect(str(tmp_path / "missing"))


def test_a_prefetching_list_closed_early_stops_its_thread(fake: FakeCluster) -> None:
    import threading

    fake.add(*(node(f"n{i:02d}") for i in range(40)))
    api = api_for(fake, page_size=2, prefetch=2)
    items = api.list("/api/v1/nodes")
    assert next(items)["metadata"]["name"] == "n00"
    items.close()
    assert not any(t.name == "kubeapi-pager" and t.is_alive() for t in threading.enumerate())
    assert len(fake.requests_to("/api/v1/nodes")) < 20  # it did not read the whole list
