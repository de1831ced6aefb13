"""Scenario 3: Dynamic Resource Allocation with AMD's DeviceClass ``gpu.amd.com`` and the
ResourceSlices its driver publishes (one pool per node, named after it). The resourceclaim
controller turns ResourceClaimTemplates into claims, the scheduler's allocator picks the devices,
and the webhook's placement decides from which pools."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cluster_objects import exactly, new_claim, new_claim_pod, new_claim_template

from webhook.core.policy import default_policy
from webhook.service.auditloop import LEASE_NAME

from .harness import (
    DRIVER,
    GPUS_PER_NODE,
    MI300X_LABELS,
    POOL_NODES,
    WEBHOOK_DENIAL,
    WEBHOOK_NAMESPACE,
    Cluster,
    make_node,
    resource_slice,
)
from .kube import ApiError, Obj, wait_until

pytestmark = pytest.mark.minors("1.34", "1.35")  # DRA is served from 1.34 (issue 47)


def one_gpu(device_class: str = DRIVER) -> Obj:
    """A request for one device of ``device_class`` (no count: the apiserver defaults it)."""
    return exactly(device_class, count=None)


def dra_pod(ns: str, name: str, *, app: str | None = None, **spec: Any) -> Obj:
    """A pod labelled ``app: <app or name>`` using one claim (``claim_name``) or template (``template``)."""
    return new_claim_pod(name, ns, labels={"app": app or name}, **spec)


def allocated_pools(cluster: Cluster, ns: str, pod_name: str) -> tuple[str, list[Obj]]:
    """The pod's node and its claims' allocation results, once the scheduler bound it."""

    def bound() -> Obj | None:
        pod = cluster.kube.get("Pod", pod_name, ns)
        return pod if pod["spec"].get("nodeName") and pod.get("status", {}).get("resourceClaimStatuses") else None

    pod = wait_until(bound, timeout=90, what=f"{ns}/{pod_name} bound with its claims")
    results = []
    for status in pod["status"]["resourceClaimStatuses"]:
        live = cluster.kube.get("ResourceClaim", status["resourceClaimName"], ns)
        name = status["resourceClaimName"]

        def allocated(name: str = name) -> Obj | None:
            result: Obj | None = cluster.kube.get("ResourceClaim", name, ns).get("status", {}).get("allocation")
            return result

        allocation = wait_until(
            allocated,
            timeout=30,
            what="the claim's allocation",
        )
        assert live["metadata"]["ownerReferences"][0]["name"] == pod_name  # made by the controller
        results += allocation["devices"]["results"]
    return pod["spec"]["nodeName"], results


@pytest.mark.parametrize("workload_class", ["inference", "training"])
def test_claims_from_templates_are_allocated_from_the_right_pools(
    cluster: Cluster, namespace: Callable[..., str], workload_class: str
) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": workload_class})
    cluster.kube.create(new_claim_template("mi300x", ns, one_gpu()))
    allowed = set(cluster.reserved) if workload_class == "inference" else set(cluster.shared) | set(POOL_NODES)
    names = [f"{workload_class}-{i}" for i in range(len(cluster.reserved))]
    for name in names:
        # One app: the replicas' spread constraint counts each other.
        pod = cluster.kube.create(dra_pod(ns, name, template="mi300x", app=f"dra-{workload_class}"))
        assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == workload_class
    nodes = []
    for name in names:
        node, results = allocated_pools(cluster, ns, name)
        nodes.append(node)
        assert node in allowed, (node, allowed)
        assert results, "no device allocated"
        for result in results:
            assert result["driver"] == DRIVER
            # AMD's driver names its pool after the node: the device is on the pod's own node.
            assert result["pool"] == node, result
    if workload_class == "inference":
        assert sorted(nodes) == sorted(cluster.reserved)  # spread over the reserved pool


def test_dra_training_pods_aimed_at_reserved_nodes_are_denied(cluster: Cluster, namespace: Callable[..., str]) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    cluster.kube.create(new_claim_template("mi300x", ns, one_gpu()))
    attempts = {
        "nodeSelector": dra_pod(
            ns, "selector", template="mi300x", nodeSelector={"rocm-isolation.io/pool": "inference"}
        ),
        "nodeName": dra_pod(ns, "named", template="mi300x", nodeName=cluster.reserved[0]),
        "toleration": dra_pod(
            ns,
            "tolerating",
            template="mi300x",
            tolerations=[{"key": "rocm-isolation.io/reserved", "operator": "Exists"}],
        ),
    }
    for what, pod in attempts.items():
        with pytest.raises(ApiError) as denied:
            cluster.kube.create(pod)
        assert WEBHOOK_DENIAL in denied.value.message, (what, denied.value)
    assert cluster.pods(ns) == []
    # No claim was made for a pod that was never created.
    assert cluster.kube.list("ResourceClaim", ns) == []


def test_a_claim_that_does_not_exist_yet_counts_as_a_gpu(cluster: Cluster, namespace: Callable[..., str]) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    pod = cluster.kube.create(dra_pod(ns, "early", claim_name="later"))
    warnings = cluster.kube.last_warnings
    assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == "training"
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert all(
        {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in t["matchExpressions"]
        for t in terms
    )
    assert any("later" in w for w in warnings), warnings
    # Nothing to allocate yet: the pod waits. Once the claim exists it is allocated off the reserved pool.
    assert not cluster.kube.get("Pod", "early", ns)["spec"].get("nodeName")
    cluster.kube.create(new_claim("later", ns, one_gpu()))
    node = wait_until(
        lambda: cluster.kube.get("Pod", "early", ns)["spec"].get("nodeName"), timeout=90, what="the pod bound"
    )
    assert node not in cluster.reserved
    allocation = wait_until(
        lambda: cluster.kube.get("ResourceClaim", "later", ns).get("status", {}).get("allocation"),
        timeout=30,
        what="the claim allocated",
    )
    assert {r["pool"] for r in allocation["devices"]["results"]} == {node}


def test_a_claim_of_another_driver_is_not_a_gpu(cluster: Cluster, namespace: Callable[..., str]) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    cluster.kube.create(new_claim_template("nic", ns, one_gpu("nic.example.com")))

    def resolved() -> Obj | None:
        pod = cluster.kube.create(dra_pod(ns, "nic-user", template="nic"), dry_run=True)
        return pod if "rocm-isolation.io/class" not in (pod["metadata"].get("annotations") or {}) else None

    pod = wait_until(resolved, timeout=30, what="the webhook to resolve the template")
    assert not (pod["spec"].get("affinity") or {}).get("nodeAffinity")


DRA_ONLY = "dra-only-1"
# The reserved pool's label and taint, as the shipped policy (and so pool apply) sets them.
RESERVED = default_policy().spec.reserved_nodes


@pytest.fixture
def dra_only_node(cluster: Cluster) -> Iterator[str]:
    """A reserved node that runs AMD's DRA driver and no device plugin: no ``amd.com/gpu`` in its
    allocatable, its 8 GPUs in a ResourceSlice. Deleted after, with its slice."""
    assert RESERVED.taint is not None
    make_node(cluster.kube, DRA_ONLY, {**MI300X_LABELS, **dict([RESERVED.label])}, gpus=0)
    cluster.kube.patch("Node", DRA_ONLY, {"spec": {"taints": [RESERVED.taint.model_dump()]}})
    cluster.kube.apply(resource_slice(DRA_ONLY, "AMD_Instinct_MI300X_OAM", "74a1"))
    try:
        yield DRA_ONLY
    finally:
        cluster.kube.delete("ResourceSlice", resource_slice(DRA_ONLY, "", "")["metadata"]["name"])
        cluster.kube.delete("Node", DRA_ONLY)


def _reserved_capacity(cluster: Cluster) -> tuple[dict[str, object], set[str]]:
    result = cluster.cli("audit", "-o", "json")
    assert result.returncode in (0, 1), result.stdout + result.stderr
    doc = json.loads(result.stdout)
    without_gpus = {f["name"] for f in doc["findings"] if f["rule"] == "reserved-node-without-gpus"}
    return doc["capacity"]["reserved"], without_gpus


def test_gpus_published_and_allocated_by_dra_are_capacity(
    cluster: Cluster, namespace: Callable[..., str], dra_only_node: str
) -> None:
    """audit (and the serve's background audit, with the ServiceAccount's RBAC) counts the DRA-only
    node's ResourceSlice as its allocatable GPUs, not as a reserved node without GPUs, and the device the
    real scheduler allocated to an inference pod's claim there as requested."""
    before, without_gpus = _reserved_capacity(cluster)
    assert dra_only_node not in without_gpus
    ns = namespace(labels={"rocm-isolation.io/class": "inference"})
    cluster.kube.create(new_claim_template("mi300x", ns, one_gpu()))
    selector = {"kubernetes.io/hostname": dra_only_node}
    cluster.kube.create(dra_pod(ns, "on-dra-only", template="mi300x", nodeSelector=selector))
    node, results = allocated_pools(cluster, ns, "on-dra-only")
    assert node == dra_only_node and [r["pool"] for r in results] == [dra_only_node]
    after, without_gpus = _reserved_capacity(cluster)
    assert dra_only_node not in without_gpus
    # The session's reserved nodes (device plugin and DRA both publishing their GPUs: counted once) and this one.
    expected = (len(cluster.reserved) + 1, (len(cluster.reserved) + 1) * GPUS_PER_NODE)
    assert (before["nodes"], before["gpusAllocatable"]) == expected
    assert (after["nodes"], after["gpusAllocatable"]) == expected
    requested_before: dict[str, int] = before["gpusRequested"]  # type: ignore[assignment]
    assert after["gpusRequested"] == {**requested_before, "inference": requested_before.get("inference", 0) + 1}
    # The background audit reads the slices with the manifests' RBAC.
    webhook = cluster.start_webhook("audit-dra", "--audit-interval-seconds", "2", cert_dir=cluster.webhook.cert_dir)
    try:
        wait_until(
            lambda: webhook.metric("rocm_isolation_pool_gpus_allocatable", pool="reserved") == after["gpusAllocatable"],
            timeout=90,
            what="the background audit to count the DRA-only node's GPUs",
        )
    finally:
        cluster.plane.processes.stop_one(webhook.component)
        cluster.kube.delete("Lease", LEASE_NAME, WEBHOOK_NAMESPACE)
