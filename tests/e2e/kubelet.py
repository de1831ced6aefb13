"""A kubelet stand-in for the end-to-end tests and the lending benchmark: the control plane of ``../shared/envtest``
has no kubelet, and without one every pod stays Pending, which the Eviction API and the disruption controller
treat differently (a PodDisruptionBudget is ignored for a pod that is not Running and Ready: lending-facts.md
§5)."""

from __future__ import annotations

import calendar
import threading
import time
from dataclasses import dataclass, field

from .kube import ApiError, Kube


@dataclass
class KubeletStandIn:
    """Marks bound pods Running and Ready (status subresource) and finishes a deletion after its grace
    period (delete with grace 0). Nothing else: no container runs, nothing is evicted or restarted."""

    kube: Kube
    namespaces: tuple[str, ...]
    stop: threading.Event = field(default_factory=threading.Event)
    # uid -> (namespace, name, labels) of every pod deleted while it was watched: what was taken back.
    deleted: dict[str, tuple[str, str, dict[str, str]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # uid -> (namespace, name) of every deleted pod the scheduler preempted (or the Eviction API evicted):
    # the DisruptionTarget condition they carry while they terminate.
    disrupted: dict[str, tuple[str, str]] = field(default_factory=dict)

    def _step(self) -> None:
        now = time.time()
        for namespace in self.namespaces:
            for pod in self.kube.list("Pod", namespace):
                meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
                name = meta["name"]
                deleting = meta.get("deletionTimestamp")
                if deleting:
                    self.deleted[meta["uid"]] = (namespace, name, dict(meta.get("labels") or {}))
                    if any(c.get("type") == "DisruptionTarget" for c in status.get("conditions") or []):
                        self.disrupted[meta["uid"]] = (namespace, name)
                    due = calendar.timegm(time.strptime(deleting, "%Y-%m-%dT%H:%M:%SZ"))
                    if now >= due:
                        self.kube.delete("Pod", name, namespace, force=True)
                    continue
                if spec.get("nodeName") and status.get("phase") != "Running":
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    conditions = [
                        {"type": kind, "status": "True", "lastTransitionTime": stamp}
                        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                    ]
                    body = {"status": {"phase": "Running", "startTime": stamp, "conditions": conditions}}
                    self.kube.patch("Pod", name, body, namespace, subresource="status", patch_type="strategic")

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._step()
            except ApiError as err:  # a pod gone between the list and the write: next round
                if err.status not in (404, 409):
                    self.errors.append(str(err))
            self.stop.wait(0.2)
