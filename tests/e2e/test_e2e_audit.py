"""Scenario 5: ``audit`` on the live cluster: findings made for real (a training pod running on a
reserved node, admitted while the webhook was out of the path; a node labelled for the pool without
its taint; a namespace with an unknown class), the reserved pool's capacity, exit codes; and its
PolicyReports accepted by the apiserver with the Policy WG's CRDs installed, nothing pruned."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from .controlplane import MINORS
from .harness import GPUS_PER_NODE, Cluster, gpu_pod
from .kube import ApiError, Obj, wait_until

pytestmark = pytest.mark.minors(*MINORS)  # what every stock minor serves (issue 47)

CRDS = Path(__file__).parent / "fixtures" / "wgpolicyk8s.io-crds.yaml"


def _running(cluster: Cluster, pod: Obj) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.kube.patch(
        "Pod",
        pod["metadata"]["name"],
        {"status": {"phase": "Running", "startTime": now, "conditions": [{"type": "Ready", "status": "True"}]}},
        pod["metadata"]["namespace"],
        subresource="status",
    )


@pytest.fixture
def findings(cluster: Cluster, namespace: Callable[..., str]) -> Iterator[dict[str, str]]:
    """Three things audit must find, made for real; undone at the end."""
    training = namespace("train", labels={"rocm-isolation.io/class": "training"})
    # A training pod running on a node that then joins the reserved pool (`pool apply` without --evict).
    joined = cluster.pool_nodes[1]
    pod = cluster.kube.create(gpu_pod("left-behind", training, node_name=joined))
    _running(cluster, pod)
    unknown = namespace("odd", labels={"rocm-isolation.io/class": "gpu-wizards"})
    half = cluster.pool_nodes[0]
    cluster.kube.patch("Node", half, {"metadata": {"labels": {"rocm-isolation.io/pool": "inference"}}})
    try:
        cluster.cli("pool", "apply", "--nodes", joined, check=True)
        yield {"pod": f"{training}/left-behind", "namespace": unknown, "node": half}
    finally:
        cluster.kube.patch("Node", half, {"metadata": {"labels": {"rocm-isolation.io/pool": None}}})
        cluster.cli("pool", "release", "--nodes", joined, "--force", check=True)


def test_audit_finds_what_is_wrong_on_the_live_cluster(cluster: Cluster, findings: dict[str, str]) -> None:
    result = cluster.cli("audit", "-o", "json")
    assert result.returncode == 1, result.stdout + result.stderr  # 1: findings
    report = json.loads(result.stdout)
    pod = findings["pod"].split("/")[1]

    def found(rule: str, subject: str) -> bool:
        return any(f["rule"] == rule and subject in json.dumps(f) for f in report["findings"])

    rules = sorted({f["rule"] for f in report["findings"]})
    assert found("pod-on-reserved-node", pod), rules
    assert found("node-label-without-taint", findings["node"]), rules
    assert found("namespace-unknown-class", findings["namespace"]), rules
    capacity = report["capacity"]
    reserved, shared = capacity["reserved"], capacity["shared"]
    # The two reserved MI300X nodes and the MI210 node that joined (the half-labelled node is a finding,
    # whichever pool it is counted in), 8 allocatable GPUs each; the left-behind pod's GPU is requested
    # by training on the reserved pool.
    assert reserved["nodes"] in (3, 4) and reserved["nodes"] + shared["nodes"] == 7, capacity
    assert reserved["gpusAllocatable"] == reserved["nodes"] * GPUS_PER_NODE, capacity
    assert shared["gpusAllocatable"] == shared["nodes"] * GPUS_PER_NODE, capacity
    assert reserved["gpusRequested"].get("training") == 1, capacity

    table = cluster.cli("audit")
    assert table.returncode == 1
    assert "pod-on-reserved-node" in table.stdout and pod in table.stdout


def test_audit_exit_codes(cluster: Cluster) -> None:
    unreadable = cluster.workdir / "nowhere.kubeconfig"
    unreadable.write_text(
        cluster.kubeconfig.read_text().replace(cluster.plane.server, "https://127.0.0.1:1"), encoding="utf-8"
    )
    # Nothing wrong on the cluster as the suite leaves it between tests: exit 0 (and the capacity).
    # Namespaces of earlier tests are listed (and judged) until their deletion completes.
    wait_until(
        lambda: all(n.get("status", {}).get("phase") != "Terminating" for n in cluster.kube.list("Namespace")),
        timeout=120,
        what="the namespaces of earlier tests to be gone",
    )
    result = cluster.cli("audit", "-o", "json", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["capacity"]["reserved"]["gpusAllocatable"] == len(cluster.reserved) * GPUS_PER_NODE
    from .harness import cli

    broken = cli("audit", kubeconfig=unreadable, timeout=180)
    assert broken.returncode == 2, broken.stdout + broken.stderr


@pytest.fixture
def policy_report_crds(cluster: Cluster) -> Iterator[None]:
    crds = yaml.safe_load(CRDS.read_text(encoding="utf-8"))["items"]
    for crd in crds:
        cluster.kube.apply(crd)

    for crd in crds:
        wait_until(
            functools.partial(cluster.kube.crd_established, crd["metadata"]["name"]),
            timeout=60,
            what=f"CRD {crd['metadata']['name']} established",
        )
    yield
    for crd in crds:
        cluster.kube.delete("CustomResourceDefinition", crd["metadata"]["name"])


def test_policy_reports_are_accepted_by_the_apiserver(
    cluster: Cluster, findings: dict[str, str], policy_report_crds: None
) -> None:
    result = cluster.cli("audit", "-o", "policyreport")
    assert result.returncode == 1, result.stderr
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = {d["kind"] for d in documents}
    assert kinds >= {"PolicyReport", "ClusterPolicyReport"}, kinds
    namespace, pod = findings["pod"].split("/")
    for document in documents:
        try:
            created = cluster.kube.create(document)
        except ApiError as err:
            pytest.fail(f"{document['kind']} {document['metadata'].get('name')} refused: {err}")
        # Nothing pruned: what the apiserver stored is what audit wrote.
        for key in ("results", "summary", "scope"):
            assert created.get(key) == document.get(key), key
    reports = cluster.kube.list("PolicyReport", namespace)
    assert any(pod in json.dumps(r["results"]) for r in reports), reports
    cluster_reports = cluster.kube.list("ClusterPolicyReport")
    assert any(findings["node"] in json.dumps(r["results"]) for r in cluster_reports), cluster_reports
