"""Lending (``spec.lending``): the two PriorityClasses ``manifests`` renders when lending is on.

The webhook and the placement MutatingAdmissionPolicy write a class's name, value and preemption policy
into a pod together (the Priority admission plugin checks the pod again after the mutating webhooks and
policies, and forbids a name whose value or policy the pod does not carry: lending-facts.md §5), so the
values come from the policy, never from the cluster: the webhook needs no RBAC on PriorityClasses. A
PriorityClass's ``value`` cannot be changed in Kubernetes (the apiserver refuses the update): changing it
in the policy means deleting the class and applying the manifests again (docs/operations.md "Lending").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.core.lending import switchable
from webhook.core.policy import Policy, PriorityClassSettings

API_VERSION = "scheduling.k8s.io/v1"

_DESCRIPTIONS = {
    "borrower": "rocm-isolation-webhook: training pods borrowing idle reserved GPUs; below every inference pod, "
    "preempted first when inference takes its capacity back; never preempts anybody",
    "inference": "rocm-isolation-webhook: inference pods whose own priority is not above the borrowers' "
    "(set by the webhook when lending is on)",
}


def _priority_class(
    settings: PriorityClassSettings, role: str, metadata: Callable[[str], dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "PriorityClass",
        "metadata": metadata(settings.name),
        "value": settings.value,
        "globalDefault": False,
        "preemptionPolicy": settings.preemption_policy,
        "description": _DESCRIPTIONS[role],
    }


def resources(policy: Policy, *, metadata: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The borrowers' and the inference PriorityClass; none without lending. Kept with a lending section
    turned off (``core/lending.switchable``): a pod the placement policy still made a borrower during the
    switch names the class (the Priority plugin denies a pod naming a class that is gone), and so may a pod
    admitted before it. Delete them with the section once no pod names them."""
    lending = policy.spec.lending
    if not switchable(policy):
        return []
    return [
        _priority_class(lending.borrower_priority_class, "borrower", metadata),
        _priority_class(lending.inference_priority_class, "inference", metadata),
    ]
