"""Placement in the apiserver: a MutatingAdmissionPolicy rendered from the IsolationPolicy.

The mutating webhook runs with ``failurePolicy: Ignore`` (an outage must not stop every pod of the
cluster), so without this policy an inference pod admitted while the webhook is down has no affinity
and no toleration, and a training pod no ``NotIn``. The MutatingAdmissionPolicy (GA and on by default
in Kubernetes 1.36) applies the same placement as the engine, in the apiserver, before any mutating
webhook is called:

- the class as the engine decides it (namespace rules by name, glob and ``namespaceObject`` labels,
  the class label, ``defaultClass``; a pod label only picks a class its namespace allows), the
  same expression as the ValidatingAdmissionPolicy backstop's (``cel.pod_class``);
- the class's node requirements (its placement requirement, then its ``nodeSelectorRequirements``
  with their key aliases) ANDed into **every** required ``nodeSelectorTerms`` entry, an empty term
  left alone, ``matchFields`` kept, a requirement with several spellings splitting a term into one
  per spelling; a term created when there is none (``scheduling.narrow_terms``); a term that already
  holds a narrower ``In`` keeps it (``scheduling._implies``);
- the reserved toleration unless a toleration already tolerates the taint, then the class's own
  tolerations unless the pod has the same one (``placement.plan_tolerations``);
- the class annotation ``rocm-isolation.io/class``, and ``node-affinity`` / ``tolerations`` in the
  ``rocm-isolation.io/mutations`` record when it changes them (the webhook merges its own entries into
  that value, ``placement.recorded_mutations``; both append only what is missing), and the placed label
  ``rocm-isolation.io/placed`` (the class), which the webhook writes too.

What it costs is the apiserver's, per pod (kube-apiserver 1.36's code, docs/architecture.md, "What the
apiserver evaluates per pod"): every mutation evaluation converts the pod for CEL and runs a JSON round
trip of the pod whatever the patch, and any evaluated mutation asks for a second pass of the mutating
chain. So the policy is **one** mutation (the parts' operations concatenated, each computed on the
pod as it arrives: none reads what another writes), with ``reinvocationPolicy: Never`` (evaluated once
per pod) and a binding that skips, in Go, a pod carrying the placed label (``engine.PLACED_LABEL``, which
this policy and the webhook write: in the second pass not even the match condition is evaluated), one
variable (the class),
**one** match condition (the apiserver evaluates all of a policy's conditions: the cheapest test first,
no regular expression where a string comparison says the same), and plain ``dyn`` maps as patch values
(the pod's typed ``Object.spec...{}`` literals are converted again at every nesting level). The common
case is one operation per part: a pod without affinity gets one ``add`` of the whole affinity, one
without annotations one ``add`` of the class and its record.

Everything is a ``JSONPatch`` mutation: ``nodeSelectorTerms``, ``matchExpressions`` and
``tolerations`` are atomic lists, which an ``ApplyConfiguration`` can only replace wholesale. A
mutation yields no operation when the pod already has what it would add, so the policy and the
webhook can run after one another in any order, any number of times: neither undoes nor repeats the
other. ``Never`` costs nothing in placement while the webhook is up: it runs after this policy (and is
reinvoked when a later mutating webhook changes the pod) and places every pod this policy does.

What stays with the webhook (docs/architecture.md, "Who does what"): env variables, topology spread,
the KFD mount, pods that reach GPUs only through a DRA claim (CEL cannot read the ResourceClaimTemplate
to tell a GPU claim from another), warnings and audit annotations. The binding leaves out the
namespaces whose mode is ``audit`` (nothing is changed there), the excluded namespaces and the pods
opted out of the webhook.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from webhook.core import engine, patch, placement, scheduling
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

_AFFINITY = "object.spec.affinity"
_NODE_AFFINITY = f"{_AFFINITY}.nodeAffinity"
_REQUIRED = f"{_NODE_AFFINITY}.{scheduling.REQUIRED}"
_TERMS = f"{_REQUIRED}.nodeSelectorTerms"
_REQUIRED_PATH = patch.pointer(*scheduling.TERMS_PATH[:-1])
_TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
# The record of what the policy changed, in the webhook's ``rocm-isolation.io/mutations`` annotation.
_RECORD_AFFINITY = "node-affinity"
_RECORD_TOLERATIONS = "tolerations"


def _literal(value: Any) -> str:
    """A CEL literal of a JSON value: maps and lists as plain (``dyn``) CEL values, not the pod's typed
    ``Object.spec...{}`` literals, whose conversion the apiserver repeats for every nested level.
    Kubernetes CEL checks aggregate literals for one element type (``HomogeneousAggregateLiterals``): a
    map or list whose items differ in type has each item wrapped in ``dyn()``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, list):
        items = [_literal(item) for item in value]
        if len({_kind(item) for item in value}) > 1 or (len(value) > 1 and isinstance(value[0], (dict, list))):
            items = [f"dyn({item})" for item in items]
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        entries = {key: _literal(item) for key, item in value.items()}
        if len({_kind(item) for item in value.values()}) > 1 or any(
            isinstance(v, (dict, list)) for v in value.values()
        ):
            entries = {key: f"dyn({item})" for key, item in entries.items()} if len(entries) > 1 else entries
        return "{" + ", ".join(f"{quote(key)}: {item}" for key, item in entries.items()) + "}"
    raise TypeError(f"no CEL literal for {value!r}")


def _kind(value: Any) -> str:
    return type(value).__name__


def _bind(value: str, name: str, body: str) -> str:
    """``body`` with ``name`` bound to ``value``, computed once (Kubernetes CEL has no ``cel.bind``)."""
    return f"[{value}].map({name}, {body})[0]"


def _operation(op: str, path: str, value: str) -> str:
    return f"JSONPatch{{op: {quote(op)}, path: {quote(path)}, value: {value}}}"


# --- node affinity --------------------------------------------------------------------------------

_LIVE = cel.LIVE_TERM


def _values_equal(values: list[str]) -> str:
    """``e.values`` equals ``values`` as a multiset (absent counts as empty)."""
    if not values:
        return "(!has(e.values) || size(e.values) == 0)"
    if len(values) == 1:
        return f"(has(e.values) && size(e.values) == 1 && e.values[0] == {quote(values[0])})"
    return f"(has(e.values) && e.values.sort() == {str_list(sorted(values))})"


def _implies(alternative: dict[str, Any]) -> str:
    """``scheduling._implies``: key and operator, and the values as a multiset (``In``: a non-empty subset)."""
    values = sorted(alternative.get("values") or [])
    head = f"e.key == {quote(alternative['key'])} && e.operator == {quote(alternative['operator'])}"
    if alternative["operator"] == "In":
        return f"({head} && has(e.values) && size(e.values) > 0 && e.values.all(v, v in {str_list(values)}))"
    return f"({head} && {_values_equal(values)})"


def _excludes_reserved(reserved: scheduling.Reserved) -> str:
    """``Reserved.excludes_reserved``: any expression that keeps the pod off reserved nodes."""
    value = quote(reserved.value)
    return (
        f"(e.key == {quote(reserved.key)} && (e.operator == 'DoesNotExist' || "
        f"(e.operator == 'NotIn' && has(e.values) && {value} in e.values) || "
        f"(e.operator == 'In' && !(has(e.values) && {value} in e.values))))"
    )


def _subsumed(alternative: dict[str, Any], reserved: scheduling.Reserved | None) -> bool:
    """An alternative that ``excludes_reserved`` already accepts (``NotIn [reserved]``): not tested twice."""
    return (
        reserved is not None
        and alternative.get("key") == reserved.key
        and alternative.get("operator") == "NotIn"
        and reserved.value in (alternative.get("values") or [])
    )


def _satisfied(requirement: scheduling.Requirement) -> str:
    """``Requirement.satisfied`` of term ``t``."""
    exclusion = requirement.satisfied_by_exclusion
    parts = [_excludes_reserved(exclusion)] if exclusion is not None else []
    parts.extend(_implies(alt) for alt in requirement.alternatives if not _subsumed(alt, exclusion))
    return f"(has(t.matchExpressions) && t.matchExpressions.exists(e, {' || '.join(parts)}))"


def _combinations(requirements: tuple[scheduling.Requirement, ...]) -> list[tuple[int, ...]]:
    """Which spelling of each requirement a variant uses, in ``narrow_terms``'s order."""
    return list(itertools.product(*(range(len(r.alternatives)) for r in requirements)))


def _new_terms(requirements: tuple[scheduling.Requirement, ...]) -> list[dict[str, Any]]:
    """``narrow_terms(None, requirements)``: the terms of a pod that has none."""
    return scheduling.narrow_terms(None, requirements)


def _narrowed_term(requirements: tuple[scheduling.Requirement, ...]) -> str:
    """``narrow_terms`` of one live term ``t``: the list of its variants (plain maps; the term's own
    lists travel as they are)."""
    satisfied = [_satisfied(r) for r in requirements]
    variants = []
    for combination in _combinations(requirements):
        added = [
            f"({satisfied[i]} ? [] : [{_literal(r.alternatives[j])}])"
            for i, (r, j) in enumerate(zip(requirements, combination, strict=True))
        ]
        expressions = "dyn(" + " + ".join(["dyn(has(t.matchExpressions) ? t.matchExpressions : [])", *added]) + ")"
        term = (
            f"(has(t.matchFields) ? {{'matchFields': dyn(t.matchFields), 'matchExpressions': {expressions}}} : "
            f"{{'matchExpressions': {expressions}}})"
        )
        # A variant using another spelling than the first only exists for a requirement the term lacks.
        needed = [f"!{satisfied[i]}" for i, j in enumerate(combination) if j > 0]
        variants.append(f"({' && '.join(needed)} ? [dyn({term})] : [])" if needed else f"[dyn({term})]")
    return " + ".join(variants)


def _affinity_operations(requirements: tuple[scheduling.Requirement, ...]) -> str:
    """The JSONPatch operations that narrow the pod's required node affinity (none when it already is):
    one ``add`` of the missing level for a pod without terms (the common case), else one ``replace``
    of the required node selector with every live term narrowed (empty terms kept as they are).

    Values are plain maps: a list of the pod's typed objects as a JSONPatch value panics kube-apiserver
    1.36's cel-go (0.26, ``baseList.ConvertToNative``), a list of plain maps converts."""
    new_terms = _new_terms(requirements)
    required = {"nodeSelectorTerms": new_terms}
    node_affinity = {scheduling.REQUIRED: required}
    affinity = {"nodeAffinity": node_affinity}
    narrowed = f"{_TERMS}.map(t, !{_LIVE} ? [dyn(t)] : {_narrowed_term(requirements)}).flatten()"
    all_satisfied = " && ".join(_satisfied(r) for r in requirements)
    return (
        f"!has({_AFFINITY}) ? [{_operation('add', '/spec/affinity', _literal(affinity))}] :\n"
        f"!has({_NODE_AFFINITY}) ? [{_operation('add', '/spec/affinity/nodeAffinity', _literal(node_affinity))}] :\n"
        f"!has({_REQUIRED}) || !has({_TERMS}) || size({_TERMS}) == 0 ? "
        f"[{_operation('add', _REQUIRED_PATH, _literal(required))}] :\n"
        f"{_TERMS}.exists(t, {_LIVE} && !({all_satisfied})) ? "
        f"[{_operation('replace', _REQUIRED_PATH, '{' + quote('nodeSelectorTerms') + ': ' + narrowed + '}')}] : []"
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
    return f"object.spec.tolerations.exists(t, {condition})"


def _toleration_operations(policy: Policy, class_name: str, borrower: bool = False) -> str | None:
    """The engine's tolerations for the class (``placement.plan_tolerations``): on a pod without any, one
    ``add`` of the whole list; else an ``add /spec/tolerations/-`` per toleration the pod lacks (the
    reserved one unless a toleration already tolerates the taint, the class's own unless the pod has
    the same). None when the class adds none. ``borrower``: a borrower's (``placement.borrower_plan``)."""
    plan = placement.borrower_plan(policy, class_name) if borrower else placement.class_plan(policy, class_name)
    reserved = plan.reserved_toleration
    wanted: list[tuple[str, dict[str, Any]]] = []
    reserved_wanted = None
    if reserved is not None:
        reserved_wanted = "!" + _existing(_tolerates(reserved["key"], reserved["value"], reserved["effect"]))
        wanted.append((reserved_wanted, reserved))
    seen: list[dict[str, Any]] = []
    for body in plan.tolerations:
        if body in seen:
            continue
        seen.append(body)
        condition = "!" + _existing(_same_toleration(body))
        if body == reserved and reserved_wanted is not None:
            condition += f" && !({reserved_wanted})"
        wanted.append((condition, body))
    if not wanted:
        return None
    # Without tolerations, everything is wanted (the class's copy of the reserved toleration once).
    everything = [body for index, (_, body) in enumerate(wanted) if index == 0 or body != reserved]
    some = " + ".join(
        f"({condition} ? [{_operation('add', '/spec/tolerations/-', _literal(body))}] : [])"
        for condition, body in wanted
    )
    return (
        f"!has(object.spec.tolerations) || size(object.spec.tolerations) == 0 ? "
        f"[{_operation('add', '/spec/tolerations', _literal(everything))}] :\n{some}"
    )


# --- the annotations ------------------------------------------------------------------------------


def _new_annotations(class_name: str, entries: list[tuple[str, str]], done: list[str]) -> str:
    """The annotations of a pod that has none: the class, and the record of what the placement changes
    (each entry of ``entries`` chosen by its CEL test)."""
    if not entries:
        value = {engine.CLASS_ANNOTATION: class_name}
        if done:
            value[engine.MUTATIONS_ANNOTATION] = ",".join(done)
        return _literal(value)
    (adds, name), rest = entries[0], entries[1:]
    return (
        f"({adds} ? {_new_annotations(class_name, rest, [*done, name])} : {_new_annotations(class_name, rest, done)})"
    )


def _annotation_operations(class_name: str, adds_affinity: str | None, adds_tolerations: str | None) -> str:
    """The class annotation, and the policy's entries merged into the ``mutations`` record (what the
    webhook's ``placement.recorded_mutations`` does with its own: the existing value kept, the missing
    entries appended, nothing when every entry is listed). ``adds_*``: CEL telling whether the
    placement operations change the pod (None: never). A pod without annotations gets them in one
    operation."""
    annotations = "object.metadata.annotations"
    key = engine.CLASS_ANNOTATION
    record = engine.MUTATIONS_ANNOTATION
    entries = [
        (adds, name)
        for adds, name in ((adds_affinity, _RECORD_AFFINITY), (adds_tolerations, _RECORD_TOLERATIONS))
        if adds is not None
    ]
    new = f"[{_operation('add', '/metadata/annotations', _new_annotations(class_name, entries, []))}]"
    class_op = (
        f"({quote(key)} in {annotations} && {annotations}[{quote(key)}] == {quote(class_name)} ? [] : "
        f"[{_operation('add', patch.pointer('metadata', 'annotations', key), quote(class_name))}])"
    )
    if not entries:
        return f"!has({annotations}) ? {new} :\n{class_op}"
    listed = "r.split(',')"
    missing = " + ".join(f"({adds} && !({quote(name)} in {listed}) ? [{quote(name)}] : [])" for adds, name in entries)
    merged = "r == '' ? n.join(',') : r + ',' + n.join(',')"
    record_op = _bind(
        f"{quote(record)} in {annotations} ? {annotations}[{quote(record)}] : ''",
        "r",
        _bind(
            missing,
            "n",
            f"size(n) == 0 ? [] : [{_operation('add', patch.pointer('metadata', 'annotations', record), merged)}]",
        ),
    )
    return f"!has({annotations}) ? {new} :\n{class_op} +\n{record_op}"


def _label_operations(class_name: str, extra: tuple[tuple[str, str], ...] = ()) -> str:
    """The placed label (``engine.PLACED_LABEL``): the binding skips a pod that carries it, so the second
    pass of the mutating chain does not evaluate this policy's match condition again. ``extra``: labels
    written next to it (a borrower's borrow label)."""
    labels = "object.metadata.labels"
    entries = {engine.PLACED_LABEL: class_name, **dict(extra)}
    each = " + ".join(
        f"({quote(key)} in {labels} && {labels}[{quote(key)}] == {quote(value)} ? [] : "
        f"[{_operation('add', patch.pointer('metadata', 'labels', key), quote(value))}])"
        for key, value in entries.items()
    )
    return f"!has({labels}) ? [{_operation('add', '/metadata/labels', _literal(entries))}] :\n{each}"


# --- the policy -----------------------------------------------------------------------------------


def _class_operations(policy: Policy, class_name: str) -> str:
    """Every operation for a pod of the class, in one list: the annotations (computed on the pod as it
    arrives, like the placement after them), the affinity, the tolerations. The placement lists are
    bound once (``a``, ``t``) so that the record reads their sizes without computing them again."""
    plan = placement.class_plan(policy, class_name)
    affinity = _affinity_operations(plan.requirements) if plan.requirements else None
    tolerations = _toleration_operations(policy, class_name)
    annotations = _annotation_operations(
        class_name,
        "size(a) > 0" if affinity is not None else None,
        "size(w) > 0" if tolerations is not None else None,
    )
    body = f"({annotations}) + ({_label_operations(class_name)})"
    if affinity is not None:
        body += " + a"
    if tolerations is not None:
        body += " + w"
        body = _bind(tolerations, "w", body)
    if affinity is not None:
        body = _bind(affinity, "a", body)
    return body


# --- lending: borrowers and inference beside them (webhook.core.lending) ---------------------------

_PREFERRED = f"{_NODE_AFFINITY}.{engine.PREFERRED}"
_ANTI = f"{_AFFINITY}.podAntiAffinity"
_ANTI_REQUIRED = f"{_ANTI}.{scheduling.REQUIRED}"


def _preferred_present(preferred: dict[str, Any]) -> str:
    """The pod's preferred node-affinity terms hold ``preferred`` (one expression, no matchFields) as it is."""
    [expression] = preferred["preference"]["matchExpressions"]
    same = (
        f"x.weight == {preferred['weight']} && has(x.preference) && !has(x.preference.matchFields) && "
        f"has(x.preference.matchExpressions) && size(x.preference.matchExpressions) == 1 && "
        f"x.preference.matchExpressions.exists(e, {_implies_exactly(expression)})"
    )
    return f"(has({_AFFINITY}) && has({_NODE_AFFINITY}) && has({_PREFERRED}) && {_PREFERRED}.exists(x, {same}))"


def _implies_exactly(expression: dict[str, Any]) -> str:
    """Expression ``e`` equals ``expression`` (key, operator, values in order)."""
    values = expression.get("values") or []
    listed = " && ".join(f"e.values[{i}] == {quote(v)}" for i, v in enumerate(values))
    values_test = f"has(e.values) && size(e.values) == {len(values)}" + (f" && {listed}" if listed else "")
    if not values:
        values_test = "(!has(e.values) || size(e.values) == 0)"
    return f"e.key == {quote(expression['key'])} && e.operator == {quote(expression['operator'])} && {values_test}"


def _anti_affinity_present(term: dict[str, Any]) -> str:
    """The pod's required pod anti-affinity holds ``term`` as the engine writes it (a label selector of one
    expression, every namespace, the topology key), nothing else in it."""
    [expression] = term["labelSelector"]["matchExpressions"]
    same = (
        f"x.topologyKey == {quote(term['topologyKey'])} && !has(x.namespaces) && has(x.namespaceSelector) && "
        "!has(x.namespaceSelector.matchLabels) && !has(x.namespaceSelector.matchExpressions) && "
        "!has(x.matchLabelKeys) && !has(x.mismatchLabelKeys) && has(x.labelSelector) && "
        "!has(x.labelSelector.matchLabels) && has(x.labelSelector.matchExpressions) && "
        f"size(x.labelSelector.matchExpressions) == 1 && x.labelSelector.matchExpressions.exists(e, "
        f"{_implies_exactly(expression)})"
    )
    return f"(has({_AFFINITY}) && has({_ANTI}) && has({_ANTI_REQUIRED}) && {_ANTI_REQUIRED}.exists(x, {same}))"


def _preferred_operations(preferred: dict[str, Any], required_added: str) -> str:
    """The borrower's preference for shared nodes, appended when missing. ``required_added``: CEL telling
    whether the required-affinity operations before it create the node affinity (they run first)."""
    node_affinity_after = f"((has({_AFFINITY}) && has({_NODE_AFFINITY})) || {required_added})"
    path = patch.pointer("spec", "affinity", "nodeAffinity", engine.PREFERRED)
    return (
        f"{_preferred_present(preferred)} ? [] :\n"
        f"{node_affinity_after} ? (has({_AFFINITY}) && has({_NODE_AFFINITY}) && has({_PREFERRED}) ? "
        f"[{_operation('add', path + '/-', _literal(preferred))}] : [{_operation('add', path, _literal([preferred]))}]) :\n"
        f"has({_AFFINITY}) ? [{_operation('add', '/spec/affinity/nodeAffinity', _literal({engine.PREFERRED: [preferred]}))}] :\n"
        f"[{_operation('add', '/spec/affinity', _literal({'nodeAffinity': {engine.PREFERRED: [preferred]}}))}]"
    )


def _anti_affinity_operations(term: dict[str, Any], affinity_added: str) -> str:
    """The borrower's anti-affinity to nodes running inference pods (``lendFrom: idleNodes``), appended
    when missing; ``affinity_added``: CEL telling whether the operations before it create the affinity."""
    path = patch.pointer("spec", "affinity", "podAntiAffinity", scheduling.REQUIRED)
    return (
        # Not for a pod with claims (``placement.plan_borrower_affinity``).
        "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0 ? [] :\n"
        f"{_anti_affinity_present(term)} ? [] :\n"
        f"has({_AFFINITY}) && has({_ANTI}) ? (has({_ANTI_REQUIRED}) ? [{_operation('add', path + '/-', _literal(term))}] : "
        f"[{_operation('add', path, _literal([term]))}]) :\n"
        f"has({_AFFINITY}) || {affinity_added} ? "
        f"[{_operation('add', '/spec/affinity/podAntiAffinity', _literal({scheduling.REQUIRED: [term]}))}] :\n"
        f"[{_operation('add', '/spec/affinity', _literal({'podAntiAffinity': {scheduling.REQUIRED: [term]}}))}]"
    )


def _priority_operations(fields: dict[str, Any]) -> str:
    """The three priority fields (``placement.plan_priority``), each written when it differs."""
    return " + ".join(
        f"(has(object.spec.{name}) && object.spec.{name} == {_literal(value)} ? [] : "
        f"[{_operation('add', patch.pointer('spec', name), _literal(value))}])"
        for name, value in fields.items()
    )


def _borrower_operations(policy: Policy, class_name: str) -> str:
    """Every operation for a borrower of the class, in one list (``placement.borrower_plan``): the class's own
    required node requirements (``a``), the preference for shared nodes (``p``), the anti-affinity to
    inference (``q``, lendFrom idleNodes), the tolerations (``w``), the priority fields, the annotations and
    the labels (placed, borrow). Affinity operations run in that order, each knowing what the ones before it
    created."""
    plan = placement.borrower_plan(policy, class_name)
    assert plan.preferred is not None and plan.priority is not None
    affinity = _affinity_operations(plan.requirements) if plan.requirements else None
    required_added = "size(a) > 0" if affinity is not None else "false"
    preferred = _preferred_operations(plan.preferred, required_added)
    anti = (
        _anti_affinity_operations(plan.anti_affinity, f"({required_added} || size(p) > 0)")
        if plan.anti_affinity is not None
        else None
    )
    tolerations = _toleration_operations(policy, class_name, borrower=True)
    annotations = _annotation_operations(
        class_name,
        f"({required_added} || size(p) > 0)",
        "size(w) > 0" if tolerations is not None else None,
    )
    body = f"({annotations}) + ({_label_operations(class_name, plan.labels)})"
    if affinity is not None:
        body += " + a"
    body += " + p"
    if anti is not None:
        body += " + q"
    if tolerations is not None:
        body += " + w"
    body += f" + ({_priority_operations(plan.priority)})"
    if plan.grace_cap is not None:
        grace = "object.spec.terminationGracePeriodSeconds"
        body += (
            f" + (has({grace}) && {grace} <= {plan.grace_cap} ? [] : "
            f"[{_operation('add', '/spec/terminationGracePeriodSeconds', str(plan.grace_cap))}])"
        )
    if tolerations is not None:
        body = _bind(tolerations, "w", body)
    if anti is not None:
        body = _bind(anti, "q", body)
    body = _bind(preferred, "p", body)
    if affinity is not None:
        body = _bind(affinity, "a", body)
    return body


def _inference_priority_operations(policy: Policy) -> str:
    """Lending on: an inference pod whose resolved priority (the Priority admission plugin ran before this
    policy) is not above the borrowers' gets the inference PriorityClass, all three fields."""
    settings = policy.spec.lending
    fields = {
        "priorityClassName": settings.inference_priority_class.name,
        "priority": settings.inference_priority_class.value,
        "preemptionPolicy": settings.inference_priority_class.preemption_policy,
    }
    at_most = settings.borrower_priority_class.value
    return f"(!has(object.spec.priority) || object.spec.priority <= {at_most}) ? ({_priority_operations(fields)}) : []"


def _lending_operations(policy: Policy, class_name: str) -> str:
    """A class's operations with lending on: an unreserved class's borrowers placed as borrowers, the others
    as without lending; a reserved class's pods raised above the borrowers when they are not."""
    cls = policy.spec.classes[class_name]
    operations = _class_operations(policy, class_name)
    if cls.placement == "unreserved":
        borrower = f"{cel.namespace_may_borrow(policy)} && {cel.borrow_requested(policy)}"
        return f"{borrower} ? (\n{_borrower_operations(policy, class_name)}) :\n({operations})"
    if cls.placement == "reserved":
        return f"({operations}) + ({_inference_priority_operations(policy)})"
    return operations


def class_variables(policy: Policy) -> list[dict[str, str]]:
    """The class of the pod as the backstops compute it. ``podClass`` stands alone (``cel.pod_class``:
    one evaluation); the namespace's allowed and default classes are there for the policies that need
    them (device-level reservation), evaluated only when read."""
    spec = policy.spec
    return [
        {
            "name": "namespaceClassLabel",
            "expression": cel._label_or_absent("namespaceObject", quote(spec.labels.namespace_class)),
        },
        {"name": "namespaceAllowedClasses", "expression": cel._namespace_choice(policy, allowed=True)},
        {"name": "namespaceDefaultClass", "expression": cel._namespace_choice(policy, allowed=False)},
        {"name": "podClass", "expression": cel.pod_class(policy)},
    ]


def without_claims(policy: Policy) -> RouteCatalogue:
    """The policy's GPU-route catalogue without the DRA claim route: CEL cannot read the
    ResourceClaim(Template) a pod names, so a pod that reaches GPUs only through a claim is placed by
    the webhook, which resolves it (the backstop still treats any claim as a GPU route)."""
    return dataclasses.replace(route_catalogue(policy.spec), resource_claims=False)


def not_mirror_pod() -> str:
    annotations = "object.metadata.annotations"
    return f"!(has({annotations}) && {quote(engine.MIRROR_ANNOTATION)} in {annotations})"


def match_conditions(policy: Policy) -> list[dict[str, str]]:
    """One condition (the apiserver evaluates every condition of a policy, no short-circuit between
    them): never a mirror pod (the kubelet owns them: the engine checks them and never mutates them),
    the cheapest test, first; then a GPU pod by every route of the catalogue shared with the engine,
    the webhook and the backstop but the claims (``without_claims``), without regular expressions."""
    if policy.spec.scope.all_pods:
        return [{"name": "not-mirror-pod", "expression": not_mirror_pod()}]
    routes = cel.gpu_routes(without_claims(policy))
    return [{"name": "gpu-pods", "expression": f"{not_mirror_pod()} && (\n{routes})"}]


def placement_policy_spec(policy: Policy) -> dict[str, Any]:
    """The MutatingAdmissionPolicy spec: the engine's placement and class annotation, per class, in one
    mutation."""
    classes = list(policy.spec.classes)
    of_class = _lending_operations if policy.spec.lending.enabled else _class_operations
    operations = of_class(policy, classes[-1])
    for class_name in reversed(classes[:-1]):
        operations = f"variables.podClass == {quote(class_name)} ? (\n{of_class(policy, class_name)}) :\n{operations}"
    return {
        # A mutation that cannot be evaluated rejects the pod rather than admitting it unplaced
        # (docs/operations.md, "Failures"); the cost of the largest pods is measured in the e2e suite.
        "failurePolicy": "Fail",
        # Never: kube-apiserver 1.36 asks for a second pass of the whole mutating chain after any
        # evaluated mutation, and an IfNeeded policy then runs itself again (docs/architecture.md): the
        # webhook, called after this policy (and reinvoked when a later webhook changes the pod), places
        # every pod this policy does.
        "reinvocationPolicy": "Never",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ]
        },
        "matchConditions": match_conditions(policy),
        "variables": [{"name": "podClass", "expression": cel.pod_class(policy)}],
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": operations}}],
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
    namespaceSelector requirement), not in ``audit`` mode, not the pods opted out of the webhook, not the
    pods placed already (``engine.PLACED_LABEL``)."""
    return {
        "policyName": POLICY_NAME,
        "matchResources": {
            "namespaceSelector": {"matchExpressions": [excluded, mutating_modes_selector(policy)]},
            "objectSelector": {
                "matchExpressions": [
                    {"key": cel.OPT_OUT_LABEL, "operator": "NotIn", "values": ["true"]},
                    # Placed already: in the second pass of the mutating chain (this policy or the webhook
                    # wrote it in the first), or by a pod's author, for whom the webhook still places and
                    # the backstop still judges (neither reads it).
                    {"key": engine.PLACED_LABEL, "operator": "DoesNotExist"},
                ]
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
