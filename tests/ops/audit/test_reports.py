"""webhook.ops.audit.reports (findings -> report objects per API, and what a round writes) and the parts of
webhook.service.reportwriter that need no apiserver (discovery answers, the serve flag). The writes
themselves run against a real kube-apiserver: tests/e2e/test_e2e_reports.py."""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

import pytest

from webhook.cluster.kubeapi import NotFound
from webhook.ops.audit import reports
from webhook.ops.audit.command import RULES, Finding
from webhook.ops.audit.reports import OPENREPORTS, REPORT_NAME, WGPOLICY
from webhook.service import serve
from webhook.service.reportwriter import served

POD = Finding("pod-on-reserved-node", "Pod", "trainer", "pod ml/trainer runs on r1", "ml", "uid-1")
POD_2 = Finding("pod-missing-mutations", "Pod", "llm", "pod serve/llm lacks env", "serve", "uid-2")
NODE = Finding("node-label-without-taint", "Node", "r2", "node r2 lacks the taint")
NAMESPACE = Finding("namespace-allows-privileged", "Namespace", "ml", "ml enforces no Pod Security")
DEVICE_CLASS = Finding("deviceclass-not-in-policy", "DeviceClass", "gpu.example.com", "not in the scope")
ALL = [POD, POD_2, NODE, NAMESPACE, DEVICE_CLASS]


@pytest.mark.parametrize("api", [WGPOLICY, OPENREPORTS], ids=lambda a: a.name)
def test_one_report_per_namespace_and_one_cluster_report(api: reports.ReportApi) -> None:
    documents = reports.documents(ALL, 1_700_000_000, api)
    where = [(d["apiVersion"], d["kind"], d["metadata"].get("namespace")) for d in documents]
    assert where == [
        (api.group_version, api.cluster_kind, None),
        (api.group_version, api.kind, "ml"),
        (api.group_version, api.kind, "serve"),
    ]
    for document in documents:
        assert document["metadata"]["name"] == REPORT_NAME
        assert document["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "rocm-isolation-webhook"}
        assert ("source" in document) is (api is OPENREPORTS)
        counts = document["summary"]
        assert sum(counts.values()) == len(document["results"])
        assert counts["fail"] == sum(r["result"] == "fail" for r in document["results"])
        assert counts["warn"] == sum(r["result"] == "warn" for r in document["results"])
    cluster = documents[0]
    assert [r["rule"] for r in cluster["results"]] == [
        "node-label-without-taint",
        "namespace-allows-privileged",
        "deviceclass-not-in-policy",
    ]
    assert cluster["summary"] == {"pass": 0, "fail": 2, "warn": 1, "error": 0, "skip": 0}


def test_a_result_carries_what_policy_reporter_shows() -> None:
    ml = reports.documents([POD, NAMESPACE, DEVICE_CLASS], 1_700_000_000, OPENREPORTS)
    result = ml[1]["results"][0]
    assert result == {
        "policy": "rocm-isolation",
        "rule": "pod-on-reserved-node",
        "result": "fail",
        "severity": RULES["pod-on-reserved-node"].severity,
        "category": "GPU isolation",
        "source": "rocm-isolation-webhook",
        "scored": True,
        "message": "pod ml/trainer runs on r1",
        "timestamp": {"seconds": 1_700_000_000, "nanos": 0},
        "resources": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer", "namespace": "ml", "uid": "uid-1"}],
    }
    namespace, device_class = ml[0]["results"]
    # Low severity is advice: warn, not scored.
    assert (namespace["result"], namespace["severity"], namespace["scored"]) == ("warn", "low", False)
    assert namespace["resources"] == [{"apiVersion": "v1", "kind": "Namespace", "name": "ml"}]
    assert device_class["resources"][0]["apiVersion"] == "resource.k8s.io/v1"


def test_every_rule_has_a_valid_severity_and_outcome() -> None:
    for rule in RULES:
        assert reports.severity(rule) in {"critical", "high", "medium", "low", "info"}
        assert reports.outcome(rule) == ("warn" if RULES[rule].severity == "low" else "fail")
    # A finding whose rule the table lacks (a rule of a newer audit than this table) is still a result.
    unknown = Finding("rule-of-a-newer-audit", "ConfigMap", "params", "out of date", "rocm-isolation-system")
    (_, report) = reports.documents([unknown], 0)
    assert report["results"][0]["severity"] == reports.DEFAULT_SEVERITY and report["results"][0]["result"] == "fail"


def test_no_findings_is_an_empty_cluster_report() -> None:
    assert reports.documents([], 5, WGPOLICY) == [
        {
            "apiVersion": "wgpolicyk8s.io/v1alpha2",
            "kind": "ClusterPolicyReport",
            "metadata": {"name": REPORT_NAME, "labels": {"app.kubernetes.io/managed-by": "rocm-isolation-webhook"}},
            "summary": {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0},
            "results": [],
        }
    ]


def test_findings_round_trip_through_the_childs_json() -> None:
    for finding in ALL:
        assert reports.finding_from_json(finding.to_json()) == finding


def stored(document: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver hands back: the same content plus server fields."""
    out = copy.deepcopy(document)
    out["metadata"].update(resourceVersion="7", uid="x", managedFields=[{"manager": "rocm-isolation-audit"}])
    return out


def test_the_same_findings_later_write_nothing() -> None:
    first = [stored(d) for d in reports.documents(ALL, 1000, WGPOLICY)]
    plan = reports.plan(reports.documents(ALL, 2000, WGPOLICY), first)
    assert plan.apply == [] and plan.delete == [] and plan.unchanged == 3


def test_a_new_finding_rewrites_only_its_report_and_keeps_old_timestamps() -> None:
    first = [stored(d) for d in reports.documents([POD, NODE], 1000, WGPOLICY)]
    extra = Finding("pod-would-be-denied", "Pod", "other", "denied now", "ml", "uid-3")
    plan = reports.plan(reports.documents([POD, NODE, extra], 2000, WGPOLICY), first)
    assert plan.unchanged == 1 and plan.delete == []
    (ml,) = plan.apply
    assert ml["metadata"]["namespace"] == "ml"
    assert [(r["rule"], r["timestamp"]["seconds"]) for r in ml["results"]] == [
        ("pod-on-reserved-node", 1000),  # first found then
        ("pod-would-be-denied", 2000),
    ]
    assert ml["summary"]["fail"] == 2


def test_a_namespace_whose_findings_are_gone_loses_its_report() -> None:
    first = [stored(d) for d in reports.documents(ALL, 1000, OPENREPORTS)]
    plan = reports.plan(reports.documents([POD, NODE], 2000, OPENREPORTS), first)
    assert plan.delete == [("serve", REPORT_NAME)]
    # The cluster report loses two results (applied), ml's report is as it was.
    assert [reports.key(r) for r in plan.apply] == [(None, REPORT_NAME)]
    assert [r["rule"] for r in plan.apply[0]["results"]] == ["node-label-without-taint"]
    assert plan.unchanged == 1


def test_a_changed_message_is_rewritten() -> None:
    first = [stored(d) for d in reports.documents([POD], 1000, WGPOLICY)]
    moved = Finding(POD.rule, POD.kind, POD.name, "pod ml/trainer runs on r2", POD.namespace, POD.uid)
    plan = reports.plan(reports.documents([moved], 2000, WGPOLICY), first)
    assert [reports.key(r) for r in plan.apply] == [("ml", REPORT_NAME)]
    assert plan.apply[0]["results"][0]["timestamp"]["seconds"] == 2000


def test_reports_of_others_are_left_alone() -> None:
    kyverno = {"metadata": {"name": "cpol-require-labels", "namespace": "ml", "labels": {"managed-by": "kyverno"}}}
    same_name = {"metadata": {"name": REPORT_NAME, "namespace": "serve"}, "results": []}  # not labelled ours
    plan = reports.plan(reports.documents([], 0, WGPOLICY), [kyverno, same_name])
    assert plan.delete == [] and [reports.key(r) for r in plan.apply] == [(None, REPORT_NAME)]


def test_a_relabelled_report_is_applied_again() -> None:
    first = [stored(d) for d in reports.documents([POD], 1000, WGPOLICY)]
    first[1]["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone"  # no longer ours: re-created
    plan = reports.plan(reports.documents([POD], 1000, WGPOLICY), first)
    assert [reports.key(r) for r in plan.apply] == [("ml", REPORT_NAME)]


class Discovery:
    """A KubeApi stand-in answering discovery only."""

    def __init__(self, groups: dict[str, list[str]]) -> None:
        self.groups = groups

    def get(self, path: str) -> dict[str, Any]:
        group_version = path.removeprefix("/apis/")
        if group_version not in self.groups:
            raise NotFound(f"{path} not found", status=404, path=path)
        return {"kind": "APIResourceList", "resources": [{"name": n} for n in self.groups[group_version]]}


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ({}, ()),
        ({"wgpolicyk8s.io/v1alpha2": ["policyreports", "clusterpolicyreports"]}, (WGPOLICY,)),
        ({"openreports.io/v1alpha1": ["reports", "clusterreports"]}, (OPENREPORTS,)),
        (
            {
                "wgpolicyk8s.io/v1alpha2": ["policyreports", "clusterpolicyreports"],
                "openreports.io/v1alpha1": ["reports", "clusterreports", "reports/status"],
            },
            (WGPOLICY, OPENREPORTS),
        ),
        ({"openreports.io/v1alpha1": ["reports"]}, ()),  # half the CRDs: not written
    ],
)
def test_discovery_decides_the_apis(groups: dict[str, list[str]], expected: tuple[reports.ReportApi, ...]) -> None:
    assert served(Discovery(groups)) == expected  # type: ignore[arg-type]


def test_serve_writes_reports_unless_told_not_to() -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.settings_from_args(parser.parse_args(["--no-cluster"])).audit_reports is True
    assert serve.settings_from_args(parser.parse_args(["--no-cluster", "--no-audit-reports"])).audit_reports is False


class RecordingWriter:
    def __init__(self) -> None:
        self.rounds: list[list[Finding]] = []
        self.closed = False

    def write(self, findings: list[Finding]) -> dict[str, Any]:
        self.rounds.append(findings)
        return {}

    def status(self) -> dict[str, Any]:
        return {"apis": ["openreports.io/v1alpha1"], "detail": "written as Report/ClusterReport"}

    def close(self) -> None:
        self.closed = True


def test_the_background_audit_hands_its_findings_to_the_writer() -> None:
    import json
    import sys

    from webhook.service.auditloop import BackgroundAudit
    from webhook.service.metrics import Metrics

    document = {"findings": [POD.to_json(), NODE.to_json()], "capacity": {}}
    child = [sys.executable, "-c", f"import sys; print({json.dumps(json.dumps(document))}); sys.exit(1)"]
    writer = RecordingWriter()
    auditor = BackgroundAudit(child, Metrics(), interval=60, reports=writer)  # type: ignore[arg-type]
    assert auditor.run_once()
    assert writer.rounds == [[POD, NODE]]
    assert auditor.reports_status()["apis"] == ["openreports.io/v1alpha1"]
    auditor.stop()
    assert writer.closed
    off = BackgroundAudit(child, Metrics(), interval=60)
    assert off.run_once() and off.reports_status() == {"apis": [], "detail": "off (serve --no-audit-reports)"}


def _many(count: int, namespace: str | None = "ml") -> list[Finding]:
    # A message as long as the audit's (the pod, its node, the rule's advice): ~200 characters.
    advice = "it runs on a node reserved for inference; delete it, the webhook places its next incarnation " * 2
    return [
        Finding(
            "pod-on-reserved-node", "Pod", f"trainer-{i}", f"pod ml/trainer-{i} on r1: {advice}", namespace, f"u{i}"
        )
        for i in range(count)
    ]


def test_a_report_holds_at_most_max_results_and_says_how_many_it_left_out() -> None:
    findings = _many(reports.MAX_RESULTS + 250)
    report = reports.documents(findings, 1)[1]
    assert len(report["results"]) == reports.MAX_RESULTS
    assert report["summary"]["fail"] == reports.MAX_RESULTS  # the summary counts what the report holds
    assert report["metadata"]["annotations"] == {reports.OMITTED_ANNOTATION: "250"}
    assert [r["resources"][0]["name"] for r in report["results"]][:2] == ["trainer-0", "trainer-1"]
    # what etcd accepts: 1.5 MiB per object (its default --max-request-bytes)
    assert len(json.dumps(report)) < 1.5 * 1024 * 1024


def test_the_cap_keeps_the_fail_results_before_the_advice() -> None:
    advice = [NAMESPACE] * 30  # warn results, found first
    nodes = [
        Finding("node-label-without-taint", "Node", f"n{i}", "lacks the taint") for i in range(reports.MAX_RESULTS)
    ]
    report = reports.documents([*advice, *nodes], 1)[0]
    assert {r["result"] for r in report["results"]} == {"fail"}
    assert report["summary"] == {"pass": 0, "fail": reports.MAX_RESULTS, "warn": 0, "error": 0, "skip": 0}
    assert report["metadata"]["annotations"] == {reports.OMITTED_ANNOTATION: "30"}


def test_a_report_under_the_cap_has_no_omitted_annotation() -> None:
    report = reports.documents(_many(reports.MAX_RESULTS), 1)[1]
    assert len(report["results"]) == reports.MAX_RESULTS and "annotations" not in report["metadata"]


def test_more_findings_beyond_the_cap_rewrite_the_report() -> None:
    """The kept results are the same, only the count left out grew: the report is written again."""
    before = [stored(d) for d in reports.documents(_many(reports.MAX_RESULTS + 10), 1)]
    again = reports.plan(reports.documents(_many(reports.MAX_RESULTS + 10), 2), before)
    assert again.apply == [] and again.unchanged == 2
    grown = reports.plan(reports.documents(_many(reports.MAX_RESULTS + 20), 2), before)
    assert [reports.key(r) for r in grown.apply] == [("ml", reports.REPORT_NAME)]
    assert grown.apply[0]["metadata"]["annotations"] == {reports.OMITTED_ANNOTATION: "20"}
