"""Reserved node names that follow the cluster (webhook/service/names_sync.py), on the real control plane:
nodes labelled by another tool (kubectl here), a reserved node added later, one unlabelled; the replica
holding the audit Lease keeps the backstop's params ConfigMap in step within seconds, with the webhook's
own ServiceAccount (its RBAC: get/patch on that ConfigMap only); stopped afterwards, the backstop still
denies a training pod naming the nodes it learnt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from webhook.deploy import reserved_names, reserved_nodes

from .harness import MI210_LABELS, Cluster, gpu_pod, make_node
from .kube import ApiError, wait_until

POOL = "rocm-isolation.io/pool"
NAMES_POLICY = reserved_nodes.POLICY_NAME


def _names(cluster: Cluster) -> set[str]:
    configmap = cluster.kube.get("ConfigMap", reserved_names.PARAMS_CONFIGMAP, reserved_names.NAMESPACE)
    return set(configmap.get("data") or {})


def _label(cluster: Cluster, node: str, value: str | None) -> None:
    cluster.kube.patch("Node", node, {"metadata": {"labels": {POOL: value}}})


def test_the_backstop_learns_nodes_reserved_by_any_tool_within_seconds(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    kube = cluster.kube
    before = _names(cluster)
    labelled, added = cluster.pool_nodes[1], "names-sync-later-0"
    # Not the first reserved node: the suite's own probe (Cluster.sync_webhook) names that one.
    unlabelled = next(node for node in sorted(before) if node != cluster.reserved[0])
    webhook = cluster.start_webhook(
        "names-sync",
        "--audit-interval-seconds",
        "300",
        "--no-audit-reports",
        "--names-sync-seconds",
        "1",
        cert_dir=cluster.webhook.cert_dir,
    )
    try:
        wait_until(lambda: webhook.metric("rocm_isolation_audit_leader") == 1, timeout=60, what="the audit Lease")
        # A node labelled by another tool; a node that joins already labelled (an autoscaler's); one
        # node unlabelled: each is followed within seconds.
        _label(cluster, labelled, "inference")
        make_node(kube, added, {**MI210_LABELS, POOL: "inference"})
        _label(cluster, unlabelled, None)
        expected = (before | {labelled, added}) - {unlabelled}
        wait_until(lambda: _names(cluster) == expected, timeout=15, what=f"the ConfigMap to list {sorted(expected)}")
        assert webhook.metric("rocm_isolation_reserved_names_syncs_total", result="updated") >= 1
    finally:
        cluster.plane.processes.stop_one(webhook.component)
    try:
        # The webhook stopped and out of the path: the apiserver alone denies a training pod naming a node
        # the backstop learnt from the cluster (before this change it knew only what `pool` had written).
        ns = namespace(labels={"rocm-isolation.io/class": "training"})
        with cluster.without_webhook_configuration():
            for node in (labelled, added):
                with pytest.raises(ApiError) as denied:
                    kube.create(gpu_pod(f"on-{node}", ns, node_name=node), dry_run=True)
                assert NAMES_POLICY in denied.value.message, denied.value.message
            # The unlabelled node is no longer reserved: a training pod may name it.
            created: Any = kube.create(gpu_pod("on-unlabelled", ns, node_name=unlabelled), dry_run=True)
            assert created["spec"]["nodeName"] == unlabelled
    finally:
        _label(cluster, labelled, None)
        _label(cluster, unlabelled, "inference")
        kube.delete("Node", added)
        # Back to what `pool` wrote, for the rest of the session.
        result = cluster.cli("pool", "apply", "--nodes", ",".join(sorted(before)))
        assert result.returncode == 0, result.stdout + result.stderr
        wait_until(lambda: _names(cluster) == before, timeout=15, what="the ConfigMap restored")


def test_a_deleted_params_configmap_turns_the_pod_backstop_off_until_pool_apply_writes_it_again(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    """The documented trade of one backstop policy (webhook/deploy/reserved_nodes.py): its bindings read
    the names ConfigMap with parameterNotFoundAction Allow, so while it is deleted the apiserver skips the
    whole policy (a training pod selecting the reserved nodes by label is admitted with the webhook out of
    the path), and ``pool apply`` re-creates it (denied again)."""
    kube = cluster.kube
    before = _names(cluster)
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    by_label = gpu_pod("by-label", ns, nodeSelector={POOL: "inference"})

    def denied() -> bool:
        try:
            kube.create(by_label, dry_run=True)
        except ApiError as err:
            assert NAMES_POLICY in err.message, err.message
            return True
        return False

    with cluster.without_webhook_configuration():
        assert denied()
        kube.delete("ConfigMap", reserved_names.PARAMS_CONFIGMAP, reserved_names.NAMESPACE)
        try:
            wait_until(lambda: not denied(), timeout=30, what="the backstop skipped without its parameter")
        finally:
            result = cluster.cli("pool", "apply", "--nodes", ",".join(sorted(before)))
            assert result.returncode == 0, result.stdout + result.stderr
        assert _names(cluster) == before
        wait_until(denied, timeout=30, what="the backstop back with its parameter")
