"""The reserved-node-names backstop as rendered, its params ConfigMap, and what ``audit`` says when it
and the labelled nodes disagree (how ``pool`` writes the ConfigMap: tests/ops/test_reserved_names_sync.py).
The policy's verdicts are judged by the real apiserver in tests/e2e/test_mutating_policy.py."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.policy import default_policy
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
