"""Scenario 4: the backstop in the apiserver. The rendered ValidatingAdmissionPolicies compile and
type-check without warnings, keep training off the reserved nodes with the webhook's configuration
deleted, and the namespace-label guard refuses a user outside the editor groups."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest
from cluster_objects import new_namespace

from webhook.core.engine import PLACED_LABEL

from .controlplane import MINORS
from .harness import RESERVED_POLICY, WEBHOOK_DENIAL, WEBHOOK_NAMESPACE, Cluster, gpu_pod, placement_served
from .kube import ApiError, Obj, wait_until

pytestmark = pytest.mark.minors(*MINORS)  # what every stock minor serves (issue 47)

NAMESPACE_POLICY = "rocm-isolation-namespace-class"
EDITORS_CONFIGMAP = "rocm-isolation-class-label-editors"


def policies(cluster: Cluster) -> list[Obj]:
    return [doc for doc in cluster.manifests if doc["kind"] == "ValidatingAdmissionPolicy"]


def test_every_rendered_policy_type_checks_without_warnings(cluster: Cluster) -> None:
    rendered = policies(cluster)
    assert {p["metadata"]["name"] for p in rendered} >= {RESERVED_POLICY, NAMESPACE_POLICY}
    for policy in rendered:
        name = policy["metadata"]["name"]

        def checked(name: str = name) -> Obj | None:
            live = cluster.kube.get("ValidatingAdmissionPolicy", name)
            status = live.get("status") or {}
            # The controller-manager's validatingadmissionpolicy-status controller type-checks every
            # expression against the OpenAPI schema of the matched kinds and writes the result here.
            if (
                status.get("observedGeneration") == live["metadata"]["generation"]
                and status.get("typeChecking") is not None
            ):
                return live
            return None

        live = wait_until(checked, timeout=60, what=f"status.typeChecking of {name}")
        warnings = live["status"]["typeChecking"].get("expressionWarnings") or []
        assert warnings == [], f"{name}: {warnings}"
        conditions = {c["type"]: c for c in live["status"].get("conditions") or []}
        assert conditions.get("InvalidExpressions", {}).get("status", "False") != "True", conditions


@pytest.fixture
def webhook_configuration_deleted(cluster: Cluster) -> Iterator[None]:
    with cluster.without_webhook_configuration():
        yield


def _denied_by(kube_call: Callable[[], object]) -> str:
    with pytest.raises(ApiError) as caught:
        kube_call()
    assert caught.value.status in (400, 403, 422), caught.value
    return caught.value.message


def test_the_backstop_holds_with_the_webhook_configuration_deleted(
    cluster: Cluster, namespace: Callable[..., str], webhook_configuration_deleted: None
) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    kube = cluster.kube

    # The webhook is out of the path (the fixture waited until a GPU pod's creation no longer
    # reached it); each attempt below is checked not to reach it either.
    reviews = cluster.webhook_reviews()

    attempts = {
        "nodeSelector": gpu_pod("selector", ns, nodeSelector={"rocm-isolation.io/pool": "inference"}),
        "affinity": gpu_pod(
            "affinity",
            ns,
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "rocm-isolation.io/pool", "operator": "In", "values": ["inference"]}
                                ]
                            }
                        ]
                    }
                }
            },
        ),
        "toleration": gpu_pod(
            "toleration", ns, tolerations=[{"key": "rocm-isolation.io/reserved", "operator": "Exists"}]
        ),
        "tolerate-everything": gpu_pod("everything", ns, tolerations=[{"operator": "Exists"}]),
        "opted-out-with-node-name": gpu_pod(
            "opted-out", ns, labels={"rocm-isolation.io/ignore": "true"}, node_name=cluster.reserved[0]
        ),
        # The placed label makes the placement policy skip a pod; the backstop never reads it.
        "placed-label-with-toleration": gpu_pod(
            "placed",
            ns,
            labels={PLACED_LABEL: "inference"},
            tolerations=[{"key": "rocm-isolation.io/reserved", "operator": "Exists"}],
        ),
    }
    for what, pod in attempts.items():
        message = _denied_by(functools.partial(kube.create, pod, dry_run=True))
        # Refused by the rendered backstop policy, in the apiserver.
        assert _by_a_backstop_policy(cluster, message), (what, message)
        assert WEBHOOK_DENIAL not in message, (what, message)
    assert cluster.webhook_reviews() == reviews

    # Inference keeps its way in: the same toleration in an inference namespace is admitted.
    inference = namespace("inference", labels={"rocm-isolation.io/class": "inference"})
    kube.create(
        gpu_pod("server", inference, tolerations=[{"key": "rocm-isolation.io/reserved", "operator": "Exists"}]),
        dry_run=True,
    )


@pytest.mark.skipif(not placement_served(), reason="no MutatingAdmissionPolicy on a stock minor before 1.36")
def test_a_pod_created_with_the_placed_label_is_placed_by_the_webhook_and_skipped_by_the_policy(
    cluster: Cluster, namespace: Callable[..., str]
) -> None:
    """The placed label is what lets the placement policy's binding skip the second pass of the mutating
    chain in Go. A pod's author who sets it (here with the wrong class) skips the policy: the webhook, which
    does not read it, still places the pod and corrects the label; with the webhook out of the path the pod
    is admitted unplaced (``audit``: pod-missing-mutations), and a training pod so labelled is still judged
    by the backstop (above)."""
    serving = namespace("serving", labels={"rocm-isolation.io/class": "inference"})
    labelled = gpu_pod("pre-labelled", serving, labels={"app": "llm", PLACED_LABEL: "training"})
    placed = cluster.kube.create(labelled, dry_run=True)
    assert placed["metadata"]["labels"][PLACED_LABEL] == "inference"
    assert placed["spec"]["affinity"]["nodeAffinity"], placed["spec"]
    with cluster.without_webhook_configuration():
        unplaced = cluster.kube.create(labelled, dry_run=True)
        assert "affinity" not in unplaced["spec"], unplaced["spec"]
        assert unplaced["metadata"]["labels"][PLACED_LABEL] == "training"
        by_policy = cluster.kube.create(gpu_pod("by-policy", serving), dry_run=True)
        assert by_policy["metadata"]["labels"][PLACED_LABEL] == "inference"
        assert by_policy["spec"]["affinity"]["nodeAffinity"], by_policy["spec"]


def test_the_backstop_denies_on_update_too_without_the_webhook(
    cluster: Cluster, namespace: Callable[..., str], webhook_configuration_deleted: None
) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    kube = cluster.kube
    pod = kube.create(gpu_pod("gated", ns, schedulingGates=[{"name": "example.com/queue"}]))
    pod["spec"]["tolerations"] = [
        *pod["spec"].get("tolerations", []),
        {"key": "rocm-isolation.io/reserved", "operator": "Exists"},
    ]
    message = _denied_by(lambda: kube.replace(pod))
    assert _by_a_backstop_policy(cluster, message), message


def _by_a_backstop_policy(cluster: Cluster, message: str) -> bool:
    names = {p["metadata"]["name"] for p in policies(cluster)} - {NAMESPACE_POLICY}
    return any(f"ValidatingAdmissionPolicy '{name}'" in message for name in names)


@pytest.fixture
def namespace_editor_rbac(cluster: Cluster) -> Iterator[None]:
    """RBAC lets the impersonated users create and label namespaces, so that any refusal is the
    policy's (not RBAC's)."""
    kube = cluster.kube
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "e2e-namespace-owner"},
        "rules": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "create", "update", "patch"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-namespace-owner"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-namespace-owner"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "e2e-tenants"}],
    }
    kube.apply(role)
    kube.apply(binding)
    try:
        yield
    finally:
        kube.delete("ClusterRoleBinding", "e2e-namespace-owner")
        kube.delete("ClusterRole", "e2e-namespace-owner")
        kube.patch("ConfigMap", EDITORS_CONFIGMAP, {"data": {"e2e-platform": None}}, WEBHOOK_NAMESPACE)


def test_namespace_label_guard_refuses_a_user_outside_the_editor_groups(
    cluster: Cluster, namespace: Callable[..., str], namespace_editor_rbac: None
) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    alice = cluster.kube.as_user("alice", ["e2e-tenants", "system:authenticated"])

    # RBAC allows alice to label her namespace: another label goes through.
    alice.patch("Namespace", ns, {"metadata": {"labels": {"team": "research"}}})
    assert cluster.kube.get("Namespace", ns)["metadata"]["labels"]["team"] == "research"

    for labels in (
        {"rocm-isolation.io/class": "inference"},
        {"rocm-isolation.io/class": None},
        {"rocm-isolation.io/mode": "audit"},
    ):
        message = _denied_by(functools.partial(alice.patch, "Namespace", ns, {"metadata": {"labels": labels}}))
        assert f"ValidatingAdmissionPolicy '{NAMESPACE_POLICY}'" in message, message
        assert EDITORS_CONFIGMAP in message, message
    new = new_namespace(f"{ns}-x", {"rocm-isolation.io/class": "inference"})
    message = _denied_by(lambda: alice.create(new))
    assert f"ValidatingAdmissionPolicy '{NAMESPACE_POLICY}'" in message, message
    assert cluster.kube.get("Namespace", ns)["metadata"]["labels"]["rocm-isolation.io/class"] == "training"

    # A group listed in the ConfigMap (the policy's params) may.
    cluster.kube.patch(
        "ConfigMap", EDITORS_CONFIGMAP, {"data": {"e2e-platform": "e2e-gpu-platform"}}, WEBHOOK_NAMESPACE
    )
    bob = cluster.kube.as_user("bob", ["e2e-tenants", "e2e-gpu-platform", "system:authenticated"])
    wait_until(
        lambda: _try(
            lambda: bob.patch("Namespace", ns, {"metadata": {"labels": {"rocm-isolation.io/class": "inference"}}})
        ),
        timeout=30,
        what="the editors ConfigMap to reach the policy",
    )
    assert cluster.kube.get("Namespace", ns)["metadata"]["labels"]["rocm-isolation.io/class"] == "inference"


def _try(call: Callable[[], object]) -> bool:
    try:
        call()
    except ApiError:
        return False
    return True
