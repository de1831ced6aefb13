"""Placement in the apiserver: a MutatingAdmissionPolicy rendered from the IsolationPolicy.

The mutating webhook runs with ``failurePolicy: Ignore`` (an outage must not stop every pod of the
cluster), so without this policy an inference pod admitted while the webhook is down has no affinity
and no toleration, and a training pod no ``NotIn``. The MutatingAdmissionPolicy (GA and on by default
in Kubernetes 1.36) applies the same placement as the engine, in the apiserver, before any mutating
webhook is called:

- the class as the engine decides it (namespace rules by name, glob and ``namespaceObject`` labels,
  the class label, ``defaultClass``; a pod label only picks a class its namespace allows), the
  same variables as the ValidatingAdmissionPolicy backstop (``cel._namespace_choice``);
- the class's node requirements (its placement requirement, then its ``nodeSelectorRequirements``
  with their key aliases) ANDed into **every** required ``nodeSelectorTerms`` entry, an empty term
  left alone, ``matchFields`` kept, a requirement with several spellings splitting a term into one
  per spelling; a term created when there is none (``scheduling.narrow_terms``);
- the reserved toleration unless a toleration already tolerates the taint, then the class's own
  tolerations unless the pod has the same one (``engine._plan_tolerations``);
- the class annotation ``rocm-isolation.io/class``, and ``node-affinity`` / ``tolerations`` in the
  ``rocm-isolation.io/mutations`` record when it changes them (the webhook merges its own entries into
  that value, ``engine._recorded_mutations``; both append only what is missing).

Everything is a ``JSONPatch`` mutation: ``nodeSelectorTerms``, ``matchExpressions`` and
``tolerations`` are atomic lists, which an ``ApplyConfiguration`` can only replace wholesale. A
mutation yields no operation when the pod already has what it would add, so the policy and the
webhook can run after one another in any order, any number of times (``reinvocationPolicy:
IfNeeded`` on both): neither undoes nor repeats the other.

What stays with the webhook (docs/architecture.md, "Who does what"): env variables, topology spread,
the KFD mount, pods that reach GPUs only through a DRA claim (CEL cannot read the ResourceClaimTemplate
to tell a GPU claim from another), warnings and audit annotations. The binding leaves out the
namespaces whose mode is ``audit`` (nothing is changed there), the excluded namespaces and the pods
opted out of the webhook.

Kubernetes CEL checks aggregate literals for one element type (``HomogeneousAggregateLiterals``) and
``object`` has no schema type here, so new list items are built with the pod's own types
(``Object.spec.tolerations{...}``), never map literals mixed with the pod's values.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from webhook.core import engine, patch, scheduling
from webhook.core.policy import Policy, RouteCatalogue, route_catalogue
from webhook.deploy import cel
from webhook.deploy.cel import quote, str_list

POLICY_NAME = "rocm-isolation-placement"
API_GROUP = "admissionregistration.k8s.io"
# --mutating-admission-policy: v1 (Kubernetes >= 1.36, the default), v1beta1 (1.34 and 1.35, with
# --feature-gates=MutatingAdmissionPolicy=true --runtime-config=admissionregistration.k8s.io/v1beta1=true
# on the apiserver), none (older clusters: placement by the webhook only).
VERSIONS = ("v1", "v1beta1", "none")
DEFAULT_VERSION = "v1"

_REQUIRED = f"object.spec.affinity.nodeAffinity.{scheduling.REQUIRED}"
_TERMS = f"{_REQUIRED}.nodeSelectorTerms"
_TERMS_PATH = patch.pointer(*scheduling.TERMS_PATH)
# The pod's own types (the schema the apiserver resolves ``Object`` against).
_T_AFFINITY = "Object.spec.affinity"
_T_NODE_AFFINITY = f"{_T_AFFINITY}.nodeAffinity"
_T_REQUIRED = f"{_T_NODE_AFFINITY}.{scheduling.REQUIRED}"
_T_TERM = f"{_T_REQUIRED}.nodeSelectorTerms"
_T_REQUIREMENT = f"{_T_TERM}.matchExpressions"
_T_TOLERATION = "Object.spec.tolerations"
_TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, list):
        return str_list([str(item) for item in value])
    raise TypeError(f"no CEL literal for {value!r}")


def _typed(type_name: str, fields: dict[str, Any]) -> str:
    return type_name + "{" + ", ".join(f"{key}: {_literal(value)}" for key, value in fields.items()) + "}"


# --- node affinity --------------------------------------------------------------------------------

_LIVE = "((has(t.matchExpressions) && size(t.matchExpressions) > 0) || (has(t.matchFields) && size(t.matchFields) > 0))"


def _implies(alternative: dict[str, Any]) -> str:
    """``scheduling._implies``: key and operator, and the values as a multiset (``In``: a non-empty subset)."""
    values = sorted(alternative.get("values") or [])
    head = f"e.key == {quote(alternative['key'])} && e.operator == {quote(alternative['operator'])}"
    if alternative["operator"] == "In":
        return f"({head} && has(e.values) && size(e.values) > 0 && e.values.all(v, v in {str_list(values)}))"
    return f"({head} && (has(e.values) ? e.values : []).sort() == {str_list(values)})"


def _excludes_reserved(reserved: scheduling.Reserved) -> str:
    """``Reserved.excludes_reserved``: any expression that keeps the pod off reserved nodes."""
    value = quote(reserved.value)
    return (
        f"(e.key == {quote(reserved.key)} && (e.operator == 'DoesNotExist' || "
        f"(e.operator == 'NotIn' && has(e.values) && {value} in e.values) || "
        f"(e.operator == 'In' && !(has(e.values) && {value} in e.values))))"
    )


def _satisfied(requirement: scheduling.Requirement) -> str:
    """``Requirement.satisfied`` of term ``t``."""
    parts = []
    if requirement.satisfied_by_exclusion is not None:
        parts.append(_excludes_reserved(requirement.satisfied_by_exclusion))
    parts.extend(_implies(alternative) for alternative in requirement.alternatives)
    return f"(has(t.matchExpressions) && t.matchExpressions.exists(e, {' || '.join(parts)}))"


def _term(expressions: str, *, fields: str | None) -> str:
    if fields is None:
        return f"{_T_TERM}{{matchExpressions: {expressions}}}"
    return f"{_T_TERM}{{matchFields: {fields}, matchExpressions: {expressions}}}"


def _combinations(requirements: tuple[scheduling.Requirement, ...]) -> list[tuple[int, ...]]:
    """Which spelling of each requirement a variant uses, in ``narrow_terms``'s order."""
    return list(itertools.product(*(range(len(r.alternatives)) for r in requirements)))


def _new_terms(requirements: tuple[scheduling.Requirement, ...]) -> str:
    """``narrow_terms(None, requirements)``: the terms of a pod that has none."""
    terms = []
    for combination in _combinations(requirements):
        expressions = [
            _typed(_T_REQUIREMENT, r.alternatives[j]) for r, j in zip(requirements, combination, strict=True)
        ]
        terms.append(_term("[" + ", ".join(expressions) + "]", fields=None))
    return "[" + ", ".join(terms) + "]"


def _narrowed_term(requirements: tuple[scheduling.Requirement, ...]) -> str:
    """``narrow_terms`` of one existing term ``t``: the list of its variants."""
    keep = [f"(!{_LIVE} || {_satisfied(r)})" for r in requirements]
    variants = []
    for combination in _combinations(requirements):
        added = [
            f"({keep[i]} ? [] : [{_typed(_T_REQUIREMENT, r.alternatives[j])}])"
            for i, (r, j) in enumerate(zip(requirements, combination, strict=True))
        ]
        expressions = " + ".join(["(has(t.matchExpressions) ? t.matchExpressions : [])", *added])
        term = (
            f"(has(t.matchFields) ? {_term(expressions, fields='t.matchFields')} : {_term(expressions, fields=None)})"
        )
        # A variant using another spelling than the first only exists for a requirement the term lacks.
        needed = [f"!{keep[i]}" for i, j in enumerate(combination) if j > 0]
        variants.append(f"({' && '.join(needed)} ? [{term}] : [])" if needed else f"[{term}]")
    return " + ".join(variants)


def _affinity_patch(requirements: tuple[scheduling.Requirement, ...]) -> str:
    """The JSONPatch operations that narrow the pod's required node affinity (an empty list when it
    already is narrowed).

    The terms always travel inside a typed ``NodeSelector`` object, never as a bare list value: a
    JSONPatch value that is a list of typed objects panics kube-apiserver 1.36's cel-go (0.26,
    ``baseList.ConvertToNative``: "*structpb.Struct is not assignable to type *structpb.Value"),
    which fails the request with an HTTP/2 INTERNAL_ERROR."""
    new_terms = _new_terms(requirements)
    nodes = f"{_T_REQUIRED}{{nodeSelectorTerms: {new_terms}}}"
    node_affinity = f"{_T_NODE_AFFINITY}{{{scheduling.REQUIRED}: {nodes}}}"
    affinity = f"{_T_AFFINITY}{{nodeAffinity: {node_affinity}}}"
    base = patch.pointer("spec", "affinity")
    required_path = quote(base + "/nodeAffinity/" + scheduling.REQUIRED)
    narrowed = f"variables.nodeSelectorTerms.map(t, {_narrowed_term(requirements)}).flatten()"
    all_satisfied = " && ".join(_satisfied(r) for r in requirements)
    needs = f"{_LIVE} && !({all_satisfied})"
    return (
        f"!has(object.spec.affinity) ? [JSONPatch{{op: 'add', path: {quote(base)}, value: {affinity}}}] :\n"
        f"!has(object.spec.affinity.nodeAffinity) ? "
        f"[JSONPatch{{op: 'add', path: {quote(base + '/nodeAffinity')}, value: {node_affinity}}}] :\n"
        f"size(variables.nodeSelectorTerms) == 0 ? [JSONPatch{{op: 'add', path: {required_path}, value: {nodes}}}] :\n"
        f"variables.nodeSelectorTerms.exists(t, {needs}) ? [JSONPatch{{op: 'replace', path: {required_path}, "
        f"value: {_T_REQUIRED}{{nodeSelectorTerms: {narrowed}}}}}] : []"
    )


def _adds_node_affinity(requirements: tuple[scheduling.Requirement, ...]) -> str:
    """Whether ``_affinity_patch`` yields an operation (a pod without terms gets one; a live term
    lacking a requirement is narrowed)."""
    all_satisfied = " && ".join(_satisfied(r) for r in requirements)
    return (
        "size(variables.nodeSelectorTerms) == 0 || "
        f"variables.nodeSelectorTerms.exists(t, {_LIVE} && !({all_satisfied}))"
    )


# --- tolerations ----------------------------------------------------------------------------------


def _tolerates(key: str, value: str, effect: str) -> str:
    """``scheduling.tolerates`` of toleration ``t`` for the taint ``key=value:effect``."""
    exists = "(has(t.operator) && t.operator == 'Exists')"
    equal = "(!has(t.operator) || t.operator == 'Equal')"
    keyed = f"(t.key == {quote(key)} && ({exists} || ({equal} && (has(t.value) ? t.value : '') == {quote(value)})))"
    return f"((!has(t.effect) || t.effect == {quote(effect)}) && ((!has(t.key) || t.key == '') ? {exists} : {keyed}))"


def _same_toleration(body: dict[str, Any]) -> str:
    """Toleration ``t`` equals ``body`` as JSON (the engine compares dicts; the apiserver omits empty fields)."""
    parts = [
        f"has(t.{name}) && t.{name} == {_literal(body[name])}" if name in body else f"!has(t.{name})"
        for name in _TOLERATION_FIELDS
    ]
    return "(" + " && ".join(parts) + ")"


def _existing(condition: str) -> str:
    return f"(has(object.spec.tolerations) && object.spec.tolerations.exists(t, {condition}))"


def _tolerations_wanted(policy: Policy, class_name: str) -> list[tuple[str, str]]:
    """The tolerations the engine appends for the class, in its order, each as (the condition under
    which it is added, its typed value); an empty list when the class never adds any."""
    plan = engine._class_plan(policy, class_name)
    parts = []
    reserved = plan.reserved_toleration
    reserved_wanted = None
    if reserved is not None:
        reserved_wanted = "!" + _existing(_tolerates(reserved["key"], reserved["value"], reserved["effect"]))
        parts.append((reserved_wanted, _typed(_T_TOLERATION, reserved)))
    seen: list[dict[str, Any]] = []
    for body in plan.tolerations:
        if body in seen:
            continue
        seen.append(body)
        wanted = "!" + _existing(_same_toleration(body))
        if body == reserved and reserved_wanted is not None:
            wanted += f" && !({reserved_wanted})"
        parts.append((wanted, _typed(_T_TOLERATION, body)))
    return parts


def _tolerations_list(wanted: list[tuple[str, str]]) -> str:
    return " + ".join(f"({condition} ? [{value}] : [])" for condition, value in wanted)


def _adds_tolerations(wanted: list[tuple[str, str]]) -> str:
    """Whether ``_tolerations_patch`` adds any toleration (no typed object: usable in a variable)."""
    return " || ".join(f"({condition})" for condition, _ in wanted)


def _tolerations_patch(wanted: str) -> str:
    # [x].map(ws, ...)[0] binds the list to ws (Kubernetes CEL has no cel.bind): computed once. The
    # pod's types (Object...) exist in mutations only, so the list is not a policy variable. A missing
    # list is created empty, then appended to: a list of typed objects as a JSONPatch value panics
    # the apiserver (see _affinity_patch).
    return (
        f"[{wanted}].map(ws, size(ws) == 0 ? [] :\n"
        "(has(object.spec.tolerations) ? [] : [JSONPatch{op: 'add', path: '/spec/tolerations', value: []}]) +\n"
        "ws.map(w, JSONPatch{op: 'add', path: '/spec/tolerations/-', value: w}))[0]"
    )


# --- the class annotation -------------------------------------------------------------------------


def _annotation_patch() -> str:
    """The class annotation, and the policy's entries merged into the ``mutations`` annotation (what the
    webhook's ``engine._recorded_mutations`` does with its own: the existing value kept, the missing
    entries appended, nothing when every entry is listed). One mutation, evaluated first: on the pod
    before this policy's own placement, it records what the next two will change."""
    annotations = "object.metadata.annotations"
    key = quote(engine.CLASS_ANNOTATION)
    record = quote(engine.MUTATIONS_ANNOTATION)
    recorded = "variables.recordedMutations"
    added = "variables.addedMutations"
    joined = f"{added}.join(',')"
    merged = f"{recorded} == '' ? {joined} : {recorded} + ',' + {joined}"

    # string(): a variable is dyn, and map literals must be homogeneous (HomogeneousAggregateLiterals).
    def path(name: str) -> str:
        return quote(patch.pointer("metadata", "annotations", name))

    return (
        f"!has({annotations}) ? [JSONPatch{{op: 'add', path: '/metadata/annotations', value: size({added}) == 0 ? "
        f"{{{key}: variables.podClass}} : {{{key}: string(variables.podClass), {record}: {joined}}}}}] :\n"
        f"({key} in {annotations} && {annotations}[{key}] == variables.podClass ? [] :\n"
        f"  [JSONPatch{{op: 'add', path: {path(engine.CLASS_ANNOTATION)}, value: variables.podClass}}]) +\n"
        f"(size({added}) == 0 ? [] : [JSONPatch{{op: 'add', path: {path(engine.MUTATIONS_ANNOTATION)}, "
        f"value: {merged}}}])"
    )


def _record_variables(
    adds_node_affinity: list[tuple[str, str]], adds_tolerations: list[tuple[str, str]]
) -> list[dict[str, str]]:
    """What this policy changes on the pod (per class, ``false`` for a class it never changes), and the
    entries of the ``mutations`` annotation it adds for it."""
    annotations = "object.metadata.annotations"
    record = quote(engine.MUTATIONS_ANNOTATION)
    listed = "variables.recordedMutations.split(',')"
    return [
        {"name": "addsNodeAffinity", "expression": _by_class(adds_node_affinity, otherwise="false")},
        {"name": "addsTolerations", "expression": _by_class(adds_tolerations, otherwise="false")},
        {
            "name": "recordedMutations",
            "expression": f"has({annotations}) && {record} in {annotations} ? {annotations}[{record}] : ''",
        },
        {
            "name": "addedMutations",
            "expression": (
                f"(variables.addsNodeAffinity && !('node-affinity' in {listed}) ? ['node-affinity'] : []) + "
                f"(variables.addsTolerations && !('tolerations' in {listed}) ? ['tolerations'] : [])"
            ),
        },
    ]


# --- the policy -----------------------------------------------------------------------------------


def _by_class(branches: list[tuple[str, str]], *, otherwise: str = "[]") -> str:
    """One expression choosing the class's branch (``otherwise``, no operation, for a class not listed)."""
    out = otherwise
    for class_name, operations in reversed(branches):
        out = f"variables.podClass == {quote(class_name)} ? (\n{operations}) :\n{out}"
    return out


def class_variables(policy: Policy) -> list[dict[str, str]]:
    """The class of the pod, exactly as the ValidatingAdmissionPolicy backstop computes it."""
    spec = policy.spec
    pod_label = quote(spec.labels.pod_class)
    return [
        {
            "name": "namespaceClassLabel",
            "expression": cel._label_or_absent("namespaceObject", quote(spec.labels.namespace_class)),
        },
        {"name": "namespaceAllowedClasses", "expression": cel._namespace_choice(policy, allowed=True)},
        {"name": "namespaceDefaultClass", "expression": cel._namespace_choice(policy, allowed=False)},
        {
            "name": "podClass",
            "expression": (
                f"has(object.metadata.labels) && {pod_label} in object.metadata.labels &&\n"
                f"object.metadata.labels[{pod_label}] in variables.namespaceAllowedClasses\n"
                f"? object.metadata.labels[{pod_label}] : variables.namespaceDefaultClass"
            ),
        },
    ]


def without_claims(policy: Policy) -> RouteCatalogue:
    """The policy's GPU-route catalogue without the DRA claim route: CEL cannot read the
    ResourceClaim(Template) a pod names, so a pod that reaches GPUs only through a claim is placed by
    the webhook, which resolves it (the backstop still treats any claim as a GPU route)."""
    return dataclasses.replace(route_catalogue(policy.spec), resource_claims=False)


def match_conditions(policy: Policy) -> list[dict[str, str]]:
    """GPU pods by every route of the catalogue shared with the engine, the webhook and the backstop but
    the claims (``without_claims``); never mirror pods (the kubelet owns them: the engine checks them
    and never mutates them)."""
    conditions = []
    if not policy.spec.scope.all_pods:
        conditions.append({"name": "gpu-pods", "expression": cel.gpu_routes(without_claims(policy))})
    annotations = "object.metadata.annotations"
    conditions.append(
        {
            "name": "not-mirror-pod",
            "expression": f"!(has({annotations}) && {quote(engine.MIRROR_ANNOTATION)} in {annotations})",
        }
    )
    return conditions


def placement_policy_spec(policy: Policy) -> dict[str, Any]:
    """The MutatingAdmissionPolicy spec: the engine's placement and class annotation, per class."""
    variables = class_variables(policy)
    variables.append(
        {
            "name": "nodeSelectorTerms",
            "expression": (
                f"has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && has({_REQUIRED}) && "
                f"has({_TERMS}) ? {_TERMS} : []"
            ),
        }
    )
    affinity: list[tuple[str, str]] = []
    adds_node_affinity: list[tuple[str, str]] = []
    tolerations: list[tuple[str, str]] = []
    adds_tolerations: list[tuple[str, str]] = []
    for class_name in policy.spec.classes:
        plan = engine._class_plan(policy, class_name)
        if plan.requirements:
            affinity.append((class_name, _affinity_patch(plan.requirements)))
            adds_node_affinity.append((class_name, _adds_node_affinity(plan.requirements)))
        wanted = _tolerations_wanted(policy, class_name)
        if wanted:
            tolerations.append((class_name, _tolerations_patch(_tolerations_list(wanted))))
            adds_tolerations.append((class_name, _adds_tolerations(wanted)))
    variables.extend(_record_variables(adds_node_affinity, adds_tolerations))
    # The annotations first: what the placement mutations after it will change is read off the pod
    # as it arrives (each mutation sees the previous ones' result).
    mutations = [{"patchType": "JSONPatch", "jsonPatch": {"expression": _annotation_patch()}}]
    mutations.extend(
        {"patchType": "JSONPatch", "jsonPatch": {"expression": _by_class(branches)}}
        for branches in (affinity, tolerations)
        if branches
    )
    return {
        # A mutation that cannot be evaluated rejects the pod rather than admitting it unplaced
        # (docs/operations.md, "Failures"); the cost of the largest pods is measured in the e2e suite.
        "failurePolicy": "Fail",
        # The webhook (and any other mutating webhook) may change the pod after this policy: run again.
        "reinvocationPolicy": "IfNeeded",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ]
        },
        "matchConditions": match_conditions(policy),
        "variables": variables,
        "mutations": mutations,
    }


def mutating_modes_selector(policy: Policy) -> dict[str, Any]:
    """Namespaces whose effective mode mutates (enforce or warn): the mode label, or the policy's mode
    when the label is absent or not a mode (as ``engine._mode``)."""
    label = policy.spec.labels.namespace_mode
    if policy.spec.mode == "audit":
        return {"key": label, "operator": "In", "values": ["enforce", "warn"]}
    return {"key": label, "operator": "NotIn", "values": ["audit"]}


def binding_spec(policy: Policy, excluded: dict[str, Any]) -> dict[str, Any]:
    """Bound where the webhook mutates: not the excluded namespaces (``excluded``: the webhook's own
    namespaceSelector requirement), not in ``audit`` mode, not the pods opted out of the webhook."""
    return {
        "policyName": POLICY_NAME,
        "matchResources": {
            "namespaceSelector": {"matchExpressions": [excluded, mutating_modes_selector(policy)]},
            "objectSelector": {
                "matchExpressions": [{"key": cel.OPT_OUT_LABEL, "operator": "NotIn", "values": ["true"]}]
            },
        },
    }


def resources(
    policy: Policy,
    *,
    excluded: dict[str, Any],
    version: str = DEFAULT_VERSION,
    metadata: Callable[[str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy and its binding (none for ``version`` none). ``metadata(name)`` gives
    an object's metadata (the manifests' common labels)."""
    if version not in VERSIONS:
        raise ValueError(f"unknown MutatingAdmissionPolicy version {version!r} (one of {', '.join(VERSIONS)})")
    if version == "none":
        return []
    api_version = f"{API_GROUP}/{version}"
    return [
        {
            "apiVersion": api_version,
            "kind": "MutatingAdmissionPolicy",
            "metadata": metadata(POLICY_NAME),
            "spec": placement_policy_spec(policy),
        },
        {
            "apiVersion": api_version,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": metadata(POLICY_NAME),
            "spec": binding_spec(policy, excluded),
        },
    ]
