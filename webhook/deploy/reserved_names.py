"""Reserved node names in the apiserver's backstop.

The ValidatingAdmissionPolicy ``rocm-isolation-reserved-nodes`` sees no Node objects, so a training pod
that names a reserved node (``spec.nodeName``: the scheduler and with it the NoSchedule taint are
skipped, and the kubelet does not check NoSchedule; or ``matchFields metadata.name``) passed it while
the webhook was down. This module closes that gap with a second policy, ``rocm-isolation-reserved-node-names``,
whose parameters are a ConfigMap in the webhook's namespace listing the reserved nodes (one data key
per node). The replica of ``serve`` holding the audit Lease keeps it equal to the nodes carrying the
reserved label in its watch cache, within seconds, whatever tool labelled them (``webhook.service.names_sync``);
``pool apply`` and ``pool release`` rewrite it too, with the same content, after they changed the nodes
(``webhook.ops.reserved_names_sync``); ``audit`` reports when the two disagree (no replica running, or
a node labelled while none was: ``disagreement``).

The ConfigMap is shipped with the manifests without ``data`` (so that re-applying them never manages
or empties it, and ``serve`` needs no ``create``). Should it be missing, the bindings'
``parameterNotFoundAction: Allow`` makes it deny nothing new (the label-based backstop and the webhook
still apply; ``Deny`` would stop every GPU pod of the cluster), and ``audit`` reports it when reserved
nodes exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.core.policy import Policy
from webhook.deploy import cel
from webhook.deploy.cel import quote

POLICY_NAME = "rocm-isolation-reserved-node-names"
PARAMS_CONFIGMAP = "rocm-isolation-reserved-node-names"
NAMESPACE = "rocm-isolation-system"
MODE_ACTIONS: dict[str, list[str]] = {"enforce": ["Deny"], "warn": ["Warn", "Audit"], "audit": ["Audit"]}
PARAMETER_NOT_FOUND_ACTION = "Allow"

_LIVE = cel.LIVE_TERM


# ``name`` is a reserved node: a key of the params ConfigMap (a ConfigMap without data lists none).
def _reserved_name(name: str) -> str:
    return f"(has(params.data) && {name} in params.data)"


def policy_spec(policy: Policy) -> dict[str, Any]:
    """Deny a GPU pod of a class that may not use reserved nodes when it names one: ``spec.nodeName``, or
    required node affinity whose every term selects reserved nodes, by their label or by
    ``matchFields metadata.name`` of reserved nodes only (at least one term by name: the label-only
    case is ``rocm-isolation-reserved-nodes``'), as ``engine._check_create`` does with node facts.

    What kube-apiserver 1.36 evaluates per pod (docs/architecture.md): both match conditions in one
    activation, then, for a pod they hold for, every validation, every messageExpression (passing or
    not) and the audit annotations, each in an activation of its own. So the second condition,
    ``may-be-denied``, is exactly "a validation could deny this" without the class: the pod names a
    reserved node (``spec.nodeName`` on CREATE, or required affinity every term of which selects
    reserved nodes, one at least by name) or a debug container reaching GPUs is added to a pod bound
    to one. A pod that names no reserved node (every pod the scheduler places: the webhook's and the
    MAP's training pods; a DaemonSet's pod on a shared node) costs it one activation. Each validation tests its
    own check first, then the class (one variable, ``cel.pod_class``, the MAP's); each message is ''
    unless its validation fails."""
    spec = policy.spec
    unreserved = [name for name, cls in spec.classes.items() if cls.placement == "unreserved"]
    key, value = spec.reserved_nodes.label
    terms = f"object.spec.affinity.nodeAffinity.{cel.REQUIRED}.nodeSelectorTerms"
    by_label = (
        f"(has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == {quote(key)} && e.operator == 'In' "
        f"&& has(e.values) && size(e.values) > 0 && e.values.all(v, v == {quote(value)})))"
    )
    by_name = (
        "(has(t.matchFields) && t.matchFields.exists(f, f.key == 'metadata.name' && f.operator == 'In' && "
        f"has(f.values) && size(f.values) > 0 && f.values.all(v, {_reserved_name('v')})))"
    )
    on_reserved_node = f"has(object.spec.nodeName) && {_reserved_name('object.spec.nodeName')}"
    variables = [
        {"name": "podClass", "expression": cel.pod_class(policy)},
        {"name": "unreservedClass", "expression": f"variables.podClass in {cel.str_list(unreserved)}"},
    ]
    reserved_class = next((name for name, cls in spec.classes.items() if cls.placement == "reserved"), None)
    advice = (
        f"move the pod to a namespace labelled {spec.labels.namespace_class}={reserved_class}, or "
        if reserved_class
        else ""
    )
    # (expression of the check, message text as CEL, message text, how to fix)
    checks = [
        (
            f"request.operation == 'CREATE' && {on_reserved_node}",
            "' + object.spec.nodeName + ', a reserved node, is its spec.nodeName",
            "spec.nodeName names a reserved node",
            "remove spec.nodeName",
        ),
        (
            f"request.operation == 'CREATE' && has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
            f"has(object.spec.affinity.nodeAffinity.{cel.REQUIRED}) && has({terms}) &&\n"
            f"{terms}.exists(t, {_LIVE} && {by_name}) &&\n"
            f"{terms}.all(t, !{_LIVE} || {by_label} || {by_name})",
            "every term of spec.affinity.nodeAffinity." + cel.REQUIRED + " selects reserved nodes (matchFields "
            "metadata.name)",
            "every term of its required node affinity selects reserved nodes by name",
            "remove that requirement",
        ),
        # kubectl debug on a pod bound to a reserved node by spec.nodeName alone (no toleration needed:
        # the scheduler, and with it the NoSchedule taint, was skipped): only its node's name tells.
        (
            f"({cel.ephemeral_gpu_access(policy)}) &&\n{on_reserved_node}",
            "an added ephemeral container reaches the GPUs (privileged, or a variable of the AMD container runtime) "
            "of the reserved node ' + object.spec.nodeName + '",
            "an added ephemeral container reaches the GPUs of the reserved node it runs on",
            "debug with an unprivileged ephemeral container, or from a copy of the pod (kubectl debug --copy-to)",
        ),
    ]
    validations = []
    for current, what_expression, what, fix in checks:
        # Inline, not variables (the validations' and the messages' activations share none); the check
        # first, the class only when it holds.
        check = f"({current})"
        message = (
            "'rocm-isolation: a GPU pod of class ' + variables.podClass + "
            f"' may not use the nodes reserved for inference: {what_expression}; {advice}{fix}'"
        )
        validations.append(
            {
                "expression": f"!{check} ||\n!variables.unreservedClass",
                # Used when messageExpression cannot be evaluated.
                "message": f"rocm-isolation: the class of this GPU pod may not use the nodes reserved for inference: "
                f"{what}",
                # Evaluated for every pod the conditions hold for, denied or not: '' unless it fails.
                "messageExpression": f"{check} &&\nvariables.unreservedClass ?\n{message} : ''",
                "reason": "Forbidden",
            }
        )
    # The GPU pods (the reserved-nodes policy's condition, the same text), and only those a validation
    # may deny (its checks, without the class): both conditions in one activation (a policy's conditions
    # are never short-circuited).
    may_be_denied = " ||\n".join(f"({current})" for current, _, _, _ in checks)
    conditions = [] if spec.scope.all_pods else [{"name": "gpu-pods", "expression": cel.gpu_pod(policy)}]
    conditions.append({"name": "may-be-denied", "expression": may_be_denied})
    return {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
        # nodeName and node affinity cannot change after creation (binding goes through pods/binding), so
        # they are checked on CREATE; pods/ephemeralcontainers (kubectl debug) adds containers to a bound pod.
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["pods/ephemeralcontainers"],
                },
            ]
        },
        "matchConditions": conditions,
        "variables": variables,
        "validations": validations,
    }


def resources(
    policy: Policy,
    *,
    excluded: dict[str, Any],
    mode_selector: Callable[[Policy, str], dict[str, Any]],
    metadata: Callable[[str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The policy and one binding per mode (the namespaces of that effective mode), each reading the
    reserved node names from the ConfigMap ``PARAMS_CONFIGMAP``."""
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": metadata(POLICY_NAME),
            "spec": policy_spec(policy),
        }
    ]
    for mode, actions in MODE_ACTIONS.items():
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": metadata(f"{POLICY_NAME}-{mode}"),
                "spec": {
                    "policyName": POLICY_NAME,
                    "validationActions": actions,
                    "paramRef": {
                        "name": PARAMS_CONFIGMAP,
                        "namespace": NAMESPACE,
                        "parameterNotFoundAction": PARAMETER_NOT_FOUND_ACTION,
                    },
                    "matchResources": {
                        "namespaceSelector": {"matchExpressions": [excluded, mode_selector(policy, mode)]}
                    },
                },
            }
        )
    return out


# --- the params object, kept by pool apply | release ----------------------------------------------

CONFIGMAP_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


def configmap(names: Iterable[str], reserved_label: str) -> dict[str, Any]:
    """The params object: one key per reserved node (node names are valid ConfigMap keys)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": PARAMS_CONFIGMAP,
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "rocm-isolation-webhook",
                "app.kubernetes.io/part-of": "rocm-isolation-webhook",
            },
            "annotations": {
                "rocm-isolation.io/written-by": "rocm-isolation-webhook pool apply|release: the nodes labelled "
                + reserved_label
            },
        },
        "data": {name: reserved_label for name in sorted(names)},
    }


def disagreement(data: Mapping[str, str] | None, labelled: Iterable[str]) -> list[str]:
    """What ``audit`` reports: the params object missing while nodes are reserved, or listing other nodes
    than those carrying the reserved label (someone labelled or unlabelled a node by hand)."""
    names = sorted(labelled)
    if data is None:
        if not names:
            return []
        return [
            f"the ConfigMap {NAMESPACE}/{PARAMS_CONFIGMAP} is missing: the backstop does not know the reserved "
            f"node names ({', '.join(names)}), so spec.nodeName or matchFields naming them is only denied by the "
            "webhook; run `rocm-isolation-webhook pool apply` (or release) to write it"
        ]
    out = []
    unknown = [name for name in names if name not in data]
    stale = sorted(name for name in data if name not in names)
    if unknown:
        out.append(
            f"nodes {', '.join(unknown)} carry the reserved label but are not in the ConfigMap "
            f"{NAMESPACE}/{PARAMS_CONFIGMAP}: the backstop lets training pods name them; run "
            "`rocm-isolation-webhook pool apply --nodes ...` instead of labelling by hand"
        )
    if stale:
        out.append(
            f"the ConfigMap {NAMESPACE}/{PARAMS_CONFIGMAP} lists {', '.join(stale)}, which no longer carry the "
            "reserved label: training pods naming them are denied; run `rocm-isolation-webhook pool release`"
        )
    return out
