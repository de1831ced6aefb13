"""Lending kept by ``serve``'s Lease holder (webhook/service/lending_loop.py), on the real control plane,
with the webhook's own ServiceAccount (the manifests' RBAC, and what lending adds: ``patch`` on nodes held
by a ValidatingAdmissionPolicy to the no-borrowers taint, webhook/deploy/lending_access.py).

The keeper's rounds run in the test process (``run_once``), as the Lease holder runs them; the pods it reads
are created in an excluded namespace with the borrowers' fields set by hand (the session's webhook, MAP and
backstop run the shipped policy, lending off). Preemption of borrowers by the real scheduler, with the
webhook placing them: tests/e2e/test_e2e_lending.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from webhook.cluster.kubeapi import KubeApi
from webhook.core.policy import Policy, default_policy, parse_policy
from webhook.deploy import lending_access, priority_classes, render
from webhook.service.lending_loop import LendingKeeper

from .harness import Cluster
from .kube import wait_until

TAINT_KEY = "rocm-isolation.io/no-borrowers"

# The keeper's taints and the node-writes ValidatingAdmissionPolicy need no DRA and no MutatingAdmissionPolicy.
pytestmark = pytest.mark.minors("1.33", "1.34", "1.35")
EXCLUDED = "kube-public"  # excluded by the shipped policy: the webhook and the backstop leave its pods alone


def lending_policy(enabled: bool = True, headroom: int = 0) -> Policy:
    document = default_policy().document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["lending"] = {"enabled": enabled, "headroomGPUs": headroom}
    return parse_policy(yaml.safe_dump(document))


def closed(cluster: Cluster) -> set[str]:
    return {
        name
        for name in cluster.reserved
        if any(t.get("key") == TAINT_KEY for t in cluster.kube.get("Node", name)["spec"].get("taints") or [])
    }


@pytest.fixture(scope="module")
def lending(cluster: Cluster) -> Iterator[KubeApi]:
    """What ``manifests`` renders with lending on (the PriorityClasses, the node RBAC and its policy), and an
    API client of the webhook's ServiceAccount; every node opened again afterwards."""
    policy = lending_policy()
    objects = [
        *priority_classes.resources(policy, metadata=render._metadata),
        *lending_access.resources(policy, render.NAMESPACE, render.APP_NAME, metadata=render._metadata),
    ]
    for obj in objects:
        cluster.kube.apply(obj)
    api = KubeApi.connect(str(cluster.webhook_kubeconfig))
    try:
        yield api
    finally:
        LendingKeeper(api, lambda: lending_policy(enabled=False), lambda: True).run_once()
        for obj in reversed(objects):
            cluster.kube.delete(obj["kind"], obj["metadata"]["name"])
        api.close()


def test_the_webhook_may_change_the_no_borrowers_taint_of_a_node_and_nothing_else(
    cluster: Cluster, lending: KubeApi
) -> None:
    node = cluster.reserved[0]

    def label_refused() -> str | None:
        try:
            lending.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"rocm-isolation.io/pool": "shared"}}})
        except Exception as err:  # the policy's denial, once the apiserver has loaded it
            text = str(err)
            return text if lending_access.NODE_WRITES_POLICY in text else None
        # Loaded too late: the label was changed; put it back and try again.
        cluster.kube.patch("Node", node, {"metadata": {"labels": {"rocm-isolation.io/pool": "inference"}}})
        return None

    refused = wait_until(label_refused, timeout=30, what="the node-writes policy to deny a label change")
    assert "may change only the taint rocm-isolation.io/no-borrowers" in refused
    # The keeper's own write goes through: headroom for every reserved GPU closes every idle reserved node.
    observed = LendingKeeper(lending, lambda: lending_policy(headroom=10_000), lambda: True).run_once()
    assert set(observed.written) == set(cluster.reserved) == closed(cluster)
    reserved_taint = {"key": "rocm-isolation.io/reserved", "value": "inference", "effect": "NoSchedule"}
    assert reserved_taint in cluster.kube.get("Node", node)["spec"]["taints"]  # the others kept
    # Another taint, or cordoning, is refused to the webhook's ServiceAccount.
    with pytest.raises(Exception, match=lending_access.NODE_WRITES_POLICY):
        lending.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
    # Lending off: the next round opens every node again.
    LendingKeeper(lending, lambda: lending_policy(enabled=False), lambda: True).run_once()
    assert closed(cluster) == set()


def borrower(name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": EXCLUDED, "labels": {"rocm-isolation.io/borrow": "true"}},
        "spec": {
            "nodeName": node,
            "priorityClassName": "rocm-isolation-borrower",
            "tolerations": [{"key": "rocm-isolation.io/reserved", "operator": "Exists"}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"amd.com/gpu": str(gpus)}}}],
        },
    }


def test_a_borrower_keeps_its_node_open_the_headroom_closes_idle_ones(cluster: Cluster, lending: KubeApi) -> None:
    lent_node = cluster.reserved[0]
    created = cluster.kube.create(borrower("keeper-borrower", lent_node, 2))
    try:
        # The Priority admission plugin filled the borrowers' priority from the class: a borrower.
        assert created["spec"]["priority"] == -100
        observed = LendingKeeper(lending, lambda: lending_policy(headroom=1), lambda: True).run_once()
        assert observed.lent == 2
        assert lent_node not in observed.closed and len(observed.closed) == 1
        assert closed(cluster) == set(observed.closed)
    finally:
        cluster.kube.delete("Pod", "keeper-borrower", EXCLUDED, force=True)
        LendingKeeper(lending, lambda: lending_policy(enabled=False), lambda: True).run_once()
