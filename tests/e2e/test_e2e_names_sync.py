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
NAMES_POLICY = reserved_nodes.NAMES_POLICY_NAME
LABEL_POLICY = reserved_nodes.POLICY_NAME


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


def test_with_the_params_configmap_deleted_and_the_webhook_down_the_backstop_still_denies_all_but_names(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    """Issue 42: the backstop fails closed. With the webhook out of the path and the names ConfigMap deleted,
    the apiserver alone still denies a training GPU pod tolerating the reserved taint, selecting the reserved
    pool, requiring it by affinity, tolerating every taint, or opting out with a node name
    (``rocm-isolation-reserved-nodes`` takes no parameter); only the name checks
    (``rocm-isolation-reserved-node-names``, ``parameterNotFoundAction: Allow``) are off, and a pod of another
    namespace, GPU or not, is still admitted (the cluster keeps working). ``pool apply`` re-creates the
    ConfigMap and ``spec.nodeName`` of a reserved node is denied again."""
    kube = cluster.kube
    before = _names(cluster)
    reserved = sorted(before)[0]
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    term = {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["inference"]}]}
    by_label = {
        "toleration": gpu_pod(
            "tolerates", ns, tolerations=[{"key": "rocm-isolation.io/reserved", "operator": "Exists"}]
        ),
        "selector": gpu_pod("selects", ns, nodeSelector={POOL: "inference"}),
        "affinity": gpu_pod(
            "affinity",
            ns,
            affinity={
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            },
        ),
        "every-taint": gpu_pod("everything", ns, tolerations=[{"operator": "Exists"}]),
        "opted-out": gpu_pod("opted-out", ns, labels={"rocm-isolation.io/ignore": "true"}, node_name=reserved),
    }
    by_name = gpu_pod("by-name", ns, node_name=reserved)

    def denial(pod: dict[str, Any]) -> str | None:
        try:
            kube.create(pod, dry_run=True)
        except ApiError as err:
            return err.message
        return None

    with cluster.without_webhook_configuration():
        reviews = cluster.webhook_reviews()
        assert NAMES_POLICY in (denial(by_name) or ""), "denied by name while the ConfigMap is there"
        kube.delete("ConfigMap", reserved_names.PARAMS_CONFIGMAP, reserved_names.NAMESPACE)
        try:
            # The apiserver's params informer has seen the deletion once a pod naming a reserved node passes.
            wait_until(
                lambda: denial(by_name) is None, timeout=30, what="the names policy skipped without its parameter"
            )
            for what, pod in by_label.items():
                message = denial(pod)
                assert message is not None, f"{what}: admitted with the ConfigMap deleted"
                assert f"ValidatingAdmissionPolicy '{LABEL_POLICY}'" in message, (what, message)
            # The cluster keeps working: pods that reach no reserved node are admitted, GPU or not.
            assert denial(gpu_pod("placed-elsewhere", ns)) is None
            plain: Any = gpu_pod("no-gpu", ns)
            plain["spec"]["containers"][0].pop("resources", None)
            assert denial(plain) is None
            assert cluster.webhook_reviews() == reviews, "the webhook was out of the path"
        finally:
            result = cluster.cli("pool", "apply", "--nodes", ",".join(sorted(before)))
            assert result.returncode == 0, result.stdout + result.stderr
        assert _names(cluster) == before
        wait_until(lambda: NAMES_POLICY in (denial(by_name) or ""), timeout=30, what="the names policy back")
