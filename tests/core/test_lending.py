"""Lending (webhook.core.lending, spec.lending of the policy), table-driven from tests/fixtures/lending/:
the policy's validation messages (each with its field path), the one definition of a borrower on stored
pods, and who may become one on CREATE. The engine's admission of borrowers is in
tests/fixtures/engine/lending.yaml (test_engine.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core import lending
from webhook.core.policy import Policy, PolicyError, default_policy, default_policy_text, load_policy, parse_policy

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _cases(name: str) -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in yaml.safe_load((FIXTURES / "lending" / name).read_text())]


def _policy(name: str) -> Policy:
    return default_policy() if name == "default" else load_policy(FIXTURES / "policies" / f"{name}.yaml")


def _with_lending(section: dict[str, Any]) -> str:
    document = yaml.safe_load(default_policy_text())
    document["spec"]["lending"] = section
    return yaml.safe_dump(document)


@pytest.mark.parametrize("case", _cases("policies.yaml"))
def test_lending_validation(case: dict[str, Any]) -> None:
    text = _with_lending(case["lending"])
    if not case["problems"]:
        assert parse_policy(text).spec.lending.lend_from in ("idleNodes", "idleGPUs")
        return
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    assert caught.value.problems == case["problems"]


def test_lending_is_off_by_default_with_the_names_users_see() -> None:
    settings = default_policy().spec.lending
    assert settings.enabled is False
    assert (settings.namespaces.label_key, settings.pod_label) == (
        "rocm-isolation.io/lending",
        "rocm-isolation.io/borrow",
    )
    assert (settings.borrower_priority_class.name, settings.inference_priority_class.name) == (
        "rocm-isolation-borrower",
        "rocm-isolation-inference",
    )
    assert settings.borrower_priority_class.value < 0 < settings.inference_priority_class.value
    assert settings.borrower_priority_class.preemption_policy == "Never"
    assert (settings.reclaim_grace_seconds, settings.headroom_gpus, settings.lend_from) == (30, 0, "idleNodes")


def test_a_borrower_priority_not_below_zero_is_warned_about() -> None:
    warnings = _policy("engine-lending-gpus").warnings
    assert any("borrowerPriorityClass.value is 0" in warning for warning in warnings), warnings
    assert _policy("engine-lending").warnings == ()


@pytest.mark.parametrize("case", _cases("borrowers.yaml"))
def test_is_borrower(case: dict[str, Any]) -> None:
    pod = {"metadata": {"name": "p"}, "spec": case["spec"]}
    assert lending.is_borrower(pod, _policy(case["policy"])) is case["borrower"]


@pytest.mark.parametrize(
    ("namespace", "labels", "pod_labels", "borrows", "warned"),
    [
        ("borrow-a", {}, {"rocm-isolation.io/borrow": "true"}, True, False),
        ("borrow-a", None, {"rocm-isolation.io/borrow": "true"}, True, False),  # by name, labels unknown
        ("borrow-a", {}, {}, False, False),  # defaultBorrow off: opt in
        ("research", {"rocm-isolation.io/lending": "allowed"}, {"rocm-isolation.io/borrow": "true"}, True, False),
        ("research", {"rocm-isolation.io/lending": "yes"}, {"rocm-isolation.io/borrow": "true"}, False, True),
        ("research", {}, {"rocm-isolation.io/borrow": "true"}, False, True),
        ("research", {}, {"rocm-isolation.io/borrow": "false"}, False, False),
        ("borrow-a", {}, {"rocm-isolation.io/borrow": "TRUE"}, False, True),
    ],
)
def test_borrow_choice(
    namespace: str, labels: dict[str, str] | None, pod_labels: dict[str, str], borrows: bool, warned: bool
) -> None:
    got, why = lending.borrow_choice(_policy("engine-lending"), namespace, labels, pod_labels)
    assert (got, bool(why)) == (borrows, warned), why


def test_nobody_borrows_with_lending_off() -> None:
    policy = default_policy()
    allowed = {"rocm-isolation.io/lending": "allowed"}
    assert lending.borrow_choice(policy, "research", allowed, {"rocm-isolation.io/borrow": "true"}) == (False, "")
    assert not lending.namespace_may_borrow(policy, "research", allowed)


def test_priority_fields_are_all_three() -> None:
    fields = lending.priority_fields(_policy("engine-lending").spec.lending.borrower_priority_class)
    assert fields == {"priorityClassName": "rocm-isolation-borrower", "priority": -100, "preemptionPolicy": "Never"}
