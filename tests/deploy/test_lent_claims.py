"""Issue 42: a borrower's claim serves its own pod only. The backstop ``rocm-isolation-lent-claim-consumers``
(lending on) denies the scheduler's reservation of a borrower's claim (it names the lendable class) for any
pod but the claim's owner; its CEL evaluated here with cel-python, the real apiserver and scheduler in
tests/e2e/test_e2e_device_lending.py."""

from __future__ import annotations

import copy
from typing import Any

from cel_harness import cel, evaluate, find, rendered, request, run_policy
from celpy import celtypes

from webhook.core.policy import default_policy
from webhook.deploy import render, reserved_devices

LENDABLE, SHARED = "rocm-isolation-lendable", "rocm-isolation-shared"
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "borrower-0", "uid": "uid-owner", "controller": True}


def claim(classes: list[str], reserved_for: list[str], owner: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "borrower-0-gpu-x7k2p", "namespace": "research"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)],
                    }
                ]
            }
        },
        "status": {
            "reservedFor": [{"resource": "pods", "name": uid.removeprefix("uid-"), "uid": uid} for uid in reserved_for]
        },
    }
    if owner:
        body["metadata"]["ownerReferences"] = [OWNER]
    return body


def verdict(new: dict[str, Any], old: dict[str, Any]) -> tuple[bool, list[str]]:
    """(matched, messages of the failed validations) of the status UPDATE ``old`` -> ``new``."""
    spec = find(rendered("engine-lending"), "ValidatingAdmissionPolicy", reserved_devices.LENT_CLAIMS_POLICY)["spec"]
    activation = {
        "object": cel(new),
        "oldObject": cel(old),
        "request": cel(request("UPDATE", "research", ["system:serviceaccounts"], "status")),
        "namespaceObject": cel({"metadata": {"name": "research", "labels": {}}}),
    }
    matched, _, messages = run_policy(spec, activation)
    return matched, messages


def test_only_the_owner_may_be_reserved_a_borrowers_claim() -> None:
    unreserved = claim([SHARED, LENDABLE], [])
    # The scheduler binding the borrower itself (allocation and reservation in one status update).
    assert verdict(claim([SHARED, LENDABLE], ["uid-owner"]), unreserved) == (True, [])
    # Another pod naming the claim by resourceClaimName: first, or after the owner.
    for reserved in (["uid-sharer"], ["uid-owner", "uid-sharer"]):
        before = claim([SHARED, LENDABLE], [u for u in reserved if u == "uid-owner"])
        matched, messages = verdict(claim([SHARED, LENDABLE], reserved), before)
        assert matched and len(messages) == 1, reserved
        assert messages[0].startswith("rocm-isolation: ResourceClaim borrower-0-gpu-x7k2p was made for a borrower")
        assert "cannot be reserved for pod sharer" in messages[0] and "resourceClaimTemplateName" in messages[0]
    # A claim without an owner naming the lendable class (the claims policy lets nobody but the controller
    # make one) is reserved for nobody.
    assert verdict(claim([SHARED, LENDABLE], ["uid-sharer"], owner=False), claim([SHARED, LENDABLE], [], owner=False))[
        1
    ]


def test_entries_already_there_and_their_removal_pass_and_other_claims_are_not_judged() -> None:
    # Ratcheting: a consumer reserved before the policy existed is not judged again; the resourceclaim
    # controller removing entries passes.
    both = claim([SHARED, LENDABLE], ["uid-owner", "uid-sharer"])
    assert verdict(copy.deepcopy(both), both) == (True, [])
    assert verdict(claim([SHARED, LENDABLE], ["uid-owner"]), both) == (True, [])
    assert verdict(claim([SHARED, LENDABLE], []), both) == (True, [])
    # A claim of the shared class only: shared by name as before (the condition leaves it out).
    assert verdict(claim([SHARED], ["uid-owner", "uid-sharer"]), claim([SHARED], ["uid-owner"])) == (False, [])


def test_the_policy_exists_with_lending_on_only_and_every_message_expression_is_guarded() -> None:
    names = {r["metadata"]["name"] for r in render.render(overlay="cert-manager")}
    assert reserved_devices.LENT_CLAIMS_POLICY not in names
    assert reserved_devices.LENT_CLAIMS_POLICY not in {
        name for name, _, _ in reserved_devices.policies(default_policy())
    }
    resources = rendered("engine-lending")
    spec = find(resources, "ValidatingAdmissionPolicy", reserved_devices.LENT_CLAIMS_POLICY)["spec"]
    assert "paramKind" not in spec and spec["failurePolicy"] == "Fail"
    bindings = [
        r
        for r in resources
        if r["kind"] == "ValidatingAdmissionPolicyBinding"
        and r["spec"]["policyName"] == reserved_devices.LENT_CLAIMS_POLICY
    ]
    assert len(bindings) == len(render.MODES) and all("paramRef" not in b["spec"] for b in bindings)
    # Evaluated for a passing validation too (the apiserver does): no error on an empty list.
    activation = {
        "object": cel(claim([SHARED, LENDABLE], ["uid-owner"])),
        "oldObject": cel(claim([SHARED, LENDABLE], [])),
        "request": cel(request("UPDATE", "research", [], "status")),
    }
    variables: dict[Any, Any] = {}
    for variable in spec["variables"]:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    assert evaluate(spec["validations"][0]["messageExpression"], activation) == ""
