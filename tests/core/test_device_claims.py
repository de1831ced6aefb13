"""Table-driven tests of ``decide_claim`` (tests/fixtures/claims/*.yaml): each patch is applied with
jsonpatch, the result validated strictly against the Kubernetes 1.37 schema, compared with the case's
expectations, and decided again to prove the second run changes nothing (reinvocation idempotence)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

# The engine's table: the same fixture layout, policies and schema version.
from test_engine import K8S_VERSION, load_cases, policy_for

from webhook.core.decision import Decision, DeviceFacts, NamespaceFacts
from webhook.core.device_claims import decide_claim
from webhook.core.policy import default_policy


def as_object(case: dict[str, Any]) -> dict[str, Any]:
    obj = {"apiVersion": "resource.k8s.io/v1", **copy.deepcopy(case["object"])}
    obj["metadata"].setdefault("namespace", case["namespace"]["name"])
    return obj


def run(case: dict[str, Any], obj: dict[str, Any]) -> Decision:
    ns = case["namespace"]
    return decide_claim(
        operation=case.get("operation", "CREATE"),
        claim=obj,
        kind=obj["kind"],
        namespace=NamespaceFacts(ns["name"], ns.get("labels", {})),
        policy=policy_for(case),
        devices=DeviceFacts(
            frozenset(case.get("classSelectors", {})),
            devices_reserved=case.get("reserved", True),
            devices_tainted=case.get("tainted", False),
            class_selectors={name: tuple(found) for name, found in case.get("classSelectors", {}).items()},
        ),
        owner=case.get("owner"),
    )


@pytest.mark.parametrize("case", load_cases("claims"))
def test_decide_claim(case: dict[str, Any]) -> None:
    obj = as_object(case)
    original = copy.deepcopy(obj)
    decision = run(case, obj)
    expect = case["expect"]

    assert obj == original, "decide_claim must not modify its input"
    assert decision.outcome == expect["outcome"], decision
    for key, attribute in (("rule", "rule"), ("class", "workload_class"), ("code", "code")):
        if key in expect:
            assert getattr(decision, attribute) == expect[key], decision
    for text in expect.get("messageContains", []):
        assert text in decision.message, decision.message
    for text in expect.get("warningsContain", []):
        assert any(text in warning for warning in decision.warnings), decision.warnings
    if decision.outcome != "patched":
        assert decision.patch == ()
        return
    patched = jsonpatch.apply_patch(obj, list(decision.patch))
    if "spec" in obj and not isinstance(obj["spec"], str):
        kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
    for pointer, value in expect.get("result", {}).items():
        assert jsonpatch.JsonPointer(pointer).resolve(patched) == value, pointer
    again = run(case, patched)
    assert again.patch == (), f"second run is not idempotent: {list(again.patch)}"


def test_a_null_or_non_object_claim_is_a_400_never_an_exception() -> None:
    for body in (None, [], "claim", {"spec": []}, {"spec": {"spec": 3}}):
        decision = decide_claim(
            operation="CREATE",
            claim=body,
            kind="ResourceClaimTemplate",
            namespace=NamespaceFacts("research", {}),
            policy=default_policy(),
            devices=DeviceFacts(devices_reserved=True),
        )
        assert decision.code == 400 or decision.rule == "no-gpu-request", (body, decision)
