"""Table-driven tests of ``decide`` (agnhost style): every case is a YAML document under
tests/fixtures/engine/. Each returned patch is applied with jsonpatch, the result is validated
strictly against the Kubernetes 1.37 schema, compared with the case's expectations, and fed back
to ``decide`` to prove the second run yields no operation (reinvocation idempotence)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from webhook.core.decision import ClaimFacts, Decision, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.engine import PLACED_LABEL, decide
from webhook.core.policy import Policy, default_policy, load_policy

FIXTURES = Path(__file__).parents[1] / "fixtures"
K8S_VERSION = "1.37.0"


def load_cases(folder: str = "engine") -> list[Any]:
    """The table's cases: every YAML document under ``tests/fixtures/<folder>``, named file:case."""
    cases = []
    for path in sorted((FIXTURES / folder).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                cases.append(pytest.param(doc, id=f"{path.stem}:{doc['name']}"))
    return cases


def policy_for(case: dict[str, Any]) -> Policy:
    name = case.get("policy", "default")
    return default_policy() if name == "default" else load_policy(FIXTURES / "policies" / f"{name}.yaml")


def as_pod(body: dict[str, Any] | None) -> dict[str, Any] | None:
    if body is None:
        return None
    pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(body)}
    if isinstance(pod.get("metadata"), dict):
        pod["metadata"].setdefault("name", "pod")
    return pod


def facts(case: dict[str, Any]) -> dict[str, Any]:
    """Everything ``decide`` gets from a case but the pods: operation, namespace, nodes, policy."""
    ns = case["namespace"]
    reserved = case.get("reservedNodes")
    known = case.get("claims", {})
    return {
        "operation": case.get("operation", "CREATE"),
        "namespace": NamespaceFacts(ns["name"], ns.get("labels")),
        "nodes": NodeFacts(None if reserved is None else frozenset(reserved)),
        "policy": policy_for(case),
        # DRA objects of the namespace: name -> the device classes they request.
        "claims": ClaimFacts(
            claims={name: frozenset(classes) for name, classes in known.get("claims", {}).items()},
            templates={name: frozenset(classes) for name, classes in known.get("templates", {}).items()},
        ),
        # What the cluster's DeviceClasses add: GPU classes by driver, their extendedResourceNames.
        "devices": DeviceFacts(
            frozenset(case.get("devices", {}).get("gpuClasses", [])),
            frozenset(case.get("devices", {}).get("extendedResources", [])),
            # The reserved DeviceClass says that a device-level reservation is active, and (tainted) that
            # DeviceTaintRules hold it.
            devices_reserved=case.get("devices", {}).get("reserved", False),
            devices_tainted=case.get("devices", {}).get("tainted", False),
            # The CEL selectors of the GPU classes (what a class of the extended resource name inherited).
            class_selectors={
                name: tuple(found) for name, found in case.get("devices", {}).get("classSelectors", {}).items()
            },
        ),
        "sub_resource": case.get("subResource", ""),
    }


def run(case: dict[str, Any], pod: Any, old: Any = None) -> Decision:
    return decide(pod=pod, old_pod=old, **facts(case))


def resolve(document: Any, pointer: str) -> Any:
    return jsonpatch.JsonPointer(pointer).resolve(document)


@pytest.mark.parametrize("case", load_cases())
def test_decide(case: dict[str, Any]) -> None:
    pod = as_pod(case["pod"]) if case.get("raw") is not True else case["pod"]
    original = copy.deepcopy(pod)
    decision = run(case, pod, as_pod(case.get("oldPod")))
    expect = case["expect"]

    assert pod == original, "decide must not modify its input"
    assert decision.outcome == expect["outcome"], decision
    for key, attribute in (("rule", "rule"), ("class", "workload_class"), ("code", "code"), ("mode", "mode")):
        if key in expect:
            assert getattr(decision, attribute) == expect[key], decision
    for text in expect.get("messageContains", []):
        assert text in decision.message, decision.message
    for text in expect.get("warningsContain", []):
        assert any(text in warning for warning in decision.warnings), decision.warnings
    if expect.get("noWarnings"):
        assert decision.warnings == ()
    for key, value in expect.get("auditAnnotations", {}).items():
        assert decision.audit_annotations.get(key) == value, decision.audit_annotations
    if "violations" in expect:
        assert sorted(v.rule for v in decision.violations) == sorted(expect["violations"])
    if "operations" in expect:
        assert len(decision.patch) == expect["operations"], decision.patch
    if expect.get("opsUse"):
        assert sorted({op["op"] for op in decision.patch}) == sorted(expect["opsUse"])

    if decision.outcome != "patched":
        assert decision.patch == ()
        assert not expect.get("result"), "a case without a patch cannot expect a result"
        return

    patched = jsonpatch.apply_patch(pod, list(decision.patch))
    kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
    for pointer, value in expect.get("result", {}).items():
        assert resolve(patched, pointer) == value, pointer
    for pointer in expect.get("absent", []):
        with pytest.raises(jsonpatch.JsonPointerException):
            resolve(patched, pointer)

    again = run(case, patched)
    assert again.allowed
    assert again.patch == (), f"second run must be a no-op, got {again.patch}"


def test_every_deny_rule_has_a_case() -> None:
    from webhook.core.engine import DENY_RULES

    covered = {case.values[0]["expect"].get("rule") for case in load_cases()}
    assert set(DENY_RULES) <= covered, set(DENY_RULES) - covered


def test_the_placed_label_is_never_a_spread_peer_selector() -> None:
    """The placement policy runs before the webhook and writes the placed label (the class, not the
    workload): the spread the webhook adds selects its peers without it, or every inference pod of the
    namespace would count as a peer. (Not an engine fixture: the placement policy skips a pod created
    with the label, so the MAP-vs-engine suites leave such pods out by construction.)"""
    pod = {
        "metadata": {"generateName": "embed-", "labels": {"app": "embed", PLACED_LABEL: "inference"}},
        "spec": {"containers": [{"name": "server", "image": "vllm", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
    }
    decision = decide(
        operation="CREATE",
        pod=pod,
        namespace=NamespaceFacts("serving", {"rocm-isolation.io/class": "inference"}),
        nodes=NodeFacts(frozenset()),
        policy=default_policy(),
    )
    patched = jsonpatch.apply_patch(pod, list(decision.patch))
    [spread] = patched["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": {"app": "embed"}}
    assert patched["metadata"]["labels"][PLACED_LABEL] == "inference"
