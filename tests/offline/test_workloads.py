"""Workload CRDs in the dry run: every pod template of Kubeflow, Trainer, JobSet, LWS, KubeRay, KServe, Volcano,
Kaiwo, AIBrix and vLLM production stack objects is decided and mutated (``webhook/offline/workloads.py``), run through the real CLI on manifests
written from each project's API reference (tests/fixtures/dryrun/crds, the reference cited in each).

Each mutated pod template is validated (kubernetes_validate, Kubernetes 1.37, strict) as the core
PodTemplate or Pod it becomes. Trainer and JobSet objects are also checked whole against Kubeflow's
published API models (PyPI kubeflow-trainer-api); the other projects publish no installable schema
that fits the dev environment (KServe's SDK pulls a model server, the Training Operator SDK pins an
older kubernetes client), so their objects' own fields are checked only by reading the reference; the
Kaiwo, LLMInferenceService, AIBrix and VLLMRuntime objects are checked whole, before and after, against a JSON
Schema written from those projects' Go API types (tests/fixtures/schemas/dryrun-workloads.yaml)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import crd_models
import jsonpatch
import jsonschema
import kubernetes_validate
import pytest
import strategies as S
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubeflow_trainer_api.models import (
    JobsetV1alpha2JobSet,
    TrainerV1alpha1ClusterTrainingRuntime,
    TrainerV1alpha1TrainingRuntime,
    TrainerV1alpha1TrainJob,
)
from pydantic import BaseModel
from test_dryrun import CLASS, POOL, load_all, mutate, stderr_lines

from webhook.core.decision import NodeFacts
from webhook.core.engine import PLACED_LABEL
from webhook.core.policy import default_policy
from webhook.offline import documents, outcomes, workloads

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "dryrun" / "crds"
K8S = "1.37.0"
NOT_IN = {"key": POOL, "operator": "NotIn", "values": ["inference"]}
IN = {"key": POOL, "operator": "In", "values": ["inference", "inference-devices"]}
LOW = {"name": "HSA_QUEUE_PRIORITY", "value": "low"}
HIGH = {"name": "HSA_QUEUE_PRIORITY", "value": "high"}

# fixture -> object name -> (class, the GPU templates that are mutated, the templates left as they are)
TEMPLATE_FIXTURES: dict[str, dict[str, tuple[str, list[str], list[str]]]] = {
    "pytorchjob.yaml": {
        "llama-finetune": (
            "training",
            ["spec.pytorchReplicaSpecs.Master.template", "spec.pytorchReplicaSpecs.Worker.template"],
            [],
        )
    },
    "tfjob-paddlejob.yaml": {
        "resnet": (
            "training",
            ["spec.tfReplicaSpecs.Chief.template", "spec.tfReplicaSpecs.Worker.template"],
            ["spec.tfReplicaSpecs.PS.template"],
        ),
        "ernie": ("training", ["spec.paddleReplicaSpecs.Worker.template"], []),
    },
    "mpijob.yaml": {
        name: ("training", ["spec.mpiReplicaSpecs.Worker.template"], ["spec.mpiReplicaSpecs.Launcher.template"])
        for name in ("allreduce-v1", "allreduce-v2")
    },
    "trainer.yaml": {
        "torch-distributed-rocm": ("training", ["spec.template.spec.replicatedJobs.0.template.spec.template"], []),
        "torch-with-initializer": (
            "training",
            ["spec.template.spec.replicatedJobs.1.template.spec.template"],
            ["spec.template.spec.replicatedJobs.0.template.spec.template"],
        ),
        # TrainJob overrides are checked, never mutated (docs/workloads.md).
        "finetune-overrides": ("training", [], ["spec.podTemplateOverrides.0"]),
        "finetune-patches": ("training", [], ["spec.runtimePatches.0"]),
    },
    "jobset.yaml": {
        "llama-pretrain": (
            "training",
            ["spec.replicatedJobs.1.template.spec.template"],
            ["spec.replicatedJobs.0.template.spec.template"],
        )
    },
    "leaderworkerset.yaml": {
        "vllm": (
            "inference",
            ["spec.leaderWorkerTemplate.leaderTemplate", "spec.leaderWorkerTemplate.workerTemplate"],
            [],
        )
    },
    "ray.yaml": {
        "raycluster-train": ("training", ["spec.workerGroupSpecs.0.template"], ["spec.headGroupSpec.template"]),
        "rayjob-tune": (
            "training",
            ["spec.rayClusterSpec.headGroupSpec.template", "spec.rayClusterSpec.workerGroupSpecs.0.template"],
            ["spec.submitterPodTemplate"],
        ),
        "llm-serve": (
            "inference",
            ["spec.rayClusterConfig.workerGroupSpecs.0.template"],
            ["spec.rayClusterConfig.headGroupSpec.template"],
        ),
    },
    "volcano.yaml": {
        "mpi-allreduce": ("training", ["spec.tasks.1.template"], ["spec.tasks.0.template"]),
    },
    "aibrix.yaml": {
        "qwen-pd": (
            "inference",
            ["spec.template.spec.roles.1.template", "spec.template.spec.roles.2.template"],
            ["spec.template.spec.roles.0.template"],
        ),
        # An inference-serving kind in a training namespace: the namespace decides, as for any pod.
        "qwen-ray": (
            "training",
            ["spec.template.spec.workerGroupSpecs.0.template"],
            ["spec.template.spec.headGroupSpec.template"],
        ),
    },
}
ALL_FIXTURES = sorted(p.name for p in CRDS.glob("*.yaml"))
ADMITTED = [name for name in ALL_FIXTURES if "reserved" not in name]


def at(obj: Any, dotted: str) -> Any:
    node = obj
    for token in dotted.split("."):
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def crd(name: str) -> str:
    return str(CRDS / name)


def as_pod_template(template: dict[str, Any]) -> dict[str, Any]:
    """A template as the core PodTemplate object (how kubernetes_validate reads a PodTemplateSpec)."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}


def required_terms(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = pod_spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms


def gpu_containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod_spec["containers"] if "amd.com/gpu" in c.get("resources", {}).get("limits", {})]


@pytest.mark.parametrize("fixture", sorted(TEMPLATE_FIXTURES))
def test_every_pod_template_of_a_crd_is_mutated_and_stays_a_valid_pod_template(fixture: str) -> None:
    source = {doc["metadata"]["name"]: doc for doc in load_all((CRDS / fixture).read_text())}
    result = mutate("-f", crd(fixture))

    assert result.returncode == 0, result.stderr
    out = {doc["metadata"]["name"]: doc for doc in load_all(result.stdout)}
    assert list(out) == list(source)
    for name, (cls, mutated, untouched) in TEMPLATE_FIXTURES[fixture].items():
        for dotted in mutated:
            template = at(out[name], dotted)
            assert template["metadata"]["annotations"][CLASS] == cls, (name, dotted)
            for term in required_terms(template["spec"]):
                assert (NOT_IN if cls == "training" else IN) in term["matchExpressions"], (name, dotted)
            containers = gpu_containers(template["spec"])
            assert containers, (name, dotted)
            for container in containers:
                assert (LOW if cls == "training" else HIGH) in container["env"], (name, dotted)
            kubernetes_validate.validate(as_pod_template(template), K8S, strict=True)
        for dotted in untouched:
            assert at(out[name], dotted) == at(source[name], dotted), (name, dotted)
        # Only pod templates change: the object's own metadata and other fields stay as written.
        assert out[name]["metadata"] == source[name]["metadata"]


TRAINER_MODELS: dict[str, type[BaseModel]] = {
    "JobSet": JobsetV1alpha2JobSet,
    "TrainingRuntime": TrainerV1alpha1TrainingRuntime,
    "ClusterTrainingRuntime": TrainerV1alpha1ClusterTrainingRuntime,
    "TrainJob": TrainerV1alpha1TrainJob,
}


@pytest.mark.parametrize("fixture", ["trainer.yaml", "jobset.yaml"])
def test_trainer_and_jobset_objects_match_the_published_api_models_before_and_after(fixture: str) -> None:
    result = mutate("-f", crd(fixture))

    assert result.returncode == 0, result.stderr
    pairs = zip(load_all((CRDS / fixture).read_text()), load_all(result.stdout), strict=True)
    checked = 0
    for before, after in pairs:
        if "podTemplateOverrides" in before.get("spec", {}):
            continue  # the Trainer v2.0/v2.1 field, gone from the current models
        model = TRAINER_MODELS[before["kind"]]
        assert crd_models.problems(model, before) == [], before["metadata"]["name"]
        assert crd_models.problems(model, after) == [], after["metadata"]["name"]
        checked += 1
    assert checked == (3 if fixture == "trainer.yaml" else 1)


def test_the_model_check_catches_a_misspelt_field_and_a_wrong_type() -> None:
    jobset = load_all((CRDS / "jobset.yaml").read_text())[0]
    jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["nodeSelecter"] = {"a": "b"}

    assert crd_models.problems(JobsetV1alpha2JobSet, jobset) == [
        "spec.replicatedJobs[1].template.spec.template.spec.nodeSelecter: unknown field"
    ]
    jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"].pop("nodeSelecter")
    jobset["spec"]["replicatedJobs"][0]["replicas"] = "two"
    (wrong_type,) = crd_models.problems(JobsetV1alpha2JobSet, jobset)
    assert "replicas" in wrong_type and "valid integer" in wrong_type


def test_stderr_names_each_template_of_the_object() -> None:
    result = mutate("-f", crd("ray.yaml"))

    (head,) = stderr_lines(result, "RayCluster/ml-training/raycluster-train head template: unchanged: the pod ")
    assert "no GPU" in head
    assert "RayCluster/ml-training/raycluster-train worker group mi300x template: mutated: class training" in (
        result.stderr
    )
    assert "RayJob/ml-training/rayjob-tune submitter template: unchanged" in result.stderr
    assert "RayService/ray-serving/llm-serve worker group gpu template: mutated: class inference" in result.stderr
    volcano = mutate("-f", crd("volcano.yaml"))
    # Volcano's Job is spelled the way kubectl does, so it cannot be taken for a batch/v1 Job.
    assert "Job.batch.volcano.sh/ml-training/mpi-allreduce task mpiworker template: mutated" in volcano.stderr


def test_a_pytorchjob_asking_for_the_reserved_nodes_is_denied_naming_the_template() -> None:
    source = load_all((CRDS / "pytorchjob-reserved.yaml").read_text())
    result = mutate("-f", crd("pytorchjob-reserved.yaml"))

    assert result.returncode == 1
    assert load_all(result.stdout) == source  # printed unchanged, the stream stays aligned with the input
    (denial,) = stderr_lines(result, "denied [")
    assert "PyTorchJob/ml-training/sneaky-finetune Worker template: denied [deny-node-selector]" in denial
    assert "(fields are relative to spec.pytorchReplicaSpecs.Worker.template)" in denial
    assert "rocm-isolation.io/class=inference" in denial
    (master,) = stderr_lines(result, "Master template")
    assert "admitted, not printed (the object is denied)" in master
    entries = json.loads(mutate("-f", crd("pytorchjob-reserved.yaml"), "-o", "patch").stdout)
    (entry,) = entries
    assert entry["allowed"] is False and entry["patch"] == [] and entry["rule"] == "deny-node-selector"
    assert [(t["name"], t["allowed"]) for t in entry["templates"]] == [
        ("Master template", True),
        ("Worker template", False),
    ]


def test_a_trainjob_override_reaching_the_reserved_nodes_is_denied() -> None:
    result = mutate("-f", crd("trainjob-reserved.yaml"))

    assert result.returncode == 1
    (denial,) = stderr_lines(result, "denied [")
    assert "TrainJob/ml-training/sneaky-trainjob podTemplateOverrides[0]: denied [deny-node-selector]" in denial
    assert "spec.tolerations[0] tolerates rocm-isolation.io/reserved=inference:NoSchedule" in denial


def test_trainjob_overrides_are_checked_not_mutated() -> None:
    result = mutate("-f", crd("trainer.yaml"))

    assert result.returncode == 0, result.stderr
    lines = stderr_lines(result, "TrainJob/")
    assert len(lines) == 2
    assert all("unchanged: checked, class training: not mutated" in line for line in lines)


def test_an_inference_service_is_mutated_where_kserve_keeps_each_pod_field() -> None:
    source = load_all((CRDS / "inferenceservice.yaml").read_text())
    result = mutate("-f", crd("inferenceservice.yaml"))

    assert result.returncode == 0, result.stderr
    _, small, large = load_all(result.stdout)
    predictor = small["spec"]["predictor"]
    # Pod metadata is the component's labels/annotations; pod spec fields are inlined in the component.
    assert predictor["annotations"][CLASS] == "inference"
    assert required_terms(predictor) == [{"matchExpressions": [IN]}]
    assert predictor["tolerations"][0]["key"] == "example.com/dedicated"
    assert predictor["tolerations"][1]["key"] == "rocm-isolation.io/reserved"
    spread = predictor["topologySpreadConstraints"][0]
    assert spread["labelSelector"]["matchLabels"] == {
        "app": "llama3-8b",
        "serving.kserve.io/inferenceservice": "llama3-8b",
        "component": "predictor",
    }
    # predictor.model is the kserve-container (the GPU one); the sidecar in predictor.containers has no GPU.
    assert predictor["model"]["env"] == [HIGH]
    assert "env" not in predictor["containers"][0]
    assert small["spec"]["transformer"] == source[1]["spec"]["transformer"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": predictor["labels"], "annotations": predictor["annotations"]},
        "spec": {
            **{k: predictor[k] for k in ("serviceAccountName", "tolerations", "affinity", "topologySpreadConstraints")},
            "containers": [
                *predictor["containers"],
                {
                    "name": "kserve-container",
                    "image": "kserve/huggingfaceserver:latest",
                    **{k: predictor["model"][k] for k in ("args", "resources", "env")},
                },
            ],
        },
    }
    kubernetes_validate.validate(pod, K8S, strict=True)
    worker = large["spec"]["predictor"]["workerSpec"]
    assert worker["containers"][0]["env"] == [HIGH]
    assert required_terms(worker) == [{"matchExpressions": [IN]}]
    assert "annotations" not in worker  # a WorkerSpec has no metadata of its own
    assert large["spec"]["predictor"]["model"]["env"] == [HIGH]


@pytest.mark.parametrize("fixture", ALL_FIXTURES)
def test_the_patch_output_applied_to_each_object_gives_the_manifests_output(fixture: str) -> None:
    source = load_all((CRDS / fixture).read_text())
    manifests = mutate("-f", crd(fixture))
    patches = mutate("-f", crd(fixture), "-o", "patch")

    assert patches.returncode == manifests.returncode
    entries = json.loads(patches.stdout)
    assert len(entries) == len(source)  # one entry per object, all its templates' operations in it
    applied = [jsonpatch.apply_patch(doc, entry["patch"]) for doc, entry in zip(source, entries, strict=True)]
    assert applied == load_all(manifests.stdout)
    for entry in entries:
        for operation in entry["patch"]:
            assert any(operation["path"].startswith(t["podPath"] + "/") for t in entry.get("templates", [])), operation


@pytest.mark.parametrize("fixture", ADMITTED)
def test_running_on_its_own_output_changes_nothing(fixture: str) -> None:
    first = mutate("-f", crd(fixture))
    again = mutate("-f", "-", "-o", "patch", stdin=first.stdout)

    assert first.returncode == again.returncode == 0, again.stderr
    assert all(entry["patch"] == [] for entry in json.loads(again.stdout))


UNKNOWN_GPU = """\
apiVersion: example.com/v1
kind: TrainingThing
metadata:
  name: mystery
spec:
  workers:
    - name: a
      podSpec:
        containers:
          - name: x
            image: busybox
            resources:
              limits:
                amd.com/gpu: 1
---
apiVersion: example.com/v1
kind: ClaimThing
metadata:
  name: dra-mystery
spec:
  pod:
    resourceClaims:
      - name: gpu
        resourceClaimTemplateName: mi300x
"""


def test_a_gpu_request_in_an_unknown_kind_is_warned_about_and_strict_fails() -> None:
    relaxed = mutate("-f", "-", stdin=UNKNOWN_GPU)
    strict = mutate("-f", "-", "--strict", stdin=UNKNOWN_GPU)
    patches = json.loads(mutate("-f", "-", "-o", "patch", stdin=UNKNOWN_GPU).stdout)

    assert relaxed.returncode == 0
    assert strict.returncode == 1
    assert relaxed.stdout == strict.stdout
    warnings = [line for line in relaxed.stderr.splitlines() if "a GPU request at" in line]
    assert len(warnings) == 2
    assert "spec.workers[0].podSpec.containers[0].resources.limits[amd.com/gpu]" in warnings[0]
    assert "spec.pod.resourceClaims" in warnings[1]
    assert patches[0]["gpuRequests"] == ["spec.workers[0].podSpec.containers[0].resources.limits[amd.com/gpu]"]


def test_strict_passes_when_every_gpu_request_is_in_a_known_template() -> None:
    result = mutate("-f", crd("pytorchjob.yaml"), "--strict")

    assert result.returncode == 0, result.stderr


def test_namespace_labels_not_given_is_said_once_per_run() -> None:
    result = mutate("-f", crd("ray.yaml"), "-f", crd("pytorchjob.yaml"))

    lines = [line for line in result.stderr.splitlines() if "namespace labels not given" in line]
    assert lines == [
        "warning: namespace labels not given for ml-training (no --namespace-label, no Namespace document): the "
        "class comes from the namespace rules by name or the policy's defaultClass; label rules, the mode label "
        "and Pod Security labels were not checked"
    ]
    assert "labels unknown" not in result.stderr
    labelled = mutate("-f", crd("ray.yaml"), "--namespace-label", f"{CLASS}=training")
    assert "namespace labels not given" not in labelled.stderr


# --- Kaiwo, KServe LLMInferenceService, AIBrix, vLLM production stack ---------------------------------


def by_name(text: str) -> dict[str, Any]:
    return {doc["metadata"]["name"]: doc for doc in load_all(text)}


def as_pod(spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A core PodSpec (KServe's template/worker, a built pod) as the Pod kubernetes_validate reads."""
    metadata: dict[str, Any] = {"name": "p", **({"labels": labels} if labels else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def test_kaiwo_templates_get_the_gpus_of_the_common_fields() -> None:
    source = by_name((CRDS / "kaiwo.yaml").read_text())
    result = mutate("-f", crd("kaiwo.yaml"))

    assert result.returncode == 0, result.stderr
    out = by_name(result.stdout)
    # No embedded container asks for a GPU: Kaiwo's gpus/gpusPerReplica make them GPU pods, so they are mutated.
    job = out["llama-sft"]["spec"]["job"]["spec"]["template"]
    assert job["metadata"]["annotations"][CLASS] == "training"
    assert required_terms(job["spec"]) == [{"matchExpressions": [NOT_IN]}]
    assert job["spec"]["containers"][0]["env"] == [LOW]
    # The GPU request itself is Kaiwo's to write: it never reaches the output.
    assert "resources" not in job["spec"]["containers"][0]
    kubernetes_validate.validate(as_pod_template(job), K8S, strict=True)
    ray = out["ray-pretrain"]["spec"]["rayJob"]["spec"]["rayClusterSpec"]
    assert ray["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"] == [LOW]
    # Kaiwo gives the Ray head no GPU.
    head = source["ray-pretrain"]["spec"]["rayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert ray["headGroupSpec"] == head
    service = out["qwen-chat"]["spec"]["deployment"]["spec"]["template"]
    assert required_terms(service["spec"]) == [{"matchExpressions": [IN]}]
    assert service["spec"]["tolerations"][0]["key"] == "rocm-isolation.io/reserved"
    # Kaiwo labels its pods with the object's name (docs/reference/labels.md): the spread counts them.
    assert spread_of(service)["labelSelector"] == {
        "matchLabels": {"app": "qwen-chat", "kaiwo.silogen.ai/name": "qwen-chat"}
    }
    kubernetes_validate.validate(as_pod_template(service), K8S, strict=True)
    serve = out["ray-serve"]["spec"]["ray"]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]
    assert serve["spec"]["containers"][0]["env"] == [HIGH]
    # Nothing embedded: the pod Kaiwo generates is checked, and the object is printed as it was.
    assert out["quick-eval"] == source["quick-eval"]
    (generated,) = stderr_lines(result, "KaiwoJob/ml-training/quick-eval")
    assert "generated job pod: unchanged: checked, class training: not mutated" in generated


KAIWO_JOB = """\
apiVersion: kaiwo.silogen.ai/v1alpha1
kind: KaiwoJob
metadata:
  name: k
  namespace: ml-training
spec:
  {fields}
  job:
    spec:
      template:
        spec:
          containers:
            - name: trainer
              image: ghcr.io/silogen/rocm-ray:v0.8
"""


@pytest.mark.parametrize(
    ("fields", "gpu_pod"),
    [
        ("gpus: 2", True),
        ("gpusPerReplica: 1", True),
        ("gpus: 0", False),
        ("{gpus: 4, gpuVendor: nvidia}", False),
        ("{gpus: 4, gpuVendor: AMD}", True),
        ("user: someone", False),
    ],
)
def test_kaiwo_gpu_fields_decide_whether_the_embedded_template_is_a_gpu_pod(fields: str, gpu_pod: bool) -> None:
    manifest = KAIWO_JOB.format(fields=fields)
    if fields.startswith("{"):
        manifest = manifest.replace(f"  {fields}\n", "".join(f"  {f.strip()}\n" for f in fields[1:-1].split(",")))
    result = mutate("-f", "-", stdin=manifest)

    assert result.returncode == 0, result.stderr
    (line,) = stderr_lines(result, "KaiwoJob/ml-training/k job template")
    assert ("mutated: class training" in line) is gpu_pod, line
    assert ("unchanged" in line) is not gpu_pod, line


def test_kaiwo_workloads_reaching_for_the_inference_pool_are_denied() -> None:
    source = load_all((CRDS / "kaiwo-reserved.yaml").read_text())
    result = mutate("-f", crd("kaiwo-reserved.yaml"))

    assert result.returncode == 1
    assert load_all(result.stdout) == source
    labelled, selected = stderr_lines(result, "denied [")
    # podTemplateSpecLabels land on every pod Kaiwo makes: a pod label never grants a class.
    assert "KaiwoJob/ml-training/label-sneak generated job pod: denied [deny-class-not-allowed]" in labelled
    assert "KaiwoJob/ml-training/selector-sneak job template: denied [deny-node-selector]" in selected
    assert "(fields are relative to spec.job.spec.template)" in selected


def test_an_llm_inference_service_is_mutated_in_its_pod_specs() -> None:
    source = by_name((CRDS / "llminferenceservice.yaml").read_text())
    result = mutate("-f", crd("llminferenceservice.yaml"))

    assert result.returncode == 0, result.stderr
    out = by_name(result.stdout)
    single = out["llama3-8b"]["spec"]["template"]
    assert required_terms(single) == [{"matchExpressions": [IN]}]
    assert single["containers"][0]["env"] == [HIGH]
    # template is a core PodSpec: no metadata of its own, so no annotation is written there.
    assert set(single) == {"containers", "affinity", "tolerations", "topologySpreadConstraints"}
    assert spread_of({"spec": single})["labelSelector"]["matchLabels"] == {
        "app.kubernetes.io/component": "llminferenceservice-workload",
        "app.kubernetes.io/name": "llama3-8b",
        "app.kubernetes.io/part-of": "llminferenceservice",
    }
    assert out["llama3-8b"]["spec"]["router"] == source["llama3-8b"]["spec"]["router"]
    pd = out["deepseek-pd"]["spec"]
    components = {
        where: spread_of({"spec": spec})["labelSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for where, spec in (
            ("template", pd["template"]),
            ("worker", pd["worker"]),
            ("prefill", pd["prefill"]["template"]),
        )
    }
    # With a worker the pods are a LeaderWorkerSet's; prefill is a Deployment of its own.
    assert components == {
        "template": "llminferenceservice-workload-leader",
        "worker": "llminferenceservice-workload-worker",
        "prefill": "llminferenceservice-workload-prefill",
    }
    assert spread_of({"spec": pd["worker"]})["matchLabelKeys"] == ["controller-revision-hash"]
    assert spread_of({"spec": pd["prefill"]["template"]})["labelSelector"]["matchLabels"]["tier"] == "prefill"
    for spec in (single, pd["template"], pd["worker"], pd["prefill"]["template"]):
        kubernetes_validate.validate(as_pod(spec), K8S, strict=True)
    # Serving kind, training namespace: the namespace decides.
    training = out["eval-endpoint"]["spec"]["template"]
    assert required_terms(training) == [{"matchExpressions": [NOT_IN]}]
    assert training["containers"][0]["env"] == [LOW]


def test_a_vllm_runtime_is_checked_as_the_pod_its_operator_builds_and_never_written() -> None:
    source = load_all((CRDS / "vllmruntime.yaml").read_text())
    result = mutate("-f", crd("vllmruntime.yaml"))
    entries = json.loads(mutate("-f", crd("vllmruntime.yaml"), "-o", "patch").stdout)

    assert result.returncode == 0, result.stderr
    assert load_all(result.stdout) == source
    inference, training = stderr_lines(result, "deploymentConfig: unchanged: checked")
    assert "VLLMRuntime/vllm-serving/llama3-8b" in inference and "class inference" in inference
    assert "VLLMRuntime/ml-training/ablation-server" in training and "class training" in training
    assert [(e["templates"][0]["name"], e["patch"]) for e in entries[1:]] == [("deploymentConfig", [])] * 2
    # Without gpuType the operator asks for nvidia.com/gpu: not an AMD GPU pod.
    nvidia = copy.deepcopy(source[1])
    del nvidia["spec"]["deploymentConfig"]["resources"]["gpuType"]
    other = mutate("-f", "-", stdin=json.dumps(nvidia))
    (line,) = stderr_lines(other, "deploymentConfig: unchanged: the pod ")
    assert "no GPU" in line


def test_a_vllm_runtime_whose_deployment_config_reaches_the_reserved_nodes_is_denied() -> None:
    result = mutate("-f", crd("vllmruntime-reserved.yaml"))

    assert result.returncode == 1
    (denial,) = stderr_lines(result, "denied [")
    assert "VLLMRuntime/ml-training/borrowed-pool deploymentConfig: denied [deny-node-affinity]" in denial
    assert "(fields are relative to spec.deploymentConfig)" in denial
    assert "spec.tolerations[0] tolerates rocm-isolation.io/reserved=inference:NoSchedule" in denial


def test_the_pod_a_vllm_runtime_operator_builds() -> None:
    body = load_all((CRDS / "vllmruntime-reserved.yaml").read_text())[0]
    body["metadata"]["labels"] = {"team": "eval"}
    body["spec"]["vllmConfig"]["env"] = [{"name": "AMD_VISIBLE_DEVICES", "value": "0"}]
    body["spec"]["deploymentConfig"]["sidecarConfig"] = {"enabled": True, "name": "lmcache", "image": {}}
    found = workloads.workload(body["apiVersion"], body["kind"])
    assert found is not None
    (template,) = workloads.templates(body, found)

    pod = workloads.predicted_pod(body, template, frozenset())

    config = body["spec"]["deploymentConfig"]
    assert pod["metadata"] == {"labels": {"team": "eval", "app": "borrowed-pool"}}
    assert required_terms(pod["spec"]) == config["nodeSelectorTerms"]
    assert pod["spec"]["tolerations"] == config["toleration"]
    vllm, sidecar = pod["spec"]["containers"]
    gpu = {"amd.com/gpu": "1"}
    assert vllm["resources"] == {"requests": gpu, "limits": gpu}
    assert vllm["env"] == [{"name": "AMD_VISIBLE_DEVICES", "value": "0"}]
    assert sidecar == {"name": "lmcache"}  # the operator's sidecar default is gpu "0": no GPU
    kubernetes_validate.validate(pod | {"metadata": {"name": "p", **pod["metadata"]}}, K8S, strict=True)


def test_kaiwo_limits_go_to_the_first_container_of_the_predicted_pod_only() -> None:
    body = by_name((CRDS / "kaiwo.yaml").read_text())["llama-sft"]
    original = copy.deepcopy(body)
    found = workloads.workload(body["apiVersion"], body["kind"])
    assert found is not None
    (template,) = workloads.templates(body, found)  # the generated pod is looked at only without templates

    pod = workloads.predicted_pod(body, template, frozenset({"job-name"}))

    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"amd.com/gpu": 4}}
    assert pod["metadata"]["labels"] == {
        "job-name": workloads.PLACEHOLDER,
        "team": "nlp",
        "kaiwo.silogen.ai/name": "llama-sft",
    }
    assert body == original


WORKLOAD_SCHEMA = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "fixtures" / "schemas" / "dryrun-workloads.yaml").read_text(encoding="utf-8")
)
SCHEMA_FIXTURES = ["kaiwo.yaml", "kaiwo-reserved.yaml", "llminferenceservice.yaml", "aibrix.yaml", "vllmruntime.yaml"]


def schema_problems(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator({**WORKLOAD_SCHEMA, "$ref": f"#/$defs/{doc['kind']}"})
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc))


@pytest.mark.parametrize("fixture", SCHEMA_FIXTURES)
def test_the_new_workload_objects_keep_to_their_crd_fields_before_and_after(fixture: str) -> None:
    result = mutate("-f", crd(fixture))

    pairs = zip(load_all((CRDS / fixture).read_text()), load_all(result.stdout), strict=True)
    checked = 0
    for before, after in pairs:
        if before["kind"] == "Namespace":
            continue
        assert schema_problems(before) == [], before["metadata"]["name"]
        assert schema_problems(after) == [], after["metadata"]["name"]
        checked += 1
    assert checked >= 2


def test_the_crd_schema_catches_a_misspelt_field_where_the_dry_run_could_write() -> None:
    runtime = load_all((CRDS / "vllmruntime.yaml").read_text())[1]
    runtime["spec"]["deploymentConfig"]["tolerations"] = []  # the field is `toleration`
    service = load_all((CRDS / "llminferenceservice.yaml").read_text())[1]
    service["spec"]["template"] = {"metadata": {}, "spec": service["spec"]["template"]}  # a PodSpec, not a template

    assert schema_problems(runtime) == [
        "spec.deploymentConfig: Additional properties are not allowed ('tolerations' was unexpected)"
    ]
    assert schema_problems(service) == ["spec.template: 'containers' is a required property"]


# --- the table and template paths, without the CLI ------------------------------------------------


def test_wildcards_find_every_template_of_maps_and_lists() -> None:
    body = load_all((CRDS / "tfjob-paddlejob.yaml").read_text())[0]
    found = workloads.workload(body["apiVersion"], body["kind"])

    assert found is not None
    templates = workloads.templates(body, found)
    assert [(t.name, t.dotted) for t in templates] == [
        ("Chief template", "spec.tfReplicaSpecs.Chief.template"),
        ("PS template", "spec.tfReplicaSpecs.PS.template"),
        ("Worker template", "spec.tfReplicaSpecs.Worker.template"),
    ]
    jobset = load_all((CRDS / "jobset.yaml").read_text())[0]
    table = workloads.workload(jobset["apiVersion"], jobset["kind"])
    assert table is not None
    assert [t.path for t in workloads.templates(jobset, table)] == [
        ("spec", "replicatedJobs", 0, "template", "spec", "template"),
        ("spec", "replicatedJobs", 1, "template", "spec", "template"),
    ]


def test_the_same_kind_in_another_group_is_another_workload() -> None:
    assert workloads.workload("batch/v1", "Job") is not None
    assert workloads.workload("batch.volcano.sh/v1alpha1", "Job") is not None
    assert workloads.workload("example.com/v1", "Job") is None
    assert workloads.workload("kubeflow.org/v2beta1", "MPIJob") is not None


def test_a_template_that_is_not_an_object_is_denied_as_malformed() -> None:
    manifest = (
        "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: broken\n"
        "spec:\n  pytorchReplicaSpecs:\n    Worker:\n      template: [1]\n"
    )
    result = mutate("-f", "-", stdin=manifest)

    assert result.returncode == 1
    assert "PyTorchJob/default/broken: denied [malformed-pod]" in result.stderr
    assert "spec.pytorchReplicaSpecs.Worker.template must be an object" in result.stderr


def test_a_crd_without_any_template_is_passed_through_with_a_note() -> None:
    result = mutate("-f", "-", stdin="apiVersion: ray.io/v1\nkind: RayCluster\nmetadata:\n  name: empty\nspec: {}\n")

    assert result.returncode == 0
    assert "RayCluster/empty: passed through: no pod template found" in result.stderr
    assert "warning" not in result.stderr


def test_a_gpu_request_where_a_known_kind_has_no_template_is_warned_about() -> None:
    # workerGroupSpecs must be a list: as a map, no template is found, and the GPU is not silently passed.
    manifest = (
        "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata:\n  name: odd\nspec:\n  workerGroupSpecs:\n"
        "    gpu:\n      template:\n        spec:\n          containers:\n            - name: w\n"
        "              image: rocm/ray\n              resources:\n                limits:\n"
        "                  amd.com/gpu: 1\n"
    )
    relaxed = mutate("-f", "-", stdin=manifest)
    strict = mutate("-f", "-", "--strict", stdin=manifest)

    assert relaxed.returncode == 0 and strict.returncode == 1
    assert "a GPU request at spec.workerGroupSpecs.gpu.template.spec.containers[0].resources.limits[amd.com/gpu]" in (
        relaxed.stderr
    )


def test_a_trainjob_without_overrides_is_its_runtimes_business() -> None:
    manifest = (
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: plain\nspec:\n"
        "  runtimeRef:\n    name: torch-distributed\n  trainer:\n    resourcesPerNode:\n      limits:\n"
        "        amd.com/gpu: 8\n"
    )
    result = mutate("-f", "-", "--strict", stdin=manifest)

    assert result.returncode == 0, result.stderr
    assert "TrainJob/plain: passed through: nothing shapes its pods here" in result.stderr


def test_inline_operation_paths_land_on_the_component_fields() -> None:
    body = load_all((CRDS / "inferenceservice.yaml").read_text())[1]
    found = workloads.workload(body["apiVersion"], body["kind"])
    assert found is not None
    predictor = workloads.templates(body, found)[0]

    assert workloads.operation_path(predictor, "/metadata/annotations") == "/spec/predictor/annotations"
    assert workloads.operation_path(predictor, "/spec/affinity") == "/spec/predictor/affinity"
    assert workloads.operation_path(predictor, "/spec/containers/0/env") == "/spec/predictor/containers/0/env"
    assert workloads.operation_path(predictor, "/spec/containers/1/env/-") == "/spec/predictor/model/env/-"


def test_placeholder_controller_labels_only_for_keys_the_policy_keeps_out_of_match_labels() -> None:
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "llm"},
        "spec": {"template": {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": []}}},
    }
    found = workloads.workload("apps/v1", "StatefulSet")
    assert found is not None
    (template,) = workloads.templates(body, found)

    none = workloads.predicted_pod(body, template, frozenset())
    some = workloads.predicted_pod(body, template, frozenset({"controller-revision-hash"}))

    assert none["metadata"]["labels"] == {"app": "llm"}
    assert some["metadata"]["labels"] == {"app": "llm", "controller-revision-hash": workloads.PLACEHOLDER}
    assert body["spec"]["template"]["metadata"]["labels"] == {"app": "llm"}  # the object is not touched


def test_controller_labels_with_known_values_are_predicted() -> None:
    source = copy.deepcopy(load_all((CRDS / "pytorchjob.yaml").read_text())[0])
    found = workloads.workload(source["apiVersion"], source["kind"])
    assert found is not None
    worker = workloads.templates(source, found)[1]

    pod = workloads.predicted_pod(source, worker, frozenset())

    assert pod["metadata"]["labels"] == {
        "training.kubeflow.org/job-name": "llama-finetune",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": "worker",
    }
    assert default_policy() is not None


# --- Dynamic Resource Allocation documents --------------------------------------------------------

DRA = Path(__file__).resolve().parents[1] / "fixtures" / "dryrun"


def test_claim_documents_are_printed_unchanged_with_a_note() -> None:
    source = load_all((DRA / "dra-claims.yaml").read_text())
    result = mutate("-f", str(DRA / "dra-claims.yaml"))

    assert result.returncode == 0, result.stderr
    assert load_all(result.stdout) == source
    notes = stderr_lines(result, "passed through: used to resolve the resource claims of the pods in its namespace")
    assert len(notes) == 3
    assert "ResourceClaim/ml-training/shared-gpu" in notes[2]
    for doc in source:
        kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("spec:\n  spec:\n    devices:\n      requests: gpu\n", "spec.spec.devices.requests must be a list"),
        (
            "spec:\n  spec:\n    devices:\n      requests:\n        - name: gpu\n          exactly:\n"
            "            deviceClassName: 7\n",
            "spec.spec.devices.requests[0].exactly.deviceClassName must be a string",
        ),
    ],
)
def test_a_malformed_claim_document_is_an_input_error(body: str, problem: str) -> None:
    manifest = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers: []\n---\n"
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n  name: mi300x\n" + body
    )
    result = mutate("-f", "-", stdin=manifest)

    assert result.returncode == 2
    assert result.stdout == ""
    assert f"error: <stdin>: document 2: ResourceClaimTemplate mi300x: {problem}" in result.stderr


# --- controller labels: the spread each template gets is the one its pods get ----------------------

INFERENCE = ("--namespace-label", f"{CLASS}=inference")


def spread_of(template: dict[str, Any]) -> dict[str, Any]:
    (constraint,) = template["spec"]["topologySpreadConstraints"]
    result: dict[str, Any] = constraint
    return result


def test_each_core_controller_template_gets_the_spread_its_pods_will_get() -> None:
    fixture = str(DRA / "controllers.yaml")
    result = mutate("-f", fixture, *INFERENCE)
    patches = mutate("-f", fixture, *INFERENCE, "-o", "patch")

    assert result.returncode == 0, result.stderr
    by_kind = {doc["kind"]: doc for doc in load_all(result.stdout)}
    sts = spread_of(by_kind["StatefulSet"]["spec"]["template"])
    # Per-pod identity (pod-name, pod-index) never enters the selector; the revision goes to matchLabelKeys.
    assert sts["labelSelector"] == {"matchLabels": {"app": "llm"}}
    assert sts["matchLabelKeys"] == ["controller-revision-hash"]
    deployment = spread_of(by_kind["Deployment"]["spec"]["template"])
    assert deployment["labelSelector"] == {"matchLabels": {"app": "embedder"}}
    assert deployment["matchLabelKeys"] == ["pod-template-hash"]
    job_keys = {"batch.kubernetes.io/controller-uid", "controller-uid", "batch.kubernetes.io/job-name", "job-name"}
    indexed = spread_of(by_kind["Job"]["spec"]["template"])
    assert indexed["labelSelector"] == {"matchLabels": {"app": "batch-infer"}}  # no job-completion-index
    assert set(indexed["matchLabelKeys"]) == job_keys
    # The CronJob's template has no labels: the Job controller's labels still select its siblings.
    cron_template = by_kind["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]
    cron = spread_of(cron_template)
    assert cron["labelSelector"] == {}
    assert set(cron["matchLabelKeys"]) == job_keys
    assert cron_template["metadata"] == {
        "annotations": {CLASS: "inference", "rocm-isolation.io/mutations": ANY_LIST},
        "labels": {PLACED_LABEL: "inference"},
    }
    daemon = spread_of(by_kind["DaemonSet"]["spec"]["template"])
    assert set(daemon["matchLabelKeys"]) == {"controller-revision-hash", "pod-template-generation"}
    legacy = spread_of(by_kind["ReplicaSet"]["spec"]["template"])
    assert legacy == {**legacy, "labelSelector": {"matchLabels": {"app": "legacy"}}} and "matchLabelKeys" not in legacy
    assert "no labels to select its peers" not in result.stderr
    # The predicted labels exist only in the pod given to the engine: never in the output.
    assert workloads.PLACEHOLDER not in result.stdout + patches.stdout
    for doc in by_kind.values():
        assert "controller-revision-hash" not in json.dumps(doc.get("spec", {}).get("template", {}).get("metadata", {}))
        kubernetes_validate.validate(doc, K8S, strict=True)


class _AnyList:
    """Equal to any comma-separated list of mutations (its content is the engine's business)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and "topology-spread" in other.split(",")


ANY_LIST: Any = _AnyList()


def test_crd_templates_get_their_controllers_labels_in_the_spread() -> None:
    lws = load_all(mutate("-f", crd("leaderworkerset.yaml")).stdout)[1]
    leader = spread_of(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"])
    worker = spread_of(lws["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    # LWS pods are StatefulSet pods: the name label selects the set's pods, the revision hash is a key.
    assert leader["labelSelector"] == {"matchLabels": {"role": "leader", "leaderworkerset.sigs.k8s.io/name": "vllm"}}
    assert worker["labelSelector"] == {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "vllm"}}
    assert worker["matchLabelKeys"] == ["controller-revision-hash"]
    ray = {doc["metadata"]["name"]: doc for doc in load_all(mutate("-f", crd("ray.yaml")).stdout)}
    group = spread_of(ray["llm-serve"]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"])
    assert group["labelSelector"]["matchLabels"] == {
        "app": "llm-serve",
        "ray.io/node-type": "worker",
        "ray.io/group": "gpu",
        "ray.io/is-ray-node": "yes",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }


# --- DRA end to end: claims resolved from the input -------------------------------------------------


def test_a_dra_training_deployment_on_the_reserved_pool_is_denied() -> None:
    result = mutate("-f", str(DRA / "dra-claims.yaml"), "-f", str(DRA / "dra-reserved.yaml"))

    assert result.returncode == 1
    (denial,) = stderr_lines(result, "denied [")
    assert "Deployment/ml-training/dra-sneaky: denied [deny-node-selector]" in denial
    assert "could not be resolved" not in result.stderr and "unresolv" not in result.stderr


def test_dra_claims_in_the_input_resolve_and_missing_ones_warn() -> None:
    with_claims = mutate("-f", str(DRA / "dra-claims.yaml"), "-f", str(DRA / "dra-workloads.yaml"))
    without = mutate("-f", str(DRA / "dra-workloads.yaml"))

    assert with_claims.returncode == 0, with_claims.stderr
    resolved = {doc["metadata"]["name"]: doc for doc in load_all(with_claims.stdout)}
    guessed = {doc["metadata"]["name"]: doc for doc in load_all(without.stdout)}
    trainer = resolved["dra-trainer"]["spec"]["template"]
    assert trainer["metadata"]["annotations"][CLASS] == "training"
    assert NOT_IN in required_terms(trainer["spec"])[0]["matchExpressions"]
    # A DRA GPU pod in a CRD template is a GPU pod too.
    worker = resolved["dra-finetune"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert worker["metadata"]["annotations"][CLASS] == "training"
    # The claim with a non-GPU device class is not in scope: left alone, its nodeSelector on the pool and all.
    assert (
        resolved["nic-only"]["spec"]["template"]
        == load_all((DRA / "dra-workloads.yaml").read_text())[2]["spec"]["template"]
    )
    assert "Deployment/ml-training/nic-only: unchanged" in with_claims.stderr
    assert not [line for line in with_claims.stderr.splitlines() if line.startswith("  warning:")]
    # Without the claim documents every claim is unresolvable: a GPU request, with a warning (fail toward
    # isolation): the GPU pods are mutated the same way, and the NIC-only pod on the reserved pool is denied.
    assert without.returncode == 1
    assert guessed["dra-trainer"]["spec"]["template"]["spec"] == trainer["spec"]
    assert "Deployment/ml-training/nic-only: denied [deny-node-selector]" in without.stderr
    warned = [line for line in without.stderr.splitlines() if "could not be resolved" in line]
    assert len(warned) == 3, without.stderr
    assert "ResourceClaimTemplate mi300x could not be resolved (not in the input: add its document" in warned[0]
    assert "ResourceClaim shared-gpu could not be resolved" in warned[1]
    assert all("counted as a GPU request" in line for line in warned)


# --- broken CRDs: a clear verdict, never a crash ------------------------------------------------------

CRD_OBJECTS = [
    doc for name in ALL_FIXTURES for doc in load_all((CRDS / name).read_text()) if doc["kind"] != "Namespace"
]


def _facts() -> documents.Facts:
    return documents.Facts(
        policy=default_policy(),
        nodes=NodeFacts(None),
        default_namespace="default",
        given_labels=None,
        namespace_documents={},
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_crd_broken_anywhere_gets_a_verdict_and_a_patch_that_applies(data: st.DataObject) -> None:
    body = copy.deepcopy(data.draw(st.sampled_from(CRD_OBJECTS)))
    places = [p for p in S.json_paths(body) if len(p) > 1 or (p and p[0] not in ("apiVersion", "kind"))]
    place = data.draw(st.sampled_from(places))
    parent = body
    for token in place[:-1]:
        parent = parent[token]
    parent[place[-1]] = data.draw(S.json_values)
    original = copy.deepcopy(body)

    output, (outcome,) = outcomes.process_document(documents.Document(documents.Location("<fuzz>", 1), body), _facts())

    assert body == original  # the input is never modified
    if outcome.allowed:
        assert output == jsonpatch.apply_patch(body, list(outcome.patch))
    else:
        assert output == body and outcome.patch == ()
        assert outcome.message
    json.dumps(output)
