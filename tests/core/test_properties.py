"""Property tests of ``decide`` over generated, schema-valid pods, namespaces, node facts and policies.

For every generated input: ``decide`` never raises; a denial carries no patch; the patch applies
with ``jsonpatch``; the patched pod still validates strictly against the Kubernetes 1.37 schema;
a second run on the patched pod yields no operation (reinvocation idempotence); UPDATE never
patches. The safety invariant is checked with an independent scheduler model written here (it
does not use ``webhook.core.scheduling``): an admitted pod of an unreserved class can never be placed
on a reserved node, and an admitted inference pod can only be placed on reserved nodes.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import jsonschema
import kubernetes_validate
import pytest
import strategies as S
from hypothesis import event, given
from hypothesis import strategies as st
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

from webhook.core.decision import ClaimFacts, Decision, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.device_claims import DENY_RESERVED_CLASS, DENY_RESERVED_TOLERATION, decide_claim
from webhook.core.engine import DENY_CLASS, DENY_RESERVED_DEVICES, DENY_RULES, DENY_TOLERATION, decide, records_only
from webhook.core.policy import Policy, WorkloadClass

K8S_VERSION = "1.37.0"
TERMS = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")

# ---------------------------------------------------------------------------------------------
# An independent model of the scheduler's and kubelet's node predicates
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    taints: Sequence[Mapping[str, str]] = field(default_factory=tuple)

    @property
    def reserved(self) -> bool:
        return self.labels.get(S.RESERVED_KEY) == S.RESERVED_VALUE


RESERVED_TAINT = {"key": S.TAINT_KEY, "value": S.TAINT_VALUE, "effect": S.TAINT_EFFECT}


def _node(name: str, taints: Sequence[Mapping[str, str]] = (), **labels: str) -> Node:
    return Node(name, {"kubernetes.io/hostname": name, **labels}, tuple(taints))


# The synthetic cluster: the reserved nodes (named as in the node facts), each carrying the MI300X
# partition label under one of the two spellings the AMD labeller writes, and ordinary GPU/CPU nodes.
CLUSTER = (
    Node(
        S.RESERVED_NODE_NAMES[0],
        {
            "kubernetes.io/hostname": S.RESERVED_NODE_NAMES[0],
            S.RESERVED_KEY: S.RESERVED_VALUE,
            S.PARTITION_KEY: "cpx_nps4",
            "amd.com/gpu.device-id": "74a1",
            "amd.com/gpu.cu-count": "304",
        },
        (RESERVED_TAINT,),
    ),
    Node(
        S.RESERVED_NODE_NAMES[1],
        {
            "kubernetes.io/hostname": S.RESERVED_NODE_NAMES[1],
            S.RESERVED_KEY: S.RESERVED_VALUE,
            S.PARTITION_ALIAS: "cpx_nps4",
            "amd.com/gpu.device-id": "74a1",
            "amd.com/gpu.cu-count": "38",
        },
        (RESERVED_TAINT,),
    ),
    _node(
        "gpu-train-0", **{S.RESERVED_KEY: "training", "amd.com/gpu.device-id": "740f", "amd.com/gpu.cu-count": "104"}
    ),
    _node("gpu-train-1", **{"amd.com/gpu.device-id": "740f"}),
    _node("cpu-0"),
)
RESERVED_NODES = tuple(node for node in CLUSTER if node.reserved)
OTHER_NODES = tuple(node for node in CLUSTER if not node.reserved)


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def label_requirement_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """k8s.io/apimachinery labels.Requirement.Matches."""
    key = expression["key"]
    operator = expression["operator"]
    values = expression.get("values") or []
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        have, want = _as_int(labels[key]), _as_int(values[0])
        if have is None or want is None:
            return False
        return have > want if operator == "Gt" else have < want
    raise AssertionError(f"unknown operator {operator!r}")


def field_requirement_matches(expression: Mapping[str, Any], node: Node) -> bool:
    assert expression["key"] == "metadata.name", expression
    values = expression.get("values") or []
    if expression["operator"] == "In":
        return node.name in values
    if expression["operator"] == "NotIn":
        return node.name not in values
    raise AssertionError(f"operator {expression['operator']!r} is not allowed in matchFields")


def term_matches(term: Mapping[str, Any] | None, node: Node) -> bool:
    """A null or empty node selector term matches no objects; requirements inside are ANDed."""
    term = term or {}
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return all(label_requirement_matches(e, node.labels) for e in expressions) and all(
        field_requirement_matches(f, node) for f in fields
    )


def required_affinity_matches(spec: Mapping[str, Any], node: Node) -> bool:
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get(TERMS[2])
    if required is None:
        return True
    # Terms are ORed; a selector with no terms matches no node.
    return any(term_matches(term, node) for term in required.get("nodeSelectorTerms") or [])


def toleration_tolerates(toleration: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """k8s.io/api/core/v1 Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint["effect"]:
        return False
    key = toleration.get("key") or ""
    if key and key != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == taint["value"]
    return False


def feasible(pod: Mapping[str, Any], node: Node) -> bool:
    """Can the pod end up running on the node (via the scheduler, or via spec.nodeName and the kubelet)?

    The kubelet re-checks nodeName, nodeSelector and required node affinity at admission; a pod
    with spec.nodeName bypasses the scheduler and so only NoExecute taints keep it off the node.
    """
    spec = pod.get("spec") or {}
    node_name = spec.get("nodeName") or ""
    if node_name and node_name != node.name:
        return False
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(key) != value for key, value in selector.items()):
        return False
    if not required_affinity_matches(spec, node):
        return False
    blocking = ("NoExecute",) if node_name else ("NoSchedule", "NoExecute")
    tolerations = spec.get("tolerations") or []
    return all(
        any(toleration_tolerates(t, taint) for t in tolerations) for taint in node.taints if taint["effect"] in blocking
    )


def reachable(pod: Mapping[str, Any], nodes: Sequence[Node]) -> list[str]:
    return [node.name for node in nodes if feasible(pod, node)]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


@functools.cache
def _validator(filename: str) -> Any:
    """kubernetes_validate's strict schema of one kind for K8S_VERSION, built once (it re-reads 1.8 MB per call)."""
    base = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/"
    schema = schema_contents(base + filename, K8S_VERSION)
    definitions = schema_contents(base + "_definitions.json", K8S_VERSION)
    registry: Registry[Any] = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def _pod_validator() -> Any:
    return _validator("pod-v1.json")


def validate(pod: Mapping[str, Any]) -> None:
    """Strict Kubernetes 1.37 schema validation (same schema files as kubernetes_validate.validate)."""
    _pod_validator().validate(dict(pod))


def validate_claim(claim: Mapping[str, Any]) -> None:
    """The same, for a resource.k8s.io/v1 ResourceClaim or ResourceClaimTemplate."""
    _validator(f"{claim['kind'].lower()}-resource-v1.json").validate(dict(claim))


def apply(pod: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(pod), list(decision.patch))
    return patched


def run(
    pod: Any,
    namespace: NamespaceFacts,
    nodes: NodeFacts,
    policy: Policy,
    operation: str = "CREATE",
    old_pod: Any = None,
) -> Decision:
    before = copy.deepcopy(pod)
    decision = decide(operation=operation, pod=pod, old_pod=old_pod, namespace=namespace, nodes=nodes, policy=policy)
    assert pod == before, "decide must not modify the pod it is given"
    return decision


def is_gpu_resource(name: str) -> bool:
    """The catalogue's resource route, written independently: any name under amd.com/ (the device
    plugin) and the DRA extended resource of AMD's DeviceClass."""
    return name.startswith("amd.com/") or name == "deviceclass.resource.kubernetes.io/gpu.amd.com"


def reaches_gpu(body: Mapping[str, Any]) -> bool:
    """A container that reaches a GPU by any route of its own: a GPU resource, privileged, or a variable of
    the AMD container runtime (whatever its value)."""
    resources = body.get("resources") or {}
    names = {*(resources.get("requests") or {}), *(resources.get("limits") or {})}
    if any(is_gpu_resource(name) for name in names):
        return True
    if (body.get("securityContext") or {}).get("privileged") is True:
        return True
    variables = [e.get("name", "") for e in body.get("env") or []]
    return any(v == "AMD_VISIBLE_DEVICES" or v.startswith("DOCKER_RESOURCE_") for v in variables)


def gpu_containers(pod: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    out = []
    for list_name in ("initContainers", "containers"):
        for index, body in enumerate(pod["spec"].get(list_name) or []):
            if reaches_gpu(body):
                out.append((list_name, index, body))
    return out


def live_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    spec = pod["spec"]
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(TERMS[2])
    if required is None:
        return None
    terms = required.get("nodeSelectorTerms") or []
    return [t for t in terms if (t.get("matchExpressions") or t.get("matchFields"))]


def workload_class(policy: Policy, decision: Decision) -> WorkloadClass | None:
    if decision.workload_class is None:
        return None
    return policy.spec.classes[decision.workload_class]


def check_create(
    pod: dict[str, Any], namespace: NamespaceFacts, nodes: NodeFacts, policy_name: str
) -> tuple[Decision, dict[str, Any]]:
    """Every CREATE property that holds for any input; returns the decision and the patched pod."""
    policy = S.policy_named(policy_name)
    decision = run(pod, namespace, nodes, policy)
    event(f"{decision.mode} {decision.outcome} {decision.rule}")
    if not decision.allowed:
        assert decision.patch == (), "a denial must not carry a patch"
        assert decision.rule in DENY_RULES, decision
        assert decision.violations, decision
        assert decision.mode == "enforce", decision
    if decision.mode == "audit":
        assert decision.allowed and decision.patch == (), "audit mode changes nothing"
    if decision.violations and decision.mode == "warn":
        assert decision.allowed
        assert any(w.startswith("would be denied in enforce mode") for w in decision.warnings)

    patched = apply(pod, decision)
    validate(patched)
    again = run(patched, namespace, nodes, policy)
    assert again.patch == (), f"second run is not idempotent: {list(again.patch)}"

    if is_mirror(pod):
        assert decision.patch == (), "mirror pods belong to the kubelet: checked, never changed"
    elif decision.allowed and decision.mode != "audit" and decision.workload_class is not None:
        annotations = patched["metadata"].get("annotations") or {}
        assert annotations.get(S.CLASS_LABEL) == decision.workload_class
        if not all(records_only(op) for op in decision.patch):
            assert "rocm-isolation.io/mutations" in annotations
    return decision, patched


def is_mirror(pod: Mapping[str, Any]) -> bool:
    return "kubernetes.io/config.mirror" in (pod["metadata"].get("annotations") or {})


def check_placement(policy: Policy, decision: Decision, patched: Mapping[str, Any]) -> None:
    """The safety invariant, checked with the independent scheduler model. Mirror pods are left
    out: the kubelet already runs their static pod on its node, and they are never mutated."""
    cls = workload_class(policy, decision)
    if cls is None or not decision.allowed or decision.mode == "audit" or is_mirror(patched):
        return
    if cls.placement == "unreserved":
        # enforce and warn both add the NotIn requirement, so neither may leave a path to a reserved node.
        assert reachable(patched, RESERVED_NODES) == [], (
            f"an admitted {decision.workload_class} pod can still be placed on a reserved node"
        )
    elif cls.placement == "reserved" and decision.mode == "enforce":
        terms = live_terms(patched)
        assert terms is not None, "an inference pod must carry required node affinity"
        for term in terms:
            # Whole reserved nodes or nodes whose devices are split (the reserved DeviceClass picks the GPUs);
            # a narrower In (an earlier version's [inference]) places the pod as well.
            values = {S.RESERVED_VALUE, policy.spec.reserved_devices.node_label_value}
            assert any(
                e.get("key") == S.RESERVED_KEY
                and e.get("operator") == "In"
                and e.get("values")
                and set(e["values"]) <= values
                for e in term.get("matchExpressions") or []
            ), f"a live term lacks the reserved-node requirement: {term}"
        tolerations = patched["spec"].get("tolerations") or []
        assert any(toleration_tolerates(t, RESERVED_TAINT) for t in tolerations)
        assert reachable(patched, OTHER_NODES) == [], "an admitted inference pod can land on an unreserved node"


def check_env(policy: Policy, decision: Decision, pod: Mapping[str, Any], patched: Mapping[str, Any]) -> None:
    cls = workload_class(policy, decision)
    if cls is None or not decision.allowed or decision.mode == "audit" or is_mirror(pod):
        return
    for list_name, index, body in gpu_containers(patched):
        before = pod["spec"][list_name][index].get("env") or []
        after = body.get("env") or []
        for var in cls.env:
            old_entries = [e for e in before if e.get("name") == var.name]
            new_entries = [e for e in after if e.get("name") == var.name]
            if not old_entries:
                assert new_entries == [{"name": var.name, "value": var.value}], (list_name, index, var)
            elif var.on_conflict == "override":
                assert new_entries == [{"name": var.name, "value": var.value}] * len(old_entries)
            else:
                assert new_entries == old_entries, "onConflict keep must leave the container's own value"
    # Non-GPU containers are never touched.
    gpu = {(name, index) for name, index, _ in gpu_containers(pod)}
    for list_name in ("initContainers", "containers"):
        for index, body in enumerate(pod["spec"].get(list_name) or []):
            if (list_name, index) not in gpu:
                assert patched["spec"][list_name][index] == body


def _host_paths(pod: Mapping[str, Any]) -> list[Any]:
    return [v for v in pod["spec"].get("volumes") or [] if "hostPath" in v]


def check_kfd(
    policy: Policy, decision: Decision, namespace: NamespaceFacts, pod: Mapping[str, Any], patched: Mapping[str, Any]
) -> None:
    cls = workload_class(policy, decision)
    level = None if namespace.labels is None else namespace.labels.get(S.PSS_LABEL)
    if namespace.labels is None or level in ("baseline", "restricted") or cls is None or not cls.kfd_topology_mount:
        # The webhook never adds a hostPath volume that Pod Security could reject (or one not asked for).
        assert _host_paths(patched) == _host_paths(pod)
        return
    if not decision.allowed or decision.mode == "audit" or not gpu_containers(pod) or is_mirror(pod):
        return
    kfd = [v for v in patched["spec"].get("volumes") or [] if v["name"] == "rocm-kfd-topology"]
    assert len(kfd) == 1
    if "hostPath" not in kfd[0]:
        return  # the pod's own different volume of that name: skipped with a warning
    for _, _, body in gpu_containers(patched):
        assert any(m["mountPath"] == S.KFD_PATH for m in body.get("volumeMounts") or [])


# ---------------------------------------------------------------------------------------------
# Sanity of the scheduler model itself (a wrong model would make the properties vacuous)
# ---------------------------------------------------------------------------------------------


def test_cached_claim_validator_agrees_with_kubernetes_validate() -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu"},
        "spec": {"spec": {"devices": {"requests": [{"name": "r", "firstAvailable": [
            {"name": "s", "deviceClassName": "gpu.amd.com", "count": 1}]}]}}},
    }  # fmt: skip
    validate_claim(claim)
    kubernetes_validate.validate(claim, K8S_VERSION, strict=True)
    bad = copy.deepcopy(claim)
    bad["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["adminAccess"] = False
    with pytest.raises(jsonschema.ValidationError):
        validate_claim(bad)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_cached_validator_agrees_with_kubernetes_validate() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"rocm-isolation.io/class": "training"}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}],
            "tolerations": [{"operator": "Exists"}],
        },
    }
    validate(pod)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    bad = copy.deepcopy(pod)
    bad["spec"]["tolerations"][0]["bogus"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def _pod(**spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c"}], **spec}}


def test_model_reserved_nodes_need_the_toleration() -> None:
    assert reachable(_pod(), CLUSTER) == [n.name for n in OTHER_NODES]
    tolerating = _pod(tolerations=[{"operator": "Exists"}])
    assert reachable(tolerating, CLUSTER) == [n.name for n in CLUSTER]
    effect_only = _pod(tolerations=[{"operator": "Exists", "effect": "NoExecute"}])
    assert reachable(effect_only, RESERVED_NODES) == []
    # spec.nodeName bypasses the scheduler: NoSchedule taints do not stop it, affinity does.
    assert reachable(_pod(nodeName="gpu-inf-0"), CLUSTER) == ["gpu-inf-0"]


def test_model_affinity_terms_are_ored_expressions_anded() -> None:
    def with_terms(*terms: Any) -> dict[str, Any]:
        return _pod(
            tolerations=[{"key": S.TAINT_KEY, "operator": "Exists"}],
            affinity={"nodeAffinity": {TERMS[2]: {"nodeSelectorTerms": list(terms)}}},
        )

    notin = {"key": S.RESERVED_KEY, "operator": "NotIn", "values": [S.RESERVED_VALUE]}
    assert reachable(with_terms({"matchExpressions": [notin]}), CLUSTER) == [n.name for n in OTHER_NODES]
    pin = {"key": "metadata.name", "operator": "In", "values": ["gpu-inf-0"]}
    assert reachable(with_terms({"matchFields": [pin]}), CLUSTER) == ["gpu-inf-0"]
    assert reachable(with_terms({"matchFields": [pin], "matchExpressions": [notin]}), CLUSTER) == []
    assert reachable(with_terms({}, {"matchExpressions": None}), CLUSTER) == []
    alias = {"key": S.PARTITION_ALIAS, "operator": "In", "values": ["cpx_nps4"]}
    gt = {"key": "amd.com/gpu.cu-count", "operator": "Gt", "values": ["100"]}
    assert reachable(with_terms({"matchExpressions": [alias]}, {"matchExpressions": [gt]}), CLUSTER) == [
        "gpu-inf-0",
        "gpu-inf-1",
        "gpu-train-0",
    ]


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------


@given(pod=S.pods(), namespace=S.namespaces(), nodes=S.node_facts, policy_name=S.policy_names)
def test_create_any_pod(pod: dict[str, Any], namespace: NamespaceFacts, nodes: NodeFacts, policy_name: str) -> None:
    """Any pod, namespace, node facts and policy: the CREATE contract and the safety invariant."""
    validate(pod)
    policy = S.policy_named(policy_name)
    decision, patched = check_create(pod, namespace, nodes, policy_name)
    if not policy.spec.scope.all_pods and namespace.name not in policy.spec.excluded_namespaces:
        # The catalogue, as written independently here: a pod is in scope exactly when it reaches a GPU.
        assert (decision.rule != "not-gpu-pod") == bool(gpu_containers(pod)), decision
    check_placement(policy, decision, patched)
    check_env(policy, decision, pod, patched)
    check_kfd(policy, decision, namespace, pod, patched)


unreserved_namespaces = st.builds(
    NamespaceFacts,
    name=st.sampled_from(["default", "team-a", "research", "ml-serving"]),
    labels=st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {},
            optional={
                S.CLASS_LABEL: st.sampled_from(["training", "bogus"]),
                S.MODE_LABEL: st.sampled_from(["enforce", "warn"]),
                S.PSS_LABEL: st.sampled_from(["baseline", "privileged"]),
            },
        ),
    ),
)


@given(
    pod=S.pods(gpu=True),
    namespace=unreserved_namespaces,
    nodes=S.node_facts,
    policy_name=st.sampled_from(["default", "prop-kfd", "prop-partition", "prop-allpods-warn"]),
)
def test_training_gpu_pod_never_reaches_a_reserved_node(
    pod: dict[str, Any], namespace: NamespaceFacts, nodes: NodeFacts, policy_name: str
) -> None:
    """A GPU pod in a namespace that does not grant inference: denied, or kept off every reserved node."""
    policy = S.policy_named(policy_name)
    decision, patched = check_create(pod, namespace, nodes, policy_name)
    if policy_name == "default":
        assert decision.workload_class == "training"
    cls = workload_class(policy, decision)
    assert cls is not None
    if cls.placement == "unreserved":
        assert decision.mode in ("enforce", "warn")
        if decision.allowed and not is_mirror(pod):
            assert reachable(patched, RESERVED_NODES) == []
        # Mirror pods too: the annotation is no bypass of the checks.
        tolerating = [t for t in pod["spec"].get("tolerations") or [] if toleration_tolerates(t, RESERVED_TAINT)]
        if tolerating and decision.mode == "enforce":
            assert not decision.allowed and any(v.rule == DENY_TOLERATION for v in decision.violations)
    check_placement(policy, decision, patched)


inference_namespaces = st.builds(
    NamespaceFacts,
    name=st.sampled_from(["ml-serving", "inference-prod", "team-a"]),
    labels=st.fixed_dictionaries(
        {S.CLASS_LABEL: st.just("inference")},
        optional={S.PSS_LABEL: st.sampled_from(["baseline", "restricted", "privileged"])},
    ),
)


@given(
    pod=S.pods(gpu=True),
    namespace=inference_namespaces,
    nodes=S.node_facts,
    policy_name=st.sampled_from(["default", "prop-kfd", "prop-partition"]),
)
def test_inference_gpu_pod_is_pinned_to_reserved_nodes(
    pod: dict[str, Any], namespace: NamespaceFacts, nodes: NodeFacts, policy_name: str
) -> None:
    """In an inference namespace (enforce): admitted pods carry the In requirement in every live
    term and tolerate the reserved taint; the only denial is a pod label asking for another class."""
    policy = S.policy_named(policy_name)
    decision, patched = check_create(pod, namespace, nodes, policy_name)
    assert decision.mode == "enforce"
    requested = (pod["metadata"].get("labels") or {}).get(S.POD_CLASS_LABEL)
    # prop-partition's first rule lets inference-* namespaces run both classes; elsewhere the label grants one.
    two = policy_name == "prop-partition" and namespace.name.startswith("inference-")
    allowed = ("inference", "training") if two else ("inference",)
    if requested in (None, "inference"):
        assert decision.allowed and decision.workload_class == "inference"
    elif requested in allowed:
        # The pod picked another class its namespace allows; that class's checks apply.
        assert decision.workload_class == requested
    else:
        # A pod label never grants a class the namespace did not grant.
        assert not decision.allowed and {v.rule for v in decision.violations} == {DENY_CLASS}
        return
    check_placement(policy, decision, patched)
    check_env(policy, decision, pod, patched)
    check_kfd(policy, decision, namespace, pod, patched)


def _unconstrained(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    for name in ("nodeName", "nodeSelector", "affinity", "tolerations"):
        spec.pop(name, None)
    labels = pod["metadata"].get("labels") or {}
    labels.pop(S.POD_CLASS_LABEL, None)
    return pod


@given(
    pod=S.pods(gpu=True).map(_unconstrained),
    class_label=st.sampled_from(["inference", "training"]),
    nodes=S.node_facts,
    policy_name=st.sampled_from(["default", "prop-kfd", "prop-partition"]),
)
def test_mutation_does_not_over_constrain(
    pod: dict[str, Any], class_label: str, nodes: NodeFacts, policy_name: str
) -> None:
    """A pod with no placement of its own can reach every node of its class after mutation; with
    keyAliases, reserved nodes labelled with either partition-key spelling stay reachable."""
    namespace = NamespaceFacts("apps", {S.CLASS_LABEL: class_label})
    decision, patched = check_create(pod, namespace, nodes, policy_name)
    assert decision.allowed and decision.workload_class == class_label
    if is_mirror(pod):
        assert decision.rule == "mirror-pod" and decision.patch == ()
        return
    if class_label == "inference":
        assert reachable(patched, CLUSTER) == [n.name for n in RESERVED_NODES]
    else:
        assert reachable(patched, CLUSTER) == [n.name for n in OTHER_NODES]


@st.composite
def updates(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    old = draw(S.pods())
    return old, draw(S.updated_pods(old))


@given(pair=updates(), namespace=S.namespaces(), nodes=S.node_facts, policy_name=S.policy_names)
def test_update_never_patches(
    pair: tuple[dict[str, Any], dict[str, Any]], namespace: NamespaceFacts, nodes: NodeFacts, policy_name: str
) -> None:
    """UPDATE: only checked, never patched; a newly added toleration of the reserved taint is
    denied for an unreserved class in enforce mode."""
    old, new = pair
    validate(new)
    policy = S.policy_named(policy_name)
    decision = run(new, namespace, nodes, policy, operation="UPDATE", old_pod=old)
    assert decision.patch == ()
    if not decision.allowed:
        assert decision.rule in DENY_RULES and decision.mode == "enforce"
    cls = workload_class(policy, decision)
    if cls is None or cls.placement != "unreserved" or decision.mode != "enforce":
        return
    before = old["spec"].get("tolerations") or []
    added = [
        t for t in new["spec"].get("tolerations") or [] if t not in before and toleration_tolerates(t, RESERVED_TAINT)
    ]
    if added:
        assert not decision.allowed and any(v.rule == DENY_TOLERATION for v in decision.violations)


@given(pod=S.pods(), namespace=S.namespaces(), nodes=S.node_facts, policy_name=S.policy_names)
def test_update_that_changes_nothing_is_never_denied(
    pod: dict[str, Any], namespace: NamespaceFacts, nodes: NodeFacts, policy_name: str
) -> None:
    """UPDATE checks only what the update introduces: a pod updated without changing its
    placement, tolerations or labels (a finalizer or annotation change) is never blocked, whatever
    it looked like when it was admitted (before the policy, in audit mode, or in another class)."""
    old = copy.deepcopy(pod)
    new = copy.deepcopy(pod)
    new["metadata"].setdefault("finalizers", []).append("example.com/cleanup")
    decision = run(new, namespace, nodes, S.policy_named(policy_name), operation="UPDATE", old_pod=old)
    assert decision.allowed, decision.message
    assert decision.patch == ()


@given(
    operation=st.sampled_from(["DELETE", "CONNECT"]),
    pod=S.pods(),
    namespace=S.namespaces(),
    policy_name=S.policy_names,
)
def test_other_operations_are_ignored(
    operation: str, pod: dict[str, Any], namespace: NamespaceFacts, policy_name: str
) -> None:
    decision = run(pod, namespace, NodeFacts(None), S.policy_named(policy_name), operation=operation)
    assert decision.allowed and decision.patch == () and decision.rule == "operation-ignored"


# ---------------------------------------------------------------------------------------------
# Dynamic Resource Allocation: GPUs reached through claims, with no GPU resource at all
# ---------------------------------------------------------------------------------------------

# The namespace's claim templates as the cache resolves them: one GPU class, one other class.
DRA_TEMPLATES = {"mi300x": frozenset({"gpu.amd.com"}), "rdma": frozenset({"rdma.example.com"})}


@st.composite
def dra_pods(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A pod without GPU resources that names a claim: a GPU template, another device class, or a
    template the webhook cannot resolve. Returns the pod and whether it reaches a GPU (unresolvable
    counts as one)."""
    pod = copy.deepcopy(draw(S.pods(gpu=False)))
    template = draw(st.sampled_from(["mi300x", "rdma", "not-cached-yet"]))
    pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
    user = pod["spec"]["containers"][0]
    if not isinstance(user.get("resources"), dict):
        user["resources"] = {}
    user["resources"]["claims"] = [{"name": "dev"}]
    return pod, template != "rdma"


@given(drawn=dra_pods(), namespace=unreserved_namespaces, nodes=S.node_facts)
def test_training_pod_with_a_gpu_claim_never_reaches_a_reserved_node(
    drawn: tuple[dict[str, Any], bool], namespace: NamespaceFacts, nodes: NodeFacts
) -> None:
    pod, reaches_gpu = drawn

    def run_with_claims(body: dict[str, Any]) -> Decision:
        claims = ClaimFacts(templates=DRA_TEMPLATES)
        return decide(
            operation="CREATE",
            pod=body,
            namespace=namespace,
            nodes=nodes,
            policy=S.policy_named("default"),
            claims=claims,
        )

    decision = run_with_claims(pod)
    event(f"gpu={reaches_gpu} {decision.outcome} {decision.rule}")
    if not reaches_gpu:
        assert decision.rule == "not-gpu-pod" and decision.patch == ()
        return
    assert decision.workload_class == "training"
    patched = apply(pod, decision)
    validate(patched)
    if decision.allowed and not is_mirror(pod):
        assert reachable(patched, RESERVED_NODES) == []
        # The container that uses the claim is a GPU container: it gets the class's environment.
        if decision.mode != "audit":
            assert {"name": "HSA_QUEUE_PRIORITY", "value": "low"} in patched["spec"]["containers"][0]["env"]
    assert run_with_claims(patched).patch == ()


# ---------------------------------------------------------------------------------------------
# Device-level reservation: claims steered at CREATE, pods' DRA extended resources
# ---------------------------------------------------------------------------------------------

RESERVED_RESOURCE = S.DEVICE_CLASS_PREFIX + S.RESERVED_CLASS
SHARED_RESOURCE = S.DEVICE_CLASS_PREFIX + S.SHARED_CLASS


def is_gpu_class(policy_name: str, name: str) -> bool:
    """Which DeviceClasses hand out GPUs, written independently: AMD's, the reservation's two, and the glob's
    class where the policy lists the glob (prop-devices)."""
    return name in S.GPU_DEVICE_CLASSES or (policy_name == "prop-devices" and name == S.GLOB_DEVICE_CLASS)


def request_classes(claim: Mapping[str, Any]) -> list[list[str]]:
    """Per request, the DeviceClasses it names (``exactly``, then each ``firstAvailable`` entry)."""
    spec = claim["spec"]["spec"] if claim["kind"] == "ResourceClaimTemplate" else claim["spec"]
    out = []
    for request in ((spec or {}).get("devices") or {}).get("requests") or []:
        names = [request["exactly"]["deviceClassName"]] if request.get("exactly") else []
        names += [entry["deviceClassName"] for entry in request.get("firstAvailable") or []]
        out.append(names)
    return out


def run_claim(
    claim: Any, namespace: NamespaceFacts, policy: Policy, reserved: bool, *, tainted: bool = False
) -> Decision:
    before = copy.deepcopy(claim)
    decision = decide_claim(
        operation="CREATE",
        claim=claim,
        kind=claim["kind"],
        namespace=namespace,
        policy=policy,
        devices=DeviceFacts(devices_reserved=reserved, devices_tainted=tainted),
    )
    assert claim == before, "decide_claim must not modify the claim it is given"
    return decision


# The reserved-device taint (DeviceTaintRules, reservation mode "taints"), written independently.
DEVICE_TAINT_KEY = "rocm-isolation.io/reserved-device"


@st.composite
def device_tolerations(draw: st.DrawFn) -> dict[str, Any]:
    """A DeviceToleration as the apiserver accepts it: of every taint (empty key, Exists), of the reserved
    devices' key (Exists, or Equal with a value), of another key; any effect."""
    kind = draw(st.sampled_from(["every-taint", "reserved-exists", "reserved-equal", "other-exists", "other-equal"]))
    tol: dict[str, Any]
    if kind == "every-taint":
        tol = {"operator": "Exists"}
    elif kind == "reserved-exists":
        tol = {"key": DEVICE_TAINT_KEY, "operator": "Exists"}
    elif kind == "reserved-equal":
        tol = {"key": DEVICE_TAINT_KEY, "operator": "Equal", "value": draw(st.sampled_from([S.RESERVED_CLASS, "x"]))}
    elif kind == "other-exists":
        tol = {"key": draw(S.label_keys), "operator": "Exists"}
    else:
        tol = {"key": draw(S.label_keys), "operator": "Equal", "value": draw(S.label_values)}
    effect = draw(st.sampled_from(["", "", "NoSchedule", "NoExecute", "None"]))
    if effect:
        tol["effect"] = effect
    if effect == "NoExecute" and draw(st.booleans()):
        tol["tolerationSeconds"] = draw(st.integers(0, 3600))
    return tol


@st.composite
def claims_with_tolerations(draw: st.DrawFn) -> dict[str, Any]:
    """``S.resource_claims()``, each request (``exactly``) and subrequest sometimes carrying tolerations (or
    an explicit null)."""
    claim: dict[str, Any] = draw(S.resource_claims())
    spec = claim["spec"]["spec"] if claim["kind"] == "ResourceClaimTemplate" else claim["spec"]
    for request in ((spec or {}).get("devices") or {}).get("requests") or []:
        for body in [request["exactly"]] if request.get("exactly") else request.get("firstAvailable") or []:
            shape = draw(st.integers(0, 5))
            if shape == 0:
                body["tolerations"] = None
            elif shape <= 2:
                body["tolerations"] = draw(st.lists(device_tolerations(), max_size=3))
    return claim


def request_bodies(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every ``exactly`` and ``firstAvailable`` entry of the claim, in order."""
    spec = claim["spec"]["spec"] if claim["kind"] == "ResourceClaimTemplate" else claim["spec"]
    out: list[dict[str, Any]] = []
    for request in ((spec or {}).get("devices") or {}).get("requests") or []:
        out += [request["exactly"]] if request.get("exactly") else []
        out += request.get("firstAvailable") or []
    return out


def may_tolerate_device_taint(tol: Mapping[str, Any]) -> bool:
    """Could it tolerate the reserved-device taint (what a namespace without inference may not carry)?"""
    return tol.get("key") == DEVICE_TAINT_KEY or (not tol.get("key") and tol.get("operator") == "Exists")


def tolerates_device_taint(tol: Mapping[str, Any]) -> bool:
    """Does it tolerate the reserved-device taint (NoSchedule) whatever the taint's value?"""
    return (
        tol.get("operator") == "Exists"
        and tol.get("key", "") in ("", DEVICE_TAINT_KEY)
        and tol.get("effect", "") in ("", "NoSchedule")
    )


def claim_decision_facts(decision: Decision) -> tuple[Any, ...]:
    violations = tuple((v.rule, v.field, v.message) for v in decision.violations)
    return (decision.allowed, decision.rule, decision.message, decision.patch, decision.warnings, violations)


@given(
    claim=claims_with_tolerations(),
    namespace=S.device_namespaces(),
    policy_name=S.device_policy_names,
    reserved=st.sampled_from([True, True, True, False]),
    tainted=st.booleans(),
)
def test_claims_under_device_reservation(
    claim: dict[str, Any], namespace: NamespaceFacts, policy_name: str, reserved: bool, tainted: bool
) -> None:
    """Any claim or template, namespace and policy: ``decide_claim`` never raises, a denial carries no patch,
    the patch applies and the result is valid Kubernetes 1.37, a second run changes nothing; nothing at
    all without a reservation. With one (enforce, admitted): a claim of a namespace whose class is not
    inference names no GPU class but the shared one (the reserved one only where the namespace also
    allows inference and the author named it); an inference claim names only the reserved class, and the
    shared one where the author named it or the policy spills over. Tolerations of the reserved-device
    taint: every request or subrequest for the reserved class of a namespace that may use it tolerates the
    taint, its own tolerations kept before the added one; a claim of any other namespace that could
    tolerate it is denied; the same in either reservation mode."""
    validate_claim(claim)
    policy = S.device_policy_named(policy_name)
    decision = run_claim(claim, namespace, policy, reserved, tainted=tainted)
    other = run_claim(claim, namespace, policy, reserved, tainted=not tainted)
    assert claim_decision_facts(other) == claim_decision_facts(decision), "the reservation's mode changes nothing"
    event(f"{decision.mode} {decision.outcome} {decision.rule}")
    if not decision.allowed:
        assert decision.patch == () and decision.mode == "enforce"
        assert decision.rule in (DENY_RESERVED_CLASS, DENY_RESERVED_TOLERATION)
        assert decision.code == 403 and decision.violations
    if decision.mode == "audit" or not reserved:
        assert decision.allowed and decision.patch == ()
    patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(claim), list(decision.patch))
    validate_claim(patched)
    again = run_claim(patched, namespace, policy, reserved, tainted=tainted)
    assert again.patch == (), f"second run is not idempotent: {list(again.patch)}"
    assert again.allowed == decision.allowed

    scheduler = (claim["metadata"].get("annotations") or {}).get(S.EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"
    excluded = namespace.name in policy.spec.excluded_namespaces
    if not reserved or excluded or (scheduler and claim["kind"] == "ResourceClaim"):
        assert decision.patch == () and decision.allowed
        return
    classes = policy.namespace_classes(namespace.name, namespace.labels)
    inference = policy.spec.classes[classes.default].placement == "reserved"
    may_use_reserved = any(policy.spec.classes[name].placement == "reserved" for name in classes.allowed)
    tolerating = [tol for body in request_bodies(claim) for tol in body.get("tolerations") or []]
    if not may_use_reserved and any(map(may_tolerate_device_taint, tolerating)):
        assert DENY_RESERVED_TOLERATION in {v.rule for v in decision.violations}, decision
    if DENY_RESERVED_TOLERATION in {v.rule for v in decision.violations}:
        assert not may_use_reserved and any(map(may_tolerate_device_taint, tolerating)), decision
    if not decision.allowed or decision.mode != "enforce":
        return
    for body in request_bodies(patched):
        own = body.get("tolerations") or []
        if not may_use_reserved:
            assert not any(map(may_tolerate_device_taint, own)), body
        elif body["deviceClassName"] == S.RESERVED_CLASS:
            assert any(map(tolerates_device_taint, own)), body
    # The author's tolerations are kept, in order, ahead of any added one (a spill-over adds subrequests).
    if len(request_bodies(claim)) == len(request_bodies(patched)):
        for before_body, after_body in zip(request_bodies(claim), request_bodies(patched), strict=True):
            kept = before_body.get("tolerations") or []
            assert (after_body.get("tolerations") or [])[: len(kept)] == kept, (before_body, after_body)
    spillover = policy.spec.reserved_devices.inference_spillover
    for before, after in zip(request_classes(claim), request_classes(patched), strict=True):
        gpu = [name for name in after if is_gpu_class(policy_name, name)]
        # Requests of classes that hand out no GPU are never touched.
        assert [n for n in after if not is_gpu_class(policy_name, n)] == [
            n for n in before if not is_gpu_class(policy_name, n)
        ]
        if not inference:
            assert set(gpu) <= {S.SHARED_CLASS, S.RESERVED_CLASS}, (before, after)
            if S.RESERVED_CLASS in gpu:
                assert may_use_reserved and S.RESERVED_CLASS in before, (before, after)
        else:
            assert set(gpu) <= {S.RESERVED_CLASS, S.SHARED_CLASS}, (before, after)
            if S.SHARED_CLASS in gpu:
                assert S.SHARED_CLASS in before or (spillover and after[:2] == [S.RESERVED_CLASS, S.SHARED_CLASS])
    if decision.patch:
        assert (patched["metadata"].get("annotations") or {}).get(S.CLASS_LABEL) == classes.default


def resource_names(pod: Mapping[str, Any]) -> list[tuple[str, int, str, str]]:
    """(container list, index, requests|limits, name) of every resource the pod's containers ask for."""
    out = []
    for list_name in ("initContainers", "containers"):
        for index, body in enumerate(pod["spec"].get(list_name) or []):
            for kind in ("requests", "limits"):
                for name in (body.get("resources") or {}).get(kind) or {}:
                    out.append((list_name, index, kind, name))
    return out


def own_placement_reaches(pod: Mapping[str, Any], node: Node) -> bool:
    """Whether the pod's own nodeName, nodeSelector and required node affinity allow the node (taints aside)."""
    spec = pod["spec"]
    if spec.get("nodeName") and spec["nodeName"] != node.name:
        return False
    if any(node.labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    return required_affinity_matches(spec, node)


def is_gpu_resource_of_a_class(policy_name: str, name: str) -> bool:
    """A DRA extended resource of a GPU DeviceClass, written independently: an implicit name of one, or the
    policy's extendedResourceName of another GPU class (prop-devices)."""
    if name.startswith(S.DEVICE_CLASS_PREFIX):
        return is_gpu_class(policy_name, name.removeprefix(S.DEVICE_CLASS_PREFIX))
    return policy_name == "prop-devices" and name == S.OTHER_EXTENDED_RESOURCE


@given(
    pod=S.device_pods(),
    namespace=S.device_namespaces(),
    policy_name=S.device_policy_names,
    tainted=st.sampled_from([False, False, True]),
)
def test_pods_under_device_reservation(
    pod: dict[str, Any], namespace: NamespaceFacts, policy_name: str, tainted: bool
) -> None:
    """A reservation is active: the pod contract holds (patch applies, valid, idempotent), an admitted pod of
    a class other than inference never asks for the reserved class (enforce: nor for any GPU class but the
    shared one; warn: only with the violation said), an admitted inference pod keeps no amd.com/gpu (unless
    its own placement keeps it off the nodes whose devices are split) and asks for no GPU class but the
    reserved one (and the shared one where it asked for it itself), and a steered name is the same in
    requests and limits. When DeviceTaintRules hold the reservation (``tainted``), no inference pod is given
    the reserved class's implicit name (its claim would carry no toleration): its GPU names go to the
    shared class, amd.com/gpu kept, with a warning unless it pins itself to the whole reserved nodes."""
    validate(pod)
    policy = S.device_policy_named(policy_name)

    def judge(body: dict[str, Any]) -> Decision:
        return decide(
            operation="CREATE",
            pod=body,
            namespace=namespace,
            nodes=NodeFacts(None),
            policy=policy,
            devices=DeviceFacts(devices_reserved=True, devices_tainted=tainted),
        )

    before = copy.deepcopy(pod)
    decision = judge(pod)
    assert pod == before
    event(f"{decision.mode} {decision.outcome} {decision.rule}")
    if not decision.allowed:
        assert decision.patch == () and decision.rule in DENY_RULES and decision.mode == "enforce"
    patched = apply(pod, decision)
    validate(patched)
    assert judge(patched).patch == (), "second run is not idempotent"
    cls = workload_class(policy, decision)
    if cls is None or not decision.allowed or decision.mode == "audit" or is_mirror(pod):
        return
    names = resource_names(patched)
    asked = {name for *_, name in names}
    for list_name, index, _, name in names:
        resources = patched["spec"][list_name][index]["resources"]
        if name in (RESERVED_RESOURCE, SHARED_RESOURCE) and name in (resources.get("limits") or {}):
            assert resources["requests"][name] == resources["limits"][name], resources
    if cls.placement != "reserved":
        if RESERVED_RESOURCE in asked:
            assert decision.mode == "warn" and DENY_RESERVED_DEVICES in {v.rule for v in decision.violations}
        if decision.mode == "enforce":
            assert RESERVED_RESOURCE not in asked
            assert {n for n in asked if is_gpu_resource_of_a_class(policy_name, n)} <= {SHARED_RESOURCE}, asked
        return
    if tainted:
        original = {name for *_, name in resource_names(pod)}
        if RESERVED_RESOURCE in asked:
            assert RESERVED_RESOURCE in original, asked
        if decision.mode != "audit":
            gpu = {n for n in original if n == "amd.com/gpu" or is_gpu_resource_of_a_class(policy_name, n)}
            warned = any("device-level reservation by DeviceTaintRules" in w for w in decision.warnings)
            split = policy.spec.reserved_devices.node_label_value
            split_node = Node("gpu-split-0", {**RESERVED_NODES[0].labels, S.RESERVED_KEY: split})
            if gpu - {SHARED_RESOURCE} and own_placement_reaches(pod, split_node):
                assert warned, decision.warnings
        if decision.mode == "enforce":
            assert {n for n in asked if is_gpu_resource_of_a_class(policy_name, n)} <= {
                SHARED_RESOURCE,
                RESERVED_RESOURCE,
            }, asked
        return
    if decision.mode == "enforce":
        original = {name for *_, name in resource_names(pod)}
        if "amd.com/gpu" in asked:
            # Kept only by a pod whose own placement keeps it off the nodes whose devices are split: it pins
            # itself to the whole reserved nodes (device-plugin nodes in a mixed cluster serve amd.com/gpu).
            split = policy.spec.reserved_devices.node_label_value
            split_node = Node("gpu-split-0", {**RESERVED_NODES[0].labels, S.RESERVED_KEY: split})
            assert not own_placement_reaches(pod, split_node), asked
        gpu = {n for n in asked if is_gpu_resource_of_a_class(policy_name, n)}
        assert gpu <= {RESERVED_RESOURCE, SHARED_RESOURCE}, asked
        if SHARED_RESOURCE in gpu:
            assert SHARED_RESOURCE in original


RESERVED_DEVICE_TOLERATION = {"key": DEVICE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


@given(claim=claims_with_tolerations(), name=st.sampled_from(["serving", "llm", "mixed-serving"]))
def test_inference_claims_spill_over_to_valid_subrequests(claim: dict[str, Any], name: str) -> None:
    """Inference spill-over (device-spillover): each exact request of a GPU class other than the reservation's
    two becomes ``firstAvailable: [reserved, shared]`` (admin access: pointed at the reserved class, never
    spilled), each subrequest keeping the request's fields a subrequest has, the reserved one (and any
    exact request for the reserved class) tolerating the reserved-device taint; valid, and decided once."""
    policy = S.device_policy_named("device-spillover")
    namespace = NamespaceFacts(name, {S.CLASS_LABEL: "inference"})
    decision = run_claim(claim, namespace, policy, True)
    event(f"{decision.outcome} {decision.rule}")
    patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(claim), list(decision.patch))
    validate_claim(patched)
    assert run_claim(patched, namespace, policy, True).patch == ()
    scheduler = (claim["metadata"].get("annotations") or {}).get(S.EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"
    if scheduler and claim["kind"] == "ResourceClaim":
        return
    spec = claim["spec"]["spec"] if claim["kind"] == "ResourceClaimTemplate" else claim["spec"]
    after = patched["spec"]["spec"] if claim["kind"] == "ResourceClaimTemplate" else patched["spec"]
    for request, result in zip(
        ((spec or {}).get("devices") or {}).get("requests") or [],
        ((after or {}).get("devices") or {}).get("requests") or [],
        strict=True,
    ):
        exactly = request.get("exactly")
        if not exactly or not is_gpu_class("device-spillover", exactly["deviceClassName"]):
            continue
        own = exactly.get("tolerations") or []
        # A request for the reserved class tolerates the reserved-device taint (added unless it already did).
        tolerations = own if any(map(tolerates_device_taint, own)) else [*own, RESERVED_DEVICE_TOLERATION]
        if exactly["deviceClassName"] == S.SHARED_CLASS:
            assert result == request
        elif exactly["deviceClassName"] == S.RESERVED_CLASS:
            assert result == {**request, "exactly": {**exactly, "tolerations": tolerations}}
        elif exactly.get("adminAccess"):
            assert result["exactly"] == {**exactly, "deviceClassName": S.RESERVED_CLASS, "tolerations": tolerations}
        else:
            fields = {k: v for k, v in exactly.items() if k not in ("deviceClassName", "adminAccess")}
            assert result == {
                "name": request["name"],
                "firstAvailable": [
                    {"name": "reserved", **fields, "deviceClassName": S.RESERVED_CLASS, "tolerations": tolerations},
                    {"name": "shared", **fields, "deviceClassName": S.SHARED_CLASS},
                ],
            }
