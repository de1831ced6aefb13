"""The placement MutatingAdmissionPolicy as rendered (offline). Whether it places pods exactly as the
engine does is judged by the real apiserver: tests/e2e/test_mutating_policy.py (cel-python cannot
evaluate MAP mutations, typed object construction or JSONPatch)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core import engine
from webhook.core.policy import PolicyError, default_policy, load_policy, parse_policy, route_catalogue
from webhook.deploy import cel, mutating_policy, render, reserved_nodes

FIXTURES = Path(__file__).parents[1] / "fixtures"
KINDS = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")


def placement(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in resources if r["kind"] in KINDS]


def test_the_manifests_ship_the_policy_and_its_binding_in_v1_by_default() -> None:
    found = placement(render.render(overlay="cert-manager"))
    assert [(r["apiVersion"], r["kind"]) for r in found] == [
        ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"),
        ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"),
    ]
    policy, binding = found
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == mutating_policy.POLICY_NAME
    # Never: the apiserver asks for a second pass after any evaluated mutation; the webhook places
    # whatever a later mutating webhook changes (docs/architecture.md).
    assert policy["spec"]["reinvocationPolicy"] == "Never"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    assert [m["patchType"] for m in policy["spec"]["mutations"]] == ["JSONPatch"]


@pytest.mark.parametrize(
    ("version", "expected"), [("v1beta1", ["admissionregistration.k8s.io/v1beta1"] * 2), ("none", [])]
)
def test_the_version_option_renders_v1beta1_or_leaves_the_policy_out(version: str, expected: list[str]) -> None:
    resources = render.render(overlay="cert-manager", mutating_admission_policy=version)
    assert [r["apiVersion"] for r in placement(resources)] == expected
    # Nothing else changes.
    others = [r for r in render.render(overlay="cert-manager") if r["kind"] not in KINDS]
    assert [r for r in resources if r["kind"] not in KINDS] == others


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(render.RenderError, match="unknown MutatingAdmissionPolicy version 'v2'"):
        render.render(overlay="cert-manager", mutating_admission_policy="v2")


def test_the_cli_flag_reaches_the_output(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    render.add_arguments(parser)
    assert render.main(parser.parse_args(["--mutating-admission-policy", "v1beta1"])) == 0
    out = capsys.readouterr().out
    kinds = [(d["apiVersion"], d["kind"]) for d in yaml.safe_load_all(out) if d and d["kind"] in KINDS]
    assert kinds == [("admissionregistration.k8s.io/v1beta1", kind) for kind in KINDS]
    assert "--mutating-admission-policy v1beta1" in out.splitlines()[0]
    with pytest.raises(SystemExit):
        parser.parse_args(["--mutating-admission-policy", "v1alpha1"])


def test_one_match_condition_skips_mirror_pods_first_then_the_gpu_route_catalogue_but_claims() -> None:
    """The apiserver evaluates every match condition of a policy (no short-circuit between them): one
    condition, the cheapest test first."""
    policy = default_policy()
    conditions = mutating_policy.placement_policy_spec(policy)["matchConditions"]
    catalogue = route_catalogue(policy.spec)
    assert catalogue.resource_claims
    routes = cel.gpu_routes(mutating_policy.without_claims(policy))
    assert conditions == [{"name": "gpu-pods", "expression": f"{mutating_policy.not_mirror_pod()} && (\n{routes})"}]
    assert engine.MIRROR_ANNOTATION in mutating_policy.not_mirror_pod()
    # The same catalogue as the webhook's and the backstop's, the claim route left out.
    assert cel.gpu_pod(policy).startswith(routes)
    assert "resourceClaims" in cel.gpu_pod(policy) and "resourceClaims" not in routes
    # No regular expression: the catalogue's prefix pattern is a startsWith, its variable prefix too.
    assert ".matches(" not in conditions[0]["expression"]
    assert "r.startsWith('amd.com/')" in routes and "e.name.startsWith('DOCKER_RESOURCE_')" in routes
    all_pods = parse_policy(
        "apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\nspec:\n  scope: {allPods: true}\n"
        "  classes: {training: {placement: unreserved}}\n"
    )
    assert [c["name"] for c in mutating_policy.placement_policy_spec(all_pods)["matchConditions"]] == ["not-mirror-pod"]


def _accepted_policies() -> list[Any]:
    out = []
    for path in sorted((FIXTURES / "policies").glob("*.yaml")):
        try:
            out.append(pytest.param(load_policy(path), id=path.stem))
        except PolicyError:
            continue
    return out


@pytest.mark.parametrize("policy", _accepted_policies())
def test_every_policy_renders_one_mutation_one_condition_one_variable_and_no_typed_literal(policy: Any) -> None:
    """Each mutation evaluation costs a conversion of the pod and a JSON round trip, and each variable a
    program evaluation: one mutation, the class as the one variable. Patch values are plain maps (the
    pod's typed ``Object.spec...{}`` literals are converted again at every nesting level). The apiserver
    compiles them all and places like the engine with each (tests/e2e/test_mutating_policy.py)."""
    spec = mutating_policy.placement_policy_spec(policy)
    assert len(spec["matchConditions"]) == 1
    assert [v["name"] for v in spec["variables"]] == ["podClass"]
    assert spec["variables"][0]["expression"] == cel.pod_class(policy)
    [mutation] = spec["mutations"]
    expression = mutation["jsonPatch"]["expression"]
    # (namespaceObject is the namespace, read by lending's test of whether a namespace may borrow.)
    assert "Object." not in expression.replace("namespaceObject.", "")
    # Every class has its branch (the last is the fallback).
    for class_name in list(policy.spec.classes)[:-1]:
        assert f"variables.podClass == {cel.quote(class_name)}" in expression
    # No ApplyConfiguration: nodeSelectorTerms, matchExpressions and tolerations are atomic lists.
    assert mutation["patchType"] == "JSONPatch"


def test_the_common_case_is_one_operation_per_part() -> None:
    """A pod without affinity gets one add of the whole affinity, a pod without annotations one add of
    the class and the record, a pod without tolerations one add of the list: the first branch of each."""
    expression = mutating_policy.placement_policy_spec(default_policy())["mutations"][0]["jsonPatch"]["expression"]
    assert (
        "!has(object.spec.affinity) ? [JSONPatch{op: 'add', path: '/spec/affinity', value: {'nodeAffinity'"
        in expression
    )
    assert (
        "!has(object.metadata.annotations) ? [JSONPatch{op: 'add', path: '/metadata/annotations', value: " in expression
    )
    assert (
        "size(object.spec.tolerations) == 0 ? [JSONPatch{op: 'add', path: '/spec/tolerations', value: [" in expression
    )


def test_the_class_is_the_backstops() -> None:
    """One class decision for the apiserver's policies: the MAP places a pod in the class the VAPs judge
    it by (the reserved-nodes backstop, and the names and device backstops through ``class_variables``)."""
    for policy in (default_policy(), load_policy(FIXTURES / "policies" / "engine-aliases.yaml")):
        ours = {v["name"]: v["expression"] for v in mutating_policy.placement_policy_spec(policy)["variables"]}
        backstop = {v["name"]: v["expression"] for v in reserved_nodes.policy_spec(policy)["variables"]}
        shared = {v["name"]: v["expression"] for v in mutating_policy.class_variables(policy)}
        assert ours["podClass"] == backstop["podClass"] == shared["podClass"] == cel.pod_class(policy)


@pytest.mark.parametrize(
    ("policy_mode", "label", "mutates"),
    [
        ("enforce", None, True),
        ("enforce", "warn", True),
        ("enforce", "audit", False),
        ("enforce", "bogus", True),
        ("audit", None, False),
        ("audit", "enforce", True),
        ("audit", "warn", True),
        ("audit", "bogus", False),
        ("warn", "audit", False),
    ],
)
def test_the_binding_leaves_out_exactly_the_namespaces_whose_mode_is_audit(
    policy_mode: str, label: str | None, mutates: bool
) -> None:
    """The namespace selector agrees with the engine's mode (a label that is not a mode falls back to the
    policy's mode); label selectors are evaluated here as the apiserver does."""
    policy = parse_policy(
        "apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\n"
        f"spec:\n  mode: {policy_mode}\n  classes: {{training: {{placement: unreserved}}}}\n"
    )
    requirement = mutating_policy.mutating_modes_selector(policy)
    labels = {} if label is None else {policy.spec.labels.namespace_mode: label}
    value = labels.get(requirement["key"])
    selected = value in requirement["values"] if requirement["operator"] == "In" else value not in requirement["values"]
    assert selected is mutates
    from webhook.core.decision import NamespaceFacts

    mode, _ = engine.namespace_mode(policy.spec, NamespaceFacts("ns", labels))
    assert (mode != "audit") is mutates


def test_the_binding_skips_excluded_namespaces_opted_out_and_placed_pods() -> None:
    """The webhook's objectSelector, and pods placed already: the second pass of the mutating chain (the
    placed label written in the first) costs the policy no CEL. The webhook itself does not skip them."""
    policy = default_policy()
    excluded = render.excluded_namespaces_selector(policy)
    spec = mutating_policy.binding_spec(policy, excluded)
    assert spec["matchResources"]["namespaceSelector"]["matchExpressions"][0] == excluded
    opted_out = {"key": cel.OPT_OUT_LABEL, "operator": "NotIn", "values": ["true"]}
    placed = {"key": engine.PLACED_LABEL, "operator": "DoesNotExist"}
    assert spec["matchResources"]["objectSelector"] == {"matchExpressions": [opted_out, placed]}
    webhook = render._find(
        render.render(overlay="cert-manager"), "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION
    )
    assert webhook["webhooks"][0]["objectSelector"] == {"matchExpressions": [opted_out]}


def test_a_class_without_requirements_or_tolerations_only_gets_its_annotation() -> None:
    policy = parse_policy(
        "apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\n"
        "spec:\n  defaultClass: debug\n  classes: {debug: {placement: any}}\n"
    )
    [mutation] = mutating_policy.placement_policy_spec(policy)["mutations"]
    expression = mutation["jsonPatch"]["expression"]
    assert engine.CLASS_ANNOTATION in expression
    assert "nodeSelectorTerms" not in expression and "tolerations" not in expression
    assert engine.MUTATIONS_ANNOTATION not in expression


def test_the_record_reads_what_the_placement_operations_change() -> None:
    """The annotations are computed on the pod as it arrives, with the placement's operations bound once
    (``a``: affinity, ``w``: tolerations): an entry is recorded when its list is not empty; a class that
    never adds tolerations records no ``tolerations``."""
    expression = mutating_policy.placement_policy_spec(default_policy())["mutations"][0]["jsonPatch"]["expression"]
    inference, training = expression.split("variables.podClass == 'inference' ? (", 1)[1].split(") :\n[", 1)
    assert ".map(a, " in inference and ".map(w, " in inference
    assert "size(a) > 0 && !('node-affinity' in r.split(','))" in inference
    assert "size(w) > 0 && !('tolerations' in r.split(','))" in inference
    assert ".map(w, " not in training and "'tolerations'" not in training
    assert "size(a) > 0 && !('node-affinity' in r.split(','))" in training


def test_key_aliases_render_one_variant_per_spelling() -> None:
    policy = load_policy(FIXTURES / "policies" / "engine-aliases.yaml")
    [mutation] = mutating_policy.placement_policy_spec(policy)["mutations"]
    expression = mutation["jsonPatch"]["expression"]
    for key in ("amd.com/compute-memory-partition", "amd.com/gpu.compute-memory-partition"):
        assert cel.quote(key) in expression
    # No list of typed objects travels as a JSONPatch value (it panics kube-apiserver 1.36's cel-go):
    # the terms are plain maps.
    # (namespaceObject is the namespace, read by lending's test of whether a namespace may borrow.)
    assert "Object." not in expression.replace("namespaceObject.", "")


def test_the_generated_base_file_is_the_default_policy_rendering() -> None:
    text = (render.manifests_dir() / "base" / "generated-placement-policy.yaml").read_text(encoding="utf-8")
    documents = [d for d in yaml.safe_load_all(text) if d]
    expected = render.generated_base_files(default_policy(), "")["generated-placement-policy.yaml"]
    assert documents == [d for d in yaml.safe_load_all(expected) if d]
