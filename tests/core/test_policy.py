"""Loading and validating IsolationPolicy files: the shipped default, good and bad files under
tests/fixtures/policies/ (good-*.yaml, bad-*.yaml), the exact problem messages (path: what is
wrong), warnings, and how namespaces are matched to classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.core import device_claims, engine
from webhook.core.policy import (
    NamespaceClasses,
    Policy,
    PolicyError,
    default_policy,
    default_policy_text,
    load_policy,
    parse_policy,
)

POLICIES = Path(__file__).parents[1] / "fixtures" / "policies"
HEAD = "apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\n"


def problems_of(path: Path) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.source == str(path)
    return caught.value.problems


# ---------------------------------------------------------------------------------------------
# The shipped default policy
# ---------------------------------------------------------------------------------------------


def test_default_policy_loads_with_its_documented_values() -> None:
    policy = default_policy()
    spec = policy.spec
    assert policy.name == "default"
    assert spec.mode == "enforce"
    system = ["kube-system", "kube-public", "kube-node-lease", "rocm-isolation-system", "kube-amd-gpu"]
    assert spec.excluded_namespaces == system
    # The shipped file and the schema's defaults are the same catalogue of GPU routes.
    assert spec.scope == type(spec.scope)()
    assert spec.reserved_nodes.label == ("rocm-isolation.io/pool", "inference")
    taint = spec.reserved_nodes.taint
    assert taint is not None
    assert (taint.key, taint.value, taint.effect) == ("rocm-isolation.io/reserved", "inference", "NoSchedule")
    assert (spec.labels.namespace_class, spec.labels.namespace_mode, spec.labels.pod_class) == (
        "rocm-isolation.io/class",
        "rocm-isolation.io/mode",
        "rocm-isolation.io/workload-class",
    )
    assert spec.default_class == "training"
    assert spec.classes["inference"].placement == "reserved"
    assert spec.classes["training"].placement == "unreserved"
    # The KFD topology mount is off by default (ROCm does not need it; hostPath).
    assert not any(cls.kfd_topology_mount for cls in spec.classes.values())
    assert spec.namespaces == []
    assert not spec.scope.all_pods


def test_default_policy_acknowledges_hsa_queue_priority_and_does_not_warn_about_itself() -> None:
    policy = default_policy()
    assert policy.warnings == ()
    for cls in ("inference", "training"):
        (var,) = policy.spec.classes[cls].env
        assert (var.name, var.acknowledge_no_effect) == ("HSA_QUEUE_PRIORITY", True)


def test_the_same_variable_without_the_acknowledgement_still_warns() -> None:
    text = default_policy_text().replace("acknowledgeNoEffect: true", "acknowledgeNoEffect: false")
    warnings = parse_policy(text).warnings
    assert len(warnings) == 2
    for cls, warning in zip(("inference", "training"), warnings, strict=True):
        assert warning.startswith(f"spec.classes.{cls}.env[0] (HSA_QUEUE_PRIORITY): HSA_QUEUE_PRIORITY has no effect")
        assert "hipStreamCreateWithPriority" in warning


def test_acknowledging_a_variable_that_has_an_effect_is_an_error() -> None:
    text = default_policy_text().replace("- name: HSA_QUEUE_PRIORITY", "- name: GPU_MAX_HW_QUEUES", 1)
    with pytest.raises(PolicyError) as err:
        parse_policy(text)
    assert any(
        "acknowledgeNoEffect: GPU_MAX_HW_QUEUES is not a variable known to have no effect" in p
        for p in err.value.problems
    ), err.value.problems


def test_default_policy_overrides_the_priority_variable() -> None:
    for name in ("inference", "training"):
        (var,) = default_policy().spec.classes[name].env
        assert var.name == "HSA_QUEUE_PRIORITY" and var.on_conflict == "override"


@pytest.mark.parametrize(
    ("resource", "gpu"),
    [
        ("amd.com/gpu", True),
        ("amd.com/cpx_nps4", True),
        ("amd.com/spx_nps1", True),
        # Every name under amd.com/: the device plugin's names vary (virtualization, partitions).
        ("amd.com/gpu_vf", True),
        ("amd.com/gpu_pf", True),
        ("amd.com/cpx", True),
        ("amd.com.evil/gpu", False),
        ("nvidia.com/gpu", False),
        ("cpu", False),
        ("example.com/amd.com/cpx_nps4", False),
        # DRA extended resources of the GPU DeviceClasses the policy names.
        ("deviceclass.resource.kubernetes.io/gpu.amd.com", True),
        ("deviceclass.resource.kubernetes.io/rdma.example.com", False),
    ],
)
def test_default_gpu_resources(resource: str, gpu: bool) -> None:
    assert default_policy().is_gpu_resource(resource) is gpu


def test_default_policy_text_digest_is_stable_and_content_addressed() -> None:
    text = default_policy_text()
    assert parse_policy(text).digest == default_policy().digest
    assert parse_policy(text + "\n# comment\n").digest != default_policy().digest


# ---------------------------------------------------------------------------------------------
# Good files
# ---------------------------------------------------------------------------------------------


def test_minimal_policy_gets_the_defaults() -> None:
    policy = load_policy(POLICIES / "good-minimal.yaml")
    assert policy.warnings == ()
    assert policy.name == "default"
    spec = policy.spec
    assert spec.mode == "enforce"
    assert spec.default_class == "training"
    assert spec.reserved_nodes.label == ("rocm-isolation.io/pool", "inference")
    assert spec.reserved_nodes.taint is None  # the taint is optional
    assert spec.scope.gpu_resources == ["amd.com/gpu"]
    inference = spec.classes["inference"]
    assert inference.env == [] and inference.tolerations == [] and inference.topology_spread is None
    assert inference.node_selector_requirements == [] and not inference.kfd_topology_mount


def test_warnings_are_not_errors() -> None:
    policy = load_policy(POLICIES / "good-warnings.yaml")
    assert policy.name == "warnings"
    by_field = {w.split(":", 1)[0]: w for w in policy.warnings}
    assert set(by_field) == {
        "spec.classes.inference.env[0] (HSA_QUEUE_PRIORITY)",
        "spec.classes.inference.env[1] (HIP_PRECISION_MODE)",
        "spec.classes.inference.env[2] (HIP_LAUNCH_BLOCKING)",
        "spec.classes.inference.kfdTopologyMount",
        "spec.classes.training.env[0] (HSA_AMD_PRECISION_LEVEL)",
    }
    assert "has no effect in ROCm" in by_field["spec.classes.inference.env[0] (HSA_QUEUE_PRIORITY)"]
    assert "does not exist" in by_field["spec.classes.inference.env[1] (HIP_PRECISION_MODE)"]
    assert "does not exist" in by_field["spec.classes.training.env[0] (HSA_AMD_PRECISION_LEVEL)"]
    assert "slows inference down" in by_field["spec.classes.inference.env[2] (HIP_LAUNCH_BLOCKING)"]
    assert "hostPath" in by_field["spec.classes.inference.kfdTopologyMount"]
    # HIP_LAUNCH_BLOCKING=0, GPU_MAX_HW_QUEUES and a valid HSA_CU_MASK raise nothing.
    assert not any("training.env[1]" in w or "training.env[2]" in w or "training.env[3]" in w for w in policy.warnings)


# ---------------------------------------------------------------------------------------------
# Bad files: every problem, with the path of the field
# ---------------------------------------------------------------------------------------------

BAD_FILES = [
    ("bad-unknown-field.yaml", ["spec.classes.inference.bogus: Extra inputs are not permitted"]),
    ("bad-api-version.yaml", ["apiVersion: Input should be 'rocm-isolation.io/v1alpha1'"]),
    ("bad-kind.yaml", ["kind: Input should be 'IsolationPolicy'"]),
    (
        "bad-cu-mask.yaml",
        [
            "spec.classes.inference.env[0]: HSA_CU_MASK '0:0x0': set 1: a CU mask of 0x0 enables no CU "
            "(ROCm ignores a malformed mask silently, so it is rejected here)"
        ],
    ),
    (
        "bad-tolerates-unhealthy.yaml",
        [
            "spec.classes.inference: tolerating amd-gpu-unhealthy is not allowed: the AMD GPU operator uses it "
            "to keep pods off unhealthy or re-partitioning GPUs"
        ],
    ),
    (
        "bad-tolerates-dcm.yaml",
        [
            "spec.classes.training: tolerating amd-dcm is not allowed: the AMD GPU operator uses it "
            "to keep pods off unhealthy or re-partitioning GPUs"
        ],
    ),
    ("bad-undefined-class.yaml", ["spec: namespaces[0]: class 'batch' is not defined under classes"]),
    ("bad-default-class.yaml", ["spec: defaultClass: 'batch' is not one of the classes (inference, training)"]),
    (
        "bad-two-reserved-labels.yaml",
        ["spec.reservedNodes: nodeSelector must have exactly one label (key: value) that marks reserved nodes"],
    ),
    (
        "bad-unreserved-tolerates-reserved.yaml",
        ["spec: classes.training.tolerations[0]: an unreserved class must not tolerate the reserved taint"],
    ),
    (
        "bad-several.yaml",
        [
            "spec.mode: Input should be 'enforce', 'warn' or 'audit'",
            "spec.classes.inference.env[0].value: Input should be a valid string",
            "spec.classes.training.kfdTopologyMount: Input should be a valid boolean",
        ],
    ),
]


@pytest.mark.parametrize(("name", "expected"), BAD_FILES, ids=[name for name, _ in BAD_FILES])
def test_bad_file_is_rejected_with_the_field_path(name: str, expected: list[str]) -> None:
    assert problems_of(POLICIES / name) == expected


def test_bad_yaml_reports_line_and_column() -> None:
    (problem,) = problems_of(POLICIES / "bad-yaml.yaml")
    # The unclosed "{" on line 5 is noticed at the ":" of the next mapping key.
    assert problem.startswith("line 6, column 13: not valid YAML: ")
    assert "expected ',' or '}'" in problem


def test_policy_error_message_lists_every_problem() -> None:
    path = POLICIES / "bad-several.yaml"
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: invalid policy:\n  spec.mode: ")
    assert text.count("\n  ") == 3


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    (problem,) = problems_of(missing)
    assert problem.startswith("cannot read the file: ")


BAD_SPECS = [
    ("", ["the file must hold one YAML mapping (apiVersion, kind, spec)"]),
    ("- a\n- b\n", ["the file must hold one YAML mapping (apiVersion, kind, spec)"]),
    (HEAD, ["spec: Field required"]),
    (HEAD + "spec: {}\n", ["spec.classes: Field required"]),
    (
        HEAD + "spec:\n  classes: {training: {placement: unreserved, tolerations: [{operator: Exists}]}}\n",
        [
            "spec.classes.training: a class toleration must name a key: operator Exists without a key "
            "tolerates every taint"
        ],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved, env: [{name: A, value: x}, {name: A, value: y}]}}\n",
        ["spec.classes.training: env sets A more than once"],
    ),
    (
        HEAD + 'spec:\n  classes: {training: {placement: unreserved, env: [{name: "A=B", value: x}]}}\n',
        ["spec.classes.training.env[0]: 'A=B' is not a valid environment variable name"],
    ),
    (
        HEAD + "spec:\n  classes: {training: {placement: unreserved, onConflict: keep}}\n",
        ["spec.classes.training.onConflict: Extra inputs are not permitted"],
    ),
    (
        # Field names are the camelCase ones of the docs: a snake_case spelling is an unknown field.
        HEAD + "spec:\n  default_class: training\n  classes: {training: {placement: unreserved}}\n",
        ["spec.default_class: Extra inputs are not permitted"],
    ),
    (
        HEAD + "spec:\n  classes: {training: {placement: unreserved, env: [{name: A, value: x, onConflict: merge}]}}\n",
        ["spec.classes.training.env[0].onConflict: Input should be 'keep' or 'override'"],
    ),
    (
        HEAD + "spec:\n  classes: {training: {placement: nowhere}}\n",
        ["spec.classes.training.placement: Input should be 'reserved', 'unreserved' or 'any'"],
    ),
    (
        HEAD + "spec:\n  defaultClass: Training\n  classes: {Training: {placement: unreserved}}\n",
        ["spec: classes.Training: a class name must be a DNS label (it is used as a label value)"],
    ),
    (
        HEAD
        + "spec:\n  reservedNodes: {nodeSelector: {'bad key!': x}}\n  classes: {training: {placement: unreserved}}\n",
        ["spec.reservedNodes: 'bad key!' is not a valid label key (prefix/name, e.g. example.com/pool)"],
    ),
    (
        HEAD + "spec:\n  reservedNodes: {nodeSelector: {}}\n  classes: {training: {placement: unreserved}}\n",
        ["spec.reservedNodes: nodeSelector must have exactly one label (key: value) that marks reserved nodes"],
    ),
    (
        HEAD
        + "spec:\n  reservedNodes: {taint: {key: a, effect: NoRun}}\n  classes: {training: {placement: unreserved}}\n",
        ["spec.reservedNodes.taint.effect: Input should be 'NoSchedule', 'PreferNoSchedule' or 'NoExecute'"],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved, nodeSelectorRequirements: [{key: a, operator: In}]}}\n",
        ["spec.classes.training.nodeSelectorRequirements[0]: operator In needs at least one value"],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved, nodeSelectorRequirements: "
        + "[{key: a, operator: Gt, values: ['x']}]}}\n",
        ["spec.classes.training.nodeSelectorRequirements[0]: operator Gt takes exactly one integer value"],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved, nodeSelectorRequirements: "
        + "[{key: a, keyAliases: ['b c'], operator: Exists}]}}\n",
        [
            "spec.classes.training.nodeSelectorRequirements[0]: 'b c' is not a valid label key (prefix/name, e.g. example.com/pool)"
        ],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved, topologySpread: "
        + "{minDomains: 2, whenUnsatisfiable: ScheduleAnyway}}}\n",
        ["spec.classes.training.topologySpread: minDomains is only allowed with whenUnsatisfiable: DoNotSchedule"],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved}}\n  namespaces: [{match: {}, allowedClasses: [training]}]\n",
        ["spec.namespaces[0].match: a namespace rule must match by names, by labels, or both"],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved}, inference: {placement: reserved}}\n"
        + "  namespaces: [{match: {names: [a]}, allowedClasses: [training], defaultClass: inference}]\n",
        ["spec.namespaces[0]: defaultClass 'inference' is not in allowedClasses"],
    ),
    (
        HEAD
        + "spec:\n  classes: {training: {placement: unreserved}}\n  namespaces: [{match: {names: [a]}, allowedClasses: []}]\n",
        ["spec.namespaces[0]: allowedClasses must name at least one class"],
    ),
    (
        HEAD + "spec:\n  scope: {gpuResourcePatterns: ['(']}\n  classes: {training: {placement: unreserved}}\n",
        [
            "spec.scope: gpuResourcePatterns: '(' is not a regular expression: missing ), unterminated subpattern "
            "at position 0"
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_SPECS)
def test_bad_policy_text(text: str, expected: list[str]) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, source="inline")
    assert caught.value.problems == expected


@pytest.mark.parametrize(
    ("mask", "valid"),
    [
        ("0:0-51", True),
        ("0,2-4,7:0-15,32-47;8-9:0x337F", True),
        # AMD's documented example repeats GPUs 3, 4 and 7 across sets: ROCr's parser
        # (flag.cpp "no GPU was repeated across cu_sets") drops the second set, so it is rejected.
        ("0,2-4,7:0-15,32-47;3-9:0x337F", False),
        ("0:", False),
        ("0:0x0", False),
        ("0:5-3", False),
        ("0,0:1", False),
        ("abc", False),
        ("0:1;;", False),
    ],
)
def test_cu_mask_in_a_policy(mask: str, valid: bool) -> None:
    text = (
        HEAD
        + f"spec:\n  classes:\n    training:\n      placement: unreserved\n      env: [{{name: HSA_CU_MASK, value: '{mask}'}}]\n"
    )
    if valid:
        assert parse_policy(text).warnings == ()
    else:
        with pytest.raises(PolicyError) as caught:
            parse_policy(text)
        (problem,) = caught.value.problems
        assert problem.startswith(f"spec.classes.training.env[0]: HSA_CU_MASK {mask!r}: ")


# ---------------------------------------------------------------------------------------------
# Namespace rules: which classes a namespace allows, and its default
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ns_policy() -> Policy:
    return load_policy(POLICIES / "good-namespaces.yaml")


@pytest.mark.parametrize(
    ("namespace", "labels", "expected"),
    [
        # Exact name; the later rule naming "serving" again never applies (first match wins).
        ("serving", {}, NamespaceClasses(("inference",), "inference", "policy rule namespaces[0]")),
        ("serving", None, NamespaceClasses(("inference",), "inference", "policy rule namespaces[0]")),
        # Globs: * and ?; the exact "serve-canary" in rule 4 loses to the glob in rule 1.
        ("serve-eu", {}, NamespaceClasses(("inference", "debug"), "inference", "policy rule namespaces[1]")),
        ("serve-canary", {}, NamespaceClasses(("inference", "debug"), "inference", "policy rule namespaces[1]")),
        ("infer-01", {}, NamespaceClasses(("inference", "debug"), "inference", "policy rule namespaces[1]")),
        ("infer-001", {}, NamespaceClasses(("training",), "training", "the policy's defaultClass")),
        ("xserve-eu", {}, NamespaceClasses(("training",), "training", "the policy's defaultClass")),
        # Labels must all match; the rule's defaultClass wins over its first allowed class.
        (
            "anything",
            {"team": "ml", "tier": "prod", "x": "y"},
            NamespaceClasses(("training", "inference"), "inference", "policy rule namespaces[2]"),
        ),
        ("anything", {"team": "ml"}, NamespaceClasses(("training",), "training", "the policy's defaultClass")),
        # Names and labels together; without defaultClass the first allowed class is the default.
        ("lab-1", {"team": "ml"}, NamespaceClasses(("debug", "training"), "debug", "policy rule namespaces[3]")),
        ("lab-1", {"team": "web"}, NamespaceClasses(("training",), "training", "the policy's defaultClass")),
        # Labels unknown (no cluster): rules that need labels cannot match.
        ("lab-1", None, NamespaceClasses(("training",), "training", "the policy's defaultClass")),
        # No rule: the namespace class label, then defaultClass.
        (
            "team-a",
            {"rocm-isolation.io/class": "inference"},
            NamespaceClasses(("inference",), "inference", "namespace label rocm-isolation.io/class=inference"),
        ),
        (
            "team-a",
            {"rocm-isolation.io/class": "debug"},
            NamespaceClasses(("debug",), "debug", "namespace label rocm-isolation.io/class=debug"),
        ),
        (
            "team-a",
            {"rocm-isolation.io/class": "bogus"},
            NamespaceClasses(("training",), "training", "the policy's defaultClass"),
        ),
        ("team-a", None, NamespaceClasses(("training",), "training", "the policy's defaultClass")),
        # A matching rule wins over the class label.
        (
            "serve-eu",
            {"rocm-isolation.io/class": "training"},
            NamespaceClasses(("inference", "debug"), "inference", "policy rule namespaces[1]"),
        ),
    ],
)
def test_namespace_classes(
    ns_policy: Policy, namespace: str, labels: dict[str, str] | None, expected: NamespaceClasses
) -> None:
    assert ns_policy.namespace_classes(namespace, labels) == expected


def test_namespace_class_label_key_is_configurable() -> None:
    text = HEAD + (
        "spec:\n  labels: {namespaceClass: example.com/gpu-class}\n"
        "  classes: {inference: {placement: reserved}, training: {placement: unreserved}}\n"
    )
    policy = parse_policy(text)
    assert policy.namespace_classes("a", {"example.com/gpu-class": "inference"}).default == "inference"
    assert policy.namespace_classes("a", {"rocm-isolation.io/class": "inference"}).default == "training"


def test_a_name_in_two_rules_falls_through_to_the_second_when_the_first_needs_labels() -> None:
    text = HEAD + (
        "spec:\n  classes: {inference: {placement: reserved}, training: {placement: unreserved}}\n"
        "  namespaces:\n"
        "    - {match: {names: [serving], labels: {tier: gold}}, allowedClasses: [inference]}\n"
        "    - {match: {names: [serving, a.b]}, allowedClasses: [training, inference]}\n"
    )
    policy = parse_policy(text)
    assert policy.namespace_classes("serving", {"tier": "gold"}).source == "policy rule namespaces[0]"
    assert policy.namespace_classes("serving", {}).allowed == ("training", "inference")
    assert policy.namespace_classes("a.b", {}).source == "policy rule namespaces[1]"
    assert policy.namespace_classes("axb", {}).source == "the policy's defaultClass"  # '.' is not a glob


def test_docs_complete_example_is_the_good_full_fixture_and_loads_cleanly() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "policy.md").read_text(encoding="utf-8")
    example = docs.split("## Complete example", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    fixture = POLICIES / "good-full.yaml"
    assert example == fixture.read_text(encoding="utf-8")
    policy = load_policy(fixture)
    assert policy.warnings == ()
    assert policy.name == "mi300x-cluster"
    assert set(policy.spec.classes) == {"inference", "training", "debug"}
    aliases = policy.spec.classes["inference"].node_selector_requirements[1]
    assert aliases.key_aliases == ["amd.com/gpu.compute-memory-partition"]
    assert policy.namespace_classes("serve-eu", None).allowed == ("inference",)
    assert policy.namespace_classes("x", {"team": "ml-platform"}).allowed == ("training", "inference", "debug")


def test_docs_list_every_rule_id() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "policy.md").read_text(encoding="utf-8")
    rules = [
        value
        for module in (engine, device_claims)
        for name, value in vars(module).items()
        if name.startswith(("RULE_", "DENY_")) and isinstance(value, str)
    ]
    assert len(set(rules)) == 17 + 6
    for rule in rules:
        assert f"| `{rule}` |" in docs, rule


def test_gpu_device_classes_match_names_and_globs() -> None:
    text = default_policy_text().replace(
        "gpuDeviceClasses: [gpu.amd.com, gpu.amd.com-*]", "gpuDeviceClasses: [gpu.amd.com, '*.gpu.example.com']"
    )
    policy = parse_policy(text)
    assert policy.gpu_device_classes("gpu.amd.com")
    assert policy.gpu_device_classes("mi300x.gpu.example.com")
    assert not policy.gpu_device_classes("gpu.example.com")
    assert not policy.gpu_device_classes("xgpu.amd.com")
    assert not policy.gpu_device_classes("rdma.example.com")


@pytest.mark.parametrize("name", ["", "GPU.amd.com", "gpu_amd", "-gpu.amd.com"])
def test_a_device_class_that_is_not_a_dns_subdomain_is_rejected(name: str) -> None:
    text = default_policy_text().replace(
        "gpuDeviceClasses: [gpu.amd.com, gpu.amd.com-*]", f"gpuDeviceClasses: ['{name}']"
    )
    with pytest.raises(PolicyError) as err:
        parse_policy(text)
    assert any("is not a DeviceClass name" in problem for problem in err.value.problems), err.value.problems


def test_a_spread_label_key_cannot_be_both_excluded_and_a_match_label_key() -> None:
    text = default_policy_text().replace(
        "      - apps.kubernetes.io/pod-index\n", "      - apps.kubernetes.io/pod-index\n      - job-name\n"
    )
    with pytest.raises(PolicyError) as err:
        parse_policy(text)
    assert any("job-name: a key is either excluded or a matchLabelKey" in p for p in err.value.problems), (
        err.value.problems
    )


def test_amds_autopartition_class_is_a_gpu_class_by_default() -> None:
    """The backstop cannot read DeviceClasses: AMD's gpu.amd.com-spx (AutoPartition's whole-GPU class) must be
    known by name, or a training pod asking for its implicit resource name passes with the webhook down."""
    policy = default_policy()
    assert policy.gpu_device_classes("gpu.amd.com-spx") and policy.gpu_device_classes("gpu.amd.com")
    assert not policy.gpu_device_classes("gpu.amd.comx")


def test_gpu_metrics_is_optional_with_safe_defaults_and_checked_when_given() -> None:
    metrics = default_policy().spec.gpu_metrics
    assert (metrics.activity_percent, metrics.window_seconds, metrics.temperature_celsius) == (20.0, 300, 95.0)
    assert metrics.inference_load_percent == 40.0
    text = default_policy_text().replace(
        "spec:\n", "spec:\n  gpuMetrics:\n    temperatureCelsius: 85\n    vramMB: 512\n", 1
    )
    given = parse_policy(text).spec.gpu_metrics
    assert (given.temperature_celsius, given.vram_mb, given.activity_percent) == (85.0, 512.0, 20.0)
    with pytest.raises(PolicyError) as err:
        parse_policy(default_policy_text().replace("spec:\n", "spec:\n  gpuMetrics:\n    activityPercent: 0\n", 1))
    assert any(p.startswith("spec.gpuMetrics.activityPercent") for p in err.value.problems), err.value.problems
