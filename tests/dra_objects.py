"""The DRA workloads the device-level reservation tests share (tests/ops/pool/test_pool.py, test_device_taints.py),
built with tests/cluster_objects.py's builders."""

from __future__ import annotations

from typing import Any

from cluster_objects import RESERVED_CLASS, claim_pod, held_claim


def dra_workloads() -> list[dict[str, Any]]:
    """Pods on DRA nodes dra-a and dra-b with their allocated claims: a training pod on dra-a's gpu-9-137, one
    on dra-b's gpu-6-134 (shared class), an inference pod on dra-b's gpu-8-136 (reserved class)."""
    return [
        held_claim("train-a-gpu", "ml-training", "dra-a", ["gpu-9-137"], pods=["train-a"]),
        claim_pod("train-a", "ml-training", "dra-a", "train-a-gpu", labels={"app": "train-a"}),
        held_claim("train-b-gpu", "ml-training", "dra-b", ["gpu-6-134"], pods=["train-b"]),
        claim_pod("train-b", "ml-training", "dra-b", "train-b-gpu", labels={"app": "train-b"}),
        held_claim("llm-gpu", "serving", "dra-b", ["gpu-8-136"], pods=["llm-0"], device_class=RESERVED_CLASS),
        claim_pod("llm-0", "serving", "dra-b", "llm-gpu", inference=True, labels={"app": "llm-0"}),
    ]
