"""Scenario 6: ``pool plan | apply | release | status`` on real nodes, with an operator's (admin)
kubeconfig; ``apply --evict`` against a real PodDisruptionBudget that refuses, then allows; DaemonSet
pods left alone; ``--dry-run=server`` changes nothing. The pool scenario uses the two MI210 nodes and
gives them back at the end."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from .controlplane import MINORS
from .harness import Cluster, gpu_pod
from .kube import ApiError, Obj, wait_until

pytestmark = pytest.mark.minors(*MINORS)  # what every stock minor serves (issue 47)

POOL_LABEL = "rocm-isolation.io/pool"
TAINT = {"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}


def node_state(cluster: Cluster, name: str) -> tuple[str | None, list[Obj], str]:
    node = cluster.kube.get("Node", name)
    taints = [
        {k: t.get(k) for k in ("key", "value", "effect")}
        for t in node["spec"].get("taints") or []
        if t["key"] == TAINT["key"]
    ]
    return node["metadata"]["labels"].get(POOL_LABEL), taints, node["metadata"]["resourceVersion"]


def is_reserved(cluster: Cluster, name: str) -> bool:
    label, taints, _ = node_state(cluster, name)
    return label == "inference" and taints == [TAINT]


def webhook_sees_reserved(cluster: Cluster, node: str, reserved: bool) -> None:
    """The webhook's cache follows the pool: a training pod naming the node is denied iff it is reserved."""

    def agrees() -> bool:
        try:
            cluster.kube.create(gpu_pod("probe", "default", node_name=node), dry_run=True)
        except ApiError as err:
            return reserved and f"spec.nodeName is {node}, a reserved node" in err.message
        return not reserved

    wait_until(agrees, timeout=60, what=f"the webhook to see {node} {'in' if reserved else 'out of'} the pool")


@pytest.fixture
def pool_nodes_released(cluster: Cluster) -> Iterator[tuple[str, ...]]:
    for node in cluster.pool_nodes:
        assert not is_reserved(cluster, node)
    yield cluster.pool_nodes
    cluster.cli("pool", "release", "--nodes", ",".join(cluster.pool_nodes), "--force")
    for node in cluster.pool_nodes:
        assert not is_reserved(cluster, node)
        webhook_sees_reserved(cluster, node, False)


def test_plan_apply_status_release_on_real_nodes(cluster: Cluster, pool_nodes_released: tuple[str, ...]) -> None:
    first, second = pool_nodes_released

    plan = cluster.cli("pool", "plan", "--selector", "amd.com/gpu.device-id=740f", "--count", "1", "-o", "json")
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    chosen = [n["name"] for n in planned["nodes"]]
    assert len(chosen) == 1 and chosen[0] in (first, second), planned  # one of the two MI210 nodes
    assert planned["reserved"]["after"]["gpusAllocatable"] == planned["reserved"]["before"]["gpusAllocatable"] + 8
    assert not is_reserved(cluster, first) and not is_reserved(cluster, second)  # a plan writes nothing

    _, _, version = node_state(cluster, first)
    dry = cluster.cli("pool", "apply", "--nodes", first, "--dry-run=server")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert node_state(cluster, first) == (None, [], version)  # validated by the apiserver, not persisted

    applied = cluster.cli("pool", "apply", "--nodes", first)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert is_reserved(cluster, first)
    node = cluster.kube.get("Node", first)
    assert node["metadata"]["labels"]["amd.com/gpu.device-id"] == "740f"  # only our label and taint change
    webhook_sees_reserved(cluster, first, True)

    _, _, version = node_state(cluster, first)
    again = cluster.cli("pool", "apply", "--nodes", first)
    assert again.returncode == 0, again.stdout + again.stderr
    assert node_state(cluster, first)[2] == version  # idempotent: no write at all

    status = cluster.cli("pool", "status", "-o", "json")
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    states = {n["name"]: (n["labelled"], n["tainted"], n["state"]) for n in report["nodes"]}
    assert states == {name: (True, True, "ok") for name in (*cluster.reserved, first)}, states
    assert report["reserved"]["nodes"] == len(cluster.reserved) + 1
    assert report["reserved"]["gpusAllocatable"] == 8 * (len(cluster.reserved) + 1)

    released = cluster.cli("pool", "release", "--nodes", first)
    assert released.returncode == 0, released.stdout + released.stderr
    assert node_state(cluster, first)[:2] == (None, [])
    webhook_sees_reserved(cluster, first, False)


def _running_and_ready(cluster: Cluster, pod: Obj) -> None:
    """No kubelet: the pod's status is written by the test, so that a PodDisruptionBudget counts it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.kube.patch(
        "Pod",
        pod["metadata"]["name"],
        {
            "status": {
                "phase": "Running",
                "startTime": now,
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                ],
            }
        },
        pod["metadata"]["namespace"],
        subresource="status",
    )


def _pdb(cluster: Cluster, ns: str) -> Obj:
    obj: Obj = cluster.kube.get("PodDisruptionBudget", "trainer", ns)
    return obj


def test_evict_honours_a_real_pod_disruption_budget_and_skips_daemonset_pods(
    cluster: Cluster, namespace: Callable[..., str], pool_nodes_released: tuple[str, ...]
) -> None:
    node = pool_nodes_released[1]
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    kube = cluster.kube
    trainers = [kube.create(gpu_pod(f"trainer-{i}", ns, labels={"app": "trainer"}, node_name=node)) for i in range(2)]
    kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "a", "image": "busybox"}]},
                },
            },
        }
    )
    agent = wait_until(
        lambda: next((p for p in cluster.pods(ns, "app=agent") if p["spec"].get("nodeName") == node), None),
        timeout=60,
        what=f"the DaemonSet pod on {node}",
    )
    for pod in [*trainers, agent]:
        _running_and_ready(cluster, pod)
    kube.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "trainer", "namespace": ns},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "trainer"}}},
        }
    )
    wait_until(
        lambda: (
            (s := _pdb(cluster, ns).get("status") or {}).get("currentHealthy") == 2 and s.get("disruptionsAllowed") == 0
        ),
        timeout=60,
        what="the disruption controller to count the trainers",
    )

    def alive(name: str) -> bool:
        pod = kube.get_or_none("Pod", name, ns)
        return pod is not None and not pod["metadata"].get("deletionTimestamp")

    # --dry-run=server: nothing labelled, nothing evicted.
    _, _, version = node_state(cluster, node)
    dry = cluster.cli("pool", "apply", "--nodes", node, "--evict", "--dry-run=server", "--timeout", "5s")
    assert dry.returncode in (0, 1), dry.stdout + dry.stderr
    assert node_state(cluster, node) == (None, [], version)
    assert all(alive(p["metadata"]["name"]) for p in [*trainers, agent])

    # The budget refuses: apply reserves the node, retries until its timeout, evicts nothing, says not done.
    refused = cluster.cli("pool", "apply", "--nodes", node, "--evict", "--timeout", "5s")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert is_reserved(cluster, node)
    assert all(alive(p["metadata"]["name"]) for p in trainers)
    assert "trainer" in refused.stdout + refused.stderr

    # The budget allows: both trainers are evicted (graceful: no kubelet finishes it, so they stay
    # Terminating), the DaemonSet pod is skipped.
    kube.patch("PodDisruptionBudget", "trainer", {"spec": {"minAvailable": 0}}, ns)
    wait_until(
        lambda: (_pdb(cluster, ns).get("status") or {}).get("disruptionsAllowed") == 2,
        timeout=60,
        what="the budget to allow two disruptions",
    )
    allowed = cluster.cli("pool", "apply", "--nodes", node, "--evict", "--timeout", "60s")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    for pod in trainers:
        assert not alive(pod["metadata"]["name"]), pod["metadata"]["name"]
    assert alive(agent["metadata"]["name"])
