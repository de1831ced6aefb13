"""One fake cluster with every ``audit`` finding once and compliant objects around them: the audit's
tests (tests/ops/audit/test_audit.py) and the kubectl plugin's (tests/test_plugin.py) read it.

A second one (``populate_devices``) holds an active device-level reservation (``pool apply
--devices-per-node 2``) with every device-level finding once: apart, because while GPUs are reserved the
policy steers an inference pod's ``amd.com/gpu`` to the reserved DeviceClass, which the first cluster's
inference pods do not ask for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cluster_objects import (
    DRIVER,
    RESERVED_CLASS,
    SHARED_CLASS,
    SPLIT_LABELS,
    claim_pod,
    device_class,
    device_slice,
    drm_gpus,
    extended_resource_pod,
    gpu_device,
    held_claim,
    inference_pod,
    namespace,
    node,
    pod,
    reservation_classes,
    resource_claim,
)
from fake_cluster import FakeCluster

from webhook.deploy.device_classes import DeviceReservation

UNHEALTHY = {"key": "amd-gpu-unhealthy", "value": "gpu-3", "effect": "NoSchedule"}
TOLERATE_ALL = {"operator": "Exists"}


def populate(fake: FakeCluster) -> None:
    """One cluster with every finding once, and compliant objects around them."""
    fake.add(
        node("r1", reserved=True),
        node("r2", labels={"rocm-isolation.io/pool": "inference"}),  # label, no taint
        node("r3", reserved=True, taints=[UNHEALTHY]),
        node("r4", reserved=True, allocatable={}),  # no GPU
        node("t1", taints=[{"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}]),
        node("s1"),
        node("s2"),
        node("cpu", allocatable={}),
    )
    fake.add(
        namespace("serve", {"rocm-isolation.io/class": "inference"}),
        namespace("ml"),  # GPU pods of class training, no Pod Security level: privileged pods allowed
        namespace("ml-safe", {"rocm-isolation.io/class": "training", "pod-security.kubernetes.io/enforce": "baseline"}),
        namespace("weird", {"rocm-isolation.io/class": "gpu-party"}),
        namespace("odd-mode", {"rocm-isolation.io/mode": "strict"}),
        namespace("kube-system"),
    )
    # The reserved node names the backstop reads, as pool apply last wrote them: r3 and r4 were labelled since.
    fake.add(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "rocm-isolation-reserved-node-names", "namespace": "rocm-isolation-system"},
            "data": {"r1": "rocm-isolation.io/pool=inference", "r2": "rocm-isolation.io/pool=inference"},
        }
    )
    fake.add(
        device_class("gpu.amd.com", 'device.driver == "gpu.amd.com"'),  # named in the policy: quiet
        device_class("big-gpus", 'device.driver == "gpu.amd.com"', extended_resource_name="example.com/amd-gpu"),
        device_class("nic.example.com", 'device.driver == "nic.example.com"'),  # no GPU: quiet
        device_class("vendor-x", 'device.driver == "accel.example.com"'),
        # The allocation is the ground truth: the scheduler gave an AMD GPU through a class the policy
        # does not count as a GPU class.
        resource_claim("sneaky", "ml", "vendor-x", allocated_by="gpu.amd.com"),
        resource_claim("nic", "ml", "nic.example.com", allocated_by="nic.example.com"),
    )
    fake.add(
        pod("trainer-ok", "ml", node="s1"),
        pod("trainer-on-reserved", "ml", node="r1", affinity=None, env=[], annotations={}),
        pod("trainer-pending-tolerates", "ml", node=None, tolerations=[TOLERATE_ALL]),
        pod("class-hijack", "ml", node="s1", labels={"app": "x", "rocm-isolation.io/workload-class": "inference"}),
        pod("finished", "ml", node="r1", phase="Succeeded", affinity=None),
        pod("cpu-only", "ml", node="r1", gpus={}, affinity=None),
        inference_pod("llm-ok", "serve", node="r1"),
        inference_pod("llm-shared", "serve", node="s2", affinity=None, tolerations=[], annotations={}),
        inference_pod("llm-unmutated", "serve", node=None, affinity=None, tolerations=[], env=[], spread=False),
        pod("gpu-burn", "kube-system", node="r1", affinity=None),
        pod(
            "via-vendor-x",
            "ml",
            node="r1",
            gpus={},
            affinity=None,
            resource_claims=[{"name": "a", "resourceClaimName": "sneaky"}],
        ),
        pod(
            "via-nic",
            "ml",
            node="r1",
            gpus={},
            affinity=None,
            resource_claims=[{"name": "n", "resourceClaimName": "nic"}],
        ),
    )


def running() -> Iterator[FakeCluster]:
    """The fake cluster started and populated, stopped afterwards (the body of a pytest fixture)."""
    cluster = FakeCluster().start()
    populate(cluster)
    yield cluster
    cluster.stop()


# -- device-level reservation ---------------------------------------------------------------------

# What pool apply --devices-per-node 2 recorded: every node's two lowest PCI bus IDs (the same slots).
RESERVATION = DeviceReservation(2, ("0000:03:00.0", "0000:23:00.0"))
SLOTS = ("0000:03:00.0", "0000:23:00.0", "0000:43:00.0", "0000:63:00.0")
# The inference placement since device-level reservation: whole reserved nodes or split ones.
SPLIT_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "rocm-isolation.io/pool",
                            "operator": "In",
                            "values": ["inference", "inference-devices"],
                        }
                    ]
                }
            ]
        }
    }
}


def split_node_slice(node_name: str, *devices: dict[str, Any]) -> dict[str, Any]:
    """The node's ResourceSlice of AMD's DRA driver (its pool is named after the node)."""
    return device_slice(node_name, list(devices), name=f"{node_name}-{DRIVER}-x7k2p", driver=DRIVER)


def four_gpus(*taints_of_first: dict[str, Any]) -> list[dict[str, Any]]:
    """Four GPUs in the usual slots, named by DRM minors (card, renderD): names out of PCI order."""
    return drm_gpus(*SLOTS, taints_of_first=taints_of_first)


def split_inference(device: str, name: str = "llm") -> tuple[dict[str, Any], dict[str, Any]]:
    """The inference pod ``name`` placed on the split node d1 (SPLIT_AFFINITY) and its claim ``name``-gpu of
    the reserved class, allocated d1's ``device``."""
    return (
        held_claim(f"{name}-gpu", "serve", "d1", [device], pods=[name], device_class=RESERVED_CLASS),
        claim_pod(name, "serve", "d1", f"{name}-gpu", inference=True, affinity=SPLIT_AFFINITY),
    )


def populate_devices(fake: FakeCluster) -> None:
    """An active device reservation (2 per node) with every device-level finding once, compliant objects
    around them:

    - d1 (split, labelled): an inference pod on a reserved GPU, a training pod on a shared one, and a training
      pod on a reserved one through AMD's chart class (``reserved-device-held-by-other-class``); a reserved GPU
      with a taint of effect None and a shared GPU tainted NoSchedule (neither is a finding);
    - d2 publishes the driver's devices without the split label (``split-node-label-out-of-date``);
    - d3 lost the GPU in slot 0000:03:00.0 (``reserved-device-missing``);
    - d4's reserved GPU is tainted NoExecute by the driver (``reserved-device-unhealthy``); a pod of an excluded
      namespace holds a shared GPU there (capacity, class unclassified);
    - AMD's chart class names amd.com/gpu and is newer than the shared class
      (``extended-resource-not-on-shared-class``)."""
    informational = {"key": "gpu.amd.com/ecc-corrected", "value": "12", "effect": "None"}
    conflict = {"key": "gpu.amd.com/memory-partition-conflict", "effect": "NoExecute"}
    d1 = four_gpus()
    d1[1]["taints"] = [informational]  # reserved, effect None: allocatable as before
    d1[2]["taints"] = [{**conflict, "effect": "NoSchedule"}]  # shared: not the reservation's concern
    fake.add(
        node("d1", labels=SPLIT_LABELS, allocatable={}),
        node("d2", allocatable={}),
        node("d3", labels=SPLIT_LABELS, allocatable={}),
        node("d4", labels=SPLIT_LABELS, allocatable={}),
        split_node_slice("d1", *d1),
        split_node_slice("d2", *four_gpus()),
        split_node_slice("d3", *four_gpus()[1:]),
        split_node_slice("d4", *four_gpus(conflict)),
    )
    fake.add(
        namespace("serve", {"rocm-isolation.io/class": "inference"}),
        namespace("ml", {"rocm-isolation.io/class": "training", "pod-security.kubernetes.io/enforce": "baseline"}),
        namespace("kube-system"),
    )
    chart = device_class("gpu.amd.com", 'device.driver == "gpu.amd.com"', extended_resource_name="amd.com/gpu")
    chart["metadata"]["creationTimestamp"] = "2026-11-20T10:00:00Z"  # reinstalled after pool apply: newer
    fake.add(*reservation_classes(RESERVATION), chart)
    fake.add(
        held_claim("llm-a-gpu", "serve", "d1", ["gpu-9-137"], pods=["llm-a"], device_class=RESERVED_CLASS),
        held_claim("trainer-ok-gpu", "ml", "d1", ["gpu-7-135"], pods=["trainer-ok"]),
        held_claim("trainer-stray-gpu", "ml", "d1", ["gpu-8-136"], pods=["trainer-stray"], device_class=DRIVER),
        held_claim("gpu-check", "kube-system", "d4", ["gpu-6-134"], pods=["gpu-check"], device_class=DRIVER),
    )
    fake.add(
        claim_pod("llm-a", "serve", "d1", "llm-a-gpu", inference=True, affinity=SPLIT_AFFINITY),
        claim_pod("trainer-ok", "ml", "d1", "trainer-ok-gpu"),
        claim_pod("trainer-stray", "ml", "d1", "trainer-stray-gpu"),
        claim_pod("gpu-check", "kube-system", "d4", "gpu-check"),
    )


def running_devices() -> Iterator[FakeCluster]:
    """The device-level reservation's cluster started and populated, stopped afterwards."""
    cluster = FakeCluster().start()
    populate_devices(cluster)
    yield cluster
    cluster.stop()


# -- whole and split nodes side by side -------------------------------------------------------------

# Eight GPUs of an MI300X node, in PCI order; a split keeps the first two for inference.
EIGHT_SLOTS = tuple(f"0000:{bus}:00.0" for bus in ("03", "23", "43", "63", "83", "a3", "c3", "e3"))
RESERVE_TWO = DeviceReservation(2, EIGHT_SLOTS[:2])


def eight_gpus(node_name: str) -> dict[str, Any]:
    """The ResourceSlice of a node with eight GPUs (gpu-0 in the lowest PCI slot)."""
    return split_node_slice(node_name, *(gpu_device(f"gpu-{i}", pci) for i, pci in enumerate(EIGHT_SLOTS)))


def populate_mixed(fake: FakeCluster) -> None:
    """A whole reserved node r1 (device plugin, 8 GPUs), a shared node s1 (device plugin, 8 GPUs) and a node
    d1 split by pool apply --devices-per-node 2 (DRA, 8 GPUs: gpu-0 and gpu-1 reserved):

    - on r1 an inference pod requesting 2 amd.com/gpu, on s1 a training pod requesting 2;
    - on d1 an inference pod whose claim holds the reserved gpu-0, and a training pod asking for amd.com/gpu 1
      through the claim the scheduler made for the extended resource (the shared gpu-5): its GPU is in its
      resources and in that claim, one GPU."""
    fake.add(
        node("r1", reserved=True),
        node("s1"),
        node("d1", labels=SPLIT_LABELS, allocatable={}),
        eight_gpus("d1"),
        namespace("serve", {"rocm-isolation.io/class": "inference"}),
        namespace("ml", {"rocm-isolation.io/class": "training", "pod-security.kubernetes.io/enforce": "baseline"}),
        *reservation_classes(RESERVE_TWO),
    )
    made = "trainer-split-extended-resources-q8n4z"
    trainer = extended_resource_pod("trainer-split", "ml", "d1", made)
    fake.add(
        *split_inference("gpu-0", "llm-split"),
        held_claim(made, "ml", "d1", ["gpu-5"], pods=["trainer-split"], device_class=SHARED_CLASS),
        inference_pod("llm", "serve", node="r1"),
        pod("trainer", "ml", node="s1"),
        trainer,
    )
