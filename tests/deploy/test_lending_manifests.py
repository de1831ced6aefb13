"""Lending in the manifests (issue 36): the two PriorityClasses rendered from the policy when lending is on
(none when off), the lending namespace label guarded like the class label, and with lending off every
manifest exactly what it was (the renderer's output for the default policy is the committed base)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.policy import default_policy_text, load_policy
from webhook.deploy import cel, lending_access, mutating_policy, render, reserved_devices, reserved_nodes

POLICIES = Path(__file__).parents[1] / "fixtures" / "policies"


def _rendered(name: str) -> list[dict[str, Any]]:
    return render.render(policy_text=(POLICIES / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("name", "borrower", "inference"),
    [
        (
            "engine-lending",
            ("rocm-isolation-borrower", -100, "Never"),
            ("rocm-isolation-inference", 1000, "PreemptLowerPriority"),
        ),
        (
            "engine-lending-gpus",
            ("lending-borrower", 0, "Never"),
            ("lending-inference", 100000, "PreemptLowerPriority"),
        ),
    ],
)
def test_lending_on_renders_both_priority_classes_from_the_policy(
    name: str, borrower: tuple[str, int, str], inference: tuple[str, int, str]
) -> None:
    classes = [r for r in _rendered(name) if r["kind"] == "PriorityClass"]
    assert [(c["metadata"]["name"], c["value"], c["preemptionPolicy"]) for c in classes] == [borrower, inference]
    for priority_class in classes:
        assert priority_class["apiVersion"] == "scheduling.k8s.io/v1"
        assert priority_class["globalDefault"] is False
        assert priority_class["metadata"]["labels"]["app.kubernetes.io/name"] == render.APP_NAME


def test_lending_off_renders_no_priority_class_and_no_rbac_on_them() -> None:
    resources = render.render(policy_text=default_policy_text())
    assert not [r for r in resources if r["kind"] == "PriorityClass"]
    rules = [rule for r in resources if r["kind"] in ("ClusterRole", "Role") for rule in r.get("rules", [])]
    assert not [rule for rule in rules if "priorityclasses" in rule.get("resources", [])]
    # ... nor with lending on: the values come from the policy.
    rules = [
        rule for r in _rendered("engine-lending") if r["kind"] in ("ClusterRole", "Role") for rule in r.get("rules", [])
    ]
    assert not [rule for rule in rules if "priorityclasses" in rule.get("resources", [])]


def test_the_lending_namespace_label_is_guarded_like_the_class_label_only_with_lending_on() -> None:
    assert "rocm-isolation.io/lending" in cel.namespace_label_keys(load_policy(POLICIES / "engine-lending.yaml"))
    assert "rocm-isolation.io/lending" not in cel.namespace_label_keys(load_policy(POLICIES / "good-full.yaml"))
    guard = render._find(_rendered("engine-lending"), "ValidatingAdmissionPolicy", render.NAMESPACE_CLASS_POLICY)
    assert "'rocm-isolation.io/lending'" in guard["spec"]["variables"][0]["expression"]


def test_lending_off_leaves_the_backstop_and_the_placement_policy_without_a_word_of_lending() -> None:
    policy = load_policy(POLICIES / "good-full.yaml")
    text = str(reserved_nodes.policy_spec(policy)) + str(mutating_policy.placement_policy_spec(policy))
    for word in (
        "priority",
        "rocm-isolation.io/borrow",
        "rocm-isolation.io/lending",
        "no-borrowers",
        "podAntiAffinity",
    ):
        assert word not in text, word
    lent = load_policy(POLICIES / "engine-lending.yaml")
    text = str(reserved_nodes.policy_spec(lent)) + str(mutating_policy.placement_policy_spec(lent))
    for word in (
        "object.spec.priority <= -100",
        "rocm-isolation.io/borrow",
        "rocm-isolation.io/lending",
        "no-borrowers",
    ):
        assert word in text, word


def test_lending_on_splits_the_backstop_by_the_lending_label_into_disjoint_bindings() -> None:
    """Lending on: the borrowing namespaces (labelled) get a backstop of their own, whose condition leaves out
    a pod at the borrowers' priority that does not tolerate the no-borrowers taint (a match condition cannot
    read the namespace, a binding's selector can); the other namespaces keep the backstop, bound to them only.
    Lending off: one backstop, its bindings as they were."""
    resources = _rendered("engine-lending")
    policies = {r["metadata"]["name"]: r for r in resources if r["kind"] == "ValidatingAdmissionPolicy"}
    assert {reserved_nodes.POLICY_NAME, reserved_nodes.LENDING_POLICY_NAME} <= set(policies)
    lent = policies[reserved_nodes.LENDING_POLICY_NAME]["spec"]["matchConditions"][0]["expression"]
    assert "object.spec.priority <= -100" in lent and "rocm-isolation.io/no-borrowers" in lent
    selectors: dict[str, list[Any]] = {}
    backstops = (reserved_nodes.POLICY_NAME, reserved_nodes.LENDING_POLICY_NAME)
    for binding in (
        r for r in resources if r["kind"] == "ValidatingAdmissionPolicyBinding" and r["spec"]["policyName"] in backstops
    ):
        selectors.setdefault(binding["spec"]["policyName"], []).append(
            binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][-1]
        )
    lending_key = {"key": "rocm-isolation.io/lending", "values": ["allowed"]}
    assert [dict(e, operator=None) for e in selectors[reserved_nodes.LENDING_POLICY_NAME]] == [
        dict(lending_key, operator=None)
    ] * 3
    assert [e["operator"] for e in selectors[reserved_nodes.LENDING_POLICY_NAME]] == ["In"] * 3
    assert [e["operator"] for e in selectors[reserved_nodes.POLICY_NAME]] == ["NotIn"] * 3
    off = render.render(policy_text=default_policy_text())
    assert not [r for r in off if r["metadata"]["name"].startswith(reserved_nodes.LENDING_POLICY_NAME)]


def _lending_off_text() -> str:
    """The lending fixture turned off as docs/operations.md "Turning it off" says: ``enabled: false``."""
    document = yaml.safe_load((POLICIES / "engine-lending.yaml").read_text(encoding="utf-8"))
    document["spec"]["lending"]["enabled"] = False
    return yaml.safe_dump(document, sort_keys=False)


def _access(resources: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    names = {lending_access.CLUSTER_ROLE, lending_access.NODE_WRITES_POLICY, lending_access.CLASS_WRITES_POLICY}
    return {(r["kind"], r["metadata"]["name"]): r for r in resources if r["metadata"]["name"] in names}


def test_lending_turned_off_keeps_the_keepers_closing_access_and_drops_the_rest() -> None:
    """Issue 42: after the switch off the Lease holder keeps the no-borrowers taint while a borrower of before
    is pending, then takes it off, and closes the lendable class. The lending-off manifests of a policy with a
    lending section keep ``patch`` on nodes and on the lendable class, with the two policies holding them, so
    that applying them with pruning removes nothing the keeper needs; evictions and creating the class go."""
    on, off = _access(_rendered("engine-lending")), _access(render.render(policy_text=_lending_off_text()))
    assert (
        set(off)
        == set(on)
        == {
            ("ClusterRole", lending_access.CLUSTER_ROLE),
            ("ClusterRoleBinding", lending_access.CLUSTER_ROLE),
            ("ValidatingAdmissionPolicy", lending_access.NODE_WRITES_POLICY),
            ("ValidatingAdmissionPolicyBinding", lending_access.NODE_WRITES_POLICY),
            ("ValidatingAdmissionPolicy", lending_access.CLASS_WRITES_POLICY),
            ("ValidatingAdmissionPolicyBinding", lending_access.CLASS_WRITES_POLICY),
        }
    )
    rules = off[("ClusterRole", lending_access.CLUSTER_ROLE)]["rules"]
    assert rules == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["deviceclasses"],
            "resourceNames": ["rocm-isolation-lendable"],
            "verbs": ["patch"],
        },
    ]
    granted = {
        (tuple(r["resources"]), tuple(r["verbs"])) for r in on[("ClusterRole", lending_access.CLUSTER_ROLE)]["rules"]
    }
    assert {(("pods/eviction",), ("create",)), (("deviceclasses",), ("create",))} <= granted
    for name in (lending_access.NODE_WRITES_POLICY, lending_access.CLASS_WRITES_POLICY):
        assert off[("ValidatingAdmissionPolicy", name)] == on[("ValidatingAdmissionPolicy", name)]


def test_without_a_lending_section_the_webhook_may_write_no_node() -> None:
    """The default policy (lending never used): no write access to nodes or DeviceClasses at all."""
    resources = render.render(policy_text=default_policy_text())
    assert _access(resources) == {}
    rules = [rule for r in resources if r["kind"] in ("ClusterRole", "Role") for rule in r.get("rules", [])]
    writes = {"patch", "update", "create", "delete"}
    for rule in rules:
        if {"nodes", "deviceclasses"} & set(rule.get("resources", [])):
            assert not writes & set(rule["verbs"]), rule


def test_a_switch_changes_the_placement_policy_alone_in_the_apiserver() -> None:
    """Issue 42: each admission plugin of the apiserver takes a changed policy on its own (within about a
    second), so a switch that changed both the placement MAP and the backstop's bindings would have moments
    where the MAP makes borrowers the backstop still denies (seen on the real control plane). With a lending
    section, on and off render the same backstop, bindings, PriorityClasses and namespace guard; what differs
    is the placement policy, the policies on claims (devices of split nodes) and the keeper's role."""
    # The GPU-route catalogue names the lendable class with lending on: a name the catalogue's test for any
    # extended resource of a group ("r.contains('/')") matches either way, so no decision differs.
    lendable = ", 'deviceclass.resource.kubernetes.io/rocm-isolation-lendable'"

    def objects(resources: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
        return {(r["kind"], r["metadata"]["name"]): json.dumps(r).replace(lendable, "") for r in resources}

    on, off = objects(_rendered("engine-lending")), objects(render.render(policy_text=_lending_off_text()))
    assert "r.contains('/')" in on[("MutatingWebhookConfiguration", render.APP_NAME)]
    differ = sorted(key for key in on.keys() | off.keys() if on.get(key) != off.get(key))
    judging_pods = [
        key
        for key in on
        if key[1].startswith(
            (reserved_nodes.POLICY_NAME, reserved_nodes.NAMES_POLICY_NAME, render.NAMESPACE_CLASS_POLICY)
        )
        or key[0] in ("PriorityClass", "MutatingWebhookConfiguration", "MutatingAdmissionPolicyBinding")
    ]
    assert len(judging_pods) >= 16, judging_pods
    assert [key for key in judging_pods if key in differ] == []
    assert ("MutatingAdmissionPolicy", render.PLACEMENT_POLICY) in differ
    # Still switched with lending: the claims' policies (devices of split nodes, DRA) and the keeper's role.
    assert {key[1] for key in differ} <= {
        render.PLACEMENT_POLICY,
        "rocm-isolation-policy",
        lending_access.CLUSTER_ROLE,
        *(key[1] for key in on if "device-claim" in key[1] or key[1].startswith(reserved_devices.LENT_CLAIMS_POLICY)),
    }, differ
    # Turned on, the placement policy comes last (its borrowers name the class and need the lending backstop);
    # turned off, before the backstop.
    order = [(r["kind"], r["metadata"]["name"]) for r in _rendered("engine-lending")]
    assert order[-2:] == [
        ("MutatingAdmissionPolicy", render.PLACEMENT_POLICY),
        ("MutatingAdmissionPolicyBinding", render.PLACEMENT_POLICY),
    ]
    assert order.index(("PriorityClass", "rocm-isolation-borrower")) < order.index(
        ("ValidatingAdmissionPolicy", reserved_nodes.POLICY_NAME)
    )
    order = [(r["kind"], r["metadata"]["name"]) for r in render.render(policy_text=_lending_off_text())]
    assert order.index(("MutatingAdmissionPolicy", render.PLACEMENT_POLICY)) < order.index(
        ("ValidatingAdmissionPolicy", reserved_nodes.POLICY_NAME)
    )
