"""CEL run by the kube-apiserver itself: the webhook's ``matchConditions``, the namespace-class guard and
the building blocks of the backstop (``reserved_nodes``) and the placement MAP, generated from the
IsolationPolicy so they always agree with it.

Only functions both Kubernetes CEL and cel-python implement are used (``has``, ``in``, ``size``,
``all``/``exists``, ``startsWith``/``endsWith``/``contains``, ``matches``, ternaries), so the tests
evaluate these exact strings. Every field read is guarded by ``has()``: a missing field is an
evaluation error, and an error in a match condition or a policy with ``failurePolicy: Fail`` would
reject the request. A regular expression of the policy (resource patterns, glob namespace rules)
becomes a string comparison where one says the same (``string_test``).

What CEL cannot see that the engine can (documented in docs/operations.md):
- node labels: the reserved node names reach the backstop as its parameter (``reserved_names``);
- glob namespace rules are translated to anchored regular expressions (same meaning for DNS names).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from webhook.core.lending import switchable
from webhook.core.policy import LENDING_ALLOWED, Policy, RouteCatalogue, glob_regex, route_catalogue

__all__ = ["glob_regex"]  # re-exported: the namespace rules' globs are rendered with it

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
# A label value can never contain "<", so this stands for "label absent" when comparing old and new.
ABSENT = "<absent>"
CLASS_LABEL_EDITORS = "rocm-isolation-class-label-editors"


def quote(text: str) -> str:
    """A CEL single-quoted string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def str_list(items: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(quote(item) for item in items) + "]"


def _is_glob(name: str) -> bool:
    return any(ch in name for ch in "*?[")


# --- GPU pods -------------------------------------------------------------------------------------


# --- strings without regular expressions -----------------------------------------------------------

_REGEX_SPECIAL = frozenset(".^$*+?()[]{}|\\")


def _regex_pieces(pattern: str) -> list[str | None] | None:
    """An anchored-or-not regular expression as literal runs separated by ``.*`` (None), or None when it
    uses anything else (classes, ``?``, ``+``, alternation...). ``^`` and ``$`` are kept as pieces."""
    pieces: list[str | None] = []
    literal: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= n or pattern[i + 1].isalnum():
                return None  # \d, \w, \b...: a class or an assertion
            literal.append(pattern[i + 1])
            i += 2
            continue
        if ch in "^$" and (i == 0 if ch == "^" else i == n - 1):
            pieces.append("".join(literal))
            literal = []
            pieces.append(ch)
            i += 1
            continue
        if pattern.startswith(".*", i):
            pieces.append("".join(literal))
            literal = []
            pieces.append(None)
            i += 2
            continue
        if ch in _REGEX_SPECIAL:
            return None
        literal.append(ch)
        i += 1
    pieces.append("".join(literal))
    return [piece for piece in pieces if piece != ""]


def string_test(var: str, pattern: str) -> str:
    """CEL for ``var.matches(pattern)`` (RE2, searched), without a regular expression when the pattern is
    a literal anchored at one or both ends, or two such literals around ``.*``: ``==``, ``startsWith``,
    ``endsWith`` (the apiserver precompiles constant regexes, but a match still costs more than a
    string comparison). Anything else stays ``matches()``."""
    pieces = _regex_pieces(pattern)
    if pieces is not None:
        start = bool(pieces) and pieces[0] == "^"
        end = bool(pieces) and pieces[-1] == "$"
        body = pieces[int(start) : len(pieces) - int(end)]
        # A leading or trailing .* changes nothing to a search.
        if body and body[0] is None and start:
            body, start = body[1:], False
        if body and body[-1] is None and end:
            body, end = body[:-1], False
        while body and body[0] is None:
            body = body[1:]
        while body and body[-1] is None:
            body = body[:-1]
        literals = [piece for piece in body if piece is not None]
        if not body:
            return "true"
        if len(body) == 1 and isinstance(body[0], str):
            text = quote(body[0])
            if start and end:
                return f"{var} == {text}"
            if start:
                return f"{var}.startsWith({text})"
            if end:
                return f"{var}.endsWith({text})"
            return f"{var}.contains({text})"
        if start and end and len(body) == 3 and body[1] is None and len(literals) == 2:
            head, tail = literals
            return (
                f"({var}.startsWith({quote(head)}) && {var}.endsWith({quote(tail)}) && "
                f"size({var}) >= {len(head) + len(tail)})"
            )
    return f"{var}.matches({quote(pattern)})"


def glob_test(var: str, glob: str) -> str:
    """CEL for a namespace (or class) name ``var`` matching a shell glob, as ``glob_regex`` means it."""
    return string_test(var, glob_regex(glob))


def _gpu_key(var: str, catalogue: RouteCatalogue) -> str:
    parts = []
    if catalogue.resource_names:
        parts.append(f"{var} in {str_list(catalogue.resource_names)}")
    parts.extend(string_test(var, pattern) for pattern in catalogue.resource_patterns)
    return " || ".join(parts)


def _resource_route(c: str, key: str) -> str:
    """The container ``c`` requests or limits a resource name that ``key`` (on ``r``) matches."""
    return (
        f"(has({c}.resources) && (\n"
        f"  (has({c}.resources.requests) && {c}.resources.requests.exists(r, {key})) ||\n"
        f"  (has({c}.resources.limits) && {c}.resources.limits.exists(r, {key}))"
        "))"
    )


def _privileged_route(c: str) -> str:
    return f"(has({c}.securityContext) && has({c}.securityContext.privileged) && {c}.securityContext.privileged)"


def _runtime_variable(catalogue: RouteCatalogue) -> str:
    """An env entry ``e`` that the AMD container runtime reads ('' when the route is off)."""
    variables = [f"e.name in {str_list(catalogue.runtime_variables)}"] if catalogue.runtime_variables else []
    variables += [f"e.name.startsWith({quote(p)})" for p in catalogue.runtime_variable_prefixes]
    return " || ".join(variables)


def _runtime_variable_route(c: str, variable: str) -> str:
    return f"(has({c}.env) && {c}.env.exists(e, {variable}))"


def _container_routes(catalogue: RouteCatalogue) -> str:
    """A container ``c`` that reaches a GPU by a route of its own (the engine's pods.container_routes)."""
    parts = []
    key = _gpu_key("r", catalogue)
    if key:
        parts.append(_resource_route("c", key))
    if catalogue.privileged:
        parts.append(_privileged_route("c"))
    variable = _runtime_variable(catalogue)
    if variable:
        parts.append(_runtime_variable_route("c", variable))
    return " ||\n".join(parts)


CONTAINER_FIELDS = ("containers", "initContainers", "ephemeralContainers")
# Every extended resource name has a domain prefix (cpu, memory, hugepages-* have none).
ANY_EXTENDED_RESOURCE = "/"


def gpu_pod(policy: Policy, root: str = "object") -> str:
    """True when the pod reaches a GPU by any route of the policy's catalogue (``Policy.catalogue``,
    the engine's definition): a container (regular, init, ephemeral) requesting or limiting a GPU
    resource, privileged, or setting the AMD container runtime's variables; a RuntimeClass of the AMD
    runtime; or any Dynamic Resource Allocation claim.

    CEL in admission cannot read the ResourceClaim(Template) a pod names, so it cannot tell a GPU claim
    from another: every pod with a claim is treated as a GPU pod. The webhook then resolves the claim
    (and leaves a non-GPU one alone); the ValidatingAdmissionPolicy keeps any claim-holding pod of a
    non-inference class off the reserved nodes (documented in docs/policy.md). Nor can it read
    DeviceClasses: the DRA extended resources it knows are the policy's (``extendedResourceNames``,
    ``deviceclass.resource.kubernetes.io/<gpuDeviceClasses>``)."""
    return gpu_routes(route_catalogue(policy.spec), root)


def gpu_routes(catalogue: RouteCatalogue, root: str = "object") -> str:
    container = _container_routes(catalogue)
    parts = []
    if container:
        parts += [
            f"(has({root}.spec.{field}) && {root}.spec.{field}.exists(c, {container}))" for field in CONTAINER_FIELDS
        ]
    if catalogue.runtime_class_names:
        runtime_class = f"{root}.spec.runtimeClassName"
        parts.append(f"(has({runtime_class}) && {runtime_class} in {str_list(catalogue.runtime_class_names)})")
    if catalogue.resource_claims:
        parts.append(f"(has({root}.spec.resourceClaims) && size({root}.spec.resourceClaims) > 0)")
    return " ||\n".join(parts) if parts else "false"


def direct_routes(catalogue: RouteCatalogue) -> str:
    """An ephemeral container ``c`` that reaches GPUs itself (privileged, the runtime's variables)."""
    without_resources = replace(
        catalogue, resource_names=(), resource_patterns=(), resource_claims=False, runtime_class_names=()
    )
    return _container_routes(without_resources) or "false"


def webhook_match_conditions(policy: Policy) -> list[dict[str, str]]:
    """The mutating webhook's matchConditions: GPU pods only (unless the policy scopes all pods).

    Mirror pods are sent too: anyone can set the mirror annotation, so the engine checks them
    (``spec.nodeName`` on a reserved node is beyond the ValidatingAdmissionPolicy) but never mutates them.
    """
    conditions = []
    if not policy.spec.scope.all_pods:
        catalogue = route_catalogue(policy.spec)
        if policy.spec.scope.routes.dra_extended_resources:
            # The webhook knows the cluster's DeviceClasses (their extendedResourceNames and
            # deviceclass.resource.kubernetes.io/<class>), CEL does not: a pod asking for any extended
            # resource is sent, and the engine tells a GPU class's from the others.
            catalogue = replace(catalogue, resource_patterns=(*catalogue.resource_patterns, ANY_EXTENDED_RESOURCE))
        conditions.append({"name": "gpu-pods", "expression": gpu_routes(catalogue)})
    return conditions


# --- namespace class ------------------------------------------------------------------------------


def _label_equals(root: str, key: str, value: str) -> str:
    labels = f"{root}.metadata.labels"
    return f"(has({labels}) && {quote(key)} in {labels} && {labels}[{quote(key)}] == {quote(value)})"


def _label_or_absent(root: str, key: str) -> str:
    labels = f"{root}.metadata.labels"
    return f"(has({labels}) && {key} in {labels} ? {labels}[{key}] : {quote(ABSENT)})"


def _rule_matches(policy: Policy, index: int) -> str:
    match = policy.spec.namespaces[index].match
    parts = []
    if match.names:
        exact = [name for name in match.names if not _is_glob(name)]
        names = [f"request.namespace in {str_list(exact)}"] if exact else []
        names += [glob_test("request.namespace", name) for name in match.names if _is_glob(name)]
        parts.append("(" + " || ".join(names) + ")")
    parts.extend(_label_equals("namespaceObject", key, value) for key, value in match.labels.items())
    return " && ".join(parts)


def _namespace_choice(policy: Policy, *, allowed: bool) -> str:
    """Nested ternary mirroring Policy.namespace_classes: first rule, then the class label, then the default."""
    spec = policy.spec
    label = "variables.namespaceClassLabel"
    fallback = (
        f"{label} in {str_list(list(spec.classes))} ? "
        + (f"[{label}]" if allowed else label)
        + " : "
        + (str_list([spec.default_class]) if allowed else quote(spec.default_class))
    )
    for index in reversed(range(len(spec.namespaces))):
        rule = spec.namespaces[index]
        value = str_list(rule.allowed_classes) if allowed else quote(rule.effective_default)
        fallback = f"{_rule_matches(policy, index)} ? {value} :\n({fallback})"
    return fallback


def _label_in(root: str, key: str, values: list[str] | tuple[str, ...]) -> str:
    labels = f"{root}.metadata.labels"
    return f"has({labels}) && {quote(key)} in {labels} && {labels}[{quote(key)}] in {str_list(values)}"


def _pick(policy: Policy, allowed: list[str] | tuple[str, ...], default: str) -> str:
    """The class of a pod whose namespace allows ``allowed`` (default ``default``): the pod label when
    it names an allowed class, else the default (``engine._classify``). A constant when the label can
    change nothing (a single allowed class that is the default)."""
    if set(allowed) == {default}:
        return quote(default)
    key = policy.spec.labels.pod_class
    return f"({_label_in('object', key, allowed)} ? object.metadata.labels[{quote(key)}] : {quote(default)})"


def pod_class(policy: Policy) -> str:
    """The pod's class in one expression (one variable evaluation, where the namespace choice, then the
    pod label, took four): the first namespace rule that matches, else the namespace's class label,
    else ``defaultClass`` (``Policy.namespace_classes``); then the pod label when it names a class that
    namespace allows. For the placement MAP and the backstops alike."""
    spec = policy.spec
    key = spec.labels.namespace_class
    classes = list(spec.classes)
    by_label = f"namespaceObject.metadata.labels[{quote(key)}]"
    out = f"({_label_in('namespaceObject', key, classes)} ? {by_label} : {quote(spec.default_class)})"
    for index in reversed(range(len(spec.namespaces))):
        rule = spec.namespaces[index]
        out = (
            f"{_rule_matches(policy, index)} ?\n{_pick(policy, rule.allowed_classes, rule.effective_default)} :\n{out}"
        )
    return out


# --- reaching reserved nodes ----------------------------------------------------------------------


def node_selector_reserved(policy: Policy, root: str) -> str:
    key, value = policy.spec.reserved_nodes.label
    selector = f"{root}.spec.nodeSelector"
    return f"has({selector}) && {quote(key)} in {selector} && {selector}[{quote(key)}] == {quote(value)}"


# A node-selector term ``t`` that can match a node (an empty term matches none).
LIVE_TERM = (
    "((has(t.matchExpressions) && size(t.matchExpressions) > 0) || (has(t.matchFields) && size(t.matchFields) > 0))"
)


def _every_live_term(root: str, condition: str) -> str:
    """The pod has required node affinity with a live term, and every live term meets ``condition`` (on ``t``)."""
    affinity = f"{root}.spec.affinity"
    required = f"{affinity}.nodeAffinity.{REQUIRED}"
    terms = f"{required}.nodeSelectorTerms"
    return (
        f"has({affinity}) && has({affinity}.nodeAffinity) && has({required}) && has({terms}) &&\n"
        f"{terms}.exists(t, {LIVE_TERM}) &&\n"
        f"{terms}.all(t, !{LIVE_TERM} ||\n  {condition})"
    )


def affinity_only_reserved(policy: Policy, root: str) -> str:
    """Every non-empty required term has a requirement ``key In [value...]`` selecting only reserved nodes
    (an empty term matches no node and is ignored; with no non-empty term the pod reaches nothing)."""
    key, value = policy.spec.reserved_nodes.label
    only_reserved = (
        f"(has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == {quote(key)} && e.operator == 'In' "
        f"&& has(e.values) && size(e.values) > 0 && e.values.all(v, v == {quote(value)})))"
    )
    return _every_live_term(root, only_reserved)


def affinity_excludes_reserved(policy: Policy, root: str) -> str:
    """Every non-empty required term keeps off the reserved nodes by their label (``NotIn`` the value,
    ``DoesNotExist``, or ``In`` other values), as scheduling.affinity_excludes_reserved."""
    key, value = policy.spec.reserved_nodes.label
    listed = f"(has(e.values) && {quote(value)} in e.values)"
    excludes = (
        f"(has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == {quote(key)} && ("
        f"e.operator == 'DoesNotExist' || (e.operator == 'NotIn' && {listed}) || "
        f"(e.operator == 'In' && !{listed}))))"
    )
    return _every_live_term(root, excludes)


def ephemeral_gpu_access(policy: Policy) -> str:
    """pods/ephemeralcontainers: an ephemeral container the old pod did not have reaches GPUs itself
    (privileged, the AMD runtime's variables), as the engine's _decide_ephemeral reads it."""
    ephemeral = "object.spec.ephemeralContainers"
    before = "oldObject.spec.ephemeralContainers"
    return (
        "has(request.subResource) && request.subResource == 'ephemeralcontainers' &&\n"
        f"has({ephemeral}) && {ephemeral}.exists(c,\n  ({direct_routes(route_catalogue(policy.spec))}) &&\n"
        f"  !(has({before}) && {before}.exists(o, o.name == c.name)))"
    )


def may_be_on_reserved(policy: Policy) -> str:
    """Whether the pod may be on a reserved node, as far as the pod itself tells (CEL knows no node
    names): not kept off them by its affinity, and (with a reserved taint) tolerating it or selecting
    them. A pod pinned with spec.nodeName at creation and not tolerating the taint is the documented gap."""
    excluded = f"({affinity_excludes_reserved(policy, 'object')})"
    if policy.spec.reserved_nodes.taint is None:
        return f"!{excluded}"
    tolerates = tolerates_any_reserved(policy)
    selects = f"({node_selector_reserved(policy, 'object')}) ||\n({affinity_only_reserved(policy, 'object')})"
    return f"!{excluded} &&\n(({tolerates}) ||\n{selects})"


def _tolerates_reserved_taint(policy: Policy) -> str:
    """A toleration ``t`` that tolerates the reserved taint (Kubernetes' ToleratesTaint)."""
    taint = policy.spec.reserved_nodes.taint
    assert taint is not None
    effect = f"(!has(t.effect) || t.effect == '' || t.effect == {quote(taint.effect)})"
    exists = "(has(t.operator) && t.operator == 'Exists')"
    equal = "(!has(t.operator) || t.operator == '' || t.operator == 'Equal')"
    value = f"(has(t.value) ? t.value : '') == {quote(taint.value)}"
    keyed = f"t.key == {quote(taint.key)} && ({exists} || ({equal} && {value}))"
    return f"{effect} &&\n  ((!has(t.key) || t.key == '') ? {exists} : ({keyed}))"


def tolerates_any_reserved(policy: Policy) -> str:
    """Any toleration of the pod tolerates the reserved taint (old or new)."""
    if policy.spec.reserved_nodes.taint is None:
        return "false"
    return f"has(object.spec.tolerations) && object.spec.tolerations.exists(t,\n  {_tolerates_reserved_taint(policy)})"


def tolerates_reserved(policy: Policy) -> str:
    """A toleration that tolerates the reserved taint (Kubernetes' ToleratesTaint: an empty key with
    Exists tolerates every taint) and that the old pod did not already have (on UPDATE only what the
    update adds is checked, as the engine does)."""
    if policy.spec.reserved_nodes.taint is None:
        return "false"
    already = "request.operation == 'UPDATE' && has(oldObject.spec.tolerations) && t in oldObject.spec.tolerations"
    return (
        f"has(object.spec.tolerations) && object.spec.tolerations.exists(t,\n"
        f"  {_tolerates_reserved_taint(policy)} &&\n  !({already}))"
    )


# Pods labelled rocm-isolation.io/ignore=true are not sent to the webhook (its objectSelector).
OPT_OUT_LABEL = "rocm-isolation.io/ignore"


def opted_out_with_node_name(root: str) -> str:
    """An opted-out pod that names its node: only the webhook knows which nodes are reserved (the
    policy sees no node labels) and the kubelet ignores NoSchedule taints for such a pod."""
    label = quote(OPT_OUT_LABEL)
    return (
        f"has({root}.metadata.labels) && {label} in {root}.metadata.labels && "
        f"{root}.metadata.labels[{label}] == 'true' &&\n"
        f"has({root}.spec.nodeName) && {root}.spec.nodeName != ''"
    )


# Judged at all: a terminating pod is never scheduled again, its updates (finalizers) are not checked.
NOT_TERMINATING = "(request.operation != 'UPDATE' || !has(object.metadata.deletionTimestamp))"


def namespace_label_keys(policy: Policy) -> list[str]:
    """Namespace labels that decide a class or its enforcement: the class label, the mode label (``audit``
    or ``warn`` on a namespace turns the denials off there, in the webhook and in the policy's bindings),
    every label a namespace rule matches on, and (lending on) the label that lets a namespace borrow."""
    keys = [policy.spec.labels.namespace_class, policy.spec.labels.namespace_mode]
    for rule in policy.spec.namespaces:
        keys.extend(key for key in rule.match.labels if key not in keys)
    lending = policy.spec.lending
    if switchable(policy) and lending.namespaces.label_key not in keys:
        # Lending on (or switchable, core/lending.switchable: the backstop's lending binding reads it): the
        # label that lets a namespace borrow reserved capacity is guarded the same way.
        keys.append(lending.namespaces.label_key)
    return keys


def namespace_class_policy_spec(policy: Policy) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy spec limiting who may set, change or remove class-deciding labels."""
    keys = namespace_label_keys(policy)
    unchanged = (
        f"{str_list(keys)}.all(k,\n  {_label_or_absent('object', 'k')} ==\n  "
        f"(request.operation == 'UPDATE' && has(oldObject.metadata.labels) && k in oldObject.metadata.labels ? "
        f"oldObject.metadata.labels[k] : {quote(ABSENT)}))"
    )
    editor = (
        "has(request.userInfo.groups) && has(params.data) &&\n"
        "params.data.exists(k, params.data[k] in request.userInfo.groups)"
    )
    return {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["namespaces"],
                }
            ]
        },
        "variables": [
            {"name": "classLabelsUnchanged", "expression": unchanged},
            {"name": "classLabelEditor", "expression": editor},
        ],
        "validations": [
            {
                "expression": "variables.classLabelsUnchanged || variables.classLabelEditor",
                "message": f"rocm-isolation: only the groups listed in the ConfigMap {CLASS_LABEL_EDITORS} may set, "
                f"change or remove the namespace labels {', '.join(keys)}",
                "messageExpression": quote("rocm-isolation: only the groups listed in the ConfigMap ")
                + " + params.metadata.name + "
                + quote(
                    f" may set, change or remove the namespace labels {', '.join(keys)}: they decide which pods "
                    "may use the nodes reserved for inference"
                ),
                "reason": "Forbidden",
            }
        ],
    }


# --- lending (webhook.core.lending) ----------------------------------------------------------------


def namespace_may_borrow(policy: Policy) -> str:
    """``lending.namespace_may_borrow``: the namespace is labelled ``<labelKey>=allowed``, or named (exact
    or glob) in ``lending.namespaces.names``."""
    namespaces = policy.spec.lending.namespaces
    parts = [_label_equals("namespaceObject", namespaces.label_key, LENDING_ALLOWED)]
    exact = [name for name in namespaces.names if not _is_glob(name)]
    if exact:
        parts.append(f"request.namespace in {str_list(exact)}")
    parts += [glob_test("request.namespace", name) for name in namespaces.names if _is_glob(name)]
    return "(" + " || ".join(parts) + ")"


def namespace_named_to_borrow(policy: Policy) -> str:
    """The namespace is named (exact or glob) in ``lending.namespaces.names`` ('false' when none is)."""
    names = policy.spec.lending.namespaces.names
    exact = [name for name in names if not _is_glob(name)]
    parts = [f"request.namespace in {str_list(exact)}"] if exact else []
    parts += [glob_test("request.namespace", name) for name in names if _is_glob(name)]
    return "(" + " || ".join(parts) + ")" if parts else "false"


def borrow_requested(policy: Policy) -> str:
    """The pod's own choice as ``lending.borrow_choice`` reads it: its borrow label ``"true"``, or (with
    ``defaultBorrow``) no borrow label at all; any other value borrows nothing."""
    lending = policy.spec.lending
    labels = "object.metadata.labels"
    key = quote(lending.pod_label)
    opted_in = f"{labels}[{key}] == 'true'"
    if lending.default_borrow:
        return f"(!has({labels}) || !({key} in {labels}) || {opted_in})"
    return f"(has({labels}) && {key} in {labels} && {opted_in})"


def _tolerates_taint(key: str, value: str, effect: str) -> str:
    """A toleration ``t`` that tolerates the taint ``key=value:effect`` (Kubernetes' ToleratesTaint)."""
    effect_test = f"(!has(t.effect) || t.effect == '' || t.effect == {quote(effect)})"
    exists = "(has(t.operator) && t.operator == 'Exists')"
    equal = "(!has(t.operator) || t.operator == '' || t.operator == 'Equal')"
    keyed = f"t.key == {quote(key)} && ({exists} || ({equal} && (has(t.value) ? t.value : '') == {quote(value)}))"
    return f"{effect_test} &&\n  ((!has(t.key) || t.key == '') ? {exists} : ({keyed}))"


def tolerates_no_borrowers(policy: Policy, *, added: bool) -> str:
    """A toleration of the pod tolerates the no-borrowers taint (``added``: one the old pod did not have,
    on UPDATE)."""
    taint = policy.spec.lending.no_borrowers_taint
    already = "request.operation == 'UPDATE' && has(oldObject.spec.tolerations) && t in oldObject.spec.tolerations"
    test = _tolerates_taint(taint.key, taint.value, taint.effect)
    if added:
        test += f" &&\n  !({already})"
    return f"has(object.spec.tolerations) && object.spec.tolerations.exists(t,\n  {test})"
