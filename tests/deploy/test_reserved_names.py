"""The reserved-node-names backstop as rendered, its params ConfigMap, and what ``audit`` says when it
and the labelled nodes disagree (how ``pool`` writes the ConfigMap: tests/ops/test_reserved_names_sync.py).
The policy's verdicts are judged by the real apiserver in tests/e2e/test_mutating_policy.py; here its CEL is
evaluated with cel-python on the fixture pods: what its conditions leave out and what its messages cost."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest
from cel_harness import as_pod, cel, decide, evaluate, find, fixture_cases, pod_activation, rendered, well_formed
from celpy import celtypes

from webhook.core.policy import default_policy
from webhook.deploy import cel as cel_module
from webhook.deploy import render, reserved_names


@pytest.mark.parametrize(
    ("data", "labelled", "expected"),
    [
        (None, [], []),
        (None, ["inf-1"], ["is missing"]),
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


def test_the_manifests_bind_the_policy_per_mode_to_the_params_and_allow_when_it_is_missing() -> None:
    resources = render.render(overlay="cert-manager")
    policy = render._find(resources, "ValidatingAdmissionPolicy", reserved_names.POLICY_NAME)
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert policy["spec"]["failurePolicy"] == "Fail"
    reserved = render._find(resources, "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)
    assert policy["spec"]["matchConditions"][0] == reserved["spec"]["matchConditions"][0]
    for mode in render.MODES:
        binding = render._find(resources, "ValidatingAdmissionPolicyBinding", f"{reserved_names.POLICY_NAME}-{mode}")
        twin = render._find(resources, "ValidatingAdmissionPolicyBinding", f"{render.RESERVED_NODES_POLICY}-{mode}")
        assert binding["spec"]["validationActions"] == twin["spec"]["validationActions"]
        assert binding["spec"]["matchResources"] == twin["spec"]["matchResources"]
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


def _verdict(
    pod: dict[str, Any], *, operation: str, old: dict[str, Any] | None = None, sub_resource: str = ""
) -> list[int]:
    """The indexes of the failed validations, evaluated as the apiserver does for a namespace of class
    training (unlabelled: the default class), with the params ConfigMap listing gpu-r1."""
    import celpy

    env = celpy.Environment()
    spec = reserved_names.policy_spec(default_policy())
    namespace = {"metadata": {"name": "research", "labels": {"kubernetes.io/metadata.name": "research"}}}
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(pod),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": operation, "namespace": "research", "subResource": sub_resource}),
        "namespaceObject": celpy.json_to_cel(namespace),
        "params": celpy.json_to_cel({"data": {"gpu-r1": "rocm-isolation.io/pool=inference"}}),
    }

    def evaluate(expression: str) -> Any:
        result = env.program(env.compile(expression)).evaluate(activation)
        assert not isinstance(result, celpy.CELEvalError), (expression, result)
        return result

    for condition in spec["matchConditions"]:
        if not evaluate(condition["expression"]):
            return []
    variables: dict[Any, Any] = {}
    for variable in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(variable["name"])] = evaluate(variable["expression"])
    activation["variables"] = celpy.celtypes.MapType(variables)
    return [i for i, v in enumerate(spec["validations"]) if not evaluate(v["expression"])]


def _pod(node: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}], **spec}}


def test_a_gpu_pod_naming_a_reserved_node_is_denied_on_create_and_its_updates_are_not() -> None:
    gpu = [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}]
    assert _verdict(_pod("gpu-r1", containers=gpu), operation="CREATE") == [0]
    assert _verdict(_pod("gpu-s1", containers=gpu), operation="CREATE") == []
    # A pod admitted before the names were known is not wedged: its updates pass.
    assert _verdict(_pod("gpu-r1", containers=gpu), operation="UPDATE", old=_pod("gpu-r1", containers=gpu)) == []


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
        failed = _verdict(
            _pod(node, ephemeralContainers=added),
            operation="UPDATE",
            old=_pod(node),
            sub_resource="ephemeralcontainers",
        )
        assert (failed == [2]) is denied, (node, added, failed)
        assert failed in ([], [2])
    # A privileged debug container that was already there is not judged again.
    before = _pod("gpu-r1", ephemeralContainers=debug)
    after = _pod("gpu-r1", ephemeralContainers=[*debug, {"name": "dbg2", "image": "busybox"}])
    assert _verdict(after, operation="UPDATE", old=before, sub_resource="ephemeralcontainers") == []


# --- what the apiserver evaluates: the conditions leave out every pod no validation denies ----------

POD_CASES = [case for case in fixture_cases("engine") + fixture_cases("cel/pods") if well_formed(case)]
# The nodes the params list when a case names none (the fixtures' reserved nodes).
FIXTURE_RESERVED = ["gpu-r1", "inf-node-1", "inf-node-2", "mi300x-01", "mi300x-02"]


def _names_spec(policy_name: str) -> dict[str, Any]:
    return find(rendered(policy_name), "ValidatingAdmissionPolicy", reserved_names.POLICY_NAME)["spec"]


def _evaluated(
    spec: Mapping[str, Any], case: Mapping[str, Any], pod: Mapping[str, Any], params: Mapping[str, Any]
) -> tuple[dict[str, bool], list[tuple[bool, str]], list[bool]]:
    """(each condition's value, each validation's (holds, message), each validation's value for a pod of
    an unreserved class: the check alone) for ``pod`` under ``case``, as the apiserver evaluates them."""
    operation = case.get("operation", "CREATE")
    activation = pod_activation(case, pod, operation, case.get("subResource", ""))
    activation["params"] = cel(params)
    conditions = {c["name"]: bool(evaluate(c["expression"], activation)) for c in spec["matchConditions"]}
    variables: dict[Any, Any] = {}
    for variable in spec["variables"]:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    judged = [
        (bool(evaluate(v["expression"], activation)), str(evaluate(v["messageExpression"], activation)))
        for v in spec["validations"]
    ]
    unreserved = dict(variables)
    unreserved[celtypes.StringType("unreservedClass")] = celtypes.BoolType(True)
    activation["variables"] = celtypes.MapType(unreserved)
    checks = [bool(evaluate(v["expression"], activation)) for v in spec["validations"]]
    return conditions, judged, checks


def _params(names: list[str] | None) -> dict[str, Any]:
    meta = {"name": reserved_names.PARAMS_CONFIGMAP, "namespace": reserved_names.NAMESPACE}
    return {"metadata": meta} if names is None else {"metadata": meta, "data": {n: "x" for n in names}}


def _sent(case: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod as sent (the webhook down) and as the webhook patched it (what the apiserver validates)."""
    pod = as_pod(case["pod"], case["namespace"]["name"])
    assert pod is not None
    decision = decide(case, nodes_known=bool(case.get("reservedNodes")))
    return [pod] + ([jsonpatch.apply_patch(pod, list(decision.patch))] if decision.patch else [])


@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["_id"])
def test_the_names_backstops_conditions_hold_exactly_when_a_validation_could_deny_and_messages_only_cost_denials(
    case: dict[str, Any],
) -> None:
    """``may-be-denied`` is the validations' checks without the class: it holds exactly when a validation
    would fail for a pod of an unreserved class, so a pod it leaves out (one activation instead of four)
    is one no validation denies; and each message is '' exactly when its validation holds (the apiserver
    evaluates every messageExpression of a pod the conditions hold for). On every fixture pod, as sent and
    as patched, with the params listing the case's reserved nodes, other nodes, or no data."""
    spec = _names_spec(case.get("policy", "default"))
    for pod in _sent(case):
        for names in (case.get("reservedNodes") or FIXTURE_RESERVED, ["elsewhere"], None):
            conditions, judged, checks = _evaluated(spec, case, pod, _params(names))
            for (holds, message), validation in zip(judged, spec["validations"], strict=True):
                assert (message == "") == holds, (validation["message"], message)
            assert conditions["may-be-denied"] == (not all(checks)), (names, checks)
            if not conditions["may-be-denied"]:
                assert all(holds for holds, _ in judged)


def test_the_fixtures_exercise_every_check_of_the_names_backstop() -> None:
    spec = _names_spec("default")
    failing: set[int] = set()
    left_out = 0
    for case in POD_CASES:
        if case.get("policy", "default") != "default":
            continue
        for pod in _sent(case):
            conditions, _, checks = _evaluated(spec, case, pod, _params(case.get("reservedNodes") or FIXTURE_RESERVED))
            failing |= {i for i, holds in enumerate(checks) if not holds}
            left_out += not conditions["may-be-denied"]
    assert failing == {0, 1, 2}
    assert left_out > len(POD_CASES) / 2


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {cel_module.REQUIRED: {"nodeSelectorTerms": list(terms)}}}


def _by_name(*names: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}


RESERVED_TERM = {"matchExpressions": [{"key": "rocm-isolation.io/pool", "operator": "In", "values": ["inference"]}]}


@pytest.mark.parametrize(
    ("spec", "judged"),
    [
        # Placed by the scheduler (the webhook's and the MAP's training pods): no node named.
        ({}, False),
        ({"affinity": _affinity({"matchExpressions": [{"key": "x", "operator": "In", "values": ["y"]}]})}, False),
        ({"affinity": _affinity(RESERVED_TERM)}, False),  # by label: rocm-isolation-reserved-nodes' case
        ({"nodeName": "gpu-s1"}, False),
        ({"affinity": _affinity(_by_name("gpu-s1"))}, False),  # a DaemonSet's pod on a shared node
        ({"affinity": _affinity(_by_name("gpu-r1", "gpu-s1"))}, False),
        ({"affinity": _affinity(_by_name("gpu-r1"), {"matchFields": []}, {})}, True),  # empty terms match nothing
        ({"affinity": _affinity(_by_name("gpu-r1"), _by_name("gpu-s1"))}, False),
        ({"affinity": _affinity(_by_name("gpu-r1"), RESERVED_TERM)}, True),
        ({"affinity": _affinity(_by_name("gpu-r1"))}, True),
        ({"nodeName": "gpu-r1"}, True),
    ],
)
def test_the_names_backstop_judges_only_pods_that_name_a_reserved_node(spec: dict[str, Any], judged: bool) -> None:
    gpu = [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}]
    pod = {"metadata": {"name": "p", "namespace": "research"}, "spec": {"containers": gpu, **spec}}
    case = {"namespace": {"name": "research", "labels": {}}, "pod": pod}
    conditions, judged_, _ = _evaluated(_names_spec("default"), case, pod, _params(["gpu-r1"]))
    assert conditions == {"gpu-pods": True, "may-be-denied": judged}
    # A training pod (the default class) naming a reserved node is denied, one validation at a time.
    assert [holds for holds, _ in judged_].count(False) == (1 if judged else 0)
    # The params without data (nothing synced yet): nothing named is reserved.
    assert _evaluated(_names_spec("default"), case, pod, _params(None))[0]["may-be-denied"] is False


@pytest.mark.parametrize("policy_name", ["default", "engine-all-pods"])
def test_the_names_backstops_conditions_variables_and_checks(policy_name: str) -> None:
    """The GPU pods (the reserved-nodes policy's first condition, the same text) and ``may-be-denied``; the
    class in one variable (the MAP's, ``cel.pod_class``), read only once a check holds; no regex."""
    spec = _names_spec(policy_name)
    nodes = find(rendered(policy_name), "ValidatingAdmissionPolicy", render.RESERVED_NODES_POLICY)["spec"]
    names = [c["name"] for c in spec["matchConditions"]]
    assert names == (["may-be-denied"] if policy_name == "engine-all-pods" else ["gpu-pods", "may-be-denied"])
    if policy_name == "default":
        assert spec["matchConditions"][0] == nodes["matchConditions"][0]
    assert [v["name"] for v in spec["variables"]] == ["podClass", "unreservedClass"]
    assert spec["variables"][0] == nodes["variables"][0]
    expressions = [c["expression"] for c in spec["matchConditions"]] + [v["expression"] for v in spec["variables"]]
    expressions += [e for v in spec["validations"] for e in (v["expression"], v["messageExpression"])]
    assert not any(".matches(" in expression for expression in expressions)
    assert all(v["expression"].startswith("!(") for v in spec["validations"]), "each check first"
