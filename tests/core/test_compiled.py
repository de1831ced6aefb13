"""The decision core compiled with mypyc (setup.py, ``make compile``) decides exactly as its pure
Python source does.

The pure modules are loaded side by side under another package name (a copy of webhook/ whose
imports are renamed), so both run in this process on the same inputs: every engine fixture, and
generated pods (valid ones, and valid ones with one field replaced by arbitrary JSON, since
compiled code checks declared types at run time where Python does not). The outcomes, patches,
messages, warnings and violations must be equal, and a malformed pod must fail the same way.

Skipped when the modules are not compiled (``make pure``, or no C compiler): then the pure
modules are what runs, and the rest of the suite tests them.
"""

from __future__ import annotations

import ast
import copy
import importlib
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import strategies as S
from hypothesis import given
from hypothesis import strategies as st
from test_engine import as_pod, facts, load_cases
from test_properties import DRA_TEMPLATES, dra_pods

from webhook.core import engine
from webhook.core.decision import NO_CLAIMS, NO_DEVICES, ClaimFacts, DeviceFacts
from webhook.core.policy import Policy

ROOT = Path(__file__).parents[2]


def compiled_modules() -> list[str]:
    """``COMPILED_MODULES`` of setup.py, as module names."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMPILED_MODULES" for t in node.targets):
            paths: list[str] = ast.literal_eval(node.value)
            return [path.removesuffix(".py").replace("/", ".") for path in paths]
    raise AssertionError("setup.py has no COMPILED_MODULES")


COMPILED = compiled_modules()
IS_COMPILED = any(
    not (importlib.import_module(name).__file__ or "").endswith(".py") for name in COMPILED
)  # fmt: skip
pytestmark = pytest.mark.skipif(not IS_COMPILED, reason="the decision core is not compiled (pure Python build)")


@pytest.fixture(scope="module")
def pure(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The pure Python engine, as package ``pure_webhook`` (a renamed copy of the sources)."""
    root = tmp_path_factory.mktemp("pure")
    package = root / "pure_webhook"
    package.mkdir()
    for source in (ROOT / "webhook").rglob("*"):
        target = package / source.relative_to(ROOT / "webhook")
        if source.suffix == ".py" and "_manifests" not in source.parts:
            target.parent.mkdir(parents=True, exist_ok=True)
            text = source.read_text(encoding="utf-8")
            text = re.sub(r"\bfrom webhook\b", "from pure_webhook", text)
            text = re.sub(r"\bimport webhook\b", "import pure_webhook", text)
            target.write_text(text, encoding="utf-8")
        elif source.suffix == ".yaml" and source.parent == ROOT / "webhook":
            target.write_bytes(source.read_bytes())
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("pure_webhook.core.engine")
    finally:
        sys.path.remove(str(root))
    assert (module.__file__ or "").endswith(".py")
    return module


def test_every_compiled_module_is_the_compiled_one() -> None:
    for name in COMPILED:
        path = importlib.import_module(name).__file__ or ""
        assert not path.endswith(".py"), f"{name} is not compiled ({path}): run `make compile`"


def outcome(
    module: Any,
    pod: Any,
    old: Any,
    operation: str,
    namespace: Any,
    nodes: Any,
    policy: Policy,
    claims: Any,
    devices: Any = NO_DEVICES,
    sub_resource: str = "",
) -> Any:
    """What ``decide`` returns, as plain data (the compiled and pure records are different classes)."""
    try:
        decision = module.decide(
            operation=operation,
            pod=pod,
            old_pod=old,
            namespace=namespace,
            nodes=nodes,
            policy=policy,
            claims=claims,
            devices=devices,
            sub_resource=sub_resource,
        )
    except Exception as err:  # decide() never raises: if one does, both must raise alike
        return ("raised", type(err).__name__, str(err))
    return (
        decision.allowed,
        decision.rule,
        decision.message,
        decision.mode,
        decision.workload_class,
        list(decision.patch),
        list(decision.warnings),
        dict(decision.audit_annotations),
        [(v.rule, v.field, v.message) for v in decision.violations],
        decision.code,
    )


def assert_same(
    pure: ModuleType,
    pod: Any,
    old: Any,
    operation: str,
    namespace: Any,
    nodes: Any,
    policy: Policy,
    claims: ClaimFacts = NO_CLAIMS,
    devices: DeviceFacts = NO_DEVICES,
    sub_resource: str = "",
) -> Any:
    before = copy.deepcopy((pod, old))
    compiled = outcome(engine, pod, old, operation, namespace, nodes, policy, claims, devices, sub_resource)
    assert (pod, old) == before, "decide must not modify its input"
    assert compiled == outcome(pure, pod, old, operation, namespace, nodes, policy, claims, devices, sub_resource)
    return compiled


@pytest.mark.parametrize("case", load_cases())
def test_same_decision_on_every_engine_fixture(pure: ModuleType, case: dict[str, Any]) -> None:
    inputs = facts(case)
    pod = as_pod(case["pod"]) if case.get("raw") is not True else case["pod"]
    result = assert_same(
        pure, pod, as_pod(case.get("oldPod")), inputs["operation"], inputs["namespace"], inputs["nodes"],
        inputs["policy"], inputs["claims"], inputs["devices"], inputs["sub_resource"],
    )  # fmt: skip
    assert result[0] is (case["expect"]["outcome"] != "denied")


@given(
    pod=S.pods(),
    old=S.pods(),
    operation=st.sampled_from(["CREATE", "UPDATE"]),
    namespace=S.namespaces(),
    nodes=S.node_facts,
    policy_name=S.policy_names,
)
def test_same_decision_on_generated_pods(
    pure: ModuleType, pod: Any, old: Any, operation: str, namespace: Any, nodes: Any, policy_name: str
) -> None:
    assert_same(
        pure, pod, old if operation == "UPDATE" else None, operation, namespace, nodes, S.policy_named(policy_name)
    )


@st.composite
def corrupted_pods(draw: st.DrawFn) -> Any:
    """A valid GPU pod with one field (anywhere) replaced by arbitrary JSON."""
    pod = draw(S.pods(gpu=True))
    path = draw(st.sampled_from([p for p in S.json_paths(pod) if p]))
    parent = pod
    for token in path[:-1]:
        parent = parent[token]
    parent[path[-1]] = draw(S.json_values)
    return pod


@given(
    pod=corrupted_pods(),
    operation=st.sampled_from(["CREATE", "UPDATE"]),
    namespace=S.namespaces(),
    nodes=S.node_facts,
    policy_name=S.policy_names,
)
def test_same_decision_on_malformed_pods(
    pure: ModuleType, pod: Any, operation: str, namespace: Any, nodes: Any, policy_name: str
) -> None:
    old = copy.deepcopy(pod) if operation == "UPDATE" else None
    result = assert_same(pure, pod, old, operation, namespace, nodes, S.policy_named(policy_name))
    assert result[0] != "raised", result


@given(drawn=dra_pods(), operation=st.sampled_from(["CREATE", "UPDATE"]), namespace=S.namespaces(), nodes=S.node_facts)
def test_same_decision_on_dra_pods(
    pure: ModuleType, drawn: tuple[dict[str, Any], bool], operation: str, namespace: Any, nodes: Any
) -> None:
    pod, _ = drawn
    old = copy.deepcopy(pod) if operation == "UPDATE" else None
    claims = ClaimFacts(templates=DRA_TEMPLATES)
    assert_same(pure, pod, old, operation, namespace, nodes, S.policy_named("default"), claims)
