"""Hypothesis strategies for schema-valid Kubernetes pods, namespaces, node facts and policies, and random
clusters for the capacity model (``random_clusters``: a ``RandomCluster`` of raw objects, self-tested in
tests/test_strategies_cluster.py).

Shared by the property suite (tests/core/test_properties.py) and the service/fuzz suites. Everything
generated here is what a real kube-apiserver could send in an AdmissionReview: label keys and
values follow the qualified-name rules, GPU (extended) resources sit in ``limits`` (``requests``
equal them when present), node-selector requirements carry the values their operator needs,
``matchFields`` use ``metadata.name`` with exactly one value, and ``tolerationSeconds`` only
comes with ``NoExecute``. Optional parents are sometimes absent and sometimes JSON ``null``.

Hypothesis profiles are registered here (tests/conftest.py belongs to the service suite):
``default`` (150 examples) and ``fuzz`` (5000), selected with ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cluster_objects as co
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from webhook.core.decision import NamespaceFacts, NodeFacts
from webhook.core.policy import Policy, default_policy, load_policy
from webhook.deploy.device_classes import DeviceReservation

settings.register_profile(
    "default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile(
    "fuzz",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

POLICY_DIR = Path(__file__).parent / "fixtures" / "policies"

# The default policy's names (the property suite checks the patched pods against them).
RESERVED_KEY = "rocm-isolation.io/pool"
RESERVED_VALUE = "inference"
TAINT_KEY = "rocm-isolation.io/reserved"
TAINT_VALUE = "inference"
TAINT_EFFECT = "NoSchedule"
CLASS_LABEL = "rocm-isolation.io/class"
MODE_LABEL = "rocm-isolation.io/mode"
POD_CLASS_LABEL = "rocm-isolation.io/workload-class"
PSS_LABEL = "pod-security.kubernetes.io/enforce"
PARTITION_KEY = "amd.com/compute-memory-partition"
PARTITION_ALIAS = "amd.com/gpu.compute-memory-partition"
KFD_PATH = "/sys/class/kfd/kfd/topology/nodes"

RESERVED_NODE_NAMES = ("gpu-inf-0", "gpu-inf-1")
OTHER_NODE_NAMES = ("gpu-train-0", "gpu-train-1", "cpu-0")
NAMESPACE_NAMES = (
    "default",
    "team-a",
    "ml-serving",
    "inference-prod",
    "inference-canary",
    "research",
    "kube-system",
    "rocm-isolation-system",
)
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# Policy variants: the shipped default plus the prop-*.yaml files under tests/fixtures/policies/.
POLICY_FILES = ("prop-kfd.yaml", "prop-partition.yaml", "prop-allpods-warn.yaml", "prop-audit.yaml")


def policies() -> dict[str, Policy]:
    """The shipped default policy and the property-suite variants, by name."""
    out = {"default": default_policy()}
    for name in POLICY_FILES:
        out[name.removesuffix(".yaml")] = load_policy(POLICY_DIR / name)
    return out


_POLICIES = policies()
POLICY_NAMES = tuple(_POLICIES)


def policy_named(name: str) -> Policy:
    return _POLICIES[name]


# ---------------------------------------------------------------------------------------------
# Names, labels, annotations
# ---------------------------------------------------------------------------------------------

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?"
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?"

dns_labels: st.SearchStrategy[str] = st.from_regex(rf"\A{_DNS_LABEL}\Z")
label_names: st.SearchStrategy[str] = st.from_regex(rf"\A{_LABEL_NAME}\Z")
label_values: st.SearchStrategy[str] = st.one_of(st.just(""), label_names)
prefixes: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["example.com", "app.kubernetes.io", "rocm-isolation.io", "amd.com", "a.b-c.d"]),
    st.lists(dns_labels, min_size=1, max_size=3).map(".".join),
)
# Keys with a prefix (and therefore a "/", which must be escaped in JSON pointers) are common.
label_keys: st.SearchStrategy[str] = st.one_of(
    label_names,
    st.builds(lambda prefix, name: f"{prefix}/{name}", prefixes, label_names),
    st.sampled_from(["app", "app.kubernetes.io/name", "example.com/a", "pod-template-hash", RESERVED_KEY]),
)


@st.composite
def pod_labels(draw: st.DrawFn) -> dict[str, str] | None:
    labels = dict(draw(st.dictionaries(label_keys, label_values, max_size=4)))
    choice = draw(st.sampled_from(["none", "none", "inference", "training", "bogus"]))
    if choice != "none":
        labels[POD_CLASS_LABEL] = choice
    if not labels and draw(st.booleans()):
        return None
    return labels


annotation_values: st.SearchStrategy[str] = st.text(st.characters(codec="utf-8"), max_size=8)


@st.composite
def pod_annotations(draw: st.DrawFn) -> dict[str, str] | None:
    annotations = dict(draw(st.dictionaries(label_keys, annotation_values, max_size=3)))
    extra = draw(st.sampled_from(["none", "none", "none", "class-stale", "class-training", "mirror"]))
    if extra == "class-stale":
        annotations[CLASS_LABEL] = "stale"
    elif extra == "class-training":
        annotations[CLASS_LABEL] = "training"
    elif extra == "mirror":
        annotations["kubernetes.io/config.mirror"] = "0123456789abcdef"
    if not annotations and draw(st.booleans()):
        return None
    return annotations


def _maybe(draw: st.DrawFn, value: Any, *, null: bool = True) -> tuple[bool, Any]:
    """Whether to set an optional field, and to what (sometimes JSON null)."""
    choice = draw(st.sampled_from(["set", "set", "set", "absent", "null"] if null else ["set", "set", "absent"]))
    if choice == "absent":
        return False, None
    if choice == "null":
        return True, None
    return True, value


def _put(draw: st.DrawFn, target: dict[str, Any], key: str, value: Any, *, null: bool = True) -> None:
    present, body = _maybe(draw, value, null=null)
    if present:
        target[key] = body


# ---------------------------------------------------------------------------------------------
# Containers
# ---------------------------------------------------------------------------------------------

# Every resource route to a GPU: the device plugin's names (any under amd.com/) and a DRA extended resource.
GPU_RESOURCES = ("amd.com/gpu", "amd.com/cpx_nps4", "amd.com/gpu_vf", "deviceclass.resource.kubernetes.io/gpu.amd.com")
# The AMD container runtime's GPU selection variables (a name, and one of the prefix).
RUNTIME_VARIABLES = ("AMD_VISIBLE_DEVICES", "DOCKER_RESOURCE_GPU0")
QUANTITIES = {"cpu": ["100m", "1", "2"], "memory": ["128Mi", "1Gi"], "amd.com/gpu": ["1", "2", "8"]}


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    """Requests/limits. Extended (GPU) resources: limits only, or requests equal to limits."""
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    for name in ("cpu", "memory"):
        where = draw(st.sampled_from(["none", "requests", "limits", "both"]))
        value = draw(st.sampled_from(QUANTITIES[name]))
        if where in ("requests", "both"):
            requests[name] = value
        if where in ("limits", "both"):
            limits[name] = value
    for name in GPU_RESOURCES:
        where = draw(st.sampled_from(["none", "none", "limits", "both"]))
        value = draw(st.sampled_from(QUANTITIES["amd.com/gpu"]))
        if where != "none":
            limits[name] = value
        if where == "both":
            requests[name] = value
    body: dict[str, Any] = {}
    if requests or draw(st.booleans()):
        body["requests"] = requests
    if limits or draw(st.booleans()):
        body["limits"] = limits
    return body


# Since Kubernetes 1.34 an env var name may be any printable ASCII except "=".
env_names: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["HSA_QUEUE_PRIORITY", "GPU_MAX_HW_QUEUES", "HIP_FORCE_DEV_KERNARG", "PATH", "HSA_CU_MASK"]),
    st.sampled_from([*RUNTIME_VARIABLES, "ROCR_VISIBLE_DEVICES", "DOCKER_RESOURCES"]),
    st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z"),
    st.text(alphabet=[chr(c) for c in range(0x21, 0x7F) if chr(c) != "="], min_size=1, max_size=8),
)


@st.composite
def env_var(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(env_names)
    kind = draw(st.sampled_from(["value", "value", "empty", "fieldRef", "secret"]))
    if kind == "value":
        return {"name": name, "value": draw(st.sampled_from(["high", "low", "1", "4", "x/y~z"]))}
    if kind == "empty":
        return {"name": name}
    if kind == "fieldRef":
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}


@st.composite
def container(draw: st.DrawFn, name: str, volume_names: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": draw(st.sampled_from(["rocm/pytorch:latest", "busybox"]))}
    _put(draw, body, "resources", draw(resources()), null=False)
    _put(draw, body, "env", draw(st.lists(env_var(), max_size=4)))
    # A privileged container sees every GPU of its node: a GPU route of its own.
    context = draw(st.sampled_from(["absent", "absent", "absent", "empty", "unprivileged", "privileged"]))
    if context != "absent":
        body["securityContext"] = {
            "empty": {},
            "unprivileged": {"privileged": False},
            "privileged": {"privileged": True},
        }[context]
    if volume_names:
        mounts: list[dict[str, Any]] = []
        paths: set[str] = set()
        for volume in draw(st.lists(st.sampled_from(volume_names), max_size=3)):
            path = draw(st.sampled_from(["/data", "/cache", "/scratch", KFD_PATH]))
            if path in paths:
                continue
            paths.add(path)
            mount: dict[str, Any] = {"name": volume, "mountPath": path}
            if draw(st.booleans()):
                mount["readOnly"] = True
            mounts.append(mount)
        _put(draw, body, "volumeMounts", mounts)
    return body


# ---------------------------------------------------------------------------------------------
# Scheduling: tolerations, node selector, node affinity, topology spread
# ---------------------------------------------------------------------------------------------


@st.composite
def toleration(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(
        st.sampled_from(
            [
                "exists-any",
                "reserved-equal",
                "reserved-equal-other-value",
                "reserved-exists",
                "reserved-no-operator",
                "unhealthy",
                "dcm",
                "other",
            ]
        )
    )
    tol: dict[str, Any]
    if kind == "exists-any":
        tol = {"operator": "Exists"}
    elif kind == "reserved-equal":
        tol = {"key": TAINT_KEY, "operator": "Equal", "value": TAINT_VALUE}
    elif kind == "reserved-equal-other-value":
        tol = {"key": TAINT_KEY, "operator": "Equal", "value": "training"}
    elif kind == "reserved-exists":
        tol = {"key": TAINT_KEY, "operator": "Exists"}
    elif kind == "reserved-no-operator":
        tol = {"key": TAINT_KEY, "value": TAINT_VALUE}
    elif kind == "unhealthy":
        tol = {"key": "amd-gpu-unhealthy", "operator": "Exists"}
    elif kind == "dcm":
        tol = {"key": "amd-dcm", "operator": "Equal", "value": "up"}
    else:
        tol = {"key": draw(label_keys), "operator": "Equal", "value": draw(label_values)}
    effect = draw(st.sampled_from(["", *EFFECTS]))
    if effect:
        tol["effect"] = effect
    if effect == "NoExecute" and draw(st.booleans()):
        tol["tolerationSeconds"] = draw(st.integers(0, 3600))
    return tol


@st.composite
def node_selector(draw: st.DrawFn) -> dict[str, str]:
    selector = dict(draw(st.dictionaries(label_keys, label_values, max_size=2)))
    choice = draw(st.sampled_from(["none", "reserved", "other-pool", PARTITION_KEY]))
    if choice == "reserved":
        selector[RESERVED_KEY] = RESERVED_VALUE
    elif choice == "other-pool":
        selector[RESERVED_KEY] = "training"
    elif choice == PARTITION_KEY:
        selector[PARTITION_KEY] = "cpx_nps4"
    return selector


@st.composite
def match_expression(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(
        st.sampled_from(
            [
                "reserved-in",
                "reserved-in",
                "reserved-in-mixed",
                "reserved-in-other",
                "reserved-notin",
                "reserved-exists",
                "reserved-doesnotexist",
                "partition",
                "partition-alias",
                "device-id",
                "cu-count",
                "random",
            ]
        )
    )
    if kind == "reserved-in":
        return {"key": RESERVED_KEY, "operator": "In", "values": [RESERVED_VALUE]}
    if kind == "reserved-in-mixed":
        return {"key": RESERVED_KEY, "operator": "In", "values": [RESERVED_VALUE, "training"]}
    if kind == "reserved-in-other":
        return {"key": RESERVED_KEY, "operator": "In", "values": ["training"]}
    if kind == "reserved-notin":
        return {"key": RESERVED_KEY, "operator": "NotIn", "values": [RESERVED_VALUE]}
    if kind == "reserved-exists":
        return {"key": RESERVED_KEY, "operator": "Exists"}
    if kind == "reserved-doesnotexist":
        return {"key": RESERVED_KEY, "operator": "DoesNotExist"}
    if kind == "partition":
        return {"key": PARTITION_KEY, "operator": "In", "values": ["cpx_nps4"]}
    if kind == "partition-alias":
        return {"key": PARTITION_ALIAS, "operator": "In", "values": draw(st.sampled_from([["cpx_nps4"], ["spx_nps1"]]))}
    if kind == "device-id":
        return {"key": "amd.com/gpu.device-id", "operator": "In", "values": ["74a1"]}
    if kind == "cu-count":
        operator = draw(st.sampled_from(["Gt", "Lt"]))
        return {"key": "amd.com/gpu.cu-count", "operator": operator, "values": [str(draw(st.integers(0, 400)))]}
    operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
    expression: dict[str, Any] = {"key": draw(label_keys), "operator": operator}
    if operator in ("In", "NotIn"):
        expression["values"] = draw(st.lists(label_values, min_size=1, max_size=2))
    return expression


@st.composite
def match_field(draw: st.DrawFn) -> dict[str, Any]:
    # The apiserver allows only metadata.name with In/NotIn and exactly one value.
    name = draw(st.sampled_from([*RESERVED_NODE_NAMES, *OTHER_NODE_NAMES]))
    return {"key": "metadata.name", "operator": draw(st.sampled_from(["In", "In", "NotIn"])), "values": [name]}


@st.composite
def node_selector_term(draw: st.DrawFn) -> dict[str, Any]:
    term: dict[str, Any] = {}
    expressions = draw(st.lists(match_expression(), max_size=3))
    fields = draw(st.lists(match_field(), max_size=1))
    if expressions or draw(st.booleans()):
        term["matchExpressions"] = expressions
    elif draw(st.booleans()):
        term["matchExpressions"] = None
    if fields or draw(st.integers(0, 3)) == 0:
        term["matchFields"] = fields
    return term


@st.composite
def node_affinity(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    terms = draw(st.lists(node_selector_term(), min_size=0, max_size=4))
    if terms:
        body["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    elif draw(st.integers(0, 4)) == 0:
        body["requiredDuringSchedulingIgnoredDuringExecution"] = None
    preferred = draw(
        st.lists(
            st.fixed_dictionaries({"weight": st.integers(1, 100), "preference": node_selector_term()}),
            max_size=2,
        )
    )
    if preferred:
        body["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return body


@st.composite
def affinity(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    _put(draw, body, "nodeAffinity", draw(node_affinity()))
    if draw(st.integers(0, 4)) == 0:
        body["podAntiAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "x"}},
                    },
                }
            ]
        }
    return body


@st.composite
def spread_constraint(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "maxSkew": draw(st.integers(1, 3)),
        "topologyKey": draw(st.sampled_from(["kubernetes.io/hostname", "topology.kubernetes.io/zone"])),
        "whenUnsatisfiable": draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway"])),
    }
    if draw(st.booleans()):
        body["labelSelector"] = {"matchLabels": draw(st.dictionaries(label_keys, label_values, max_size=2))}
    return body


# ---------------------------------------------------------------------------------------------
# Pods
# ---------------------------------------------------------------------------------------------


@st.composite
def volumes(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"name": "data", "emptyDir": {}})
    if draw(st.booleans()):
        out.append({"name": "cache", "emptyDir": {"medium": "Memory"}})
    kfd = draw(st.sampled_from(["none", "none", "none", "same", "different"]))
    if kfd == "same":
        out.append({"name": "rocm-kfd-topology", "hostPath": {"path": KFD_PATH, "type": "Directory"}})
    elif kfd == "different":
        out.append({"name": "rocm-kfd-topology", "emptyDir": {}})
    return out


@st.composite
def pods(draw: st.DrawFn, *, gpu: bool | None = None) -> dict[str, Any]:
    """A schema-valid Pod as the apiserver sends it on CREATE.

    ``gpu=True`` forces at least one container to reach a GPU (``amd.com/gpu``, the DRA extended resource,
    privileged, or the AMD runtime's variable); ``False`` strips every route.
    """
    metadata: dict[str, Any] = {"name": draw(dns_labels)}
    _put(draw, metadata, "labels", draw(pod_labels()), null=False)
    _put(draw, metadata, "annotations", draw(pod_annotations()), null=False)
    if draw(st.booleans()):
        metadata["creationTimestamp"] = None  # what the apiserver sends on CREATE

    spec: dict[str, Any] = {}
    volume_list = draw(volumes())
    volume_names = [v["name"] for v in volume_list]
    spec["containers"] = [
        draw(container(f"c{i}", volume_names)) for i in range(draw(st.integers(min_value=1, max_value=3)))
    ]
    init = [draw(container(f"init{i}", volume_names)) for i in range(draw(st.integers(min_value=0, max_value=2)))]
    if init:
        spec["initContainers"] = init
    if volume_list:
        spec["volumes"] = volume_list
    elif draw(st.integers(0, 5)) == 0:
        spec["volumes"] = None
    spec = copy.deepcopy(spec)  # drawn values are never mutated (keeps Hypothesis' reports exact)
    init = spec.get("initContainers") or []
    if gpu is True:
        # Forced through one route of the catalogue (the others may be there too).
        first = spec["containers"][0]
        route = draw(
            st.sampled_from(["amd.com/gpu", "deviceclass.resource.kubernetes.io/gpu.amd.com", "privileged", "runtime"])
        )
        if route == "privileged":
            first["securityContext"] = {"privileged": True}
        elif route == "runtime":
            env = first.get("env") if isinstance(first.get("env"), list) else []
            first["env"] = [*env, {"name": draw(st.sampled_from(RUNTIME_VARIABLES)), "value": "all"}]
        else:
            if not isinstance(first.get("resources"), dict):
                first["resources"] = {}
            limits = first["resources"].get("limits")
            if not isinstance(limits, dict):
                limits = first["resources"]["limits"] = {}
            limits[route] = "1"
            requests = first["resources"].get("requests")
            if isinstance(requests, dict) and route in requests:
                requests[route] = "1"
    elif gpu is False:
        # No route at all: no GPU resource, not privileged, none of the AMD runtime's variables.
        for body in [*spec["containers"], *init]:
            for kind in ("requests", "limits"):
                quantities = (body.get("resources") or {}).get(kind)
                if isinstance(quantities, dict):
                    for name in GPU_RESOURCES:
                        quantities.pop(name, None)
            body.pop("securityContext", None)
            if isinstance(body.get("env"), list):
                body["env"] = [e for e in body["env"] if e.get("name") not in RUNTIME_VARIABLES]

    _put(draw, spec, "tolerations", draw(st.lists(toleration(), max_size=3)))
    _put(draw, spec, "nodeSelector", draw(node_selector()))
    node_name = draw(st.sampled_from(["", "", "", "", *RESERVED_NODE_NAMES, *OTHER_NODE_NAMES]))
    if node_name:
        spec["nodeName"] = node_name
    _put(draw, spec, "affinity", draw(affinity()))
    _put(draw, spec, "topologySpreadConstraints", draw(st.lists(spread_constraint(), max_size=2)))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@st.composite
def updated_pods(draw: st.DrawFn, old: dict[str, Any]) -> dict[str, Any]:
    """``old`` plus some added tolerations and labels (what an UPDATE may introduce)."""
    new = copy.deepcopy(old)
    added = draw(st.lists(toleration(), max_size=2))
    if added:
        existing = new["spec"].get("tolerations") or []
        new["spec"]["tolerations"] = [*existing, *added]
    extra = dict(draw(st.dictionaries(label_keys, label_values, max_size=2)))
    if draw(st.integers(0, 3)) == 0:
        extra[POD_CLASS_LABEL] = draw(st.sampled_from(["inference", "training", "bogus"]))
    if extra:
        new["metadata"]["labels"] = {**(new["metadata"].get("labels") or {}), **extra}
    return new


# ---------------------------------------------------------------------------------------------
# Namespaces and nodes
# ---------------------------------------------------------------------------------------------


@st.composite
def namespace_labels(draw: st.DrawFn) -> dict[str, str]:
    labels = dict(draw(st.dictionaries(label_keys, label_values, max_size=2)))
    for key, values in (
        (CLASS_LABEL, ["inference", "training", "bogus"]),
        (MODE_LABEL, ["enforce", "warn", "audit", "bogus"]),
        (PSS_LABEL, ["baseline", "restricted", "privileged"]),
        ("team", ["ml", "web"]),
    ):
        if draw(st.booleans()):
            labels[key] = draw(st.sampled_from(values))
    return labels


@st.composite
def namespaces(draw: st.DrawFn) -> NamespaceFacts:
    name = draw(st.one_of(st.sampled_from(NAMESPACE_NAMES), dns_labels))
    labels = draw(st.one_of(st.none(), namespace_labels()))
    return NamespaceFacts(name=name, labels=labels)


node_facts: st.SearchStrategy[NodeFacts] = st.sampled_from([NodeFacts(frozenset(RESERVED_NODE_NAMES)), NodeFacts(None)])
policy_names: st.SearchStrategy[str] = st.sampled_from(POLICY_NAMES)


# ---------------------------------------------------------------------------------------------
# Arbitrary JSON (for envelopes and pods broken in one place)
# ---------------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20,
)


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON document, the document itself (``()``) first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from json_paths(item, (*prefix, index))


# ---------------------------------------------------------------------------------------------
# Device-level reservation: ResourceClaims, ResourceClaimTemplates, pods' DRA extended resources
# ---------------------------------------------------------------------------------------------

RESERVED_CLASS = "rocm-isolation-reserved"
SHARED_CLASS = "rocm-isolation-shared"
DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
# GPU DeviceClasses: AMD's, the two of the reservation, one of the glob of prop-devices (GPU there only).
GPU_DEVICE_CLASSES = ("gpu.amd.com", RESERVED_CLASS, SHARED_CLASS)
GLOB_DEVICE_CLASS = "mi300x.gpu.example.com"
# Not GPU classes: a NIC, and a name the glob does not match.
OTHER_DEVICE_CLASSES = ("nic.example.com", "gpu.example.com")
DEVICE_CLASSES = (*GPU_DEVICE_CLASSES, GLOB_DEVICE_CLASS, *OTHER_DEVICE_CLASSES)
# The GPU DeviceClass's extendedResourceName of prop-devices (steered like its implicit name there).
OTHER_EXTENDED_RESOURCE = "example.com/amd-gpu"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"

# Policies for the claims: the shipped one, inference spill-over, and prop-devices (a glob of GPU classes,
# namespaces allowing both classes, a debug-only one). Kept apart from POLICY_NAMES (whose pod properties
# assume the reserved taint).
DEVICE_POLICY_FILES = ("device-spillover.yaml", "prop-devices.yaml")
_DEVICE_POLICIES = {
    "default": default_policy(),
    **{name.removesuffix(".yaml"): load_policy(POLICY_DIR / name) for name in DEVICE_POLICY_FILES},
}
device_policy_names: st.SearchStrategy[str] = st.sampled_from(tuple(_DEVICE_POLICIES))


def device_policy_named(name: str) -> Policy:
    return _DEVICE_POLICIES[name]


@st.composite
def device_namespaces(draw: st.DrawFn) -> NamespaceFacts:
    """The namespaces of the claim properties: prop-devices' rules by name (mixed, mixed-serving, lab), an
    excluded one, any other; labels as for pods (class, mode), or unknown."""
    names = ["research", "serving", "mixed", "mixed-serving", "lab", "default", "kube-system"]
    name = draw(st.one_of(st.sampled_from(names), dns_labels))
    if draw(st.integers(0, 4)) == 0:
        return NamespaceFacts(name=name, labels=None)
    labels = dict(draw(st.dictionaries(label_keys, label_values, max_size=1)))
    for key, values in (
        (CLASS_LABEL, ["inference", "inference", "training", "bogus", None]),
        (MODE_LABEL, ["enforce", "warn", "audit", "bogus", None, None, None]),
    ):
        value = draw(st.sampled_from(values))
        if value is not None:
            labels[key] = value
    return NamespaceFacts(name=name, labels=labels)


# AMD's class most often: what the webhook steers.
requested_device_classes: st.SearchStrategy[str] = st.sampled_from(("gpu.amd.com", "gpu.amd.com", *DEVICE_CLASSES))

_CEL_SELECTORS = (
    "device.driver == 'gpu.amd.com'",
    "device.capacity['gpu.amd.com'].memory.compareTo(quantity('64Gi')) >= 0",
)


def _device_amount(draw: st.DrawFn, body: dict[str, Any]) -> None:
    mode = draw(st.sampled_from(["none", "none", "ExactCount", "All"]))
    if mode == "All":
        body["allocationMode"] = "All"
    else:
        if mode == "ExactCount":
            body["allocationMode"] = "ExactCount"
        if draw(st.booleans()):
            body["count"] = draw(st.integers(1, 8))
    if draw(st.integers(0, 3)) == 0:
        body["selectors"] = [{"cel": {"expression": draw(st.sampled_from(_CEL_SELECTORS))}}]


@st.composite
def device_requests(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """One request: ``exactly`` (sometimes adminAccess, true or false) or ``firstAvailable`` (1-3 entries)."""
    if draw(st.integers(0, 2)) < 2:
        exactly: dict[str, Any] = {"deviceClassName": draw(requested_device_classes)}
        _device_amount(draw, exactly)
        admin = draw(st.sampled_from(["absent", "absent", "true", "false"]))
        if admin != "absent":
            exactly["adminAccess"] = admin == "true"
        return {"name": name, "exactly": exactly}
    entries = []
    for index in range(draw(st.integers(1, 3))):
        entry: dict[str, Any] = {"name": f"s{index}", "deviceClassName": draw(requested_device_classes)}
        _device_amount(draw, entry)
        entries.append(entry)
    return {"name": name, "firstAvailable": entries}


@st.composite
def resource_claims(draw: st.DrawFn) -> dict[str, Any]:
    """A schema-valid resource.k8s.io/v1 ResourceClaim or ResourceClaimTemplate as the apiserver sends it
    on CREATE (1-3 requests; sometimes none: their parents absent or null)."""
    kind = draw(st.sampled_from(["ResourceClaim", "ResourceClaimTemplate"]))
    requests = [draw(device_requests(f"r{index}")) for index in range(draw(st.integers(1, 3)))]
    shape = draw(st.integers(0, 9))
    spec: dict[str, Any] = {"devices": {"requests": requests}}
    if shape < 3:
        spec = [{}, {"devices": None}, {"devices": {"requests": None}}][shape]
    metadata: dict[str, Any] = (
        {"name": draw(dns_labels)} if draw(st.booleans()) else {"generateName": draw(dns_labels) + "-"}
    )
    annotations = dict(draw(st.dictionaries(label_keys, annotation_values, max_size=2)))
    extra = draw(st.sampled_from(["none", "none", "none", "none", "class-stale", "class-training", "scheduler"]))
    if extra == "class-stale":
        annotations[CLASS_LABEL] = "stale"
    elif extra == "class-training":
        annotations[CLASS_LABEL] = "training"
    elif extra == "scheduler":
        annotations[EXTENDED_RESOURCE_CLAIM_ANNOTATION] = "true"
    if annotations:
        metadata["annotations"] = annotations
    body = {"spec": spec} if kind == "ResourceClaimTemplate" else spec
    return copy.deepcopy({"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": metadata, "spec": body})


# The resource names of the device properties' pods: the implicit names of every device class above,
# amd.com/gpu (the shared class's extendedResourceName) and another GPU class's extendedResourceName.
DEVICE_RESOURCES = (
    *(DEVICE_CLASS_PREFIX + name for name in DEVICE_CLASSES),
    "amd.com/gpu",
    OTHER_EXTENDED_RESOURCE,
)


@st.composite
def device_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod whose containers and init containers ask for DRA extended resources (one to three names per
    container, several GPU names together too), with the requests the apiserver's defaulting gives a Pod
    before any webhook sees it (each limit copied to requests when absent there)."""
    pod = copy.deepcopy(draw(pods(gpu=False)))
    spec = pod["spec"]
    for body in [*spec["containers"], *(spec.get("initContainers") or [])]:
        if draw(st.integers(0, 3)) == 0:
            continue
        names = draw(st.lists(st.sampled_from(DEVICE_RESOURCES), min_size=1, max_size=3, unique=True))
        if not isinstance(body.get("resources"), dict):
            body["resources"] = {}
        resources = body["resources"]
        if not isinstance(resources.get("limits"), dict):
            resources["limits"] = {}
        for name in names:
            resources["limits"][name] = draw(st.sampled_from(["1", "2", "8"]))
        requests = resources.get("requests")
        requests = resources["requests"] = dict(requests) if isinstance(requests, dict) else {}
        for name, value in resources["limits"].items():
            requests.setdefault(name, value)
    return pod


# ---------------------------------------------------------------------------------------------
# Random clusters for the capacity model: nodes, pods, slices, claims, classes and the policy
# ---------------------------------------------------------------------------------------------

# Eight PCI slots of an MI300X node in PCI order; the reservation keeps the lowest ones of every node.
CLUSTER_SLOTS = tuple(f"0000:{bus}:00.0" for bus in ("03", "23", "43", "63", "83", "a3", "c3", "e3"))
# The node kinds random_clusters draws from: reserved whole (device plugin, label and taint), shared (device
# plugin), DRA shared, DRA split by the device-level reservation (labelled), AutoPartition (DRA, split or not).
NODE_KINDS = ("whole", "shared", "dra", "split", "autopartition")
# Namespace -> the class of its pods (kube-system is excluded by the policy: ``other``).
CLUSTER_NAMESPACES = {"serve": "inference", "ml": "training", "kube-system": "other"}
CONFLICT_TAINT = {"key": "gpu.amd.com/memory-partition-conflict", "effect": "NoExecute"}
DEVICE_TAINTS = (
    {"key": "amd-gpu-unhealthy", "value": "ecc", "effect": "NoExecute"},
    {"key": "gpu.amd.com/ecc-corrected", "value": "12", "effect": "None"},
    {"key": "maintenance", "effect": "NoSchedule"},
)


@dataclass
class RandomCluster:
    """A cluster as raw API objects (lists as the apiserver returns them) and the policy that governs it."""

    nodes: list[dict[str, Any]]
    namespaces: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    device_classes: list[dict[str, Any]]
    policy: Policy


@dataclass
class _Gpu:
    """One physical GPU of a DRA node: its PCI bus ID (None: not published) and the devices it is published
    as (one full device, 2-4 partitions, or the AutoPartition layouts), with which of them are taken."""

    pci: str | None
    devices: list[dict[str, Any]]
    taken: set[str] = field(default_factory=set)


def _dra_gpus(draw: st.DrawFn, kind: str, count: int) -> list[_Gpu]:
    gpus = []
    for index, slot in enumerate(CLUSTER_SLOTS[:count]):
        pci = None if draw(st.integers(0, 9)) == 0 else slot
        if kind == "autopartition":
            gpus.append(_Gpu(pci, [co.autopartition_device(index, pci, c, m) for c, m in co.LAYOUTS]))
        elif draw(st.integers(0, 4)) == 0:
            parts = draw(st.integers(2, 4))
            gpus.append(_Gpu(pci, [co.partition_device(f"gpu-{index}-cpx-{p}", pci) for p in range(parts)]))
        else:
            gpus.append(_Gpu(pci, [co.gpu_device(f"gpu-{index}", pci)]))
    return gpus


def _free_devices(gpus: list[_Gpu], memory: str | None, shared: bool) -> list[str]:
    """The devices a claim may still be allocated: not taken (``shared``: an AutoPartition device may be
    taken again), an AutoPartition GPU in the layout already allocated on it (one layout per GPU, the node's
    memory mode: ``memory``), a partitioned GPU's partitions one by one."""
    free = []
    for gpu in gpus:
        for device in gpu.devices:
            name = device["name"]
            if "consumesCounters" in device:
                layout_taken = bool(gpu.taken)
                if (layout_taken and name not in gpu.taken) or (memory and not name.endswith(memory)):
                    continue
                if name in gpu.taken and not shared:
                    continue
            elif name in gpu.taken:
                continue
            free.append(name)
    return free


@st.composite
def random_clusters(draw: st.DrawFn, *, max_nodes: int = 6, shared_devices: bool = False) -> RandomCluster:
    """A random cluster for the capacity model: 1 to ``max_nodes`` nodes of the kinds in NODE_KINDS (DRA ones
    with 2-8 GPUs, some partitioned, some without a PCI bus ID, some devices tainted), AMD's chart class and,
    when a node is split, the reservation's two classes (the N lowest of CLUSTER_SLOTS); pods of the classes
    inference (namespace serve), training (ml) and other (kube-system) bound to the nodes, asking for
    ``amd.com/gpu`` within a device-plugin node's allocatable, or holding allocated ResourceClaims on devices
    their node's slices publish (a claim the scheduler made for a DRA extended resource, sometimes); some
    pods pending (unbound, nothing allocated). A device is allocated at most once, one AutoPartition layout
    per GPU and one memory mode per node (the other mode's devices then carry the driver's conflict taint);
    ``shared_devices``: an AutoPartition device (``allowMultipleAllocations``) may be allocated to several
    claims."""
    pol = co.policy()
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    per_node = draw(st.integers(1, 2))
    kinds = draw(st.lists(st.sampled_from(NODE_KINDS), min_size=1, max_size=max_nodes))
    serial = iter(range(10_000))

    def add_pod(
        node_name: str | None, gpus: int = 0, claim: str | None = None, extended: bool = False
    ) -> dict[str, Any]:
        """A pod of a random namespace's class on ``node_name``: asking for ``gpus`` amd.com/gpu of the device
        plugin, or holding ``claim`` (``extended``: the one the scheduler made for ``gpus`` amd.com/gpu)."""
        ns = draw(st.sampled_from(sorted(CLUSTER_NAMESPACES)))
        name, inference = f"p{next(serial)}", CLUSTER_NAMESPACES[ns] == "inference"
        if claim is None:
            make = co.inference_pod if inference else co.pod
            obj = make(name, ns, node=node_name, gpus={"amd.com/gpu": str(gpus)} if gpus else {})
        elif extended:
            assert node_name is not None
            obj = co.extended_resource_pod(name, ns, node_name, claim, gpus, inference=inference)
        else:
            obj = co.claim_pod(name, ns, node_name, claim, inference=inference)
        pods.append(obj)
        return obj

    for index, kind in enumerate(kinds):
        name = f"{kind}-{index}"
        if kind in ("whole", "shared"):
            gpus = draw(st.integers(0, 8))
            nodes.append(co.node(name, reserved=kind == "whole", allocatable={"amd.com/gpu": str(gpus)}))
            free = gpus
            for _ in range(draw(st.integers(0, 4))):
                want = draw(st.integers(0, 2))
                if want > free:
                    break
                free -= want
                add_pod(name, want)
            continue
        split = kind == "split" or (kind == "autopartition" and draw(st.booleans()))
        nodes.append(co.dra_node(name, split=split))
        gpus = _dra_gpus(draw, kind, draw(st.integers(2, 8)))
        if kind == "autopartition":
            node_slices = co.autopartition_slices(name, [g.pci for g in gpus])
            node_slices[1]["spec"]["devices"] = [d for g in gpus for d in g.devices]
        else:
            node_slices = [co.node_slice(name, *(d for g in gpus for d in g.devices))]
        slices.extend(node_slices)
        memory: str | None = None
        for _ in range(draw(st.integers(0, 4))):
            held: list[str] = []
            for _ in range(draw(st.integers(1, 2))):
                free = [d for d in _free_devices(gpus, memory, shared_devices) if d not in held]
                if not free:
                    break
                device = draw(st.sampled_from(free))
                held.append(device)
                gpu = next(g for g in gpus if any(d["name"] == device for d in g.devices))
                gpu.taken.add(device)
                if kind == "autopartition":
                    memory = device.rsplit("-", 1)[1]
            if not held:
                break
            claim_name = f"c{next(serial)}"
            holder = add_pod(name, len(held), claim_name, extended=draw(st.integers(0, 3)) == 0)
            ns, pod_name = holder["metadata"]["namespace"], holder["metadata"]["name"]
            device_class = draw(st.sampled_from([co.RESERVED_CLASS, co.SHARED_CLASS, co.DRIVER]))
            claims.append(co.held_claim(claim_name, ns, name, held, pods=[pod_name], device_class=device_class))
        for gpu in gpus:
            for device in gpu.devices:
                taints = []
                if memory and "consumesCounters" in device and not device["name"].endswith(memory):
                    taints.append(dict(CONFLICT_TAINT))
                if draw(st.integers(0, 11)) == 0:
                    taints.append(dict(draw(st.sampled_from(DEVICE_TAINTS))))
                if taints:
                    device["taints"] = taints
        for _ in range(draw(st.integers(0, 1))):
            add_pod(name)  # a pod without a GPU on a GPU node

    for _ in range(draw(st.integers(0, 2))):
        add_pod(None, draw(st.integers(1, 4)))  # pending: unbound, nothing allocated

    classes = [co.chart_class()]
    if any(n["metadata"]["labels"].get(co.POOL_LABEL) == co.SPLIT_LABELS[co.POOL_LABEL] for n in nodes):
        classes.extend(co.reservation_classes(DeviceReservation(per_node, CLUSTER_SLOTS[:per_node]), policy=pol))
    namespaces = [
        co.namespace("serve", {CLASS_LABEL: "inference"}),
        co.namespace("ml", {CLASS_LABEL: "training"}),
        co.namespace("kube-system"),
    ]
    return RandomCluster(nodes, namespaces, pods, slices, claims, classes, pol)
