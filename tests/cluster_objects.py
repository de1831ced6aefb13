"""The tests' one set of builders of cluster objects (raw dicts), imported by module name (pytest puts tests/ on
the path; bench/__init__.py does the same): the unit tests, tests/audit_cluster.py, the e2e harness and modules.

Two shapes:

- as the apiserver returns them (``node``, ``namespace``, ``pod``, ``inference_pod``, ``claim_pod``,
  ``resource_claim``, ``held_claim``): derived from the fixtures in tests/fixtures/cluster/ (recorded with
  managedFields, status, defaulted fields and all);
- as a client creates them (``new_node``, ``new_namespace``, ``new_pod``, ``new_claim``, ``new_claim_pod``...):
  only what a manifest says, for the e2e suite to send.

DRA objects as AMD's driver (``gpu.amd.com``) publishes them: ``gpu_device`` (a full GPU, its PCI bus ID,
taints), ``partition_device``, ``drm_gpus`` (GPUs named by DRM minors, out of PCI order), ``node_slice`` /
``device_slice`` (one node's pool), ``autopartition_slices`` (the AutoPartition gate's virtual devices and their
counter sets); ``device_class`` and ``chart_class``; ``policy`` (the shipped default with overrides).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml
from fake_cluster import fixture

from webhook.core.policy import Policy, default_policy, default_policy_text, parse_policy
from webhook.deploy import device_classes
from webhook.deploy.device_classes import DeviceReservation

DRIVER = "gpu.amd.com"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
POOL_LABEL = "rocm-isolation.io/pool"
RESERVED_TAINT = {"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}
SPLIT_LABELS = {POOL_LABEL: "inference-devices"}
RESERVED_CLASS = "rocm-isolation-reserved"
SHARED_CLASS = "rocm-isolation-shared"
ONLY_AMD = f"device.driver == '{DRIVER}'"


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
        metadata["labels"][POOL_LABEL] = "inference"
        obj["spec"]["taints"] = [dict(RESERVED_TAINT)]
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


def dra_node(name: str, *, split: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A node running AMD's DRA driver and no device plugin: no ``amd.com/`` resource in its capacity or
    allocatable; ``split``: labelled by the device-level reservation (``SPLIT_LABELS``)."""
    obj = node(name, labels={**(SPLIT_LABELS if split else {}), **(labels or {})}, allocatable={})
    status = obj["status"]
    status["capacity"] = {k: v for k, v in status["capacity"].items() if not k.startswith("amd.com/")}
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


def device_class(
    name: str,
    selector: str | None = ONLY_AMD,
    extended_resource_name: str | None = None,
    *,
    created: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 DeviceClass (as AMD's DRA driver installs gpu.amd.com: one CEL selector; ``None``:
    no selector); ``created``: as read back (uid, creationTimestamp, generation)."""
    spec: dict[str, Any] = {}
    if selector is not None:
        spec["selectors"] = [{"cel": {"expression": selector}}]
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    metadata: dict[str, Any] = {"name": name}
    if created is not None:
        metadata.update(uid=f"uid-class-{name}", creationTimestamp=created, generation=1)
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": metadata, "spec": spec}


def chart_class(created: str | None = "2026-11-01T00:00:00Z", selector: str = ONLY_AMD) -> dict[str, Any]:
    """AMD's chart DeviceClass ``gpu.amd.com`` naming ``amd.com/gpu`` (``created``: read back, before ours)."""
    return device_class(DRIVER, selector, "amd.com/gpu", created=created)


def reservation_classes(
    reservation: DeviceReservation, created: str = "2026-11-01T09:00:00Z", policy: Policy | None = None
) -> list[dict[str, Any]]:
    """The two DeviceClasses pool apply writes (webhook.deploy.device_classes), as read back."""
    found = device_classes.classes(policy or default_policy(), reservation)
    for obj in found:
        obj["metadata"]["creationTimestamp"] = created
        obj["metadata"]["uid"] = f"uid-class-{obj['metadata']['name']}"
    return found


def allocated(claim: dict[str, Any], pool: str, *devices: str) -> dict[str, Any]:
    """The claim with these devices of AMD's DRA driver allocated (status.allocation), from ``pool``."""
    results = [{"request": "gpu", "driver": "gpu.amd.com", "pool": pool, "device": d} for d in devices]
    claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


# --- devices and slices of AMD's DRA driver ----------------------------------------------------------------

# The compute-memory layouts the AutoPartition gate publishes per GPU, and the partitions each gives.
LAYOUTS = (("spx", "nps1"), ("dpx", "nps2"), ("cpx", "nps1"), ("cpx", "nps4"))
PARTITIONS = {"spx": 1, "dpx": 2, "cpx": 8}
PARTITION_COUNTER = "partition-mode"


def gpu_device(
    name: str,
    pci_bus_id: str | None = None,
    *taints: dict[str, Any],
    beta: bool = False,
    device_id: str = "0x74a1",
    attributes: Mapping[str, Any] | None = None,
    capacity: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A full GPU as AMD's DRA driver publishes it (``type``, ``deviceID``, the PCI bus ID when given, 192Gi),
    with ``attributes`` added, ``capacity`` instead, the taints given; ``beta``: v1beta1's ``basic`` nesting."""
    attrs: dict[str, Any] = {"type": {"string": "amdgpu"}, "deviceID": {"string": device_id}}
    if pci_bus_id is not None:
        attrs[PCI_BUS_ID] = {"string": pci_bus_id}
    attrs.update(attributes or {})
    fields: dict[str, Any] = {"attributes": attrs, "capacity": dict(capacity or {"memory": {"value": "192Gi"}})}
    if taints:
        fields["taints"] = list(taints)
    return {"name": name, "basic": fields} if beta else {"name": name, **fields}


def partition_device(name: str, pci_bus_id: str | None, compute: str = "cpx", memory: str = "nps4") -> dict[str, Any]:
    """A compute partition of a GPU as AMD's driver publishes it without AutoPartition: its own device
    (``amdgpu-partition``) with the physical GPU's PCI bus ID."""
    return gpu_device(
        name,
        pci_bus_id,
        attributes={
            "type": {"string": "amdgpu-partition"},
            "computePartition": {"string": compute},
            "memoryPartition": {"string": memory},
        },
        capacity={"memory": {"value": f"{192 // PARTITIONS[compute]}Gi"}},
    )


def drm_gpus(
    *pci_bus_ids: str | None, first: int = 9, taints_of_first: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """One GPU per PCI bus ID, named by DRM minors as AMD's driver does (card, renderD: ``gpu-9-137`` in the
    first slot, then ``gpu-8-136``...): names that do not follow the PCI order."""
    return [
        gpu_device(f"gpu-{first - i}-{first + 128 - i}", pci, *(taints_of_first if i == 0 else ()))
        for i, pci in enumerate(pci_bus_ids)
    ]


def device_slice(
    node_name: str,
    devices: list[dict[str, Any]],
    *,
    name: str | None = None,
    generation: int = 1,
    version: str = "v1",
    driver: str = DRIVER,
    slice_count: int = 1,
) -> dict[str, Any]:
    """A ResourceSlice of one node's pool, as AMD's DRA driver publishes it (the pool named after the node)."""
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": slice_count},
            "devices": devices,
        },
    }


def node_slice(
    node_name: str,
    *devices: dict[str, Any],
    generation: int = 1,
    version: str = "v1",
    driver: str = DRIVER,
    name: str | None = None,
) -> dict[str, Any]:
    """The ResourceSlice of one node's pool holding ``devices``, named ``<node>-<driver>-<generation>``."""
    return device_slice(
        node_name,
        list(devices),
        name=name or f"{node_name}-{driver}-{generation}",
        generation=generation,
        version=version,
        driver=driver,
    )


def node_gpus(node_name: str, *pci_bus_ids: str) -> dict[str, Any]:
    """A node's slice with one GPU per PCI bus ID, named by DRM minors (``drm_gpus``)."""
    return node_slice(node_name, *drm_gpus(*pci_bus_ids))


def resource_slice(node_name: str, *devices: str) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceSlice of AMD's DRA driver: the node's pool (named after it), these devices."""
    return device_slice(node_name, [{"name": d} for d in devices])


def counter_set(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-mutex"


def autopartition_device(gpu_index: int, pci_bus_id: str | None, compute: str, memory: str) -> dict[str, Any]:
    """One virtual device of the AutoPartition gate: GPU ``gpu_index`` in one compute-memory layout, consuming
    the GPU's counter set (one layout per GPU at a time); its PCI bus ID is the physical GPU's."""
    attributes: dict[str, Any] = {
        "type": {"string": "amdgpu" if compute == "spx" else "amdgpu-partition"},
        "computePartition": {"string": compute},
        "memoryPartition": {"string": memory},
        "gpuIndex": {"int": gpu_index},
    }
    if pci_bus_id is not None:
        attributes["pciAddr"] = {"string": pci_bus_id}
    device = gpu_device(
        f"gpu-{gpu_index}-{compute}-{memory}",
        pci_bus_id,
        attributes=attributes,
        capacity={"partitions": {"value": str(PARTITIONS[compute])}},
    )
    device["allowMultipleAllocations"] = True
    device["consumesCounters"] = [
        {"counterSet": counter_set(gpu_index), "counters": {PARTITION_COUNTER: {"value": "1"}}}
    ]
    return device


def autopartition_slices(
    node_name: str,
    pci_bus_ids: Sequence[str | None],
    *,
    layouts: Sequence[tuple[str, str]] = LAYOUTS,
    generation: int = 1,
) -> list[dict[str, Any]]:
    """The two ResourceSlices of a node's pool under AutoPartition (reference §11): one publishing a counter set
    ``gpu-<i>-mutex`` (capacity 1) per GPU in ``sharedCounters``, one the virtual devices ``gpu-<i>-<layout>``
    of every GPU (``pci_bus_ids[i]``, ``None``: no PCI bus ID) in every layout, each consuming its GPU's set."""
    counters = device_slice(node_name, [], name=f"{node_name}-{DRIVER}-counters", generation=generation, slice_count=2)
    del counters["spec"]["devices"]
    counters["spec"]["sharedCounters"] = [
        {"name": counter_set(i), "counters": {PARTITION_COUNTER: {"value": "1"}}} for i in range(len(pci_bus_ids))
    ]
    devices = [autopartition_device(i, pci, c, m) for i, pci in enumerate(pci_bus_ids) for c, m in layouts]
    return [
        counters,
        device_slice(node_name, devices, name=f"{node_name}-{DRIVER}-devices", generation=generation, slice_count=2),
    ]


# --- claims ------------------------------------------------------------------------------------------------


def held_claim(
    name: str,
    namespace: str,
    node_name: str,
    devices: Iterable[str],
    *,
    pods: Iterable[str],
    driver: str = DRIVER,
    device_class: str = SHARED_CLASS,
) -> dict[str, Any]:
    """A ResourceClaim allocated these devices of ``node_name``'s pool and reserved for ``pods`` (their uids as
    ``pod`` gives them)."""
    claim = resource_claim(name, namespace, device_class)
    results = [{"request": "gpu", "driver": driver, "pool": node_name, "device": device} for device in devices]
    claim["status"] = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-pod-{namespace}-{pod}"} for pod in pods],
    }
    return claim


def claim_pod(
    name: str,
    namespace: str,
    node_name: str | None,
    claim: str,
    *,
    inference: bool = False,
    labels: dict[str, str] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A pod (``inference``: an inference pod as the webhook mutated it) on ``node_name`` asking for no
    ``amd.com/gpu``, using the ResourceClaim ``claim``."""
    make = inference_pod if inference else pod
    claims = [{"name": "gpu", "resourceClaimName": claim}]
    obj = make(name, namespace, node=node_name, gpus={}, resource_claims=claims, **kwargs)
    if labels is not None:
        obj["metadata"]["labels"] = labels
    return obj


def extended_resource_pod(
    name: str,
    namespace: str,
    node_name: str,
    claim: str,
    gpus: int = 1,
    *,
    inference: bool = False,
    resource: str = "amd.com/gpu",
    **kwargs: Any,
) -> dict[str, Any]:
    """A pod asking for ``gpus`` of the DRA extended resource ``resource`` and the ResourceClaim ``claim`` the
    scheduler made for it (``status.extendedResourceClaimStatus``, KEP-5004)."""
    make = inference_pod if inference else pod
    obj = make(name, namespace, node=node_name, gpus={resource: str(gpus)}, **kwargs)
    obj["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": claim,
        "requestMappings": [{"containerName": "trainer", "resourceName": resource, "requestName": "container-0"}],
    }
    return obj


# --- objects as a client creates them (the e2e suite) --------------------------------------------------------


def new_node(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Node as registered (hostname, os, arch labels and ``labels``): the e2e suite writes its status."""
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {**node_labels, **(labels or {})}}}


def node_status(gpus: int | None, now: str) -> dict[str, Any]:
    """A Ready node's status (no kubelet: the e2e suite writes it) with ``gpus`` ``amd.com/gpu`` of the device
    plugin in capacity and allocatable (``None``: no device plugin, no ``amd.com/gpu``)."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if gpus is not None:
        resources["amd.com/gpu"] = str(gpus)
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "e2e: no kubelet, status written by the test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    return {"capacity": resources, "allocatable": dict(resources), "conditions": [ready]}


def new_namespace(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}


def new_pod(
    name: str,
    namespace: str,
    resources: Mapping[str, str] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod asking for ``resources`` (extended resources, as limits) in its one container ``main``."""
    container: dict[str, Any] = {"name": "main", "image": "rocm/pytorch:latest"}
    if resources:
        container["resources"] = {"limits": dict(resources)}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container], **spec}}


def new_claim_pod(
    name: str, namespace: str, *, claim_name: str | None = None, template: str | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod whose container uses the claim ``claim_name``, or one made from the template ``template``."""
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim_name}
    body = new_pod(name, namespace, **spec)
    body["spec"]["resourceClaims"] = [{"name": "gpu", **source}]
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return body


def exactly(device_class: str, count: int | None = 1, **fields: Any) -> dict[str, Any]:
    """A device request ``gpu`` for ``count`` devices of ``device_class`` (``None``: no count)."""
    body: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        body["count"] = count
    return {"name": "gpu", "exactly": {**body, **fields}}


def first_available(*device_classes: str) -> dict[str, Any]:
    return {
        "name": "gpu",
        "firstAvailable": [{"name": f"option-{i}", "deviceClassName": c} for i, c in enumerate(device_classes)],
    }


def new_claim(name: str, namespace: str, *requests: dict[str, Any], template: bool = False) -> dict[str, Any]:
    """A ResourceClaim (``template``: a ResourceClaimTemplate) with these device requests."""
    spec = {"devices": {"requests": list(requests)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate" if template else "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec} if template else spec,
    }


def new_claim_template(name: str, namespace: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return new_claim(name, namespace, *requests, template=True)


# --- policy ------------------------------------------------------------------------------------------------


def _merged(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def policy(overrides: Mapping[str, Any] | None = None) -> Policy:
    """The shipped default policy, ``overrides`` merged into its document (mappings key by key, anything else
    replaced: e.g. ``{"spec": {"mode": "audit"}}``); none: the default policy itself."""
    if not overrides:
        return default_policy()
    document = _merged(yaml.safe_load(default_policy_text()), overrides)
    return parse_policy(yaml.safe_dump(document, sort_keys=False), source="<test policy>")
