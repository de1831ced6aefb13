"""Issue 42: switching lending on or off denies no pod that either state admits. The policy reaches the
webhook (hot reload) and the apiserver's objects (the placement MAP, the backstop) in two writes, in either
order; between them the MAP places a pod with one setting and the webhook judges it with the other. The
MAP's placement is the engine's (proven on the real apiserver: tests/e2e/test_mutating_policy.py), so here
the engine with one policy stands for the MAP, the engine with the other for the webhook, and the rendered
backstop of the apiserver's state judges the result (cel-python; the real apiserver in
tests/e2e/test_e2e_lending_switch.py)."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cel_harness import reserved_nodes_verdict

from webhook.core import engine
from webhook.core.decision import NamespaceFacts, NodeFacts
from webhook.core.policy import Policy, parse_policy
from webhook.deploy import render

LENDING_ON = (Path(__file__).parents[1] / "fixtures" / "policies" / "engine-lending.yaml").read_text(encoding="utf-8")
LENDING_OFF = LENDING_ON.replace("enabled: true", "enabled: false")
TAINT_KEY = "rocm-isolation.io/reserved"
# A namespace that may borrow by label, and one the policy names (borrow-*).
NAMESPACES = [
    NamespaceFacts("research", {"rocm-isolation.io/class": "training", "rocm-isolation.io/lending": "allowed"}),
    NamespaceFacts("borrow-team", {"rocm-isolation.io/class": "training"}),
]
PODS = {
    "asks-to-borrow": {"rocm-isolation.io/borrow": "true"},
    "plain": {},
    "opts-out": {"rocm-isolation.io/borrow": "false"},
}


@cache
def policy(text: str) -> Policy:
    return parse_policy(text)


@cache
def manifests(text: str) -> list[dict[str, Any]]:
    return render.render(overlay="cert-manager", policy_text=text, policy_source="test")


def pod(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": namespace, "labels": {"app": "trainer", **labels}},
        "spec": {"containers": [{"name": "c", "image": "torch", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
    }


def placed(text: str, body: dict[str, Any], namespace: NamespaceFacts) -> tuple[engine.Decision, dict[str, Any]]:
    decision = engine.decide(
        operation="CREATE",
        pod=body,
        old_pod=None,
        namespace=namespace,
        nodes=NodeFacts(frozenset({"gpu-r1"})),
        policy=policy(text),
    )
    return decision, jsonpatch.apply_patch(copy.deepcopy(body), list(decision.patch))


def keeps_off_reserved(body: dict[str, Any]) -> bool:
    terms = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return bool(terms) and all(
        any(
            e["key"] == "rocm-isolation.io/pool" and e["operator"] in ("NotIn", "DoesNotExist")
            for e in t["matchExpressions"]
        )
        for t in terms
    )


def tolerates_reserved(body: dict[str, Any]) -> bool:
    return any(t.get("key") == TAINT_KEY for t in body["spec"].get("tolerations") or [])


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda ns: ns.name)
@pytest.mark.parametrize("labels", PODS.values(), ids=list(PODS))
@pytest.mark.parametrize(
    ("apiserver", "webhook"), [(LENDING_ON, LENDING_OFF), (LENDING_OFF, LENDING_ON)], ids=["off-first", "on-first"]
)
def test_between_the_two_writes_no_pod_is_denied_and_none_borrows_unless_both_lend(
    apiserver: str, webhook: str, namespace: NamespaceFacts, labels: dict[str, str]
) -> None:
    """Either order of the writes, every kind of training pod of a namespace that may borrow: the apiserver's
    placement (the engine with its policy), then the webhook (the engine with the other): admitted, and by the
    apiserver's backstop too; and it borrows reserved capacity only if both states make it a borrower, which
    never happens in a switch (so: on shared capacity, the reserved nodes excluded in every term)."""
    before, by_map = placed(apiserver, pod(namespace.name, labels), namespace)
    assert before.allowed, before.message
    decision, result = placed(webhook, by_map, namespace)
    assert decision.allowed, decision.message
    case = {"namespace": {"name": namespace.name, "labels": namespace.labels}}
    _, failed, messages = reserved_nodes_verdict(manifests(apiserver), case, result, "CREATE")
    assert failed == set(), messages
    assert keeps_off_reserved(result), result["spec"]
    if webhook == LENDING_ON:
        # The webhook did not make it a borrower: no reserved toleration the old backstop would deny.
        assert not tolerates_reserved(result) and result["spec"].get("priorityClassName") is None
        if labels.get("rocm-isolation.io/borrow") == "true":
            assert any("shared capacity only" in w for w in decision.warnings), decision.warnings


def test_after_the_switch_both_ways_the_pods_are_what_each_state_makes_them() -> None:
    """Once both writes are done nothing changes: a borrower with lending on (the webhook re-judging the
    MAP's borrower adds nothing), a training pod with it off."""
    namespace = NAMESPACES[0]
    _, on = placed(LENDING_ON, pod(namespace.name, PODS["asks-to-borrow"]), namespace)
    again, _ = placed(LENDING_ON, on, namespace)
    assert again.allowed and not again.patch and tolerates_reserved(on)
    _, off = placed(LENDING_OFF, pod(namespace.name, PODS["asks-to-borrow"]), namespace)
    again, _ = placed(LENDING_OFF, off, namespace)
    assert again.allowed and not again.patch and not tolerates_reserved(off)


def test_with_lending_off_a_pod_tolerating_the_reserved_taint_on_its_own_is_still_denied() -> None:
    """The exemption is for what the lending-on placement writes (the borrowers' PriorityClass, in a namespace
    that may borrow): a training pod tolerating the reserved taint without it is denied as before; and one
    with it in a namespace that may not borrow too."""
    body = pod("research", {})
    body["spec"]["tolerations"] = [{"key": TAINT_KEY, "operator": "Exists"}]
    decision, _ = placed(LENDING_OFF, body, NAMESPACES[0])
    assert not decision.allowed and decision.rule == engine.DENY_TOLERATION
    body["spec"]["priorityClassName"] = "rocm-isolation-borrower"
    elsewhere = NamespaceFacts("ml", {"rocm-isolation.io/class": "training"})
    decision, _ = placed(LENDING_OFF, {**body, "metadata": {**body["metadata"], "namespace": "ml"}}, elsewhere)
    assert not decision.allowed and decision.rule == engine.DENY_TOLERATION


def test_without_a_lending_section_nothing_is_exempted() -> None:
    """Lending never on (no ``spec.lending``: the default policy): no switch to bridge, every decision as before
    lending existed. A pod at the borrowers' PriorityClass tolerating the reserved taint in a namespace labelled
    to borrow is denied, and the rendered backstop has no lending policy."""
    document = yaml.safe_load(LENDING_ON)
    del document["spec"]["lending"]
    never = yaml.safe_dump(document)
    assert "lending" not in policy(never).spec.model_fields_set
    body = pod("research", {})
    body["spec"]["tolerations"] = [{"key": TAINT_KEY, "operator": "Exists"}]
    body["spec"]["priorityClassName"] = "rocm-isolation-borrower"
    decision, _ = placed(never, body, NAMESPACES[0])
    assert not decision.allowed and decision.rule == engine.DENY_TOLERATION
    rendered = manifests(never)
    assert not [d for d in rendered if "lending" in d["metadata"]["name"] or "borrower" in d["metadata"]["name"]]
