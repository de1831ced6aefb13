"""Audit findings as report objects, in both report APIs that policy UIs read (pure: no I/O).

- ``wgpolicyk8s.io/v1alpha2`` PolicyReport / ClusterPolicyReport: the Policy WG's CRDs, which Kyverno
  installs and Policy Reporter displays;
- ``openreports.io/v1alpha1`` Report / ClusterReport: their successor (Kyverno 1.15+ can emit it).
  Same result shape; the report itself carries ``source`` too.

One namespaced report per namespace with findings (the pods, and the backstop's ConfigMap in the
webhook's namespace) and one cluster-scoped report (nodes, namespaces, DeviceClasses), all named
``rocm-isolation-audit`` and labelled ``app.kubernetes.io/managed-by: rocm-isolation-webhook``. The
cluster-scoped report is always there (no result: the audit ran and found nothing); a namespace
without findings has no report (``plan`` deletes the one it had).

Each finding is one result: ``policy: rocm-isolation``, ``rule`` (the stable rule id), ``result``
(``fail``, or ``warn`` for the low-severity rules: advice, not scored), ``severity``, ``message``,
the object (``resources``: apiVersion, kind, name, namespace, uid) and a timestamp. The summary
counts them (``fail + warn == len(results)``). A report holds at most ``MAX_RESULTS`` results (fail
first); ``rocm-isolation.io/results-omitted`` says how many more the audit found.

``plan`` compares what is there with what the audit found: a result already reported keeps its
timestamp (when it was first found), so a round that finds the same as the last one writes
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.ops.audit.findings import POLICY_NAME, RULES, SOURCE, Finding

REPORT_NAME: Final = "rocm-isolation-audit"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABELS: Final = {MANAGED_BY: SOURCE}
SELECTOR: Final = f"{MANAGED_BY}={SOURCE}"
CATEGORY: Final = "GPU isolation"
WARN_SEVERITIES: Final = frozenset({"low", "info"})
# A rule id the table does not list (cannot happen for the audit's own rules): still reported.
DEFAULT_SEVERITY: Final = "medium"
# What a report's content is, for "did it change": the fields written here besides metadata.
_CONTENT: Final = ("source", "summary", "results")
# Results per report: a result is ~0.6 KiB of JSON and etcd refuses an object over 1.5 MiB (its default
# --max-request-bytes), so a namespace with thousands of findings would get no report at all. Beyond
# the cap the fail results are kept first; the annotation says how many were left out (``audit -o json``
# has them all).
MAX_RESULTS: Final = 1000
OMITTED_ANNOTATION: Final = "rocm-isolation.io/results-omitted"


@dataclass(frozen=True)
class ReportApi:
    """One report API: its group/version and the kinds (and plurals) of its two reports."""

    group: str
    version: str
    kind: str
    plural: str
    cluster_kind: str
    cluster_plural: str
    report_source: bool  # the report itself has a ``source`` field

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def name(self) -> str:
        """How logs and /readyz name it: ``wgpolicyk8s.io/v1alpha2``."""
        return self.group_version


WGPOLICY: Final = ReportApi(
    "wgpolicyk8s.io", "v1alpha2", "PolicyReport", "policyreports", "ClusterPolicyReport", "clusterpolicyreports", False
)
OPENREPORTS: Final = ReportApi(
    "openreports.io", "v1alpha1", "Report", "reports", "ClusterReport", "clusterreports", True
)
APIS: Final = (WGPOLICY, OPENREPORTS)


def finding_from_json(document: Mapping[str, Any]) -> Finding:
    """A finding of ``audit -o json`` (what the background audit's child prints) back as a Finding."""
    namespace = document.get("namespace")
    return Finding(
        rule=str(document.get("rule", "")),
        kind=str(document.get("kind", "")),
        name=str(document.get("name", "")),
        message=str(document.get("message", "")),
        namespace=str(namespace) if namespace is not None else None,
        uid=str(document.get("uid") or ""),
    )


def severity(rule_id: str) -> str:
    rule = RULES.get(rule_id)
    return rule.severity if rule is not None else DEFAULT_SEVERITY


def outcome(rule_id: str) -> str:
    """``fail``, or ``warn`` for a low-severity rule (advice: Pod Security, an unknown mode label)."""
    return "warn" if severity(rule_id) in WARN_SEVERITIES else "fail"


def result(finding: Finding, seconds: int) -> dict[str, Any]:
    """One finding as a report result (the same in both APIs)."""
    resource: dict[str, Any] = {"apiVersion": _api_version(finding.kind), "kind": finding.kind, "name": finding.name}
    if finding.namespace is not None:
        resource["namespace"] = finding.namespace
    if finding.uid:
        resource["uid"] = finding.uid
    status = outcome(finding.rule)
    return {
        "policy": POLICY_NAME,
        "rule": finding.rule,
        "result": status,
        "severity": severity(finding.rule),
        "category": CATEGORY,
        "source": SOURCE,
        "scored": status == "fail",
        "message": finding.message,
        "timestamp": {"seconds": seconds, "nanos": 0},
        "resources": [resource],
    }


def _api_version(kind: str) -> str:
    return "resource.k8s.io/v1" if kind == "DeviceClass" else "v1"


def summary(results: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    for item in results:
        counts[str(item["result"])] += 1
    return counts


def documents(findings: Sequence[Finding], seconds: int, api: ReportApi = WGPOLICY) -> list[dict[str, Any]]:
    """The reports of one audit in ``api``: the cluster-scoped report first (always, maybe empty),
    then one per namespace with findings, by namespace name; results in the audit's order."""
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    cluster: list[dict[str, Any]] = []
    for finding in findings:
        target = by_namespace.setdefault(finding.namespace, []) if finding.namespace is not None else cluster
        target.append(result(finding, seconds))
    out = [_report(api, None, cluster)]
    out.extend(_report(api, namespace, results) for namespace, results in sorted(by_namespace.items()))
    return out


def capped(results: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """At most ``MAX_RESULTS`` results, the fail results first (each kind in the audit's order), and how
    many were left out."""
    if len(results) <= MAX_RESULTS:
        return results, 0
    ordered = sorted(results, key=lambda item: item["result"] != "fail")  # stable
    return ordered[:MAX_RESULTS], len(results) - MAX_RESULTS


def _report(api: ReportApi, namespace: str | None, results: list[dict[str, Any]]) -> dict[str, Any]:
    results, omitted = capped(results)
    metadata: dict[str, Any] = {"name": REPORT_NAME}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(LABELS)
    if omitted:
        metadata["annotations"] = {OMITTED_ANNOTATION: str(omitted)}
    report: dict[str, Any] = {
        "apiVersion": api.group_version,
        "kind": api.kind if namespace is not None else api.cluster_kind,
        "metadata": metadata,
    }
    if api.report_source:
        report["source"] = SOURCE
    report["summary"] = summary(results)
    report["results"] = results
    return report


# -- what to write --------------------------------------------------------------------------------

Key = tuple[str | None, str]  # (namespace or None for the cluster-scoped report, name)


def key(report: Mapping[str, Any]) -> Key:
    metadata = report.get("metadata") or {}
    namespace = metadata.get("namespace")
    return (str(namespace) if namespace else None, str(metadata.get("name", "")))


@dataclass
class Plan:
    """What one round writes in one API: reports to apply (changed or new), reports to delete
    (a namespace's report whose findings are all gone), and how many were left as they were."""

    apply: list[dict[str, Any]] = field(default_factory=list)
    delete: list[Key] = field(default_factory=list)
    unchanged: int = 0


def _identity(item: Mapping[str, Any]) -> str:
    """A result without its timestamp: the same finding about the same object."""
    return json.dumps({k: v for k, v in item.items() if k != "timestamp"}, sort_keys=True)


def carry_timestamps(results: list[dict[str, Any]], before: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``results`` with the timestamp of the same result already reported (when it was first found)."""
    seen = {_identity(item): item.get("timestamp") for item in before if isinstance(item, Mapping)}
    out = []
    for item in results:
        stamp = seen.get(_identity(item))
        out.append({**item, "timestamp": stamp} if stamp else item)
    return out


def content(report: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a report written here: compared with what the apiserver holds."""
    metadata = report.get("metadata") or {}
    labels = metadata.get("labels") or {}
    omitted = (metadata.get("annotations") or {}).get(OMITTED_ANNOTATION)
    return {
        "labels": {k: labels.get(k) for k in LABELS},
        "omitted": omitted,
        **{name: report.get(name) for name in _CONTENT},
    }


def plan(desired: Sequence[dict[str, Any]], existing: Iterable[Mapping[str, Any]]) -> Plan:
    """Compare the reports an audit would write with the reports of ours the cluster holds (the
    ``REPORT_NAME`` ones labelled as ours; others are ignored)."""
    ours = {
        key(report): report
        for report in existing
        if key(report)[1] == REPORT_NAME
        and ((report.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == SOURCE
    }
    out = Plan()
    wanted = set()
    for report in desired:
        where = key(report)
        wanted.add(where)
        current = ours.get(where)
        if current is not None:
            report = {**report, "results": carry_timestamps(report["results"], current.get("results") or [])}
            if content(report) == content(current):
                out.unchanged += 1
                continue
        out.apply.append(report)
    out.delete = sorted((where for where in ours if where not in wanted), key=lambda k: (k[0] or "", k[1]))
    return out
