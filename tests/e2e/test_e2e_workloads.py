"""Scenario 2: the controllers create the pods, the webhook patches them, the real scheduler binds
them. Inference lands only on the reserved nodes and spreads over them; training (Job, Indexed Job)
only on shared nodes; a StatefulSet's replicas count each other in their spread constraint; a
DaemonSet runs on the nodes it may use and on no reserved node."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from .controlplane import MINORS
from .harness import POOL_NODES, Cluster
from .kube import Obj, wait_until

pytestmark = pytest.mark.minors(*MINORS)  # what every stock minor serves (issue 47)

INFERENCE = {"rocm-isolation.io/class": "inference"}
TRAINING = {"rocm-isolation.io/class": "training"}


def container(gpus: int = 1) -> Obj:
    return {"name": "main", "image": "rocm/vllm:latest", "resources": {"limits": {"amd.com/gpu": str(gpus)}}}


def template(labels: dict[str, str], **spec: Any) -> Obj:
    return {"metadata": {"labels": labels}, "spec": {"containers": [container()], **spec}}


def nodes_of(pods: list[Obj]) -> Counter[str]:
    return Counter(p["spec"]["nodeName"] for p in pods)


def spread_constraint(pod: Obj) -> Obj:
    constraints = [
        c for c in pod["spec"].get("topologySpreadConstraints") or [] if c["topologyKey"] == "kubernetes.io/hostname"
    ]
    assert len(constraints) == 1, pod["spec"].get("topologySpreadConstraints")
    constraint: Obj = constraints[0]
    return constraint


def test_inference_deployment_binds_only_to_reserved_nodes_and_spreads(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    ns = namespace(labels=INFERENCE)
    replicas = 2 * len(cluster.reserved)
    cluster.kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "llm", "namespace": ns},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "llm"}},
                "template": template({"app": "llm"}),
            },
        }
    )
    pods = cluster.wait_bound(ns, replicas)
    placed = nodes_of(pods)
    assert set(placed) <= set(cluster.reserved), placed
    # maxSkew 1 over the reserved nodes (the only ones the pods' affinity allows): 2 + 2.
    assert sorted(placed.values()) == [2] * len(cluster.reserved), placed
    for pod in pods:
        assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == "inference"
        constraint = spread_constraint(pod)
        assert constraint["whenUnsatisfiable"] == "DoNotSchedule"
        assert "pod-template-hash" in constraint.get("matchLabelKeys", [])


def _job(ns: str, name: str, parallelism: int, **spec: Any) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": template({"app": name}, restartPolicy="Never"),
            **spec,
        },
    }


def test_training_jobs_bind_only_to_shared_nodes(cluster: Cluster, namespace: Callable[..., str]) -> None:
    ns = namespace(labels=TRAINING)
    shared = set(cluster.shared) | set(POOL_NODES)
    # More pods than the shared MI300X nodes: without the webhook's NotIn the scheduler's spreading
    # would also use the (reserved) nodes; it never does.
    cluster.kube.create(_job(ns, "train", 6))
    cluster.kube.create(_job(ns, "indexed", 4, completionMode="Indexed"))
    pods = cluster.wait_bound(ns, 10)
    placed = nodes_of(pods)
    assert set(placed) <= shared, placed
    assert not set(placed) & set(cluster.reserved)
    for pod in pods:
        assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == "training"
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert all(
            {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in t["matchExpressions"]
            for t in terms
        ), terms
    indexed = [p for p in pods if p["metadata"]["labels"].get("app") == "indexed"]
    assert len(indexed) == 4
    for pod in indexed:
        # The per-pod completion index never enters a selector (it would select that pod only).
        for constraint in pod["spec"].get("topologySpreadConstraints") or []:
            selector = constraint.get("labelSelector") or {}
            assert "batch.kubernetes.io/job-completion-index" not in (selector.get("matchLabels") or {})


def test_statefulset_replicas_count_each_other_in_their_spread(cluster: Cluster, namespace: Callable[..., str]) -> None:
    ns = namespace(labels=INFERENCE)
    replicas = len(cluster.reserved)
    cluster.kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "kv", "namespace": ns},
            "spec": {
                "replicas": replicas,
                # Parallel: OrderedReady would wait for pod 0 to be Ready, which needs a kubelet.
                "podManagementPolicy": "Parallel",
                "serviceName": "kv",
                "selector": {"matchLabels": {"app": "kv"}},
                "template": template({"app": "kv"}),
            },
        }
    )
    pods = cluster.wait_bound(ns, replicas)
    placed = nodes_of(pods)
    assert sorted(placed) == sorted(cluster.reserved), placed  # one each: they see each other
    names = {p["metadata"]["name"] for p in pods}
    for pod in pods:
        constraint = spread_constraint(pod)
        selector = constraint["labelSelector"]
        assert "statefulset.kubernetes.io/pod-name" not in (selector.get("matchLabels") or {})
        assert "controller-revision-hash" in constraint.get("matchLabelKeys", [])
        # The selector, as the scheduler evaluates it, matches every replica (its siblings).
        matched = {p["metadata"]["name"] for p in pods if _selects(selector, p["metadata"]["labels"])}
        assert matched == names, (selector, matched)


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        present = expression["key"] in labels
        value = labels.get(expression["key"])
        operator = expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def test_training_daemonset_runs_on_the_nodes_it_may_use(cluster: Cluster, namespace: Callable[..., str]) -> None:
    ns = namespace(labels=TRAINING)
    cluster.kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": template({"app": "agent"}),
            },
        }
    )
    expected = set(cluster.shared) | set(POOL_NODES)
    pods = wait_until(
        lambda: (
            (pods := [p for p in cluster.pods(ns) if p["spec"].get("nodeName")])
            and {p["spec"]["nodeName"] for p in pods} >= expected
            and pods
        ),
        timeout=90,
        what="a DaemonSet pod on every shared node",
    )
    placed = nodes_of(pods)
    assert set(placed) == expected, placed
    assert all(count == 1 for count in placed.values()), placed
    for pod in pods:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        # The controller's matchFields pin is kept; the webhook's NotIn sits next to it in the same term.
        assert len(terms) == 1, terms
        assert terms[0]["matchFields"][0]["values"] == [pod["spec"]["nodeName"]]
        assert {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in terms[0][
            "matchExpressions"
        ]
    daemonset = wait_until(
        lambda: (
            (d := cluster.kube.get("DaemonSet", "agent", ns))["status"].get("desiredNumberScheduled") == len(expected)
            and d
        ),
        timeout=60,
        what="the DaemonSet status",
    )
    # The controller does not even try the reserved nodes (their taint is not tolerated), so no
    # creation was refused and nothing is left unscheduled.
    assert daemonset["status"]["currentNumberScheduled"] == len(expected)
    assert daemonset["status"].get("numberMisscheduled", 0) == 0
    refused = [e for e in cluster.events(ns) if e.get("reason") == "FailedCreate"]
    assert refused == [], [e["message"] for e in refused]
