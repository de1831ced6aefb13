"""The CEL that the apiserver runs agrees with the engine.

The rendered manifests' CEL (the webhook's ``matchConditions`` and both ValidatingAdmissionPolicies)
is evaluated with cel-python, with the apiserver's variables (``object``, ``oldObject``,
``request``, ``namespaceObject``, ``params``, ``variables``), against the engine's own table-driven
fixtures (tests/fixtures/engine) plus edge cases of our own (tests/fixtures/cel).

Scope of the agreement, stated precisely:
- match conditions: for every well-formed pod, the webhook is called exactly when ``decide`` acts on
  the pod (its rule is not ``not-gpu-pod``: mirror pods are sent too, checked and never mutated),
  the engine being given no claim facts (CEL cannot read a ResourceClaim: a pod with any DRA claim is
  a GPU pod to both; with the claim resolved the engine may act on fewer, see
  ``test_a_pod_with_any_claim_is_covered_by_cel_which_cannot_read_the_claim``);
- the reserved-nodes policy: for every well-formed CREATE or UPDATE in a namespace the policy is
  bound to, the set of failed validations equals the set of engine violations among
  ``deny-node-selector``, ``deny-node-affinity`` and ``deny-toleration``, both on the pod as sent
  (the webhook never saw it: failurePolicy Ignore) and on the pod after the engine's patch (what the
  apiserver validates when the webhook answered), and the binding's actions follow the engine's mode.
  The engine runs without node facts here, as the policy has none: ``deny-node-name`` and
  ``matchFields`` on node names need node names, and are the documented gap (see
  ``test_node_names_are_the_documented_gap``).
- Mirror pods are checked by both and mutated by neither (the annotation can be set by anyone
  creating a pod, so it must not be a way around either).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest
import yaml
from cel_harness import (
    FIXTURES,
    OPTED_OUT_NODE_NAME,
    PORTABLE_FUNCTIONS,
    REACH_RULES,
    as_pod,
    cel,
    decide,
    engine_reach,
    evaluate,
    find,
    fixture_cases,
    match_conditions_pass,
    pod_activation,
    policy_for,
    rendered,
    request,
    reserved_names_params,
    reserved_nodes_verdict,
    run_policy,
    selector_matches,
    well_formed,
)
from celpy import celtypes

from webhook.core import engine
from webhook.core.decision import ClaimFacts, NamespaceFacts, NodeFacts
from webhook.core.policy import Policy, default_policy, parse_policy
from webhook.deploy import cel as cel_module
from webhook.deploy import render, reserved_nodes

POD_CASES = [case for case in fixture_cases("engine") + fixture_cases("cel/pods") if well_formed(case)]


# --- tests ----------------------------------------------------------------------------------------


def test_the_agreement_covers_the_engines_fixtures() -> None:
    ids = [case["_id"] for case in POD_CASES]
    assert sum(i.startswith("engine/") for i in ids) >= 40
    rules = set().union(*(engine_reach(decide(case, nodes_known=False)) for case in POD_CASES))
    assert rules == set(REACH_RULES), "every reachability rule must be exercised"


@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["_id"])
def test_match_conditions_select_exactly_the_pods_the_engine_acts_on(case: dict[str, Any]) -> None:
    resources = rendered(case.get("policy", "default"))
    pod = as_pod(case["pod"], "anywhere")
    # A namespace no rule excludes, so only the pod decides whether the engine acts.
    probe = {**case, "namespace": {"name": "anywhere", "labels": {}}, "oldPod": case.get("oldPod") or case["pod"]}
    foreign = _extended_resources_outside_the_catalogue(pod, policy_for(case))
    for operation in ("CREATE", "UPDATE"):
        decision = decide(probe, nodes_known=False, pod=pod, operation=operation, devices_known=True)
        acts = decision.rule != engine.RULE_NOT_GPU
        sent = match_conditions_pass(resources, pod, operation)
        if foreign and policy_for(case).spec.scope.routes.dra_extended_resources:
            # Maybe a DeviceClass's extended resource: only the webhook can tell, so it is asked.
            assert sent, foreign
        else:
            assert sent == acts
    if "gpu" in case.get("cel", {}):
        # The catalogue as the backstop renders it (policy names only): the fixture's stated expectation.
        spec = find(resources, "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)["spec"]
        gpu = cel_module.gpu_pod(policy_for(case))
        assert all(gpu in c["expression"] for c in spec["matchConditions"])
        activation = {"object": cel(pod), "oldObject": cel(None), "request": cel({"operation": "CREATE"})}
        assert bool(evaluate(gpu, activation)) == case["cel"]["gpu"]


def _extended_resources_outside_the_catalogue(pod: Mapping[str, Any], policy: Policy) -> list[str]:
    names = []
    for list_name in ("containers", "initContainers"):
        for body in pod["spec"].get(list_name) or []:
            resources = body.get("resources") or {}
            for kind in ("requests", "limits"):
                names += [n for n in resources.get(kind) or {} if "/" in n and not policy.gpu(n)]
    return names


@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["_id"])
def test_reserved_nodes_policy_denies_what_the_engine_denies(case: dict[str, Any]) -> None:
    resources = rendered(case.get("policy", "default"))
    operation = case.get("operation", "CREATE")
    decision = decide(case, nodes_known=False)
    expected = engine_reach(decision)
    pod = as_pod(case["pod"], case["namespace"]["name"])
    assert pod is not None
    if decision.rule in (engine.RULE_EXCLUDED, engine.RULE_NOT_GPU):
        expected = set()

    # The webhook was unavailable (failurePolicy: Ignore): the policy sees the pod as it was sent.
    actions, failed, messages = reserved_nodes_verdict(resources, case, pod, operation)
    if decision.rule == engine.RULE_EXCLUDED:
        assert actions == [], "excluded namespaces are not bound"
    else:
        assert failed == expected, messages
    if expected:
        assert actions == render.MODE_ACTIONS[decision.mode]
        assert ("Deny" in actions) == (not decision.allowed)
        for message in messages:
            assert "rocm-isolation.io/class=inference" in message

    # The webhook answered: the apiserver validates the patched pod.
    if decision.patch:
        patched = jsonpatch.apply_patch(pod, list(decision.patch))
        assert reserved_nodes_verdict(resources, case, patched, operation)[1] == expected

    if "reach" in case.get("cel", {}):
        assert sorted(expected) == sorted(case["cel"]["reach"]), "the fixture's stated expectation"


def _backstop_evaluated(case: dict[str, Any], pod: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reserved-nodes policy's spec and the activation (variables evaluated) of ``pod`` under ``case``."""
    spec = find(rendered(case.get("policy", "default")), "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)[
        "spec"
    ]
    operation = case.get("operation", "CREATE")
    activation = pod_activation(case, pod, operation)
    variables: dict[Any, Any] = {}
    for variable in spec["variables"]:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    return spec, activation


@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["_id"])
def test_the_backstops_conditions_leave_out_only_pods_no_validation_denies(case: dict[str, Any]) -> None:
    """The ``may-be-denied`` condition excludes a GPU pod before the validations' activation only when no
    validation would deny it (here evaluated without the condition), on the pod as sent and as patched,
    or a terminating pod's update. (A pod that reaches no GPU is out of scope: the validations do not
    test it again.)"""
    pod = as_pod(case["pod"], case["namespace"]["name"])
    assert pod is not None
    decision = decide(case, nodes_known=False)
    sent = [pod] + ([jsonpatch.apply_patch(pod, list(decision.patch))] if decision.patch else [])
    # A terminating pod's update is left out on purpose (it is never scheduled again), denials or not.
    terminating = case.get("operation") == "UPDATE" and bool(pod["metadata"].get("deletionTimestamp"))
    for candidate in sent:
        spec, activation = _backstop_evaluated(case, candidate)
        conditions = {c["name"]: bool(evaluate(c["expression"], activation)) for c in spec["matchConditions"]}
        gpu = policy_for(case).spec.scope.all_pods or bool(evaluate(cel_module.gpu_pod(policy_for(case)), activation))
        for validation in spec["validations"]:
            holds = bool(evaluate(validation["expression"], activation))
            if not conditions["may-be-denied"] and gpu and not terminating:
                assert holds, validation["message"]


@pytest.mark.parametrize("policy_name", sorted({case.get("policy", "default") for case in POD_CASES}))
def test_the_backstops_messages_are_static_and_name_their_rule(policy_name: str) -> None:
    """The apiserver evaluates every messageExpression of a policy for every pod it validates, passing or
    not (an activation of its own): the reserved-nodes policy has none. Each validation's static message
    names the engine's rule it enforces, the reserved label (and taint), the classes it keeps off and
    what to do, in the engine's words (assessment.denied)."""
    policy = policy_for({"policy": policy_name})
    spec = find(rendered(policy_name), "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)["spec"]
    names = find(rendered(policy_name), "ValidatingAdmissionPolicy", reserved_nodes.NAMES_POLICY_NAME)["spec"]
    key, value = policy.spec.reserved_nodes.label
    unreserved = [name for name, cls in policy.spec.classes.items() if cls.placement == "unreserved"]
    taint = policy.spec.reserved_nodes.taint
    # By label, taint and opting out (the label policy), then by the reserved node names of the names
    # policy's parameter.
    rules = [*REACH_RULES, OPTED_OUT_NODE_NAME, engine.DENY_EPHEMERAL]
    if taint is None:
        rules.remove(engine.DENY_TOLERATION)
    validations = spec["validations"]
    if policy.spec.lending.enabled:
        # Lending on: one more, the no-borrowers taint is inference's (its own words: borrowers are denied too).
        *validations, no_borrowers = validations
        lent = policy.spec.lending.no_borrowers_taint
        assert no_borrowers["message"].startswith(f"rocm-isolation: [{engine.DENY_TOLERATION}] only inference pods ")
        assert f"({lent.key}={lent.value}:{lent.effect})" in no_borrowers["message"]
        assert "messageExpression" not in no_borrowers
    rules += [engine.DENY_NODE_NAME, engine.DENY_NODE_AFFINITY, engine.DENY_EPHEMERAL]
    validations += names["validations"]
    for rule, validation in zip(rules, validations, strict=True):
        assert "messageExpression" not in validation
        message = validation["message"]
        assert "\n" not in message
        assert message.startswith(f"rocm-isolation: [{rule}] {' or '.join(unreserved)} pods may not use "), message
        assert f"the reserved nodes ({key}={value}): " in message, message
        assert validation["reason"] == "Forbidden"
        if rule == engine.DENY_TOLERATION:
            assert taint is not None and f"{taint.key}={taint.value}:{taint.effect}" in message, message
        if any(cls.placement == "reserved" for cls in policy.spec.classes.values()):
            assert f"to use them, run the pod in a namespace labelled {policy.spec.labels.namespace_class}=" in message


# The engine's " (a GPU pod through <field>: <why>)" (assessment.direct_note), which the backstop repeats.
DIRECT_NOTE = re.compile(r" \(a GPU pod through [^:]+: [^)]*\)")


def _direct_notes(messages: list[str]) -> set[str]:
    return {match.group(0) for message in messages for match in DIRECT_NOTE.finditer(message)}


def _denies_a_reach(case: dict[str, Any]) -> bool:
    decision = decide(case, nodes_known=False)
    return decision.rule not in (engine.RULE_EXCLUDED, engine.RULE_NOT_GPU) and bool(engine_reach(decision))


REACH_CASES = [case for case in POD_CASES if _denies_a_reach(case)]


@pytest.mark.parametrize("case", REACH_CASES, ids=lambda case: case["_id"])
def test_the_backstop_denies_with_the_rule_the_engine_names(case: dict[str, Any]) -> None:
    """Every case both deny: the backstop's messages name the rules the engine denies for (its static
    message cannot name the field that makes the pod a GPU pod: the engine's denial does, as the fixture
    says)."""
    decision = decide(case, nodes_known=False)
    pod = as_pod(case["pod"], case["namespace"]["name"])
    _, failed, messages = reserved_nodes_verdict(
        rendered(case.get("policy", "default")), case, pod, case.get("operation", "CREATE")
    )
    assert {message.split("]")[0].removeprefix("rocm-isolation: [") for message in messages} == failed, messages
    assert not _direct_notes(messages), messages
    notes = _direct_notes([v.message for v in decision.violations if v.rule in REACH_RULES])
    if "through" in case.get("cel", {}):
        through = case["cel"]["through"]
        assert {note.split(": ")[0] for note in notes} == ({f" (a GPU pod through {through}"} if through else set())


def test_the_direct_route_cases_cover_every_kind_of_note() -> None:
    notes = set()
    for case in POD_CASES:
        decision = decide(case, nodes_known=False)
        notes |= _direct_notes([v.message for v in decision.violations if v.rule in REACH_RULES])
    fields = {note.split(":")[0].rsplit(".", 1)[-1].split("[")[0] for note in notes}
    assert {"privileged", "env", "runtimeClassName"} <= fields, notes
    assert any("initContainers" in note for note in notes) and any("spec.containers" in note for note in notes), notes


EPHEMERAL_CASES = [case for case in POD_CASES if case.get("subResource") == engine.EPHEMERAL_CONTAINERS]


def _tolerates_the_reserved_taint(pod: Mapping[str, Any]) -> bool:
    return any(
        t.get("operator") == "Exists" and t.get("key") in (None, "", "rocm-isolation.io/reserved")
        for t in (pod.get("spec") or {}).get("tolerations") or []
    )


@pytest.mark.parametrize("case", EPHEMERAL_CASES, ids=lambda case: case["_id"])
def test_the_backstop_denies_a_gpu_debug_container_only_where_the_engine_does(case: dict[str, Any]) -> None:
    """pods/ephemeralcontainers: the backstop knows no node names, so it denies less than the engine does
    with the nodes unknown (never more); on a pod that tolerates the reserved taint (the way onto a
    tainted reserved node through the scheduler) both deny alike."""
    resources = rendered(case.get("policy", "default"))
    ns = case["namespace"]["name"]
    pod = as_pod(case["pod"], ns) or {}
    decision = engine.decide(
        operation="UPDATE",
        pod=pod,
        old_pod=as_pod(case.get("oldPod"), ns),
        namespace=NamespaceFacts(ns, case["namespace"].get("labels")),
        nodes=NodeFacts(None),
        policy=policy_for(case),
        sub_resource=engine.EPHEMERAL_CONTAINERS,
    )
    engine_denies = engine.DENY_EPHEMERAL in {v.rule for v in decision.violations}
    _, failed, messages = reserved_nodes_verdict(resources, case, pod, "UPDATE", engine.EPHEMERAL_CONTAINERS)
    backstop_denies = engine.DENY_EPHEMERAL in failed
    assert engine_denies or not backstop_denies, messages
    if _tolerates_the_reserved_taint(pod):
        assert backstop_denies == engine_denies, messages
    if backstop_denies:
        assert any("kubectl debug --copy-to" in message for message in messages)


def test_the_ephemeral_cases_cover_both_answers_of_the_backstop() -> None:
    answers = set()
    for case in EPHEMERAL_CASES:
        pod = as_pod(case["pod"], case["namespace"]["name"]) or {}
        failed = reserved_nodes_verdict(
            rendered(case.get("policy", "default")), case, pod, "UPDATE", "ephemeralcontainers"
        )[1]
        answers.add(engine.DENY_EPHEMERAL in failed)
    assert answers == {True, False}


def _case(name: str) -> dict[str, Any]:
    return next(case for case in POD_CASES if case["name"] == name)


def test_a_pod_that_only_tolerates_the_reserved_taint_is_denied_by_both() -> None:
    case = _case("training-tolerates-the-reserved-taint-by-key")
    assert decide(case, nodes_known=False).rule == engine.DENY_TOLERATION
    actions, failed, _ = reserved_nodes_verdict(
        rendered("default"), case, as_pod(case["pod"], "research") or {}, "CREATE"
    )
    assert failed == {engine.DENY_TOLERATION} and actions == ["Deny"]


def test_a_training_pod_the_engine_mutated_is_allowed() -> None:
    case = _case("training-notin-added-to-every-term-and-matchfields-kept")
    decision = decide(case, nodes_known=False)
    assert decision.outcome == "patched" and not decision.violations
    patched = jsonpatch.apply_patch(as_pod(case["pod"], case["namespace"]["name"]), list(decision.patch))
    assert reserved_nodes_verdict(rendered("default"), case, patched, "CREATE")[1] == set()


def test_node_names_are_denied_from_the_params_and_only_from_them() -> None:
    """The backstop knows which nodes are reserved from its parameter (the ConfigMap ``serve`` and ``pool``
    keep in step with the labelled nodes), as the engine knows them from its node cache: listed, a pod
    pinned by name is denied by both; not listed (the ConfigMap as shipped), neither denies it and the
    engine's NotIn requirement makes the kubelet refuse it on a reserved node."""
    case = _case("training-nodename-of-a-reserved-node")
    pod = as_pod(case["pod"], "research") or {}
    known = decide(case, nodes_known=True)
    assert known.rule == engine.DENY_NODE_NAME
    listed = reserved_names_params(case["reservedNodes"])
    actions, failed, messages = reserved_nodes_verdict(rendered("default"), case, pod, "CREATE", params=listed)
    assert actions == ["Deny"] and failed == {engine.DENY_NODE_NAME}, messages
    assert reserved_nodes_verdict(rendered("default"), case, pod, "CREATE")[1] == set()
    unknown = decide(case, nodes_known=False)
    assert unknown.outcome == "patched"
    patched = jsonpatch.apply_patch(pod, list(unknown.patch))
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "rocm-isolation.io/pool", "operator": "NotIn", "values": ["inference"]} in terms[
        "nodeSelectorTerms"
    ][0]["matchExpressions"]


def test_mirror_pods_are_still_checked() -> None:
    """The engine never mutates mirror pods but checks them, and so does the backstop: the
    annotation is no way around either."""
    case = copy.deepcopy(_case("training-tolerates-everything-with-exists-and-no-key"))
    case["pod"]["metadata"]["annotations"] = {engine.MIRROR_ANNOTATION: "x"}
    decision = decide(case, nodes_known=False)
    assert decision.rule == engine.DENY_TOLERATION and decision.patch == ()
    pod = as_pod(case["pod"], case["namespace"]["name"]) or {}
    assert match_conditions_pass(rendered("default"), pod, "CREATE")
    assert reserved_nodes_verdict(rendered("default"), case, pod, "CREATE")[1] == {engine.DENY_TOLERATION}


def test_all_pods_scope_renders_no_gpu_condition() -> None:
    resources = rendered("engine-all-pods")
    hook = find(resources, "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION)["webhooks"][0]
    assert [c.get("name") for c in hook.get("matchConditions") or []] == []
    cpu_pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert match_conditions_pass(resources, cpu_pod, "CREATE")
    policy = find(resources, "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)["spec"]
    # No GPU condition: only the one that leaves out the pods no validation can deny.
    assert [c["name"] for c in policy["matchConditions"]] == ["may-be-denied"]


@pytest.mark.parametrize("policy_name", ["default", "engine-all-pods"])
def test_the_backstop_leaves_out_at_its_conditions_the_pods_it_cannot_deny_and_terminating_ones(
    policy_name: str,
) -> None:
    """One condition (the apiserver evaluates all of a policy's conditions): a validation may deny the pod
    (else the validations, the messages and the audit annotations would cost three more activations of
    it), the cheaper half first, then it is a GPU pod; a terminating pod's update (finalizers) is never
    denied, even one that would newly select the reserved nodes."""
    resources = rendered(policy_name)
    spec = find(resources, "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)["spec"]
    names = [c["name"] for c in spec["matchConditions"]]
    assert names == ["may-be-denied"]
    gpu = cel_module.gpu_pod(policy_for({"policy": policy_name}))
    (condition,) = spec["matchConditions"]
    assert (gpu in condition["expression"]) == (policy_name != "engine-all-pods")
    assert not condition["expression"].startswith(f"({gpu})"), "the cheaper half first"
    # The class in one variable (the MAP's), read only once a check holds; no regular expression.
    assert spec["variables"][0] == {
        "name": "podClass",
        "expression": cel_module.pod_class(policy_for({"policy": policy_name})),
    }
    expressions = [c["expression"] for c in spec["matchConditions"]] + [v["expression"] for v in spec["variables"]]
    expressions += [v["expression"] for v in spec["validations"]]
    assert not any(".matches(" in expression for expression in expressions)
    assert all(v["expression"].startswith("!(") for v in spec["validations"]), "each check first"
    assert not any("messageExpression" in v for v in spec["validations"]), "static messages: no activation of their own"
    old = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
    }
    new = copy.deepcopy(old)
    new["spec"]["nodeSelector"] = {"rocm-isolation.io/pool": "inference"}
    case = {"namespace": {"name": "research", "labels": {}}, "oldPod": old}
    assert reserved_nodes_verdict(resources, case, as_pod(new, "research") or {}, "UPDATE")[1] == {
        engine.DENY_NODE_SELECTOR
    }
    new["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reserved_nodes_verdict(resources, case, as_pod(new, "research") or {}, "UPDATE")[1] == set()


LENDING_POLICIES = ("engine-lending", "engine-lending-gpus")
# The pods a backstop may deny somewhere (a reach the engine denies) and the lending fixtures' pods.
DENIABLE_CASES = [
    case
    for case in POD_CASES
    if engine_reach(decide(case, nodes_known=True)) or case.get("policy", "default") in LENDING_POLICIES
]


def _lending_backstops(policy_name: str) -> list[dict[str, Any]]:
    resources = rendered(policy_name)
    return [
        find(resources, "ValidatingAdmissionPolicy", name)
        for name in (reserved_nodes.POLICY_NAME, reserved_nodes.LENDING_POLICY_NAME, reserved_nodes.NAMES_POLICY_NAME)
    ]


@pytest.mark.parametrize("policy_name", LENDING_POLICIES)
@pytest.mark.parametrize("case", DENIABLE_CASES, ids=lambda case: case["_id"])
def test_lending_on_the_backstops_leave_out_the_reserved_class_namespaces_where_nothing_can_be_denied(
    case: dict[str, Any], policy_name: str
) -> None:
    """Lending on, both backstops' bindings leave out the namespaces labelled with a reserved class
    (``reserved_nodes.reserved_class_namespaces``: the apiserver reads the selector in Go, so such a pod costs
    them no activation): no validation of either fails for a pod there, evaluated without the conditions,
    every node the pod names reserved, in a namespace labelled to borrow or not and named as the policy's
    borrowing names or not. Leaving them out denies nothing less."""
    resources = rendered(policy_name)
    pod = as_pod(case["pod"], "serving")
    assert pod is not None
    names = {*(case.get("reservedNodes") or []), *([pod["spec"]["nodeName"]] if pod["spec"].get("nodeName") else [])}
    for term in (
        ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            names.update(field.get("values") or [])
    params = reserved_names_params(sorted(names))
    for name, lending in (("serving", {}), ("borrow-serving", {"rocm-isolation.io/lending": "allowed"})):
        namespace = {"name": name, "labels": {"rocm-isolation.io/class": "inference", **lending}}
        where = {**case, "namespace": namespace}
        labels = {**namespace["labels"], render.NAMESPACE_NAME_LABEL: name}
        for backstop in _lending_backstops(policy_name):
            bindings = [
                r
                for r in resources
                if r["kind"] == "ValidatingAdmissionPolicyBinding"
                and r["spec"]["policyName"] == backstop["metadata"]["name"]
            ]
            assert len(bindings) == len(render.MODES)
            assert not [
                b for b in bindings if selector_matches(b["spec"]["matchResources"]["namespaceSelector"], labels)
            ]
            # ... and a training namespace of the same labels is bound (by one of the two label policies, and
            # by the names policy).
            training = {**labels, "rocm-isolation.io/class": "training"}
            name = backstop["metadata"]["name"]
            assert any(
                selector_matches(b["spec"]["matchResources"]["namespaceSelector"], training) for b in bindings
            ) == (
                name == reserved_nodes.NAMES_POLICY_NAME
                or bool(lending) == (name == reserved_nodes.LENDING_POLICY_NAME)
            )
            spec = backstop["spec"]
            activation = pod_activation(where, pod, case.get("operation", "CREATE"), params=params)
            variables: dict[Any, Any] = {}
            for variable in spec["variables"]:
                activation["variables"] = celtypes.MapType(variables)
                variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
            activation["variables"] = celtypes.MapType(variables)
            for validation in spec["validations"]:
                assert evaluate(validation["expression"], activation), validation["message"]


def test_the_reserved_class_namespaces_stay_bound_when_a_namespace_rule_could_class_them_otherwise() -> None:
    """A namespace rule comes before the class label (``cel.pod_class``): one that allows an unreserved class
    could make a pod of a namespace labelled inference a training pod, which the backstop must judge. With
    such a rule the bindings do not leave those namespaces out; with rules that allow reserved classes only,
    they do. Lending off: no requirement (its manifests are what they were)."""
    document = yaml.safe_load((FIXTURES / "policies" / "engine-lending.yaml").read_text(encoding="utf-8"))
    requirement = {"key": "rocm-isolation.io/class", "operator": "NotIn", "values": ["inference"]}
    for allowed, left_out in ((["inference"], True), (["training", "inference"], False), (["training"], False)):
        document["spec"]["namespaces"] = [{"match": {"names": ["serve-*"]}, "allowedClasses": allowed}]
        policy = parse_policy(yaml.safe_dump(document))
        selectors = reserved_nodes.binding_namespaces(policy)
        assert set(selectors) == {
            reserved_nodes.POLICY_NAME,
            reserved_nodes.LENDING_POLICY_NAME,
            reserved_nodes.NAMES_POLICY_NAME,
        }
        for requirements in selectors.values():
            assert (requirement in requirements) == left_out, allowed
    assert reserved_nodes.binding_namespaces(default_policy()) == {}
    assert reserved_nodes.reserved_class_namespaces(default_policy()) == [requirement]


# --- the namespace class label guard --------------------------------------------------------------

GUARD_CASES = yaml.safe_load((FIXTURES / "cel" / "namespace-guard.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", GUARD_CASES, ids=lambda case: case["name"])
def test_namespace_class_labels_are_changed_only_by_the_listed_groups(case: dict[str, Any]) -> None:
    resources = rendered(case.get("policy", "default"))
    spec = find(resources, "ValidatingAdmissionPolicy", render.NAMESPACE_CLASS_POLICY)["spec"]
    params = find(resources, "ConfigMap", render.CLASS_LABEL_EDITORS)
    binding = find(resources, "ValidatingAdmissionPolicyBinding", render.NAMESPACE_CLASS_POLICY)
    assert binding["spec"]["paramRef"]["name"] == params["metadata"]["name"]

    def namespace(labels: Mapping[str, str] | None) -> Any:
        if labels is None:
            return None
        return {"metadata": {"name": "team-a", "labels": {render.NAMESPACE_NAME_LABEL: "team-a", **labels}}}

    operation = "UPDATE" if "old" in case else "CREATE"
    activation = {
        "object": cel(namespace(case["new"])),
        "oldObject": cel(namespace(case.get("old"))),
        "request": cel(request(operation, "", case.get("groups"))),
        "namespaceObject": cel(None),
        "params": cel(params),
    }
    _, failed, messages = run_policy(spec, activation)
    assert (not failed) == case["allowed"], messages
    if not case["allowed"]:
        assert render.CLASS_LABEL_EDITORS in messages[0]


# --- portability ----------------------------------------------------------------------------------


def _all_expressions() -> list[str]:
    out = []
    for policy in ("default", "engine-aliases", "engine-all-pods", "cel-rules"):
        for resource in rendered(policy):
            if resource["kind"] == "MutatingWebhookConfiguration":
                out += [c["expression"] for hook in resource["webhooks"] for c in hook["matchConditions"]]
            if resource["kind"] == "ValidatingAdmissionPolicy":
                spec = resource["spec"]
                for key in ("matchConditions", "variables"):
                    out += [item["expression"] for item in spec.get(key) or []]
                for validation in spec["validations"]:
                    out += [
                        validation["expression"],
                        *([validation["messageExpression"]] if "messageExpression" in validation else []),
                    ]
    return out


# Standard CEL string functions (both implement them): what the renderer uses instead of a regular
# expression where a literal prefix, suffix or substring says the same (cel.string_test).
STRING_FUNCTIONS = frozenset({"startsWith", "endsWith", "contains"})


def test_expressions_use_only_functions_kubernetes_and_cel_python_share() -> None:
    portable = PORTABLE_FUNCTIONS | STRING_FUNCTIONS
    for expression in _all_expressions():
        without_strings = re.sub(r"'(?:[^'\\]|\\.)*'", "''", expression)
        called = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", without_strings))
        assert called <= portable, (called - portable, expression)


@pytest.mark.parametrize(
    ("pattern", "cel_text"),
    [
        (r"^amd\.com/", "x.startsWith('amd.com/')"),
        (r"^amd\.com/.*", "x.startsWith('amd.com/')"),
        (r"^ml\-platform$", "x == 'ml-platform'"),
        (r"\-serving$", "x.endsWith('-serving')"),
        (r"^.*\-serving$", "x.endsWith('-serving')"),
        (r"gpu", "x.contains('gpu')"),
        (r"^deviceclass\.resource\.kubernetes\.io/.*\.gpu\.example\.com$", None),
        (r"^amd\.com/[a-z0-9]+_[a-z0-9]+$", "x.matches('^amd\\\\.com/[a-z0-9]+_[a-z0-9]+$')"),
        (r"^infer-..$", "x.matches('^infer-..$')"),
        (r"^\d", "x.matches('^\\\\d')"),
        (r"a|b", "x.matches('a|b')"),
    ],
)
def test_a_regular_expression_becomes_a_string_comparison_where_one_says_the_same(
    pattern: str, cel_text: str | None
) -> None:
    """``cel.string_test``: a literal anchored at the start, the end or both (or around one ``.*``) is
    compared as a string; anything else stays ``matches()``. Both agree with a regex search on names."""
    rendered_test = cel_module.string_test("x", pattern)
    if cel_text is not None:
        assert rendered_test == cel_text
    names = [
        "amd.com/gpu",
        "amd.com/gpu_x1",
        "xamd.com/gpu",
        "ml-platform",
        "ml-platform2",
        "team-serving",
        "serving",
        "a.gpu.example.com",
        "deviceclass.resource.kubernetes.io/a.gpu.example.com",
        "deviceclass.resource.kubernetes.io/.gpu.example.com",
        "deviceclass.resource.kubernetes.io/gpu.example.com",
        "gpu",
        "infer-ab",
        "infer-a",
        "7up",
        "b",
        "",
    ]
    for name in names:
        assert bool(evaluate(rendered_test, {"x": cel(name)})) == bool(re.search(pattern, name)), (pattern, name)


def test_validations_with_line_breaks_have_a_message() -> None:
    # The apiserver requires `message` when an expression spans lines, and messages must be one line.
    for policy in ("default", "cel-rules"):
        for resource in rendered(policy):
            if resource["kind"] == "ValidatingAdmissionPolicy":
                for validation in resource["spec"]["validations"]:
                    assert validation["message"] and "\n" not in validation["message"]


def test_a_pod_with_any_claim_is_covered_by_cel_which_cannot_read_the_claim() -> None:
    """DRA: the apiserver's CEL sees the pod only, not the ResourceClaim(Template) it names. Both the
    matchConditions and the policy treat every claim-holding pod as a GPU pod. The engine, which can
    resolve the claim, leaves a non-GPU claim alone; the policy still keeps such a pod of a
    non-inference class off the reserved nodes (the documented, stricter side)."""
    case = _case("claim-of-another-device-class-is-not-a-gpu-pod")
    pod = as_pod(case["pod"], case["namespace"]["name"]) or {}
    resolved = engine.decide(
        operation="CREATE",
        pod=pod,
        namespace=NamespaceFacts("research", {"rocm-isolation.io/class": "training"}),
        nodes=NodeFacts(None),
        policy=default_policy(),
        claims=ClaimFacts(templates={"rdma": frozenset({"rdma.example.com"})}),
    )
    assert resolved.rule == engine.RULE_NOT_GPU
    resources = rendered("default")
    assert match_conditions_pass(resources, pod, "CREATE")
    actions, failed, messages = reserved_nodes_verdict(resources, case, pod, "CREATE")
    assert failed == {engine.DENY_NODE_SELECTOR} and actions == ["Deny"], messages
    # Unresolved, the engine agrees with the policy exactly.
    assert decide(case, nodes_known=False).rule == engine.DENY_NODE_SELECTOR
