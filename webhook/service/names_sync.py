"""Reserved node names that follow the cluster: the backstop's params ConfigMap kept in step by ``serve``.

The ValidatingAdmissionPolicy ``rocm-isolation-reserved-node-names`` reads the reserved node names from a
ConfigMap (``webhook.deploy.reserved_names``). ``pool apply|release`` rewrites it, but nodes reserved by
other tools (Terraform node groups, Karpenter NodePools, GitOps) or added later by an autoscaler stayed
unknown to it. The replica holding the background audit's Lease (one at a time) now compares, every
``interval`` seconds, the nodes that carry the reserved label in its watch cache with the ConfigMap's
keys, and patches the ConfigMap when they differ: within seconds of a node being labelled, added or
removed, by whatever tool.

- It writes the same content as ``pool`` (one key per node, compared before writing), so the two never
  fight; a merge patch with the ``resourceVersion`` read makes a concurrent write a 409, retried next
  round.
- The ConfigMap is shipped (empty) with the manifests: RBAC is ``get``/``patch`` on that one object by
  name, no ``create``. If someone deletes it, this says so (log, metric ``result="missing"``, alert
  ``RocmIsolationBackstopParamsMissing``) and ``pool apply`` re-creates it. Reported, not re-created
  (issue 42): RBAC cannot restrict ``create`` by name, and ``create`` on ConfigMaps of
  ``rocm-isolation-system`` would let a stolen token of the webhook re-create the parameter of the class
  label guard (``rocm-isolation-class-label-editors``) with groups of its choosing if that one were ever
  deleted. What is lost meanwhile is small since issue 42: only the name checks
  (``rocm-isolation-reserved-node-names``) are skipped; the label, taint and opt-out checks
  (``rocm-isolation-reserved-nodes``) take no parameter.
- Without the Lease (``--audit-interval-seconds 0``) nothing is synced; ``audit`` keeps reporting drift
  when no replica runs (``reserved-node-names-out-of-date``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from webhook.cluster.cache import ClusterCache
from webhook.cluster.kubeapi import ApiError, Conflict, KubeApi, NotFound
from webhook.core.policy import Policy
from webhook.deploy.reserved_names import CONFIGMAP_PATH, PARAMS_CONFIGMAP, configmap
from webhook.service.periodic import Periodic

log = logging.getLogger("webhook.serve")
PATH = f"{CONFIGMAP_PATH}/{PARAMS_CONFIGMAP}"


class ReservedNamesSync:
    def __init__(
        self,
        api: KubeApi,
        cache: ClusterCache,
        policy: Callable[[], Policy],
        leading: Callable[[], bool],
        *,
        interval: float = 2.0,
        on_write: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.policy = policy
        self.leading = leading
        self.interval = interval
        self.on_write = on_write or (lambda result: None)
        self.written: frozenset[str] | None = None  # what the ConfigMap was last seen or made to hold
        self.writes = 0
        self._missing_said = False
        self._rounds = Periodic("reserved-names-sync", interval, self.run_once, log)

    def start(self) -> None:
        self._rounds.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._rounds.stop(timeout)

    def run_once(self) -> str:
        """One round: ``skipped`` (not leading, cache not synced), ``unchanged``, ``updated``, ``conflict``,
        ``missing`` or ``failed``."""
        if not self.leading():
            self.written = None  # another replica writes: read it afresh when leading again
            return "skipped"
        policy = self.policy()
        names = self.cache.nodes(policy).reserved_node_names
        if names is None:
            return "skipped"
        if names == self.written:
            return "unchanged"
        try:
            current = self.api.get(PATH)
        except NotFound:
            if not self._missing_said:
                log.warning(
                    "reserved node names: the ConfigMap is missing (shipped with the manifests): the apiserver "
                    "skips the backstop's name checks (spec.nodeName of a reserved node) until "
                    "`rocm-isolation-webhook pool apply` re-creates it",
                    extra={"configmap": PARAMS_CONFIGMAP},
                )
                self._missing_said = True
            self.on_write("missing")
            return "missing"
        except ApiError as err:
            log.warning("reserved node names: cannot read the ConfigMap", extra={"error": str(err)})
            self.on_write("failed")
            return "failed"
        self._missing_said = False
        data: Mapping[str, Any] = current.get("data") or {}
        if frozenset(data) == names:
            self.written = names
            return "unchanged"
        key, value = policy.spec.reserved_nodes.label
        wanted = configmap(sorted(names), f"{key}={value}")
        body = {
            "metadata": {
                "resourceVersion": (current.get("metadata") or {}).get("resourceVersion"),
                "annotations": wanted["metadata"]["annotations"],
            },
            "data": {**wanted["data"], **dict.fromkeys(name for name in data if name not in names)},
        }
        try:
            self.api.patch(PATH, body)
        except Conflict:
            self.on_write("conflict")
            return "conflict"
        except ApiError as err:
            log.warning("reserved node names: cannot write the ConfigMap", extra={"error": str(err)})
            self.on_write("failed")
            return "failed"
        added = sorted(names - frozenset(data))
        removed = sorted(frozenset(data) - names)
        log.info(
            "reserved node names: the backstop's ConfigMap follows the labelled nodes",
            extra={"configmap": PARAMS_CONFIGMAP, "added": added, "removed": removed},
        )
        self.written = names
        self.writes += 1
        self.on_write("updated")
        return "updated"
