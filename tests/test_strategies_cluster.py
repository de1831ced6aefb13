"""The random clusters of ``strategies.random_clusters`` (the capacity model's property test reads them) are
consistent: every bound pod on a node that exists, every claim allocated devices its node's slices publish
and reserved for pods bound there, no device allocated twice, one AutoPartition layout per GPU and one memory
mode per node, a device-plugin node's requests within its allocatable; each kind of node and device it
promises does come up; the objects pass the Kubernetes schema."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import cluster_objects as co
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from strategies import CLUSTER_NAMESPACES, CONFLICT_TAINT, RandomCluster, random_clusters

from webhook.core.policy import default_policy


def published(cluster: RandomCluster) -> dict[str, dict[str, dict[str, Any]]]:
    """Node -> device name -> device, from the node's slices of AMD's driver."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for obj in cluster.slices:
        spec = obj["spec"]
        assert spec["driver"] == co.DRIVER and spec["pool"]["name"] == spec["nodeName"]
        for device in spec.get("devices", []):
            out.setdefault(spec["nodeName"], {})[device["name"]] = device
    return out


def allocations(cluster: RandomCluster) -> Counter[tuple[str, str]]:
    return Counter(
        (result["pool"], result["device"])
        for claim in cluster.claims
        for result in claim["status"]["allocation"]["devices"]["results"]
    )


def gpu_requests(pod: dict[str, Any]) -> int:
    return sum(
        int((c.get("resources") or {}).get("requests", {}).get("amd.com/gpu", 0)) for c in pod["spec"]["containers"]
    )


def check(cluster: RandomCluster, *, shared_devices: bool = False) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.nodes}
    assert len(nodes) == len(cluster.nodes)
    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in cluster.pods}
    assert len(pods) == len(cluster.pods)
    devices = published(cluster)
    for pod in cluster.pods:
        assert pod["metadata"]["namespace"] in CLUSTER_NAMESPACES
        bound = pod["spec"].get("nodeName")
        assert bound is None or bound in nodes, bound
        assert (pod["status"]["phase"] == "Pending") == (bound is None)
    for claim in cluster.claims:
        ns = claim["metadata"]["namespace"]
        results = claim["status"]["allocation"]["devices"]["results"]
        assert results
        for result in results:
            assert result["driver"] == co.DRIVER and result["device"] in devices[result["pool"]], result
        (holder,) = claim["status"]["reservedFor"]
        pod = pods[(ns, holder["name"])]
        assert holder["uid"] == pod["metadata"]["uid"]
        assert {r["pool"] for r in results} == {pod["spec"]["nodeName"]}
        # The pod names the claim, or asks for the DRA extended resource the scheduler made it for.
        named = [c.get("resourceClaimName") for c in pod["spec"].get("resourceClaims", [])]
        made = pod["status"].get("extendedResourceClaimStatus", {}).get("resourceClaimName")
        assert claim["metadata"]["name"] in [*named, made]
        if made:
            assert gpu_requests(pod) == len(results)
    taken = allocations(cluster)
    if not shared_devices:
        assert set(taken.values()) <= {1}, taken
    for (node_name, name), times in taken.items():
        device = devices[node_name][name]
        assert times == 1 or device.get("allowMultipleAllocations"), (node_name, name)
    for node_name, node_devices in devices.items():
        # AutoPartition: one layout per GPU (its counter set's capacity), one memory mode per node; the devices
        # of the other memory mode carry the driver's conflict taint.
        layouts = {n for (pool, n) in taken if pool == node_name and "consumesCounters" in node_devices[n]}
        counter_sets = Counter(node_devices[n]["consumesCounters"][0]["counterSet"] for n in layouts)
        assert set(counter_sets.values()) <= {1}, layouts
        modes = {n.rsplit("-", 1)[1] for n in layouts}
        assert len(modes) <= 1, modes
        for name, device in node_devices.items():
            other_mode = bool(modes) and "consumesCounters" in device and name.rsplit("-", 1)[1] not in modes
            assert (CONFLICT_TAINT in device.get("taints", [])) == other_mode, (node_name, name)
    for name, node in nodes.items():
        plugin = node["status"]["allocatable"].get("amd.com/gpu")
        assert node["status"]["capacity"].get("amd.com/gpu") == plugin
        assert (plugin is None) == (name in devices or name.startswith(("dra", "split", "autopartition")))
        if plugin is not None:
            requested = sum(gpu_requests(p) for p in cluster.pods if p["spec"].get("nodeName") == name)
            assert requested <= int(plugin), name
        if name.startswith("whole"):
            assert node["metadata"]["labels"][co.POOL_LABEL] == "inference" and node["spec"]["taints"] == [
                co.RESERVED_TAINT
            ]
        split = node["metadata"]["labels"].get(co.POOL_LABEL) == "inference-devices"
        if not name.startswith("autopartition"):  # split or not
            assert split == name.startswith("split"), name
    class_names = {c["metadata"]["name"] for c in cluster.device_classes}
    assert co.DRIVER in class_names
    assert ({co.RESERVED_CLASS, co.SHARED_CLASS} <= class_names) == any(
        n["metadata"]["labels"].get(co.POOL_LABEL) == "inference-devices" for n in cluster.nodes
    )
    assert cluster.policy is default_policy()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_clusters())
def test_random_clusters_are_consistent(cluster: RandomCluster) -> None:
    check(cluster)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_clusters(shared_devices=True))
def test_shared_autopartition_devices_stay_on_one_layout_per_gpu(cluster: RandomCluster) -> None:
    check(cluster, shared_devices=True)


def _devices(cluster: RandomCluster) -> list[dict[str, Any]]:
    return [d for s in cluster.slices for d in s["spec"].get("devices", [])]


WANTED: dict[str, Callable[[RandomCluster], bool]] = {
    "a node of every kind": lambda c: (
        {n["metadata"]["name"].split("-")[0] for n in c.nodes} >= {"whole", "shared", "dra", "split", "autopartition"}
    ),
    "a DRA node with 8 GPUs": lambda c: any(
        len({d["name"].split("-")[1] for d in s["spec"].get("devices", [])}) == 8 for s in c.slices
    ),
    "a device without a PCI bus ID": lambda c: any(co.PCI_BUS_ID not in d["attributes"] for d in _devices(c)),
    "partitions sharing a PCI bus ID": lambda c: any(
        d["attributes"]["type"]["string"] == "amdgpu-partition" and "consumesCounters" not in d for d in _devices(c)
    ),
    "an allocated AutoPartition layout": lambda c: any(
        r["device"].endswith("-nps4") for cl in c.claims for r in cl["status"]["allocation"]["devices"]["results"]
    ),
    "a tainted device": lambda c: any("taints" in d for d in _devices(c)),
    "an extended-resource claim": lambda c: any("extendedResourceClaimStatus" in p["status"] for p in c.pods),
    "pods of all three classes holding claims": lambda c: (
        {cl["metadata"]["namespace"] for cl in c.claims} == set(CLUSTER_NAMESPACES)
    ),
    "a pending pod": lambda c: any("nodeName" not in p["spec"] for p in c.pods),
    "a device-plugin pod": lambda c: any(
        gpu_requests(p) and "resourceClaims" not in p["spec"] and "extendedResourceClaimStatus" not in p["status"]
        for p in c.pods
        if p["spec"].get("nodeName", "").startswith(("whole", "shared"))
    ),
}


@pytest.mark.parametrize("what", list(WANTED))
def test_the_strategy_reaches(what: str) -> None:
    found = find(
        random_clusters(),
        WANTED[what],
        settings=settings(max_examples=2000, deadline=None, database=None, phases=[Phase.generate]),
    )
    assert WANTED[what](found)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_clusters())
def test_the_objects_pass_the_kubernetes_schema(cluster: RandomCluster) -> None:
    for obj in [*cluster.nodes, *cluster.namespaces, *cluster.pods, *cluster.claims, *cluster.device_classes]:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    for obj in cluster.slices:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


# --- the builders it uses ------------------------------------------------------------------------------


def test_autopartition_slices_publish_counters_apart_and_every_layout_of_every_gpu() -> None:
    counters, devices = co.autopartition_slices("n", ["0000:03:00.0", None])
    assert (
        counters["spec"]["pool"] == devices["spec"]["pool"] == {"name": "n", "generation": 1, "resourceSliceCount": 2}
    )
    assert "devices" not in counters["spec"]
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["gpu-0-mutex", "gpu-1-mutex"]
    names = [d["name"] for d in devices["spec"]["devices"]]
    assert names == [f"gpu-{i}-{layout}" for i in (0, 1) for layout in ("spx-nps1", "dpx-nps2", "cpx-nps1", "cpx-nps4")]
    first, last = devices["spec"]["devices"][0], devices["spec"]["devices"][-1]
    assert (
        first["attributes"][co.PCI_BUS_ID] == {"string": "0000:03:00.0"}
        and first["attributes"]["type"]["string"] == "amdgpu"
    )
    assert co.PCI_BUS_ID not in last["attributes"] and last["attributes"]["type"]["string"] == "amdgpu-partition"
    assert last["consumesCounters"] == [{"counterSet": "gpu-1-mutex", "counters": {"partition-mode": {"value": "1"}}}]
    assert last["capacity"] == {"partitions": {"value": "8"}}
    for obj in (counters, devices):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_the_policy_builder_merges_overrides_into_the_shipped_default() -> None:
    assert co.policy() is default_policy()
    changed = co.policy({"spec": {"mode": "audit", "excludedNamespaces": ["kube-system"]}})
    assert changed.spec.mode == "audit" and changed.spec.excluded_namespaces == ["kube-system"]
    assert changed.spec.classes == default_policy().spec.classes
    assert changed.spec.reserved_devices == default_policy().spec.reserved_devices
