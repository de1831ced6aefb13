"""The cluster-facts cache against a local HTTP server replaying recorded Kubernetes list and watch
responses (tests/fixtures/kube-api/). kube-apiserver cannot run here; its side of the exchange is
replayed over real HTTP by ``fake_kube_api.FakeKubeApi``, and the ``kubernetes`` client talks to it
unchanged (no function is patched).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PKI, ServerFactory, load_review, wait_for
from fake_kube_api import FakeKubeApi, listed, status, watched
from kube_apiserver import apply_patch, verify_response

from webhook.cluster.cache import ClusterCache, Reflector
from webhook.core.policy import default_policy
from webhook.service.metrics import Metrics


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi().start()
    yield fake
    fake.stop()


def api_client(fake: FakeKubeApi) -> Any:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = fake.url
    return client.ApiClient(configuration)


def restarts(metrics: Metrics, resource: str, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "rocm_isolation_cluster_watch_restarts_total", {"resource": resource, "reason": reason}
    )
    return value or 0.0


def test_namespace_reflector_follows_watches_drops_and_410_gone(api: FakeKubeApi) -> None:
    api.script(
        "namespaces",
        lists=[listed("namespaces-list-1.json"), listed("namespaces-list-2.json"), listed("namespaces-list-3.json")],
        watches=[
            watched("namespaces-watch-1.jsonl", end="close"),  # server-side timeout: resume from the last event
            watched("namespaces-watch-2.jsonl", end="drop"),  # connection cut mid-event: back off, relist
            watched("watch-expired.jsonl", end="close"),  # ERROR 410 event: relist
            status(410, "status-410-gone.json"),  # HTTP 410 on the watch request: relist
            watched("namespaces-watch-3.jsonl", end="close"),  # an event and a bookmark
        ],
    )
    from kubernetes import client

    metrics = Metrics()
    reflector = Reflector(
        "namespaces", client.CoreV1Api(api_client(api)).list_namespace, metrics=metrics, backoff_initial=0.05
    )
    reflector.start()
    try:
        # After the bookmark, the next watch resumes from its resourceVersion and is held open.
        wait_for(
            lambda: any(r.watch and r.query.get("resourceVersion") == "450" for r in api.requests_for("namespaces")),
            what="the watch after the bookmark",
        )
        assert reflector.synced.is_set()
        assert reflector.items == {
            "team-a": {"kubernetes.io/metadata.name": "team-a", "rocm-isolation.io/class": "inference"},
            "team-c": {"kubernetes.io/metadata.name": "team-c"},
            "team-d": {"kubernetes.io/metadata.name": "team-d", "rocm-isolation.io/class": "inference"},
        }
        assert reflector.resource_version == "450"
    finally:
        reflector.stop()

    sequence = [
        ("watch" if r.watch else "list", r.query.get("resourceVersion")) for r in api.requests_for("namespaces")
    ]
    assert sequence == [
        ("list", None),
        ("watch", "100"),
        ("watch", "102"),  # resumed after the clean close, no relist
        ("list", None),  # after the drop
        ("watch", "300"),
        ("list", None),  # after the ERROR 410 event
        ("watch", "400"),
        ("list", None),  # after the HTTP 410
        ("watch", "400"),
        ("watch", "450"),  # resumed from the bookmark
    ]
    for request in api.requests_for("namespaces"):
        if request.watch:
            assert request.query["allowWatchBookmarks"] == "true"
            assert int(request.query["timeoutSeconds"]) > 0
    assert reflector.lists == 4
    assert restarts(metrics, "namespaces", "expired") == 2
    assert restarts(metrics, "namespaces", "error") == 1
    assert restarts(metrics, "namespaces", "closed") >= 2


def test_watch_events_update_the_cache(api: FakeKubeApi) -> None:
    """Events between lists are applied: a label change, an addition, a deletion."""
    api.script(
        "namespaces",
        lists=[listed("namespaces-list-1.json")],
        watches=[watched("namespaces-watch-1.jsonl", end="hold")],
    )
    from kubernetes import client

    reflector = Reflector("namespaces", client.CoreV1Api(api_client(api)).list_namespace)
    reflector.start()
    try:
        wait_for(lambda: "team-c" in reflector.items, what="the ADDED event")
        assert reflector.items["team-b"]["team"] == "x"
        assert reflector.resource_version == "102"
    finally:
        reflector.stop()


def test_list_failures_back_off_and_recover(api: FakeKubeApi) -> None:
    api.script(
        "namespaces",
        lists=[status(500, "status-500.json"), status(500, "status-500.json"), listed("namespaces-list-1.json")],
        watches=[],
    )
    from kubernetes import client

    metrics = Metrics()
    reflector = Reflector(
        "namespaces", client.CoreV1Api(api_client(api)).list_namespace, metrics=metrics, backoff_initial=0.05
    )
    reflector.start()
    try:
        wait_for(reflector.synced.is_set, what="the cache to sync after two failed lists")
        assert set(reflector.items) == {"team-a", "team-b"}
        assert restarts(metrics, "namespaces", "error") == 2
        assert reflector.last_error is None
    finally:
        reflector.stop()


def test_cluster_cache_serves_reserved_nodes_and_namespace_labels(api: FakeKubeApi) -> None:
    api.script("namespaces", lists=[listed("namespaces-list-1.json")], watches=[])
    api.script("nodes", lists=[listed("nodes-list.json")], watches=[watched("nodes-watch.jsonl", end="hold")])
    policy = default_policy()
    cache = ClusterCache(
        api_client(api), reserved_label=policy.spec.reserved_nodes.label, metrics=Metrics(), backoff_initial=0.05
    )
    # Before the first list, nothing is known (not "no labels", not "no reserved nodes").
    assert cache.namespace("team-a").labels is None
    assert cache.nodes(policy).reserved_node_names is None
    cache.start()
    try:
        wait_for(lambda: cache.synced, what="both collections listed")
        assert cache.namespace("team-a").labels == {
            "kubernetes.io/metadata.name": "team-a",
            "rocm-isolation.io/class": "inference",
        }
        assert cache.namespace("not-yet-seen").labels is None
        wait_for(
            lambda: cache.nodes(policy).reserved_node_names == frozenset({"gpu-node-1", "gpu-node-4"}),
            what="node events (gpu-node-2 moved to training, gpu-node-4 added)",
        )
        status_body = cache.status()
        assert status_body["nodes"]["synced"] is True and status_body["namespaces"]["count"] == 2
    finally:
        cache.stop()
    node_requests = api.requests_for("nodes")
    assert all(r.query.get("labelSelector") == "rocm-isolation.io/pool" for r in node_requests)


def test_serve_with_a_kubeconfig_uses_the_cluster_facts(
    api: FakeKubeApi, running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    """The real server started with ``--kubeconfig``: readiness waits for the cache, and reviews use
    the namespace label (class from the label) and the reserved node names (nodeName denial)."""
    api.script("namespaces", lists=[listed("namespaces-list-1.json")], watches=[])
    api.script("nodes", lists=[listed("nodes-list.json")], watches=[])
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, cluster=True, args=["--kubeconfig", str(kubeconfig)])

    def ready() -> bool:
        code, _ = server.get_json("/readyz")
        return code == 200

    wait_for(ready, what="readiness after the cluster cache synced")
    _, body = server.get_json("/readyz")
    assert body["checks"]["cluster"]["namespaces"]["synced"] is True

    # team-a is labelled rocm-isolation.io/class=inference in the recorded list.
    review = load_review("inference-pod-create.json")
    review["request"]["namespace"] = "team-a"
    review["request"]["object"]["metadata"]["namespace"] = "team-a"
    with server.client() as client:
        status_code, reply = client.post_review(review)
        assert status_code == 200
        response = verify_response(review, reply)
        pod = apply_patch(review["request"]["object"], response)
        assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == "inference"
        assert not any("unknown" in warning for warning in response.get("warnings", []))

        # A training pod pinned to a reserved node by name is denied: the node is known to be reserved.
        training = load_review("training-pod-create.json")
        training["request"]["object"]["spec"]["nodeName"] = "gpu-node-1"
        status_code, reply = client.post_review(training)
        denied = verify_response(training, reply)
        assert denied["allowed"] is False and denied["status"]["code"] == 403
        assert "gpu-node-1" in denied["status"]["message"]


def test_readiness_waits_for_the_cluster(
    api: FakeKubeApi, running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    """The cluster answers 500 to every list: reviews are still answered, /readyz says what is missing."""
    api.script("namespaces", lists=[status(500, "status-500.json")], watches=[])
    api.script("nodes", lists=[status(500, "status-500.json")], watches=[])
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, cluster=True, args=["--kubeconfig", str(kubeconfig)])
    code, body = server.get_json("/readyz")
    assert code == 503
    assert body["missing"] == ["cluster"]
    assert body["checks"]["cluster"]["namespaces"]["synced"] is False
    review = load_review("training-pod-create.json")
    with server.client() as client:
        status_code, reply = client.post_review(review)
    assert status_code == 200
    assert verify_response(review, reply)["allowed"] is True


CLAIMS_V1 = "resource.k8s.io/v1/resourceclaims"
TEMPLATES_V1 = "resource.k8s.io/v1/resourceclaimtemplates"


def _empty_core(api: FakeKubeApi) -> None:
    api.script("namespaces", lists=[listed("namespaces-list-1.json")], watches=[])
    api.script("nodes", lists=[listed("nodes-list.json")], watches=[])


def test_cluster_cache_resolves_dra_claims_and_follows_their_watch(api: FakeKubeApi) -> None:
    _empty_core(api)
    api.script(CLAIMS_V1, lists=[listed("resourceclaims-v1-list.json")], watches=[])
    api.script(
        TEMPLATES_V1,
        lists=[listed("resourceclaimtemplates-v1-list.json")],
        watches=[watched("resourceclaimtemplates-v1-watch.jsonl", end="hold")],
    )
    cache = ClusterCache(
        api_client(api), reserved_label=default_policy().spec.reserved_nodes.label, backoff_initial=0.05
    )
    # Before the lists, every claim is unresolvable (the engine counts it as a GPU request).
    assert dict(cache.claims("research").templates) == {}
    cache.start()
    try:
        wait_for(lambda: cache.synced, what="all collections listed")
        facts = cache.claims("research")
        assert facts.claims["shared-gpus"] == frozenset({"gpu.amd.com"})
        assert facts.templates["mi300x"] == frozenset({"gpu.amd.com"})
        # firstAvailable alternatives: every class named counts.
        assert cache.claims("serving").templates["gpu-or-partition"] == frozenset({"gpu.amd.com", "rdma.example.com"})
        assert dict(cache.claims("elsewhere").claims) == {}
        wait_for(lambda: "mi355x" in cache.claims("research").templates, what="the ADDED template")
        wait_for(lambda: "rdma-nic" not in cache.claims("research").templates, what="the DELETED template")
        assert cache.status()["resourceclaimtemplates"]["count"] == 3  # mi300x, mi355x, gpu-or-partition
    finally:
        cache.stop()
    paths = {r.path for r in api.requests if r.collection in ("resourceclaims", "resourceclaimtemplates")}
    assert paths == {"/apis/resource.k8s.io/v1/resourceclaims", "/apis/resource.k8s.io/v1/resourceclaimtemplates"}


def test_cluster_cache_falls_back_to_the_dra_version_the_cluster_serves(api: FakeKubeApi) -> None:
    """A cluster serving only resource.k8s.io/v1beta1 (Kubernetes 1.32/1.33): v1 and v1beta2 answer 404."""
    _empty_core(api)
    api.script("resource.k8s.io/v1beta1/resourceclaims", lists=[listed("resourceclaims-v1-list.json")], watches=[])
    api.script(
        "resource.k8s.io/v1beta1/resourceclaimtemplates",
        lists=[listed("resourceclaimtemplates-v1beta1-list.json")],
        watches=[],
    )
    cache = ClusterCache(
        api_client(api), reserved_label=default_policy().spec.reserved_nodes.label, backoff_initial=0.05
    )
    cache.start()
    try:
        wait_for(lambda: cache.synced, what="all collections listed")
        # v1beta1's flat deviceClassName is read as well.
        assert cache.claims("research").templates["mi300x"] == frozenset({"gpu.amd.com"})
    finally:
        cache.stop()
    tried = [r.path for r in api.requests if r.collection == "resourceclaimtemplates" and not r.watch]
    assert tried[:3] == [
        "/apis/resource.k8s.io/v1/resourceclaimtemplates",
        "/apis/resource.k8s.io/v1beta2/resourceclaimtemplates",
        "/apis/resource.k8s.io/v1beta1/resourceclaimtemplates",
    ]
    assert all(
        r.path.startswith("/apis/resource.k8s.io/v1beta1/") for r in api.requests if r.watch and "resource" in r.path
    )


def test_a_cluster_without_dra_is_synced_and_every_claim_stays_unresolvable(api: FakeKubeApi) -> None:
    _empty_core(api)
    cache = ClusterCache(
        api_client(api), reserved_label=default_policy().spec.reserved_nodes.label, backoff_initial=0.05
    )
    cache.start()
    try:
        wait_for(lambda: cache.synced, what="all collections listed or found not served")
        assert cache.status()["resourceclaims"]["served"] is False
        assert dict(cache.claims("research").claims) == {}
    finally:
        cache.stop()


def test_serve_resolves_dra_claims_from_the_cluster(
    api: FakeKubeApi, running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    """Through the real HTTPS server with ``--kubeconfig``: a training pod whose claim template asks for
    gpu.amd.com and that selects the reserved pool is denied; the same pod with a NIC claim is not a
    GPU pod; a claim the cache does not know counts as a GPU request, with a warning."""
    api.script("namespaces", lists=[listed("namespaces-list-1.json")], watches=[])
    api.script("nodes", lists=[listed("nodes-list.json")], watches=[])
    api.script(CLAIMS_V1, lists=[listed("resourceclaims-v1-list.json")], watches=[])
    api.script(TEMPLATES_V1, lists=[listed("resourceclaimtemplates-v1-list.json")], watches=[])
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, cluster=True, args=["--kubeconfig", str(kubeconfig)])
    wait_for(lambda: server.get_json("/readyz")[0] == 200, what="readiness after the cluster cache synced")

    def review(template: str) -> dict[str, Any]:
        body = load_review("training-pod-create.json")
        pod = body["request"]["object"]
        body["request"]["namespace"] = pod["metadata"]["namespace"] = "research"
        pod["spec"]["nodeSelector"] = {"rocm-isolation.io/pool": "inference"}
        pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
        for container in pod["spec"]["containers"]:
            container["resources"] = {"claims": [{"name": "dev"}]}
        return body

    with server.client() as client:
        sent = review("mi300x")
        denied = verify_response(sent, client.post_review(sent)[1])
        assert denied["allowed"] is False and denied["status"]["code"] == 403
        assert "spec.nodeSelector" in denied["status"]["message"]

        sent = review("rdma-nic")
        nic = verify_response(sent, client.post_review(sent)[1])
        assert nic["allowed"] is True and "patch" not in nic

        sent = review("made-a-moment-ago")
        unknown = verify_response(sent, client.post_review(sent)[1])
        assert unknown["allowed"] is False
        assert any("could not be resolved" in w for w in unknown.get("warnings", []))
