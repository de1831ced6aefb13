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
from webhook.core.policy import default_policy, load_policy, parse_policy, route_catalogue
from webhook.deploy import cel, mutating_policy, render

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
    assert policy["spec"]["reinvocationPolicy"] == "IfNeeded"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    assert all(m["patchType"] == "JSONPatch" for m in policy["spec"]["mutations"])


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


def test_the_match_conditions_are_the_gpu_route_catalogue_but_claims_and_skip_mirror_pods() -> None:
    policy = default_policy()
    conditions = mutating_policy.placement_policy_spec(policy)["matchConditions"]
    catalogue = route_catalogue(policy.spec)
    assert catalogue.resource_claims
    assert conditions[0] == {"name": "gpu-pods", "expression": cel.gpu_routes(mutating_policy.without_claims(policy))}
    # The same catalogue as the webhook's and the backstop's, the claim route left out.
    assert cel.gpu_pod(policy).startswith(conditions[0]["expression"])
    assert "resourceClaims" in cel.gpu_pod(policy) and "resourceClaims" not in conditions[0]["expression"]
    assert conditions[1]["name"] == "not-mirror-pod" and engine.MIRROR_ANNOTATION in conditions[1]["expression"]
    all_pods = parse_policy(
        "apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\nspec:\n  scope: {allPods: true}\n"
        "  classes: {training: {placement: unreserved}}\n"
    )
    assert [c["name"] for c in mutating_policy.placement_policy_spec(all_pods)["matchConditions"]] == ["not-mirror-pod"]


def test_the_class_variables_are_the_backstops() -> None:
    """One class decision for the apiserver's two policies: the MAP places a pod in the class the VAP
    judges it by."""
    for policy in (default_policy(), load_policy(FIXTURES / "policies" / "engine-aliases.yaml")):
        ours = {v["name"]: v["expression"] for v in mutating_policy.class_variables(policy)}
        backstop = {v["name"]: v["expression"] for v in cel.reserved_nodes_policy_spec(policy)["variables"]}
        assert ours == {name: backstop[name] for name in ours}


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


def test_the_binding_skips_excluded_namespaces_and_opted_out_pods() -> None:
    policy = default_policy()
    excluded = render.excluded_namespaces_selector(policy)
    spec = mutating_policy.binding_spec(policy, excluded)
    assert spec["matchResources"]["namespaceSelector"]["matchExpressions"][0] == excluded
    assert spec["matchResources"]["objectSelector"] == {
        "matchExpressions": [{"key": cel.OPT_OUT_LABEL, "operator": "NotIn", "values": ["true"]}]
    }
    webhook = render._find(
        render.render(overlay="cert-manager"), "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION
    )
    assert webhook["webhooks"][0]["objectSelector"] == spec["matchResources"]["objectSelector"]


def test_a_class_without_requirements_or_tolerations_only_gets_its_annotation() -> None:
    policy = parse_policy(
        "apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\n"
        "spec:\n  defaultClass: debug\n  classes: {debug: {placement: any}}\n"
    )
    mutations = mutating_policy.placement_policy_spec(policy)["mutations"]
    assert len(mutations) == 1
    assert engine.CLASS_ANNOTATION in mutations[0]["jsonPatch"]["expression"]


def test_the_mutations_record_comes_first_and_only_for_the_classes_that_place() -> None:
    """The annotations mutation reads what the placement mutations after it will change off the pod as
    it arrives; a class that never adds affinity or tolerations records neither (``false``)."""
    spec = mutating_policy.placement_policy_spec(default_policy())
    first = spec["mutations"][0]["jsonPatch"]["expression"]
    assert engine.MUTATIONS_ANNOTATION in first and "variables.addedMutations" in first
    assert all(engine.MUTATIONS_ANNOTATION not in m["jsonPatch"]["expression"] for m in spec["mutations"][1:])
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "'node-affinity'" in variables["addedMutations"] and "'tolerations'" in variables["addedMutations"]
    # training adds no toleration: only inference is listed, every other class falls to false.
    assert "'training'" not in variables["addsTolerations"] and variables["addsTolerations"].endswith("false")
    assert "'training'" in variables["addsNodeAffinity"]


def test_key_aliases_render_one_variant_per_spelling() -> None:
    policy = load_policy(FIXTURES / "policies" / "engine-aliases.yaml")
    annotations, affinity, _ = (
        m["jsonPatch"]["expression"] for m in mutating_policy.placement_policy_spec(policy)["mutations"]
    )
    assert engine.CLASS_ANNOTATION in annotations and "nodeSelectorTerms" not in annotations
    for key in ("amd.com/compute-memory-partition", "amd.com/gpu.compute-memory-partition"):
        assert cel.quote(key) in affinity
    # No list of typed objects travels as a bare JSONPatch value (it panics kube-apiserver 1.36's cel-go).
    assert (
        "path: '/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms'"
        not in affinity
    )


def test_the_generated_base_file_is_the_default_policy_rendering() -> None:
    text = (render.manifests_dir() / "base" / "generated-placement-policy.yaml").read_text(encoding="utf-8")
    documents = [d for d in yaml.safe_load_all(text) if d]
    expected = render.generated_base_files(default_policy(), "")["generated-placement-policy.yaml"]
    assert documents == [d for d in yaml.safe_load_all(expected) if d]
