"""One fake cluster with every ``audit`` finding once and compliant objects around them: the audit's
tests (tests/ops/test_audit.py) and the kubectl plugin's (tests/test_plugin.py) read it."""

from __future__ import annotations

from collections.abc import Iterator

from cluster_objects import device_class, inference_pod, namespace, node, pod, resource_claim
from fake_cluster import FakeCluster

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
