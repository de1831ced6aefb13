"""``rocm-isolation-webhook pool`` against the fake Kubernetes API (tests/fake_cluster.py).

kube-apiserver cannot run here: the fake answers over real HTTP the way it does (merge-patch of
nodes with the resourceVersion precondition and ``dryRun=All``, the policy/v1 eviction subresource
with PodDisruptionBudgets, Status bodies), and records every request, so the tests assert the exact
writes that reached the API, and that none did when the input was bad.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cluster_objects import (
    allocated,
    chart_class,
    claim_pod,
    device_class,
    gpu_device,
    held_claim,
    inference_pod,
    namespace,
    node,
    node_gpus,
    node_slice,
    pod,
    resource_claim,
    resource_slice,
)
from dra_objects import dra_workloads
from fake_cluster import FakeCluster
from prometheus_stub import Prometheus, serving

from webhook import cli
from webhook.core.policy import default_policy
from webhook.deploy import device_classes, reserved_devices, reserved_names
from webhook.deploy.device_classes import DeviceReservation
from webhook.ops.gpus.series import SELECTOR
from webhook.ops.pool import write as pool_write

POOL_LABEL = "rocm-isolation.io/pool"
OURS = {"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}
STALE = {"key": "rocm-isolation.io/reserved", "value": "batch", "effect": "NoSchedule"}
UNHEALTHY = {"key": "amd-gpu-unhealthy", "value": "true", "effect": "NoSchedule"}
MERGE_PATCH = "application/merge-patch+json"


def daemonset_pod(name: str, ns: str, node_name: str, gpus: str) -> dict[str, Any]:
    obj = pod(name, ns, node=node_name, gpus={"amd.com/gpu": gpus}, labels={"app": "gpu-agent"})
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "gpu-agent",
            "uid": "uid-ds-gpu-agent",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return obj


def mirror_pod(name: str, ns: str, node_name: str) -> dict[str, Any]:
    obj = pod(f"{name}-{node_name}", ns, node=node_name, gpus={"amd.com/gpu": "1"}, labels={"app": name})
    obj["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "0f3c5d9e8b7a6f5e4d3c2b1a09f8e7d6"}
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": f"uid-node-{node_name}", "controller": True}
    ]
    return obj


def pdb(name: str, ns: str, match_labels: dict[str, str], *, allowed: int) -> dict[str, Any]:
    """A policy/v1 PodDisruptionBudget as the apiserver returns it, status kept by its controller."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns, "generation": 1},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": match_labels}},
        "status": {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": 1,
            "desiredHealthy": 1,
            "expectedPods": 1,
        },
    }


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    """Five MI300X nodes (8 GPUs each): gpu-a reserved and running inference; gpu-c with a stale
    same-key taint, another taint and labels of its own; training pods here and there."""
    fake = FakeCluster().start()
    fake.add(
        namespace("ml-training"),
        namespace("serving", {"rocm-isolation.io/class": "inference"}),
        namespace("kube-system"),
        node("gpu-a", reserved=True),
        node("gpu-b"),
        node("gpu-c", labels={"team": "ml"}, taints=[STALE, UNHEALTHY]),
        node("gpu-d"),
        node("gpu-e"),
        node("cpu-1", allocatable={}),
        inference_pod("llm-0", "serving", node="gpu-a", gpus={"amd.com/gpu": "4"}),
        pod("train-b", "ml-training", node="gpu-b", gpus={"amd.com/gpu": "4"}, labels={"app": "train-b"}),
        pod("train-c", "ml-training", node="gpu-c", gpus={"amd.com/gpu": "2"}, labels={"app": "train-c"}),
        pod("train-d", "ml-training", node="gpu-d", gpus={"amd.com/gpu": "1"}, labels={"app": "train-d"}),
        daemonset_pod("gpu-agent-c", "ml-training", "gpu-c", "1"),
        mirror_pod("gpu-burnin", "ml-training", "gpu-c"),
        pod("done", "ml-training", node="gpu-e", phase="Succeeded", gpus={"amd.com/gpu": "8"}),
    )
    yield fake
    fake.stop()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # Evictions refused by a budget are retried with backoff; the tests shorten the waits only.
    monkeypatch.setattr(pool_write, "EVICTION_BACKOFF", (0.01, 0.02))


def run(cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    code = cli.main(["pool", *argv, "--kubeconfig", str(kubeconfig)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def writes(cluster: FakeCluster) -> list[Any]:
    """Writes to nodes and evictions (the backstop's params ConfigMap: ``configmap_writes``)."""
    with cluster.lock:
        return [r for r in cluster.requests if r.method != "GET" and "/configmaps" not in r.path]


def configmap_writes(cluster: FakeCluster) -> list[Any]:
    with cluster.lock:
        return [r for r in cluster.requests if r.method != "GET" and "/configmaps" in r.path]


def test_apply_and_release_keep_the_backstops_reserved_node_names(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-c")
    assert code == 0, out
    stored = cluster.get_object("configmaps", f"{reserved_names.NAMESPACE}/{reserved_names.PARAMS_CONFIGMAP}")
    assert stored is not None
    labelled = sorted(
        name
        for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e")
        if (cluster.get_object("nodes", name) or {}).get("metadata", {}).get("labels", {}).get(POOL_LABEL)
        == "inference"
    )
    assert "gpu-c" in labelled and sorted(stored["data"]) == labelled
    assert f"configmap/{reserved_names.PARAMS_CONFIGMAP}" in out
    code, out, _ = run(cluster, tmp_path, capsys, "release", "--nodes", "gpu-c", "--force")
    assert code == 0, out
    stored = cluster.get_object("configmaps", f"{reserved_names.NAMESPACE}/{reserved_names.PARAMS_CONFIGMAP}")
    assert stored is not None and "gpu-c" not in (stored.get("data") or {})
    assert [r.method for r in configmap_writes(cluster)] == ["POST", "PATCH"]


def stored_node(cluster: FakeCluster, name: str) -> dict[str, Any]:
    obj = cluster.get_object("nodes", name)
    assert obj is not None
    return obj


# --- plan ----------------------------------------------------------------------------------------


def test_plan_chooses_by_selector_and_count_and_changes_nothing(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, tmp_path, capsys, "--selector", "amd.com/gpu.device-id=74a1", "--count", "3")
    assert code == 0
    # gpu-a is reserved already; then the fewest non-inference GPUs: gpu-e 0 (its pod finished), gpu-d 1
    lines = out.splitlines()
    assert (
        lines[0]
        == "Reserved pool: label rocm-isolation.io/pool=inference, taint rocm-isolation.io/reserved=inference:NoSchedule"
    )
    assert lines[2].split() == ["NODE", "GPUS", "LABEL", "TAINT", "WHY"]
    assert lines[3].split()[:5] == ["gpu-a", "8", "keep", "keep", "already"]
    assert lines[4].split("   ")[0] == "gpu-e" and "0 GPUs requested by non-inference pods" in lines[4]
    assert lines[5].startswith("gpu-d") and lines[5].endswith(
        "1 GPU requested by non-inference pods (fewer than gpu-b: 4)"
    )
    assert "gpu-c   8      4 GPUs requested by non-inference pods" in out  # not chosen, with why
    assert "Left for training: 2 nodes, 16 GPUs allocatable, 8 requested by non-inference pods (8 free)." in out
    assert writes(cluster) == []


def test_plan_json_lists_the_pods_the_taint_leaves(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, tmp_path, capsys, "plan", "--nodes", "gpu-c", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    [gpu_c] = doc["nodes"]
    assert (gpu_c["label"], gpu_c["taint"], gpu_c["gpus"]) == ("add", "replace", 8)
    assert gpu_c["replacesTaints"] == [STALE]
    assert [(p["name"], p["owner"], p["gpus"], p["evictable"]) for p in gpu_c["podsStaying"]] == [
        ("gpu-agent-c", "DaemonSet/gpu-agent", 1, False),
        ("gpu-burnin-gpu-c", "Node/gpu-c", 1, False),
        ("train-c", "ReplicaSet/trainer-7d9c8b6f5", 2, True),
    ]
    assert doc["reserved"]["after"] == {"nodes": 2, "gpusAllocatable": 16, "gpusRequested": 4, "gpusFree": 12}
    assert doc["displacedGpus"] == 2
    assert writes(cluster) == []


def test_plan_by_gpus(cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(cluster, tmp_path, capsys, "--gpus", "20", "-o", "json")
    assert code == 0
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["gpu-a", "gpu-e", "gpu-d"]


def test_plan_counts_the_gpus_dra_publishes_and_hands_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nodes that run AMD's DRA driver and no device plugin: their GPUs are in ResourceSlices, and a
    training pod's GPUs are the devices allocated to its claim."""
    fake = FakeCluster().start()
    try:
        gpus = [f"gpu-{i}" for i in range(8)]
        fake.add(
            namespace("ml-training"),
            node("dra-a", allocatable={}),
            node("dra-b", allocatable={}),
            resource_slice("dra-a", *gpus),
            resource_slice("dra-b", *gpus),
            allocated(resource_claim("train", "ml-training"), "dra-a", "gpu-0", "gpu-1", "gpu-2"),
            pod(
                "train-a",
                "ml-training",
                node="dra-a",
                gpus={},
                resource_claims=[{"name": "gpu", "resourceClaimName": "train"}],
            ),
        )
        code, out, _ = run(fake, tmp_path, capsys, "plan", "--gpus", "8", "-o", "json")
        assert code == 0, out
        doc = json.loads(out)
        assert [(n["name"], n["gpus"]) for n in doc["nodes"]] == [("dra-b", 8)]
        code, out, _ = run(fake, tmp_path, capsys, "plan", "--nodes", "dra-a", "-o", "json")
        assert [(p["name"], p["gpus"]) for p in json.loads(out)["nodes"][0]["podsStaying"]] == [("train-a", 3)]
    finally:
        fake.stop()


# --- apply ---------------------------------------------------------------------------------------


def test_apply_sends_only_our_label_and_taint(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = stored_node(cluster, "gpu-c")
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-c")
    assert code == 0
    [request] = writes(cluster)
    assert (request.method, request.path, request.content_type) == ("PATCH", "/api/v1/nodes/gpu-c", MERGE_PATCH)
    assert "dryRun" not in request.query
    assert request.body == {
        "metadata": {"labels": {POOL_LABEL: "inference"}, "resourceVersion": before["metadata"]["resourceVersion"]},
        # the stale same-key taint is replaced where it was; the GPU operator's taint is untouched
        "spec": {"taints": [OURS, UNHEALTHY]},
    }
    after = stored_node(cluster, "gpu-c")
    assert after["metadata"]["labels"] == {**before["metadata"]["labels"], POOL_LABEL: "inference"}
    assert after["spec"]["taints"] == [OURS, UNHEALTHY]
    # nothing else of the node moved
    for key in ("spec", "metadata"):
        rest = {k: v for k, v in after[key].items() if k not in ("labels", "taints", "resourceVersion")}
        assert rest == {k: v for k, v in before[key].items() if k not in ("labels", "taints", "resourceVersion")}
    assert after["status"] == before["status"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Node", **after}, "1.37.0", strict=True)
    assert "node/gpu-c labeled and tainted" in out
    assert "The pods listed above keep running: pool apply --evict evicts them." in out
    assert cluster.get_object("pods", "train-c", "ml-training") is not None


def test_apply_twice_changes_nothing_the_second_time(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("apply", "--selector", "amd.com/gpu.device-id=74a1", "--count", "2")
    assert run(cluster, tmp_path, capsys, *args)[0] == 0
    patched = [r.path for r in writes(cluster)]
    assert patched == ["/api/v1/nodes/gpu-e"]  # gpu-a was reserved already
    first = stored_node(cluster, "gpu-e")
    code, out, _ = run(cluster, tmp_path, capsys, *args)
    assert code == 0
    assert [r.path for r in writes(cluster)] == patched  # no new write
    assert "node/gpu-a unchanged" in out and "node/gpu-e unchanged" in out
    assert out.rstrip().endswith("Nothing changed: the pool was already set up.")
    assert stored_node(cluster, "gpu-e") == first


def test_a_concurrent_edit_is_reread_and_kept(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    maintenance = {"key": "example.com/maintenance", "effect": "NoSchedule"}

    def someone_else(obj: dict[str, Any]) -> None:  # e.g. another operator's kubectl taint, meanwhile
        obj["metadata"]["labels"]["example.com/rack"] = "r7"
        obj["spec"].setdefault("taints", []).append(maintenance)

    cluster.edit_before_next_patch("gpu-d", someone_else)
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-d")
    assert code == 0
    patches = writes(cluster)
    assert [r.status for r in patches] == [409, 200]
    assert patches[0].body["spec"]["taints"] == [OURS]  # built from what was read first
    assert patches[1].body["spec"]["taints"] == [maintenance, OURS]  # rebuilt after the re-read
    after = stored_node(cluster, "gpu-d")
    assert after["spec"]["taints"] == [maintenance, OURS]
    assert after["metadata"]["labels"]["example.com/rack"] == "r7"
    assert after["metadata"]["labels"][POOL_LABEL] == "inference"
    assert "node/gpu-d labeled and tainted" in out


def test_a_node_that_keeps_changing_is_left_alone_and_reported(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def relabel(obj: dict[str, Any]) -> None:  # a controller rewriting the node all the time
        obj["metadata"]["labels"]["example.com/heartbeat"] = str(obj["metadata"]["resourceVersion"])

    cluster.edit_before_next_patch("gpu-d", relabel, times=pool_write.CONFLICT_RETRIES)
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-d", "-o", "json")
    assert code == 1
    assert [r.status for r in writes(cluster)] == [409] * pool_write.CONFLICT_RETRIES
    assert json.loads(out)["nodes"][0]["result"] == "conflict"
    assert POOL_LABEL not in stored_node(cluster, "gpu-d")["metadata"]["labels"]


def test_a_pod_gone_before_its_eviction_is_fine(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the pod finishes and is deleted between the read and the eviction (404: what was wanted)
    cluster.edit_before_next_patch("gpu-b", lambda _: cluster.delete_object("pods", "train-b", "ml-training"))
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-b", "--evict", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["nodes"] == [{"name": "gpu-b", "result": "patched", "patch": writes(cluster)[-2].body}]
    assert doc["evictions"] == [
        {"namespace": "ml-training", "name": "train-b", "outcome": "gone", "message": "already gone", "attempts": 1}
    ]
    assert writes(cluster)[-1].status == 404


def test_server_dry_run_sends_dry_run_all_and_persists_nothing(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = stored_node(cluster, "gpu-c")
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-c", "--evict", "--dry-run=server")
    assert code == 0
    requests = writes(cluster)
    assert [(r.method, r.path, r.query.get("dryRun")) for r in requests] == [
        ("PATCH", "/api/v1/nodes/gpu-c", "All"),
        ("POST", "/api/v1/namespaces/ml-training/pods/train-c/eviction", "All"),
    ]
    assert requests[1].body["deleteOptions"] == {"dryRun": ["All"]}
    assert stored_node(cluster, "gpu-c") == before
    assert cluster.get_object("pods", "train-c", "ml-training") is not None
    assert "node/gpu-c labeled and tainted (server dry run)" in out


# --- eviction ------------------------------------------------------------------------------------


def test_evict_retries_a_budget_refusal_and_skips_daemonset_and_mirror_pods(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add(pdb("train-c", "ml-training", {"app": "train-c"}, allowed=0))
    cluster.allow_evictions_after("ml-training", "train-c", refusals=2)
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-c", "--evict", "--timeout", "30s")
    assert code == 0
    evictions = [r for r in writes(cluster) if r.method == "POST"]
    assert {r.path for r in evictions} == {"/api/v1/namespaces/ml-training/pods/train-c/eviction"}
    assert [r.status for r in evictions] == [429, 429, 201]
    assert evictions[0].body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "train-c", "namespace": "ml-training"},
    }
    assert cluster.get_object("pods", "train-c", "ml-training") is None
    assert cluster.get_object("pods", "gpu-agent-c", "ml-training") is not None
    assert cluster.get_object("pods", "gpu-burnin-gpu-c", "ml-training") is not None
    assert "pod/train-c -n ml-training evicted" in out
    assert "pod/gpu-agent-c -n ml-training skipped: DaemonSet pod (its controller would recreate it)" in out
    assert "pod/gpu-burnin-gpu-c -n ml-training skipped: mirror pod (static, managed by the kubelet)" in out


def test_an_eviction_still_refused_at_the_timeout_is_reported_not_forced(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add(pdb("train-c", "ml-training", {"app": "train-c"}, allowed=0))
    code, out, _ = run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-c", "--evict", "--timeout", "0.1s")
    assert code == 1
    assert cluster.get_object("pods", "train-c", "ml-training") is not None
    assert not [r for r in writes(cluster) if r.method == "DELETE"]
    assert (
        "pod/train-c -n ml-training not evicted: Cannot evict pod as it would violate the pod's disruption budget. "
        "(The disruption budget train-c needs 1 healthy pods and has 1 currently)"
    ) in out
    # the node itself was reserved: only the eviction is left undone
    assert stored_node(cluster, "gpu-c")["metadata"]["labels"][POOL_LABEL] == "inference"


# --- release -------------------------------------------------------------------------------------


def test_release_refuses_when_inference_would_lose_its_last_room(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(cluster, tmp_path, capsys, "release", "--nodes", "gpu-a")
    assert code == 1
    assert "release refused: these inference pods would have no room left" in err
    assert "serving     llm-0   gpu-a   4" in err
    assert writes(cluster) == []
    code, _, _ = run(cluster, tmp_path, capsys, "release", "--all")
    assert code == 1
    assert writes(cluster) == []


def test_release_removes_only_our_label_and_taint_when_there_is_room(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(cluster, tmp_path, capsys, "apply", "--nodes", "gpu-c")[0] == 0
    before = stored_node(cluster, "gpu-a")
    # gpu-c (8 GPUs, 2 requested by a training pod still there: 6 free) takes llm-0 (4)
    code, out, _ = run(cluster, tmp_path, capsys, "release", "--nodes", "gpu-a")
    assert code == 0
    request = writes(cluster)[-1]
    assert request.body == {
        "metadata": {"labels": {POOL_LABEL: None}, "resourceVersion": before["metadata"]["resourceVersion"]},
        "spec": {"taints": None},
    }
    after = stored_node(cluster, "gpu-a")
    assert POOL_LABEL not in after["metadata"]["labels"]
    assert "taints" not in after["spec"]
    assert {k: v for k, v in after["metadata"]["labels"].items()} == {
        k: v for k, v in before["metadata"]["labels"].items() if k != POOL_LABEL
    }
    assert "node/gpu-a released (label and taint removed)" in out
    # gpu-c keeps the GPU operator's taint
    code, _, _ = run(cluster, tmp_path, capsys, "release", "--all", "--force")
    assert code == 0
    gpu_c = stored_node(cluster, "gpu-c")
    assert gpu_c["spec"]["taints"] == [UNHEALTHY]
    assert gpu_c["metadata"]["labels"]["team"] == "ml" and POOL_LABEL not in gpu_c["metadata"]["labels"]


# --- status --------------------------------------------------------------------------------------


def test_status_shows_label_taint_consistency_gpus_and_pods_by_class(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    half = copy.deepcopy(node("gpu-f", labels={POOL_LABEL: "inference"}))
    other = node("gpu-g", labels={POOL_LABEL: "batch"})
    cluster.add(half, other, pod("stray", "ml-training", node="gpu-a", gpus={"amd.com/gpu": "2"}))
    code, out, _ = run(cluster, tmp_path, capsys, "status", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert [(n["name"], n["labelled"], n["tainted"], n["gpusRequested"]) for n in doc["nodes"]] == [
        ("gpu-a", True, True, 6),
        ("gpu-c", False, False, 4),
        ("gpu-f", True, False, 0),
        ("gpu-g", False, False, 0),
    ]
    assert doc["nodes"][3]["state"] == (
        "label rocm-isolation.io/pool=batch is not the policy's: pool apply or release --nodes gpu-g"
    )
    assert doc["nodes"][1]["state"].startswith("taint rocm-isolation.io/reserved=batch:NoSchedule is not the policy's")
    assert doc["nodes"][2]["state"].startswith("label without taint")
    assert doc["reserved"]["podsByClass"] == {"inference": {"pods": 1, "gpus": 4}, "training": {"pods": 1, "gpus": 2}}
    assert doc["nonInferenceOnReserved"] == [
        {"namespace": "ml-training", "name": "stray", "node": "gpu-a", "gpus": 2, "class": "training"}
    ]
    code, out, _ = run(cluster, tmp_path, capsys, "status")
    assert code == 0
    assert (
        "Reserved: 2 nodes, 16 GPUs allocatable, 6 requested (inference 1 pod / 4 GPUs, training 1 pod / 2 GPUs)" in out
    )
    assert writes(cluster) == []


def test_status_shows_the_reserved_gpus_lent_to_borrowers_when_lending_is_on(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    borrower = pod("borrower", "ml-training", node="gpu-a", gpus={"amd.com/gpu": "2"})
    borrower["spec"].update({"priorityClassName": "rocm-isolation-borrower", "priority": -100})
    cluster.add(borrower)
    document = default_policy().document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["lending"] = {"enabled": True}
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(document))
    code, out, _ = run(cluster, tmp_path, capsys, "status", "-o", "json", "--policy", str(policy_file))
    assert code == 0
    assert {n["name"]: n["gpusLent"] for n in json.loads(out)["nodes"]} == {"gpu-a": 2, "gpu-c": 0}
    code, out, _ = run(cluster, tmp_path, capsys, "status", "--policy", str(policy_file))
    assert code == 0 and "LENT" in out.splitlines()[2]
    # Lending off (the shipped policy): no such column, the output as before.
    code, out, _ = run(cluster, tmp_path, capsys, "status")
    assert code == 0 and "LENT" not in out


# --- status --gpu-metrics ------------------------------------------------------------------------


def exporter_lines(now: float) -> list[tuple[str, dict[str, str], float, float]]:
    """AMD's exporter on gpu-a (reserved) and gpu-b (shared), a point every 30 s over 330 s up to ``now``: gpu-a's
    GPU 0 kept 30-60 % busy by inference's llm-0 (4 GB of VRAM), GPU 1 95 % busy with no pod (the incident), GPU 2
    idle; gpu-b's GPU busy for train-b (shared: not shown)."""
    gpus = [
        ("gpu-a", "0", "serving", "llm-0", [30.0] * 10 + [60.0, 30.0]),
        ("gpu-a", "1", "", "", [95.0] * 12),
        ("gpu-a", "2", "", "", [0.0] * 12),
        ("gpu-b", "0", "ml-training", "train-b", [99.0] * 12),
    ]
    found = []
    for host, gpu_id, ns, name, values in gpus:
        labels = {
            "hostname": host,
            "gpu_id": gpu_id,
            "serial_number": f"{host}-S{gpu_id}",
            "pod": name,
            "namespace": ns,
        }
        for step, value in enumerate(values):
            found.append(("gpu_gfx_activity", labels, value, now - 330 + 30 * step))
        found.append(("gpu_used_vram", labels, 4096.0 if name else 0.0, now))
    return found


def exporter_file(path: Path, now: float) -> Path:
    path.write_text(
        "".join(
            f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in labels.items())}}} {value:g} {int(at * 1000)}\n"
            for name, labels, value, at in exporter_lines(now)
        ),
        encoding="utf-8",
    )
    return path


def test_status_gpu_metrics_shows_each_reserved_gpus_holder_activity_and_vram(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = exporter_file(tmp_path / "exporter.prom", datetime.now().timestamp())
    _, before, _ = run(cluster, tmp_path, capsys, "status")
    code, out, err = run(cluster, tmp_path, capsys, "status", "--gpu-metrics", str(metrics))
    assert (code, err) == (0, "")
    assert out.startswith(before)  # the section is added after what status shows without it
    assert out[len(before) :].splitlines() == [
        "",
        "Reserved GPUs as the exporter reports them (gfx activity over the last 300 s; inference is expected to keep "
        "one at most 40 % busy on average):",
        "NODE    GPU                          PCI BUS ID   HELD BY                    MEAN   PEAK   VRAM",
        "gpu-a   gpu_id 0 (serial gpu-a-S0)   -            inference: serving/llm-0   33 %   60 %   4096 MB",
        "gpu-a   gpu_id 1 (serial gpu-a-S1)   -            free                       95 %   95 %   0 MB",
        "gpu-a   gpu_id 2 (serial gpu-a-S2)   -            free                       0 %    0 %    0 MB",
    ]
    code, out, err = run(cluster, tmp_path, capsys, "status", "-o", "json", "--gpu-metrics", str(metrics))
    assert (code, err) == (0, "")
    section = json.loads(out)["gpuMetrics"]
    assert (section["read"], section["error"], section["windowSeconds"], section["inferenceLoadPercent"]) == (
        True,
        None,
        300.0,
        40.0,
    )
    first, second, _ = section["reservedGpus"]
    assert first == {
        "node": "gpu-a",
        "gpu": "gpu_id 0 (serial gpu-a-S0)",
        "pciBusId": None,
        "heldBy": [{"namespace": "serving", "name": "llm-0", "class": "inference", "inference": True}],
        "inference": True,
        "meanActivityPercent": 32.7,
        "peakActivityPercent": 60.0,
        "vramMB": 4096.0,
        "overInferenceLoad": False,
    }
    assert (second["heldBy"], second["meanActivityPercent"], second["inference"]) == ([], 95.0, False)
    # Without --gpu-metrics, no such key: the document as before.
    _, plain, _ = run(cluster, tmp_path, capsys, "status", "-o", "json")
    assert "gpuMetrics" not in json.loads(plain)
    assert writes(cluster) == []


def test_status_gpu_metrics_marks_inference_over_its_expected_load(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = default_policy().document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["gpuMetrics"] = {"inferenceLoadPercent": 30}
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(document))
    metrics = exporter_file(tmp_path / "exporter.prom", datetime.now().timestamp())
    code, out, _ = run(cluster, tmp_path, capsys, "status", "--gpu-metrics", str(metrics), "--policy", str(policy_file))
    assert code == 0
    assert "at most 30 % busy on average" in out
    assert "inference: serving/llm-0   33 % (over)   60 %" in out
    assert "free                       95 %          95 %" in out  # busy with no pod: not inference's load
    code, out, _ = run(
        cluster, tmp_path, capsys, "status", "-o", "json", "--gpu-metrics", str(metrics), "--policy", str(policy_file)
    )
    assert [g["overInferenceLoad"] for g in json.loads(out)["gpuMetrics"]["reservedGpus"]] == [True, False, False]


def test_status_gpu_metrics_from_prometheus_with_a_token_file(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = datetime.now().timestamp()
    matrix: dict[tuple[str, tuple[tuple[str, str], ...]], list[list[Any]]] = {}
    for name, labels, value, at in exporter_lines(now):
        matrix.setdefault((name, tuple(sorted(labels.items()))), []).append([at, str(value)])
    result = [{"metric": {"__name__": name, **dict(labels)}, "values": v} for (name, labels), v in matrix.items()]
    token = tmp_path / "token"
    token.write_text("tok-from-file\n", encoding="utf-8")
    with serving() as url:
        Prometheus.answers = {"*": (200, {"status": "success", "data": {"resultType": "matrix", "result": result}})}
        code, out, err = run(
            cluster, tmp_path, capsys, "status", "-o", "json", "--gpu-metrics", url, "--token-file", str(token)
        )
        [(path, fields, auth)] = Prometheus.seen
    assert (path, fields["query"], auth) == ("/api/v1/query_range", SELECTOR, "Bearer tok-from-file")
    assert (code, err) == (0, "")
    assert [(g["gpu"], g["meanActivityPercent"]) for g in json.loads(out)["gpuMetrics"]["reservedGpus"]] == [
        ("gpu_id 0 (serial gpu-a-S0)", 32.7),
        ("gpu_id 1 (serial gpu-a-S1)", 95.0),
        ("gpu_id 2 (serial gpu-a-S2)", 0.0),
    ]


def test_status_gpu_metrics_unreadable_is_one_warning_and_the_status_as_before(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, before, _ = run(cluster, tmp_path, capsys, "status")
    code, out, err = run(cluster, tmp_path, capsys, "status", "--gpu-metrics", "http://127.0.0.1:9")
    assert (code, out) == (0, before)
    [line] = err.splitlines()
    assert line.startswith("warning: GPU metrics: cannot reach Prometheus at http://127.0.0.1:9")
    assert line.endswith(": the reserved GPUs' activity is not shown")
    code, out, err = run(cluster, tmp_path, capsys, "status", "-o", "json", "--gpu-metrics", str(tmp_path / "no.prom"))
    assert code == 0 and len(err.splitlines()) == 1 and "GPU metrics file" in err
    section = json.loads(out)["gpuMetrics"]
    assert section["read"] is False and "no.prom" in section["error"] and section["reservedGpus"] == []


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("apply", "--nodes", "gpu-a,gpu-zz"), "error: node not found: gpu-zz; nothing was changed"),
        (
            ("apply", "--selector", "amd.com/gpu.device-id=740f", "--count", "1"),
            "error: no node matches --selector amd.com/gpu.device-id=740f; nothing was changed",
        ),
        (
            ("apply", "--selector", "amd.com/gpu.device-id=74a1", "--count", "6"),
            "error: --count 6: --selector amd.com/gpu.device-id=74a1 has only 5 candidate node(s) with allocatable "
            "GPUs (1 more without allocatable GPUs); nothing was changed",
        ),
        (
            ("apply", "--selector", "nonsense"),
            "error: --selector 'nonsense': 'nonsense' is not KEY=VALUE; nothing was changed",
        ),
        (("release", "--nodes", "gpu-zz"), "error: node not found: gpu-zz; nothing was changed"),
        (("apply",), "error: say which nodes: --nodes NAME[,...], or --selector KEY=VALUE with --count N or --gpus N"),
        (("plan", "--nodes", "gpu-a", "--evict"), "error: --evict is only for pool apply"),
        (("release", "--nodes", "gpu-a", "--all"), "error: pool release needs --nodes NAME[,NAME...] or --all"),
        (("status", "--nodes", "gpu-a"), "error: pool status shows the whole pool: --nodes does not apply"),
        (("plan", "--nodes", "gpu-a", "--gpu-metrics", "x.prom"), "error: --gpu-metrics is only for pool status"),
        (("status", "--token", "t"), "error: --token is only for pool recommend, or pool status --gpu-metrics"),
        (("status", "--window", "7d", "--gpu-metrics", "x.prom"), "error: --window is only for pool recommend"),
        (
            ("status", "--gpu-metrics", "x.prom", "--token-file", "t"),
            "error: --token, --token-file and the TLS options are for --gpu-metrics URL, not a file",
        ),
        (
            ("status", "--gpu-metrics", "http://p:9090", "--token", "t", "--token-file", "t"),
            "error: give --token or --token-file, not both",
        ),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run(cluster, tmp_path, capsys, *argv)
    assert code == 2
    assert err.strip() == message
    assert out == ""
    assert writes(cluster) == []


def test_an_unreachable_api_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "op", "user": {"token": "t"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "op"}}],
                "current-context": "gone",
            }
        )
    )
    code = cli.main(["pool", "plan", "--nodes", "gpu-a", "--kubeconfig", str(kubeconfig)])
    err = capsys.readouterr().err
    assert code == 2
    # the last line: urllib3 logs its connection retries, and another test may have left a log
    # handler on a stream that pytest has closed since (a "--- Logging error ---" block before it)
    assert err.strip().splitlines()[-1].startswith(f"error: cannot reach the Kubernetes API at http://127.0.0.1:{port}")


def test_without_an_operator_kubeconfig_it_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # even inside a pod
    code = cli.main(["pool", "status"])
    assert code == 2
    assert "pool needs an operator's kubeconfig" in capsys.readouterr().err


def test_the_webhook_service_account_gets_none_of_what_pool_does() -> None:
    """pool patches nodes and evicts pods with a person's credentials; the rendered RBAC stays read-only."""
    from webhook.deploy import render

    rules = [
        rule
        for resource in render.render()
        if resource["kind"] in ("ClusterRole", "Role")
        for rule in resource.get("rules", [])
    ]
    assert rules
    for rule in rules:
        resources = set(rule.get("resources", []))
        if resources & {"nodes", "pods", "pods/eviction", "*"}:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
        assert "pods/eviction" not in resources


def test_the_plan_shown_in_operations_md_is_this_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/operations.md shows `pool plan` run against this cluster: the docs stay true."""
    fake = FakeCluster().start()
    try:
        fake.add(
            namespace("ml-training"),
            namespace("serving", {"rocm-isolation.io/class": "inference"}),
            node("gpu-node-01", reserved=True),
            node("gpu-node-02"),
            node("gpu-node-03"),
            node("gpu-node-04"),
            node("gpu-node-05", taints=[UNHEALTHY]),
            inference_pod("llm-7b9f-abcde", "serving", node="gpu-node-01", gpus={"amd.com/gpu": "4"}),
            pod("trainer-7d9c8b6f5-x2klm", "ml-training", node="gpu-node-02", gpus={"amd.com/gpu": "8"}),
            pod("trainer-7d9c8b6f5-q8wzp", "ml-training", node="gpu-node-03", gpus={"amd.com/gpu": "2"}),
            pod("trainer-7d9c8b6f5-m4n7r", "ml-training", node="gpu-node-05", gpus={"amd.com/gpu": "4"}),
        )
        code, out, _ = run(fake, tmp_path, capsys, "--selector", "amd.com/gpu.device-id=74a1", "--count", "3")
    finally:
        fake.stop()
    assert code == 0
    docs = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    shown = "$ rocm-isolation-webhook pool --selector amd.com/gpu.device-id=74a1 --count 3\n" + out
    assert shown in docs


# --- device-level reservation ----------------------------------------------------------------------------

RESERVED_CLASS, SHARED_CLASS = "rocm-isolation-reserved", "rocm-isolation-shared"
SLOTS = ("0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0")
DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


class Clock:
    """The apiserver's clock for creationTimestamp (one-second resolution): ``hold`` calls at one instant,
    then a second later at each call."""

    def __init__(self, start: str = "2026-12-01T09:00:00Z", hold: int = 1) -> None:
        self.now = datetime.fromisoformat(start.replace("Z", "+00:00"))
        self.hold = hold

    def __call__(self) -> str:
        if self.hold > 0:
            self.hold -= 1
        else:
            self.now += timedelta(seconds=1)
        return self.now.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def dra() -> Iterator[FakeCluster]:
    """Two MI300X nodes whose GPUs AMD's DRA driver publishes (no device plugin), in PCI slots 19, 3b, 4c, 5d;
    a device-plugin node; AMD's chart class gpu.amd.com naming amd.com/gpu; a training pod on dra-a's first
    GPU, another on dra-b's last, an inference pod on dra-b's second."""
    fake = FakeCluster().start()
    fake.clock = Clock()
    fake.add(
        namespace("ml-training"),
        namespace("serving", {"rocm-isolation.io/class": "inference"}),
        node("dra-a", allocatable={}),
        node("dra-b", allocatable={}),
        node("plugin-1"),
        node_gpus("dra-a", *SLOTS),
        node_gpus("dra-b", *SLOTS),
        chart_class(),
        *dra_workloads(),
    )
    yield fake
    fake.stop()


@pytest.fixture(autouse=True)
def no_creation_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tie lost by name waits for the next second of creationTimestamp; the fake's clock moves by itself.
    monkeypatch.setattr(pool_write, "CREATION_TICK", 0.0)


def stored_class(cluster: FakeCluster, name: str) -> dict[str, Any]:
    obj = cluster.get_object("deviceclasses", name, group="resource.k8s.io")
    assert obj is not None, name
    return obj


def class_writes(cluster: FakeCluster) -> list[Any]:
    return [r for r in writes(cluster) if "/deviceclasses" in r.path]


def test_device_plan_reserves_the_lowest_pci_bus_ids_of_every_dra_node_and_changes_nothing(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(dra, tmp_path, capsys, "plan", "--devices-per-node", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == "Now: no device reservation (the classes do not exist)."
    assert lines[2] == (
        "After apply: 2 devices per node, PCI bus IDs 0000:19:00.0, 0000:3b:00.0 (each node's 2 lowest, in ROCm's "
        "order; one list for every node)."
    )
    assert lines[3] == (
        "Split nodes are labelled rocm-isolation.io/pool=inference-devices (inference is placed on them, no node "
        "taint: every class uses their shared devices)."
    )
    assert [line.split() for line in lines[5:8]] == [
        ["NODE", "GPUS", "RESERVED", "SHARED", "LABEL"],
        ["dra-a", "4", "2", "2", "add"],
        ["dra-b", "4", "2", "2", "add"],
    ]
    assert ["dra-a", "gpu-9-137", "0000:19:00.0", "unreserved", "reserved"] in [line.split() for line in lines]
    # the training pod on dra-a's first GPU is listed, the inference pod and the training pod on a shared GPU not
    [held] = [line for line in lines if "train-a" in line]
    assert held.split() == [
        "dra-a",
        "ml-training",
        "train-a",
        "ReplicaSet/trainer-7d9c8b6f5",
        "training",
        "gpu-9-137",
        "yes",
    ]
    assert not [line for line in lines if "train-b" in line or "llm-0" in line]
    assert (
        "  deviceclass/gpu.amd.com also names amd.com/gpu (created 2026-11-01T00:00:00Z); not ours: pool never edits it"
    ) in lines
    assert "  apply creates deviceclass/rocm-isolation-shared, which then is the newest" not in lines
    assert "note: plugin-1 serves GPUs through the device plugin: not split" in out
    assert writes(dra) == []
    code, out, _ = run(dra, tmp_path, capsys, "plan", "--devices-per-node", "2", "-o", "json")
    doc = json.loads(out)["devices"]
    assert doc["after"] == {
        "active": True,
        "mode": "classes",
        "devicesPerNode": 2,
        "pciBusIds": ["0000:19:00.0", "0000:3b:00.0"],
        "taintedDevices": [],
        "memoryPartition": None,  # whole GPUs: no memory mode to pin
    }
    assert [(n["name"], n["reserved"], n["shared"]) for n in doc["nodes"]] == [("dra-a", 2, 2), ("dra-b", 2, 2)]
    assert [p["name"] for p in doc["podsHoldingReserved"]] == ["train-a"]
    assert [(c["name"], c["action"]) for c in doc["classes"]] == [(RESERVED_CLASS, "create"), (SHARED_CLASS, "create")]
    assert doc["extendedResource"]["ownerNow"] == "gpu.amd.com"
    assert writes(dra) == []


def test_device_apply_writes_the_reserved_class_then_the_shared_one_and_is_idempotent(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before_a = stored_node(dra, "dra-a")
    code, out, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0, err
    assert [(r.method, r.path, r.body["metadata"].get("name")) for r in writes(dra)] == [
        ("POST", DEVICE_CLASSES, RESERVED_CLASS),
        ("POST", DEVICE_CLASSES, SHARED_CLASS),
        ("PATCH", "/api/v1/nodes/dra-a", None),
        ("PATCH", "/api/v1/nodes/dra-b", None),
    ]
    # the split nodes get the label inference is placed on (our key only, the resourceVersion read), no taint
    assert writes(dra)[2].body == {
        "metadata": {
            "labels": {POOL_LABEL: "inference-devices"},
            "resourceVersion": before_a["metadata"]["resourceVersion"],
        }
    }
    after_a = stored_node(dra, "dra-a")
    assert after_a["metadata"]["labels"] == {**before_a["metadata"]["labels"], POOL_LABEL: "inference-devices"}
    assert after_a["spec"] == before_a["spec"]
    assert "node/dra-a labeled rocm-isolation.io/pool=inference-devices" in out
    assert POOL_LABEL not in stored_node(dra, "plugin-1")["metadata"]["labels"]
    reservation = DeviceReservation(2, ("0000:19:00.0", "0000:3b:00.0"))
    policy = default_policy()
    reserved, shared = stored_class(dra, RESERVED_CLASS), stored_class(dra, SHARED_CLASS)
    # issue 35: ours keeps the selectors of the class it takes amd.com/gpu from (the chart's: the same CEL)
    expected_shared = device_classes.shared_class(
        policy, reservation, device_classes.Inherited("gpu.amd.com", ("device.driver == 'gpu.amd.com'",))
    )
    expected_shared["metadata"]["annotations"]["rocm-isolation.io/extended-resource-also-named-by"] = "gpu.amd.com"
    for stored, expected in ((reserved, device_classes.reserved_class(policy, reservation)), (shared, expected_shared)):
        assert stored["metadata"]["labels"] == expected["metadata"]["labels"]
        assert stored["metadata"]["annotations"] == expected["metadata"]["annotations"]
        assert stored["spec"] == expected["spec"]
        kubernetes_validate.validate(
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", **stored}, "1.37.0", strict=True
        )
    assert device_classes.reservation_of(reserved) == reservation
    assert "deviceclass/rocm-isolation-reserved created" in out and "deviceclass/rocm-isolation-shared created" in out
    # ours is newer than AMD's chart class: amd.com/gpu maps to it; the chart's class is never written
    assert stored_class(dra, "gpu.amd.com")["metadata"]["resourceVersion"]
    assert not [r for r in writes(dra) if r.path.endswith("/gpu.amd.com")]
    assert "The pods listed above keep their devices: pool apply --devices-per-node 2 --evict evicts them." in out
    before = len(writes(dra))
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0
    assert len(writes(dra)) == before
    assert "deviceclass/rocm-isolation-reserved unchanged" in out and "node/dra-b unchanged" in out
    assert out.rstrip().endswith("Nothing changed: the classes, the rules and the nodes already said this.")


def test_device_apply_with_another_n_replaces_with_the_resource_version_read(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    versions = {name: stored_class(dra, name)["metadata"]["resourceVersion"] for name in (RESERVED_CLASS, SHARED_CLASS)}
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "1", "-o", "json")
    assert code == 0
    puts = [r for r in writes(dra) if r.method == "PUT"]
    assert [(r.path, r.body["metadata"]["resourceVersion"]) for r in puts] == [
        (f"{DEVICE_CLASSES}/{RESERVED_CLASS}", versions[RESERVED_CLASS]),
        (f"{DEVICE_CLASSES}/{SHARED_CLASS}", versions[SHARED_CLASS]),
    ]
    doc = json.loads(out)
    assert [(w["name"], w["result"]) for w in doc["deviceClasses"]] == [
        (RESERVED_CLASS, "replaced"),
        (SHARED_CLASS, "replaced"),
    ]
    assert doc["plan"]["devices"]["before"]["pciBusIds"] == ["0000:19:00.0", "0000:3b:00.0"]
    assert device_classes.reservation_of(stored_class(dra, RESERVED_CLASS)) == DeviceReservation(1, ("0000:19:00.0",))
    # llm-0 holds dra-b's 3b, which stops being reserved: listed, not evicted
    assert [p["name"] for p in doc["plan"]["devices"]["inferenceKeeping"]] == ["llm-0"]


def test_a_concurrent_change_of_a_class_is_read_again_and_kept(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0

    def someone_else(obj: dict[str, Any]) -> None:  # e.g. a GitOps tool adding its label meanwhile
        obj["metadata"]["labels"]["argocd.argoproj.io/instance"] = "gpu"

    dra.edit_before_next_update("deviceclasses", RESERVED_CLASS, someone_else)
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "1")
    assert code == 0, out
    puts = [r for r in writes(dra) if r.method == "PUT" and r.path.endswith(RESERVED_CLASS)]
    assert [r.status for r in puts] == [409, 200]
    stored = stored_class(dra, RESERVED_CLASS)
    assert stored["metadata"]["labels"]["argocd.argoproj.io/instance"] == "gpu"
    assert device_classes.reservation_of(stored) == DeviceReservation(1, ("0000:19:00.0",))


def test_the_shared_class_is_recreated_when_another_class_naming_amd_gpu_is_newer(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    # AMD's chart re-installed later: its class is now the newest naming amd.com/gpu
    dra.add(device_class("gpu.amd.com", created="2026-12-01T10:00:00Z", extended_resource_name="amd.com/gpu"))
    dra.clock = Clock("2026-12-01T11:00:00Z")
    old = stored_class(dra, SHARED_CLASS)
    code, out, _ = run(dra, tmp_path, capsys, "plan", "--devices-per-node", "2")
    assert "amd.com/gpu: the scheduler maps it to the newest DeviceClass naming it (the lower name on a tie): " in out
    assert "deviceclass/gpu.amd.com today." in out
    assert "deviceclass/rocm-isolation-shared (shared): delete and create again (see above)" in out
    first = len(writes(dra))
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0, out
    done = writes(dra)[first:]
    assert [(r.method, r.path) for r in done] == [
        ("DELETE", f"{DEVICE_CLASSES}/{SHARED_CLASS}"),
        ("POST", DEVICE_CLASSES),
    ]
    assert done[0].body["preconditions"] == {
        "uid": old["metadata"]["uid"],
        "resourceVersion": old["metadata"]["resourceVersion"],
    }
    assert stored_class(dra, SHARED_CLASS)["metadata"]["creationTimestamp"] == "2026-12-01T11:00:00Z"
    assert (
        "deviceclass/rocm-isolation-shared deleted and re-created: deviceclass/gpu.amd.com (created "
        "2026-12-01T10:00:00Z) was newer; now it is the newest class naming amd.com/gpu (created 2026-12-01T11:00:00Z)"
    ) in out
    assert stored_class(dra, "gpu.amd.com")["metadata"]["creationTimestamp"] == "2026-12-01T10:00:00Z"


def test_a_tie_lost_by_name_waits_for_the_next_second_and_recreates(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # AMD's chart class and ours created in the same second: gpu.amd.com is the lower name and wins
    dra.add(device_class("gpu.amd.com", created="2026-12-01T09:00:00Z", extended_resource_name="amd.com/gpu"))
    dra.clock = Clock("2026-12-01T09:00:00Z", hold=2)
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0, out
    assert [(r.method, r.path) for r in class_writes(dra)] == [
        ("POST", DEVICE_CLASSES),
        ("POST", DEVICE_CLASSES),
        ("DELETE", f"{DEVICE_CLASSES}/{SHARED_CLASS}"),
        ("POST", DEVICE_CLASSES),
    ]
    assert stored_class(dra, SHARED_CLASS)["metadata"]["creationTimestamp"] == "2026-12-01T09:00:01Z"
    assert "deviceclass/gpu.amd.com was created the same second and wins the tie by name" in out


def test_device_apply_server_dry_run_persists_nothing(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--evict", "--dry-run=server")
    assert code == 0, out
    assert [(r.method, r.query.get("dryRun")) for r in writes(dra)] == [
        ("POST", "All"),
        ("POST", "All"),
        ("PATCH", "All"),
        ("PATCH", "All"),
        ("POST", "All"),
    ]
    assert POOL_LABEL not in stored_node(dra, "dra-a")["metadata"]["labels"]
    assert dra.get_object("deviceclasses", RESERVED_CLASS, group="resource.k8s.io") is None
    assert dra.get_object("pods", "train-a", "ml-training") is not None
    assert "deviceclass/rocm-isolation-reserved created (server dry run)" in out


def test_device_apply_evicts_the_other_classes_on_reserved_devices_after_writing_the_classes(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dra.add(pdb("train-a", "ml-training", {"app": "train-a"}, allowed=0))
    dra.allow_evictions_after("ml-training", "train-a", refusals=1)
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--evict", "--timeout", "30s")
    assert code == 0, out
    assert [(r.method, r.path.rsplit("/", 1)[-1], r.status) for r in writes(dra)] == [
        ("POST", "deviceclasses", 201),
        ("POST", "deviceclasses", 201),
        ("PATCH", "dra-a", 200),
        ("PATCH", "dra-b", 200),
        ("POST", "eviction", 429),
        ("POST", "eviction", 201),
    ]
    assert writes(dra)[4].path == "/api/v1/namespaces/ml-training/pods/train-a/eviction"
    assert dra.get_object("pods", "train-a", "ml-training") is None
    assert dra.get_object("pods", "train-b", "ml-training") is not None  # on a shared GPU
    assert dra.get_object("pods", "llm-0", "serving") is not None  # inference
    assert "pod/train-a -n ml-training evicted" in out


@pytest.mark.parametrize(
    ("extra", "served"),
    [
        (
            {"resource.k8s.io/v1beta2": ["devicetaintrules"]},
            "this cluster serves devicetaintrules in resource.k8s.io/v1beta2",
        ),
        ({}, "this cluster serves no devicetaintrules"),
    ],
)
def test_a_subset_of_the_dra_nodes_is_refused_with_why(
    dra: FakeCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: dict[str, list[str]],
    served: str,
) -> None:
    dra.serve_discovery(extra)
    code, out, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2", "--nodes", "dra-a")
    assert code == 2
    assert err.startswith(
        "error: --nodes dra-a: device-level reservation splits every node that publishes gpu.amd.com devices, not "
        "some: dra-b also publishes them."
    )
    assert served in err
    assert err.rstrip().endswith("; nothing was changed")
    assert out == "" and writes(dra) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("plan", "--devices-per-node", "2", "--nodes", "dra-a,dra-b,plugin-1"),
            "error: node plugin-1 serves GPUs through the device plugin (amd.com/* allocatable) and publishes no "
            "gpu.amd.com devices: device-level reservation needs AMD's DRA driver",
        ),
        (("plan", "--devices-per-node", "0"), "error: --devices-per-node 0: give at least 1"),
        (
            ("plan", "--devices-per-node", "2", "--count", "1"),
            "error: --devices-per-node splits every node of the driver: it does not go with --count",
        ),
        (("status", "--devices-per-node", "2"), "error: --devices-per-node is only for pool plan / apply"),
        (("release", "--devices"), "error: pool release --devices needs --all, or --nodes NAME[,NAME...]"),
        (("apply", "--devices", "--nodes", "dra-a"), "error: --devices is only for pool release"),
        (
            ("release", "--devices", "--nodes", "dra-a"),
            "error: --nodes dra-a: device-level reservation splits every node that publishes gpu.amd.com devices",
        ),
    ],
)
def test_device_bad_input_is_a_clear_error_and_writes_nothing(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run(dra, tmp_path, capsys, *argv)
    assert code == 2
    assert err.startswith(message)
    assert out == "" and writes(dra) == []


def test_a_node_is_reserved_whole_or_split_never_both(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # dra-b reserved whole first: the split is refused until it is released
    assert run(dra, tmp_path, capsys, "apply", "--nodes", "dra-b")[0] == 0
    code, out, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 2, out
    assert "dra-b is reserved whole" in err and "Release it first: pool release --nodes dra-b" in err
    assert not class_writes(dra)
    assert run(dra, tmp_path, capsys, "release", "--nodes", "dra-b", "--force")[0] == 0
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    # now split: reserving a DRA node whole is refused, a device-plugin node is not
    before = len(writes(dra))
    code, _, err = run(dra, tmp_path, capsys, "apply", "--nodes", "dra-a")
    assert code == 2
    assert err.startswith(
        "error: dra-a publishes gpu.amd.com devices, which the active device reservation splits (deviceclass/"
        "rocm-isolation-reserved: 2 devices per node, PCI bus IDs 0000:19:00.0, 0000:3b:00.0): a node is reserved "
        "whole or split, never both. Release the device reservation first (pool release --devices --all)"
    )
    assert len(writes(dra)) == before
    assert run(dra, tmp_path, capsys, "apply", "--nodes", "plugin-1")[0] == 0


def test_release_devices_widens_both_classes_and_deletes_neither(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(dra, tmp_path, capsys, "release", "--devices", "--all")
    assert code == 0
    assert (
        out.strip() == "No device reservation: deviceclass/rocm-isolation-reserved does not exist; nothing to release."
    )
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    code, out, _ = run(dra, tmp_path, capsys, "release", "--devices", "--nodes", "dra-b,dra-a")
    assert code == 0, out
    for name in (RESERVED_CLASS, SHARED_CLASS):
        stored = stored_class(dra, name)
        assert stored["metadata"]["labels"]["rocm-isolation.io/device-reservation"] == "released"
        assert stored["spec"]["selectors"] == [{"cel": {"expression": "device.driver == 'gpu.amd.com'"}}]
    assert stored_class(dra, SHARED_CLASS)["spec"]["extendedResourceName"] == "amd.com/gpu"
    assert device_classes.reservation_of(stored_class(dra, RESERVED_CLASS)) == device_classes.RELEASED_RESERVATION
    assert not [r for r in writes(dra) if r.method == "DELETE"]
    assert "After release: released (both classes select every device)." in out
    # the split label goes with it; nothing else of the node
    for name in ("dra-a", "dra-b"):
        assert POOL_LABEL not in stored_node(dra, name)["metadata"]["labels"]
    assert "node/dra-a unlabeled (rocm-isolation.io/pool=inference-devices removed)" in out
    code, out, _ = run(dra, tmp_path, capsys, "release", "--devices", "--all")
    assert code == 0 and out.rstrip().endswith("Nothing changed: the device reservation was already released.")


def test_status_shows_the_devices_reserved_and_shared_and_who_holds_them(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(dra, tmp_path, capsys, "status", "-o", "json")
    assert code == 0
    assert json.loads(out)["devices"]["reservation"] is None
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    code, out, _ = run(dra, tmp_path, capsys, "status", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert {"reservation", "nodes", "reserved", "shared", "nonInferenceOnReserved"} <= set(doc)
    devices = doc["devices"]
    assert devices["reservation"] == {
        "active": True,
        "mode": "classes",
        "devicesPerNode": 2,
        "pciBusIds": ["0000:19:00.0", "0000:3b:00.0"],
        "taintedDevices": [],
        "memoryPartition": None,  # whole GPUs: no memory mode to pin
    }
    dra_b = devices["nodes"][1]
    assert (dra_b["name"], dra_b["reserved"], dra_b["shared"]) == ("dra-b", 2, 2)
    assert dra_b["podsByClass"] == {"reserved": {"inference": 1}, "shared": {"training": 1}}
    assert [p["name"] for p in devices["nonInferenceOnReserved"]] == ["train-a"]
    assert devices["extendedResource"]["ownerNow"] == SHARED_CLASS
    assert devices["outOfDate"] == []
    code, out, _ = run(dra, tmp_path, capsys, "status")
    assert (
        "Device-level reservation (driver gpu.amd.com): 2 devices per node, PCI bus IDs 0000:19:00.0, 0000:3b:00.0"
        in out
    )
    assert ["dra-b", "gpu-8-136", "0000:3b:00.0", "reserved", "serving/llm-0", "(inference)"] in [
        line.split() for line in out.splitlines()
    ]
    assert (
        "amd.com/gpu maps to deviceclass/rocm-isolation-shared (the newest DeviceClass naming it); also named by deviceclass/gpu.amd.com"
        in out
    )
    assert "  ml-training/train-a (training) on dra-a: gpu-9-137" in out
    # AMD's chart stops naming amd.com/gpu: v1.36 drops the mapping; status says so, apply re-registers it
    chart = stored_class(dra, "gpu.amd.com")
    del chart["spec"]["extendedResourceName"]
    dra.add({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", **chart})
    code, out, _ = run(dra, tmp_path, capsys, "status")
    assert (
        "warning: deviceclass/rocm-isolation-shared does not say what the reservation records: pool apply "
        "--devices-per-node 2 rewrites it"
    ) in out
    before = len(writes(dra))
    code, out, _ = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0
    assert [(r.method, r.path) for r in writes(dra)[before:]] == [("PUT", f"{DEVICE_CLASSES}/{SHARED_CLASS}")]


def test_status_counts_the_split_nodes_gpus_in_the_pool_of_their_side(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the audit counts them: a split node's reserved GPUs are the reserved pool's, its shared ones the
    shared pool's, one per PCI bus ID, and a pod's GPUs are requested on the side they were allocated from."""
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    code, out, _ = run(dra, tmp_path, capsys, "status", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    # dra-a and dra-b split (2 of 4 GPUs reserved each), plugin-1 shared (8 GPUs); train-a holds a reserved GPU
    assert doc["reserved"] == {
        "nodes": 2,
        "gpusAllocatable": 4,
        "gpusRequested": 2,
        "gpusFree": 2,
        "podsByClass": {"inference": {"pods": 1, "gpus": 1}, "training": {"pods": 1, "gpus": 1}},
    }
    assert doc["shared"] == {
        "nodes": 3,
        "gpusAllocatable": 8 + 2 + 2,
        "gpusRequested": 1,
        "gpusFree": 11,
        "podsByClass": {"training": {"pods": 1, "gpus": 1}},
    }
    code, out, _ = run(dra, tmp_path, capsys, "status")
    assert "Reserved: 2 nodes, 4 GPUs allocatable, 2 requested (inference 1 pod / 1 GPU, training 1 pod / 1 GPU)" in out
    assert "Shared: 3 nodes, 12 GPUs allocatable, 1 requested (training 1 pod / 1 GPU)" in out


def test_the_device_plan_shown_in_operations_md_is_this_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/operations.md shows `pool plan --devices-per-node 2` run against this cluster: the docs stay true."""
    fake = FakeCluster().start()
    try:
        slots = ("0000:03:00.0", "0000:23:00.0", "0000:43:00.0", "0000:63:00.0")
        moved = ("0000:23:00.0", "0000:43:00.0", "0000:63:00.0", "0000:83:00.0")  # first slot empty, a fourth one used
        fake.add(
            namespace("ml-training"),
            namespace("serving", {"rocm-isolation.io/class": "inference"}),
            node("gpu-node-11", allocatable={}),
            node("gpu-node-12", allocatable={}),
            node("gpu-node-13", allocatable={}),
            node("gpu-node-05"),
            *(
                node_slice(name, *(gpu_device(f"gpu-{i + 1}-{128 + i}", pci) for i, pci in enumerate(ids)))
                for name, ids in (("gpu-node-11", slots), ("gpu-node-12", slots), ("gpu-node-13", moved))
            ),
            device_class("gpu.amd.com", created="2026-11-02T14:03:11Z", extended_resource_name="amd.com/gpu"),
            held_claim("trainer-gpus", "ml-training", "gpu-node-11", ["gpu-1-128", "gpu-4-131"], pods=["trainer-0"]),
            claim_pod("trainer-0", "ml-training", "gpu-node-11", "trainer-gpus", labels={"app": "trainer-0"}),
        )
        code, out, _ = run(fake, tmp_path, capsys, "plan", "--devices-per-node", "2")
    finally:
        fake.stop()
    assert code == 0
    docs = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    shown = "$ rocm-isolation-webhook pool plan --devices-per-node 2\n" + out
    assert shown in docs


def test_whole_node_release_and_status_leave_split_nodes_to_the_device_reservation(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(dra, tmp_path, capsys, "apply", "--nodes", "plugin-1")[0] == 0
    assert run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")[0] == 0
    # status: the split nodes are not whole-node members with a foreign label value
    code, out, _ = run(dra, tmp_path, capsys, "status", "-o", "json")
    doc = json.loads(out)
    assert [n["name"] for n in doc["nodes"]] == ["plugin-1"]
    assert doc["devices"]["outOfDate"] == []
    # a split node is not released as a whole node; --all releases the whole ones only
    code, _, err = run(dra, tmp_path, capsys, "release", "--nodes", "dra-a")
    assert code == 2
    assert err.startswith(
        "error: dra-a is split (label rocm-isolation.io/pool=inference-devices), not reserved whole: pool release "
        "--devices --all releases the device reservation"
    )
    code, out, _ = run(dra, tmp_path, capsys, "release", "--all", "--force")
    assert code == 0, out
    assert stored_node(dra, "dra-a")["metadata"]["labels"][POOL_LABEL] == "inference-devices"
    assert POOL_LABEL not in stored_node(dra, "plugin-1")["metadata"]["labels"]
    # someone removes a split label by hand: status says what to run
    node_b = stored_node(dra, "dra-b")
    del node_b["metadata"]["labels"][POOL_LABEL]
    dra.add({"apiVersion": "v1", "kind": "Node", **node_b})
    code, out, _ = run(dra, tmp_path, capsys, "status")
    assert (
        "warning: node/dra-b lacks the label rocm-isolation.io/pool=inference-devices: inference is not placed "
        "there; pool apply --devices-per-node 2 labels it"
    ) in out


def test_a_split_without_the_device_backstop_installed_says_so_after_the_plan(
    dra: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Manifests rendered for a minor without DRA (1.33) and never re-applied after the move to 1.34, or never
    applied: the split is made (the webhook still keeps training off the reserved devices) and the operator is told
    which policies are missing and what to apply; once they are installed, nothing is said."""
    code, out, err = run(dra, tmp_path, capsys, "plan", "--devices-per-node", "2")
    assert code == 0 and "After apply: 2 devices per node" in out, err
    (said,) = [line for line in err.splitlines() if "device-level backstop" in line]
    assert said.startswith("warning: the device-level backstop is not installed (validatingadmissionpolicy/"), said
    assert all(f"validatingadmissionpolicy/{name}" in said for name in reserved_devices.POLICY_NAMES), said
    assert "rocm-isolation-webhook manifests ... | kubectl apply -f -" in said, said
    dra.add(
        *(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": spec,
            }
            for name, spec, _ in reserved_devices.policies(default_policy())
        )
    )
    code, out, err = run(dra, tmp_path, capsys, "apply", "--devices-per-node", "2")
    assert code == 0 and "deviceclass/rocm-isolation-shared created" in out, err
    assert "device-level backstop" not in err, err
