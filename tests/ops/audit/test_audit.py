"""``audit`` against the stateful fake API (tests/fake_cluster.py: a real HTTP server paging and
filtering like kube-apiserver, which cannot run here), with objects shaped as the apiserver returns
them (tests/cluster_objects.py, from tests/fixtures/cluster/)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from audit_cluster import (
    RESERVATION,
    SPLIT_AFFINITY,
    SPLIT_LABELS,
    TOLERATE_ALL,
    four_gpus,
    populate_mixed,
    reservation_classes,
    running,
    running_devices,
    split_inference,
    split_node_slice,
)
from cluster_objects import (
    INFERENCE_TOLERATION,
    RESERVED_CLASS,
    allocated,
    autopartition_slices,
    claim_pod,
    device_class,
    held_claim,
    inference_pod,
    namespace,
    node,
    pod,
    resource_claim,
    resource_slice,
)
from fake_cluster import FakeCluster
from prometheus_stub import Prometheus, serving
from test_audit_lending import LENDING_EXPECTED

from webhook import cli
from webhook.cluster.kubeapi import KubeApi
from webhook.core.policy import default_policy, parse_policy
from webhook.deploy import device_taint_rules
from webhook.deploy.device_classes import RELEASED_RESERVATION, DeviceReservation
from webhook.deploy.device_taint_rules import TaintedDevice
from webhook.ops.audit import command as audit
from webhook.ops.audit.devices import DeviceAudit
from webhook.ops.devices import ownership
from webhook.ops.gpus import judge as gpu_judge
from webhook.ops.gpus.exposition import Sample
from webhook.ops.gpus.series import SELECTOR, Readings, collect
from webhook.ops.gpus.source import GpuSourceError

POLICY = default_policy()
NOW = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)
SCHEMA = yaml.safe_load(
    (Path(__file__).parents[2] / "fixtures" / "schemas" / "wgpolicyk8s.io-v1alpha2.yaml").read_text()
)


fake = pytest.fixture(running, name="fake")
devices_fake = pytest.fixture(running_devices, name="devices_fake")


def run(fake: FakeCluster, **kwargs: Any) -> audit.Report:
    return audit.run_audit(KubeApi(fake.api_client(), page_size=kwargs.pop("page_size", 3)), POLICY, now=NOW)


def keyed(report: audit.Report) -> set[tuple[str, str]]:
    return {(f.rule, f"{f.namespace}/{f.name}" if f.namespace else f.name) for f in report.findings}


EXPECTED = {
    ("node-label-without-taint", "r2"),
    ("reserved-node-gpu-unhealthy", "r3"),
    ("reserved-node-without-gpus", "r4"),
    ("node-taint-without-label", "t1"),
    ("namespace-unknown-class", "weird"),
    ("namespace-unknown-mode", "odd-mode"),
    ("pod-on-reserved-node", "ml/trainer-on-reserved"),
    ("pod-can-reach-reserved-nodes", "ml/trainer-pending-tolerates"),
    ("pod-would-be-denied", "ml/class-hijack"),
    ("inference-pod-outside-reserved-pool", "serve/llm-shared"),
    ("pod-missing-mutations", "serve/llm-shared"),
    ("pod-missing-mutations", "serve/llm-unmutated"),
    ("namespace-allows-privileged", "ml"),
    ("reserved-node-names-out-of-date", "rocm-isolation-system/rocm-isolation-reserved-node-names"),
    ("deviceclass-not-in-policy", "big-gpus"),
    ("pod-gpu-allocation-not-recognised", "ml/via-vendor-x"),
}
# The device-level reservation's cluster (tests/audit_cluster.py, populate_devices).
DEVICE_EXPECTED = {
    ("reserved-device-held-by-other-class", "ml/trainer-stray"),
    ("reserved-device-missing", "d3"),
    ("reserved-device-unhealthy", "d4"),
    ("split-node-label-out-of-date", "d2"),
    ("extended-resource-not-on-shared-class", "rocm-isolation-shared"),
}


# What the exporter says of the fake cluster's reserved node r1 (tests/ops/gpus/ judges it in detail).
GPU_EXPECTED = {
    ("reserved-gpu-used-unallocated", "r1"),
    ("reserved-gpu-used-by-other-class", "ml/trainer-on-reserved"),
    ("reserved-gpu-unhealthy", "r1"),
    ("reserved-gpu-hot", "r1"),
    ("reserved-gpu-inference-load-high", "r1"),
}


def r1_samples(now: float) -> list[Sample]:
    """Five GPUs of r1 over the window: one busy with no pod (PID 4242), one busy for the training pod, one
    unhealthy, one hot, one kept 90 % busy by inference."""
    samples = []
    for i, (holder, activity) in enumerate(
        [("", 97.0), ("ml/trainer-on-reserved", 95.0), ("", 0.0), ("", 1.0), ("serve/llm-ok", 90.0)]
    ):
        namespace, _, name = holder.partition("/")
        labels = {"hostname": "r1", "gpu_id": str(i), "serial_number": f"S{i}", "pod": name, "namespace": namespace}
        if i == 0:
            labels["kfd_process_id"] = "4242"
        for step in range(12):
            samples.append(Sample("gpu_gfx_activity", labels, activity, now - 330 + 30 * step))
        samples.append(Sample("gpu_health", labels, 0.0 if i == 2 else 1.0, now))
        samples.append(Sample("gpu_junction_temperature", labels, 99.0 if i == 3 else 60.0, now))
    return samples


def exporter_r1(now: float, limits: gpu_judge.Thresholds) -> Readings:
    return collect(r1_samples(now), end=now)


def test_the_gpus_own_word_adds_its_findings_and_an_unreadable_exporter_changes_nothing_else(
    fake: FakeCluster,
) -> None:
    api = KubeApi(fake.api_client(), page_size=3)
    report = audit.run_audit(api, POLICY, now=NOW, gpu_source=exporter_r1)
    assert keyed(report) == EXPECTED | GPU_EXPECTED
    unallocated = next(f for f in report.findings if f.rule == "reserved-gpu-used-unallocated")
    assert unallocated.kind == "Node" and "PIDs 4242" in unallocated.message
    document = report.to_json()["gpuMetrics"]
    assert document["read"] is True and document["gpusJudged"] == 5
    assert {(g["gpu"], g["inference"]) for g in document["reservedGpus"] if g["activityPercent"] >= 90} == {
        ("gpu_id 0 (serial S0)", False),
        ("gpu_id 1 (serial S1)", False),
        ("gpu_id 4 (serial S4)", True),
    }
    # r2 and r3 (reserved, with GPUs) have no series: said in one line, not judged
    assert "GPU metrics: no exporter series for 2 node(s) with reserved GPUs (r2, r3): their GPUs are not judged" in (
        report.warnings
    )

    def unreachable(now: float, limits: gpu_judge.Thresholds) -> Readings:
        raise GpuSourceError("GPU metrics: cannot reach Prometheus at http://prometheus:9090: refused")

    failed = audit.run_audit(api, POLICY, now=NOW, gpu_source=unreachable)
    assert keyed(failed) == EXPECTED
    assert [w for w in failed.warnings if "GPU metrics" in w] == [
        "GPU metrics: cannot reach Prometheus at http://prometheus:9090: refused: the GPUs were not judged (every "
        "other finding is reported)"
    ]
    assert failed.to_json()["gpuMetrics"] == {
        "read": False,
        "error": "GPU metrics: cannot reach Prometheus at http://prometheus:9090: refused",
        "gpusJudged": 0,
        "staleNodes": [],
        "notes": [],
        "reservedGpus": [],
    }


def test_every_rule_fires_once_and_compliant_objects_are_quiet(fake: FakeCluster, devices_fake: FakeCluster) -> None:
    report = run(fake)
    assert keyed(report) == EXPECTED
    # An active device reservation: its rules fire once each; the inference pod on a split node's reserved GPU,
    # the training pod on a shared one, a reserved GPU tainted with effect None, a shared GPU tainted NoSchedule
    # and the excluded namespace's pod on a shared GPU are quiet.
    device_report = run(devices_fake)
    assert keyed(device_report) == DEVICE_EXPECTED
    # Every documented rule is exercised (lending's in tests/ops/audit/test_audit_lending.py).
    every = EXPECTED | DEVICE_EXPECTED | LENDING_EXPECTED | MEMORY_EXPECTED | GPU_EXPECTED
    assert {rule for rule, _ in every} == set(audit.RULES)
    assert not {rule for rule, _ in EXPECTED} & {rule for rule, _ in DEVICE_EXPECTED}
    by_key = {(f.rule, f.name): f for f in report.findings}
    on_reserved = by_key[("pod-on-reserved-node", "trainer-on-reserved")]
    assert on_reserved.kind == "Pod" and on_reserved.uid == "uid-pod-ml-trainer-on-reserved"
    assert "spec.nodeName is r1, a reserved node" in on_reserved.message  # the engine's own wording
    missing = by_key[("pod-missing-mutations", "llm-unmutated")].message
    assert "node-affinity" in missing and "tolerations" in missing and "topology-spread" in missing
    assert "env" in missing
    assert "deny-class-not-allowed" in by_key[("pod-would-be-denied", "class-hijack")].message
    assert report.pods_checked == 8  # GPU pods not finished, the excluded namespace's included


def test_capacity_per_pool(fake: FakeCluster) -> None:
    capacity = run(fake).to_json()["capacity"]
    assert capacity["reserved"] == {
        "nodes": 4,
        "gpusAllocatable": 24,
        # unclassified: gpu-burn (kube-system is excluded) 2, via-vendor-x's DRA GPU (a class the policy
        # does not recognise) 1
        "gpusRequested": {"inference": 2, "training": 2, "unclassified": 3},
        "pendingPods": {"inference": {"pods": 1, "oldestWaitSeconds": 3600}},
    }
    assert capacity["shared"] == {
        "nodes": 3,  # s1, s2 and t1 (GPUs, no pool label); the CPU node is no GPU capacity
        "gpusAllocatable": 24,
        "gpusRequested": {"inference": 2, "training": 4},
        "pendingPods": {"training": {"pods": 1, "oldestWaitSeconds": 3600}},
    }


def test_pods_are_read_paginated_and_finished_ones_are_filtered_by_the_apiserver(fake: FakeCluster) -> None:
    run(fake, page_size=3)
    requests = fake.requests_to("/api/v1/pods")
    assert len(requests) == 4  # 11 active pods, 3 per page
    assert all(r.query["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed" for r in requests)
    assert all(r.query["limit"] == "3" for r in requests)


def test_an_expired_pod_list_restarts_without_counting_twice(fake: FakeCluster) -> None:
    expected = run(fake).to_json()
    # Pages of 3: nodes (3 pages), namespaces (2), claims and claim templates (1 each), device classes
    # (2), resource slices (1); the pod list's first page is the 11th, and its continue token expires
    # before the second page.
    fake.expire_after(3 + 2 + 1 + 1 + 2 + 1 + 1)
    restarted = run(fake)
    assert restarted.to_json() == expected  # nothing counted twice, nothing missing
    queries = [r.query for r in fake.requests_to("/api/v1/pods")][4:]  # the second run's
    assert ["continue" in q for q in queries] == [False, True, False, True, True, True]  # 410, then from the top


def test_partition_gpus_and_init_containers_in_capacity() -> None:
    fake = FakeCluster().start()
    try:
        fake.add(
            node("p1", reserved=True, allocatable={"amd.com/cpx_nps4": "64"}),
            namespace("serve", {"rocm-isolation.io/class": "inference"}),
        )
        sidecar = {
            "name": "proxy",
            "image": "x",
            "restartPolicy": "Always",
            "resources": {"limits": {"amd.com/cpx_nps4": "1"}},
        }
        fake.add(inference_pod("llm", "serve", node="p1", gpus={"amd.com/cpx_nps4": "3"}, init_containers=[sidecar]))
        report = audit.run_audit(KubeApi(fake.api_client()), POLICY, now=NOW)
        reserved = report.to_json()["capacity"]["reserved"]
        assert reserved["gpusAllocatable"] == 64 and reserved["gpusRequested"] == {"inference": 4}
    finally:
        fake.stop()


def test_dra_gpus_are_capacity_on_nodes_without_the_device_plugin() -> None:
    """A node that runs AMD's DRA driver and no device plugin has its GPUs in ResourceSlices: they are its
    allocatable GPUs (no reserved-node-without-gpus), and the devices allocated to claims are requested,
    a claim two pods share once, the claim made for a DRA extended resource not twice."""
    fake = FakeCluster().start()
    try:
        gpus = [f"gpu-{i}" for i in range(8)]
        fake.add(
            node("r-dra", reserved=True, allocatable={}),
            node("r-plain", reserved=True, allocatable={}),  # neither: still a finding
            node("both", allocatable={"amd.com/gpu": "8"}),  # migrating: the same 8 GPUs twice
            resource_slice("r-dra", *gpus),
            resource_slice("both", *gpus),
            namespace("serve", {"rocm-isolation.io/class": "inference"}),
        )
        shared = [{"name": "gpu", "resourceClaimName": "shared"}]
        fake.add(
            allocated(resource_claim("shared", "serve"), "r-dra", "gpu-0", "gpu-1"),
            allocated(resource_claim("llm-b-gpu-x1", "serve"), "r-dra", "gpu-2"),
            allocated(resource_claim("llm-c-extended-resources-x2", "serve"), "r-dra", "gpu-3"),
            inference_pod("llm-a1", "serve", node="r-dra", gpus={}, resource_claims=shared),
            inference_pod("llm-a2", "serve", node="r-dra", gpus={}, resource_claims=shared),
        )
        from_template = inference_pod(
            "llm-b", "serve", node="r-dra", gpus={}, resource_claims=[{"name": "gpu", "resourceClaimTemplateName": "t"}]
        )
        from_template["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "llm-b-gpu-x1"}]
        extended = inference_pod(
            "llm-c", "serve", node="r-dra", gpus={"deviceclass.resource.kubernetes.io/gpu.amd.com": "1"}
        )
        extended["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "llm-c-extended-resources-x2"}
        fake.add(from_template, extended)
        report = audit.run_audit(KubeApi(fake.api_client()), POLICY, now=NOW)
        without_gpus = {f.name for f in report.findings if f.rule == "reserved-node-without-gpus"}
        assert without_gpus == {"r-plain"}
        capacity = report.to_json()["capacity"]
        assert capacity["reserved"]["gpusAllocatable"] == 8
        assert capacity["reserved"]["gpusRequested"] == {"inference": 2 + 1 + 1}
        assert capacity["shared"]["gpusAllocatable"] == 8
    finally:
        fake.stop()


def test_audit_mode_policies_and_namespaces_are_judged_as_enforced(fake: FakeCluster) -> None:
    text = yaml.safe_dump(
        {
            **yaml.safe_load((Path(__file__).parents[3] / "webhook" / "default_policy.yaml").read_text()),
            "spec": {
                **yaml.safe_load((Path(__file__).parents[3] / "webhook" / "default_policy.yaml").read_text())["spec"],
                "mode": "audit",
            },
        }
    )
    policy = parse_policy(text)
    report = audit.run_audit(KubeApi(fake.api_client()), policy, now=NOW)
    assert keyed(report) == EXPECTED


# -- the command ----------------------------------------------------------------------------------


def cli_run(fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    code = cli.main(["audit", "--kubeconfig", str(kubeconfig), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_table_exits_1_on_findings(fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli_run(fake, tmp_path, capsys)
    assert code == audit.EXIT_FINDINGS
    lines = out.splitlines()
    assert lines[0].split() == ["RULE", "KIND", "NAME", "MESSAGE"]
    assert any(line.startswith("pod-on-reserved-node") and "ml/trainer-on-reserved" in line for line in lines)
    assert any(line.split()[:3] == ["reserved", "4", "24"] for line in lines)


def test_cli_json(fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli_run(fake, tmp_path, capsys, "-o", "json")
    assert code == 1
    document = json.loads(out)
    assert set(document) == {"findings", "capacity"}
    assert set(document["capacity"]) == {"reserved", "shared"}
    for finding in document["findings"]:
        keys = set(finding) - {"uid"}  # the object's uid, when it has one (what reports name it by)
        assert keys in ({"rule", "kind", "name", "message"}, {"rule", "kind", "namespace", "name", "message"})
        assert ("namespace" in finding) == (finding["kind"] in ("Pod", "ConfigMap"))
        if finding["kind"] == "Pod":
            assert finding["uid"] == f"uid-pod-{finding['namespace']}-{finding['name']}"
    assert {
        (f["rule"], f"{f['namespace']}/{f['name']}" if "namespace" in f else f["name"]) for f in document["findings"]
    } == EXPECTED


def test_cli_policyreport_validates_against_the_crd_schema(
    fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli_run(fake, tmp_path, capsys, "-o", "policyreport")
    assert code == 1
    documents = list(yaml.safe_load_all(out))
    kinds = [(d["kind"], d["metadata"].get("namespace")) for d in documents]
    assert kinds == [
        ("ClusterPolicyReport", None),
        ("PolicyReport", "ml"),
        ("PolicyReport", "rocm-isolation-system"),  # the reserved node names' ConfigMap
        ("PolicyReport", "serve"),
    ]
    for document in documents:
        jsonschema.validate(document, {**SCHEMA, "$ref": f"#/$defs/{document['kind']}"})
        summary = document["summary"]
        assert summary["fail"] + summary["warn"] == len(document["results"])
        assert summary["warn"] == sum(r["result"] == "warn" for r in document["results"])
    cluster = documents[0]
    assert {r["rule"] for r in cluster["results"]} == {rule for rule, name in EXPECTED if "/" not in name}
    result = next(r for r in documents[1]["results"] if r["rule"] == "pod-on-reserved-node")
    assert result["resources"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "trainer-on-reserved",
            "namespace": "ml",
            "uid": "uid-pod-ml-trainer-on-reserved",
        }
    ]
    assert result["result"] == "fail" and result["severity"] == "high" and result["policy"] == "rocm-isolation"


def test_the_schema_rejects_what_the_crd_rejects() -> None:
    bad = {
        "apiVersion": "wgpolicyk8s.io/v1alpha2",
        "kind": "PolicyReport",
        "metadata": {"name": "x", "namespace": "y"},
        "results": [{"policy": "p", "result": "failed"}],
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, {**SCHEMA, "$ref": "#/$defs/PolicyReport"})


def test_cli_exits_0_on_a_clean_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = FakeCluster().start()
    try:
        clean.add(node("r1", reserved=True), node("s1"), namespace("serve", {"rocm-isolation.io/class": "inference"}))
        clean.add(inference_pod("llm", "serve", node="r1"), pod("t", "default", node="s1"))
        code, out, _ = cli_run(clean, tmp_path, capsys)
        assert code == audit.EXIT_CLEAN
        assert out.startswith("No findings (2 GPU pods checked).")
    finally:
        clean.stop()


def test_cli_exits_2_when_the_cluster_goes_away_mid_list(
    fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.drop_after(4)
    code, out, err = cli_run(fake, tmp_path, capsys, "--page-size", "2")
    assert code == audit.EXIT_ERROR and out == ""
    assert err.startswith(f"audit: cannot read the cluster: cannot reach the Kubernetes API at {fake.url}")


def test_cli_exits_2_without_rights_and_says_which(
    fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.forbid("pods")
    code, _, err = cli_run(fake, tmp_path, capsys)
    assert code == 2
    assert 'Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:' in err
    assert "needs get/list on nodes, namespaces and pods" in err


def test_cli_exits_2_on_a_bad_policy(fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\nspec: {classes: {}}\n")
    code, _, err = cli_run(fake, tmp_path, capsys, "--policy", str(bad))
    assert code == 2 and "invalid policy" in err


def test_cli_exits_2_on_a_view_dump_it_cannot_read(
    fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "view.json"
    broken.write_text("{not json")
    code, out, err = cli_run(fake, tmp_path, capsys, "--from-view", str(broken))
    assert code == 2 and out == "" and f"cannot read the view dump {broken}" in err
    code, _, err = cli_run(fake, tmp_path, capsys, "--from-view", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read the view dump" in err


def test_cli_gpu_metrics_from_a_file_and_from_prometheus_with_a_token_file(
    fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file of scrapes with timestamps (ms): judged at its newest sample.
    exposition = tmp_path / "r1.prom"
    exposition.write_text(
        "".join(
            f"{s.name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in s.labels.items())}}} {s.value:g} "
            f"{int(s.timestamp * 1000)}\n"
            for s in r1_samples(NOW.timestamp())
        ),
        encoding="utf-8",
    )
    code, out, err = cli_run(fake, tmp_path, capsys, "-o", "json", "--gpu-metrics", str(exposition))
    document = json.loads(out)
    assert code == audit.EXIT_FINDINGS
    found = {
        (f["rule"], f"{f['namespace']}/{f['name']}" if "namespace" in f else f["name"]) for f in document["findings"]
    }
    assert found == EXPECTED | GPU_EXPECTED
    assert document["gpuMetrics"]["read"] is True and document["gpuMetrics"]["gpusJudged"] == 5
    # Prometheus: the same series as a matrix, with the bearer token of --token-file (read at each run).
    matrix: dict[tuple[str, tuple[tuple[str, str], ...]], list[list[Any]]] = {}
    now = time.time()
    for sample in r1_samples(now):
        key = (sample.name, tuple(sorted(sample.labels.items())))
        matrix.setdefault(key, []).append([sample.timestamp, str(sample.value)])
    result = [{"metric": {"__name__": name, **dict(labels)}, "values": v} for (name, labels), v in matrix.items()]
    token = tmp_path / "token"
    token.write_text("tok-from-file\n", encoding="utf-8")
    with serving() as url:
        Prometheus.answers = {"*": (200, {"status": "success", "data": {"resultType": "matrix", "result": result}})}
        code, out, err = cli_run(fake, tmp_path, capsys, "-o", "json", "--gpu-metrics", url, "--token-file", str(token))
        [(path, fields, auth)] = Prometheus.seen
    assert (path, fields["query"], auth) == ("/api/v1/query_range", SELECTOR, "Bearer tok-from-file")
    assert code == audit.EXIT_FINDINGS, err
    assert {f["rule"] for f in json.loads(out)["findings"]} >= {rule for rule, _ in GPU_EXPECTED}


def test_cli_gpu_metrics_unreadable_is_one_warning_and_the_exit_code_of_the_rest(
    fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli_run(fake, tmp_path, capsys, "-o", "json", "--gpu-metrics", "http://127.0.0.1:9")
    assert code == audit.EXIT_FINDINGS  # the other findings' code, not 2
    document = json.loads(out)
    assert {rule for rule, _ in EXPECTED} == {f["rule"] for f in document["findings"]}
    assert document["gpuMetrics"]["read"] is False
    said = [line for line in err.splitlines() if "GPU metrics" in line]
    assert len(said) == 1 and "cannot reach Prometheus at http://127.0.0.1:9" in said[0], err
    code, _, err = cli_run(fake, tmp_path, capsys, "--gpu-metrics", str(tmp_path / "none.prom"))
    assert code == audit.EXIT_FINDINGS and "GPU metrics file" in err and "none.prom" in err
    # A token file that cannot be read is the same one line.
    code, _, err = cli_run(
        fake, tmp_path, capsys, "--gpu-metrics", "http://127.0.0.1:9", "--token-file", str(tmp_path / "no-token")
    )
    assert code == audit.EXIT_FINDINGS and "GPU metrics: cannot read the token file" in err


def test_cli_exits_2_without_any_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    code = cli.main(["audit"])
    assert code == 2 and "no cluster configuration" in capsys.readouterr().err


def test_inference_toleration_fixture_matches_the_policy() -> None:
    taint = POLICY.spec.reserved_nodes.taint
    assert taint is not None and INFERENCE_TOLERATION["key"] == taint.key


def test_dra_pods_are_judged_with_the_namespace_claims() -> None:
    """A pod reaches GPUs through a ResourceClaimTemplate of gpu.amd.com: a GPU pod, judged; a pod
    whose only claim is a NIC is not one."""
    fake = FakeCluster().start()
    try:
        fake.add(node("r1", reserved=True), node("s1"), namespace("ml"))
        fake.add(resource_claim("gpu-tpl", "ml", template=True), resource_claim("nic", "ml", "nic.example.com"))
        gpu_claim = [{"name": "gpu", "resourceClaimTemplateName": "gpu-tpl"}]
        nic_claim = [{"name": "nic", "resourceClaimName": "nic"}]
        fake.add(
            pod("dra-gpu", "ml", node=None, gpus={}, tolerations=[TOLERATE_ALL], resource_claims=gpu_claim),
            pod("dra-nic", "ml", node=None, gpus={}, tolerations=[TOLERATE_ALL], resource_claims=nic_claim),
        )
        report = audit.run_audit(KubeApi(fake.api_client()), POLICY, now=NOW)
        assert keyed(report) == {("pod-can-reach-reserved-nodes", "ml/dra-gpu"), ("namespace-allows-privileged", "ml")}
        assert report.pods_checked == 1
        assert report.to_json()["capacity"]["shared"]["pendingPods"] == {
            "training": {"pods": 1, "oldestWaitSeconds": 3600}
        }
    finally:
        fake.stop()


def test_a_namespace_being_deleted_gets_no_namespace_findings_but_its_pods_are_judged() -> None:
    """A Terminating namespace (deletionTimestamp set, as the apiserver returns it while the namespace
    controller empties it) is no longer worth a finding of its own; a pod still running in it is."""
    cluster = FakeCluster().start()
    try:
        labels = {"rocm-isolation.io/mode": "strict"}  # an unknown mode; GPU pods and no Pod Security level
        going = namespace("going", labels)
        going["metadata"]["deletionTimestamp"] = "2026-12-01T08:00:00Z"
        going["spec"] = {"finalizers": ["kubernetes"]}
        going["status"] = {"phase": "Terminating"}
        cluster.add(node("r1", reserved=True), node("s1"), going, namespace("staying", labels))
        cluster.add(
            pod("trainer", "going", node="r1", affinity=None, env=[], annotations={}),
            pod("trainer", "staying", node="r1", affinity=None, env=[], annotations={}),
        )
        found = keyed(run(cluster))
    finally:
        cluster.stop()
    namespace_rules = {rule for rule, name in found if name == "staying"}
    assert {"namespace-unknown-mode", "namespace-allows-privileged"} <= namespace_rules
    assert not [finding for finding in found if finding[1] == "going"]
    pod_rules = {rule for rule, name in found if name == "staying/trainer"}
    assert pod_rules and {rule for rule, name in found if name == "going/trainer"} == pod_rules


# -- device-level reservation -----------------------------------------------------------------------


def test_device_findings_name_what_to_fix(devices_fake: FakeCluster) -> None:
    by_rule = {f.rule: f for f in run(devices_fake).findings}
    held = by_rule["reserved-device-held-by-other-class"]
    assert (held.kind, held.namespace, held.uid) == ("Pod", "ml", "uid-pod-ml-trainer-stray")
    for text in (
        "class training",
        "ResourceClaim trainer-stray-gpu",
        "gpu-8-136 (PCI bus ID 0000:23:00.0, node d1, pool d1)",
        "pool apply --devices-per-node 2 --evict",
    ):
        assert text in held.message
    missing = by_rule["reserved-device-missing"].message
    assert "has 1 reserved GPU, not 2" in missing and "0000:03:00.0" in missing
    unhealthy = by_rule["reserved-device-unhealthy"].message
    assert "gpu-9-137 (PCI bus ID 0000:03:00.0, node d4, pool d4)" in unhealthy
    assert "gpu.amd.com/memory-partition-conflict:NoExecute" in unhealthy
    assert "ecc-corrected" not in unhealthy  # d1's taint of effect None is not one
    label = by_rule["split-node-label-out-of-date"].message
    assert "lacks the label rocm-isolation.io/pool=inference-devices" in label and "pool apply" in label
    owner = by_rule["extended-resource-not-on-shared-class"]
    assert owner.kind == "DeviceClass"
    assert "amd.com/gpu maps to deviceclass/gpu.amd.com" in owner.message


def test_amd_gpu_on_the_shared_class_while_it_moves_is_no_risk_to_reserved_gpus() -> None:
    """Issue 35, upgrading: AMD's gpu.amd.com-spx narrows amd.com/gpu but the shared class of an earlier apply
    still owns it (the newest). The finding says what is true: shared GPUs only, any of their layouts."""
    spx = device_class("gpu.amd.com-spx", "device.driver == 'gpu.amd.com' && !has(x)", "amd.com/gpu")
    spx["metadata"]["creationTimestamp"] = "2026-10-01T00:00:00Z"
    classes = ownership.class_infos([spx, *reservation_classes(RESERVATION)])
    [finding] = DeviceAudit(POLICY, RESERVATION, {}, {}, {}, classes).findings()
    assert (finding.rule, finding.name) == ("extended-resource-not-on-shared-class", "rocm-isolation-shared-gpu")
    assert "reserved for inference" not in finding.message
    assert (
        "pods asking for amd.com/gpu on DRA nodes get shared GPUs only (never reserved ones), but in any layout "
        "deviceclass/rocm-isolation-shared selects (a partition too), not only what deviceclass/gpu.amd.com-spx "
        "admits; rocm-isolation-webhook pool apply --devices-per-node 2 writes deviceclass/rocm-isolation-shared "
        "without the name, then makes deviceclass/rocm-isolation-shared-gpu the newest class naming it"
    ) in finding.message


def test_device_capacity_per_split_node(devices_fake: FakeCluster) -> None:
    capacity = run(devices_fake).to_json()["capacity"]
    assert set(capacity) == {"reserved", "shared", "devices"}
    # No node is reserved whole: the reserved pool is the split nodes' reserved GPUs, the shared pool their
    # shared ones; every split node counts in both pools, its GPUs allocated on each side as requested there.
    assert capacity["reserved"] == {
        "nodes": 4,
        "gpusAllocatable": 7,
        "gpusRequested": {"inference": 1, "training": 1},
        "pendingPods": {},
    }
    assert capacity["shared"] == {
        "nodes": 4,
        "gpusAllocatable": 8,
        "gpusRequested": {"training": 1, "unclassified": 1},
        "pendingPods": {},
    }
    no_gpus: dict[str, dict[str, int]] = {"reserved": {}, "shared": {}}
    # One row per GPU of each split node (pool status's gpuList): whole GPUs here, one device each.
    gpu_lists = {n["name"]: n.pop("gpuList") for n in capacity["devices"]["nodes"]}
    assert [(g["pciBusId"], g["state"], g["devices"]) for g in gpu_lists["d3"]] == [
        ("0000:23:00.0", "reserved", 1),
        ("0000:43:00.0", "shared", 1),
        ("0000:63:00.0", "shared", 1),
    ]
    held = {g["pciBusId"]: [(p["name"], p["class"]) for p in g["pods"]] for g in gpu_lists["d1"] if g["allocated"]}
    assert held == {
        "0000:03:00.0": [("llm-a", "inference")],
        "0000:23:00.0": [("trainer-stray", "training")],
        "0000:43:00.0": [("trainer-ok", "training")],
    }
    assert capacity["devices"] == {
        "driver": "gpu.amd.com",
        "mode": "classes",
        "devicesPerNode": 2,
        "pciBusIds": ["0000:03:00.0", "0000:23:00.0"],
        "reservedDevices": 7,
        "sharedDevices": 8,
        "devicesAllocated": {
            "reserved": {"inference": 1, "training": 1},
            "shared": {"training": 1, "unclassified": 1},  # unclassified: the excluded namespace's pod
        },
        "nodes": [
            {
                "name": "d1",
                "reservedDevices": 2,
                "sharedDevices": 2,
                "devicesAllocated": {"reserved": {"inference": 1, "training": 1}, "shared": {"training": 1}},
            },
            {"name": "d2", "reservedDevices": 2, "sharedDevices": 2, "devicesAllocated": no_gpus},
            {"name": "d3", "reservedDevices": 1, "sharedDevices": 2, "devicesAllocated": no_gpus},
            {
                "name": "d4",
                "reservedDevices": 2,
                "sharedDevices": 2,
                "devicesAllocated": {"reserved": {}, "shared": {"unclassified": 1}},
            },
        ],
    }


def mixed_report() -> audit.Report:
    cluster = FakeCluster().start()
    try:
        populate_mixed(cluster)
        return run(cluster)
    finally:
        cluster.stop()


def test_a_split_nodes_gpus_count_in_the_pool_of_their_side() -> None:
    """One model of capacity: the whole reserved node's GPUs and the split node's reserved ones are the reserved
    pool, the split node's shared GPUs are the shared pool's; what is allocated on a side is requested there,
    one GPU per PCI bus ID (the extended resource's GPU once, not in the pod's resources and in its claim)."""
    report = mixed_report()
    assert keyed(report) == set()
    capacity = report.to_json()["capacity"]
    assert capacity["reserved"] == {
        "nodes": 2,  # r1 whole, d1 split
        "gpusAllocatable": 8 + 2,
        "gpusRequested": {"inference": 2 + 1},
        "pendingPods": {},
    }
    assert capacity["shared"] == {
        "nodes": 2,  # s1, d1 split
        "gpusAllocatable": 8 + 6,
        "gpusRequested": {"training": 2 + 1},
        "pendingPods": {},
    }
    devices = capacity["devices"]
    assert (devices["reservedDevices"], devices["sharedDevices"]) == (2, 6)
    assert devices["devicesAllocated"] == {"reserved": {"inference": 1}, "shared": {"training": 1}}


def test_the_pool_table_shows_the_split_nodes_sides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = FakeCluster().start()
    try:
        populate_mixed(cluster)
        code, out, _ = cli_run(cluster, tmp_path, capsys)
    finally:
        cluster.stop()
    assert code == audit.EXIT_CLEAN
    rows = {
        line.split()[0]: line.split()[:4] for line in out.splitlines() if line.split()[:1] in (["reserved"], ["shared"])
    }
    assert rows == {
        "reserved": ["reserved", "2", "10", "inference=3"],
        "shared": ["shared", "2", "14", "training=3"],
    }


def test_a_node_reserved_whole_is_never_split() -> None:
    """A node labelled for the reserved pool that publishes the driver's devices (pool apply refuses to split
    it; labelled by hand): the taint keeps every other class off all its GPUs, so all of them are the reserved
    pool's, and it is no split node."""
    cluster = FakeCluster().start()
    try:
        cluster.add(
            node("r-dra", reserved=True, allocatable={}),
            node("d1", labels=SPLIT_LABELS, allocatable={}),
            split_node_slice("r-dra", *four_gpus()),
            split_node_slice("d1", *four_gpus()),
            namespace("serve", {"rocm-isolation.io/class": "inference"}),
            *reservation_classes(RESERVATION),
            held_claim("llm-gpu", "serve", "r-dra", ["gpu-6-134"], pods=["llm"]),
            inference_pod(
                "llm", "serve", node="r-dra", gpus={}, resource_claims=[{"name": "gpu", "resourceClaimName": "llm-gpu"}]
            ),
        )
        capacity = run(cluster).to_json()["capacity"]
    finally:
        cluster.stop()
    assert (capacity["reserved"]["nodes"], capacity["reserved"]["gpusAllocatable"]) == (2, 4 + 2)
    assert capacity["reserved"]["gpusRequested"] == {"inference": 1}
    assert (capacity["shared"]["nodes"], capacity["shared"]["gpusAllocatable"]) == (1, 2)
    assert [n["name"] for n in capacity["devices"]["nodes"]] == ["d1"]
    assert (capacity["devices"]["reservedDevices"], capacity["devices"]["sharedDevices"]) == (2, 2)


AP_SLOTS = ("0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0")


def autopartition_cluster(memory: str = "nps1") -> FakeCluster:
    """Node ap: 4 MI300X under AutoPartition (16 virtual devices, two slices), the 2 lowest reserved, the memory
    mode ``memory`` pinned (as pool apply records it; "": a reservation written before issue 42, none); two
    inference pods share GPU 0 in CPX/NPS1 (consumable capacity: two claims of one device), a training pod
    has GPU 3 whole (SPX), GPUs 1 and 2 are in no layout."""
    cluster = FakeCluster().start()
    cluster.add(
        node("ap", labels=SPLIT_LABELS, allocatable={}),
        *autopartition_slices("ap", AP_SLOTS),
        namespace("serve", {"rocm-isolation.io/class": "inference"}),
        namespace("ml", {"rocm-isolation.io/class": "training", "pod-security.kubernetes.io/enforce": "baseline"}),
        *reservation_classes(DeviceReservation(2, AP_SLOTS[:2], memory_partition=memory)),
        held_claim("llm-a-gpu", "serve", "ap", ["gpu-0-cpx-nps1"], pods=["llm-a"], device_class=RESERVED_CLASS),
        held_claim("llm-b-gpu", "serve", "ap", ["gpu-0-cpx-nps1"], pods=["llm-b"], device_class=RESERVED_CLASS),
        held_claim("trainer-gpu", "ml", "ap", ["gpu-3-spx-nps1"], pods=["trainer"]),
        claim_pod("llm-a", "serve", "ap", "llm-a-gpu", inference=True, affinity=SPLIT_AFFINITY),
        claim_pod("llm-b", "serve", "ap", "llm-b-gpu", inference=True, affinity=SPLIT_AFFINITY),
        claim_pod("trainer", "ml", "ap", "trainer-gpu"),
    )
    return cluster


def test_audit_counts_gpus_and_shows_the_layout_each_allocated_one_is_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35: the capacity is GPUs (4, 2 reserved), not the 16 virtual devices; the layout a GPU is in
    (the device allocated) and who holds it, in the table and the JSON."""
    cluster = autopartition_cluster()
    try:
        report = run(cluster)
        code, out, _ = cli_run(cluster, tmp_path, capsys)
    finally:
        cluster.stop()
    assert keyed(report) == set() and code == audit.EXIT_CLEAN
    devices = report.to_json()["capacity"]["devices"]
    assert (devices["reservedDevices"], devices["sharedDevices"]) == (2, 2)
    # two pods on one GPU's layout: one GPU allocated, counted for the first
    assert devices["devicesAllocated"] == {"reserved": {"inference": 1}, "shared": {"training": 1}}
    [ap] = devices["nodes"]
    assert [(g["pciBusId"], g["state"], g["devices"], g["allocated"]) for g in ap["gpuList"]] == [
        ("0000:05:00.0", "reserved", 4, ["gpu-0-cpx-nps1"]),
        ("0000:26:00.0", "reserved", 4, []),
        ("0000:46:00.0", "shared", 4, []),
        ("0000:65:00.0", "shared", 4, ["gpu-3-spx-nps1"]),
    ]
    assert [(p["namespace"], p["name"], p["class"]) for p in ap["gpuList"][0]["pods"]] == [
        ("serve", "llm-a", "inference"),
        ("serve", "llm-b", "inference"),
    ]
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Split nodes (device-level reservation"))
    assert [c.strip() for c in lines[start + 2].split("   ") if c.strip()] == [
        "ap",
        "2",
        "2",
        "inference=1",
        "training=1",
    ]
    start = lines.index("GPUs of split nodes published as several devices, in the layout allocated:")
    rows = [[c.strip() for c in line.split("   ") if c.strip()] for line in lines[start + 1 : start + 4]]
    assert rows == [
        ["NODE", "GPU (PCI BUS ID)", "SIDE", "LAYOUT ALLOCATED", "PODS"],
        ["ap", "0000:05:00.0", "reserved", "gpu-0-cpx-nps1 (of 4 devices)", "serve/llm-a (inference), serve/llm-b (inference)"],
        ["ap", "0000:65:00.0", "shared", "gpu-3-spx-nps1 (of 4 devices)", "ml/trainer (training)"],
    ]  # fmt: skip


# AutoPartition with no memory mode pinned (issue 42): the split node ap publishes four layouts in three modes.
MEMORY_EXPECTED = {("reserved-device-memory-mode-unpinned", "ap")}


def test_an_unpinned_memory_mode_on_autopartition_nodes_is_a_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reservation written before issue 42 (no memory mode recorded, none in the policy) on a node whose GPUs
    publish nps1, nps2 and nps4 layouts: the node's mode is open to either side's first claim. The same cluster
    with the mode pinned (by the class, as pool apply records it, or by the policy) is quiet."""
    cluster = autopartition_cluster(memory="")
    try:
        report = run(cluster)
        code, out, _ = cli_run(cluster, tmp_path, capsys)
        document = POLICY.document.model_dump(mode="json", by_alias=True, exclude_none=True)
        document["spec"]["reservedDevices"] = {"memoryPartition": "nps1"}
        pinned_by_policy = audit.run_audit(
            KubeApi(cluster.api_client(), page_size=3), parse_policy(yaml.safe_dump(document)), now=NOW
        )
    finally:
        cluster.stop()
    assert keyed(report) == MEMORY_EXPECTED and code == audit.EXIT_FINDINGS
    (finding,) = report.findings
    assert finding.kind == "Node" and audit.RULES[finding.rule].severity == "high"
    assert "memory modes nps1, nps2, nps4" in finding.message
    assert "reservedDevices.memoryPartition" in finding.message
    assert "rocm-isolation-webhook pool apply --devices-per-node 2 pins one" in finding.message
    assert "reserved-device-memory-mode-unpinned" in out
    assert keyed(pinned_by_policy) == set()


def test_whole_gpus_need_no_layout_table(
    devices_fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = cli_run(devices_fake, tmp_path, capsys)
    assert "in the layout allocated" not in out


def test_no_device_capacity_without_an_active_reservation(fake: FakeCluster) -> None:
    assert set(run(fake).to_json()["capacity"]) == {"reserved", "shared"}


def test_an_expired_pod_list_counts_the_devices_once(devices_fake: FakeCluster) -> None:
    expected = run(devices_fake, page_size=2).to_json()
    # Pages of 2: nodes, namespaces, claims (2 each), claim templates (1), device classes, slices (2 each);
    # the pod list's first page is the 12th, and its continue token expires before the second page.
    devices_fake.expire_after(2 + 2 + 2 + 1 + 2 + 2 + 1)
    restarted = run(devices_fake, page_size=2)
    assert restarted.to_json() == expected
    queries = [r.query for r in devices_fake.requests_to("/api/v1/pods")][2:]  # the second run's
    assert ["continue" in q for q in queries] == [False, True, False, True]  # 410, then from the top


def test_device_table_lists_the_split_nodes(
    devices_fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli_run(devices_fake, tmp_path, capsys)
    assert code == audit.EXIT_FINDINGS
    lines = out.splitlines()
    start = lines.index(
        "Split nodes (device-level reservation, driver gpu.amd.com): 2 devices per node, PCI bus IDs 0000:03:00.0, "
        "0000:23:00.0"
    )
    rows = [line.split("   ") for line in lines[start + 1 :]]
    assert [cell.strip() for cell in rows[0] if cell.strip()] == [
        "NODE",
        "RESERVED",
        "SHARED",
        "ALLOCATED ON RESERVED",
        "ALLOCATED ON SHARED",
    ]
    assert [cell.strip() for cell in rows[1] if cell.strip()] == [
        "d1",
        "2",
        "2",
        "inference=1, training=1",
        "training=1",
    ]
    assert [cell.strip() for cell in rows[-1] if cell.strip()] == [
        "(all)",
        "7",
        "8",
        "inference=1, training=1",
        "training=1, unclassified=1",
    ]


def test_device_cli_json_and_policyreport(
    devices_fake: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli_run(devices_fake, tmp_path, capsys, "-o", "json")
    assert code == 1
    document = json.loads(out)
    assert {
        (f["rule"], f"{f['namespace']}/{f['name']}" if "namespace" in f else f["name"]) for f in document["findings"]
    } == DEVICE_EXPECTED
    assert document["capacity"]["devices"]["reservedDevices"] == 7
    code, out, _ = cli_run(devices_fake, tmp_path, capsys, "-o", "policyreport")
    assert code == 1
    documents = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"].get("namespace")) for d in documents] == [
        ("ClusterPolicyReport", None),
        ("PolicyReport", "ml"),
    ]
    for document in documents:
        jsonschema.validate(document, {**SCHEMA, "$ref": f"#/$defs/{document['kind']}"})
    cluster, ml = documents
    assert {(r["rule"], r["resources"][0]["kind"], r["resources"][0]["name"]) for r in cluster["results"]} == {
        ("reserved-device-missing", "Node", "d3"),
        ("reserved-device-unhealthy", "Node", "d4"),
        ("split-node-label-out-of-date", "Node", "d2"),
        ("extended-resource-not-on-shared-class", "DeviceClass", "rocm-isolation-shared"),
    }
    assert (
        next(r for r in cluster["results"] if r["rule"] == "extended-resource-not-on-shared-class")["resources"][0][
            "apiVersion"
        ]
        == "resource.k8s.io/v1"
    )
    [held] = ml["results"]
    assert held["rule"] == "reserved-device-held-by-other-class"
    assert held["result"] == "fail" and held["severity"] == "high"
    assert held["resources"][0]["uid"] == "uid-pod-ml-trainer-stray"


def test_a_released_reservation_judges_only_the_split_label() -> None:
    """Released (both classes select every device): no GPU is reserved, so a training pod on any device, a
    lost GPU or a tainted one is no finding; a node still labelled split is (inference is placed there)."""
    cluster = FakeCluster().start()
    try:
        cluster.add(
            node("d1", labels=SPLIT_LABELS, allocatable={}),
            node("d2", allocatable={}),
            split_node_slice("d1", *four_gpus({"key": "gpu.amd.com/x", "effect": "NoExecute"})[1:]),
            split_node_slice("d2", *four_gpus()),
            namespace("ml", {"rocm-isolation.io/class": "training", "pod-security.kubernetes.io/enforce": "baseline"}),
            *reservation_classes(RELEASED_RESERVATION),
            held_claim("old-gpu", "ml", "d2", ["gpu-9-137"], pods=["trainer"]),
            pod("trainer", "ml", node="d2", gpus={}, resource_claims=[{"name": "gpu", "resourceClaimName": "old-gpu"}]),
        )
        report = run(cluster)
    finally:
        cluster.stop()
    assert keyed(report) == {("split-node-label-out-of-date", "d1")}
    [finding] = report.findings
    assert "device reservation is released" in finding.message and "pool release --devices --all" in finding.message
    assert report.devices is None and "devices" not in report.to_json()["capacity"]


def test_device_holders_are_matched_by_uid_and_inference_on_split_nodes_is_placed() -> None:
    """A claim still reserved for an earlier pod of the same name (another uid) is not the running pod's; an
    inference pod on a split node is where its placement puts it (not inference-pod-outside-reserved-pool)."""
    cluster = FakeCluster().start()
    try:
        stale = held_claim("old-gpu", "ml", "d1", ["gpu-9-137"], pods=["trainer"], device_class="gpu.amd.com")
        stale["status"]["reservedFor"][0]["uid"] = "uid-of-an-earlier-trainer"
        cluster.add(
            node("d1", labels=SPLIT_LABELS, allocatable={}),
            split_node_slice("d1", *four_gpus()),
            namespace("ml", {"rocm-isolation.io/class": "training", "pod-security.kubernetes.io/enforce": "baseline"}),
            namespace("serve", {"rocm-isolation.io/class": "inference"}),
            *reservation_classes(RESERVATION),
            stale,
            pod("trainer", "ml", node="d1", gpus={}, resource_claims=[{"name": "gpu", "resourceClaimName": "old-gpu"}]),
            *split_inference("gpu-8-136"),
        )
        report = run(cluster)
    finally:
        cluster.stop()
    assert keyed(report) == set()
    assert report.pods_checked == 2
    assert report.to_json()["capacity"]["devices"]["devicesAllocated"] == {"reserved": {"inference": 1}, "shared": {}}


def test_a_class_not_ours_in_the_reserved_name_is_not_audited(devices_fake: FakeCluster) -> None:
    foreign = reservation_classes(RESERVATION)[0]
    del foreign["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    devices_fake.add(foreign)
    report = run(devices_fake)
    assert not {f.rule for f in report.findings} & {rule for rule, _ in DEVICE_EXPECTED}
    assert report.devices is None
    assert any(
        "deviceclass/rocm-isolation-reserved is not managed by rocm-isolation-webhook" in w for w in report.warnings
    )


def test_slices_not_readable_leave_an_active_reservation_unjudged(devices_fake: FakeCluster) -> None:
    devices_fake.forbid("resourceslices")
    report = run(devices_fake)
    assert not {f.rule for f in report.findings} & {rule for rule, _ in DEVICE_EXPECTED}
    assert any("device-level reservation not audited" in w for w in report.warnings)


# -- device-level reservation by DeviceTaintRules ----------------------------------------------------------

BY_TAINTS = DeviceReservation(2, ("0000:03:00.0", "0000:23:00.0"), by_taints=True)
TRAINING_NS = {"rocm-isolation.io/class": "training", "pod-security.kubernetes.io/enforce": "baseline"}


def taint_rule(node_name: str, device: str, pci: str, version: str = "v1") -> dict[str, Any]:
    """One of the rules pool apply writes (webhook.deploy.device_taint_rules), as read back."""
    return device_taint_rules.rule(POLICY, TaintedDevice(node_name, node_name, device, pci), version)


def tainted_cluster(version: str = "v1") -> FakeCluster:
    """d1 split by taints (its two lowest GPUs, gpu-9-137 and gpu-8-136, tainted by our rules), d2 not chosen
    (its GPUs in the same slots, untainted, all shared); the classes in taint mode (the shared one selects
    every device). An inference pod on d1's reserved gpu-9-137, a training pod on d1's tainted gpu-8-136
    (a claim tolerating the taint, or allocated before the rules), one on d1's shared gpu-7-135, one on
    d2's gpu-9-137 (a reserved PCI slot, not tainted there)."""
    cluster = FakeCluster().start()
    cluster.serve_discovery({f"resource.k8s.io/{version}": ["devicetaintrules"]})
    cluster.add(
        node("d1", labels=SPLIT_LABELS, allocatable={}),
        node("d2", allocatable={}),
        split_node_slice("d1", *four_gpus()),
        split_node_slice("d2", *four_gpus()),
        namespace("ml", TRAINING_NS),
        namespace("serve", {"rocm-isolation.io/class": "inference"}),
        *reservation_classes(BY_TAINTS),
        taint_rule("d1", "gpu-9-137", "0000:03:00.0", version),
        taint_rule("d1", "gpu-8-136", "0000:23:00.0", version),
        *split_inference("gpu-9-137"),
        held_claim("stray-gpu", "ml", "d1", ["gpu-8-136"], pods=["trainer-stray"]),
        claim_pod("trainer-stray", "ml", "d1", "stray-gpu"),
        held_claim("ok-gpu", "ml", "d1", ["gpu-7-135"], pods=["trainer-ok"]),
        claim_pod("trainer-ok", "ml", "d1", "ok-gpu"),
        held_claim("d2-gpu", "ml", "d2", ["gpu-9-137"], pods=["trainer-d2"]),
        claim_pod("trainer-d2", "ml", "d2", "d2-gpu"),
    )
    return cluster


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_by_taints_the_reserved_devices_are_the_tainted_ones(version: str) -> None:
    cluster = tainted_cluster(version)
    try:
        report = run(cluster)
        rule_lists = cluster.requests_to(f"/apis/resource.k8s.io/{version}/devicetaintrules")
    finally:
        cluster.stop()
    assert rule_lists, "the rules are listed in the version the cluster serves"
    # d1's shared gpu-7-135 and every device of d2 (gpu-9-137 in a reserved PCI slot included) are fine
    assert keyed(report) == {("reserved-device-held-by-other-class", "ml/trainer-stray")}
    [held] = report.findings
    assert held.uid == "uid-pod-ml-trainer-stray"
    for text in (
        "gpu-8-136 (PCI bus ID 0000:23:00.0, node d1, pool d1)",
        "a claim that tolerates the taint rocm-isolation.io/reserved-device:NoSchedule",
        "pool apply --devices-per-node 2 --nodes d1 --evict",
    ):
        assert text in held.message
    assert report.warnings == []
    devices = report.to_json()["capacity"]["devices"]
    assert (devices["mode"], devices["reservedDevices"], devices["sharedDevices"]) == ("taints", 2, 2)
    assert devices["devicesAllocated"] == {"reserved": {"inference": 1, "training": 1}, "shared": {"training": 1}}
    assert [n["name"] for n in devices["nodes"]] == ["d1"]


def test_by_taints_a_rule_for_a_device_no_slice_publishes_is_a_missing_reserved_device() -> None:
    cluster = tainted_cluster()
    try:
        # renamed after a reboot on d1; d3 gone with its slice; d2 labelled split though nothing of it is tainted
        cluster.add(
            taint_rule("d1", "gpu-99-199", "0000:23:00.0"),
            taint_rule("d3", "gpu-9-137", "0000:03:00.0"),
            node("d2", labels=SPLIT_LABELS, allocatable={}),
        )
        report = run(cluster)
    finally:
        cluster.stop()
    assert keyed(report) == {
        ("reserved-device-held-by-other-class", "ml/trainer-stray"),
        ("reserved-device-missing", "d1"),
        ("reserved-device-missing", "d3"),
        ("split-node-label-out-of-date", "d2"),
    }
    by_node = {f.name: f.message for f in report.findings if f.rule == "reserved-device-missing"}
    assert (
        "DeviceTaintRule rocm-isolation-reserved-d1-gpu-99-199 (gpu-99-199 of pool d1, PCI bus ID 0000:23:00.0) "
        "taints a device no ResourceSlice publishes"
    ) in by_node["d1"]
    assert "not 2" not in by_node["d1"]  # d1 still has its two tainted GPUs
    assert "rocm-isolation-reserved-d3-gpu-9-137" in by_node["d3"] and "its rules taint 0 GPUs" not in by_node["d3"]
    assert "pool apply --devices-per-node 2 --nodes d1,d3 derives the rules" in by_node["d1"]
    [label] = [f for f in report.findings if f.rule == "split-node-label-out-of-date"]
    assert "no DeviceTaintRule of ours taints a device of it" in label.message


def test_by_taints_rules_not_readable_leave_the_reservation_unjudged_with_a_warning() -> None:
    cluster = tainted_cluster()
    cluster.forbid("devicetaintrules")
    try:
        report = run(cluster)
    finally:
        cluster.stop()
    assert not {f.rule for f in report.findings} & {rule for rule, _ in DEVICE_EXPECTED}
    assert report.devices is None
    assert any("DeviceTaintRules not read" in w and "devicetaintrules" in w for w in report.warnings)
    assert any(
        "records a split by DeviceTaintRules, but the DeviceTaintRules were not read" in w for w in report.warnings
    )


def test_rules_left_over_while_the_classes_hold_the_split_are_a_warning(devices_fake: FakeCluster) -> None:
    devices_fake.serve_discovery({"resource.k8s.io/v1": ["devicetaintrules"]})
    devices_fake.add(taint_rule("d2", "gpu-6-134", "0000:63:00.0"))
    report = run(devices_fake)
    assert keyed(report) == DEVICE_EXPECTED
    assert any("DeviceTaintRules of ours are left from a split by taints" in w for w in report.warnings)


def test_every_rule_is_in_the_rule_table_of_operations_md() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    table = docs[docs.index("### Rules") : docs.index("### Capacity")]
    documented = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")}
    assert documented == set(audit.RULES)
    for rule in audit.RULES.values():
        kind = next(line.split("|")[2].strip() for line in table.splitlines() if line.startswith(f"| `{rule.id}`"))
        assert kind == rule.kind, rule.id


def test_a_borrower_holding_a_lent_reserved_device_is_no_finding_while_lending_is_on(devices_fake: FakeCluster) -> None:
    """The keeper lends reserved devices to borrowers (docs/operations.md "Devices of split nodes"): a borrower
    holding one is lent it, not a stray; with lending off the same pod is a finding."""
    stray = devices_fake.get_object("pods", "trainer-stray", "ml")
    assert stray is not None
    stray["spec"].update({"priorityClassName": "rocm-isolation-borrower", "priority": -100})
    devices_fake.add({"apiVersion": "v1", "kind": "Pod", **stray})
    document = POLICY.document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["lending"] = {"enabled": True}
    lending = parse_policy(yaml.safe_dump(document))
    api = KubeApi(devices_fake.api_client(), page_size=3)
    on = {
        f.name
        for f in audit.run_audit(api, lending, now=NOW).findings
        if f.rule == "reserved-device-held-by-other-class"
    }
    off = {
        f.name
        for f in audit.run_audit(api, POLICY, now=NOW).findings
        if f.rule == "reserved-device-held-by-other-class"
    }
    assert "trainer-stray" not in on and "trainer-stray" in off
