"""The Lease holder's watched view (webhook/cluster/view.py) against a stateful fake API over real HTTP
(tests/fake_cluster.py: paginated lists, selectors, discovery; its watches stay open without events). What
the view must give: the capacity model ``pool`` and ``audit`` build from the apiserver, from memory, with no
request per round; nothing answered and nothing written before it is synced. Faked here because a real
apiserver will not do it on demand: a continue token expiring in the middle of the view's first list (410).
On the real control plane: tests/e2e/test_e2e_device_lending.py (the keeper as serve runs it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from audit_cluster import populate, populate_devices
from cluster_objects import pod
from conftest import wait_for
from fake_cluster import FakeCluster

from webhook.cluster import discovery
from webhook.cluster.kubeapi import KubeApi
from webhook.cluster.view import ACTIVE_PODS, ClusterView, FrozenView, NotSynced, ViewApi
from webhook.core.policy import Policy, default_policy, parse_policy
from webhook.deploy import minors
from webhook.ops.pool.read import read_cluster, read_dra
from webhook.service.lending_loop import LendingKeeper


def lending_policy() -> Policy:
    document = default_policy().document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["lending"] = {"enabled": True}
    return parse_policy(yaml.safe_dump(document))


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster().start()
    cluster.serve_discovery()
    populate(cluster)
    populate_devices(cluster)
    # A cluster's non-GPU majority: never in the view.
    cluster.add(*(pod(f"web-{i}", "kube-system", node="s1", gpus={}, labels={"app": "web"}, env=[]) for i in range(30)))
    yield cluster
    cluster.stop()


def synced_view(fake: FakeCluster, policy: Policy, **kwargs: Any) -> ClusterView:
    view = ClusterView(fake.api_client(), lambda: policy, **kwargs)
    view.start()
    wait_for(lambda: view.synced, what="the view synced")
    return view


def comparable(cluster: Any) -> Any:
    return dataclasses.replace(cluster, gpu_by_result=dict(cluster.gpu_by_result))


def test_the_view_gives_the_capacity_model_the_apiserver_gives_with_no_request(fake: FakeCluster) -> None:
    policy = default_policy()
    direct = KubeApi(fake.api_client())
    received: dict[tuple[str, str], int] = {}

    def count(resource: str, how: str, size: int) -> None:
        received[(resource, how)] = received.get((resource, how), 0) + size

    view = synced_view(fake, policy, page_size=7, on_bytes=count)  # several pages per collection
    assert received[("pods", "list")] > received[("namespaces", "list")] > 0  # what serve's metric counts
    try:
        api = view.api(direct)
        before = len(fake.requests)
        from_view = read_cluster(api, policy)
        dra_view = read_dra(api, policy, claims=True, required=False)
        assert len(fake.requests) == before, [r.path for r in fake.requests[before:]]
        assert api.passed_through == 0
        from_api = read_cluster(direct, policy)
        dra_api = read_dra(direct, policy, claims=True, required=False)
        assert comparable(from_view) == comparable(from_api)
        assert from_view.pods, "the fixture has GPU pods"
        assert (dra_view.version, dra_view.classes, dra_view.published) == (
            dra_api.version,
            dra_api.classes,
            dra_api.published,
        )
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c.get("status") for c in dra_api.claims}
        assert {(c["metadata"]["namespace"], c["metadata"]["name"]): c.get("status") for c in dra_view.claims} == {
            key: {k: v for k, v in (status or {}).items() if k in ("allocation", "reservedFor")} or None
            for key, status in claims.items()
        }
        assert dra_view.rule_versions == dra_api.rule_versions and dra_view.server_version == dra_api.server_version
        # The non-GPU pods are not held.
        held = view.status()["collections"]["pods"]["count"]
        active = len(list(direct.list("/api/v1/pods", field_selector=ACTIVE_PODS)))
        assert held <= active - 30
    finally:
        view.stop()
    assert view.status()["collections"] == {} and not view.synced


def test_selectors_are_the_apiservers(fake: FakeCluster) -> None:
    policy = default_policy()
    direct = KubeApi(fake.api_client())
    view = synced_view(fake, policy)
    try:
        api = view.api(direct)
        for selector in ("rocm-isolation.io/pool=inference", "rocm-isolation.io/pool", "!rocm-isolation.io/pool"):
            names = sorted(n["metadata"]["name"] for n in api.list("/api/v1/nodes", label_selector=selector))
            expected = sorted(n["metadata"]["name"] for n in direct.list("/api/v1/nodes", label_selector=selector))
            assert names == expected, selector
        one_node = f"{ACTIVE_PODS},spec.nodeName=d1"
        assert sorted(p["metadata"]["name"] for p in api.list("/api/v1/pods", field_selector=one_node)) == sorted(
            p["metadata"]["name"]
            for p in direct.list("/api/v1/pods", field_selector=one_node)
            if p["metadata"]["name"] in {"llm-a", "trainer-ok", "trainer-stray", "gpu-check"}
        )
        with pytest.raises(ValueError, match="active pods only"):
            list(api.list("/api/v1/pods"))
        assert api.get("/apis/resource.k8s.io/v1/deviceclasses/rocm-isolation-reserved")["metadata"]["name"] == (
            "rocm-isolation-reserved"
        )
    finally:
        view.stop()


def test_a_continue_token_expiring_mid_list_lists_again_from_the_start(fake: FakeCluster) -> None:
    fake.expire_after(2)  # the third page's token is past the compaction: 410 Expired
    view = synced_view(fake, default_policy(), page_size=3)
    try:
        nodes = view.reflector("/api/v1/nodes")
        assert nodes is not None
        direct = KubeApi(fake.api_client())
        assert sorted(nodes.items) == sorted(n["metadata"]["name"] for n in direct.list("/api/v1/nodes"))
        lists = [r for r in fake.requests if r.path.startswith("/api") and "watch" not in r.query]
        gone = [i for i, r in enumerate(lists) if r.status == 410]
        assert gone, "a continue token expired mid-list"
        # The same collection listed again from its first page, and its result complete (above).
        after = lists[gone[0] + 1 :]
        assert any(r.path == lists[gone[0]].path and "continue" not in r.query for r in after)
    finally:
        view.stop()


def test_nothing_is_read_or_written_before_the_view_is_synced(fake: FakeCluster) -> None:
    policy = lending_policy()
    direct = KubeApi(fake.api_client())
    view = ClusterView(fake.api_client(), lambda: policy)
    api = view.api(direct)
    with pytest.raises(NotSynced):
        list(api.list("/api/v1/nodes"))
    with pytest.raises(NotSynced):
        api.patch("/api/v1/nodes/r1", {"metadata": {"labels": {"x": "y"}}})
    keeper = LendingKeeper(api, lambda: policy, lambda: True, view=view)
    writes = len([r for r in fake.requests if r.method != "GET"])
    fake.drop_after(0)  # the apiserver goes away: the view cannot list, the round decides nothing
    observed = keeper.tick()
    assert observed.synced is False and observed.written == () and observed.seconds is None
    assert len([r for r in fake.requests if r.method != "GET"]) == writes
    view.stop()


def test_the_keeper_starts_its_view_with_the_lease_and_stops_it_without(fake: FakeCluster) -> None:
    policy = lending_policy()
    leading = [True]
    view = ClusterView(fake.api_client(), lambda: policy)
    keeper = LendingKeeper(view.api(KubeApi(fake.api_client())), lambda: policy, lambda: leading[0], view=view)
    first = keeper.tick()  # starts the view: not synced yet on its first round
    assert view.started
    wait_for(lambda: view.synced, what="the view synced")
    before = len(fake.requests)
    for _ in range(3):
        observed = keeper.tick()
        assert observed.synced and observed.seconds is not None
    assert [r.path for r in fake.requests[before:] if r.method == "GET"] == [], "rounds read memory only"
    assert first.synced in (False, True)
    leading[0] = False
    assert keeper.tick().synced is False
    assert not view.started and view.status()["collections"] == {}


def test_a_policy_reload_lists_pods_and_slices_again(fake: FakeCluster) -> None:
    policy = default_policy()
    current = [policy]
    view = ClusterView(fake.api_client(), lambda: current[0])
    view.start()
    try:
        wait_for(lambda: view.synced, what="the view synced")
        pods = view.reflector("/api/v1/pods")
        nodes = view.reflector("/api/v1/nodes")
        assert pods is not None and nodes is not None
        lists = (pods.lists, nodes.lists)
        current[0] = lending_policy()
        view.follow(current[0])
        wait_for(lambda: view.synced and pods.lists == lists[0] + 1, what="pods listed again")
        assert nodes.lists == lists[1]
        assert view.reflector("/api/v1/pods") is pods  # the same reflector, listed again
    finally:
        view.stop()


def test_view_api_is_a_kube_api() -> None:
    assert issubclass(ViewApi, KubeApi)


def test_the_keepers_memo_reads_unchanged_pods_once_and_decides_again_when_their_facts_change(
    fake: FakeCluster,
) -> None:
    from webhook.ops.pool import read as pool_read

    policy = default_policy()
    view = synced_view(fake, policy)
    try:
        api = view.api(KubeApi(fake.api_client()))
        memo = pool_read.PodMemo()
        plain = read_cluster(api, policy)
        decided: list[str] = []
        original = pool_read.classify

        def counting(raw: Any, snapshot: Any, policy: Policy) -> str:
            decided.append(raw["metadata"]["name"])
            return original(raw, snapshot, policy)

        pool_read.classify = counting  # type: ignore[assignment]
        try:
            assert comparable(read_cluster(api, policy, memo)) == comparable(plain)
            first = len(decided)
            assert first > 0
            assert comparable(read_cluster(api, policy, memo)) == comparable(plain)
            assert len(decided) == first, "unchanged pods are not decided again"
            # The watch brings a new label on namespace ml: its pods are decided again, the others not.
            namespaces = view.reflector("/api/v1/namespaces")
            assert namespaces is not None
            ml = namespaces.items["ml"]
            namespaces.items["ml"] = {
                **ml,
                "metadata": {**ml["metadata"], "labels": {"rocm-isolation.io/class": "inference"}},
            }
            changed = read_cluster(api, policy, memo)
            again = decided[first:]
            pods = view.reflector("/api/v1/pods")
            assert pods is not None
            assert again and set(again) <= set(pods.items["ml"])
            assert {p.class_name for p in changed.pods if p.namespace == "ml"} != {
                p.class_name for p in plain.pods if p.namespace == "ml"
            }
        finally:
            pool_read.classify = original  # type: ignore[assignment]
    finally:
        view.stop()


@pytest.mark.parametrize("minor", ["1.35", "1.36"])
def test_the_view_and_its_dump_answer_the_discovery_that_tells_the_minor_with_no_request(
    tmp_path: Path, minor: str
) -> None:
    """The admissionregistration.k8s.io and resource.k8s.io discovery that ``deploy/minors.from_cluster`` reads is
    held: ``audit`` on the view (serve's background audit, on its dump) knows the minor without a request."""
    cluster = FakeCluster().start()
    try:
        cluster.serve_discovery(minor=minor)
        direct = KubeApi(cluster.api_client())
        expected = discovery.discovery(direct, minors.DISCOVERED)
        served = minors.from_cluster(expected, None)
        assert served is not None and served.minor == minor
        view = synced_view(cluster, default_policy())
        try:
            assert view.dump(tmp_path / "view.json")
            for api in (view.api(direct), FrozenView.load(tmp_path / "view.json").api(direct)):
                before = len(cluster.requests)
                assert discovery.discovery(api, minors.DISCOVERED) == expected
                assert len(cluster.requests) == before, [r.path for r in cluster.requests[before:]]
                assert api.passed_through == 0
        finally:
            view.stop()
    finally:
        cluster.stop()


def test_a_view_whose_discovery_failed_is_not_synced_until_it_succeeds_then_watches_dra(fake: FakeCluster) -> None:
    fake.drop_after(0)  # the apiserver is gone when the view starts: no discovery, no list
    view = ClusterView(fake.api_client(), lambda: default_policy(), resync_seconds=3600)
    view.start()
    try:
        assert not view.discovered and not view.synced
        assert view.reflector("/apis/resource.k8s.io/v1/resourceslices") is None
        fake._drop_after = None  # back
        view.refresh_discovery()  # the next round
        assert view.discovered
        wait_for(lambda: view.synced, what="the view synced, DRA collections included")
        slices = view.reflector("/apis/resource.k8s.io/v1/resourceslices")
        assert slices is not None and slices.count > 0
    finally:
        view.stop()
    assert not view.discovered
