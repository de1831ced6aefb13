"""Dynamic Resource Allocation objects for the device-level reservation tests, shaped as the apiserver
returns them (resource.k8s.io/v1 unless said otherwise): AMD's DRA driver's ResourceSlices with the PCI bus
ID attribute, allocated ResourceClaims reserved for pods, and DeviceClasses with a creationTimestamp."""

from __future__ import annotations

from typing import Any

from cluster_objects import device_slice, inference_pod, pod

DRIVER = "gpu.amd.com"
PCI = "resource.kubernetes.io/pciBusID"
RESERVED_CLASS = "rocm-isolation-reserved"


def gpu(name: str, pci_bus_id: str | None, *, beta: bool = False) -> dict[str, Any]:
    """A full GPU as AMD's driver publishes it (``type``, ``deviceID`` and, when given, the PCI bus ID)."""
    attributes: dict[str, Any] = {"type": {"string": "amdgpu"}, "deviceID": {"string": "0x74a1"}}
    if pci_bus_id is not None:
        attributes[PCI] = {"string": pci_bus_id}
    fields = {"attributes": attributes, "capacity": {"memory": {"value": "192Gi"}}}
    return {"name": name, "basic": fields} if beta else {"name": name, **fields}


def gpu_slice(
    node: str,
    *devices: dict[str, Any],
    generation: int = 1,
    version: str = "v1",
    driver: str = DRIVER,
    name: str | None = None,
) -> dict[str, Any]:
    """The ResourceSlice of one node's pool (AMD's driver names the pool after the node)."""
    return device_slice(
        node,
        list(devices),
        name=name or f"{node}-{driver}-{generation}",
        generation=generation,
        version=version,
        driver=driver,
    )


def node_gpus(node: str, *pci_bus_ids: str) -> dict[str, Any]:
    """A node's slice with one GPU per PCI bus ID, named by DRM minors as AMD's driver does (card, renderD):
    names that do not follow the PCI order."""
    devices = [gpu(f"gpu-{9 - i}-{137 - i}", pci) for i, pci in enumerate(pci_bus_ids)]
    return gpu_slice(node, *devices)


def held_claim(
    name: str,
    namespace: str,
    node: str,
    devices: list[str],
    *,
    pods: list[str],
    driver: str = DRIVER,
    device_class: str = "rocm-isolation-shared",
) -> dict[str, Any]:
    """A ResourceClaim allocated these devices of ``node``'s pool and reserved for ``pods`` (their uids as
    tests/cluster_objects.py gives them)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-claim-{namespace}-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 1}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": driver, "pool": node, "device": device} for device in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-pod-{namespace}-{pod}"} for pod in pods],
        },
    }


def device_class(
    name: str,
    *,
    created: str,
    extended_resource_name: str | None = None,
    selector: str = "device.driver == 'gpu.amd.com'",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A DeviceClass as read back (AMD's chart installs ``gpu.amd.com`` naming ``amd.com/gpu``)."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": selector}}]}
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-class-{name}", "creationTimestamp": created, "generation": 1}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": metadata, "spec": spec}


def chart_class() -> dict[str, Any]:
    """AMD's chart DeviceClass ``gpu.amd.com`` naming ``amd.com/gpu``, created before ours."""
    return device_class("gpu.amd.com", created="2026-11-01T00:00:00Z", extended_resource_name="amd.com/gpu")


def claim_pod(name: str, ns: str, node_name: str, claim: str, *, inference: bool = False) -> dict[str, Any]:
    """A pod on ``node_name`` using the ResourceClaim ``claim`` (labelled ``app: <name>``)."""
    make = inference_pod if inference else pod
    obj = make(name, ns, node=node_name, gpus={}, resource_claims=[{"name": "gpu", "resourceClaimName": claim}])
    obj["metadata"]["labels"] = {"app": name}
    return obj


def dra_workloads() -> list[dict[str, Any]]:
    """Pods on DRA nodes dra-a and dra-b with their allocated claims: a training pod on dra-a's gpu-9-137, one
    on dra-b's gpu-6-134 (shared class), an inference pod on dra-b's gpu-8-136 (reserved class)."""
    return [
        held_claim("train-a-gpu", "ml-training", "dra-a", ["gpu-9-137"], pods=["train-a"]),
        claim_pod("train-a", "ml-training", "dra-a", "train-a-gpu"),
        held_claim("train-b-gpu", "ml-training", "dra-b", ["gpu-6-134"], pods=["train-b"]),
        claim_pod("train-b", "ml-training", "dra-b", "train-b-gpu"),
        held_claim("llm-gpu", "serving", "dra-b", ["gpu-8-136"], pods=["llm-0"], device_class=RESERVED_CLASS),
        claim_pod("llm-0", "serving", "dra-b", "llm-gpu", inference=True),
    ]
