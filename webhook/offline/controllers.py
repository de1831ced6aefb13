"""The workload table: per kind, its API groups, where it keeps its pod templates, and the labels its
controller adds to the pods (``PLACEHOLDER`` for a value the dry run cannot know). Adding a CRD is one
entry in ``TABLE``. Keys from the controllers' code and docs; docs/workloads.md has the references."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core import patch, pods
from webhook.offline.workload_kinds import (
    INLINE,
    OVERRIDE,
    PLACEHOLDER,
    LabelRule,
    Template,
    TemplateRule,
    Workload,
    item_label,
    no_labels,
)

# --- controller labels ------------------------------------------------------------------------
# Keys from the controllers' code and docs; see docs/workloads.md for the references.

DEPLOYMENT_LABELS = {"pod-template-hash": PLACEHOLDER}
STATEFULSET_LABELS = {
    "statefulset.kubernetes.io/pod-name": PLACEHOLDER,
    "apps.kubernetes.io/pod-index": PLACEHOLDER,
    "controller-revision-hash": PLACEHOLDER,
}
DAEMONSET_LABELS = {"controller-revision-hash": PLACEHOLDER, "pod-template-generation": PLACEHOLDER}
JOB_LABELS = {
    "batch.kubernetes.io/controller-uid": PLACEHOLDER,
    "batch.kubernetes.io/job-name": PLACEHOLDER,
    "controller-uid": PLACEHOLDER,
    "job-name": PLACEHOLDER,
}
INDEXED_JOB_LABELS = {**JOB_LABELS, "batch.kubernetes.io/job-completion-index": PLACEHOLDER}


def _job_labels(job_spec: Any) -> dict[str, str]:
    indexed = isinstance(job_spec, Mapping) and job_spec.get("completionMode") == "Indexed"
    return dict(INDEXED_JOB_LABELS if indexed else JOB_LABELS)


def _constant(labels: Mapping[str, str]) -> LabelRule:
    def rule(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
        return dict(labels)

    return rule


def _job(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    return _job_labels(patch.resolve(body, ("spec",)))


def _cronjob(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    return _job_labels(patch.resolve(body, ("spec", "jobTemplate", "spec")))


def _name(body: Mapping[str, Any]) -> str:
    return pods.pod_name(body)


def _kubeflow(operator_name: str) -> LabelRule:
    """Kubeflow Training Operator v1 (pkg/controller.v1/common): job name, operator, replica type and index."""

    def rule(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
        return {
            "training.kubeflow.org/job-name": _name(body),
            "training.kubeflow.org/operator-name": operator_name,
            "training.kubeflow.org/replica-type": matched[0].lower(),
            "training.kubeflow.org/replica-index": PLACEHOLDER,
        }

    return rule


def _mpijob(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    if not str(body.get("apiVersion", "")).endswith("/v2beta1"):
        return _kubeflow("mpijob-controller")(body, node, matched)
    # mpi-operator v2: job-role is the replica type; the launcher is a batch Job (pkg/controller/mpi_job_controller.go).
    role = matched[0].lower()
    labels = {
        "training.kubeflow.org/job-name": _name(body),
        "training.kubeflow.org/operator-name": "mpi-operator",
        "training.kubeflow.org/job-role": role,
    }
    labels["training.kubeflow.org/replica-index"] = PLACEHOLDER
    if role == "launcher":
        labels.update(JOB_LABELS)
    return labels


def _jobset_pod(job_template: Any, replicated_job: str, jobset_name: str | None) -> dict[str, str]:
    # JobSet pods are Job pods (Indexed by default: the JobSet webhook defaults completionMode).
    job_spec = patch.resolve(job_template, ("spec",))
    indexed = not isinstance(job_spec, Mapping) or job_spec.get("completionMode", "Indexed") == "Indexed"
    labels = dict(INDEXED_JOB_LABELS if indexed else JOB_LABELS)
    labels["jobset.sigs.k8s.io/replicatedjob-name"] = replicated_job
    if jobset_name is not None:
        labels["jobset.sigs.k8s.io/jobset-name"] = jobset_name
    return labels


def _jobset(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    replicated = _item_named(patch.resolve(body, ("spec", "replicatedJobs")), matched[0])
    return _jobset_pod(patch.resolve(replicated, ("template",)), matched[0], _name(body))


def _runtime(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    # The JobSet is named after the TrainJob, not the runtime: its name is not known here.
    replicated = _item_named(patch.resolve(body, ("spec", "template", "spec", "replicatedJobs")), matched[0])
    return _jobset_pod(patch.resolve(replicated, ("template",)), matched[0], None)


def _item_named(items: Any, name: str) -> Any:
    if isinstance(items, list):
        for index, item in enumerate(items):
            if item_label(item, index) == name:
                return item
    return None


def _lws(role: str) -> LabelRule:
    """LeaderWorkerSet pods are StatefulSet pods (leader and per-group worker StatefulSets)."""

    def rule(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
        return {
            **STATEFULSET_LABELS,
            "leaderworkerset.sigs.k8s.io/name": _name(body),
            "leaderworkerset.sigs.k8s.io/worker-index": "0" if role == "leader" else PLACEHOLDER,
        }

    return rule


def _ray(cluster_known: bool, node_type: str) -> LabelRule:
    """KubeRay (ray-operator/controllers/ray/common/pod.go): the cluster, node type and group of a pod.

    A RayJob's or RayService's cluster gets a generated name, so ``ray.io/cluster`` is not known."""

    def rule(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
        labels = {
            "ray.io/node-type": node_type,
            "ray.io/group": matched[0] if matched else "headgroup",
            "ray.io/is-ray-node": "yes",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
        if cluster_known:
            labels["ray.io/cluster"] = _name(body)
        return labels

    return rule


def _kserve(component: str) -> LabelRule:
    """KServe (raw deployment, pkg/controller/v1beta1/inferenceservice/components): the component's
    Deployment labels its pods with the InferenceService's own labels, its name and the component."""

    def rule(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
        own = patch.resolve(body, ("metadata", "labels"))
        return {
            **(own if isinstance(own, Mapping) else {}),
            **DEPLOYMENT_LABELS,
            "serving.kserve.io/inferenceservice": _name(body),
            "component": component,
        }

    return rule


def _volcano(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    """Volcano's job controller labels every pod with the job's name and namespace. Newer releases add
    ``volcano.sh/task-spec`` and ``volcano.sh/queue-name``, older ones only annotate them: a label the pods
    may lack would make the selector match none of them, so only the two every release sets are predicted."""
    namespace = patch.resolve(body, ("metadata", "namespace"))
    labels = {"volcano.sh/job-name": _name(body)}
    if isinstance(namespace, str) and namespace:
        labels["volcano.sh/job-namespace"] = namespace
    return labels


def _str_map(value: Any, field: str) -> dict[str, str]:
    return dict(pods.string_map(value, field))


# Kaiwo (kaiwo.silogen.ai): the common fields of KaiwoJob/KaiwoService (CommonMetaSpec) shape every pod it makes.
KAIWO_LABELS = {"kaiwo.silogen.ai/run-id": PLACEHOLDER, "kaiwo.silogen.ai/user": PLACEHOLDER}


def _kaiwo_own(body: Mapping[str, Any]) -> dict[str, str]:
    """``podTemplateSpecLabels`` and Kaiwo's system labels (docs/reference/labels.md), which take precedence.
    The user label is derived from ``spec.user`` (an email), so its value is not predicted."""
    spec = pods.mapping(body.get("spec"), "spec")
    return {
        **_str_map(spec.get("podTemplateSpecLabels"), "spec.podTemplateSpecLabels"),
        **KAIWO_LABELS,
        "kaiwo.silogen.ai/name": _name(body),
    }


def _kaiwo(inner: LabelRule) -> LabelRule:
    """The labels of the embedded workload's controller (Job, Deployment, KubeRay), then Kaiwo's own."""

    def rule(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
        return {**inner(body, node, matched), **_kaiwo_own(body)}

    return rule


def _kaiwo_count(spec: Mapping[str, Any], field: str) -> int:
    value = spec.get(field)
    if value is None:
        return 0
    if type(value) is not int:
        raise pods.MalformedPod(f"spec.{field}", "an integer")
    return value


def _kaiwo_gpus(body: Mapping[str, Any]) -> dict[str, int]:
    """Kaiwo's GPU request per pod: ``gpusPerReplica`` when > 0, else ``gpus`` (the per-pod count Kaiwo may
    compute for Ray from node capacity is at most that: it is a GPU pod either way); the resource name from
    ``gpuVendor`` (default amd). GPU entries of ``spec.resources`` are ignored, as Kaiwo ignores them."""
    spec = pods.mapping(body.get("spec"), "spec")
    count = _kaiwo_count(spec, "gpusPerReplica") or _kaiwo_count(spec, "gpus")
    if count <= 0:
        return {}
    vendor = pods.string(spec.get("gpuVendor"), "spec.gpuVendor").lower()
    return {"nvidia.com/gpu" if vendor == "nvidia" else "amd.com/gpu": count}


def _kaiwo_pod(body: Mapping[str, Any], template: Template) -> tuple[Any, Any]:
    """The pod Kaiwo generates when the object embeds no workload: one container with the common fields'
    image, env and GPU request; Kaiwo's common fields have no placement field (gpuModels selects Kaiwo's
    own node label), so this pod can only be denied by its labels (a class its namespace does not allow)."""
    spec = template.node
    container: dict[str, Any] = {"name": "workload", "image": spec.get("image") or "ghcr.io/silogen/rocm-ray"}
    env = pods.sequence(spec.get("env"), "spec.env")
    if env:
        container["env"] = env
    gpus = _kaiwo_gpus(body)
    if gpus:
        container["resources"] = {"limits": gpus}
    pod_spec: dict[str, Any] = {"containers": [container]}
    secrets = pods.sequence(spec.get("imagePullSecrets"), "spec.imagePullSecrets")
    if secrets:
        pod_spec["imagePullSecrets"] = secrets
    return None, pod_spec


def _llmisvc(workload: tuple[str, ...], role: str) -> LabelRule:
    """KServe LLMInferenceService (pkg/controller/v1alpha1/llmisvc): a workload's pods are a Deployment's, or a
    LeaderWorkerSet's when the workload has a ``worker``; the component label says which; the workload's own
    ``labels`` are added to its pods (releases whose WorkloadSpec has the field)."""

    def rule(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
        where = ".".join(workload)
        spec = pods.mapping(patch.resolve(body, workload), where)
        multi = spec.get("worker") is not None
        component = "llminferenceservice-workload" + (f"-{role}" if multi else "")
        if workload[-1] == "prefill":
            component += "-prefill"
        return {
            **_str_map(spec.get("labels"), f"{where}.labels"),
            **(STATEFULSET_LABELS if multi else DEPLOYMENT_LABELS),
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/name": _name(body),
            "app.kubernetes.io/part-of": "llminferenceservice",
        }

    return rule


def _storm(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    """AIBrix StormService (pkg/controller/constants/stormservice.go): the service, the role, and per-RoleSet values."""
    labels = {
        "storm-service-name": _name(body),
        "roleset-name": PLACEHOLDER,
        "storm-service-revision": PLACEHOLDER,
        "role-template-hash": PLACEHOLDER,
    }
    role = _item_named(patch.resolve(body, ("spec", "template", "spec", "roles")), matched[0])
    if isinstance(role, Mapping) and isinstance(role.get("name"), str) and role["name"]:
        labels["role-name"] = role["name"]
    return labels


def _vllm_labels(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    """vLLM production stack: the runtime's Deployment labels its pods ``app: <name>`` and (newer releases)
    copies the VLLMRuntime's own labels."""
    own = _str_map(patch.resolve(body, ("metadata", "labels")), "metadata.labels")
    return {**own, "app": _name(body), **DEPLOYMENT_LABELS}


def _vllm_resources(config: Mapping[str, Any], field: str, *, default_gpu: str = "") -> dict[str, Any]:
    """The controller's ResourceRequirements from ``resources{gpu, gpuType}`` (gpuType default nvidia.com/gpu)."""
    resources = pods.mapping(config.get("resources"), f"{field}.resources")
    gpu = pods.string(resources.get("gpu"), f"{field}.resources.gpu") or default_gpu
    if gpu in ("", "0"):
        return {}
    name = pods.string(resources.get("gpuType"), f"{field}.resources.gpuType") or "nvidia.com/gpu"
    return {"requests": {name: gpu}, "limits": {name: gpu}}


def _vllm_pod(body: Mapping[str, Any], template: Template) -> tuple[Any, Any]:
    """The Deployment pod the VLLMRuntime controller builds (internal/controller/vllmruntime_controller.go):
    ``nodeSelectorTerms`` become the required node affinity, ``toleration`` the tolerations, the ``vllm``
    container gets ``resources`` and ``vllmConfig.env``, the sidecar (when enabled) its own resources."""
    config = template.node
    terms = pods.sequence(config.get("nodeSelectorTerms"), "spec.deploymentConfig.nodeSelectorTerms")
    env = pods.sequence(patch.resolve(body, ("spec", "vllmConfig", "env")), "spec.vllmConfig.env")
    container: dict[str, Any] = {"name": "vllm", "image": "vllm"}
    resources = _vllm_resources(config, "spec.deploymentConfig")
    if resources:
        container["resources"] = resources
    if env:
        container["env"] = env
    spec: dict[str, Any] = {"containers": [container]}
    sidecar = pods.mapping(config.get("sidecarConfig"), "spec.deploymentConfig.sidecarConfig")
    if sidecar.get("enabled") is True:
        side: dict[str, Any] = {"name": pods.string(sidecar.get("name"), "sidecarConfig.name") or "sidecar"}
        side_resources = _vllm_resources(sidecar, "spec.deploymentConfig.sidecarConfig")
        if side_resources:
            side["resources"] = side_resources
        spec["containers"].append(side)
    if terms:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    tolerations = pods.sequence(config.get("toleration"), "spec.deploymentConfig.toleration")
    if tolerations:
        spec["tolerations"] = tolerations
    runtime_class = pods.string(config.get("runtimeClass"), "spec.deploymentConfig.runtimeClass")
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return None, spec


# --- the table --------------------------------------------------------------------------------

APPS = frozenset({"apps", "extensions"})
KUBEFLOW = frozenset({"kubeflow.org"})
TRAINER = frozenset({"trainer.kubeflow.org"})
RAY = frozenset({"ray.io"})
KSERVE_PREDICTORS = (
    "model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "huggingface", "pmml", "lightgbm",
    "paddle",
)  # fmt: skip
KUBEFLOW_V1_REFERENCE = "https://www.kubeflow.org/docs/components/trainer/legacy-v1/reference/training-operator/"
RUNTIME_TEMPLATES = "spec.template.spec.replicatedJobs[*].template.spec.template"


def _ray_templates(prefix: str, cluster_known: bool) -> tuple[TemplateRule, ...]:
    return (
        TemplateRule(f"{prefix}headGroupSpec.template", "head template", labels=_ray(cluster_known, "head")),
        TemplateRule(
            f"{prefix}workerGroupSpecs[*].template", "worker group {} template", labels=_ray(cluster_known, "worker")
        ),
    )


def _kubeflow_job(kind: str, field_name: str, operator: str, reference: str) -> Workload:
    return Workload(
        kind,
        KUBEFLOW,
        (TemplateRule(f"spec.{field_name}.*.template", "{} template", labels=_kubeflow(operator)),),
        reference,
    )


def _kaiwo_ray(prefix: str) -> tuple[TemplateRule, ...]:
    """A Ray workload embedded in a Kaiwo object: Kaiwo's GPU request goes to the worker pods."""
    return (
        TemplateRule(f"{prefix}headGroupSpec.template", "head template", labels=_kaiwo(_ray(False, "head"))),
        TemplateRule(
            f"{prefix}workerGroupSpecs[*].template",
            "worker group {} template",
            labels=_kaiwo(_ray(False, "worker")),
            limits=_kaiwo_gpus,
        ),
    )


def _kaiwo_generated(kind: str) -> TemplateRule:
    return TemplateRule(
        "spec", f"generated {kind} pod", shape=OVERRIDE, labels=_kaiwo(no_labels), build=_kaiwo_pod, fallback=True
    )


def _kaiwo_job_labels(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    return _job_labels(patch.resolve(body, ("spec", "job", "spec")))


def _llmisvc_templates(prefix: str, label: str) -> tuple[TemplateRule, ...]:
    workload = tuple(prefix.split(".")[:-1])
    return (
        TemplateRule(
            f"{prefix}template",
            f"{label}template",
            shape=INLINE,
            has_metadata=False,
            labels=_llmisvc(workload, "leader"),
        ),
        TemplateRule(
            f"{prefix}worker", f"{label}worker", shape=INLINE, has_metadata=False, labels=_llmisvc(workload, "worker")
        ),
    )


KAIWO = frozenset({"kaiwo.silogen.ai"})
KAIWO_REFERENCE = "https://github.com/silogen/kaiwo/blob/main/docs/docs/reference/crds/kaiwo.silogen.ai.md"
AIBRIX = frozenset({"orchestration.aibrix.ai"})
AIBRIX_REFERENCE = "https://github.com/vllm-project/aibrix/tree/main/api/orchestration/v1alpha1"


TABLE: tuple[Workload, ...] = (
    Workload("Pod", frozenset({""}), (TemplateRule(""),)),
    Workload("Deployment", APPS, (TemplateRule("spec.template", labels=_constant(DEPLOYMENT_LABELS)),)),
    Workload(
        "StatefulSet", frozenset({"apps"}), (TemplateRule("spec.template", labels=_constant(STATEFULSET_LABELS)),)
    ),
    Workload("DaemonSet", APPS, (TemplateRule("spec.template", labels=_constant(DAEMONSET_LABELS)),)),
    Workload("ReplicaSet", APPS, (TemplateRule("spec.template"),)),
    Workload("ReplicationController", frozenset({""}), (TemplateRule("spec.template"),)),
    Workload("Job", frozenset({"batch"}), (TemplateRule("spec.template", labels=_job),)),
    Workload("CronJob", frozenset({"batch"}), (TemplateRule("spec.jobTemplate.spec.template", labels=_cronjob),)),
    _kubeflow_job(
        "PyTorchJob",
        "pytorchReplicaSpecs",
        "pytorchjob-controller",
        KUBEFLOW_V1_REFERENCE,
    ),
    _kubeflow_job(
        "TFJob",
        "tfReplicaSpecs",
        "tfjob-controller",
        KUBEFLOW_V1_REFERENCE,
    ),
    _kubeflow_job(
        "PaddleJob",
        "paddleReplicaSpecs",
        "paddlejob-controller",
        KUBEFLOW_V1_REFERENCE,
    ),
    _kubeflow_job(
        "XGBoostJob",
        "xgbReplicaSpecs",
        "xgboostjob-controller",
        KUBEFLOW_V1_REFERENCE,
    ),
    _kubeflow_job(
        "JAXJob",
        "jaxReplicaSpecs",
        "jaxjob-controller",
        KUBEFLOW_V1_REFERENCE,
    ),
    Workload(
        "MPIJob",
        KUBEFLOW,
        (TemplateRule("spec.mpiReplicaSpecs.*.template", "{} template", labels=_mpijob),),
        "https://github.com/kubeflow/mpi-operator/blob/master/pkg/apis/kubeflow/v2beta1/types.go",
    ),
    Workload(
        "TrainingRuntime",
        TRAINER,
        (TemplateRule(RUNTIME_TEMPLATES, "replicated job {} template", labels=_runtime),),
        "https://www.kubeflow.org/docs/components/trainer/operator-guides/runtime/",
    ),
    Workload(
        "ClusterTrainingRuntime",
        TRAINER,
        (TemplateRule(RUNTIME_TEMPLATES, "replicated job {} template", labels=_runtime),),
        "https://www.kubeflow.org/docs/components/trainer/operator-guides/runtime/",
    ),
    Workload(
        "TrainJob",
        TRAINER,
        (
            TemplateRule("spec.podTemplateOverrides[*]", "podTemplateOverrides[{}]", shape=OVERRIDE),
            TemplateRule(
                "spec.runtimePatches[*].trainingRuntimeSpec.template.spec.replicatedJobs[*].template.spec.template",
                "runtimePatches[{}] replicated job {} template",
                shape=OVERRIDE,
            ),
        ),
        "https://github.com/kubeflow/trainer/blob/master/pkg/apis/trainer/v1alpha1/trainjob_types.go",
    ),
    Workload(
        "JobSet",
        frozenset({"jobset.x-k8s.io"}),
        (TemplateRule("spec.replicatedJobs[*].template.spec.template", "replicated job {} template", labels=_jobset),),
        "https://jobset.sigs.k8s.io/docs/reference/jobset.v1alpha2/",
    ),
    Workload(
        "LeaderWorkerSet",
        frozenset({"leaderworkerset.x-k8s.io"}),
        (
            TemplateRule("spec.leaderWorkerTemplate.leaderTemplate", "leader template", labels=_lws("leader")),
            TemplateRule("spec.leaderWorkerTemplate.workerTemplate", "worker template", labels=_lws("worker")),
        ),
        "https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/",
    ),
    Workload("RayCluster", RAY, _ray_templates("spec.", True), "https://ray-project.github.io/kuberay/reference/api/"),
    Workload(
        "RayJob",
        RAY,
        (
            *_ray_templates("spec.rayClusterSpec.", False),
            TemplateRule("spec.submitterPodTemplate", "submitter template", labels=_constant(JOB_LABELS)),
        ),
        "https://ray-project.github.io/kuberay/reference/api/",
    ),
    Workload(
        "RayService",
        RAY,
        _ray_templates("spec.rayClusterConfig.", False),
        "https://ray-project.github.io/kuberay/reference/api/",
    ),
    Workload(
        "InferenceService",
        frozenset({"serving.kserve.io"}),
        (
            TemplateRule(
                "spec.predictor", "predictor", shape=INLINE, labels=_kserve("predictor"), containers=KSERVE_PREDICTORS
            ),
            TemplateRule("spec.predictor.workerSpec", "predictor workerSpec", shape=INLINE, has_metadata=False),
            TemplateRule("spec.transformer", "transformer", shape=INLINE, labels=_kserve("transformer")),
            TemplateRule("spec.explainer", "explainer", shape=INLINE, labels=_kserve("explainer"), containers=("art",)),
        ),
        "https://kserve.github.io/website/latest/reference/api/",
    ),
    Workload(
        "Job",
        frozenset({"batch.volcano.sh"}),
        (TemplateRule("spec.tasks[*].template", "task {} template", labels=_volcano),),
        "https://volcano.sh/en/docs/vcjob/",
    ),
    Workload(
        "KaiwoJob",
        KAIWO,
        (
            TemplateRule(
                "spec.job.spec.template", "job template", labels=_kaiwo(_kaiwo_job_labels), limits=_kaiwo_gpus
            ),
            *_kaiwo_ray("spec.rayJob.spec.rayClusterSpec."),
            TemplateRule("spec.rayJob.spec.submitterPodTemplate", "submitter template", labels=_constant(JOB_LABELS)),
            _kaiwo_generated("job"),
        ),
        KAIWO_REFERENCE,
    ),
    Workload(
        "KaiwoService",
        KAIWO,
        (
            TemplateRule(
                "spec.deployment.spec.template",
                "deployment template",
                labels=_kaiwo(_constant(DEPLOYMENT_LABELS)),
                limits=_kaiwo_gpus,
            ),
            *_kaiwo_ray("spec.rayService.spec.rayClusterConfig."),
            *_kaiwo_ray("spec.ray.spec.rayClusterConfig."),
            _kaiwo_generated("service"),
        ),
        KAIWO_REFERENCE,
    ),
    Workload(
        "LLMInferenceService",
        frozenset({"serving.kserve.io"}),
        (*_llmisvc_templates("spec.", ""), *_llmisvc_templates("spec.prefill.", "prefill ")),
        "https://github.com/kserve/kserve/blob/master/pkg/apis/serving/v1alpha1/llm_inference_service_types.go",
    ),
    Workload(
        "StormService",
        AIBRIX,
        (TemplateRule("spec.template.spec.roles[*].template", "role {} template", labels=_storm),),
        AIBRIX_REFERENCE,
    ),
    Workload(
        "RayClusterFleet",
        AIBRIX,
        _ray_templates("spec.template.spec.", False),
        AIBRIX_REFERENCE,
    ),
    Workload(
        "VLLMRuntime",
        frozenset({"production-stack.vllm.ai"}),
        (
            TemplateRule(
                "spec.deploymentConfig", "deploymentConfig", shape=OVERRIDE, labels=_vllm_labels, build=_vllm_pod
            ),
        ),
        "https://github.com/vllm-project/production-stack/blob/main/operator/api/v1alpha1/vllmruntime_types.go",
    ),
)

BY_KIND: dict[tuple[str, str], Workload] = {(group, w.kind): w for w in TABLE for group in w.groups}
