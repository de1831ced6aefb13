"""The plan of ``decide`` (CREATE only): what the pod's class adds to it, as JSON Patch operations that
always apply (affinity narrowed in every term, tolerations, topology spread, ROCm environment, the KFD
topology mount, the priority of a borrower, the record of what was done). ``class_plan`` is built once per
policy and class; the placement MutatingAdmissionPolicy renders the same plan into CEL."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from webhook.core import lending, patch, pods, scheduling
from webhook.core.assessment import Assessment, reserved_nodes
from webhook.core.claims import RESERVED_DEVICE_TAINT_KEY
from webhook.core.decision import (
    DeviceFacts,
)
from webhook.core.policy import Policy, WorkloadClass
from webhook.core.rules import (
    BORROWER_PREFERENCE_WEIGHT,
    CLASS_ANNOTATION,
    HOSTNAME_KEY,
    KFD_MOUNT,
    KFD_TOPOLOGY_PATH,
    KFD_VOLUME,
    KFD_VOLUME_NAME,
    MUTATIONS_ANNOTATION,
    PLACED_LABEL,
    PREFERRED,
    PSS_ENFORCE_LABEL,
)

# A whole-number resource quantity as the apiserver writes one (extended resources must be whole numbers).
_WHOLE_QUANTITY: Final = re.compile(r"^([0-9]{1,18})(?:(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)|[eE]\+?([0-9]{1,2}))?$")


_QUANTITY_FACTORS: Final = {
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def whole_quantity(value: Any) -> int | None:
    """``value`` as a whole number when it is one written as a Kubernetes quantity (``2``, ``1k``, ``1e3``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = _WHOLE_QUANTITY.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    number, suffix, exponent = match.groups()
    factor = _QUANTITY_FACTORS[suffix] if suffix else 10 ** int(exponent) if exponent else 1
    return int(number) * factor


def pinned_to_whole_reserved_nodes(review: Assessment) -> bool:
    key, value = review.reserved.key, review.reserved.value
    selector = review.spec.get("nodeSelector")
    if type(selector) is dict and selector.get(key) == value:
        return True
    return scheduling.affinity_only_reserved(review.terms, review.reserved)


def plan_device_resources(review: Assessment, cls: WorkloadClass, devices: DeviceFacts) -> None:
    """DRA extended resources steered to the class's DeviceClass: an inference pod's ``amd.com/gpu`` (the
    shared class's extendedResourceName), any class's ``deviceclass.resource.kubernetes.io/<GPU class>``
    and any other GPU class's extendedResourceName (the policy's ``extendedResourceNames``, the cluster's
    GPU DeviceClasses') become the reserved class's implicit name for inference, the shared class's for
    every other class. Where the extended resource name has classes of its own (``pool`` wrote the reserved
    side's, ``reservedDevices.reservedExtendedClassName``: the class AMD's chart gives the name admits whole
    GPUs only), an inference pod's ``amd.com/gpu`` becomes that class's implicit name instead, so that it
    gets what the name admits (a whole GPU), on the reserved side; and the implicit name of the class that
    owned the name (``deviceclass.resource.kubernetes.io/gpu.amd.com-spx``: its selectors are the ones the
    side's class of the name inherited) becomes the side's class of the name, for every class. The implicit
    names of our classes are kept as they are. An extended resource maps to exactly one DeviceClass, with no fallback: "reserved
    first" cannot be said for it, so inference gets reserved devices only
    (``reservedDevices.inferenceSpillover`` is for claims), unless the pod pins itself to the whole
    reserved nodes (device-plugin nodes in a mixed cluster). Several such names in one map (or one next
    to the target name) are summed into the target name; quantities that are not whole numbers (which
    the apiserver refuses for extended resources) are then left as they are.

    When DeviceTaintRules hold the reservation (``devices.devices_tainted``), the reserved devices are
    tainted and the scheduler's claim for an extended resource carries no tolerations: the reserved
    class's implicit name could never be served there (the pod would stay Pending). An inference pod is
    then steered as every other class (its ``amd.com/gpu`` kept, other GPU names to the shared class) and
    warned that it gets shared GPUs, and how to get reserved ones (a claim of the reserved class, which
    the webhook gives the toleration)."""
    policy = review.policy
    settings = policy.spec.reserved_devices
    prefix = pods.DEVICE_CLASS_RESOURCE_PREFIX
    inference = cls.placement == "reserved"
    tainted = inference and devices.devices_tainted
    to_reserved = inference and not tainted
    target = prefix + (settings.reserved_class_name if to_reserved else settings.shared_class_name)
    # The extended resource name has classes of its own (``pool apply`` wrote them: AMD's class that owned
    # it admits whole GPUs only): an inference pod's amd.com/gpu goes to the reserved side's one.
    gpu_classes: frozenset[str] = devices.gpu_classes
    extended_target = target
    if to_reserved and settings.reserved_extended_class_name in gpu_classes:
        extended_target = prefix + settings.reserved_extended_class_name
    # The side's class of the extended resource name (``pool`` wrote it: the side's selectors AND those of
    # the class that owned the name, AMD's gpu.amd.com-spx): the implicit name of a class whose selectors
    # are exactly the ones it inherited goes there, so that it keeps getting what that class admits (whole
    # GPUs), not every layout of the side.
    side_class = settings.reserved_class_name if to_reserved else settings.shared_class_name
    side_extended = settings.reserved_extended_class_name if to_reserved else settings.shared_extended_class_name
    narrowed_target = prefix + side_extended
    side_selectors = devices.class_selectors.get(side_class)
    extended_selectors = devices.class_selectors.get(side_extended)

    def inherited_by_side(name: str) -> bool:
        found = devices.class_selectors.get(name)
        if not found or side_extended not in gpu_classes or side_selectors is None or extended_selectors is None:
            return False
        return set(extended_selectors) == set(side_selectors) | set(found)

    def target_of(key: str) -> str:
        if key == settings.extended_resource_name:
            return extended_target
        if key.startswith(prefix) and inherited_by_side(key[len(prefix) :]):
            return narrowed_target
        return target

    own = (
        prefix + settings.reserved_class_name,
        prefix + settings.shared_class_name,
        prefix + settings.reserved_extended_class_name,
        prefix + settings.shared_extended_class_name,
    )
    other_names = (frozenset(policy.spec.scope.extended_resource_names) | devices.extended_resources) - {
        settings.extended_resource_name
    }
    # An inference pod that pins itself to the whole reserved nodes (nodeSelector, or required affinity
    # whose every term selects only them) keeps amd.com/gpu: in a mixed cluster those are device-plugin
    # nodes, where the reserved class's DRA-only name could never be served.
    pinned = inference and pinned_to_whole_reserved_nodes(review)
    keep_extended = tainted or pinned

    def steered(key: str) -> bool:
        if key in own:
            return False
        if key.startswith(prefix):
            name = key[len(prefix) :]
            return bool(policy.gpu_device_classes(name)) or name in devices.gpu_classes
        return (inference and not keep_extended and key == settings.extended_resource_name) or key in other_names

    changed = False
    # Tainted reservation: the GPU names of an inference pod that get shared GPUs (said in a warning).
    shared_only: list[str] = []
    for container in pods.containers(review.spec):
        for field, values in zip(("requests", "limits"), pods.resource_maps(container), strict=True):
            if values is None:
                continue
            if tainted and not pinned:
                for key in values:
                    gpu = key == settings.extended_resource_name or key == own[0] or steered(key)
                    if gpu and key not in shared_only:
                        shared_only.append(key)
            groups: dict[str, list[str]] = {}
            for key in values:
                if steered(key):
                    groups.setdefault(target_of(key), []).append(key)
            path = f"{container.pointer}/resources/{field}"
            for group_target, keys in groups.items():
                operations = _steer_group(values, path, group_target, keys)
                if operations:
                    review.operations.extend(operations)
                    changed = True
    if changed:
        review.done.append("device-class")
    if shared_only:
        review.warnings.append(tainted_reservation_warning(settings.reserved_class_name, shared_only, own[0]))


def _steer_group(values: dict[str, Any], path: str, target: str, keys: list[str]) -> list[patch.Operation]:
    """The patch that moves the quantities of ``keys`` to ``target`` in one resources map (summed with what
    ``target`` has already); none when a quantity to sum is not a whole number."""
    merged = [target, *keys] if target in values else keys
    quantity: Any = values[keys[0]]
    if len(merged) > 1:
        amounts = [whole_quantity(values[key]) for key in merged]
        if None in amounts:
            return []
        quantity = str(sum(amount or 0 for amount in amounts))
    operations = [patch.remove(path + "/" + patch.escape(key)) for key in keys]
    operations.append(patch.add(path + "/" + patch.escape(target), quantity))
    return operations


def tainted_reservation_warning(reserved_class: str, names: list[str], reserved_name: str) -> str:
    said = ", ".join(sorted(names))
    stuck = (
        f"; {reserved_name} can only get an untainted device, none on the nodes whose reserved GPUs are tainted"
        if reserved_name in names
        else ""
    )
    return (
        f"device-level reservation by DeviceTaintRules: this inference pod's {said} cannot get the reserved "
        f"GPUs (tainted {RESERVED_DEVICE_TAINT_KEY}; the scheduler's claim for an extended resource carries no "
        f"tolerations), only shared ones{stuck}; for reserved GPUs, name a ResourceClaimTemplate of DeviceClass "
        f"{reserved_class} in spec.resourceClaims (the webhook adds the toleration)"
    )


def plan(
    review: Assessment,
    cls: WorkloadClass,
    class_name: str,
    gpu: list[pods.ContainerRef],
    labels: Mapping[str, str],
    borrower: bool = False,
) -> None:
    if borrower:
        plan = borrower_plan(review.policy, class_name)
        plan_borrower_affinity(review, plan)
    else:
        plan = class_plan(review.policy, class_name)
        plan_affinity(review, plan)
    plan_tolerations(review, plan)
    plan_priority(review, plan)
    plan_grace(review, plan)
    plan_spread(review, cls, labels)
    plan_env(review, plan, gpu)
    plan_kfd_mount(review, cls, gpu)
    # The class annotation and the placed label land even when nothing else changes; the list of what
    # was done only when something was (so that a reinvocation on our own output yields no operation).
    entries = {CLASS_ANNOTATION: class_name}
    if review.operations:
        recorded = recorded_mutations(review.metadata.get("annotations"), review.done)
        if recorded is not None:
            entries[MUTATIONS_ANNOTATION] = recorded
    review.operations.extend(patch.set_map_entries(review.pod, ("metadata", "annotations"), entries))
    review.operations.extend(
        patch.set_map_entries(
            review.pod,
            ("metadata", "labels"),
            {PLACED_LABEL: class_name, **dict(plan.labels)} if plan.labels else {PLACED_LABEL: class_name},
        )
    )


_PLACED_POINTER = patch.pointer("metadata", "labels", PLACED_LABEL)


def records_only(operation: Mapping[str, Any]) -> bool:
    """Whether a patch operation only records what was decided (the class and mutations annotations, the
    placed label) rather than changing how the pod runs or where."""
    path = str(operation["path"])
    if path.startswith("/metadata/annotations") or path == _PLACED_POINTER:
        return True
    value = operation.get("value")
    return path == "/metadata/labels" and isinstance(value, Mapping) and set(value) == {PLACED_LABEL}


def recorded_mutations(annotations: Any, done: list[str]) -> str | None:
    """The mutations annotation with ``done`` merged in, or None when it already lists all of it.

    The MutatingAdmissionPolicy records what it did in the same annotation before the webhook is
    called (``mutating_policy._mutations_annotation_patch``, the same merge in CEL): the entries are a
    union, the existing ones first and in their order, nothing listed twice, so that neither
    overwrites the other's record and a reinvocation adds nothing."""
    current = annotations.get(MUTATIONS_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not current:
        return ",".join(done)
    listed = current.split(",")
    added = [entry for entry in done if entry not in listed]
    return current + "," + ",".join(added) if added else None


@dataclass(frozen=True)
class ClassPlan:
    """What a class adds to a pod, built once per policy and class (the pods only decide which parts)."""

    requirements: tuple[scheduling.Requirement, ...]  # ANDed into every node-selector term
    reserved_toleration: dict[str, Any] | None  # a reserved class tolerates the reserved taint
    tolerations: tuple[dict[str, Any], ...]
    env: tuple[tuple[str, dict[str, str], bool], ...]  # (name, the env entry, override)
    env_names: tuple[str, ...]  # compared, not hashed: hashing every name of every env list costs more
    # Lending (webhook.core.lending): a borrower's preferred node-affinity term (shared nodes) and required
    # pod anti-affinity term (no inference pod on its node, lendFrom idleNodes); the priority fields of a
    # borrower (always) or of an inference pod (when its resolved priority is not above the borrowers');
    # the labels written next to the placed label (a borrower's borrow label).
    preferred: dict[str, Any] | None = None
    anti_affinity: dict[str, Any] | None = None
    priority: dict[str, Any] | None = None
    priority_at_most: int | None = None  # the priority fields are set when spec.priority <= this (None: always)
    labels: tuple[tuple[str, str], ...] = ()
    # A borrower's terminationGracePeriodSeconds at most this (lending.reclaimGraceSeconds): the scheduler's
    # preemption deletes a victim with its own grace period, so this bounds how long inference waits.
    grace_cap: int | None = None


@lru_cache(maxsize=256)
def class_plan(policy: Policy, class_name: str) -> ClassPlan:
    reserved = reserved_nodes(policy, None)
    cls = policy.spec.classes[class_name]
    requirements: list[scheduling.Requirement] = []
    if cls.placement == "reserved":
        # Whole reserved nodes, or nodes whose devices are split (device-level reservation: the reserved
        # DeviceClass then decides which of their GPUs the pod gets).
        values = [reserved.value, policy.spec.reserved_devices.node_label_value]
        requirements.append(scheduling.Requirement(({"key": reserved.key, "operator": "In", "values": values},)))
    elif cls.placement == "unreserved":
        requirements.append(
            scheduling.Requirement(
                ({"key": reserved.key, "operator": "NotIn", "values": [reserved.value]},),
                satisfied_by_exclusion=reserved,
            )
        )
    for extra in cls.node_selector_requirements:
        keys = (extra.key, *extra.key_aliases)
        requirements.append(scheduling.Requirement(tuple(extra.expression(key) for key in keys)))
    taint = policy.spec.reserved_nodes.taint
    reserved_toleration = None
    if cls.placement == "reserved" and taint is not None:
        reserved_toleration = {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
    tolerations = [extra.as_k8s() for extra in cls.tolerations]
    priority = None
    priority_at_most = None
    if cls.placement == "reserved" and policy.spec.lending.enabled:
        # Inference tolerates the taint of reserved nodes that take no new borrowers, and outranks borrowers.
        settings = lending.settings(policy)
        tolerations.append(dict(settings.no_borrowers_toleration))
        priority = lending.priority_fields(settings.inference)
        priority_at_most = settings.borrower.value
    return ClassPlan(
        requirements=tuple(requirements),
        reserved_toleration=reserved_toleration,
        tolerations=tuple(tolerations),
        env=tuple((var.name, {"name": var.name, "value": var.value}, var.on_conflict == "override") for var in cls.env),
        env_names=tuple(var.name for var in cls.env),
        priority=priority,
        priority_at_most=priority_at_most,
    )


@lru_cache(maxsize=256)
def borrower_plan(policy: Policy, class_name: str) -> ClassPlan:
    """What a borrower of an unreserved class gets instead of its class's placement: the class's own node
    requirements without the one that keeps it off reserved nodes, the reserved toleration, a preference for
    shared nodes, the borrowers' priority (all three fields), its borrow label; with ``lendFrom: idleNodes``
    a required anti-affinity to the nodes where inference pods run (the placed label of the reserved classes),
    for a pod without claims (``plan_borrower_affinity``)."""
    plan = class_plan(policy, class_name)
    settings = lending.settings(policy)
    reserved = reserved_nodes(policy, None)
    taint = policy.spec.reserved_nodes.taint
    reserved_toleration = None
    if taint is not None:
        reserved_toleration = {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
    anti_affinity = None
    if settings.lend_from == "idleNodes":
        inference = [name for name, cls in policy.spec.classes.items() if cls.placement == "reserved"]
        anti_affinity = {
            "labelSelector": {"matchExpressions": [{"key": PLACED_LABEL, "operator": "In", "values": inference}]},
            # Every namespace: a term without a namespace selector counts only the pod's own namespace.
            "namespaceSelector": {},
            "topologyKey": HOSTNAME_KEY,
        }
    return ClassPlan(
        requirements=tuple(r for r in plan.requirements if r.satisfied_by_exclusion is None),
        reserved_toleration=reserved_toleration,
        tolerations=plan.tolerations,
        env=plan.env,
        env_names=plan.env_names,
        preferred={
            "weight": BORROWER_PREFERENCE_WEIGHT,
            "preference": {
                "matchExpressions": [{"key": reserved.key, "operator": "NotIn", "values": [reserved.value]}]
            },
        },
        anti_affinity=anti_affinity,
        priority=lending.priority_fields(settings.borrower),
        labels=((settings.pod_label, lending.BORROWING),),
        grace_cap=policy.spec.lending.reclaim_grace_seconds,
    )


def plan_borrower_affinity(review: Assessment, plan: ClassPlan) -> None:
    """A borrower's affinity in one operation (the required terms narrowed by the class's own
    requirements, the preferred term, the pod anti-affinity term), each part only when missing."""
    current = review.spec.get("affinity")
    affinity: dict[str, Any] = dict(current) if type(current) is dict else {}
    node_affinity: dict[str, Any] = dict(affinity.get("nodeAffinity") or {})
    changed_node = False
    terms = review.terms
    if plan.requirements:
        new_terms = scheduling.narrow_terms(terms, plan.requirements)
        old_terms = [t.body for t in terms] if terms is not None else None
        if new_terms != old_terms:
            required = dict(node_affinity.get(scheduling.REQUIRED) or {})
            required["nodeSelectorTerms"] = new_terms
            node_affinity[scheduling.REQUIRED] = required
            changed_node = True
    preferred = node_affinity.get(PREFERRED)
    preferred = list(preferred) if type(preferred) is list else []
    if plan.preferred is not None and plan.preferred not in preferred:
        node_affinity[PREFERRED] = [*preferred, plan.preferred]
        changed_node = True
    if changed_node:
        affinity["nodeAffinity"] = node_affinity
        review.done.append("node-affinity")
    changed_anti = False
    # Only a pod without claims: a pod anti-affinity is symmetric (inference could not be placed where such a
    # borrower runs), and a borrower's claims reach shared devices of split nodes, where inference runs too,
    # and lent reserved devices, which the keeper takes back (idleNodes is about nodes reserved whole).
    if plan.anti_affinity is not None and not review.spec.get("resourceClaims"):
        anti: dict[str, Any] = dict(affinity.get("podAntiAffinity") or {})
        required_anti = anti.get(scheduling.REQUIRED)
        required_anti = list(required_anti) if type(required_anti) is list else []
        if plan.anti_affinity not in required_anti:
            anti[scheduling.REQUIRED] = [*required_anti, plan.anti_affinity]
            affinity["podAntiAffinity"] = anti
            review.done.append("pod-anti-affinity")
            changed_anti = True
    if changed_node or changed_anti:
        review.operations.extend(patch.set_map_entries(review.pod, ("spec",), {"affinity": affinity}))


def plan_grace(review: Assessment, plan: ClassPlan) -> None:
    """A borrower's termination grace period capped at ``lending.reclaimGraceSeconds`` (absent: the
    apiserver's default of 30 s would apply, so it is written too)."""
    cap = plan.grace_cap
    if cap is None:
        return
    current = review.spec.get("terminationGracePeriodSeconds")
    if type(current) is int and current <= cap:
        return
    review.operations.extend(patch.set_map_entries(review.pod, ("spec",), {"terminationGracePeriodSeconds": cap}))
    review.done.append("termination-grace")


def plan_priority(review: Assessment, plan: ClassPlan) -> None:
    """The PriorityClass of a borrower, or of an inference pod not above the borrowers (lending): all three
    fields, or the apiserver's Priority plugin forbids the CREATE (lending-facts.md §5)."""
    wanted = plan.priority
    if wanted is None:
        return
    current = review.spec.get("priority")
    if plan.priority_at_most is not None:
        resolved = current if type(current) is int else 0
        if resolved > plan.priority_at_most:
            return
        review.warnings.append(
            f"the pod's priority ({resolved}) is not above the borrowers' ({plan.priority_at_most}): it gets the "
            f"PriorityClass {wanted['priorityClassName']} ({wanted['priority']}), so that it takes reserved "
            "capacity back from borrowers"
        )
    operations = patch.set_map_entries(review.pod, ("spec",), wanted)
    if operations:
        review.operations.extend(operations)
        review.done.append("priority")


def plan_affinity(review: Assessment, plan: ClassPlan) -> None:
    requirements = plan.requirements
    if not requirements:
        return
    terms = review.terms
    if terms is None:
        # No required affinity (or no terms): one new term, its missing parents created.
        required_path = scheduling.TERMS_PATH[:-1]
        new_terms = scheduling.narrow_terms(None, requirements)
        review.operations.extend(patch.set_map_entries(review.pod, required_path, {"nodeSelectorTerms": new_terms}))
        review.done.append("node-affinity")
        return
    if scheduling.splits(terms, requirements):
        new_terms = scheduling.narrow_terms(terms, requirements)
        review.operations.append(patch.replace(patch.pointer(*scheduling.TERMS_PATH), new_terms))
        review.done.append("node-affinity")
        return
    changed = False
    for term in terms:
        added = scheduling.missing_requirements(term, requirements)
        if added:
            path = patch.pointer(*scheduling.TERMS_PATH, term.index, "matchExpressions")
            review.operations.extend(patch.append_to_list(term.body.get("matchExpressions"), path, added))
            changed = True
    if changed:
        review.done.append("node-affinity")


def plan_tolerations(review: Assessment, plan: ClassPlan) -> None:
    existing = [tol for _, tol in review.tolerations]
    wanted: list[dict[str, Any]] = []
    reserved = plan.reserved_toleration
    if reserved is not None:
        key, value, effect = reserved["key"], reserved["value"], reserved["effect"]
        if not any(scheduling.tolerates(t, key, value, effect) for t in existing):
            wanted.append(dict(reserved))
    for body in plan.tolerations:
        if body not in existing and body not in wanted:
            wanted.append(dict(body))
    if wanted:
        review.operations.extend(patch.append_to_list(review.spec.get("tolerations"), "/spec/tolerations", wanted))
        review.done.append("tolerations")


def plan_spread(review: Assessment, cls: WorkloadClass, labels: Mapping[str, str]) -> None:
    spread = cls.topology_spread
    if spread is None:
        return
    current = review.spec.get("topologySpreadConstraints")
    if any(
        c.get("topologyKey") == spread.topology_key for _, c in pods.objects(current, "spec.topologySpreadConstraints")
    ):
        return
    match_labels, match_label_keys = spread_selector(review.policy, labels)
    if not match_labels and not match_label_keys:
        review.warnings.append(
            f"no topology spread on {spread.topology_key} added: the pod has no labels to select its peers by "
            "(a constraint without a selector counts nothing, and per-pod labels such as a StatefulSet's pod-name "
            "select only the pod itself); give the pod labels"
        )
        return
    constraint: dict[str, Any] = {
        "maxSkew": spread.max_skew,
        "topologyKey": spread.topology_key,
        "whenUnsatisfiable": spread.when_unsatisfiable,
        # An empty selector matches every pod; matchLabelKeys then narrows it to the pod's own revision.
        "labelSelector": {"matchLabels": match_labels} if match_labels else {},
    }
    if match_label_keys:
        constraint["matchLabelKeys"] = match_label_keys
    if spread.min_domains is not None:
        constraint["minDomains"] = spread.min_domains
    review.operations.extend(patch.append_to_list(current, "/spec/topologySpreadConstraints", [constraint]))
    review.done.append("topology-spread")


def spread_selector(policy: Policy, labels: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The spread constraint's matchLabels and matchLabelKeys: per-pod identity labels left out,
    revision and controller-instance labels as keys (``spec.spreadSelector``); our placed label left out
    (it names the class, not the workload's peers, and the placement policy may have written it first)."""
    excluded, by_key = spread_keys(policy)
    match_labels = {
        key: value for key, value in labels.items() if key not in excluded and key not in by_key and key != PLACED_LABEL
    }
    return match_labels, [key for key in by_key if key in labels]


@lru_cache(maxsize=64)
def spread_keys(policy: Policy) -> tuple[frozenset[str], tuple[str, ...]]:
    selector = policy.spec.spread_selector
    return frozenset(selector.excluded_label_keys), tuple(selector.match_label_keys)


def plan_env(review: Assessment, plan: ClassPlan, gpu: list[pods.ContainerRef]) -> None:
    if not plan.env:
        return
    changed = False
    for container in gpu:
        current = container.body.get("env")
        entries, found = env_indexes(current, plan.env_names, container)
        missing: list[dict[str, Any]] = []
        for name, wanted, override in plan.env:
            indexes = found.get(name)
            if indexes is None:
                missing.append(dict(wanted))
            elif override:
                for i in indexes:
                    if entries[i] != wanted:
                        review.operations.append(patch.replace(f"{container.pointer}/env/{i}", dict(wanted)))
                        changed = True
        if missing:
            review.operations.extend(patch.append_to_list(current, container.pointer + "/env", missing))
            changed = True
    if changed:
        review.done.append("env")


def env_indexes(
    env: Any, names: tuple[str, ...], container: pods.ContainerRef
) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """A container's env entries, and where each of ``names`` is set in them (env lists of a hundred
    variables are common, and every GPU container is read)."""
    if type(env) is list and all(type(entry) is dict for entry in env):
        entries: list[dict[str, Any]] = env
    else:  # the field name is only formatted for a list that is not plain JSON objects
        entries = [entry for _, entry in pods.objects(env, f"{container.field}.env")]
    found: dict[str, list[int]] = {}
    for index, entry in enumerate(entries):
        name = entry.get("name")
        if isinstance(name, str):
            for wanted in names:  # a class sets a few variables: compared one by one, never hashed
                if name == wanted:
                    found.setdefault(name, []).append(index)
    return entries, found


def plan_kfd_mount(review: Assessment, cls: WorkloadClass, gpu: list[pods.ContainerRef]) -> None:
    if not cls.kfd_topology_mount or not gpu:
        return
    labels = review.namespace.labels
    if labels is None:
        review.warnings.append(
            f"KFD topology mount skipped: the Pod Security level of namespace {review.namespace.name} is unknown "
            "(no cluster connection), and a hostPath volume is rejected under baseline and restricted"
        )
        return
    level = labels.get(PSS_ENFORCE_LABEL)
    if level in ("baseline", "restricted"):
        review.warnings.append(
            f"KFD topology mount skipped: namespace {review.namespace.name} enforces Pod Security {level}, "
            "which forbids hostPath volumes"
        )
        return
    volumes = review.spec.get("volumes")
    same_name = [v for _, v in pods.objects(volumes, "spec.volumes") if v.get("name") == KFD_VOLUME_NAME]
    if same_name and dict(same_name[0]) != KFD_VOLUME:
        review.warnings.append(f"KFD topology mount skipped: the pod already has a different volume {KFD_VOLUME_NAME}")
        return
    changed = False
    if not same_name:
        review.operations.extend(patch.append_to_list(volumes, "/spec/volumes", [dict(KFD_VOLUME)]))
        changed = True
    for container in gpu:
        mounts = container.body.get("volumeMounts")
        if any(
            m.get("mountPath") == KFD_TOPOLOGY_PATH for _, m in pods.objects(mounts, f"{container.field}.volumeMounts")
        ):
            continue
        review.operations.extend(patch.append_to_list(mounts, container.pointer + "/volumeMounts", [dict(KFD_MOUNT)]))
        changed = True
    if changed:
        review.done.append("kfd-topology-mount")
