"""``rocm-isolation-webhook mutate``: the offline dry run, run as a subprocess on real manifests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from webhook.offline.manifest_yaml import load_go
from webhook.offline.outcomes import prefixed

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dryrun"
POOL = "rocm-isolation.io/pool"
CLASS = "rocm-isolation.io/class"
TEMPLATE_PATHS = {
    "Pod": (),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


class K8sLoader(yaml.SafeLoader):
    """Timestamps stay strings, as Kubernetes reads YAML."""


K8sLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def mutate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", "mutate", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def load_all(text: str) -> list[Any]:
    return [doc for doc in yaml.load_all(text, Loader=K8sLoader) if doc is not None]


def pod_of(obj: Mapping[str, Any]) -> Any:
    node: Any = obj
    for token in TEMPLATE_PATHS[obj["kind"]]:
        node = node[token]
    return node


def gpu_containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for name in ("initContainers", "containers"):
        for container in pod["spec"].get(name, []):
            limits = container.get("resources", {}).get("limits", {})
            if any(key.startswith("amd.com/") for key in limits):
                yield container


def terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    affinity = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    result: list[Mapping[str, Any]] = affinity["nodeSelectorTerms"]
    return result


def stderr_lines(result: subprocess.CompletedProcess[str], marker: str) -> list[str]:
    return [line for line in result.stderr.splitlines() if marker in line]


def test_every_workload_kind_is_mutated_in_place_and_stays_valid() -> None:
    source = load_all((FIXTURES / "workloads.yaml").read_text())
    result = mutate("-f", fixture("workloads.yaml"))

    assert result.returncode == 0, result.stderr
    out = load_all(result.stdout)
    assert [o["kind"] for o in out] == [s["kind"] for s in source] == list(TEMPLATE_PATHS)
    assert [o["metadata"]["name"] for o in out] == [s["metadata"]["name"] for s in source]
    for obj in out:
        pod = pod_of(obj)
        assert pod["metadata"]["annotations"][CLASS] == "training", obj["kind"]
        for term in terms(pod):
            assert {"key": POOL, "operator": "NotIn", "values": ["inference"]} in term["matchExpressions"], obj["kind"]
        containers = list(gpu_containers(pod))
        assert containers, obj["kind"]
        for container in containers:
            assert {"name": "HSA_QUEUE_PRIORITY", "value": "low"} in container["env"], obj["kind"]
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    by_kind = {o["kind"]: o for o in out}
    # The DaemonSet's matchFields pin stays, and the NotIn goes into the same term (not a new ORed one).
    (daemon_term,) = terms(pod_of(by_kind["DaemonSet"]))
    assert daemon_term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-7"]}]
    # Both ORed StatefulSet terms got the requirement, and the training pod may not keep priority high.
    assert len(terms(pod_of(by_kind["StatefulSet"]))) == 2
    assert pod_of(by_kind["StatefulSet"])["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
    assert pod_of(by_kind["Deployment"])["spec"]["containers"][0]["env"] == [
        {"name": "HSA_QUEUE_PRIORITY", "value": "low"}
    ]
    # Workload-level metadata is untouched: only the pod template is mutated.
    for before, after in zip(source[1:], out[1:], strict=True):
        assert after["metadata"] == before["metadata"], after["kind"]
    lines = stderr_lines(result, ": mutated: class training")
    assert len(lines) == 7
    assert "workloads.yaml: document 7: CronJob/ml-training/nightly-eval: mutated" in lines[-1]


def test_an_admitted_and_a_denied_object_exit_1_and_the_denied_one_is_printed_unchanged() -> None:
    source = load_all((FIXTURES / "mixed.yaml").read_text())
    result = mutate("-f", fixture("mixed.yaml"))

    assert result.returncode == 1
    out = load_all(result.stdout)
    assert len(out) == 2
    assert out[0]["metadata"]["annotations"][CLASS] == "training"
    assert out[1] == source[1]
    (denial,) = stderr_lines(result, "denied")
    assert "document 2: Deployment/default/sneaky-trainer: denied [deny-node-selector]" in denial
    assert "spec.nodeSelector" in denial and "spec.template" in denial
    assert "rocm-isolation.io/class=inference" in denial


def test_bad_yaml_exits_2_naming_the_file_the_document_and_the_line() -> None:
    result = mutate("-f", fixture("bad.yaml"))

    assert result.returncode == 2
    assert result.stdout == ""
    assert "bad.yaml: document 3: not valid YAML:" in result.stderr
    assert "line 18" in result.stderr


def test_unknown_kinds_and_non_gpu_pods_pass_through_as_they_are() -> None:
    source = load_all((FIXTURES / "passthrough.yaml").read_text())
    result = mutate("-f", fixture("passthrough.yaml"))

    assert result.returncode == 0, result.stderr
    out = load_all(result.stdout)
    assert out == source
    # Nothing changed, so the output is the input byte for byte (comments, the block scalar, quoting).
    assert result.stdout == (FIXTURES / "passthrough.yaml").read_text()
    # Read the way kubectl reads it (go-yaml v2), the unquoted timestamp and "yes" are the same strings.
    plain = [doc for doc in load_go(result.stdout) if doc]
    assert plain[0]["metadata"]["annotations"]["built"] == "2024-05-01T10:00:00Z"
    assert plain[0]["data"]["enabled"] == "yes"
    notes = stderr_lines(result, "passed through")
    assert len(notes) == 3
    assert "ConfigMap/ml-training/trainer-config" in notes[0]
    assert "v1 ServiceAccount" in notes[1]
    assert "example.com/v1 Job" in notes[2]
    (gpu,) = stderr_lines(result, "a GPU request at")
    assert "spec.template.spec.containers[0].resources.limits[amd.com/gpu]" in gpu
    assert stderr_lines(result, "Pod/ml-training/web: unchanged: the pod reaches no GPU by any route")


def test_a_bad_policy_exits_2_naming_the_file_and_the_field(tmp_path: Path) -> None:
    result = mutate("-f", fixture("mixed.yaml"), "--policy", fixture("bad-policy.yaml"))

    assert result.returncode == 2
    assert result.stdout == ""
    assert "bad-policy.yaml: invalid policy" in result.stderr
    assert "spec.classes.training.placement" in result.stderr


def test_stdin_gives_the_same_answer_as_the_file() -> None:
    from_file = mutate("-f", fixture("mixed.yaml"))
    from_stdin = mutate("-f", "-", stdin=(FIXTURES / "mixed.yaml").read_text())

    assert from_stdin.returncode == from_file.returncode == 1
    assert from_stdin.stdout == from_file.stdout
    assert "<stdin>: document 2: Deployment/default/sneaky-trainer: denied" in from_stdin.stderr


def test_an_admission_review_has_its_request_object_mutated() -> None:
    result = mutate("-f", fixture("review.json"), "--namespace-label", f"{CLASS}=inference")

    assert result.returncode == 0, result.stderr
    (review,) = load_all(result.stdout)
    assert review["kind"] == "AdmissionReview"
    assert review["request"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    pod = review["request"]["object"]
    assert pod["metadata"]["annotations"][CLASS] == "inference"
    assert terms(pod) == [
        {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["inference", "inference-devices"]}]}
    ]
    assert {"key": "rocm-isolation.io/reserved", "operator": "Equal", "value": "inference", "effect": "NoSchedule"} in (
        pod["spec"]["tolerations"]
    )
    assert stderr_lines(result, "review.json: document 1: AdmissionReview/serving/llm-server-7d9c-: mutated")


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("workloads.yaml", []),
        ("mixed.yaml", []),
        ("namespaces.yaml", []),
        ("list.yaml", []),
        ("review.json", ["--namespace-label", f"{CLASS}=inference"]),
        ("device-reservation.yaml", []),
    ],
)
def test_the_patch_output_applied_with_jsonpatch_gives_the_manifests_output(name: str, extra: list[str]) -> None:
    source = [doc for doc in yaml.load_all((FIXTURES / name).read_text(), Loader=K8sLoader)]
    manifests = mutate("-f", fixture(name), *extra)
    patches = mutate("-f", fixture(name), "--output", "patch", *extra)

    assert patches.returncode == manifests.returncode
    entries = json.loads(patches.stdout)
    out = load_all(manifests.stdout)
    by_document: dict[int, Any] = {}
    for entry in entries:
        document = by_document.setdefault(entry["document"], source[entry["document"] - 1])
        assert entry["allowed"] or entry["patch"] == []
        if entry["podPath"] is not None:
            assert all(op["path"].startswith(entry["podPath"] + "/") for op in entry["patch"])
        if "item" in entry:
            document["items"][entry["item"]] = jsonpatch.apply_patch(document["items"][entry["item"]], entry["patch"])
        else:
            by_document[entry["document"]] = jsonpatch.apply_patch(document, entry["patch"])
    assert [by_document[number] for number in sorted(by_document)] == out
    assert any(entry["patch"] for entry in entries)


def test_patch_paths_are_relative_to_the_object_and_escaped() -> None:
    result = mutate("-f", fixture("workloads.yaml"), "-o", "patch")

    entries = {entry["kind"]: entry for entry in json.loads(result.stdout)}
    assert entries["CronJob"]["podPath"] == "/spec/jobTemplate/spec/template"
    sts_paths = [op["path"] for op in entries["StatefulSet"]["patch"]]
    assert "/spec/template/metadata/annotations/rocm-isolation.io~1class" in sts_paths
    assert (
        "/spec/template/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/1/matchExpressions/-"
        in sts_paths
    )
    # The Job's template has no metadata: the patch creates it in the same operation as the annotation.
    job_ops = {op["path"]: op for op in entries["Job"]["patch"]}
    assert job_ops["/spec/template/metadata"]["value"]["annotations"][CLASS] == "training"


def test_prefixed_patch_creates_a_missing_pod_template() -> None:
    pod_ops = [{"op": "add", "path": "/metadata", "value": {"annotations": {CLASS: "training"}}}]
    without_template = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1}}
    without_spec = {"apiVersion": "batch/v1", "kind": "CronJob"}

    patched = jsonpatch.apply_patch(without_template, prefixed(pod_ops, without_template, ("spec", "template")))
    cron_path = ("spec", "jobTemplate", "spec", "template")
    cron = jsonpatch.apply_patch(without_spec, prefixed(pod_ops, without_spec, cron_path))

    assert patched["spec"] == {"replicas": 1, "template": {"metadata": {"annotations": {CLASS: "training"}}}}
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"] == {CLASS: "training"}
    assert prefixed([], without_spec, cron_path) == []


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("workloads.yaml", []),
        ("namespaces.yaml", []),
        ("review.json", ["--namespace-label", f"{CLASS}=inference"]),
        ("device-reservation.yaml", []),
    ],
)
def test_running_on_its_own_output_changes_nothing(name: str, extra: list[str]) -> None:
    first = mutate("-f", fixture(name), *extra)
    second = mutate("-f", "-", *extra, stdin=first.stdout)
    again = mutate("-f", "-", "-o", "patch", *extra, stdin=first.stdout)

    assert first.returncode == second.returncode == 0, second.stderr
    assert stderr_lines(first, ": mutated:")
    assert load_all(second.stdout) == load_all(first.stdout)
    assert not stderr_lines(second, ": mutated:")
    entries = json.loads(again.stdout)
    assert entries and all(entry["patch"] == [] for entry in entries)


def test_namespace_label_decides_the_class() -> None:
    result = mutate("-f", fixture("mixed.yaml"), "--namespace-label", f"{CLASS}=inference")

    # In an inference namespace, selecting the reserved nodes is what the pod is supposed to do.
    assert result.returncode == 0, result.stderr
    good, sneaky = load_all(result.stdout)
    assert pod_of(good)["metadata"]["annotations"][CLASS] == "inference"
    assert terms(pod_of(sneaky)) == [
        {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["inference", "inference-devices"]}]}
    ]
    assert "labels unknown" not in result.stderr


def test_namespace_documents_in_the_stream_supply_labels() -> None:
    result = mutate("-f", fixture("namespaces.yaml"))

    assert result.returncode == 0, result.stderr
    out = load_all(result.stdout)
    assert [o["kind"] for o in out] == ["Namespace", "Namespace", "Deployment", "Pod"]
    server, notebook = pod_of(out[2]), pod_of(out[3])
    assert server["metadata"]["annotations"][CLASS] == "inference"
    assert server["spec"]["topologySpreadConstraints"][0]["labelSelector"] == {"matchLabels": {"app": "llm-server"}}
    assert notebook["metadata"]["annotations"][CLASS] == "training"
    # Both namespaces' labels were known (research has none), so no object is warned about them.
    assert "labels unknown" not in result.stderr
    assert len(stderr_lines(result, "passed through: its labels are used")) == 2


def test_namespace_label_option_overrides_namespace_documents() -> None:
    result = mutate("-f", fixture("namespaces.yaml"), "--namespace-label", f"{CLASS}=training")

    out = load_all(result.stdout)
    assert pod_of(out[2])["metadata"]["annotations"][CLASS] == "training"


def test_policy_warnings_are_printed_once_unless_quiet() -> None:
    unacknowledged = str(Path(__file__).parents[1] / "fixtures" / "policies" / "unacknowledged.yaml")
    loud = mutate("-f", fixture("workloads.yaml"), "--policy", unacknowledged)
    quiet = mutate("-f", fixture("workloads.yaml"), "--policy", unacknowledged, "--quiet")
    shipped = mutate("-f", fixture("workloads.yaml"))

    # The shipped policy acknowledges what it knowingly sets: it does not warn about itself.
    assert not [line for line in shipped.stderr.splitlines() if line.startswith("warning: spec.classes.")]

    policy_warnings = [line for line in loud.stderr.splitlines() if line.startswith("warning: spec.classes.")]
    assert len(policy_warnings) == 2
    assert all("HSA_QUEUE_PRIORITY" in line for line in policy_warnings)
    assert not [line for line in quiet.stderr.splitlines() if line.startswith("warning: spec.")]
    assert quiet.stdout == loud.stdout


def test_a_malformed_pod_template_is_denied_not_crashed() -> None:
    manifest = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: broken\nspec:\n  template: [1, 2]\n"
    result = mutate("-f", "-", stdin=manifest)

    assert result.returncode == 1
    assert "Deployment/default/broken: denied [malformed-pod]" in result.stderr
    assert "spec.template must be an object" in result.stderr


def test_a_document_that_is_not_an_object_exits_2() -> None:
    result = mutate("-f", "-", stdin="apiVersion: v1\nkind: Pod\n---\n- just\n- a list\n")

    assert result.returncode == 2
    assert "<stdin>: document 2: not a Kubernetes object" in result.stderr


def test_reserved_node_names_make_node_name_checkable() -> None:
    manifest = (
        (FIXTURES / "mixed.yaml").read_text().split("---")[0].replace("spec:\n", "spec:\n  nodeName: mi300x-7\n", 1)
    )
    unknown = mutate("-f", "-", stdin=manifest)
    reserved = mutate("-f", "-", "--reserved-node", "mi300x-7", "--reserved-node", "mi300x-8", stdin=manifest)

    assert unknown.returncode == 0
    assert "spec.nodeName mi300x-7 could not be checked" in unknown.stderr
    assert reserved.returncode == 1
    assert "denied [deny-node-name]" in reserved.stderr


def test_every_gpu_route_is_decided_offline_as_in_the_cluster() -> None:
    """The catalogue in the dry run: a privileged container and the AMD runtime's variable make GPU
    pods (placed as training), a DeviceClass of AMD's driver in the input makes its extendedResourceName a
    GPU resource (the pod aimed at the reserved nodes is denied), and an unknown kind reaching GPUs is
    reported as uncovered."""
    result = mutate("-f", fixture("gpu-routes.yaml"))
    assert result.returncode == 1, result.stderr
    out = {doc["metadata"]["name"]: doc for doc in load_all(result.stdout)}
    for name in ("gpu-peek", "runtime-gpus"):
        pod = pod_of(out[name])
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [
            {"matchExpressions": [{"key": POOL, "operator": "NotIn", "values": ["inference"]}]}
        ]
        assert pod["metadata"]["annotations"][CLASS] == "training"
        kubernetes_validate.validate(out[name], "1.37.0", strict=True)
    assert stderr_lines(result, "securityContext.privileged: a privileged container sees every GPU of its node")
    assert stderr_lines(result, "env[0](AMD_VISIBLE_DEVICES)")
    (denied,) = stderr_lines(result, "Pod/research/extended-on-reserved: denied")
    assert "spec.nodeSelector selects rocm-isolation.io/pool=inference" in denied
    privileged, runtime = stderr_lines(result, "a GPU request at")
    assert "spec.worker.securityContext.privileged" in privileged
    assert "spec.worker.env[0](DOCKER_RESOURCE_GPU)" in runtime
    assert stderr_lines(result, "DeviceClass/big-gpus: passed through: used to tell which DeviceClasses hand out GPUs")


def test_without_the_device_class_its_extended_resource_is_no_gpu() -> None:
    text = (FIXTURES / "gpu-routes.yaml").read_text()
    documents = text.split("\n---\n")
    without = "\n---\n".join(doc for doc in documents if "kind: DeviceClass" not in doc)
    result = mutate("-f", "-", stdin=without)
    assert result.returncode == 0, result.stderr
    assert stderr_lines(result, "Pod/research/extended-on-reserved: unchanged")


# --- device-level reservation: claims shown as they will be admitted -------------------------------

RESERVED_CLASS, SHARED_CLASS = "rocm-isolation-reserved", "rocm-isolation-shared"
IMPLICIT = "deviceclass.resource.kubernetes.io/"


def _by_name(text: str) -> dict[str, Any]:
    return {doc["metadata"]["name"]: doc for doc in load_all(text)}


def _without_device_classes(name: str) -> str:
    documents = (FIXTURES / name).read_text().split("\n---\n")
    return "\n---\n".join(doc for doc in documents if "kind: DeviceClass" not in doc)


def test_claims_and_pods_are_shown_steered_while_the_reserved_device_class_is_active() -> None:
    """The input holds the reserved DeviceClass labelled active: inference claims point at the reserved
    class, training ones at the shared class (firstAvailable entries each, the NIC left alone), an
    inference pod's amd.com/gpu and a training init container's implicit name of gpu.amd.com are rewritten,
    and every object printed is valid Kubernetes 1.37."""
    result = mutate("-f", fixture("device-reservation.yaml"))

    assert result.returncode == 0, result.stderr
    out = _by_name(result.stdout)
    llm = out["llm-gpu"]["spec"]["spec"]["devices"]["requests"]
    toleration = {"key": "rocm-isolation.io/reserved-device", "operator": "Exists", "effect": "NoSchedule"}
    assert llm == [
        {"name": "gpu", "exactly": {"deviceClassName": RESERVED_CLASS, "count": 2, "tolerations": [toleration]}}
    ]
    assert out["llm-gpu"]["metadata"]["annotations"] == {CLASS: "inference"}
    trainer = out["trainer-gpus"]["spec"]["spec"]["devices"]["requests"]
    assert [r["exactly"]["deviceClassName"] for r in trainer] == [SHARED_CLASS, "nic.example.com"]
    assert [s["deviceClassName"] for s in out["any-gpu"]["spec"]["devices"]["requests"][0]["firstAvailable"]] == [
        SHARED_CLASS,
        SHARED_CLASS,
    ]
    server = pod_of(out["llm-server"])["spec"]["containers"][0]
    assert server["resources"]["limits"] == {IMPLICIT + RESERVED_CLASS: "1"}
    job = pod_of(out["finetune"])["spec"]
    assert job["initContainers"][0]["resources"]["limits"] == {IMPLICIT + SHARED_CLASS: "1"}
    # amd.com/gpu is the shared class's extendedResourceName: a training pod keeps it.
    assert job["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "2"}
    for obj in out.values():
        kubernetes_validate.validate(obj, "1.37.0", strict=True)

    (inference,) = stderr_lines(result, "ResourceClaimTemplate/serving/llm-gpu: mutated: class inference:")
    assert "spec.spec.devices.requests[0].exactly.deviceClassName: gpu.amd.com -> rocm-isolation-reserved" in inference
    assert stderr_lines(result, "ResourceClaim/research/any-gpu: mutated: class training:")
    assert stderr_lines(result, "it says a device-level reservation is active")
    # The v1beta1 claim: said plainly, printed as it came.
    (old,) = stderr_lines(result, "ResourceClaim/research/old-shape: passed through: not decided")
    assert "converts this resource.k8s.io/v1beta1 object" in old and "write it as resource.k8s.io/v1" in old
    assert out["old-shape"] == _by_name((FIXTURES / "device-reservation.yaml").read_text())["old-shape"]
    (unchecked,) = stderr_lines(
        result, "a GPU request at spec.devices.requests (gpu.amd.com), in a resource.k8s.io/v1beta1"
    )
    assert "--strict" in unchecked
    assert mutate("-f", fixture("device-reservation.yaml"), "--strict").returncode == 1


def test_the_flag_assumes_the_reservation_the_input_does_not_hold() -> None:
    """Without the DeviceClass documents nothing says a reservation is active: claims are passed through and
    pods keep their names. --device-reservation-active gives what the active DeviceClass gives."""
    text = _without_device_classes("device-reservation.yaml")
    unaware = mutate("-f", "-", stdin=text)
    assumed = mutate("-f", "-", "--device-reservation-active", stdin=text)
    with_classes = mutate("-f", fixture("device-reservation.yaml"))

    assert unaware.returncode == assumed.returncode == 0, assumed.stderr
    plain = _by_name(unaware.stdout)
    assert plain["llm-gpu"] == _by_name(text)["llm-gpu"]
    assert pod_of(plain["llm-server"])["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "1"}
    assert len(stderr_lines(unaware, "passed through: used to resolve the resource claims")) == 4
    steered = _by_name(assumed.stdout)
    assert steered == {name: doc for name, doc in _by_name(with_classes.stdout).items() if doc["kind"] != "DeviceClass"}


def test_a_released_reservation_changes_no_claim_unless_the_flag_says_otherwise() -> None:
    text = (
        (FIXTURES / "device-reservation.yaml")
        .read_text()
        .replace("rocm-isolation.io/device-reservation: active", "rocm-isolation.io/device-reservation: released")
    )
    released = mutate("-f", "-", stdin=text)
    assumed = mutate("-f", "-", "--device-reservation-active", stdin=text)

    assert released.returncode == 0, released.stderr
    assert _by_name(released.stdout)["trainer-gpus"] == _by_name(text)["trainer-gpus"]
    assert stderr_lines(released, "it says no device-level reservation is active")
    assert (
        _by_name(assumed.stdout)["trainer-gpus"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        == SHARED_CLASS
    )
    assert stderr_lines(assumed, "(assumed active: --device-reservation-active)")


DENIED_CLAIMS = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: sneaky, namespace: research}
spec:
  devices:
    requests:
      - name: gpu
        firstAvailable:
          - {name: reserved, deviceClassName: rocm-isolation-reserved}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: fine, namespace: research}
spec:
  spec:
    devices:
      requests:
        - {name: gpu, exactly: {deviceClassName: gpu.amd.com}}
---
apiVersion: v1
kind: Pod
metadata: {name: direct, namespace: research}
spec:
  containers:
    - name: trainer
      image: rocm/pytorch:latest
      resources: {limits: {deviceclass.resource.kubernetes.io/rocm-isolation-reserved: "1"}}
"""


def test_a_denied_claim_exits_1_and_is_reported_like_a_denied_pod() -> None:
    flags = ("--device-reservation-active", "--namespace-label", f"{CLASS}=training")
    result = mutate("-f", "-", *flags, stdin=DENIED_CLAIMS)
    patches = mutate("-f", "-", *flags, "-o", "patch", stdin=DENIED_CLAIMS)

    assert result.returncode == patches.returncode == 1
    sneaky, fine, pod = load_all(result.stdout)
    assert sneaky == load_all(DENIED_CLAIMS)[0], "a denied object is printed as it came"
    assert fine["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == SHARED_CLASS
    assert pod == load_all(DENIED_CLAIMS)[2]
    (claim,) = stderr_lines(
        result, "<stdin>: document 1: ResourceClaim/research/sneaky: denied [deny-reserved-device-class]:"
    )
    assert "spec.devices.requests[0].firstAvailable[0].deviceClassName: DeviceClass rocm-isolation-reserved" in claim
    assert stderr_lines(result, "<stdin>: document 3: Pod/research/direct: denied [deny-reserved-devices]")

    entries = json.loads(patches.stdout)
    assert [(e["kind"], e["allowed"], e["rule"], e["podPath"]) for e in entries] == [
        ("ResourceClaim", False, "deny-reserved-device-class", None),
        ("ResourceClaimTemplate", True, "mutated", None),
        ("Pod", False, "deny-reserved-devices", ""),
    ]
    assert entries[0]["patch"] == []
    assert jsonpatch.apply_patch(load_all(DENIED_CLAIMS)[1], entries[1]["patch"]) == fine


def test_warn_and_audit_modes_apply_to_claims_as_to_pods() -> None:
    flags = ("-f", "-", "--device-reservation-active", "--namespace-label", f"{CLASS}=training", "--namespace-label")
    warn = mutate(*flags, "rocm-isolation.io/mode=warn", stdin=DENIED_CLAIMS)
    audit = mutate(*flags, "rocm-isolation.io/mode=audit", stdin=DENIED_CLAIMS)

    assert warn.returncode == audit.returncode == 0, warn.stderr
    assert stderr_lines(warn, "ResourceClaim/research/sneaky: unchanged:")
    assert stderr_lines(warn, "warning: would be denied in enforce mode: spec.devices.requests[0]")
    # Audit: nothing changed at all, the would-be denial said.
    assert load_all(audit.stdout) == load_all(DENIED_CLAIMS)
    assert stderr_lines(audit, "ResourceClaim/research/sneaky: unchanged: audit mode: nothing changed; would deny:")


def test_claims_in_unlabelled_namespaces_are_named_in_the_one_warning() -> None:
    claim = DENIED_CLAIMS.split("---\n")[1].replace("namespace: research", "namespace: lonely")
    result = mutate("-f", "-", "--device-reservation-active", stdin=claim)

    assert result.returncode == 0, result.stderr
    assert stderr_lines(result, "warning: namespace labels not given for lonely")
    assert not stderr_lines(result, "  warning: namespace lonely")


def test_mutate_shows_a_borrower_as_the_cluster_admits_it_and_says_why_another_is_not_one() -> None:
    """Lending on: the dry run runs the same decide() as the webhook. The Job of the namespace that may borrow
    gets the borrower's placement (the reserved toleration, the preference for shared nodes, the three priority
    fields, the capped grace period); the same Job where the namespace may not borrow is placed off the
    reserved nodes, with a warning saying why."""
    policy = str(Path(__file__).parents[1] / "fixtures" / "policies" / "engine-lending.yaml")
    result = mutate("-f", fixture("lending.yaml"), "--policy", policy)

    assert result.returncode == 0, result.stderr
    _, _, allowed, refused = load_all(result.stdout)
    borrower = pod_of(allowed)
    assert borrower["spec"]["priorityClassName"] == "rocm-isolation-borrower"
    assert borrower["spec"]["priority"] == -100 and borrower["spec"]["preemptionPolicy"] == "Never"
    assert borrower["spec"]["terminationGracePeriodSeconds"] == 30
    assert borrower["spec"]["tolerations"][0]["key"] == "rocm-isolation.io/reserved"
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in borrower["spec"]["affinity"]["nodeAffinity"]
    plain = pod_of(refused)
    assert "priorityClassName" not in plain["spec"] and "tolerations" not in plain["spec"]
    assert terms(plain) == [{"matchExpressions": [{"key": POOL, "operator": "NotIn", "values": ["inference"]}]}]
    assert "namespace sandbox may not borrow" in result.stderr
