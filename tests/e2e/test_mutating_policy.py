"""Issue 20 on the real control plane: nothing fails open with the webhook down.

- the placement MutatingAdmissionPolicy (installed from ``manifests``) is accepted without warnings;
- the MAP alone (webhook configuration deleted) gives every engine fixture pod, in a namespace of each
  class, the affinity, tolerations and class annotation the engine gives it; the reference engine runs
  with the DRA-claim route switched off, as the MAP matches (CEL cannot read a claim: those pods are
  the webhook's);
- MAP and webhook together give them once (no duplicate term, toleration, env variable or spread);
- with the webhook out of the path, an inference Deployment binds to reserved nodes only and a training
  Job to shared ones; a training pod naming a reserved node (nodeName, matchFields) is denied by the
  backstop after ``pool apply`` and admitted again after ``pool release``;
- a large pod (30 containers x 20 env variables, 10 ORed terms) is admitted within the CEL cost limits.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch
import pytest

from webhook.core import engine
from webhook.core.policy import default_policy
from webhook.deploy import mutating_policy, reserved_names

from .harness import RESERVED_NODES, WEBHOOK_CONFIGURATION, Cluster, gpu_pod
from .kube import ApiError, Obj, wait_until
from .placement import (
    CLASS_LABEL,
    PLACED,
    PODS,
    as_pod,
    before_admission,
    engine_result,
    placed,
    policy_without_claims,
)


@pytest.fixture(scope="module")
def class_namespaces(cluster: Cluster) -> Iterator[dict[str, str]]:
    names = {name: cluster.namespace(f"map-{name}", {CLASS_LABEL: name}) for name in default_policy().spec.classes}
    yield names
    for name in names.values():
        cluster.cleanup(name)


@pytest.fixture(scope="module")
def webhook_out_of_the_path(cluster: Cluster, class_namespaces: dict[str, str]) -> Iterator[None]:
    """The MutatingWebhookConfiguration deleted (what an outage with failurePolicy Ignore amounts to),
    until the apiserver has stopped calling it: the webhook's env variable no longer appears."""
    configuration = next(d for d in cluster.manifests if d["kind"] == "MutatingWebhookConfiguration")
    cluster.kube.delete("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    probe = gpu_pod("probe", class_namespaces["inference"])

    def webhook_gone() -> bool:
        pod = cluster.kube.create(probe, dry_run=True)
        return not any(e.get("name") == "HSA_QUEUE_PRIORITY" for e in pod["spec"]["containers"][0].get("env") or [])

    wait_until(webhook_gone, timeout=60, what="the apiserver to stop calling the deleted webhook")
    try:
        yield
    finally:
        cluster.kube.apply(configuration)
        cluster.sync_webhook()


def test_the_placement_policy_is_accepted_without_warnings(cluster: Cluster) -> None:
    """Every expression compiles against the Pod's types when created (a MutatingAdmissionPolicy has no
    status.typeChecking: the apiserver refuses a policy that does not compile, and would say any
    warning in the reply's Warning headers)."""
    rendered = [
        d for d in cluster.manifests if d["kind"] in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    ]
    assert [d["apiVersion"] for d in rendered] == ["admissionregistration.k8s.io/v1"] * 2
    live = cluster.kube.get("MutatingAdmissionPolicy", mutating_policy.POLICY_NAME)
    assert live["spec"]["mutations"] == rendered[0]["spec"]["mutations"]
    for document in rendered:
        again = copy.deepcopy(document)
        again["metadata"]["name"] = "e2e-compile-check"
        if again["kind"] == "MutatingAdmissionPolicyBinding":
            again["spec"]["policyName"] = "e2e-compile-check"
        cluster.kube.create(again, dry_run=True)
        assert cluster.kube.last_warnings == [], cluster.kube.last_warnings


def test_audit_reports_a_node_labelled_by_hand(cluster: Cluster) -> None:
    node = cluster.pool_nodes[1]
    cluster.kube.patch("Node", node, {"metadata": {"labels": {"rocm-isolation.io/pool": "inference"}}})
    try:
        assert reserved_names.disagreement(_params(cluster), [*RESERVED_NODES, node])
        result = cluster.cli("audit", "-o", "json")
        assert f"{node}" in result.stdout and reserved_names.PARAMS_CONFIGMAP in result.stdout, result.stdout[-2000:]
    finally:
        cluster.kube.patch("Node", node, {"metadata": {"labels": {"rocm-isolation.io/pool": None}}})


def _unmerged(constraints: list[Obj] | None) -> list[Obj] | None:
    """Spread constraints without what the pod registry adds at creation (matchLabelKeys merged into
    labelSelector.matchExpressions), as the webhook wrote them."""
    if constraints is None:
        return None
    out = copy.deepcopy(constraints)
    for constraint in out:
        keys = constraint.get("matchLabelKeys") or []
        selector = constraint.get("labelSelector") or {}
        kept = [e for e in selector.get("matchExpressions") or [] if e["key"] not in keys]
        selector.pop("matchExpressions", None)
        if kept:
            selector["matchExpressions"] = kept
    return out


def _duplicates(items: list[Any]) -> list[Any]:
    seen: list[Any] = []
    return [item for item in items if item in seen or seen.append(item)]  # type: ignore[func-returns-value]


@pytest.mark.parametrize("body", PODS)
def test_the_policy_and_the_webhook_together_place_once(
    cluster: Cluster, class_namespaces: dict[str, str], body: Obj
) -> None:
    """Both in the path (the MAP first, then the webhook, each reinvoked if the other changed the pod):
    the webhook alone's affinity, tolerations, env and spread, nothing twice."""
    for class_name, namespace in class_namespaces.items():
        pod = as_pod(body, namespace)
        try:
            before = before_admission(cluster.kube, pod)
        except ApiError:
            continue
        try:
            got = cluster.kube.create(pod, dry_run=True)
        except ApiError:
            continue  # denied (by the webhook or the backstop): nothing placed
        expected = engine_result(before, {CLASS_LABEL: class_name}, default_policy())
        for field in PLACED:
            assert got["spec"].get(field) == expected["spec"].get(field), (class_name, field)
        spread = "topologySpreadConstraints"
        assert _unmerged(got["spec"].get(spread)) == expected["spec"].get(spread), class_name
        for container in got["spec"]["containers"] + (got["spec"].get("initContainers") or []):
            names = [e["name"] for e in container.get("env") or []]
            assert _duplicates(names) == [], (class_name, container["name"], names)
        for term in (
            ((got["spec"].get("affinity") or {}).get("nodeAffinity") or {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", {})
            .get("nodeSelectorTerms", [])
        ):
            assert _duplicates(term.get("matchExpressions") or []) == [], (class_name, term)
        assert _duplicates(got["spec"].get("tolerations") or []) == [], class_name


@pytest.mark.parametrize("body", PODS)
def test_the_policy_alone_places_like_the_engine(
    cluster: Cluster, class_namespaces: dict[str, str], webhook_out_of_the_path: None, body: Obj
) -> None:
    policy = policy_without_claims()
    for class_name, namespace in class_namespaces.items():
        pod = as_pod(body, namespace)
        try:
            before = before_admission(cluster.kube, pod)
        except ApiError:
            continue  # refused whatever mutates it (invalid, the backstop)
        expected = engine_result(before, {CLASS_LABEL: class_name}, policy)
        try:
            got = cluster.kube.create(pod, dry_run=True)
        except ApiError as err:
            # Only the backstop may refuse it: the placement never makes an admissible pod inadmissible.
            assert "ValidatingAdmissionPolicy" in err.message, (class_name, err.message)
            continue
        assert placed(got) == placed(expected), (class_name, jsonpatch.make_patch(placed(expected), placed(got)).patch)
        # The engine on the policy's output adds no placement of its own (the webhook patches nothing twice).
        again = engine_result(got, {CLASS_LABEL: class_name}, policy)
        assert placed(again) == placed(got), class_name


def _deployment(name: str, namespace: str, replicas: int) -> Obj:
    template = gpu_pod(name, namespace)
    del template["metadata"]["name"], template["metadata"]["namespace"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def _job(name: str, namespace: str, parallelism: int) -> Obj:
    template = gpu_pod(name, namespace)
    del template["metadata"]["name"], template["metadata"]["namespace"]
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"parallelism": parallelism, "completions": parallelism, "template": template},
    }


def test_with_the_webhook_down_inference_binds_to_reserved_nodes_and_training_to_shared(
    cluster: Cluster, namespace: Callable[..., str], webhook_out_of_the_path: None
) -> None:
    serving = namespace("serving", {CLASS_LABEL: "inference"})
    research = namespace("research", {CLASS_LABEL: "training"})
    cluster.kube.create(_deployment("llm", serving, 3))
    cluster.kube.create(_job("trainer", research, 3))
    for pod in cluster.wait_bound(serving, 3, "app=llm"):
        assert pod["spec"]["nodeName"] in RESERVED_NODES, pod["spec"]["nodeName"]
        assert pod["metadata"]["annotations"][engine.CLASS_ANNOTATION] == "inference"
        # The webhook did not run: placement came from the apiserver alone.
        assert not any(e.get("name") == "HSA_QUEUE_PRIORITY" for e in pod["spec"]["containers"][0].get("env") or [])
    for pod in cluster.wait_bound(research, 3, "app=trainer"):
        assert pod["spec"]["nodeName"] not in RESERVED_NODES, pod["spec"]["nodeName"]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in terms[
            "nodeSelectorTerms"
        ][0]["matchExpressions"]


def _names_denial(cluster: Cluster, pod: Obj) -> str:
    with pytest.raises(ApiError) as caught:
        cluster.kube.create(pod, dry_run=True)
    assert f"ValidatingAdmissionPolicy '{reserved_names.POLICY_NAME}'" in caught.value.message, caught.value.message
    return caught.value.message


def _pinned(name: str, namespace: str, node: str) -> Obj:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return gpu_pod(
        name,
        namespace,
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}},
    )


def _params(cluster: Cluster) -> dict[str, str]:
    configmap = cluster.kube.get("ConfigMap", reserved_names.PARAMS_CONFIGMAP, reserved_names.NAMESPACE)
    return dict(configmap.get("data") or {})


def test_reserved_node_names_are_denied_by_the_backstop_after_pool_apply_and_allowed_after_release(
    cluster: Cluster, namespace: Callable[..., str], webhook_out_of_the_path: None
) -> None:
    research = namespace("research", {CLASS_LABEL: "training"})
    # The session's pool apply wrote the params: the reserved nodes are known to the backstop.
    assert set(RESERVED_NODES) <= set(_params(cluster))
    message = _names_denial(cluster, gpu_pod("named", research, node_name=RESERVED_NODES[0]))
    assert f"{RESERVED_NODES[0]}, a reserved node, is its spec.nodeName" in message
    _names_denial(cluster, _pinned("pinned", research, RESERVED_NODES[1]))

    node = cluster.pool_nodes[0]
    cluster.kube.create(gpu_pod("before", research, node_name=node), dry_run=True)
    try:
        cluster.cli("pool", "apply", "--nodes", node, check=True)
        assert node in _params(cluster)
        wait_until(lambda: _try_denied(cluster, gpu_pod("named", research, node_name=node)), what="the new params")
        _names_denial(cluster, _pinned("pinned", research, node))
    finally:
        cluster.cli("pool", "release", "--nodes", node, "--force", check=True)
    assert node not in _params(cluster)
    wait_until(lambda: not _try_denied(cluster, gpu_pod("after", research, node_name=node)), what="the released params")
    cluster.kube.create(_pinned("pinned", research, node), dry_run=True)
    # Inference may name its own nodes.
    serving = namespace("serving", {CLASS_LABEL: "inference"})
    cluster.kube.create(gpu_pod("server", serving, node_name=RESERVED_NODES[0]), dry_run=True)


def _try_denied(cluster: Cluster, pod: Obj) -> bool:
    try:
        cluster.kube.create(pod, dry_run=True)
    except ApiError as err:
        return reserved_names.POLICY_NAME in err.message
    return False


def test_a_large_pod_is_placed_within_the_cel_cost_limits(
    cluster: Cluster, class_namespaces: dict[str, str], webhook_out_of_the_path: None
) -> None:
    terms = [
        {
            "matchExpressions": [
                {"key": "amd.com/gpu.device-id", "operator": "In", "values": [f"74a{i}", "740f"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [f"zone-{i}"]},
            ]
        }
        for i in range(10)
    ]
    containers = [
        {
            "name": f"c{i}",
            "image": "rocm/vllm:latest",
            "env": [{"name": f"VAR_{j}", "value": "x" * 64} for j in range(20)],
            "resources": {"limits": {"amd.com/gpu": "1"}},
        }
        for i in range(30)
    ]
    for class_name, namespace in class_namespaces.items():
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "large", "namespace": namespace, "labels": {"app": "large"}},
            "spec": {
                "containers": containers,
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
                },
                "tolerations": [{"key": f"t{i}", "operator": "Exists"} for i in range(20)],
            },
        }
        got = cluster.kube.create(pod, dry_run=True)
        placed_terms = got["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert len(placed_terms) == 10
        requirement = engine._class_plan(default_policy(), class_name).requirements
        for term in placed_terms:
            assert term["matchExpressions"][-1] == requirement[0].alternatives[0], json.dumps(term)
