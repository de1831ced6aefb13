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
- a large pod (30 containers x 20 env variables, 10 ORed terms) is admitted within the CEL cost limits;
- the MAP rendered from every policy fixture (tests/fixtures/policies), alone on a control plane of its
  own, places every engine fixture pod as the engine does with that policy, in a namespace of each
  class, of each namespace rule, unlabelled and in audit mode.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cluster_objects import new_namespace

from webhook.core import engine, placement
from webhook.core.policy import default_policy, parse_policy
from webhook.deploy import mutating_policy, priority_classes, render, reserved_names, reserved_nodes

from .controlplane import ASSETS_ENV, LOOPBACK, ControlPlane, loopback_only
from .harness import RESERVED_NODES, WEBHOOK_CONFIGURATION, Cluster, gpu_pod
from .kube import ApiError, Kube, Obj, wait_until
from .placement import (
    CLASS_LABEL,
    FIXTURE_LABEL,
    PLACED,
    PODS,
    accepted_policy_fixtures,
    as_pod,
    before_admission,
    claims_off,
    engine_result,
    every_fixture_pod,
    fixture_namespaces,
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
    # The name checks are a policy of their own (issue 42: the label checks take no parameter).
    assert f"ValidatingAdmissionPolicy '{reserved_nodes.NAMES_POLICY_NAME}'" in caught.value.message, (
        caught.value.message
    )
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
    assert "[deny-node-name]" in message and "spec.nodeName names a reserved node" in message, message
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
        return reserved_nodes.NAMES_POLICY_NAME in err.message
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
        requirement = placement.class_plan(default_policy(), class_name).requirements
        for term in placed_terms:
            assert term["matchExpressions"][-1] == requirement[0].alternatives[0], json.dumps(term)


# --- every policy fixture, on a control plane of its own ------------------------------------------

FIXTURE_POLICIES = accepted_policy_fixtures()
FIXTURE_PODS = every_fixture_pod()


@dataclass
class FixtureWorld:
    kube: Kube
    # fixture name -> (its namespaces and their labels)
    namespaces: dict[str, dict[str, dict[str, str]]]
    warnings: dict[str, list[str]]


def _fixture_resources(name: str, tag: str, text: str) -> list[Obj]:
    """The fixture policy's MAP and binding as ``manifests --policy`` renders them, renamed, and bound
    only to the namespaces made for it (the label FIXTURE_LABEL)."""
    policy = parse_policy(text)
    documents = mutating_policy.resources(
        policy,
        excluded=render.excluded_namespaces_selector(policy),
        metadata=lambda object_name: {"name": f"{object_name}-{name}"},
    )
    binding = documents[1]["spec"]
    binding["policyName"] = documents[0]["metadata"]["name"]
    binding["matchResources"]["namespaceSelector"]["matchExpressions"].append(
        {"key": FIXTURE_LABEL, "operator": "In", "values": [tag]}
    )
    return documents


@pytest.fixture(scope="module")
def fixture_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureWorld]:
    """A control plane with only the fixture policies' MAPs (no webhook, no backstop): each bound to its
    own namespaces, which exist (with their default ServiceAccount) and which the MAP reads (a probe pod
    there is placed in the namespace's class) before any test runs."""
    loopback_only()
    plane = ControlPlane(Path(os.environ[ASSETS_ENV]), tmp_path_factory.mktemp("controlplane-map-fixtures"))
    try:
        plane.start()
        kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
        for handler in ("amd", "gvisor"):  # the RuntimeClass admission plugin wants them to exist
            runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": handler}}
            kube.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {**runtime_class, "handler": handler})
        world = FixtureWorld(kube, {}, {})
        for index, (name, text) in enumerate(FIXTURE_POLICIES):
            tag = f"pf{index}"
            world.warnings[name] = []
            # Lending on: the PriorityClasses the MAP writes into borrowers (and inference pods) must exist.
            for priority_class in priority_classes.resources(parse_policy(text), metadata=lambda n: {"name": n}):
                kube.create(priority_class)
            for document in _fixture_resources(name, tag, text):
                kube.create(document)
                world.warnings[name] += kube.last_warnings
            world.namespaces[name] = fixture_namespaces(parse_policy(text), tag)
            for namespace, labels in world.namespaces[name].items():
                kube.create(new_namespace(namespace, labels))
        for name, text in FIXTURE_POLICIES:
            policy = claims_off(text)
            for namespace, labels in world.namespaces[name].items():
                probe = gpu_pod("probe", namespace)
                wait_until(
                    lambda namespace=namespace: kube.get_or_none("ServiceAccount", "default", namespace),
                    what=f"{namespace}/default",
                )
                wanted = placed(engine_result(before_admission(kube, probe), labels, policy))["class"]
                if wanted is not None:
                    wait_until(
                        lambda probe=probe, wanted=wanted: (
                            (kube.create(probe, dry_run=True)["metadata"].get("annotations") or {}).get(
                                engine.CLASS_ANNOTATION
                            )
                            == wanted
                        ),
                        timeout=60,
                        what=f"the MAP of {name} placing pods of {namespace}",
                    )
        yield world
    finally:
        plane.stop()


def test_the_fixture_run_covers_every_kind_of_policy() -> None:
    names = [name for name, _ in FIXTURE_POLICIES]
    policies = {name: parse_policy(text) for name, text in FIXTURE_POLICIES}
    assert "good-full" in names and "good-namespaces" in names and len(names) >= 15
    spec = [p.spec for p in policies.values()]
    assert any(s.scope.all_pods for s in spec) and any(s.mode == "audit" for s in spec)
    assert any(any("*" in n or "?" in n for r in s.namespaces for n in r.match.names) for s in spec), "glob rules"
    assert any(any(r.match.labels for r in s.namespaces) for s in spec), "label rules"
    assert any(any(c.node_selector_requirements for c in s.classes.values()) for s in spec), "extra requirements"
    assert any(any(c.tolerations for c in s.classes.values()) for s in spec), "class tolerations"
    assert any(any(len(r.allowed_classes) > 1 for r in s.namespaces) for s in spec), "the pod label picks a class"
    assert len(FIXTURE_PODS) >= 100


@pytest.mark.parametrize("name", [name for name, _ in FIXTURE_POLICIES])
def test_every_policy_fixtures_map_places_like_the_engine(fixture_world: FixtureWorld, name: str) -> None:
    """The MAP rendered from each policy fixture, alone on a real apiserver, gives every engine fixture
    pod, in every namespace made for the fixture (each class, the default, each namespace rule, audit
    mode), the affinity, tolerations, class annotation and record that the engine gives it with that
    policy (the claim route off, as the MAP matches); and the engine on the MAP's output adds no
    placement of its own. Created without warnings."""
    kube = fixture_world.kube
    assert fixture_world.warnings[name] == []
    text = dict(FIXTURE_POLICIES)[name]
    policy = claims_off(text)
    namespaces = fixture_world.namespaces[name]
    first = next(iter(namespaces))
    differences = []
    placed_somewhere = 0
    for body in FIXTURE_PODS:
        try:
            before = before_admission(kube, as_pod(body, first))
        except ApiError:
            continue  # not a valid pod: nothing to place
        for namespace, labels in namespaces.items():
            received = copy.deepcopy(before)
            received["metadata"]["namespace"] = namespace
            expected = engine_result(received, labels, policy)
            got = kube.create(as_pod(body, namespace), dry_run=True)
            if placed(got) != placed(expected):
                differences.append((namespace, body, jsonpatch.make_patch(placed(expected), placed(got)).patch))
                continue
            placed_somewhere += placed(got)["class"] is not None
            again = engine_result(got, labels, policy)
            if placed(again) != placed(got):
                differences.append((namespace, body, "the engine places the MAP's output again"))
    assert differences == [], differences[:3]
    assert placed_somewhere > len(FIXTURE_PODS) // 2
