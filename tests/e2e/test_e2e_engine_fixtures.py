"""Scenario 1: every engine fixture pod (tests/fixtures/engine/*.yaml, CREATE, default policy) created
with server-side dry-run through the real webhook. The apiserver's result must equal the engine's
patched pod under the same facts, and creating that result again adds nothing (what a reinvocation
would do). UPDATE denials on real pods.

How "the engine's patched pod" is made comparable with the apiserver's: the webhook sees the pod
after the apiserver decoded and defaulted it, after the built-in mutating plugins
(ServiceAccount, DefaultTolerationSeconds...) and after the MutatingAdmissionPolicy, when the
manifests ship one. That input is obtained by dry-run creating every fixture pod while the webhook's
configuration is deleted. The engine's patch is applied to it and the result dry-run created with
the opt-out label ``rocm-isolation.io/ignore=true`` (the webhook's objectSelector and the placement
policy's skip it; the label is removed again; ``spec.nodeName`` is taken out for that call, since the
backstop refuses an opted-out pod with a node name, and put back), so that the apiserver defaults
what the patch added (e.g. a hostPath volume's ``type: ""``) exactly as it does after a webhook's
patch.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from webhook.core.engine import CLAIM_UNRESOLVED, decide
from webhook.core.policy import Policy, default_policy, default_policy_text, parse_policy

from .harness import OPT_OUT, Cluster, gpu_pod, live_facts, normalised, serves_dra, unmerged
from .kube import ApiError, Obj, wait_until

# Every minor: admission decisions the same as the engine's for every pod the minor can express (issue 47).
pytestmark = pytest.mark.minors("1.33", "1.34", "1.35")
NO_DRA = pytest.mark.skip(reason="1.33 serves no resource.k8s.io: no claim, and no pod can use one")

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engine"
MUTATIONS_ANNOTATION = "rocm-isolation.io/mutations"
WEBHOOK_DENIAL = 'admission webhook "pods.rocm-isolation.io" denied the request: '


# Policies the webhook is switched to (its file rewritten, reloaded) for their cases. Not
# engine-all-pods: its scope differs from the shipped manifests' (the webhook configuration rendered
# from the default policy sends GPU pods only), so its non-GPU cases never reach the webhook.
POLICIES = ("default", "engine-aliases", "engine-features")
POLICY_DIR = FIXTURES.parent / "policies"


def policy_text(name: str) -> str:
    return default_policy_text() if name == "default" else (POLICY_DIR / f"{name}.yaml").read_text(encoding="utf-8")


def create_cases() -> list[Any]:
    """CREATE cases of POLICIES whose pod the apiserver can decode (not the ``raw`` malformed ones)
    and that do not opt out themselves (the webhook never sees those), grouped by policy."""
    cases = []
    for path in sorted(FIXTURES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("raw") or doc.get("operation", "CREATE") != "CREATE":
                continue
            if doc.get("policy", "default") not in POLICIES:
                continue
            labels = (doc["pod"].get("metadata") or {}).get("labels") or {}
            if labels.get(OPT_OUT) == "true":
                continue
            uses_dra = bool(doc.get("claims") or (doc["pod"].get("spec") or {}).get("resourceClaims"))
            marks = [] if serves_dra() or not uses_dra else [NO_DRA]
            cases.append(pytest.param(doc, id=f"{path.stem}:{doc['name']}", marks=marks))
    return sorted(cases, key=lambda param: POLICIES.index(param.values[0].get("policy", "default")))


CASES = create_cases()


@dataclass
class World:
    """Where each case runs: a namespace with the case's labels (one per label set; one of its own
    for a case with DRA objects), and those objects created for real."""

    namespaces: dict[str, str] = field(default_factory=dict)  # case name -> namespace
    # case name -> the pod as the webhook receives it (decoded, defaulted, after the built-in
    # mutating plugins and the MutatingAdmissionPolicy), or the apiserver's refusal without the webhook
    inputs: dict[str, Obj | ApiError] = field(default_factory=dict)

    policy: str = "default"

    def namespace_for(self, case: Obj) -> str:
        return self.namespaces[case["name"]]

    def use_policy(self, cluster: Cluster, case: Obj) -> Policy:
        """The webhook serves the case's policy: its file rewritten, the reload awaited."""
        name = case.get("policy", "default")
        if name != self.policy:
            reloads = cluster.webhook.metric("rocm_isolation_policy_reloads_total")
            cluster.webhook.policy_file.write_text(policy_text(name), encoding="utf-8")
            wait_until(
                lambda: cluster.webhook.metric("rocm_isolation_policy_reloads_total") > reloads,
                timeout=60,
                what=f"the webhook to load policy {name}",
            )
            self.policy = name
        return parse_policy(policy_text(name))


def _labels_key(case: Obj) -> str:
    return json.dumps(case["namespace"].get("labels") or {}, sort_keys=True)


def _claim_objects(case: Obj, namespace: str) -> list[Obj]:
    objects = []
    known = case.get("claims") or {}
    for kind, key in (("ResourceClaimTemplate", "templates"), ("ResourceClaim", "claims")):
        for name, classes in (known.get(key) or {}).items():
            requests = [{"name": f"r{i}", "exactly": {"deviceClassName": cls}} for i, cls in enumerate(sorted(classes))]
            spec: Obj = {"devices": {"requests": requests}}
            objects.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": kind,
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec,
                }
            )
    return objects


@pytest.fixture(scope="module")
def world(cluster: Cluster) -> Iterator[World]:
    result = World()
    by_labels: dict[str, str] = {}
    made: list[str] = []
    for index, param in enumerate(CASES):
        case = param.values[0]
        if case["namespace"]["name"] in default_policy().spec.excluded_namespaces:
            result.namespaces[case["name"]] = case["namespace"]["name"]
            continue
        labels = case["namespace"].get("labels") or {}
        if param.marks:
            continue  # skipped on this minor
        if case.get("claims"):
            name = cluster.namespace(f"fx-dra-{index}", labels)
            made.append(name)
            for obj in _claim_objects(case, name):
                cluster.kube.create(obj)
        else:
            key = _labels_key(case)
            if key not in by_labels:
                by_labels[key] = cluster.namespace(f"fx-{len(by_labels)}", labels)
                made.append(by_labels[key])
            name = by_labels[key]
        result.namespaces[case["name"]] = name
    _barrier(cluster)
    with cluster.without_webhook_configuration():
        for param in CASES:
            case = param.values[0]
            if param.marks:
                continue
            try:
                received = normalised(
                    cluster.kube.create(as_pod(case["pod"], result.namespace_for(case)), dry_run=True)
                )
                result.inputs[case["name"]] = unmerged(received)
            except ApiError as err:
                result.inputs[case["name"]] = err
    yield result
    if result.policy != "default":
        result.use_policy(cluster, {"policy": "default"})
    for name in made:
        cluster.cleanup(name)
    cluster.cleanup("fx-barrier")


def _barrier(cluster: Cluster) -> None:
    """Wait until the webhook's watch cache has caught up with everything created above: a namespace
    created last is seen with its labels, and a claim and a template created last are resolved
    (their class is no GPU class, so a pod using only them is left alone)."""
    ns = cluster.namespace("fx-barrier", {"rocm-isolation.io/class": "inference"})
    kube = cluster.kube
    wait_until(partial(_labelled, kube, ns), timeout=60, what="the webhook to see the fixtures' namespaces")
    if not serves_dra():
        return  # no claim on this minor
    for obj in _claim_objects({"claims": {"templates": {"cpu": ["nic.example.com"]}}}, ns):
        cluster.kube.create(obj)
    for obj in _claim_objects({"claims": {"claims": {"cpu": ["nic.example.com"]}}}, ns):
        cluster.kube.create(obj)

    def resolved() -> bool:
        # Until the webhook's cache has them, the engine warns that the claim could not be resolved.
        for claim in ({"resourceClaimTemplateName": "cpu"}, {"resourceClaimName": "cpu"}):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "barrier", "namespace": ns},
                "spec": {"resourceClaims": [{"name": "c", **claim}], "containers": [{"name": "c", "image": "busybox"}]},
            }
            kube.create(pod, dry_run=True)
            if any(CLAIM_UNRESOLVED in warning for warning in kube.last_warnings):
                return False
        return True

    wait_until(resolved, timeout=60, what="the webhook to see the fixtures' ResourceClaims and templates")


def _labelled(kube: Any, ns: str) -> bool:
    pod = kube.create(gpu_pod("barrier", ns), dry_run=True)
    return (pod["metadata"].get("annotations") or {}).get("rocm-isolation.io/class") == "inference"


def as_pod(body: Obj, namespace: str) -> Obj:
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(body)}
    meta = pod.setdefault("metadata", {})
    meta.setdefault("name", "pod")
    meta["namespace"] = namespace
    return pod


def without_webhook(kube: Any, pod: Obj) -> Obj:
    """What the apiserver makes of ``pod`` before any webhook (see the module docstring)."""
    body = copy.deepcopy(pod)
    if not isinstance(body["metadata"].get("labels"), dict):
        body["metadata"]["labels"] = {}
    body["metadata"]["labels"][OPT_OUT] = "true"
    node_name = body["spec"].pop("nodeName", None)
    result = normalised(kube.create(body, dry_run=True), drop_opt_out=True)
    if node_name is not None:
        result["spec"]["nodeName"] = node_name
    return result


@pytest.mark.parametrize("case", CASES)
def test_fixture_pod_through_the_real_webhook_equals_the_engine(cluster: Cluster, world: World, case: Obj) -> None:
    kube = cluster.kube
    ns = world.namespace_for(case)
    pod = as_pod(case["pod"], ns)
    received = world.inputs[case["name"]]

    if isinstance(received, ApiError):
        # Refused without the webhook (invalid, Pod Security, the backstop): the webhook must not
        # let it in (it may refuse it first: webhooks run before validation).
        with pytest.raises(ApiError):
            kube.create(pod, dry_run=True)
        assert WEBHOOK_DENIAL not in received.message
        return

    facts = live_facts(cluster, ns, world.use_policy(cluster, case))
    decision = decide(operation="CREATE", pod=copy.deepcopy(received), **facts)

    if not decision.allowed:
        with pytest.raises(ApiError) as denied:
            kube.create(pod, dry_run=True)
        assert denied.value.status == decision.code, denied.value
        assert denied.value.message == WEBHOOK_DENIAL + decision.message
        return

    try:
        through_webhook = normalised(kube.create(pod, dry_run=True))
    except ApiError as err:
        pytest.fail(f"the engine admits the pod ({decision.outcome}) but the apiserver refused it: {err}")
    warnings = list(kube.last_warnings)
    patched = jsonpatch.apply_patch(received, list(decision.patch)) if decision.patch else received
    expected = without_webhook(kube, patched)
    assert through_webhook == expected, jsonpatch.make_patch(expected, through_webhook).patch
    for warning in decision.warnings:
        assert warning in warnings, (warning, warnings)

    # Reinvocation: the webhook's own output, as a reinvocation sees it (before the registry merges
    # matchLabelKeys into the labelSelector), created again, comes back unchanged.
    own_output = unmerged(through_webhook)
    again = normalised(kube.create(copy.deepcopy(own_output), dry_run=True))
    assert again == through_webhook, jsonpatch.make_patch(through_webhook, again).patch
    assert decide(operation="CREATE", pod=own_output, **facts).patch == ()


@pytest.mark.parametrize("case", CASES)
def test_placement_policy_and_webhook_together_equal_the_webhook_alone(
    cluster: Cluster, world: World, case: Obj
) -> None:
    """The MutatingAdmissionPolicy (when the manifests ship one) places pods in the apiserver before
    the webhook is called; what comes out of both must be what the webhook alone makes of the pod,
    i.e. the engine's patch on the pod before any placement, the record of what was done
    (rocm-isolation.io/mutations: the policy's entries, the webhook's merged in) included."""
    kube = cluster.kube
    ns = world.namespace_for(case)
    pod = as_pod(case["pod"], ns)
    try:
        before = without_webhook(kube, pod)
    except ApiError:
        return  # refused without any mutation (invalid, Pod Security, backstop): covered above
    decision = decide(
        operation="CREATE", pod=copy.deepcopy(before), **live_facts(cluster, ns, world.use_policy(cluster, case))
    )
    try:
        through = normalised(kube.create(pod, dry_run=True))
    except ApiError as err:
        assert not decision.allowed, f"the engine admits the pod alone ({decision.outcome}), not with the policy: {err}"
        assert err.message == WEBHOOK_DENIAL + decision.message or "ValidatingAdmissionPolicy" in err.message
        return
    assert decision.allowed, f"the engine denies the pod ({decision.message}), the apiserver admitted it"
    alone = without_webhook(kube, jsonpatch.apply_patch(before, list(decision.patch))) if decision.patch else before
    assert through == alone, jsonpatch.make_patch(alone, through).patch


def _has_placement_policy(cluster: Cluster) -> bool:
    return any(d["kind"] == "MutatingAdmissionPolicy" for d in cluster.manifests)


def test_the_mutations_annotation_records_what_was_done_with_the_placement_policy(
    cluster: Cluster, namespace: Any
) -> None:
    if not _has_placement_policy(cluster):
        pytest.skip("the manifests ship no MutatingAdmissionPolicy")
    ns = namespace(labels={"rocm-isolation.io/class": "inference"})
    pod = cluster.kube.create(gpu_pod("llm", ns), dry_run=True)
    assert pod["spec"]["affinity"]["nodeAffinity"]  # placed (by the policy, the webhook or both)
    recorded = pod["metadata"]["annotations"][MUTATIONS_ANNOTATION].split(",")
    # The policy's entries first (it runs before the webhook), the webhook's merged in after them, once
    # each (what else the webhook adds depends on the policy the cases above left it with).
    assert recorded[:2] == ["node-affinity", "tolerations"], recorded
    assert {"topology-spread", "env"} <= set(recorded[2:]) and len(set(recorded)) == len(recorded), recorded
    # Its own output through both again (what a reinvocation sees): nothing recorded twice.
    again = cluster.kube.create(unmerged(pod), dry_run=True)
    assert again["metadata"]["annotations"][MUTATIONS_ANNOTATION] == ",".join(recorded)


def test_the_fixture_run_is_not_vacuous() -> None:
    """Most cases are mutated, several are denied: a run where the webhook did nothing would fail
    the parametrized test above, which compares with the engine."""
    outcomes = [param.values[0]["expect"]["outcome"] for param in CASES]
    assert outcomes.count("patched") >= 20 and outcomes.count("denied") >= 5, outcomes


# --- UPDATE ---------------------------------------------------------------------------------------


def _gated_training_pod(cluster: Cluster, ns: str, name: str) -> Obj:
    pod = cluster.kube.create(gpu_pod(name, ns, schedulingGates=[{"name": "example.com/queue"}]))
    assert pod["metadata"]["annotations"]["rocm-isolation.io/class"] == "training"
    return pod


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda spec: spec.setdefault("tolerations", []).append(
                {"key": "rocm-isolation.io/reserved", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
            ),
            id="reserved-toleration-added",
        ),
        pytest.param(
            lambda spec: spec.setdefault("tolerations", []).append({"operator": "Exists"}),
            id="tolerate-everything-added",
        ),
        pytest.param(
            lambda spec: spec.setdefault("nodeSelector", {}).update({"rocm-isolation.io/pool": "inference"}),
            id="reserved-node-selector-added",
        ),
    ],
)
def test_update_toward_the_reserved_nodes_is_denied_by_the_webhook(
    cluster: Cluster, namespace: Any, change: Any
) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    pod = _gated_training_pod(cluster, ns, "gated")
    updated = copy.deepcopy(pod)
    change(updated["spec"])
    with pytest.raises(ApiError) as denied:
        cluster.kube.replace(updated)
    assert denied.value.message.startswith(WEBHOOK_DENIAL), denied.value
    assert "reserved" in denied.value.message
    # Nothing changed.
    live = cluster.kube.get("Pod", "gated", ns)
    assert live["spec"].get("tolerations") == pod["spec"].get("tolerations")
    assert live["spec"].get("nodeSelector") == pod["spec"].get("nodeSelector")


def test_update_that_does_not_touch_placement_is_allowed_and_not_patched(cluster: Cluster, namespace: Any) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    pod = _gated_training_pod(cluster, ns, "gated")
    updated = copy.deepcopy(pod)
    updated["metadata"]["labels"]["step"] = "2"
    updated["spec"]["tolerations"].append({"key": "example.com/spot", "operator": "Exists", "effect": "NoSchedule"})
    live = cluster.kube.replace(updated)
    assert live["metadata"]["labels"]["step"] == "2"
    # UPDATE is checked, never mutated: the spec is the one sent.
    assert live["spec"]["affinity"] == pod["spec"]["affinity"]
    assert live["spec"]["tolerations"] == updated["spec"]["tolerations"]
