"""Lending idle reserved capacity: the one notion of a borrower.

A *borrower* is a training pod (a class with ``placement: unreserved``) that an operator lets run on idle
reserved capacity at the borrowers' PriorityClass, below every inference pod, so that inference takes the
capacity back by the scheduler's own preemption (docs/policy.md "Lending", docs/operations.md "Lending").

``is_borrower`` is the definition every part uses on a stored pod (the engine on UPDATE, and later the
audit, the capacity model and the reclaim controller): lending on, the pod's ``spec.priorityClassName`` is
the borrowers' class and its ``spec.priority``, when set, is at most the class's value. Who *becomes* one on
CREATE is ``borrow_choice``: the namespace may borrow (the guarded namespace label, or a name the policy
lists) and the pod opts in (its borrow label) or does not opt out where the namespace default is to borrow.
A pod label never grants what the namespace did not allow.

Pure, like the rest of ``webhook.core``: everything it needs is passed in.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from webhook.core.policy import LENDING_ALLOWED, Policy, PriorityClassSettings
from webhook.core.rules import PLACED_LABEL

# What the engine writes on a borrower: the record that it borrows (its pod label, "true").
BORROWING = "true"


@dataclass(frozen=True)
class LendingSettings:
    """The policy's ``spec.lending``, compiled once per policy."""

    enabled: bool
    borrower: PriorityClassSettings
    inference: PriorityClassSettings
    namespace_label: str
    namespace_names: re.Pattern[str] | None
    pod_label: str
    default_borrow: bool
    lend_from: str
    # The toleration of the no-borrowers taint (inference pods get it; nobody else may carry it).
    no_borrowers_toleration: dict[str, Any]
    switchable: bool  # lending on, or a lending section turned off (``switchable``)


@lru_cache(maxsize=64)
def settings(policy: Policy) -> LendingSettings:
    lending = policy.spec.lending
    taint = lending.no_borrowers_taint
    names = lending.namespaces.names
    return LendingSettings(
        enabled=lending.enabled,
        borrower=lending.borrower_priority_class,
        inference=lending.inference_priority_class,
        namespace_label=lending.namespaces.label_key,
        namespace_names=re.compile("|".join(fnmatch.translate(name) for name in names)) if names else None,
        pod_label=lending.pod_label,
        default_borrow=lending.default_borrow,
        lend_from=lending.lend_from,
        no_borrowers_toleration={"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect},
        switchable=lending.enabled or "lending" in policy.spec.model_fields_set,
    )


def priority_fields(priority_class: PriorityClassSettings) -> dict[str, Any]:
    """The three pod fields that must all carry the class's values (the Priority admission plugin checks
    the pod again after the mutating webhooks and policies: lending-facts.md §5)."""
    return {
        "priorityClassName": priority_class.name,
        "priority": priority_class.value,
        "preemptionPolicy": priority_class.preemption_policy,
    }


def is_borrower(pod: Mapping[str, Any], policy: Policy) -> bool:
    """Whether a pod is a borrower: lending on, ``spec.priorityClassName`` is the borrowers' PriorityClass and
    ``spec.priority`` (when set: the Priority admission plugin fills it) is at most that class's value.

    Never raises: a pod that is not a mapping, or whose fields have the wrong types, is no borrower."""
    lending = settings(policy)
    if not lending.enabled or not isinstance(pod, Mapping):
        return False
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or spec.get("priorityClassName") != lending.borrower.name:
        return False
    priority = spec.get("priority")
    if priority is None:
        return True
    return isinstance(priority, int) and not isinstance(priority, bool) and priority <= lending.borrower.value


def switchable(policy: Policy) -> bool:
    """Lending on, or a ``lending`` section turned off (``enabled: false``; issue 42). What the apiserver
    holds for lending and does not depend on the switch is rendered for both (``deploy/``): the backstop
    split by the lending label, the PriorityClasses, the guarded label, the keeper's closing RBAC. A switch
    then changes, in the apiserver, the placement MutatingAdmissionPolicy alone: one object, no moment where
    one admission plugin has the new state and another the old (each refreshes its policies on its own).
    Without a section lending was never on: nothing is rendered and nothing decided for a switch."""
    return settings(policy).switchable


def namespace_may_borrow(policy: Policy, namespace: str, labels: Mapping[str, str] | None) -> bool:
    """The namespace is labelled ``<lending.namespaces.labelKey>=allowed`` or named in
    ``lending.namespaces.names``. Unknown labels (no cluster connection): by name only."""
    lending = settings(policy)
    return lending.enabled and _may_borrow(lending, namespace, labels)


def _may_borrow(lending: LendingSettings, namespace: str, labels: Mapping[str, str] | None) -> bool:
    if labels is not None and labels.get(lending.namespace_label) == LENDING_ALLOWED:
        return True
    return lending.namespace_names is not None and lending.namespace_names.match(namespace) is not None


# --- switching lending on or off (issue 42) ---------------------------------------------------------------
#
# The policy file reaches the webhook (hot reload) and the in-apiserver objects (``manifests``, applied) in
# two writes, in either order, seconds to minutes apart. Between them a pod is placed by the apiserver's
# placement policy (the MAP, which runs before the webhook) with one lending setting and judged by the
# webhook with the other. Neither state may deny a pod the other admits, and neither may let a pod borrow
# reserved capacity that the state after the switch would not: so the webhook follows the safe side,
# placing such a pod as a training pod on shared capacity, and denies nothing for what the MAP wrote.


def placed_as_borrower_before(
    policy: Policy, namespace: str, namespace_labels: Mapping[str, str] | None, spec: Mapping[str, Any]
) -> bool:
    """Lending off in this policy but its section kept (``switchable``: without one lending was never on, and
    every decision is what it was before lending existed), and a pod of a namespace that the policy's lending settings let borrow
    already carries the borrowers' PriorityClass on CREATE: the apiserver's placement policy, still rendered
    with lending on, made it a borrower (it also added the reserved toleration). The webhook then denies no
    toleration of the reserved taint (the state with lending on admits it) and places the pod as training:
    its ``NotIn`` requirement keeps it off the reserved nodes, so it borrows nothing."""
    lending = settings(policy)
    if lending.enabled or not lending.switchable or spec.get("priorityClassName") != lending.borrower.name:
        return False
    return _may_borrow(lending, namespace, namespace_labels)


def placed_without_lending(policy: Policy, labels: Mapping[str, str], spec: Mapping[str, Any]) -> bool:
    """Lending on in this policy, and on CREATE the apiserver's placement policy has placed the pod (its
    marker label) without making it a borrower (no borrowers' PriorityClass): that policy is still rendered
    with lending off, and so is the backstop, which would deny the reserved toleration a borrower gets. The
    webhook then does not make the pod a borrower (it runs on shared capacity, as with lending off). The one
    use of the marker by the webhook, and only ever toward borrowing less."""
    return PLACED_LABEL in labels and spec.get("priorityClassName") != settings(policy).borrower.name


def borrow_choice(
    policy: Policy, namespace: str, namespace_labels: Mapping[str, str] | None, pod_labels: Mapping[str, str]
) -> tuple[bool, str]:
    """Whether a pod of an unreserved class, created in ``namespace``, becomes a borrower; and, when it asks
    to borrow and may not, why (a warning kubectl shows), else ''."""
    lending = settings(policy)
    if not lending.enabled:
        return False, ""
    asked = pod_labels.get(lending.pod_label)
    may = namespace_may_borrow(policy, namespace, namespace_labels)
    if asked is not None and asked not in ("true", "false"):
        return False, (
            f'metadata.labels[{lending.pod_label}]={asked!r} is neither "true" nor "false": the pod does not borrow '
            "reserved capacity"
        )
    if asked == "true" and not may:
        unknown = " (its labels are unknown: no cluster connection)" if namespace_labels is None else ""
        return False, (
            f"the pod asks to borrow reserved capacity ({lending.pod_label}=true) but namespace {namespace}{unknown} may "
            f"not borrow: it runs on shared capacity only; an administrator can label the namespace "
            f"{lending.namespace_label}={LENDING_ALLOWED}"
        )
    if not may or asked == "false":
        return False, ""
    return (asked == "true" or lending.default_borrow), ""


# --- devices: a borrower's claims ------------------------------------------------------------------------

POD_KIND = "Pod"


def claim_owner(claim: Any) -> tuple[str, str] | None:
    """The pod a ResourceClaim was made for, as (name, uid): the resourceclaim controller makes a pod's
    claims from its templates with one controller ``ownerReference`` to the pod (the only link: nothing
    else of the pod is copied into the claim; device-reservation-facts.md §3). None for any other claim."""
    if not isinstance(claim, Mapping):
        return None
    metadata = claim.get("metadata")
    references = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    if not isinstance(references, list):
        return None
    for reference in references:
        if (
            isinstance(reference, Mapping)
            and reference.get("controller") is True
            and reference.get("kind") == POD_KIND
            and reference.get("apiVersion") == "v1"
        ):
            name, uid = reference.get("name"), reference.get("uid")
            if isinstance(name, str) and name and isinstance(uid, str) and uid:
                return name, uid
    return None


def owner_to_read(
    policy: Policy, namespace: str, namespace_labels: Mapping[str, str] | None, claim: Any, lendable: bool
) -> tuple[str, str] | None:
    """The pod to read before deciding on a claim (its name and uid), or None when nothing it could say
    changes the decision: lending off, the lendable class absent (``lendable``), the namespace may not
    borrow, or the claim was not made for a pod. Keeps the read (the webhook's one API call while admitting)
    to the claims that may borrow."""
    if not lendable or not namespace_may_borrow(policy, namespace, namespace_labels):
        return None
    return claim_owner(claim)


def borrows_devices(claim: Any, owner: Any, policy: Policy) -> bool:
    """Whether a claim is a borrower's: it was made for ``owner`` (the pod as stored, read by uid: a pod
    of the same name made since is not it) and that pod is a borrower (``is_borrower``: its priority, which
    never changes after CREATE)."""
    ref = claim_owner(claim)
    if ref is None or not isinstance(owner, Mapping):
        return False
    metadata = owner.get("metadata")
    return isinstance(metadata, Mapping) and metadata.get("uid") == ref[1] and is_borrower(owner, policy)
