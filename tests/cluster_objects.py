"""Cluster objects for tests, derived from the fixtures in tests/fixtures/cluster/ (recorded in the
shape the apiserver returns: managedFields, status, defaulted fields and all)."""

from __future__ import annotations

import copy
from typing import Any

from fake_cluster import fixture


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    reserved: bool = False,
    taints: list[dict[str, Any]] | None = None,
    allocatable: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A GPU node (8 x MI300X allocatable); ``reserved`` labels and taints it for the pool."""
    obj = copy.deepcopy(fixture("node-reserved.json"))
    metadata = obj["metadata"]
    metadata["name"] = name
    metadata["labels"]["kubernetes.io/hostname"] = name
    del metadata["labels"]["rocm-isolation.io/pool"]
    del metadata["resourceVersion"]
    metadata["uid"] = f"uid-node-{name}"
    obj["spec"]["taints"] = []
    if reserved:
        metadata["labels"]["rocm-isolation.io/pool"] = "inference"
        obj["spec"]["taints"] = [{"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}]
    metadata["labels"].update(labels or {})
    obj["spec"]["taints"].extend(taints or [])
    if not obj["spec"]["taints"]:
        del obj["spec"]["taints"]
    if allocatable is not None:
        base = {k: v for k, v in obj["status"]["allocatable"].items() if not k.startswith("amd.com/")}
        obj["status"]["allocatable"] = {**base, **allocatable}
        obj["status"]["capacity"] = {**obj["status"]["capacity"], **allocatable}
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    return obj


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-ns-{name}",
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
            "managedFields": [
                {
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}},
                }
            ],
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def pod(
    name: str,
    namespace: str,
    *,
    node: str | None = None,
    phase: str = "Running",
    gpus: dict[str, str] | None = None,
    created: str = "2026-12-01T07:30:00Z",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    affinity: Any = "keep",
    tolerations: list[dict[str, Any]] | None = None,
    env: list[dict[str, str]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    resource_claims: list[dict[str, Any]] | None = None,
    spread: bool = False,
) -> dict[str, Any]:
    """A pod as the apiserver returns it (from pod-training.json: a training pod the webhook mutated).

    ``node=None`` leaves it unscheduled (Pending, PodScheduled False, no status beyond that)."""
    obj = copy.deepcopy(fixture("pod-training.json"))
    metadata, spec = obj["metadata"], obj["spec"]
    metadata.update(name=name, namespace=namespace, uid=f"uid-pod-{namespace}-{name}", creationTimestamp=created)
    del metadata["resourceVersion"]
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    container = spec["containers"][0]
    if gpus is not None:
        container["resources"] = {"limits": dict(gpus), "requests": dict(gpus)} if gpus else {}
    if env is not None:
        container["env"] = env
    if affinity != "keep":
        if affinity is None:
            del spec["affinity"]
        else:
            spec["affinity"] = affinity
    if tolerations is not None:
        spec["tolerations"] = [*spec["tolerations"], *tolerations]
    if init_containers is not None:
        spec["initContainers"] = init_containers
    if resource_claims is not None:
        spec["resourceClaims"] = resource_claims
    if spread:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": dict(metadata.get("labels") or {})},
            }
        ]
    if node is None:
        del spec["nodeName"]
        obj["status"] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": created,
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient amd.com/gpu. preemption: 0/3 nodes are "
                    "available: 3 No preemption victims found for incoming pod.",
                }
            ],
            "qosClass": "Burstable",
        }
    else:
        spec["nodeName"] = node
        obj["status"]["phase"] = phase
    return obj


INFERENCE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "rocm-isolation.io/pool", "operator": "In", "values": ["inference"]}]}
            ]
        }
    }
}
INFERENCE_TOLERATION = {
    "key": "rocm-isolation.io/reserved",
    "operator": "Equal",
    "value": "inference",
    "effect": "NoSchedule",
}


def inference_pod(name: str, namespace: str, *, node: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """An inference pod as the webhook mutated it (affinity, toleration, spread, env, annotation)."""
    kwargs.setdefault("labels", {"app": "llm", "pod-template-hash": "5f6d7c8b9"})
    kwargs.setdefault("annotations", {"rocm-isolation.io/class": "inference"})
    kwargs.setdefault("affinity", INFERENCE_AFFINITY)
    kwargs.setdefault("tolerations", [INFERENCE_TOLERATION])
    kwargs.setdefault("env", [{"name": "HSA_QUEUE_PRIORITY", "value": "high"}])
    kwargs.setdefault("spread", True)
    return pod(name, namespace, node=node, **kwargs)


def resource_claim(
    name: str,
    namespace: str,
    device_class: str = "gpu.amd.com",
    *,
    template: bool = False,
    allocated_by: str | None = None,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim (or Template) as a list item (no kind: lists carry it);
    ``allocated_by``: the driver of the device the scheduler allocated (status.allocation)."""
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 1}}]}}
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate" if template else "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-claim-{namespace}-{name}"},
        "spec": {"spec": spec} if template else spec,
    }
    if allocated_by is not None:
        result = {"request": "gpu", "driver": allocated_by, "pool": "node-1", "device": "gpu-0"}
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return claim


def device_class(name: str, selector: str | None = None, extended_resource_name: str | None = None) -> dict[str, Any]:
    """A resource.k8s.io/v1 DeviceClass (as AMD's DRA driver installs gpu.amd.com: one CEL selector)."""
    spec: dict[str, Any] = {}
    if selector is not None:
        spec["selectors"] = [{"cel": {"expression": selector}}]
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def allocated(claim: dict[str, Any], pool: str, *devices: str) -> dict[str, Any]:
    """The claim with these devices of AMD's DRA driver allocated (status.allocation), from ``pool``."""
    results = [{"request": "gpu", "driver": "gpu.amd.com", "pool": pool, "device": d} for d in devices]
    claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def device_slice(
    node_name: str,
    devices: list[dict[str, Any]],
    *,
    name: str | None = None,
    generation: int = 1,
    version: str = "v1",
    driver: str = "gpu.amd.com",
) -> dict[str, Any]:
    """A ResourceSlice of one node's pool, as AMD's DRA driver publishes it (the pool named after the node):
    every test's slice builder fills in its devices."""
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def resource_slice(node_name: str, *devices: str) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceSlice of AMD's DRA driver: the node's pool (named after it), these devices."""
    return device_slice(node_name, [{"name": d} for d in devices])
