"""Where workloads keep their pods: one table of kind -> (API groups, pod template paths).

The dry run (``mutate``) checks a workload by deciding on each pod its controller would create, so
it has to find the pod templates inside the object and to know how each template becomes a pod:

- ``TEMPLATE``: a PodTemplateSpec (``metadata`` + ``spec``), the shape of every core workload,
  Kubeflow's replica specs, JobSet, LeaderWorkerSet, KubeRay and Volcano;
- ``INLINE``: a pod spec with its fields inlined next to other fields, and containers of its own
  beside ``containers`` (KServe's predictor/transformer/explainer: ``predictor.model`` is the
  ``kserve-container``); the component's ``labels``/``annotations`` are the pod's metadata;
- ``OVERRIDE``: fields that shape pods made from a template elsewhere (Kubeflow Trainer's TrainJob
  ``podTemplateOverrides`` / ``runtimePatches``) or by the controller itself from fields that are not
  a pod spec (vLLM production stack's ``deploymentConfig``, the pod Kaiwo generates from its common
  fields): checked as the pod the controller will make (denied when it reaches the reserved nodes)
  but never mutated, because the fields the webhook adds have no place there.

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

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook.core import patch, pods
from webhook.offline.controllers import BY_KIND
from webhook.offline.controllers import TABLE as TABLE
from webhook.offline.workload_kinds import INLINE as INLINE
from webhook.offline.workload_kinds import OVERRIDE as OVERRIDE
from webhook.offline.workload_kinds import PLACEHOLDER as PLACEHOLDER
from webhook.offline.workload_kinds import TEMPLATE as TEMPLATE
from webhook.offline.workload_kinds import Path, TemplateRule, Workload, dotted, item_label
from webhook.offline.workload_kinds import Template as Template

# Fields of a KServe component that are not pod spec fields (ComponentExtensionSpec, the 1-of predictors).
_INLINE_NOT_POD = frozenset({
    "labels", "annotations", "workerSpec", "storageUris", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric",
    "scaleMetricType", "containerConcurrency", "timeout", "canaryTrafficPercent", "logger", "batcher",
    "deploymentStrategy", "autoScaling", "pipelineParallelSize", "tensorParallelSize",
})  # fmt: skip


def workload(api_version: str, kind: str) -> Workload | None:
    return BY_KIND.get((api_version.rpartition("/")[0], kind))


# --- finding templates ------------------------------------------------------------------------


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
                    yield from _walk(value, rest, (*path, index), (*matched, item_label(value, index)))
    elif isinstance(node, Mapping) and node.get(token) is not None:
        yield from _walk(node[token], rest, (*path, token), matched)


def templates(body: Mapping[str, Any], found: Workload) -> list[Template]:
    """Every pod template of the object (absent optional templates are skipped).

    Raises ``pods.MalformedPod`` naming the field when a template is not an object."""
    out = _found(body, [rule for rule in found.templates if not rule.fallback])
    return out or _found(body, [rule for rule in found.templates if rule.fallback])


def _found(body: Mapping[str, Any], rules: list[TemplateRule]) -> list[Template]:
    out = []
    for rule in rules:
        for path, matched, node in _walk(body, rule.tokens, (), ()):
            out.append(Template(rule, path, matched, pods.mapping(node, dotted(path) or "the object")))
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
        metadata, spec = (rule.build or _override_pod)(body, template)
    if rule.limits is not None:
        spec = _with_limits(spec, rule.limits(body), template)
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


def _with_limits(spec: Any, limits: Mapping[str, int], template: Template) -> Any:
    """The spec with ``limits`` set on its first container (copies: the object is never touched). A template
    without containers is left as it is: the controller adds the container, the webhook decides on its pods."""
    if not limits or not isinstance(spec, Mapping):
        return spec
    containers = pods.sequence(spec.get("containers"), f"{template.dotted}.spec.containers")
    if not containers:
        return spec
    first = pods.mapping(containers[0], f"{template.dotted}.spec.containers[0]")
    resources = pods.mapping(first.get("resources"), f"{template.dotted}.spec.containers[0].resources")
    own = pods.mapping(resources.get("limits"), f"{template.dotted}.spec.containers[0].resources.limits")
    container = {**first, "resources": {**resources, "limits": {**own, **limits}}}
    return {**spec, "containers": [container, *containers[1:]]}


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


def uncovered_gpu_paths(body: Any, is_gpu: Callable[[str], bool], routes: pods.RouteMatcher | None = None) -> list[str]:
    """Where an object reaches a GPU by a route of the catalogue: a GPU resource in a requests/limits map,
    a resource claim, and (with ``routes``) a privileged security context or a variable of the AMD
    container runtime in an env list."""
    found: list[str] = []

    def visit(node: Any, where: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                child = f"{where}.{key}" if where else str(key)
                if key in ("requests", "limits") and isinstance(value, Mapping):
                    found.extend(f"{child}[{name}]" for name in value if isinstance(name, str) and is_gpu(name))
                elif key == "resourceClaims" and isinstance(value, list) and value:
                    found.append(child)
                elif routes is not None and key == "securityContext" and isinstance(value, Mapping):
                    if routes.privileged and value.get("privileged") is True:
                        found.append(f"{child}.privileged")
                elif routes is not None and key == "env" and isinstance(value, list):
                    for index, entry in enumerate(value):
                        name = entry.get("name") if isinstance(entry, Mapping) else None
                        if isinstance(name, str) and routes.runtime_variable(name):
                            found.append(f"{child}[{index}]({name})")
                else:
                    visit(value, child)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, f"{where}[{index}]")

    visit(body, "")
    return found
