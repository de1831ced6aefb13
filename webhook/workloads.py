"""Where workloads keep their pods: one table of kind -> (API groups, pod template paths).

The dry run (``mutate``) checks a workload by deciding on each pod its controller would create, so
it has to find the pod templates inside the object and to know how each template becomes a pod:

- ``TEMPLATE``: a PodTemplateSpec (``metadata`` + ``spec``), the shape of every core workload,
  Kubeflow's replica specs, JobSet, LeaderWorkerSet, KubeRay and Volcano;
- ``INLINE``: a pod spec with its fields inlined next to other fields, and containers of its own
  beside ``containers`` (KServe's predictor/transformer/explainer: ``predictor.model`` is the
  ``kserve-container``); the component's ``labels``/``annotations`` are the pod's metadata;
- ``OVERRIDE``: fields that shape pods made from a template elsewhere (Kubeflow Trainer's TrainJob
  ``podTemplateOverrides`` / ``runtimePatches``): checked (denied when they reach the reserved
  nodes) but never mutated, because the fields the webhook adds have no place there.

Template paths are dotted, with ``*`` for every value of a map and ``[*]`` for every item of a list
(``spec.pytorchReplicaSpecs.*.template``, ``spec.replicatedJobs[*].template.spec.template``).
Adding a CRD is one entry in ``TABLE``. Pure: no I/O.

Each template also carries the labels its controller will add to the pods (``controller_labels``),
so the engine's topology spread for the template is the one the pods will get. A value the dry run
cannot know (a hash, a uid, a per-pod index) is ``PLACEHOLDER``; the dry run gives the engine only
the placeholder keys that the policy keeps out of ``matchLabels`` (excluded or matchLabelKeys), so a
placeholder never reaches the output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook import patch, pods

Shape = Literal["template", "inline", "override"]
TEMPLATE: Shape = "template"
INLINE: Shape = "inline"
OVERRIDE: Shape = "override"
PLACEHOLDER = "dry-run-placeholder"

Path = tuple[str | int, ...]
# (the object, the template node, what the wildcards matched) -> label key -> value or PLACEHOLDER
LabelRule = Callable[[Mapping[str, Any], Mapping[str, Any], tuple[str, ...]], dict[str, str]]


def _no_labels(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class TemplateRule:
    """A pattern of template paths in a kind, how to name what it finds, and its pods' controller labels."""

    pattern: str
    label: str | None = None  # "{} template": the wildcard matches fill the braces; None for core kinds
    shape: Shape = TEMPLATE
    labels: LabelRule = _no_labels
    # INLINE: the component's own containers besides ``containers`` (KServe predictor.model, ...)
    containers: tuple[str, ...] = ()
    # INLINE: False when the component has no metadata fields (the class annotation is not written)
    has_metadata: bool = True

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(t for t in re.split(r"\.|(?=\[\*\])", self.pattern) if t)


@dataclass(frozen=True)
class Workload:
    kind: str
    groups: frozenset[str]
    templates: tuple[TemplateRule, ...]
    reference: str = ""  # the API reference the paths were read from (docs/workloads.md)


@dataclass(frozen=True)
class Template:
    """One pod template found in an object: the rule that found it, where it is, what the wildcards matched."""

    rule: TemplateRule
    path: Path
    matched: tuple[str, ...]
    node: Mapping[str, Any]

    @property
    def name(self) -> str | None:
        if self.rule.label is None:
            return None
        return self.rule.label.format(*self.matched)

    @property
    def dotted(self) -> str:
        return _dotted(self.path)


def _dotted(path: Path) -> str:
    out = ""
    for token in path:
        out += f"[{token}]" if isinstance(token, int) else (f".{token}" if out else token)
    return out


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
            if _item_label(item, index) == name:
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
)

BY_KIND: dict[tuple[str, str], Workload] = {(group, w.kind): w for w in TABLE for group in w.groups}

# Fields of a KServe component that are not pod spec fields (ComponentExtensionSpec, the 1-of predictors).
_INLINE_NOT_POD = frozenset({
    "labels", "annotations", "workerSpec", "storageUris", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric",
    "scaleMetricType", "containerConcurrency", "timeout", "canaryTrafficPercent", "logger", "batcher",
    "deploymentStrategy", "autoScaling", "pipelineParallelSize", "tensorParallelSize",
})  # fmt: skip


def workload(api_version: str, kind: str) -> Workload | None:
    return BY_KIND.get((api_version.rpartition("/")[0], kind))


# --- finding templates ------------------------------------------------------------------------


def _item_label(item: Any, index: int) -> str:
    if isinstance(item, Mapping):
        for key in ("name", "groupName", "manager"):
            value = item.get(key)
            if isinstance(value, str) and value:
                return value
    return str(index)


def _walk(
    node: Any, tokens: tuple[str, ...], path: Path, matched: tuple[str, ...]
) -> Iterator[tuple[Path, tuple[str, ...], Any]]:
    if not tokens:
        yield path, matched, node
        return
    token, rest = tokens[0], tokens[1:]
    if token == "*":
        if isinstance(node, Mapping):
            for key, value in node.items():
                if value is not None:
                    yield from _walk(value, rest, (*path, key), (*matched, str(key)))
    elif token == "[*]":
        if isinstance(node, list):
            for index, value in enumerate(node):
                if value is not None:
                    yield from _walk(value, rest, (*path, index), (*matched, _item_label(value, index)))
    elif isinstance(node, Mapping) and node.get(token) is not None:
        yield from _walk(node[token], rest, (*path, token), matched)


def templates(body: Mapping[str, Any], found: Workload) -> list[Template]:
    """Every pod template of the object (absent optional templates are skipped).

    Raises ``pods.MalformedPod`` naming the field when a template is not an object."""
    out = []
    for rule in found.templates:
        for path, matched, node in _walk(body, rule.tokens, (), ()):
            out.append(Template(rule, path, matched, pods.mapping(node, _dotted(path) or "the object")))
    return out


def predicted_pod(body: Mapping[str, Any], template: Template, label_keys: frozenset[str]) -> dict[str, Any]:
    """The pod the engine decides on: the template as a pod, with the labels its controller will add.

    Only controller labels with a known value, or whose key is in ``label_keys`` (the keys the engine
    keeps out of ``matchLabels``), are added: a placeholder never reaches the output."""
    rule, node = template.rule, template.node
    if rule.shape == TEMPLATE and not template.path:
        return dict(node)
    controller = {
        k: v for k, v in rule.labels(body, node, template.matched).items() if v != PLACEHOLDER or k in label_keys
    }
    if rule.shape == TEMPLATE:
        metadata: Any = node.get("metadata")
        spec = node.get("spec")
    elif rule.shape == INLINE:
        metadata = {k: node[k] for k in ("labels", "annotations") if k in node} if rule.has_metadata else {}
        spec = {k: v for k, v in node.items() if k not in _INLINE_NOT_POD and k not in rule.containers}
        extra = [node[k] for k in rule.containers if node.get(k) is not None]
        if extra:
            spec["containers"] = [*pods.sequence(node.get("containers"), f"{template.dotted}.containers"), *extra]
    else:
        metadata, spec = _override_pod(body, template)
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod"}
    if controller and (metadata is None or isinstance(metadata, Mapping)):
        metadata = dict(metadata or {})
        labels = metadata.get("labels")
        if labels is None or isinstance(labels, Mapping):
            metadata["labels"] = {**(labels or {}), **controller}
    if metadata is not None:
        pod["metadata"] = metadata
    if spec is not None:
        pod["spec"] = spec
    return pod


def _override_pod(body: Mapping[str, Any], template: Template) -> tuple[Any, Any]:
    """A TrainJob override as a pod: its placement fields, and the trainer's resources per node.

    The override's containers only patch env/volumeMounts of the runtime's containers, so the pod's one
    container carries ``trainer.resourcesPerNode`` (every override gets it: failing toward isolation)."""
    node = template.node
    metadata = node.get("metadata")
    spec = dict(pods.mapping(node.get("spec"), f"{template.dotted}.spec"))
    spec.pop("initContainers", None)
    container: dict[str, Any] = {"name": "node"}
    resources = patch.resolve(body, ("spec", "trainer", "resourcesPerNode"))
    if resources is not None:
        container["resources"] = resources
    spec["containers"] = [container]
    return metadata, spec


def operation_path(template: Template, pod_pointer: str) -> str | None:
    """The pointer in the object for a pointer in the predicted pod; None when it has no place there."""
    rule = template.rule
    prefix = patch.pointer(*template.path)
    if rule.shape == TEMPLATE:
        return prefix + pod_pointer
    if rule.shape == OVERRIDE:
        return None
    # INLINE: metadata maps sit on the component, containers beyond its own list are its named containers.
    parts = pod_pointer.split("/")  # "", "metadata"|"spec", ...
    if parts[1] == "metadata":
        if not rule.has_metadata or len(parts) < 3:
            return None
        return prefix + "/" + "/".join(parts[2:])
    rest = parts[2:]
    if len(rest) >= 2 and rest[0] == "containers" and rest[1].isdigit():
        own = template.node.get("containers")
        count = len(own) if isinstance(own, list) else 0
        index = int(rest[1])
        if index >= count:
            extra = [k for k in rule.containers if template.node.get(k) is not None]
            return prefix + "/" + "/".join([patch.escape(extra[index - count]), *rest[2:]])
    return prefix + "/" + "/".join(rest)


def uncovered_gpu_paths(body: Any, is_gpu: Callable[[str], bool]) -> list[str]:
    """Where an object asks for a GPU: a GPU resource in a requests/limits map, or a resource claim."""
    found: list[str] = []

    def visit(node: Any, where: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                child = f"{where}.{key}" if where else str(key)
                if key in ("requests", "limits") and isinstance(value, Mapping):
                    found.extend(f"{child}[{name}]" for name in value if isinstance(name, str) and is_gpu(name))
                elif key == "resourceClaims" and isinstance(value, list) and value:
                    found.append(child)
                else:
                    visit(value, child)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, f"{where}[{index}]")

    visit(body, "")
    return found
