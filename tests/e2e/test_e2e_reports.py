"""The background audit's reports in the cluster (webhook/service/reportwriter.py), on the real apiserver with the
report CRDs as their projects publish them (tests/e2e/fixtures): both APIs installed, one, or none.

The writer runs as the webhook's ServiceAccount (the manifests' RBAC: list, create, patch, delete on
the report resources, nothing else), driven directly over rounds: reports created by server-side
apply, the same findings again writing nothing, a finding gone (its result removed, a namespace
without findings losing its report). Then once through a real ``serve`` process with a 2 s audit interval:
real findings appear as reports and go away when fixed, and /readyz says where they are written."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.cluster.kubeapi import KubeApi, api_path
from webhook.ops.audit import reports
from webhook.ops.audit.command import Finding
from webhook.ops.audit.reports import OPENREPORTS, REPORT_NAME, WGPOLICY, ReportApi
from webhook.service.reportwriter import FIELD_MANAGER, ReportWriter

from .harness import WEBHOOK_NAMESPACE, Cluster, gpu_pod
from .kube import ApiError, Obj, wait_until

FIXTURES = Path(__file__).parent / "fixtures"
CRD_FILES = {WGPOLICY: FIXTURES / "wgpolicyk8s.io-crds.yaml", OPENREPORTS: FIXTURES / "openreports.io-crds.yaml"}
LEASE = "rocm-isolation-webhook-audit"
T1 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
T2 = datetime(2026, 12, 1, 8, 5, tzinfo=UTC)


def _crds(api: ReportApi) -> list[Obj]:
    items: list[Obj] = yaml.safe_load(CRD_FILES[api].read_text(encoding="utf-8"))["items"]
    return items


def _discovered(cluster: Cluster, api: ReportApi) -> bool:
    try:
        # raw: a group/version not served is answered 404 with a plain-text body
        listed = json.loads(cluster.kube.request("GET", f"/apis/{api.group_version}", raw=True))
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    names = {r["name"] for r in listed.get("resources", [])}
    return {api.plural, api.cluster_plural} <= names


def _remove(cluster: Cluster, api: ReportApi) -> None:
    for crd in _crds(api):
        cluster.kube.delete("CustomResourceDefinition", crd["metadata"]["name"])
    for crd in _crds(api):
        name = crd["metadata"]["name"]
        wait_until(
            lambda n=name: cluster.kube.get_or_none("CustomResourceDefinition", n) is None,
            timeout=120,
            what=f"CRD {name} gone",
        )
    wait_until(lambda: not _discovered(cluster, api), timeout=60, what=f"{api.name} no longer discovered")


def _install(cluster: Cluster, api: ReportApi) -> None:
    for crd in _crds(api):
        cluster.kube.apply(crd)
    for crd in _crds(api):
        name = crd["metadata"]["name"]
        wait_until(functools.partial(cluster.kube.crd_established, name), timeout=60, what=f"CRD {name} established")
    wait_until(lambda: _discovered(cluster, api), timeout=60, what=f"{api.name} discovered")


INSTALLS = {
    "both": (WGPOLICY, OPENREPORTS),
    "wgpolicyk8s.io only": (WGPOLICY,),
    "openreports.io only": (OPENREPORTS,),
    "none": (),
}


@pytest.fixture(params=list(INSTALLS))
def served(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[tuple[ReportApi, ...]]:
    """Exactly the report CRDs of the parameter installed (the others removed, e.g. by an earlier test)."""
    wanted: tuple[ReportApi, ...] = INSTALLS[request.param]
    for api in (WGPOLICY, OPENREPORTS):
        if api in wanted:
            _install(cluster, api)
        elif _discovered(cluster, api) or any(
            cluster.kube.get_or_none("CustomResourceDefinition", c["metadata"]["name"]) for c in _crds(api)
        ):
            _remove(cluster, api)
    yield wanted
    for api in wanted:
        _remove(cluster, api)


@pytest.fixture
def webhook_api(cluster: Cluster) -> Iterator[KubeApi]:
    """The webhook's own credentials: what the manifests' RBAC allows, nothing more."""
    api = KubeApi.connect(str(cluster.webhook_kubeconfig))
    yield api
    api.close()


def _path(api: ReportApi, namespace: str | None) -> str:
    if namespace is None:
        return api_path(api.group_version, api.cluster_plural, name=REPORT_NAME)
    return api_path(api.group_version, api.plural, namespace=namespace, name=REPORT_NAME)


def _read(cluster: Cluster, api: ReportApi, namespace: str | None) -> Obj | None:
    try:
        found: Obj = cluster.kube.request("GET", _path(api, namespace))
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    return found


def _results(report: Obj | None) -> list[tuple[str, str]]:
    return [(r["rule"], r["resources"][0]["name"]) for r in (report or {}).get("results", [])]


def test_the_writer_across_rounds(
    cluster: Cluster,
    served: tuple[ReportApi, ...],
    webhook_api: KubeApi,
    namespace: Callable[..., str],
) -> None:
    first, second = namespace("a"), namespace("b")
    node = cluster.shared[0]
    pod_a = Finding(
        "pod-on-reserved-node", "Pod", "trainer", f"pod {first}/trainer runs on a reserved node", first, "u1"
    )
    pod_b = Finding("pod-missing-mutations", "Pod", "llm", f"pod {second}/llm lacks env", second, "u2")
    node_f = Finding("node-taint-without-label", "Node", node, f"node {node} has the taint without the label")
    ns_f = Finding("namespace-allows-privileged", "Namespace", first, f"{first} enforces no Pod Security")
    writer = ReportWriter(webhook_api)

    # Round 1: every report created (server-side apply).
    done = writer.write([pod_a, pod_b, node_f, ns_f], now=T1)
    assert sorted(done) == sorted(api.name for api in served)
    status = writer.status()
    assert status["apis"] == [api.name for api in served]
    if not served:
        assert "no report API served" in status["detail"]
        for api in (WGPOLICY, OPENREPORTS):
            assert not _discovered(cluster, api)
        return
    expected = {d["metadata"].get("namespace"): d for d in reports.documents([pod_a, pod_b, node_f, ns_f], 0)}
    versions: dict[tuple[str, str | None], str] = {}
    for api in served:
        assert (done[api.name].applied, done[api.name].deleted, done[api.name].errors) == (3, 0, []), done
        for where in (None, first, second):
            report = _read(cluster, api, where)
            assert report is not None, (api.name, where)
            assert report["kind"] == (api.cluster_kind if where is None else api.kind)
            # Nothing pruned by the published schema: the apiserver holds what was written.
            assert _results(report) == _results(expected[where])
            assert report["results"][0]["timestamp"] == {"seconds": int(T1.timestamp()), "nanos": 0}
            assert report["summary"]["fail"] + report["summary"]["warn"] == len(report["results"])
            assert report.get("source") == ("rocm-isolation-webhook" if api is OPENREPORTS else None)
            managers = {(m["manager"], m["operation"]) for m in report["metadata"]["managedFields"]}
            assert managers == {(FIELD_MANAGER, "Apply")}
            versions[api.name, where] = report["metadata"]["resourceVersion"]
        cluster_report = _read(cluster, api, None)
        assert cluster_report is not None
        # The node's finding (medium severity: fail) and the namespace's (low: warn).
        assert cluster_report["summary"] == {"pass": 0, "fail": 1, "warn": 1, "error": 0, "skip": 0}
        assert {r["result"] for r in cluster_report["results"]} == {"fail", "warn"}

    # Round 2, five minutes later, the same findings: nothing written.
    done = writer.write([pod_a, pod_b, node_f, ns_f], now=T2)
    for api in served:
        assert (done[api.name].applied, done[api.name].deleted, done[api.name].unchanged) == (0, 0, 3)
        for where in (None, first, second):
            report = _read(cluster, api, where)
            assert report is not None and report["metadata"]["resourceVersion"] == versions[api.name, where]

    # Round 3: the node fixed, the second namespace's pod gone.
    done = writer.write([pod_a, ns_f], now=T2)
    for api in served:
        assert (done[api.name].applied, done[api.name].deleted, done[api.name].errors) == (1, 1, [])
        assert _read(cluster, api, second) is None  # a namespace without findings has no report
        cluster_report = _read(cluster, api, None)
        assert _results(cluster_report) == [("namespace-allows-privileged", first)]
        assert cluster_report is not None and cluster_report["summary"]["warn"] == 1
        assert cluster_report["summary"]["fail"] == 0
        # Still found: its first timestamp kept.
        assert cluster_report["results"][0]["timestamp"]["seconds"] == int(T1.timestamp())
        kept = _read(cluster, api, first)
        assert kept is not None and kept["metadata"]["resourceVersion"] == versions[api.name, first]

    # Nothing found at all: the cluster report stays, empty; the namespaced ones go.
    done = writer.write([], now=T2)
    for api in served:
        assert _read(cluster, api, first) is None
        empty = _read(cluster, api, None)
        assert empty is not None and empty.get("results", []) == [] and sum(empty["summary"].values()) == 0


def test_a_report_of_another_tool_is_left_alone(
    cluster: Cluster, webhook_api: KubeApi, namespace: Callable[..., str]
) -> None:
    _install(cluster, OPENREPORTS)
    try:
        where = namespace()
        other = {
            "apiVersion": OPENREPORTS.group_version,
            "kind": "Report",
            "metadata": {"name": "kyverno-require-labels", "namespace": where, "labels": {"managed-by": "kyverno"}},
            "source": "kyverno",
            "summary": {"pass": 0, "fail": 1, "warn": 0, "error": 0, "skip": 0},
            "results": [{"policy": "require-labels", "result": "fail", "message": "no team label"}],
        }
        cluster.kube.request("POST", api_path(OPENREPORTS.group_version, "reports", namespace=where), other)
        writer = ReportWriter(webhook_api)
        finding = Finding("pod-would-be-denied", "Pod", "p", "denied", where, "u")
        writer.write([finding], now=T1)
        writer.write([], now=T2)  # ours deleted again
        assert _read(cluster, OPENREPORTS, where) is None
        kept = cluster.kube.request(
            "GET", api_path(OPENREPORTS.group_version, "reports", namespace=where, name="kyverno-require-labels")
        )
        assert kept["results"] == other["results"]
    finally:
        _remove(cluster, OPENREPORTS)


# --- through serve --------------------------------------------------------------------------------


def _readyz(webhook: Any) -> dict[str, Any]:
    _, text = webhook.get("/readyz")
    detail: dict[str, Any] = json.loads(text)["checks"]["auditReports"]
    return detail


def test_serve_writes_real_findings_and_removes_them_when_fixed(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    _install(cluster, WGPOLICY)
    _install(cluster, OPENREPORTS)
    odd = namespace("odd", labels={"rocm-isolation.io/class": "gpu-wizards"})  # namespace-unknown-class
    training = namespace("train", labels={"rocm-isolation.io/class": "training"})
    # A training GPU pod admitted while the webhook was out of the path: it lacks the placement.
    with cluster.without_webhook_configuration():
        cluster.kube.create(gpu_pod("unplaced", training))
    webhook = cluster.start_webhook("audit-reports", "--audit-interval-seconds", "2", cert_dir=cluster.webhook.cert_dir)
    try:

        def reported() -> bool:
            return all(
                (odd in json.dumps(_read(cluster, api, None) or {}))
                and any(rule.startswith("pod-") for rule, name in _results(_read(cluster, api, training)))
                for api in (WGPOLICY, OPENREPORTS)
            )

        wait_until(reported, timeout=120, what="the background audit's reports in both APIs")
        for api in (WGPOLICY, OPENREPORTS):
            report = _read(cluster, api, training)
            assert report is not None
            assert [name for _, name in _results(report)] == ["unplaced"] * len(report["results"])
            assert report["results"][0]["resources"][0]["uid"]
            cluster_report = _read(cluster, api, None)
            assert ("namespace-unknown-class", odd) in _results(cluster_report)
        detail = _readyz(webhook)
        assert detail["ok"] is True and detail["apis"] == [WGPOLICY.name, OPENREPORTS.name], detail
        log = webhook.log()
        assert log.count("audit reports: written as") == 1, log  # said once, not every round

        # Fixed: the pod deleted, the namespace's class corrected.
        cluster.kube.delete("Pod", "unplaced", training, force=True)
        cluster.kube.patch("Namespace", odd, {"metadata": {"labels": {"rocm-isolation.io/class": "training"}}})

        def cleared() -> bool:
            return all(
                _read(cluster, api, training) is None
                and ("namespace-unknown-class", odd) not in _results(_read(cluster, api, None))
                for api in (WGPOLICY, OPENREPORTS)
            )

        wait_until(cleared, timeout=120, what="the fixed findings gone from the reports")
        assert webhook.ready()
    finally:
        cluster.plane.processes.stop_one(webhook.component)
        cluster.kube.delete("Lease", LEASE, WEBHOOK_NAMESPACE)
        _remove(cluster, OPENREPORTS)
        _remove(cluster, WGPOLICY)


def test_serve_without_report_apis_or_with_the_flag_off_writes_none(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    for api in (WGPOLICY, OPENREPORTS):
        if _discovered(cluster, api):
            _remove(cluster, api)
    namespace("odd", labels={"rocm-isolation.io/class": "gpu-wizards"})
    webhook = cluster.start_webhook(
        "audit-no-reports", "--audit-interval-seconds", "2", cert_dir=cluster.webhook.cert_dir
    )
    try:
        wait_until(
            lambda: webhook.metric("rocm_isolation_audit_runs_total", result="success") >= 2,
            timeout=120,
            what="two background audits",
        )
        detail = _readyz(webhook)
        assert detail["ok"] is True and detail["apis"] == [] and "no report API served" in detail["detail"], detail
        assert webhook.log().count("audit reports: no report API served") == 1  # said once, never an error
        assert webhook.metric("rocm_isolation_audit_runs_total", result="failure") == 0
    finally:
        cluster.plane.processes.stop_one(webhook.component)
        cluster.kube.delete("Lease", LEASE, WEBHOOK_NAMESPACE)

    _install(cluster, OPENREPORTS)
    off = cluster.start_webhook(
        "audit-reports-off", "--audit-interval-seconds", "2", "--no-audit-reports", cert_dir=cluster.webhook.cert_dir
    )
    try:
        wait_until(
            lambda: off.metric("rocm_isolation_audit_runs_total", result="success") >= 2,
            timeout=120,
            what="two background audits",
        )
        assert _read(cluster, OPENREPORTS, None) is None  # the flag is off: nothing written
        assert _readyz(off)["detail"] == "off (serve --no-audit-reports)"
    finally:
        cluster.plane.processes.stop_one(off.component)
        cluster.kube.delete("Lease", LEASE, WEBHOOK_NAMESPACE)
        _remove(cluster, OPENREPORTS)
