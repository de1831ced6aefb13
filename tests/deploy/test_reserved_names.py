"""The reserved node names in the pod backstop (``rocm-isolation-reserved-nodes`` reads them from its params
ConfigMap), the ConfigMap as shipped, and what ``audit`` says when it and the labelled nodes disagree (how
``pool`` writes the ConfigMap: tests/ops/pool/test_reserved_names_sync.py). The policy's verdicts are judged by
the real apiserver in tests/e2e/test_mutating_policy.py; here its CEL is evaluated with cel-python on the
fixture pods, against the engine with the same reserved nodes known."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest
from cel_harness import (
    MISSING,
    REACH_RULES,
    as_pod,
    decide,
    evaluate,
    find,
    fixture_cases,
    pod_activation,
    policy_for,
    rendered,
    reserved_names_params,
    reserved_nodes_verdict,
    rule_of,
    well_formed,
)
from celpy import celtypes

from webhook.core import engine
from webhook.core.policy import Policy
from webhook.deploy import cel as cel_module
from webhook.deploy import render, reserved_names, reserved_nodes


@pytest.mark.parametrize(
    ("data", "labelled", "expected"),
    [
        (None, [], []),
        (None, ["inf-1"], ["is missing: the apiserver skips the pod backstop's name checks"]),
        ({"inf-1": ""}, ["inf-1"], []),
        ({"inf-1": ""}, ["inf-1", "inf-2"], ["inf-2 carry the reserved label but are not in the ConfigMap"]),
        ({"inf-1": "", "old": ""}, ["inf-1"], ["lists old, which no longer carry the reserved label"]),
    ],
)
def test_audit_reports_when_the_params_and_the_labelled_nodes_disagree(
    data: dict[str, str] | None, labelled: list[str], expected: list[str]
) -> None:
    findings = reserved_names.disagreement(data, labelled)
    assert len(findings) == len(expected)
    for finding, text in zip(findings, expected, strict=True):
        assert text in finding


def test_the_label_backstop_takes_no_parameter_and_the_names_backstop_allows_while_its_parameter_is_missing() -> None:
    """Issue 42: the backstop fails closed. The checks that need no parameter (label, taint, opting out, GPU
    debug containers) are a policy without ``paramKind`` whose bindings take no ``paramRef``: nothing about
    the ConfigMap can turn them off. The name checks read the ConfigMap by name and are skipped while it is
    missing (``Deny`` would reject every pod of the bound namespaces: the apiserver looks the parameter up
    before any condition)."""
    resources = render.render(overlay="cert-manager")
    policies = [r["metadata"]["name"] for r in resources if r["kind"] == "ValidatingAdmissionPolicy"]
    assert {render.RESERVED_NODES_POLICY, reserved_nodes.NAMES_POLICY_NAME} <= set(policies)
    labels = render._find(resources, "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)
    assert "paramKind" not in labels["spec"] and labels["spec"]["failurePolicy"] == "Fail"
    assert "params" not in str(labels["spec"])
    names = render._find(resources, "ValidatingAdmissionPolicy", reserved_nodes.NAMES_POLICY_NAME)
    assert names["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert names["spec"]["failurePolicy"] == "Fail"
    for mode in render.MODES:
        binding = render._find(resources, "ValidatingAdmissionPolicyBinding", f"{render.RESERVED_NODES_POLICY}-{mode}")
        assert "paramRef" not in binding["spec"]
        binding = render._find(
            resources, "ValidatingAdmissionPolicyBinding", f"{reserved_nodes.NAMES_POLICY_NAME}-{mode}"
        )
        assert binding["spec"]["paramRef"] == {
            "name": reserved_names.PARAMS_CONFIGMAP,
            "namespace": render.NAMESPACE,
            "parameterNotFoundAction": "Allow",
        }
    # Shipped so that serve's Lease holder needs no create, without data: re-applying the manifests never
    # manages (or empties) what serve and pool write. serve may get and patch that object only.
    [shipped] = [
        r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == reserved_names.PARAMS_CONFIGMAP
    ]
    assert shipped["metadata"]["namespace"] == reserved_names.NAMESPACE and "data" not in shipped
    rules = [
        rule
        for r in resources
        if r["kind"] == "Role" and r["metadata"]["namespace"] == reserved_names.NAMESPACE
        for rule in r["rules"]
        if "configmaps" in rule["resources"]
    ]
    assert rules == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [reserved_names.PARAMS_CONFIGMAP],
            "verbs": ["get", "patch"],
        }
    ]


# --- the policy's CEL, evaluated (cel-python; the apiserver judges it in the end-to-end suite) ------

RESEARCH = {"namespace": {"name": "research", "labels": {}}}  # unlabelled: the default class, training
LISTING_R1 = reserved_names_params(["gpu-r1"])


def _pod(node: str, **spec: Any) -> dict[str, Any]:
    body = {"metadata": {"name": "p"}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}], **spec}}
    return as_pod(body, "research") or {}


def _failed(pod: dict[str, Any], operation: str, old: dict[str, Any] | None = None, sub_resource: str = "") -> set[str]:
    case = {**RESEARCH, "oldPod": old}
    return reserved_nodes_verdict(rendered("default"), case, pod, operation, sub_resource, params=LISTING_R1)[1]


GPU = [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}]


def test_a_gpu_pod_naming_a_reserved_node_is_denied_on_create_and_its_updates_are_not() -> None:
    assert _failed(_pod("gpu-r1", containers=GPU), "CREATE") == {engine.DENY_NODE_NAME}
    assert _failed(_pod("gpu-s1", containers=GPU), "CREATE") == set()
    # A pod admitted before the names were known is not wedged: its updates pass.
    assert _failed(_pod("gpu-r1", containers=GPU), "UPDATE", old=_pod("gpu-r1", containers=GPU)) == set()


def test_a_gpu_debug_container_on_a_pod_bound_to_a_reserved_node_by_name_is_denied() -> None:
    """No toleration needed to get there with spec.nodeName: only the node's name tells."""
    debug = [{"name": "dbg", "image": "busybox", "securityContext": {"privileged": True}}]
    runtime = [{"name": "dbg", "image": "busybox", "env": [{"name": "AMD_VISIBLE_DEVICES", "value": "all"}]}]
    plain = [{"name": "dbg", "image": "busybox"}]
    for node, added, denied in (
        ("gpu-r1", debug, True),
        ("gpu-r1", runtime, True),
        ("gpu-s1", debug, False),
        ("gpu-r1", plain, False),
    ):
        failed = _failed(_pod(node, ephemeralContainers=added), "UPDATE", _pod(node), "ephemeralcontainers")
        assert failed == ({engine.DENY_EPHEMERAL} if denied else set()), (node, added, failed)
    # A privileged debug container that was already there is not judged again.
    before = _pod("gpu-r1", ephemeralContainers=debug)
    after = _pod("gpu-r1", ephemeralContainers=[*debug, {"name": "dbg2", "image": "busybox"}])
    assert _failed(after, "UPDATE", before, "ephemeralcontainers") == set()


# --- against the engine, on every fixture pod --------------------------------------------------------

POD_CASES = [case for case in fixture_cases("engine") + fixture_cases("cel/pods") if well_formed(case)]
# The nodes the params list when a case names none (the fixtures' reserved nodes).
FIXTURE_RESERVED = ["gpu-r1", "inf-node-1", "inf-node-2", "mi300x-01", "mi300x-02"]
# What the backstop denies of what the engine denies with the reserved nodes known.
PLACEMENT_RULES = {*REACH_RULES, engine.DENY_NODE_NAME}


def _sent(case: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod as sent (the webhook down) and as the webhook patched it (what the apiserver validates)."""
    pod = as_pod(case["pod"], case["namespace"]["name"])
    assert pod is not None
    decision = decide(case, nodes_known=bool(case.get("reservedNodes")))
    return [pod] + ([jsonpatch.apply_patch(pod, list(decision.patch))] if decision.patch else [])


NAMED_CASES = [case for case in POD_CASES if case.get("reservedNodes") and case.get("operation", "CREATE") == "CREATE"]


@pytest.mark.parametrize("case", NAMED_CASES, ids=lambda case: case["_id"])
def test_with_the_names_listed_the_backstop_denies_the_placements_the_engine_denies_knowing_the_nodes(
    case: dict[str, Any],
) -> None:
    """The ConfigMap listing the case's reserved nodes (what serve keeps it at) against the engine with the
    same nodes known: the same placement denials (node name, selector, affinity by label or by name,
    toleration), on the pod as sent and as the webhook patched it."""
    decision = decide(case, nodes_known=True)
    if decision.rule in (engine.RULE_EXCLUDED, engine.RULE_NOT_GPU):
        return
    expected = {v.rule for v in decision.violations} & PLACEMENT_RULES
    params = reserved_names_params(case["reservedNodes"])
    resources = rendered(case.get("policy", "default"))
    for pod in _sent(case):
        failed = reserved_nodes_verdict(resources, case, pod, "CREATE", params=params)[1]
        assert failed & PLACEMENT_RULES == expected, (failed, expected)


def test_the_named_cases_cover_every_denial_by_name() -> None:
    denied: set[str] = set()
    for case in NAMED_CASES:
        params = reserved_names_params(case["reservedNodes"])
        pod = as_pod(case["pod"], case["namespace"]["name"]) or {}
        resources = rendered(case.get("policy", "default"))
        with_names = reserved_nodes_verdict(resources, case, pod, "CREATE", params=params)[1]
        without = reserved_nodes_verdict(resources, case, pod, "CREATE")[1]
        denied |= with_names - without
    assert {engine.DENY_NODE_NAME, engine.DENY_NODE_AFFINITY} <= denied, denied


def _gpu(policy: Policy, case: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """In the backstop's scope: a GPU pod (the second half of its condition)."""
    activation = pod_activation(case, pod, case.get("operation", "CREATE"), case.get("subResource", ""))
    return policy.spec.scope.all_pods or bool(evaluate(cel_module.gpu_pod(policy), activation))


def _backstop(policy_name: str) -> dict[str, Any]:
    """The names policy (the one reading the params)."""
    return find(rendered(policy_name), "ValidatingAdmissionPolicy", reserved_nodes.NAMES_POLICY_NAME)["spec"]


def _evaluated(
    spec: Mapping[str, Any], case: Mapping[str, Any], pod: Mapping[str, Any], params: Mapping[str, Any]
) -> tuple[dict[str, bool], list[bool]]:
    """(each condition's value, each validation's value for a pod of an unreserved class: the check alone)."""
    operation = case.get("operation", "CREATE")
    activation = pod_activation(case, pod, operation, case.get("subResource", ""), params)
    conditions = {c["name"]: bool(evaluate(c["expression"], activation)) for c in spec["matchConditions"]}
    variables: dict[Any, Any] = {}
    for variable in spec["variables"]:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
    variables[celtypes.StringType("unreservedClass")] = celtypes.BoolType(True)
    activation["variables"] = celtypes.MapType(variables)
    return conditions, [bool(evaluate(v["expression"], activation)) for v in spec["validations"]]


@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["_id"])
def test_the_conditions_leave_out_only_pods_no_validation_by_name_denies(case: dict[str, Any]) -> None:
    """``may-be-denied`` holds for a GPU pod whenever a validation's check does (a pod it leaves out costs
    one activation instead of four, so it must be one no validation denies): on every fixture pod, as sent
    and as patched, with the params listing the case's reserved nodes, other nodes, or no data."""
    spec = _backstop(case.get("policy", "default"))
    policy = policy_for(case)
    terminating = case.get("operation") == "UPDATE" and bool(
        (case["pod"].get("metadata") or {}).get("deletionTimestamp")
    )
    for pod in _sent(case):
        for names in (case.get("reservedNodes") or FIXTURE_RESERVED, ["elsewhere"], None):
            conditions, checks = _evaluated(spec, case, pod, reserved_names_params(names))
            if not conditions["may-be-denied"] and _gpu(policy, case, pod) and not terminating:
                assert all(checks), (names, checks)


def test_most_fixture_pods_stop_at_the_conditions_and_every_name_check_is_exercised() -> None:
    spec = _backstop("default")
    name_rules = {i for i, v in enumerate(spec["validations"]) if "params.data" in v["expression"]}
    assert len(name_rules) == len(spec["validations"])
    assert {rule_of(spec["validations"][i]) for i in name_rules} == {
        engine.DENY_NODE_NAME,
        engine.DENY_NODE_AFFINITY,
        engine.DENY_EPHEMERAL,
    }
    failing: set[int] = set()
    left_out = judged = 0
    for case in POD_CASES:
        if case.get("policy", "default") != "default":
            continue
        for pod in _sent(case):
            names = case.get("reservedNodes") or FIXTURE_RESERVED
            conditions, checks = _evaluated(spec, case, pod, reserved_names_params(names))
            failing |= {i for i, holds in enumerate(checks) if not holds}
            left_out += not conditions["may-be-denied"]
            judged += 1
    assert name_rules <= failing
    assert left_out > judged / 3, (left_out, judged)


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {cel_module.REQUIRED: {"nodeSelectorTerms": list(terms)}}}


def _by_name(*names: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}


RESERVED_TERM = {"matchExpressions": [{"key": "rocm-isolation.io/pool", "operator": "In", "values": ["inference"]}]}


NODE_NAME, AFFINITY = {engine.DENY_NODE_NAME}, {engine.DENY_NODE_AFFINITY}


@pytest.mark.parametrize(
    ("spec", "denied", "without_names"),
    [
        # Placed by the scheduler (the webhook's and the MAP's training pods): no node named.
        ({}, set(), set()),
        (
            {"affinity": _affinity({"matchExpressions": [{"key": "x", "operator": "In", "values": ["y"]}]})},
            set(),
            set(),
        ),
        ({"affinity": _affinity(RESERVED_TERM)}, AFFINITY, AFFINITY),  # by label: no name needed
        ({"nodeName": "gpu-s1"}, set(), set()),
        ({"affinity": _affinity(_by_name("gpu-s1"))}, set(), set()),  # a DaemonSet's pod on a shared node
        ({"affinity": _affinity(_by_name("gpu-r1", "gpu-s1"))}, set(), set()),
        ({"affinity": _affinity(_by_name("gpu-r1"), {"matchFields": []}, {})}, AFFINITY, set()),  # empty terms: none
        ({"affinity": _affinity(_by_name("gpu-r1"), _by_name("gpu-s1"))}, set(), set()),
        ({"affinity": _affinity(_by_name("gpu-r1"), RESERVED_TERM)}, AFFINITY, set()),
        ({"affinity": _affinity(_by_name("gpu-r1"))}, AFFINITY, set()),
        ({"nodeName": "gpu-r1"}, NODE_NAME, set()),
    ],
)
def test_the_backstop_judges_only_pods_that_select_or_name_a_reserved_node(
    spec: dict[str, Any], denied: set[str], without_names: set[str]
) -> None:
    """A training pod (the default class) is judged, and denied with the engine's rule, only when it selects
    a reserved node by label or names one the params list; with the params as shipped (no data: nothing
    synced yet) or deleted only by label. The names policy judges only the pods it denies by name."""
    pod = {"metadata": {"name": "p", "namespace": "research"}, "spec": {"containers": GPU, **spec}}
    for params, expected in ((LISTING_R1, denied), (reserved_names_params(None), without_names)):
        conditions, _ = _evaluated(_backstop("default"), RESEARCH, pod, params)
        assert conditions == {"may-be-denied": params is LISTING_R1 and denied != without_names}
        assert reserved_nodes_verdict(rendered("default"), RESEARCH, pod, "CREATE", params=params)[1] == expected
    assert reserved_nodes_verdict(rendered("default"), RESEARCH, pod, "CREATE", params=MISSING)[1] == without_names


@pytest.mark.parametrize("policy_name", ["default", "engine-all-pods"])
def test_the_backstops_name_checks_are_guarded_by_the_params_and_use_no_regex(policy_name: str) -> None:
    """Every read of the params is guarded (a ConfigMap without data lists no node); the class is one
    variable (the MAP's) read only once a check holds; no regular expression."""
    spec = _backstop(policy_name)
    expressions = [c["expression"] for c in spec["matchConditions"]] + [v["expression"] for v in spec["variables"]]
    expressions += [v["expression"] for v in spec["validations"]]
    assert all(e.count("in params.data") == e.count("has(params.data) && ") for e in expressions)
    assert sum("params.data" in v["expression"] for v in spec["validations"]) == 3
    assert [v["name"] for v in spec["variables"]] == ["podClass", "unreservedClass"]
    assert not any(".matches(" in expression for expression in expressions)
    assert all(v["expression"].startswith("!(") for v in spec["validations"]), "each check first"
    assert reserved_nodes.PARAM_REF["name"] == reserved_names.PARAMS_CONFIGMAP


@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["_id"])
def test_with_the_configmap_deleted_the_backstop_denies_all_it_denies_knowing_no_names(case: dict[str, Any]) -> None:
    """Issue 42: the params ConfigMap deleted (the names policy skipped) takes nothing from the backstop but
    the name checks: every fixture pod, as sent and as patched, gets the verdict of a ConfigMap listing no
    node (which denies every placement the engine denies by label, taint or opting out)."""
    resources = rendered(case.get("policy", "default"))
    operation = case.get("operation", "CREATE")
    sub_resource = case.get("subResource", "")
    for pod in _sent(case):
        missing = reserved_nodes_verdict(resources, case, pod, operation, sub_resource, params=MISSING)
        empty = reserved_nodes_verdict(
            resources, case, pod, operation, sub_resource, params=reserved_names_params(None)
        )
        assert missing[1] == empty[1], (missing, empty)
