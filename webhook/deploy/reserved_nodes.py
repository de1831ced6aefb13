"""The pod backstop: the ValidatingAdmissionPolicies ``rocm-isolation-reserved-nodes`` and
``rocm-isolation-reserved-node-names``, which keep GPU pods of the classes that may not use reserved nodes
(``placement: unreserved``, e.g. training) off them in the apiserver, webhook up or down.

It denies such a pod that reaches a reserved node by the reserved label (``spec.nodeSelector``, required
node affinity), by tolerating the reserved taint, by naming a reserved node (``spec.nodeName``,
``matchFields metadata.name``), an opted-out pod that names any node, and a GPU debug container added to
a pod that may be on a reserved node. The reserved node names come from the names policy's parameter, the ConfigMap
``rocm-isolation-system/rocm-isolation-reserved-node-names`` (``reserved_names``: one key per node, kept
in step with the labelled nodes by ``serve`` and ``pool``).

Two policies, split by what they need (issue 42: the backstop fails closed). ``rocm-isolation-reserved-nodes``
takes no parameter: the reserved label, the reserved taint, opting out with a node name, a GPU debug
container, the no-borrowers taint (lending on) hold whatever happens to any ConfigMap.
``rocm-isolation-reserved-node-names`` holds the three checks that need the names (``spec.nodeName``,
``matchFields metadata.name``, a GPU debug container on a pod bound by name) and reads the ConfigMap with
``parameterNotFoundAction: Allow``: the apiserver looks the parameter up before any match condition, so
``Deny`` would reject every pod of the bound namespaces, GPU or not, while it is missing (a cluster that
cannot start a pod is worse than a check off). From issue 27 to 42 the two were one policy reading the
ConfigMap: one policy's fixed price per pod instead of two, but with the ConfigMap deleted the apiserver
skipped the label and taint checks too (a training pod tolerating the reserved taint and selecting the
reserved pool was admitted with the webhook down). The names policy's price is one more conversion and
condition activation per pod of the bound namespaces; its condition tests ``spec.nodeName`` /
``matchFields`` first, so a pod naming no node stops there. While the ConfigMap is missing only the
name checks are off; the Lease holder of ``serve`` re-creates it within a round (service/names_sync.py),
``audit`` reports it, ``pool apply`` or re-applying the manifests re-creates it.

What the apiserver evaluates per pod (docs/architecture.md): its match conditions in one activation (all
of them: no short-circuit between conditions, hence one), then, for a pod they hold for, every
validation, every messageExpression and the audit annotations, each set in an activation of its own. So
its one condition, ``may-be-denied``, is "a validation could deny this pod" without its class (which a
match condition cannot compute: ``namespaceObject`` is null there), then "it is a GPU pod": a training
pod the webhook or the MAP placed, and most pods without GPU, stop at its first half; an inference pod
(it tolerates the reserved taint) is judged. Each validation tests its own check before
the class (one variable, ``cel.pod_class``, the MAP's); the messages are static (a messageExpression
would be evaluated for every judged pod, denied or not): the rule, the reserved label or taint and the
fix, rendered from the policy. What a static message cannot say: the pod's class, which node, and which
container makes it a GPU pod (the webhook's denial says all three).
"""

from __future__ import annotations

import copy
from typing import Any

from webhook.core import engine
from webhook.core.lending import switchable
from webhook.core.policy import LENDING_ALLOWED, Policy
from webhook.deploy import cel, reserved_names
from webhook.deploy.cel import REQUIRED, quote, str_list

POLICY_NAME = "rocm-isolation-reserved-nodes"
# Lending on: the same backstop for the namespaces labelled to borrow, bound to them only (their bindings
# select them by the label, the other policy's bindings the rest), so that its condition can leave out a
# borrower at the borrowers' priority: a match condition cannot read the namespace (``namespaceObject`` is
# null there), a binding's namespace selector can.
LENDING_POLICY_NAME = "rocm-isolation-reserved-nodes-lending"
# The checks that need the reserved node names (its parameter); the only backstop skipped while the
# ConfigMap is missing. One policy for every namespace, lending on or off: its condition is cheap without
# the namespace (a node named), so a borrower is told by its namespace in the class variable.
NAMES_POLICY_NAME = "rocm-isolation-reserved-node-names"
PARAM_REF: dict[str, str] = {
    "name": reserved_names.PARAMS_CONFIGMAP,
    "namespace": reserved_names.NAMESPACE,
    "parameterNotFoundAction": "Allow",
}
OPTED_OUT_NODE_NAME = "opted-out-with-node-name"


def _reserved_name(name: str) -> str:
    """``name`` is a reserved node: a key of the params ConfigMap (a ConfigMap without data lists none)."""
    return f"(has(params.data) && {name} in params.data)"


ON_RESERVED_NODE = f"has(object.spec.nodeName) && {_reserved_name('object.spec.nodeName')}"


def _affinity_by_name(policy: Policy) -> str:
    """Required node affinity whose every live term selects reserved nodes, by their label or by
    ``matchFields metadata.name`` of reserved nodes only, at least one by name (the label-only case is
    ``cel.affinity_only_reserved``)."""
    key, value = policy.spec.reserved_nodes.label
    terms = f"object.spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms"
    by_label = (
        f"(has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == {quote(key)} && e.operator == 'In' "
        f"&& has(e.values) && size(e.values) > 0 && e.values.all(v, v == {quote(value)})))"
    )
    by_name = (
        "(has(t.matchFields) && t.matchFields.exists(f, f.key == 'metadata.name' && f.operator == 'In' && "
        f"has(f.values) && size(f.values) > 0 && f.values.all(v, {_reserved_name('v')})))"
    )
    return (
        f"has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
        f"has(object.spec.affinity.nodeAffinity.{REQUIRED}) && has({terms}) &&\n"
        f"{terms}.exists(t, {cel.LIVE_TERM} && {by_name}) &&\n"
        f"{terms}.all(t, !{cel.LIVE_TERM} || {by_label} || {by_name})"
    )


# (the engine's rule, expression on the new pod, the same on the old pod or None, what, how to fix)
Check = tuple[str, str, str | None, str, str]


def _label_checks(policy: Policy) -> list[Check]:
    """What the pod tells by itself: the reserved label, the reserved taint, opting out with a node name,
    a GPU debug container on a pod that may be on a reserved node. Judged on CREATE and UPDATE (a
    scheduling-gated pod may gain node affinity; only what an update introduces is denied), never for a
    terminating pod."""
    spec = policy.spec
    key, value = spec.reserved_nodes.label
    checks: list[Check] = [
        (
            engine.DENY_NODE_SELECTOR,
            cel.node_selector_reserved(policy, "object"),
            cel.node_selector_reserved(policy, "oldObject"),
            f"spec.nodeSelector selects {key}={value}",
            "remove the selector",
        ),
        (
            engine.DENY_NODE_AFFINITY,
            cel.affinity_only_reserved(policy, "object"),
            cel.affinity_only_reserved(policy, "oldObject"),
            f"spec.affinity.nodeAffinity.{REQUIRED} selects reserved nodes in every term",
            "remove that requirement",
        ),
    ]
    taint = spec.reserved_nodes.taint
    if taint is not None:
        checks.append(
            (
                engine.DENY_TOLERATION,
                cel.tolerates_reserved(policy),
                None,
                f"spec.tolerations tolerate {taint.key}={taint.value}:{taint.effect} (an empty key with operator "
                "Exists tolerates every taint)",
                "remove that toleration",
            )
        )
    checks += [
        (
            # The policy's own rule: an opted-out pod never reaches the webhook.
            OPTED_OUT_NODE_NAME,
            cel.opted_out_with_node_name("object"),
            cel.opted_out_with_node_name("oldObject"),
            f"the pod opts out of the webhook ({cel.OPT_OUT_LABEL}=true) and sets spec.nodeName, which only the "
            "webhook can check against the reserved nodes",
            f"remove the {cel.OPT_OUT_LABEL} label or spec.nodeName",
        ),
        (
            engine.DENY_EPHEMERAL,
            f"({cel.ephemeral_gpu_access(policy)}) &&\n{cel.may_be_on_reserved(policy)}",
            None,
            "an added ephemeral container reaches the GPUs (privileged, or the AMD container runtime's variables) "
            "of a pod that may be on a reserved node",
            "debug with an unprivileged ephemeral container, or from a copy of the pod (kubectl debug --copy-to)",
        ),
    ]
    return checks


def _name_checks(policy: Policy) -> list[Check]:
    """What only the reserved node names tell (the params): ``spec.nodeName`` (the scheduler, and with it
    the NoSchedule taint, is skipped; the kubelet does not check NoSchedule) or ``matchFields`` naming a
    reserved node, on CREATE (neither can change afterwards: binding goes through pods/binding), and a
    GPU debug container added to a pod bound to one by name."""
    params = f"ConfigMap {reserved_names.NAMESPACE}/{reserved_names.PARAMS_CONFIGMAP}"
    return [
        (
            engine.DENY_NODE_NAME,
            f"request.operation == 'CREATE' && {ON_RESERVED_NODE}",
            None,
            f"spec.nodeName names a reserved node (listed in the {params})",
            "remove spec.nodeName",
        ),
        (
            engine.DENY_NODE_AFFINITY,
            f"request.operation == 'CREATE' && {_affinity_by_name(policy)}",
            None,
            f"every term of spec.affinity.nodeAffinity.{REQUIRED} selects reserved nodes, one at least by name "
            f"(matchFields metadata.name of nodes listed in the {params})",
            "remove that requirement",
        ),
        (
            engine.DENY_EPHEMERAL,
            f"({cel.ephemeral_gpu_access(policy)}) &&\n{ON_RESERVED_NODE}",
            None,
            "an added ephemeral container reaches the GPUs (privileged, or the AMD container runtime's variables) "
            "of the reserved node the pod is bound to (spec.nodeName)",
            "debug with an unprivileged ephemeral container, or from a copy of the pod (kubectl debug --copy-to)",
        ),
    ]


def checks(policy: Policy) -> list[Check]:
    """The validations' checks in order, the label policy's then the names policy's (tests map a failed
    validation to its rule with it)."""
    return _label_checks(policy) + _name_checks(policy)


def _advice(policy: Policy) -> str:
    spec = policy.spec
    reserved_class = next((name for name, cls in spec.classes.items() if cls.placement == "reserved"), None)
    return (
        f"to use them, run the pod in a namespace labelled {spec.labels.namespace_class}={reserved_class}, or "
        if reserved_class
        else ""
    )


def _unreserved(policy: Policy) -> list[str]:
    return [name for name, cls in policy.spec.classes.items() if cls.placement == "unreserved"]


def _validations(policy: Policy, of: list[Check]) -> list[dict[str, str]]:
    """The validations of ``of``, each with its static message. The engine's words (assessment.denied,
    reserved_hint): "<class> pods may not use the reserved nodes (<key>=<value>): <field> <what>; to use
    them, run the pod in a namespace labelled <class label>=<class>"."""
    key, value = policy.spec.reserved_nodes.label
    classes = " or ".join(_unreserved(policy))
    advice = _advice(policy)
    validations = []
    for rule, current, before, what, fix in of:
        # Inline, not variables: each check is read once, in the validations' activation. Cheapest first:
        # the check, then the class, then (UPDATE) whether the old pod did the same.
        expression = f"!({current}) ||\n!variables.unreservedClass"
        if before is not None:
            # On UPDATE only a change that newly reaches reserved nodes is denied (ratcheting): pods
            # admitted before the policy existed can still have their labels or finalizers edited.
            expression += f" ||\n(request.operation == 'UPDATE' &&\n{before})"
        validations.append(
            {
                "expression": expression,
                "message": f"rocm-isolation: [{rule}] {classes} pods may not use the reserved nodes ({key}={value}): "
                f"{what}; {advice}{fix}",
                "reason": "Forbidden",
            }
        )
    return validations


_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]},
    # kubectl debug: the one subresource that adds containers to a running pod.
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/ephemeralcontainers"]},
]


def _at_priority(policy: Policy) -> str:
    value = policy.spec.lending.borrower_priority_class.value
    return f"(has(object.spec.priority) && object.spec.priority <= {value})"


def _spec(
    policy: Policy,
    may_be_denied: str,
    unreserved_class: str,
    validations: list[dict[str, str]],
    *,
    param_kind: str | None = None,
) -> dict[str, Any]:
    """A backstop policy's spec: pods and debug containers, one match condition, the pod's class."""
    return {
        "failurePolicy": "Fail",
        **({"paramKind": {"apiVersion": "v1", "kind": param_kind}} if param_kind else {}),
        "matchConstraints": {"resourceRules": copy.deepcopy(_RULES)},
        "matchConditions": [{"name": "may-be-denied", "expression": may_be_denied}],
        "variables": [
            {"name": "podClass", "expression": cel.pod_class(policy)},
            {"name": "unreservedClass", "expression": unreserved_class},
        ],
        "validations": validations,
    }


def policy_spec(policy: Policy, *, borrowing: bool = False) -> dict[str, Any]:
    """The label policy's spec (no parameter); ``borrowing`` (lending on): the one bound to the namespaces
    labelled to borrow, where a pod at the borrowers' priority is a borrower by that alone."""
    spec = policy.spec
    unreserved = _unreserved(policy)
    advice = _advice(policy)
    validations = _validations(policy, _label_checks(policy))
    # Only the pods a validation may deny: the checks without the class. The label checks leave a
    # terminating pod's update out (it is never scheduled again; finalizers).
    by_label = [
        cel.node_selector_reserved(policy, "object"),
        cel.affinity_only_reserved(policy, "object"),
        *([cel.tolerates_any_reserved(policy)] if spec.reserved_nodes.taint is not None else []),
        cel.opted_out_with_node_name("object"),
        "has(request.subResource) && request.subResource == 'ephemeralcontainers'",
    ]
    lending = spec.lending
    if switchable(policy):
        # Lending on (or switchable: core/lending.switchable): the taint of reserved nodes that take no new
        # borrowers is inference's only.
        reserved_classes = [name for name, cls in spec.classes.items() if cls.placement == "reserved"]
        taint = lending.no_borrowers_taint
        validations.append(
            {
                "expression": f"!({cel.NOT_TERMINATING} &&\n{cel.tolerates_no_borrowers(policy, added=True)}) ||\n"
                f"variables.podClass in {str_list(reserved_classes)}",
                "message": f"rocm-isolation: [{engine.DENY_TOLERATION}] only {' or '.join(reserved_classes)} pods may "
                f"tolerate the taint of reserved nodes that take no borrowers ({taint.key}={taint.value}:{taint.effect}); "
                f"{advice}remove that toleration",
                "reason": "Forbidden",
            }
        )
        by_label.append(cel.tolerates_no_borrowers(policy, added=False))
    may_be_denied = f"{cel.NOT_TERMINATING} && (\n" + " ||\n".join(f"({test})" for test in by_label) + ")"
    # One condition, the cheapest test first: a pod that selects and tolerates no reserved node (a
    # training pod the webhook or the MAP placed, most pods without GPU) stops before the GPU-route scan.
    if not spec.scope.all_pods:
        may_be_denied = f"({may_be_denied}) &&\n({cel.gpu_pod(policy)})"
    unreserved_class = f"variables.podClass in {str_list(unreserved)}"
    at_priority = _at_priority(policy)
    if borrowing:
        # The namespace may borrow (the binding selects it by the label): a borrower by its priority.
        unreserved_class += f" &&\n!{at_priority}"
        # No validation can deny a borrower that does not tolerate the no-borrowers taint: left out here,
        # before the pod is converted for the validations, and first: a borrower tolerates the reserved
        # taint and is a GPU pod, so the rest of the condition would hold for it (its priority and
        # tolerations are read, not its containers).
        may_be_denied = (
            f"!({at_priority} &&\n!({cel.tolerates_no_borrowers(policy, added=False)})) &&\n({may_be_denied})"
        )
    elif switchable(policy) and lending.namespaces.names:
        # The other namespaces: those the policy names may borrow (a borrower by its priority there).
        unreserved_class += f" &&\n!({at_priority} && {cel.namespace_named_to_borrow(policy)})"
    return _spec(policy, may_be_denied, unreserved_class, validations)


def names_policy_spec(policy: Policy) -> dict[str, Any]:
    """The names policy's spec (parameter: the reserved node names ConfigMap): ``spec.nodeName`` or
    ``matchFields`` of a reserved node on CREATE, a GPU debug container on a pod bound to one. Lending on,
    a pod at the borrowers' priority in a namespace that may borrow is a borrower (it may be on reserved
    nodes): told by ``namespaceObject`` in the class variable, not by the bindings, since its condition
    (a node named) already leaves out almost every pod."""
    spec = policy.spec
    by_name = [current for _, current, _, _, _ in _name_checks(policy)]
    may_be_denied = " ||\n".join(f"({test})" for test in by_name)
    if not spec.scope.all_pods:
        may_be_denied = f"({may_be_denied}) &&\n({cel.gpu_pod(policy)})"
    unreserved_class = f"variables.podClass in {str_list(_unreserved(policy))}"
    if switchable(policy):
        unreserved_class += f" &&\n!({_at_priority(policy)} && {cel.namespace_may_borrow(policy)})"
    return _spec(
        policy, may_be_denied, unreserved_class, _validations(policy, _name_checks(policy)), param_kind="ConfigMap"
    )


def policies(policy: Policy) -> list[tuple[str, dict[str, Any], dict[str, str] | None]]:
    """(name, spec, parameter or None) of the label policy (lending on: and of the borrowing namespaces'
    one) and of the names policy; ``render`` binds each per mode (``binding_namespaces``: which
    namespaces)."""
    out: list[tuple[str, dict[str, Any], dict[str, str] | None]] = [(POLICY_NAME, policy_spec(policy), None)]
    if switchable(policy):
        out.append((LENDING_POLICY_NAME, policy_spec(policy, borrowing=True), None))
    out.append((NAMES_POLICY_NAME, names_policy_spec(policy), PARAM_REF))
    return out


def reserved_class_namespaces(policy: Policy) -> list[dict[str, Any]]:
    """The requirement that leaves out the namespaces labelled with a class placed on reserved nodes (e.g.
    ``rocm-isolation.io/class=inference``), or none when a namespace rule could class such a namespace's
    pods otherwise.

    No validation of either backstop can fail for a pod of a reserved class: the reach checks require an
    unreserved class, the no-borrowers toleration check exempts the reserved classes. Such a namespace's
    pods are of a reserved class unless a namespace rule of the policy matches the namespace first
    (``cel.pod_class``: rules, then the class label) and allows an unreserved class; with no such rule,
    binding the backstop there only costs every pod of it an activation (a GPU pod of it tolerates the
    reserved taint and is judged in full, four activations, to be admitted). The selector is read in Go,
    from the same namespace lister as ``namespaceObject``, and the label is the one the namespace class
    policy guards; a namespace without it stays bound."""
    spec = policy.spec
    reserved = [name for name, cls in spec.classes.items() if cls.placement == "reserved"]
    if not reserved or any(not set(rule.allowed_classes) <= set(reserved) for rule in spec.namespaces):
        return []
    return [{"key": spec.labels.namespace_class, "operator": "NotIn", "values": reserved}]


def binding_namespaces(policy: Policy) -> dict[str, list[dict[str, Any]]]:
    """Lending on: the namespace selector requirements of each policy's bindings: the namespaces of a
    reserved class left out (``reserved_class_namespaces``), then the namespaces labelled to borrow, and the
    others; none with lending off (its manifests are what they were before lending)."""
    lending = policy.spec.lending
    if not switchable(policy):
        return {}
    key = lending.namespaces.label_key
    reserved = reserved_class_namespaces(policy)
    return {
        POLICY_NAME: [*reserved, {"key": key, "operator": "NotIn", "values": [LENDING_ALLOWED]}],
        LENDING_POLICY_NAME: [*reserved, {"key": key, "operator": "In", "values": [LENDING_ALLOWED]}],
        NAMES_POLICY_NAME: list(reserved),
    }
