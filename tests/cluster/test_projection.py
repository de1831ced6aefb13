"""What the Lease holder's view keeps of a pod (webhook/cluster/projection.py): every engine fixture pod
(tests/fixtures/engine/) is decided the same from its projection as from the whole pod (class, allowed,
violations: what capacity and lending read of a decision), and every pod the engine classifies or counts a
GPU for is kept."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from core.test_engine import as_pod, facts, load_cases

from webhook.cluster.inventory import gpu_request
from webhook.cluster.projection import PodRelevance, claim_projection, node_projection, pod_projection
from webhook.core.engine import decide

CREATE_CASES = [
    case
    for case in load_cases()
    if case.values[0].get("operation", "CREATE") == "CREATE"
    and isinstance(case.values[0].get("pod"), dict)
    and not case.values[0].get("subResource")
    and case.values[0].get("raw") is not True
]


def judged(case: dict[str, Any], pod: dict[str, Any]) -> tuple[bool, str, list[str]]:
    decision = decide(pod=pod, **facts(case))
    return decision.allowed, decision.workload_class or "", sorted(v.rule for v in decision.violations)


def patched_paths(case: dict[str, Any], pod: dict[str, Any]) -> list[tuple[str, str]]:
    """What the remaining patch would do (the audit's pod-missing-mutations): each operation and path."""
    return [(op["op"], op["path"]) for op in decide(pod=pod, **facts(case)).patch]


@pytest.mark.parametrize("case", CREATE_CASES)
def test_a_projected_pod_is_decided_as_the_whole_pod(case: dict[str, Any]) -> None:
    pod = as_pod(case["pod"])
    assert pod is not None
    original = copy.deepcopy(pod)
    projected = pod_projection(pod)
    assert pod == original, "the projection must not modify the stored pod"
    assert judged(case, projected) == judged(case, pod)
    assert patched_paths(case, projected) == patched_paths(case, pod)
    policy = facts(case)["policy"]
    assert gpu_request(projected, policy) == gpu_request(pod, policy)


@pytest.mark.parametrize("case", CREATE_CASES)
def test_every_pod_the_engine_classes_or_counts_gpus_for_is_kept(case: dict[str, Any]) -> None:
    pod = as_pod(case["pod"])
    assert pod is not None
    policy = facts(case)["policy"]
    _, workload_class, _ = judged(case, pod)
    if workload_class or gpu_request(pod, policy):
        assert PodRelevance(policy)(pod), "a pod of a class, or holding GPUs, must stay in the view"


def test_a_pod_without_any_gpu_route_is_not_kept_and_a_labelled_one_is() -> None:
    policy = facts({"namespace": {"name": "x"}})["policy"]
    relevant = PodRelevance(policy)
    web = {
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {"limits": {"cpu": "1"}}}]},
    }
    assert not relevant(web)
    borrower = copy.deepcopy(web)
    borrower["metadata"]["labels"]["rocm-isolation.io/borrow"] = "true"
    assert relevant(borrower)
    claims = copy.deepcopy(web)
    claims["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
    assert relevant(claims)
    # Any extended resource may be a DRA extended resource of a GPU DeviceClass the view has not read yet.
    extended = copy.deepcopy(web)
    extended["spec"]["containers"][0]["resources"]["limits"]["example.com/fpga"] = "1"
    assert relevant(extended)
    privileged = copy.deepcopy(web)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert relevant(privileged)
    # Unreadable: kept (the engine decides what it is).
    assert relevant({"metadata": {"name": "odd"}, "spec": "not a spec"})


def test_what_is_dropped() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "n",
            "uid": "u",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "me"},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "image": "i", "command": ["x"], "livenessProbe": {}, "resources": {}}],
            "volumes": [{"name": "token", "projected": {}}, {"name": "kfd", "hostPath": {"path": "/dev/kfd"}}],
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "c"}], "conditions": []},
    }
    assert pod_projection(pod) == {
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "annotations": {"keep": "me"}},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {}}],
            "volumes": [{"name": "token"}, {"name": "kfd", "hostPath": {"path": "/dev/kfd"}}],
        },
        "status": {"phase": "Running", "conditions": []},
    }
    node = {
        "metadata": {"name": "n1", "labels": {"a": "b"}, "managedFields": []},
        "spec": {"taints": [], "podCIDR": "10.0.0.0/24"},
        "status": {"allocatable": {"amd.com/gpu": "8"}, "images": [{"names": ["x"]}]},
    }
    assert node_projection(node) == {
        "metadata": {"name": "n1", "labels": {"a": "b"}},
        "spec": {"taints": []},
        "status": {"allocatable": {"amd.com/gpu": "8"}},
    }
    claim = {
        "metadata": {"name": "c", "namespace": "n", "managedFields": []},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": []}}, "reservedFor": [], "devices": [{"data": "big"}]},
    }
    assert claim_projection(claim) == {
        "metadata": {"name": "c", "namespace": "n"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": []}}, "reservedFor": []},
    }
