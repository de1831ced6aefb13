"""Lending (``spec.lending``): what the webhook may write to keep it, rendered whenever the policy has a
``lending`` section (the part that closes and opens also with lending off: see ``resources``).

The replica holding the audit Lease closes reserved nodes to new borrowers with the no-borrowers taint
(``service/lending_loop.py``): that needs ``patch`` on nodes, a wide verb (a node's labels decide what runs
where). So it comes with a ValidatingAdmissionPolicy that holds the webhook's ServiceAccount to what the
keeper does: on a node UPDATE by that ServiceAccount, everything but the taints of the no-borrowers key must
stay as it was (labels, annotations, ``unschedulable``, every other taint). Whoever takes the webhook's
token can then add or remove that one taint (closing or opening reserved nodes to borrowers), nothing more.

Devices of split nodes (``service/device_lending.py``): the keeper writes one DeviceClass, the lendable one
(``create``, and ``patch`` by name: RBAC cannot restrict ``create`` by name, so a second policy denies the
ServiceAccount's DeviceClass writes of any other name), and evicts borrowers holding reserved devices
(``pods/eviction``: the Eviction API, PodDisruptionBudgets honoured; RBAC cannot tell a borrower from any
other pod, so this is the verb ``kubectl drain`` needs, no more).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.core.lending import switchable
from webhook.core.policy import Policy
from webhook.deploy.cel import quote

CLUSTER_ROLE = "rocm-isolation-webhook-lending"
NODE_WRITES_POLICY = "rocm-isolation-lending-node-writes"
CLASS_WRITES_POLICY = "rocm-isolation-lending-class-writes"


def service_account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def node_writes_policy(policy: Policy, user: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy spec: the webhook's node UPDATEs change the no-borrowers taints only."""
    key = quote(policy.spec.lending.no_borrowers_taint.key)
    others = "{0}.spec.?taints.orValue([]).filter(t, t.key != " + key + ")"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
            ]
        },
        "matchConditions": [{"name": "the-webhook", "expression": f"request.userInfo.username == {quote(user)}"}],
        "validations": [
            {
                "expression": " && ".join(
                    [
                        "object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({})",
                        "object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({})",
                        "object.spec.?unschedulable.orValue(false) == oldObject.spec.?unschedulable.orValue(false)",
                        others.format("object") + " == " + others.format("oldObject"),
                    ]
                ),
                "message": "rocm-isolation-webhook may change only the taint "
                f"{policy.spec.lending.no_borrowers_taint.key} of a node (lending)",
                "reason": "Forbidden",
            }
        ],
    }


def class_writes_policy(policy: Policy, user: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy spec: the webhook's DeviceClass writes are of the lendable class only."""
    name = policy.spec.reserved_devices.lendable_class_name
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["deviceclasses"],
                }
            ]
        },
        "matchConditions": [{"name": "the-webhook", "expression": f"request.userInfo.username == {quote(user)}"}],
        "validations": [
            {
                "expression": f"request.name == {quote(name)}",
                "message": f"rocm-isolation-webhook may write only the DeviceClass {name} (lending)",
                "reason": "Forbidden",
            }
        ],
    }


def resources(
    policy: Policy, namespace: str, account: str, *, metadata: Callable[[str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The ClusterRole and binding that let the webhook patch nodes, and the policies holding it to the
    no-borrowers taint and the lendable DeviceClass.

    Lending on: all of it (evictions and creating the lendable class included). Lending off with a
    ``lending`` section (turned off, issue 42): only what closes and opens, ``patch`` on nodes and on the
    lendable class, with both policies. After the switch the Lease holder still writes: it keeps the
    no-borrowers taint on the reserved nodes while a borrower admitted before the switch is pending, then
    takes it off, and closes the lendable class (``service/lending_loop.py``); a role dropped with the
    switch (``kubectl apply --prune``, GitOps) would leave the nodes as they were, open to those borrowers,
    or closed to every pod not tolerating the taint. The node policy holds the verb to that one taint
    either way. No ``lending`` section (the default policy, lending never used): nothing."""
    enabled = policy.spec.lending.enabled
    if not switchable(policy):
        return []
    user = service_account(namespace, account)
    lendable = policy.spec.reserved_devices.lendable_class_name
    rules: list[dict[str, Any]] = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    if enabled:
        rules += [
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create"]},
        ]
    rules.append(
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["deviceclasses"],
            "resourceNames": [lendable],
            "verbs": ["patch"],
        }
    )
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": metadata(CLUSTER_ROLE),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": metadata(CLUSTER_ROLE),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": metadata(NODE_WRITES_POLICY),
            "spec": node_writes_policy(policy, user),
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": metadata(NODE_WRITES_POLICY),
            "spec": {"policyName": NODE_WRITES_POLICY, "validationActions": ["Deny"]},
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": metadata(CLASS_WRITES_POLICY),
            "spec": class_writes_policy(policy, user),
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": metadata(CLASS_WRITES_POLICY),
            "spec": {"policyName": CLASS_WRITES_POLICY, "validationActions": ["Deny"]},
        },
    ]
