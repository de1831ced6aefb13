"""The rendered manifests' CEL evaluated with cel-python as kube-apiserver evaluates it (the variables
``object``, ``oldObject``, ``request``, ``namespaceObject``, ``params``, ``variables``; a binding's
namespace selector; a policy's match conditions, variables and validations), and the engine run on the
same case: what tests/deploy/test_cel.py compares and tests/core/test_bypass.py reuses."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy import celtypes

from webhook.core import engine
from webhook.core.decision import Decision, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.policy import Policy, default_policy, load_policy
from webhook.deploy import device_classes, render, reserved_names, reserved_nodes

FIXTURES = Path(__file__).parent / "fixtures"
REACH_RULES = (engine.DENY_NODE_SELECTOR, engine.DENY_NODE_AFFINITY, engine.DENY_TOLERATION)
# The rule only the policy has (an opted-out pod never reaches the webhook, see test_bypass.py).
OPTED_OUT_NODE_NAME = reserved_nodes.OPTED_OUT_NODE_NAME
# Functions and macros both Kubernetes CEL and cel-python implement, and the one of Kubernetes' list
# library the messages use (indexOf, implemented below as Kubernetes documents it); nothing else may appear.
PORTABLE_FUNCTIONS = frozenset({"has", "size", "exists", "all", "matches", "map", "filter", "string", "indexOf"})

_ENV = celpy.Environment()


def _index_of(items: celtypes.ListType, value: Any) -> celtypes.IntType:
    """Kubernetes' ``<list<T>>.indexOf(<T>) <int>``: the first index of an equal element, -1 when none."""
    return celtypes.IntType(next((i for i, item in enumerate(items) if item == value), -1))


@cache
def _program(expression: str) -> Any:
    return _ENV.program(_ENV.compile(expression), functions={"indexOf": _index_of})


def evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    result = _program(expression).evaluate(dict(activation))
    assert not isinstance(result, celpy.CELEvalError), f"{expression!r} failed: {result}"
    return result


def without_nulls(value: Any) -> Any:
    """The object as admission CEL sees it: the apiserver decodes into typed objects, so a field sent
    as null is simply absent."""
    if isinstance(value, Mapping):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def cel(value: Any) -> Any:
    return celpy.json_to_cel(without_nulls(value))


# --- fixtures -------------------------------------------------------------------------------------


def fixture_cases(directory: str) -> list[dict[str, Any]]:
    cases = []
    for path in sorted((FIXTURES / directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and "pod" in doc:
                doc["_id"] = f"{directory}/{path.stem}:{doc['name']}"
                cases.append(doc)
    return cases


def well_formed(case: Mapping[str, Any]) -> bool:
    """What the apiserver can send: a pod object, CREATE or UPDATE, parsed by the engine without error."""
    if case.get("raw") or case.get("operation", "CREATE") not in ("CREATE", "UPDATE"):
        return False
    return decide(case, nodes_known=False).rule != engine.RULE_MALFORMED


def policy_path(name: str) -> Path:
    for directory in ("policies", "cel/policies"):
        path = FIXTURES / directory / f"{name}.yaml"
        if path.exists():
            return path
    raise FileNotFoundError(name)


def policy_for(case: Mapping[str, Any]) -> Policy:
    name = case.get("policy", "default")
    return default_policy() if name == "default" else load_policy(policy_path(name))


def as_pod(body: Mapping[str, Any] | None, namespace: str) -> dict[str, Any] | None:
    if body is None:
        return None
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(dict(body))}
    pod.setdefault("metadata", {})
    pod["metadata"].setdefault("name", "pod")
    pod["metadata"].setdefault("namespace", namespace)
    return pod


def decide(
    case: Mapping[str, Any],
    *,
    nodes_known: bool,
    pod: Any = None,
    operation: str | None = None,
    devices_known: bool = False,
) -> Decision:
    ns = case["namespace"]
    reserved = case.get("reservedNodes") if nodes_known else None
    known = case.get("devices", {}) if devices_known else {}
    return engine.decide(
        operation=operation or case.get("operation", "CREATE"),
        pod=pod if pod is not None else as_pod(case["pod"], ns["name"]),
        old_pod=as_pod(case.get("oldPod"), ns["name"]),
        namespace=NamespaceFacts(ns["name"], ns.get("labels")),
        nodes=NodeFacts(None if reserved is None else frozenset(reserved)),
        policy=policy_for(case),
        # The cluster's DeviceClasses, which only the webhook knows (CEL cannot look them up).
        devices=DeviceFacts(frozenset(known.get("gpuClasses", [])), frozenset(known.get("extendedResources", []))),
    )


@cache
def rendered(policy_name: str) -> list[dict[str, Any]]:
    """The manifests rendered with that policy: their CEL is what is under test."""
    if policy_name == "default":
        return render.render(overlay="cert-manager")
    path = policy_path(policy_name)
    return render.render(overlay="cert-manager", policy_text=path.read_text(encoding="utf-8"), policy_source=str(path))


def find(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name)


def namespace_object(case: Mapping[str, Any]) -> dict[str, Any]:
    ns = case["namespace"]
    # The apiserver labels every namespace with its name; the engine may not know the other labels.
    labels = {**(ns.get("labels") or {}), render.NAMESPACE_NAME_LABEL: ns["name"]}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns["name"], "labels": labels}}


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def request(operation: str, namespace: str, groups: list[str] | None = None, sub_resource: str = "") -> dict[str, Any]:
    user: dict[str, Any] = {"username": "someone"}
    if groups is not None:
        user["groups"] = groups
    # The apiserver always sets subResource ('' for the main resource).
    return {"operation": operation, "namespace": namespace, "userInfo": user, "subResource": sub_resource}


def run_policy(spec: Mapping[str, Any], activation: dict[str, Any]) -> tuple[bool, list[int], list[str]]:
    """(matched, indexes of failed validations, their messages), as the apiserver evaluates a VAP."""
    for condition in spec.get("matchConditions") or []:
        if not evaluate(condition["expression"], activation):
            return False, [], []
    variables: dict[celtypes.StringType, Any] = {}
    for variable in spec.get("variables") or []:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    failed, messages = [], []
    for index, validation in enumerate(spec["validations"]):
        if not evaluate(validation["expression"], activation):
            failed.append(index)
            # A static message (no messageExpression) is the apiserver's message as written.
            expression = validation.get("messageExpression")
            messages.append(str(evaluate(expression, activation)) if expression else validation["message"])
    return True, failed, messages


def reserved_names_params(names: list[str] | None = None) -> dict[str, Any]:
    """The pod backstop's parameter: the reserved node names ConfigMap, as shipped (no data) or listing ``names``."""
    meta = {"name": reserved_names.PARAMS_CONFIGMAP, "namespace": reserved_names.NAMESPACE}
    return {"metadata": meta} if names is None else {"metadata": meta, "data": {n: "x" for n in names}}


def pod_activation(
    case: Mapping[str, Any],
    pod: Mapping[str, Any],
    operation: str,
    sub_resource: str = "",
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod's activation; ``params`` the pod backstop's (default: the reserved node names ConfigMap as
    shipped, listing none: the engine without node facts)."""
    ns = case["namespace"]["name"]
    old = as_pod(case.get("oldPod"), ns) if operation == "UPDATE" else None
    return {
        "object": cel(pod),
        "oldObject": cel(old),
        "request": cel(request(operation, ns, ["system:authenticated"], sub_resource)),
        "namespaceObject": cel(namespace_object(case)),
        "params": cel(reserved_names_params() if params is None else params),
    }


def rule_of(validation: Mapping[str, Any]) -> str:
    """The engine's rule a backstop validation enforces, as its static message names it."""
    message: str = validation["message"]
    return message.removeprefix("rocm-isolation: [").split("]", 1)[0]


def match_conditions_pass(resources: list[dict[str, Any]], pod: Mapping[str, Any], operation: str) -> bool:
    hook = find(resources, "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION)["webhooks"][0]
    activation = {"object": cel(pod), "oldObject": cel(None), "request": cel({"operation": operation})}
    return all(evaluate(c["expression"], activation) for c in hook["matchConditions"])


# The pod backstop's policies: the label policy (lending on: two, one bound to the namespaces labelled to
# borrow, the other to the rest) takes no parameter; the names policy reads the reserved node names ConfigMap.
LABEL_POLICIES = (render.RESERVED_NODES_POLICY, reserved_nodes.LENDING_POLICY_NAME)
NAMES_POLICY = reserved_nodes.NAMES_POLICY_NAME
# ``params`` of ``reserved_nodes_verdict``: the ConfigMap deleted (the names policy is skipped: Allow).
MISSING: Mapping[str, Any] = {"missing": True}


def reserved_nodes_verdict(
    resources: list[dict[str, Any]],
    case: Mapping[str, Any],
    pod: Mapping[str, Any],
    operation: str,
    sub_resource: str = "",
    params: Mapping[str, Any] | None = None,
) -> tuple[list[str], set[str], list[str]]:
    """(actions of the bindings that apply, engine rules of the failed validations of every backstop policy
    bound there, their messages), with ``params`` as in ``pod_activation``, or ``MISSING``: the names
    ConfigMap deleted, the names policy skipped (its bindings' ``parameterNotFoundAction: Allow``)."""
    ns = namespace_object(case)
    applying = [
        binding
        for group in (LABEL_POLICIES, (NAMES_POLICY,))
        for binding in [
            b
            for b in resources
            if b["kind"] == "ValidatingAdmissionPolicyBinding"
            and b["spec"]["policyName"] in group
            and selector_matches(b["spec"]["matchResources"]["namespaceSelector"], ns["metadata"]["labels"])
        ]
    ]
    by_policy = {b["spec"]["policyName"] for b in applying}
    assert len(by_policy) == len(applying), "the mode bindings must select disjoint namespaces"
    assert len(by_policy & set(LABEL_POLICIES)) <= 1, "one label policy per namespace"
    if not applying:
        return [], set(), []
    actions = {tuple(b["spec"]["validationActions"]) for b in applying}
    assert len(actions) == 1, "one mode per namespace"
    rules: set[str] = set()
    messages: list[str] = []
    for binding in applying:
        name = binding["spec"]["policyName"]
        spec = find(resources, "ValidatingAdmissionPolicy", name)["spec"]
        assert ("paramRef" in binding["spec"]) == (name == NAMES_POLICY) == ("paramKind" in spec)
        if name == NAMES_POLICY and params is MISSING:
            assert binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow"
            continue
        matched, failed, said = run_policy(spec, pod_activation(case, pod, operation, sub_resource, params))
        if matched:
            rules |= {rule_of(spec["validations"][i]) for i in failed}
            messages += said
    return list(next(iter(actions))), rules, messages


def engine_reach(decision: Decision) -> set[str]:
    return {v.rule for v in decision.violations if v.rule in REACH_RULES}


# --- policies with a parameter: the device-level reservation backstop ------------------------------

RESERVED_PCI_BUS_IDS = ("0000:05:00.0", "0000:26:00.0")
PARAM_STATES = ("active", "released", None)  # None: the reserved DeviceClass does not exist


def reserved_device_class(policy: Policy, state: str | None) -> dict[str, Any] | None:
    """The reserved DeviceClass as ``pool`` leaves it (``active``, ``released``), or None when absent."""
    if state is None:
        return None
    reservation = (
        device_classes.DeviceReservation(2, RESERVED_PCI_BUS_IDS)
        if state == "active"
        else device_classes.RELEASED_RESERVATION
    )
    return device_classes.reserved_class(policy, reservation)


def applying_binding(
    resources: list[dict[str, Any]], policy_name: str, case: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The binding of ``policy_name`` whose namespace selector matches the case's namespace (at most one:
    the mode bindings select disjoint namespaces)."""
    labels = namespace_object(case)["metadata"]["labels"]
    applying = [
        r
        for r in resources
        if r["kind"] == "ValidatingAdmissionPolicyBinding"
        and r["spec"]["policyName"] == policy_name
        and selector_matches(r["spec"]["matchResources"]["namespaceSelector"], labels)
    ]
    assert len(applying) <= 1, "the mode bindings must select disjoint namespaces"
    return applying[0] if applying else None


def params_verdict(
    resources: list[dict[str, Any]],
    policy_name: str,
    case: Mapping[str, Any],
    obj: Mapping[str, Any],
    params: Mapping[str, Any] | None,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
) -> tuple[list[str], list[int], list[str]]:
    """(actions of the binding that applies, indexes of failed validations, messages) of a policy whose
    binding takes a parameter by name (``paramRef``). ``params`` None: the parameter is not found, and with
    ``parameterNotFoundAction: Allow`` nothing is evaluated (the apiserver admits)."""
    binding = applying_binding(resources, policy_name, case)
    if binding is None:
        return [], [], []
    actions = binding["spec"]["validationActions"]
    ref = binding["spec"]["paramRef"]
    if params is None:
        assert ref["parameterNotFoundAction"] == "Allow"
        return actions, [], []
    assert params["metadata"]["name"] == ref["name"]
    spec = find(resources, "ValidatingAdmissionPolicy", policy_name)["spec"]
    activation = {
        "object": cel(obj),
        "oldObject": cel(old),
        "request": cel(request(operation, case["namespace"]["name"], ["system:authenticated"])),
        "namespaceObject": cel(namespace_object(case)),
        "params": cel(params),
    }
    _, failed, messages = run_policy(spec, activation)
    return actions, failed, messages


def policy_expressions(resources: list[dict[str, Any]], kind: str, names: tuple[str, ...] | None = None) -> list[str]:
    """Every CEL expression of the ``kind`` objects (ValidatingAdmissionPolicy, ...) of ``resources``,
    optionally only those named ``names``: match conditions, variables, validations and their messages."""
    out = []
    for resource in resources:
        if resource["kind"] != kind or (names is not None and resource["metadata"]["name"] not in names):
            continue
        spec = resource["spec"]
        for key in ("matchConditions", "variables"):
            out += [item["expression"] for item in spec.get(key) or []]
        for validation in spec.get("validations") or []:
            out += [
                validation["expression"],
                *([validation["messageExpression"]] if "messageExpression" in validation else []),
            ]
    return out
