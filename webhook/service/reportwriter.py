"""The background audit's reports in the cluster: ``webhook.ops.audit.reports`` objects, written with server-side apply.

Each round:

1. discovery: which of the report APIs (``reports.APIS``) the cluster serves, both, one or none (a
   ``GET /apis/GROUP/VERSION`` listing both report resources). None is no error: nothing is written.
   What was found is logged once (and again only when it changes) and shown in ``/readyz``;
2. per API served: the reports of ours already there (one ``list`` per kind, all namespaces, by the
   ``app.kubernetes.io/managed-by`` label), compared with the findings (``reports.plan``);
3. the changed or new reports applied (``PATCH`` ``application/apply-patch+yaml``, field manager
   ``rocm-isolation-audit``, ``force``: the reports are this manager's alone), the reports of namespaces
   without findings any more deleted. Nothing is written when nothing changed.

RBAC: ``list``, ``patch`` (server-side apply), ``create`` (which the apiserver also checks when an
apply creates the object) and ``delete`` on the four report resources. A write that fails (a CRD removed meanwhile, RBAC, a report too large for etcd) is logged
and counted, and the others go on: reports never fail the audit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from webhook.cluster.kubeapi import ApiError, KubeApi, NotFound, api_path, resources_served
from webhook.ops.audit import reports
from webhook.ops.audit.findings import Finding
from webhook.ops.audit.reports import ReportApi

log = logging.getLogger("webhook.reports")

FIELD_MANAGER: Final = "rocm-isolation-audit"


def served(api: KubeApi, candidates: Sequence[ReportApi] = reports.APIS) -> tuple[ReportApi, ...]:
    """The report APIs the cluster serves (both report resources of the group/version listed by
    discovery). Raises ``ApiError`` when discovery itself cannot be read (not for a group not served)."""
    out = []
    for candidate in candidates:
        names = resources_served(api, candidate.group_version)
        if names is not None and {candidate.plural, candidate.cluster_plural} <= names:
            out.append(candidate)
    return tuple(out)


@dataclass
class Written:
    """What one round did in one API."""

    applied: int = 0
    deleted: int = 0
    unchanged: int = 0
    errors: list[str] = field(default_factory=list)


def _path(report_api: ReportApi, where: reports.Key) -> str:
    namespace, name = where
    if namespace is None:
        return api_path(report_api.group_version, report_api.cluster_plural, name=name)
    return api_path(report_api.group_version, report_api.plural, namespace=namespace, name=name)


def existing(api: KubeApi, report_api: ReportApi) -> list[dict[str, Any]]:
    """Our reports of one API: the namespaced ones of every namespace, and the cluster-scoped ones."""
    out: list[dict[str, Any]] = []
    for plural in (report_api.plural, report_api.cluster_plural):
        out.extend(api.list(api_path(report_api.group_version, plural), label_selector=reports.SELECTOR))
    return out


def write(api: KubeApi, report_api: ReportApi, findings: Sequence[Finding], *, now: datetime | None = None) -> Written:
    """One API's reports brought to ``findings``. Raises ``ApiError`` when its reports cannot be listed;
    a failed write of one report is in ``errors`` and the others are still written."""
    seconds = int((now or datetime.now(UTC)).timestamp())
    todo = reports.plan(reports.documents(findings, seconds, report_api), existing(api, report_api))
    done = Written(unchanged=todo.unchanged)
    for report in todo.apply:
        try:
            api.apply(_path(report_api, reports.key(report)), report, field_manager=FIELD_MANAGER, force=True)
            done.applied += 1
        except ApiError as err:
            done.errors.append(f"{report['kind']} {_where(reports.key(report))}: {err}")
    for where in todo.delete:
        try:
            api.delete(_path(report_api, where))
            done.deleted += 1
        except NotFound:
            done.deleted += 1
        except ApiError as err:
            done.errors.append(f"delete {_where(where)}: {err}")
    return done


def _where(where: reports.Key) -> str:
    namespace, name = where
    return f"{namespace}/{name}" if namespace else name


class ReportWriter:
    """The reports of the background audit: discovery each round, said once, writes per API served."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._lock = threading.Lock()
        self._served: tuple[ReportApi, ...] | None = None  # None: not discovered yet
        self._status: dict[str, Any] = {"detail": "not written yet: the first background audit has not run"}

    def status(self) -> dict[str, Any]:
        """For ``/readyz``: which APIs are written and what the last round did (never a failure)."""
        with self._lock:
            return dict(self._status)

    def discover(self) -> tuple[ReportApi, ...] | None:
        """The report APIs served now (logged when it changes); None when discovery failed."""
        try:
            found = served(self.api)
        except ApiError as err:
            log.warning("audit reports: cannot read the API discovery, no report written", extra={"error": str(err)})
            return None
        if found != self._served:
            if found:
                log.info(
                    "audit reports: written as " + " and ".join(f"{a.kind}/{a.cluster_kind} ({a.name})" for a in found)
                )
            else:
                log.info(
                    "audit reports: no report API served (neither wgpolicyk8s.io/v1alpha2 nor openreports.io/v1alpha1"
                    " CRDs installed): findings are in the metrics only"
                )
            self._served = found
        return found

    def write(self, findings: Sequence[Finding], *, now: datetime | None = None) -> dict[str, Written]:
        found = self.discover()
        if found is None:
            self._set({"apis": [], "detail": "API discovery unreadable: no report written this round"})
            return {}
        results: dict[str, Written] = {}
        for report_api in found:
            try:
                results[report_api.name] = done = write(self.api, report_api, findings, now=now)
            except ApiError as err:
                results[report_api.name] = done = Written(errors=[f"cannot list the reports: {err}"])
            for error in done.errors:
                log.warning("audit report not written", extra={"api": report_api.name, "error": error})
            if done.applied or done.deleted:
                log.info(
                    "audit reports written",
                    extra={"api": report_api.name, "applied": done.applied, "deleted": done.deleted},
                )
        self._set(
            {
                "apis": [a.name for a in found],
                "detail": (
                    "written as " + ", ".join(f"{a.kind}/{a.cluster_kind}" for a in found)
                    if found
                    else "no report API served (wgpolicyk8s.io/v1alpha2, openreports.io/v1alpha1): none written"
                ),
                "lastRound": {
                    name: {
                        "applied": w.applied,
                        "deleted": w.deleted,
                        "unchanged": w.unchanged,
                        **({"errors": w.errors[:5]} if w.errors else {}),
                    }
                    for name, w in results.items()
                },
            }
        )
        return results

    def _set(self, status: dict[str, Any]) -> None:
        with self._lock:
            self._status = status

    def close(self) -> None:
        self.api.close()
