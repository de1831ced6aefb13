"""The backstop of device-level reservation: ValidatingAdmissionPolicies that keep every class but the
inference one (``placement: reserved``) off the reserved devices, in the apiserver, webhook or not.

The shared DeviceClass excludes the reserved devices (``device_classes.py``); what is left is a claim or a
pod naming *another* GPU class, which may select reserved devices: AMD's own ``gpu.amd.com``, the
reserved class, any class the policy lists as a GPU class. So, while a reservation is active:

- a ResourceClaim or ResourceClaimTemplate of a namespace that allows no inference class may name no GPU
  DeviceClass but the shared side's (the shared class, and the extended resource name's own class of that
  side, ``reservedDevices.sharedExtendedClassName``), in any request (``exactly``) or ``firstAvailable`` subrequest; this also
  covers ``adminAccess`` requests and claims whose own selectors name a reserved device (the class
  selectors apply first);
- nor may any of its requests or subrequests carry a toleration that could tolerate the reserved-device
  taint (``rocm-isolation.io/reserved-device``: its key, or an empty key with ``Exists``; whatever the
  effect), which DeviceTaintRules put on the reserved devices when they hold the reservation (the shared
  class then selects every device: the taint is all that keeps the reserved ones from other classes, and
  taints are not access control); the webhook denies the same (``deny-reserved-device-toleration``);
- a pod of such a class may request no ``deviceclass.resource.kubernetes.io/<GPU class>`` but the shared
  side's classes', and no other GPU class's ``extendedResourceName`` (the policy's ``extendedResourceNames``)
  than ``reservedDevices.extendedResourceName``.

Each policy takes the reserved DeviceClass as its parameter (``paramRef`` by name,
``parameterNotFoundAction: Allow``): active only while that class says so (``STATE_LABEL: active``), so
installing the manifests changes nothing until ``pool apply --devices-per-node``, and a release turns it
off with no manifest change. A claim made by the scheduler for an extended resource is judged like any
other: its class is the one the pod's resource maps to, which the pod policy already allowed or denied
(a user can set the annotation that marks such claims on a claim of their own, so it is not trusted).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.core.claims import RESERVED_DEVICE_TAINT_KEY
from webhook.core.pods import DEVICE_CLASS_RESOURCE_PREFIX
from webhook.core.policy import Policy, glob_regex, gpu_device_class_names
from webhook.deploy import cel, mutating_policy
from webhook.deploy.cel import quote, str_list
from webhook.deploy.device_classes import ACTIVE, STATE_LABEL

CLAIMS_POLICY = "rocm-isolation-reserved-device-claims"
TEMPLATES_POLICY = "rocm-isolation-reserved-device-claim-templates"
PODS_POLICY = "rocm-isolation-reserved-device-pods"
POLICY_NAMES = (CLAIMS_POLICY, TEMPLATES_POLICY, PODS_POLICY)
# Lending on: a borrower's claim (it names the lendable class) is reserved for no pod but its owner.
LENT_CLAIMS_POLICY = "rocm-isolation-lent-claim-consumers"

_ACTIVE = (
    f"has(params.metadata.labels) && {quote(STATE_LABEL)} in params.metadata.labels && "
    f"params.metadata.labels[{quote(STATE_LABEL)}] == {quote(ACTIVE)}"
)


def _reserved_classes(policy: Policy) -> list[str]:
    return [name for name, cls in policy.spec.classes.items() if cls.placement == "reserved"]


def _shared_classes(policy: Policy) -> list[str]:
    """The classes of the shared side: the shared class, and the extended resource name's own class."""
    devices = policy.spec.reserved_devices
    return [devices.shared_class_name, devices.shared_extended_class_name]


def _forbidden_class(policy: Policy, name: str) -> str:
    """CEL: the DeviceClass ``name`` is a GPU class other than the shared side's."""
    shared = _shared_classes(policy)
    names = [n for n in gpu_device_class_names(policy.spec) if n not in shared]
    exact = [n for n in names if not any(ch in n for ch in "*?[")]
    parts = [f"{name} in {str_list(exact)}"] if exact else []
    parts += [f"{name}.matches({quote(glob_regex(n))})" for n in names if n not in exact]
    return f"(!({name} in {str_list(shared)}) && ({' || '.join(parts) or 'false'}))"


def _forbidden_resource(policy: Policy, key: str) -> str:
    """CEL: the resource name ``key`` maps to a GPU DeviceClass other than the shared side's."""
    devices = policy.spec.reserved_devices
    names = [n for n in gpu_device_class_names(policy.spec) if n not in _shared_classes(policy)]
    exact = [DEVICE_CLASS_RESOURCE_PREFIX + n for n in names if not any(ch in n for ch in "*?[")]
    exact += [n for n in policy.spec.scope.extended_resource_names if n != devices.extended_resource_name]
    parts = [f"{key} in {str_list(exact)}"] if exact else []
    prefix = DEVICE_CLASS_RESOURCE_PREFIX.replace(".", r"\.")
    parts += [
        f"{key}.matches({quote('^' + prefix + glob_regex(n)[1:])})" for n in names if any(ch in n for ch in "*?[")
    ]
    return "(" + (" || ".join(parts) or "false") + ")"


def _advice(policy: Policy, what: str) -> str:
    spec = policy.spec
    inference = _reserved_classes(policy)
    where = f" or move it to a namespace labelled {spec.labels.namespace_class}={inference[0]}" if inference else ""
    return f"; {what}{where} (device-level reservation: rocm-isolation-webhook pool status)"


def _tolerates_reserved_device(t: str) -> str:
    """CEL: the DeviceToleration ``t`` could tolerate the reserved-device taint (its key, or an empty key
    with ``Exists``; whatever its effect and value), as ``webhook.core.device_claims.may_tolerate_reserved``."""
    return (
        f"((has({t}.key) && {t}.key == {quote(RESERVED_DEVICE_TAINT_KEY)}) || "
        f"((!has({t}.key) || {t}.key == '') && has({t}.operator) && {t}.operator == 'Exists'))"
    )


def _claim_policy_spec(policy: Policy, resource: str, root: str) -> dict[str, Any]:
    """The policy for ``resource`` (resourceclaims, resourceclaimtemplates) whose ResourceClaimSpec is at ``root``.

    Each validation tests its own check first, then whether a reservation is active and the namespace may
    use the reserved class; each messageExpression is '' unless its validation fails (kube-apiserver
    evaluates every messageExpression, passing or not: docs/architecture.md)."""
    shared = policy.spec.reserved_devices.shared_class_name
    requests = f"{root}.devices.requests"
    borrowing = resource == "resourceclaims" and policy.spec.lending.enabled
    # A borrower's claim may name the lendable class in a firstAvailable entry (``_borrowing_claim``).
    lent = (
        f"!(variables.borrowing && s.deviceClassName == {quote(policy.spec.reserved_devices.lendable_class_name)}) && "
        if borrowing
        else ""
    )
    bad_request = (
        f"(has(r.exactly) && has(r.exactly.deviceClassName) && {_forbidden_class(policy, 'r.exactly.deviceClassName')})"
        " ||\n"
        f"(has(r.firstAvailable) && r.firstAvailable.exists(s, has(s.deviceClassName) && {lent}"
        f"{_forbidden_class(policy, 's.deviceClassName')}))"
    )
    tolerating_request = (
        f"(has(r.exactly) && has(r.exactly.tolerations) && r.exactly.tolerations.exists(t, "
        f"{_tolerates_reserved_device('t')})) ||\n"
        f"(has(r.firstAvailable) && r.firstAvailable.exists(s, has(s.tolerations) && s.tolerations.exists(t, "
        f"{_tolerates_reserved_device('t')})))"
    )
    variables = [
        *mutating_policy.class_variables(policy)[:3],
        {
            "name": "mayUseReserved",
            "expression": f"variables.namespaceAllowedClasses.exists(c, c in {str_list(_reserved_classes(policy))})",
        },
        *([{"name": "borrowing", "expression": _borrowing_claim(policy)}] if borrowing else []),
        {
            "name": "requests",
            "expression": f"has({root}.devices) && has({requests}) ? {requests} : []",
        },
        {"name": "forbidden", "expression": f"variables.requests.filter(r, {bad_request})"},
        {"name": "tolerating", "expression": f"variables.requests.filter(r, {tolerating_request})"},
    ]
    field = f"{root.removeprefix('object.')}.devices.requests"
    guarded = f"({_ACTIVE}) && !variables.mayUseReserved"
    class_message = (
        quote(f"rocm-isolation: {field}: request '")
        + " + variables.forbidden[0].name + "
        + quote(
            "' names a DeviceClass that can hand out the GPUs reserved for inference, and this namespace "
            "allows no inference class"
            + _advice(policy, f"use deviceClassName {shared} (in every firstAvailable entry too)")
        )
    )
    toleration_message = (
        quote(f"rocm-isolation: {field}: request '")
        + " + variables.tolerating[0].name + "
        + quote(
            f"' has a toleration (exactly.tolerations or a firstAvailable entry's) that tolerates the taint "
            f"{RESERVED_DEVICE_TAINT_KEY} of the GPUs reserved for inference (that key, or an empty key with "
            "operator Exists), and this namespace allows no inference class"
            + _advice(policy, "remove that toleration (or give it another key)")
        )
    )
    return {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"},
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [resource],
                }
            ]
        },
        # UPDATE is judged too: the scheduler's adding its finalizer to a claim it allocates is one, so a
        # claim created while no reservation was active gets nothing once one is. A claim being deleted is
        # not: the resourceclaim controller's removal of its delete-protection finalizer must pass, or a
        # claim allocated before the reservation could never go (seen on v1.36.2).
        "matchConditions": [
            {
                "name": "not-being-deleted",
                "expression": "request.operation != 'UPDATE' || !has(object.metadata.deletionTimestamp)",
            }
        ],
        "variables": variables,
        "validations": [
            {
                "expression": f"size(variables.forbidden) == 0 || !({_ACTIVE}) || variables.mayUseReserved",
                "message": f"rocm-isolation: {field} names a DeviceClass that hands out the GPUs reserved for "
                f"inference; use deviceClassName {shared}",
                "messageExpression": f"size(variables.forbidden) > 0 && {guarded} ?\n{class_message} : ''",
                "reason": "Forbidden",
            },
            {
                "expression": f"size(variables.tolerating) == 0 || !({_ACTIVE}) || variables.mayUseReserved",
                "message": f"rocm-isolation: {field} has a toleration of the taint {RESERVED_DEVICE_TAINT_KEY} "
                "of the GPUs reserved for inference; remove it",
                "messageExpression": f"size(variables.tolerating) > 0 && {guarded} ?\n{toleration_message} : ''",
                "reason": "Forbidden",
            },
        ],
    }


# Who makes a pod's claims from its templates: the resourceclaim controller, with its own ServiceAccount
# (kube-controller-manager --use-service-account-credentials, kubeadm's default) or kube-controller-manager's
# credential (device-reservation-facts.md §3).
CLAIM_CONTROLLER_USERS = (
    "system:serviceaccount:kube-system:resource-claim-controller",
    "system:kube-controller-manager",
)


def _borrowing_claim(policy: Policy) -> str:
    """CEL: the claim may name the lendable class (in a ``firstAvailable`` entry; the webhook puts it after
    the shared one for a borrower's claim): a namespace that may borrow, and a claim the resourceclaim
    controller makes for a pod (its templates cannot name the class; only the webhook adds it, knowing the
    pod is a borrower), or an UPDATE (a claim's spec never changes after CREATE). With the webhook down
    nobody can make such a claim: pod authors cannot act as the controller."""
    maker = f"request.userInfo.username in {str_list(list(CLAIM_CONTROLLER_USERS))}"
    return f"{cel.namespace_may_borrow(policy)} && (request.operation == 'UPDATE' || {maker})"


def _containers_resource(policy: Policy, test: Callable[[str], str]) -> str:
    checks = []
    for field in ("containers", "initContainers"):
        c = f"object.spec.{field}"
        checks.append(
            f"(has({c}) && {c}.exists(c, has(c.resources) && (\n"
            f"  (has(c.resources.requests) && c.resources.requests.exists(r, {test('r')})) ||\n"
            f"  (has(c.resources.limits) && c.resources.limits.exists(r, {test('r')})))))"
        )
    return " ||\n".join(checks)


def _pods_policy_spec(policy: Policy) -> dict[str, Any]:
    devices = policy.spec.reserved_devices
    shared = devices.shared_class_name
    spec = policy.spec
    unreserved = [name for name, cls in spec.classes.items() if cls.placement != "reserved"]
    allowed = DEVICE_CLASS_RESOURCE_PREFIX + shared
    if devices.extended_resource_name:
        allowed += f" or {devices.extended_resource_name}"
    return {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"},
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}
            ]
        },
        # Cheapest test first: only pods asking for a DRA extended resource are judged at all.
        "matchConditions": [
            {
                "name": "dra-extended-resources",
                "expression": _containers_resource(policy, lambda r: _forbidden_resource(policy, r)),
            }
        ],
        "variables": [
            *mutating_policy.class_variables(policy),
            {"name": "notInference", "expression": f"variables.podClass in {str_list(unreserved)}"},
        ],
        "validations": [
            {
                "expression": f"!({_ACTIVE}) || !variables.notInference",
                "message": "rocm-isolation: a container requests a DRA extended resource whose DeviceClass can hand "
                f"out the GPUs reserved for inference; request {allowed} instead",
                "messageExpression": quote("rocm-isolation: a GPU pod of class ")
                + " + variables.podClass + "
                + quote(
                    " requests (spec.containers[*].resources or spec.initContainers[*].resources) a DRA extended "
                    "resource whose DeviceClass can hand out the GPUs reserved for inference"
                    + _advice(policy, f"request {allowed} instead")
                ),
                "reason": "Forbidden",
            }
        ],
    }


def policy_specs(policy: Policy) -> dict[str, dict[str, Any]]:
    return {
        CLAIMS_POLICY: _claim_policy_spec(policy, "resourceclaims", "object.spec"),
        TEMPLATES_POLICY: _claim_policy_spec(policy, "resourceclaimtemplates", "object.spec.spec"),
        PODS_POLICY: _pods_policy_spec(policy),
    }


def _names_lendable(policy: Policy) -> str:
    """CEL: the claim names the lendable class in a ``firstAvailable`` entry (a borrower's: only the webhook
    writes it, only into a claim the resourceclaim controller makes for a borrower; the claims policy
    denies it to anyone else)."""
    lendable = quote(policy.spec.reserved_devices.lendable_class_name)
    return (
        "has(object.spec.devices) && has(object.spec.devices.requests) && object.spec.devices.requests.exists(r, "
        f"has(r.firstAvailable) && r.firstAvailable.exists(s, has(s.deviceClassName) && s.deviceClassName == {lendable}))"
    )


def lent_claims_policy_spec(policy: Policy) -> dict[str, Any]:
    """A borrower's claim serves its own pod only (issue 42). A ResourceClaim is shared by every pod that
    names it (``resourceClaimName``), so another pod naming the claim the controller made for a borrower
    would use the reserved GPU lent to it without being a borrower. A pod's VAP cannot read the claim it
    names; the claim's status can tell: the scheduler reserves a claim for each pod it binds with it
    (``status.reservedFor``, an UPDATE of ``resourceclaims/status``), and a claim made from a template is
    owned by its pod (the controller's ownerReference, ``controller: true``). So a reservation of a
    borrower's claim for any pod but its owner is denied: the scheduler cannot bind that pod (it stays
    pending, the scheduler's event names this policy), webhook up or down. Only entries the update adds are
    judged (entries already there, and their removal by the resourceclaim controller, pass)."""
    lendable = policy.spec.reserved_devices.lendable_class_name
    reserved_for = "(has(object.status) && has(object.status.reservedFor) ? object.status.reservedFor : [])"
    before = "(has(oldObject.status) && has(oldObject.status.reservedFor) ? oldObject.status.reservedFor : [])"
    owners = (
        "has(object.metadata.ownerReferences) ? object.metadata.ownerReferences.filter(o, o.kind == 'Pod' && "
        "has(o.controller) && o.controller).map(o, o.uid) : []"
    )
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["resourceclaims/status"],
                }
            ]
        },
        "matchConditions": [{"name": "a-borrowers-claim", "expression": _names_lendable(policy)}],
        "variables": [
            {"name": "owners", "expression": owners},
            {
                "name": "added",
                "expression": f"{reserved_for}.filter(c, !{before}.exists(o, o.uid == c.uid))",
            },
            {"name": "others", "expression": "variables.added.filter(c, !(c.uid in variables.owners))"},
        ],
        "validations": [
            {
                "expression": "size(variables.others) == 0",
                "message": f"rocm-isolation: this ResourceClaim was made for a borrower (it names the DeviceClass "
                f"{lendable}) and serves that pod only; give the other pod a claim of its own "
                "(resourceClaimTemplateName)",
                # The apiserver evaluates every messageExpression, passing or not: '' unless it fails.
                "messageExpression": "size(variables.others) == 0 ? '' :\n"
                + quote("rocm-isolation: ResourceClaim ")
                + " + object.metadata.name + "
                + quote(" was made for a borrower (it names the DeviceClass ")
                + f" + {quote(lendable)} + "
                + quote(": it may hold a reserved GPU lent to that pod only) and cannot be reserved for pod ")
                + " + variables.others[0].name + "
                + quote("; give that pod a claim of its own (resourceClaimTemplateName)"),
                "reason": "Forbidden",
            }
        ],
    }


def policies(policy: Policy) -> list[tuple[str, dict[str, Any], dict[str, str] | None]]:
    """(name, spec, parameter) of each policy, all reading the reserved DeviceClass but the lent claims' one
    (lending on: no parameter, a borrower's claim exists only where lending was on); ``render`` binds them
    per mode."""
    param_ref = {"name": policy.spec.reserved_devices.reserved_class_name, "parameterNotFoundAction": "Allow"}
    out: list[tuple[str, dict[str, Any], dict[str, str] | None]] = [
        (name, spec, param_ref) for name, spec in policy_specs(policy).items()
    ]
    if policy.spec.lending.enabled:
        out.append((LENT_CLAIMS_POLICY, lent_claims_policy_spec(policy), None))
    return out
