"""What the Lease holder's view (``cluster/view.py``) keeps of each object: the fields that a decision reads.

A stored Pod as the apiserver returns it is mostly what no decision of ours reads (``managedFields``, the
last-applied annotation, images, commands, probes, ports, volume sources, container statuses); 100,000s of them
would not fit. The view keeps:

- of a **pod**, only when it can matter to capacity or lending (``PodRelevance``): it carries our labels
  (a borrower, a placed pod), asks for DRA claims, requests an extended resource (every GPU resource and
  every DRA extended resource is one: a name with a ``/``), or opens another GPU route of the policy
  (privileged, the AMD runtime's variables or RuntimeClass: ``core/pods.gpu_routes``); with ``scope.allPods``
  every pod has a class, and every pod is kept. Of such a pod it keeps
  the metadata decisions read, the scheduling fields of the spec, each container's name, resources,
  securityContext, env, volume mounts and restartPolicy, the volumes' names (and sources of hostPath ones), and the status fields lending reads
  (phase, the PodScheduled and DisruptionTarget conditions, the claims' statuses); the sub-structures that
  a workload's replicas repeat (containers, tolerations, affinity, labels, owner) are one shared copy
  (``Shared``). Every other pod (a cluster's non-GPU majority) is not kept
  at all: it holds no GPU and waits for none;
- of a **node**, its labels, taints, cordon and allocatable resources;
- of a **ResourceClaim** or template, its metadata, spec and allocation (``status.devices``, per-device
  health and network data, left out);
- of a **ResourceSlice**, only the slices of the drivers the policy counts (the rest never reach a model);
- of everything, no ``managedFields``.

``tests/cluster/test_projection.py`` proves that the engine decides every fixture pod the same from its
projection as from the whole pod.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from webhook.core import pods
from webhook.core.lending import settings
from webhook.core.policy import Policy

PLACED_LABEL = "rocm-isolation.io/placed"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "ownerReferences",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generateName",
)
# The spec fields a decision reads (class, GPU routes, reachability of reserved nodes, lending): containers
# are projected on their own (``_CONTAINER``), volumes down to hostPath ones.
_POD_SPEC = (
    "nodeName",
    "nodeSelector",
    "affinity",
    "tolerations",
    "priority",
    "priorityClassName",
    "preemptionPolicy",
    "runtimeClassName",
    "resourceClaims",
    "overhead",
    "schedulerName",
    "hostPID",
    "hostIPC",
    "hostNetwork",
    "securityContext",
    "terminationGracePeriodSeconds",
    "topologySpreadConstraints",
    "schedulingGates",
)
_CONTAINER = ("name", "resources", "securityContext", "env", "envFrom", "restartPolicy", "volumeMounts")
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_POD_STATUS = ("phase", "conditions", "resourceClaimStatuses", "extendedResourceClaimStatus", "nominatedNodeName")
_NODE_SPEC = ("taints", "unschedulable", "providerID")
_NODE_STATUS = ("allocatable", "capacity")


def _metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    kept = {key: metadata[key] for key in _METADATA if key in metadata}
    annotations = metadata.get("annotations")
    if isinstance(annotations, Mapping):
        kept["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return kept


def _pick(source: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: source[key] for key in keys if key in source} if isinstance(source, Mapping) else {}


class Shared:
    """One copy of each sub-structure that many pods repeat: the replicas of a workload have the same
    containers, tolerations, affinity, volumes, labels and owner. A kept pod points at the copy (projections
    are never modified: the view replaces an object that changes), which makes a replica's projection a few
    hundred bytes of its own. Keyed by a 128-bit digest of the canonical JSON; started afresh by ``clear``
    (the view does at every full list of pods) so copies no pod uses any more go."""

    def __init__(self) -> None:
        self._copies: dict[bytes, Any] = {}

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, (dict, list)) or not value:
            return value
        key = hashlib.blake2b(orjson.dumps(value, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
        return self._copies.setdefault(key, value)

    def clear(self) -> None:
        self._copies = {}

    def __len__(self) -> int:
        return len(self._copies)


_SHARED_METADATA = ("labels", "ownerReferences", "annotations")
_SHARED_SPEC = ("nodeSelector", "affinity", "tolerations", "resourceClaims", "overhead", "securityContext",
                "topologySpreadConstraints", "volumes", *_CONTAINER_LISTS)  # fmt: skip
# The conditions lending reads (PodScheduled: bound or why not; DisruptionTarget: preempted), and of each the
# fields it reads: the others (Ready, probes' times, messages) change often and are read by nothing of ours.
_CONDITIONS = frozenset({"PodScheduled", "DisruptionTarget"})
_CONDITION = ("type", "status", "reason", "lastTransitionTime")


def pod_projection(pod: Mapping[str, Any], shared: Shared | None = None) -> dict[str, Any]:
    """The fields of a pod that a decision of ours reads (module docstring); with ``shared``, the
    sub-structures replicas repeat are shared copies."""
    spec = pod.get("spec") or {}
    kept_spec = _pick(spec, _POD_SPEC)
    for name in _CONTAINER_LISTS:
        containers = spec.get(name)
        if isinstance(containers, list):
            kept_spec[name] = [_pick(c, _CONTAINER) if isinstance(c, Mapping) else c for c in containers]
    volumes = spec.get("volumes")
    if isinstance(volumes, list):
        # Names (what mounts and the KFD mount's patch compare), and the source only of hostPath volumes.
        kept_spec["volumes"] = [_pick(v, ("name", "hostPath")) if isinstance(v, Mapping) else v for v in volumes]
    metadata = _metadata(pod)
    status = _pick(pod.get("status"), _POD_STATUS)
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        status["conditions"] = [
            _pick(c, _CONDITION) for c in conditions if isinstance(c, Mapping) and c.get("type") in _CONDITIONS
        ]
    if shared is not None:
        for key in _SHARED_METADATA:
            if key in metadata:
                metadata[key] = shared(metadata[key])
        for key in _SHARED_SPEC:
            if key in kept_spec:
                kept_spec[key] = shared(kept_spec[key])
    return {"metadata": metadata, "spec": kept_spec, "status": status}


def node_projection(node: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metadata": _metadata(node),
        "spec": _pick(node.get("spec"), _NODE_SPEC),
        "status": _pick(node.get("status"), _NODE_STATUS),
    }


def claim_projection(claim: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim (or template): metadata, spec, and of the status the allocation and who holds it."""
    kept: dict[str, Any] = {"metadata": _metadata(claim), "spec": claim.get("spec") or {}}
    status = _pick(claim.get("status"), ("allocation", "reservedFor"))
    if status:
        kept["status"] = status
    return kept


def without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as stored but for ``managedFields`` (DeviceClasses, DeviceTaintRules: few and small)."""
    return {**obj, "metadata": _metadata(obj)}


def _extended_resource(container: Any) -> bool:
    if not isinstance(container, Mapping):
        return False
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return False
    return any(
        isinstance(values, Mapping) and any("/" in str(name) for name in values)
        for values in (resources.get("limits"), resources.get("requests"))
    )


class PodRelevance:
    """Whether a pod can matter to capacity or lending under ``policy`` (module docstring). Conservative: a
    pod it cannot read is kept."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._labels = (settings(policy).pod_label, PLACED_LABEL)
        self._routes = policy.routes
        self._every_pod = policy.spec.scope.all_pods  # every pod has a class: every pod is counted

    def __call__(self, pod: Mapping[str, Any]) -> bool:
        if self._every_pod:
            return True
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if any(key in labels for key in self._labels):
            return True
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return True
        if spec.get("resourceClaims"):
            return True
        status = pod.get("status") or {}
        if status.get("resourceClaimStatuses") or status.get("extendedResourceClaimStatus"):
            return True
        overhead = spec.get("overhead")
        if isinstance(overhead, Mapping) and any("/" in str(name) for name in overhead):
            return True
        for name in _CONTAINER_LISTS:
            containers = spec.get(name)
            if isinstance(containers, list) and any(_extended_resource(c) for c in containers):
                return True
        try:
            _, routes = pods.gpu_routes(spec, self._routes)
        except pods.MalformedPod:
            return True
        return bool(routes)
