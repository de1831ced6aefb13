"""The device-level reservation backstop (webhook/deploy/reserved_devices.py) agrees with the webhook.

The three ValidatingAdmissionPolicies (claims, claim templates, pods' DRA extended resources) are
evaluated with cel-python as kube-apiserver evaluates them (tests/cel_harness.py), the reserved
DeviceClass as their parameter, for a table of claims, templates (tests/fixtures/cel/devices/claims.yaml,
each request list run as both kinds) and pods (pods.yaml), in training, inference, mixed (a rule allowing
both classes), debug-only, unlabelled, warn, audit and excluded namespaces, under the shipped policy, one
with a glob of GPU DeviceClasses (cel-devices) and one with inference spill-over, with the reserved
DeviceClass active, released and absent.

The two do not do the same thing, by design: the webhook *rewrites* a training claim of ``gpu.amd.com``
to the shared class (allowed, patched), while the policy *denies* the same claim: it only ever sees it
so when the webhook was not called (``failurePolicy: Ignore``). The agreement is therefore stated as:

1. **Without the webhook**, the policy denies exactly what the webhook (in enforce mode) would have to
   change or deny: for an object outside the inference class (a claim of a namespace that allows no
   inference class; a pod whose class is not inference), the policy fails ⟺ the webhook would deny it
   or change one of its device requests (``spec.devices.requests``, a container's ``resources``); it
   never fails on an object of the inference class. The failing binding's actions follow the mode.
2. **After the webhook's patch is applied**, the same holds of the patched object; in enforce mode, that
   means the policy admits everything the webhook admitted (warn mode keeps what it warns about, audit
   changes nothing, and the policy warns or audits the same).
3. **No active reservation** (the class released, or absent: ``parameterNotFoundAction: Allow``, not
   evaluated): neither changes nor denies anything.

Tolerations of the reserved-device taint (``rocm-isolation.io/reserved-device``) follow the same
statement: outside the inference class the webhook denies a toleration that could tolerate it and the
claims' second validation fails on exactly those; in a namespace that may use the reserved class the
webhook adds it to requests for the reserved class and the policy has nothing to say. Each validation
fails for its own reason (the first: a class, the second: a toleration), and each messageExpression is
'' unless its validation fails.

The differences that remain are asserted one by one at the end (a class the policy does not name,
the scheduler's claims, UPDATEs, a pod's claims).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

import cel_harness
import jsonpatch
import pytest
import yaml
from cel_harness import (
    FIXTURES,
    PARAM_STATES,
    PORTABLE_FUNCTIONS,
    applying_binding,
    params_verdict,
    policy_expressions,
    policy_path,
    rendered,
    reserved_device_class,
)
from celpy import celtypes

from webhook.core import engine
from webhook.core.claims import CLAIM_KIND, EXTENDED_RESOURCE_CLAIM_ANNOTATION, TEMPLATE_KIND
from webhook.core.decision import ClaimFacts, Decision, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.device_claims import (
    DENY_RESERVED_CLASS,
    DENY_RESERVED_TOLERATION,
    RULE_SCHEDULER_CLAIM,
    decide_claim,
)
from webhook.core.policy import Policy, default_policy, load_policy
from webhook.deploy.render import MODE_ACTIONS
from webhook.deploy.reserved_devices import (
    CLAIMS_POLICY,
    PODS_POLICY,
    POLICY_NAMES,
    TEMPLATES_POLICY,
)

CLASS = "rocm-isolation.io/class"
MODE = "rocm-isolation.io/mode"
POD_CLASS = "rocm-isolation.io/workload-class"
RESERVED, SHARED = "rocm-isolation-reserved", "rocm-isolation-shared"
RESERVED_GPU = default_policy().spec.reserved_devices.reserved_extended_class_name
IMPLICIT = "deviceclass.resource.kubernetes.io/"
POLICIES = ("default", "cel-devices", "device-spillover")
NAMESPACES: list[dict[str, Any]] = [
    {"name": "research", "labels": {CLASS: "training"}},
    {"name": "serving", "labels": {CLASS: "inference"}},
    # cel-devices: rules allowing both classes (default training / default inference), and debug only.
    {"name": "mixed", "labels": {}},
    {"name": "mixed-serving", "labels": {}},
    {"name": "lab", "labels": {}},
    {"name": "scratch", "labels": {}},  # no class label: the policy's defaultClass
    {"name": "research-warn", "labels": {CLASS: "training", MODE: "warn"}},
    {"name": "research-audit", "labels": {CLASS: "training", MODE: "audit"}},
    {"name": "serving-audit", "labels": {CLASS: "inference", MODE: "audit"}},
    {"name": "kube-system", "labels": {}},  # excluded: neither is bound there
]
# Where the webhook changes a device request: the claim's requests, a container's resources.
REQUESTS = {CLAIM_KIND: "/spec/devices/requests", TEMPLATE_KIND: "/spec/spec/devices/requests"}
CONTAINER_RESOURCES = re.compile(r"^/spec/(initContainers|containers)/\d+/resources(/|$)")


def _cases(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((FIXTURES / "cel" / "devices" / name).read_text()) if doc]


CLAIM_CASES = _cases("claims.yaml")
POD_CASES = _cases("pods.yaml")


@cache
def policy_named(name: str) -> Policy:
    return default_policy() if name == "default" else load_policy(policy_path(name))


def _namespace(ns: Mapping[str, Any], *, enforce: bool = False) -> NamespaceFacts:
    labels = dict(ns["labels"])
    if enforce:
        labels.pop(MODE, None)
    return NamespaceFacts(ns["name"], labels)


def _may_use_reserved(policy: Policy, ns: Mapping[str, Any]) -> bool:
    allowed = policy.namespace_classes(ns["name"], ns["labels"]).allowed
    return any(policy.spec.classes[name].placement == "reserved" for name in allowed)


# --- claims -----------------------------------------------------------------------------------------


def claim_object(case: Mapping[str, Any], kind: str, namespace: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": copy.deepcopy(case["requests"])}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": case["name"], "namespace": namespace},
        "spec": {"spec": spec} if kind == TEMPLATE_KIND else spec,
    }


def webhook_claim(
    obj: Mapping[str, Any], ns: Mapping[str, Any], policy: Policy, *, active: bool, enforce: bool = False
) -> Decision:
    return decide_claim(
        operation="CREATE",
        claim=obj,
        kind=obj["kind"],
        namespace=_namespace(ns, enforce=enforce),
        policy=policy,
        devices=DeviceFacts(devices_reserved=active),
    )


def claim_must_change_or_deny(obj: Mapping[str, Any], ns: Mapping[str, Any], policy: Policy) -> bool:
    """What the webhook (enforce, reservation active) would have to do to the claim: deny it, or change a
    request."""
    return bool(claim_validations_expected(obj, ns, policy))


# The claims policies' validations, in order: a GPU class other than the shared one, a toleration of the
# reserved-device taint.
CLASS_VALIDATION, TOLERATION_VALIDATION = 0, 1


def claim_validations_expected(obj: Mapping[str, Any], ns: Mapping[str, Any], policy: Policy) -> set[int]:
    """Which validations of the claims policy must fail, from what the webhook (enforce, reservation
    active) would do to the claim: the toleration one when it would deny a toleration; the class one when
    it would deny the reserved class or change a request's class, judged on the claim without its
    tolerations (a denial carries no patch, so a toleration's denial hides the steering it would do)."""
    decision = webhook_claim(obj, ns, policy, active=True, enforce=True)
    expected = {TOLERATION_VALIDATION} if DENY_RESERVED_TOLERATION in {v.rule for v in decision.violations} else set()
    bare = _without_tolerations(obj)
    decision = webhook_claim(bare, ns, policy, active=True, enforce=True)
    # A change of a request other than the toleration's addition (which the webhook makes only where the
    # reserved class may be used) is a change of class (steered, or spilled over).
    if DENY_RESERVED_CLASS in {v.rule for v in decision.violations} or any(
        op["path"].startswith(REQUESTS[bare["kind"]]) and "/tolerations" not in op["path"] for op in decision.patch
    ):
        expected.add(CLASS_VALIDATION)
    return expected


def _without_tolerations(obj: Mapping[str, Any]) -> dict[str, Any]:
    bare = copy.deepcopy(dict(obj))
    spec = bare["spec"]["spec"] if bare["kind"] == TEMPLATE_KIND else bare["spec"]
    for request in spec["devices"]["requests"]:
        for body in [request["exactly"]] if "exactly" in request else request.get("firstAvailable", []):
            body.pop("tolerations", None)
    return bare


def claim_policy(kind: str) -> str:
    return CLAIMS_POLICY if kind == CLAIM_KIND else TEMPLATES_POLICY


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("kind", [CLAIM_KIND, TEMPLATE_KIND])
@pytest.mark.parametrize("case", CLAIM_CASES, ids=lambda case: case["name"])
def test_the_claim_backstop_denies_what_the_webhook_would_change_or_deny(
    case: dict[str, Any], kind: str, policy_name: str
) -> None:
    policy = policy_named(policy_name)
    resources = rendered(policy_name)
    name = claim_policy(kind)
    for ns in NAMESPACES:
        where = {"namespace": ns}
        obj = claim_object(case, kind, ns["name"])
        bound = applying_binding(resources, name, where) is not None
        guarded = bound and not _may_use_reserved(policy, ns)
        for state in PARAM_STATES:
            params = reserved_device_class(policy, state)
            context = f"{ns['name']}, reserved class {state}"
            decision = webhook_claim(obj, ns, policy, active=state == "active")
            actions, failed, messages = params_verdict(resources, name, where, obj, params)
            if state != "active":
                # 3. No reservation: nothing changed, nothing denied, by either.
                assert decision.allowed and decision.patch == (), context
                assert failed == [], (context, messages)
                continue
            # 1. Without the webhook.
            expected = claim_validations_expected(obj, ns, policy)
            assert set(failed) == (expected if guarded else set()), (context, decision, messages)
            if failed:
                assert actions == MODE_ACTIONS[decision.mode], context
            for index, message in zip(failed, messages, strict=True):
                if index == CLASS_VALIDATION:
                    assert f"use deviceClassName {SHARED}" in message, messages
                    assert f"request '{_first_forbidden(obj)}'" in message, messages
                else:
                    assert "tolerates the taint rocm-isolation.io/reserved-device" in message, messages
                    assert f"request '{_first_tolerating(obj)}'" in message, messages
                    assert "remove that toleration (or give it another key)" in message, messages
            if not decision.allowed:
                assert failed, f"{context}: the webhook denies, so must the backstop"
                continue
            # 2. After the webhook's patch.
            patched = jsonpatch.apply_patch(obj, list(decision.patch))
            _, after, messages = params_verdict(resources, name, where, patched, params)
            assert bool(after) == (guarded and claim_must_change_or_deny(patched, ns, policy)), (context, messages)
            if decision.mode == "enforce":
                assert after == [], f"{context}: the backstop refuses what the webhook admitted: {messages}"


def _first_tolerating(obj: Mapping[str, Any]) -> str:
    spec = obj["spec"]["spec"] if obj["kind"] == TEMPLATE_KIND else obj["spec"]
    for request in spec["devices"]["requests"]:
        bodies = [request["exactly"]] if "exactly" in request else request.get("firstAvailable", [])
        if any(
            t.get("key") == "rocm-isolation.io/reserved-device" or (not t.get("key") and t.get("operator") == "Exists")
            for body in bodies
            for t in body.get("tolerations") or []
        ):
            return str(request["name"])
    return ""


def _first_forbidden(obj: Mapping[str, Any]) -> str:
    spec = obj["spec"]["spec"] if obj["kind"] == TEMPLATE_KIND else obj["spec"]
    gpu = ("gpu.amd.com", RESERVED, RESERVED_GPU)
    for request in spec["devices"]["requests"]:
        names = [request.get("exactly", {}).get("deviceClassName")]
        names += [sub.get("deviceClassName") for sub in request.get("firstAvailable", [])]
        if any(n in gpu or (n or "").endswith(".gpu.example.com") for n in names):
            return str(request["name"])
    return ""


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("kind", [CLAIM_KIND, TEMPLATE_KIND])
def test_each_claim_message_is_empty_unless_its_validation_fails(kind: str, policy_name: str) -> None:
    """kube-apiserver evaluates every messageExpression, passing or not: each is '' exactly when its
    validation holds (never an error: a passing claim has no forbidden or tolerating request to name),
    on every table claim, namespace and state of the reserved class."""
    spec = cel_harness.find(rendered(policy_name), "ValidatingAdmissionPolicy", claim_policy(kind))["spec"]
    assert len(spec["validations"]) == 2
    policy = policy_named(policy_name)
    for case in CLAIM_CASES:
        for ns in NAMESPACES:
            obj = claim_object(case, kind, ns["name"])
            for state in ("active", "released"):
                activation: dict[str, Any] = {
                    "object": cel_harness.cel(obj),
                    "oldObject": cel_harness.cel(None),
                    "request": cel_harness.cel(cel_harness.request("CREATE", ns["name"], ["system:authenticated"])),
                    "namespaceObject": cel_harness.cel(cel_harness.namespace_object({"namespace": ns})),
                    "params": cel_harness.cel(reserved_device_class(policy, state)),
                }
                variables: dict[celtypes.StringType, Any] = {}
                for variable in spec["variables"]:
                    activation["variables"] = celtypes.MapType(variables)
                    variables[celtypes.StringType(variable["name"])] = cel_harness.evaluate(
                        variable["expression"], activation
                    )
                activation["variables"] = celtypes.MapType(variables)
                for validation in spec["validations"]:
                    holds = bool(cel_harness.evaluate(validation["expression"], activation))
                    message = str(cel_harness.evaluate(validation["messageExpression"], activation))
                    assert (message == "") == holds, (case["name"], ns["name"], state, message)


@pytest.mark.parametrize("case", CLAIM_CASES, ids=lambda case: case["name"])
def test_the_claim_table_states_what_the_webhook_does_in_a_training_namespace(case: dict[str, Any]) -> None:
    policy = policy_named(case.get("policy", "default"))
    for kind in (CLAIM_KIND, TEMPLATE_KIND):
        obj = claim_object(case, kind, "research")
        decision = webhook_claim(obj, NAMESPACES[0], policy, active=True)
        if case["training"] == "denied":
            assert decision.rule == case.get("rule", DENY_RESERVED_CLASS), decision
        elif case["training"] == "steered":
            assert decision.outcome == "patched", decision
            patched = jsonpatch.apply_patch(obj, list(decision.patch))
            assert claim_must_change_or_deny(patched, NAMESPACES[0], policy) is False
        else:
            assert decision.allowed and decision.patch == (), decision
    assert {c["training"] for c in CLAIM_CASES} == {"steered", "denied", "untouched"}


# --- pods -------------------------------------------------------------------------------------------


def pod_object(case: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": copy.deepcopy(case["containers"])}
    if "initContainers" in case:
        spec["initContainers"] = copy.deepcopy(case["initContainers"])
    metadata: dict[str, Any] = {"name": case["name"], "namespace": namespace}
    if "labels" in case:
        metadata["labels"] = dict(case["labels"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def webhook_pod(
    pod: Mapping[str, Any],
    ns: Mapping[str, Any],
    policy: Policy,
    *,
    active: bool,
    enforce: bool = False,
    claims: ClaimFacts | None = None,
) -> Decision:
    return engine.decide(
        operation="CREATE",
        pod=pod,
        namespace=_namespace(ns, enforce=enforce),
        nodes=NodeFacts(None),
        policy=policy,
        claims=claims if claims is not None else ClaimFacts(),
        devices=DeviceFacts(devices_reserved=active),
    )


def pod_must_change_or_deny(pod: Mapping[str, Any], ns: Mapping[str, Any], policy: Policy) -> bool:
    """What the webhook (enforce, reservation active) would have to do to the pod's device requests: deny
    it for the reserved class, or change a container's resources. A pod label naming a class the
    namespace does not allow is a denial of its own, after which the pod is judged as the namespace's
    default class (what the backstop's class variable computes too)."""
    decision = webhook_pod(pod, ns, policy, active=True, enforce=True)
    rules = {v.rule for v in decision.violations}
    if engine.DENY_RESERVED_DEVICES in rules:
        return True
    if engine.DENY_CLASS in rules:
        unlabelled = copy.deepcopy(dict(pod))
        del unlabelled["metadata"]["labels"][POD_CLASS]
        return pod_must_change_or_deny(unlabelled, ns, policy)
    assert decision.allowed, decision
    return any(CONTAINER_RESOURCES.match(op["path"]) for op in decision.patch)


def _inference(policy: Policy, decision: Decision) -> bool:
    return decision.workload_class is not None and policy.spec.classes[decision.workload_class].placement == "reserved"


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["name"])
def test_the_pod_backstop_denies_what_the_webhook_would_change_or_deny(case: dict[str, Any], policy_name: str) -> None:
    policy = policy_named(policy_name)
    resources = rendered(policy_name)
    for ns in NAMESPACES:
        where = {"namespace": ns}
        pod = pod_object(case, ns["name"])
        bound = applying_binding(resources, PODS_POLICY, where) is not None
        # The class the engine gives the pod (a label naming a class the namespace does not allow: its default).
        judged = webhook_pod(pod, ns, policy, active=True, enforce=True)
        guarded = bound and not _inference(policy, judged)
        for state in PARAM_STATES:
            params = reserved_device_class(policy, state)
            context = f"{ns['name']}, reserved class {state}"
            decision = webhook_pod(pod, ns, policy, active=state == "active")
            actions, failed, messages = params_verdict(resources, PODS_POLICY, where, pod, params)
            if state != "active":
                assert engine.DENY_RESERVED_DEVICES not in {v.rule for v in decision.violations}, context
                assert not any(CONTAINER_RESOURCES.match(op["path"]) for op in decision.patch), context
                assert failed == [], (context, messages)
                continue
            # 1. Without the webhook.
            must = pod_must_change_or_deny(pod, ns, policy)
            assert bool(failed) == (guarded and must), (context, decision, messages)
            if failed:
                assert actions == MODE_ACTIONS[decision.mode], context
                assert f"request {IMPLICIT}{SHARED} or amd.com/gpu instead" in messages[0], messages
            if not decision.allowed:
                assert failed or engine.DENY_RESERVED_DEVICES not in {v.rule for v in decision.violations}, context
                continue
            # 2. After the webhook's patch.
            patched = jsonpatch.apply_patch(pod, list(decision.patch))
            _, after, messages = params_verdict(resources, PODS_POLICY, where, patched, params)
            assert bool(after) == (guarded and pod_must_change_or_deny(patched, ns, policy)), (context, messages)
            if decision.mode == "enforce":
                assert after == [], f"{context}: the backstop refuses what the webhook admitted: {messages}"


@pytest.mark.parametrize("case", POD_CASES, ids=lambda case: case["name"])
def test_the_pod_table_states_what_the_webhook_does_in_a_training_namespace(case: dict[str, Any]) -> None:
    policy = policy_named(case.get("policy", "default"))
    pod = pod_object(case, "research")
    decision = webhook_pod(pod, NAMESPACES[0], policy, active=True)
    steered = any(CONTAINER_RESOURCES.match(op["path"]) for op in decision.patch)
    if case["training"] == "denied":
        assert engine.DENY_RESERVED_DEVICES in {v.rule for v in decision.violations}, decision
        assert not decision.allowed
    elif case["training"] == "steered":
        assert decision.allowed and steered, decision
        patched = jsonpatch.apply_patch(pod, list(decision.patch))
        assert not any(
            name.startswith(IMPLICIT) and name != IMPLICIT + SHARED
            for body in [*patched["spec"]["containers"], *patched["spec"].get("initContainers", [])]
            for name in body.get("resources", {}).get("limits", {})
        ), patched
    elif case["training"] == "class-not-allowed":
        assert {v.rule for v in decision.violations} == {engine.DENY_CLASS}, decision
    else:
        assert decision.allowed and not steered, decision
    assert {c["training"] for c in POD_CASES} == {"steered", "denied", "untouched", "class-not-allowed"}


def test_an_inference_pods_amd_gpu_is_rewritten_and_both_admit_it() -> None:
    """The one steering of an inference pod: amd.com/gpu (the shared class's extendedResourceName) becomes
    the reserved class's implicit name; the backstop has nothing to keep from inference, before or after."""
    (case,) = [c for c in POD_CASES if c["name"] == "amd-gpu"]
    policy = default_policy()
    serving = NAMESPACES[1]
    pod = pod_object(case, serving["name"])
    decision = webhook_pod(pod, serving, policy, active=True)
    patched = jsonpatch.apply_patch(pod, list(decision.patch))
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {IMPLICIT + RESERVED: "8"}
    params = reserved_device_class(policy, "active")
    for body in (pod, patched):
        assert params_verdict(rendered("default"), PODS_POLICY, {"namespace": serving}, body, params)[1] == []


def test_the_tables_exercise_every_answer_of_both() -> None:
    """In a training namespace with the reservation active, the tables hold objects the backstop denies
    and the webhook steers, that both deny, and that both admit untouched: for claims, templates and pods."""
    research = {"namespace": NAMESPACES[0]}
    for policy_name in ("default", "cel-devices"):
        policy = policy_named(policy_name)
        params = reserved_device_class(policy, "active")
        for kind in (CLAIM_KIND, TEMPLATE_KIND):
            answers = set()
            for case in CLAIM_CASES:
                obj = claim_object(case, kind, "research")
                failed = params_verdict(rendered(policy_name), claim_policy(kind), research, obj, params)[1]
                answers.add((bool(failed), webhook_claim(obj, NAMESPACES[0], policy, active=True).outcome))
            assert answers == {(True, "patched"), (True, "denied"), (False, "allowed")}, (policy_name, kind)
        answers = set()
        for case in POD_CASES:
            pod = pod_object(case, "research")
            failed = params_verdict(rendered(policy_name), PODS_POLICY, research, pod, params)[1]
            decision = webhook_pod(pod, NAMESPACES[0], policy, active=True)
            steered = any(CONTAINER_RESOURCES.match(op["path"]) for op in decision.patch)
            answers.add((bool(failed), "denied" if not decision.allowed else "steered" if steered else "untouched"))
        # (False, denied): an inference-labelled pod in a training namespace that asks for nothing reserved.
        assert answers == {(True, "steered"), (True, "denied"), (False, "untouched"), (False, "denied")}, policy_name


# --- the differences by design, one by one ----------------------------------------------------------


def _claim(requests: list[dict[str, Any]], namespace: str, **metadata: Any) -> dict[str, Any]:
    obj = claim_object({"name": "gpus", "requests": requests}, CLAIM_KIND, namespace)
    obj["metadata"].update(metadata)
    return obj


def test_the_webhook_steers_the_claim_the_backstop_would_deny() -> None:
    """The same training claim of AMD's class: the webhook points it at the shared class (allowed, patched);
    the backstop, which only sees it so when the webhook was not called, denies it; the webhook's output
    passes the backstop."""
    policy = default_policy()
    research = NAMESPACES[0]
    obj = _claim([{"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}], "research")
    params = reserved_device_class(policy, "active")

    decision = webhook_claim(obj, research, policy, active=True)
    assert decision.allowed and decision.outcome == "patched"
    patched = jsonpatch.apply_patch(obj, list(decision.patch))
    assert patched["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == SHARED

    actions, failed, messages = params_verdict(rendered("default"), CLAIMS_POLICY, {"namespace": research}, obj, params)
    assert failed == [0] and actions == ["Deny"]
    assert "request 'gpu' names a DeviceClass that can hand out the GPUs reserved for inference" in messages[0]
    assert params_verdict(rendered("default"), CLAIMS_POLICY, {"namespace": research}, patched, params)[1] == []


def test_a_gpu_class_the_policy_does_not_name_is_steered_by_the_webhook_only() -> None:
    """A DeviceClass that selects AMD's driver under a name the policy does not list: the webhook knows it
    from the cluster's DeviceClasses and steers it; CEL cannot look DeviceClasses up, so the backstop lets it
    through (audit reports it: deviceclass-not-in-policy; list it in gpuDeviceClasses)."""
    policy = default_policy()
    research = NAMESPACES[0]
    obj = _claim([{"name": "gpu", "exactly": {"deviceClassName": "big-gpus"}}], "research")
    decision = decide_claim(
        operation="CREATE",
        claim=obj,
        kind=CLAIM_KIND,
        namespace=_namespace(research),
        policy=policy,
        devices=DeviceFacts(frozenset({"big-gpus"}), devices_reserved=True),
    )
    assert decision.outcome == "patched"
    params = reserved_device_class(policy, "active")
    assert params_verdict(rendered("default"), CLAIMS_POLICY, {"namespace": research}, obj, params)[1] == []


@pytest.mark.parametrize(("device_class", "denied"), [(SHARED, False), (RESERVED, True), ("gpu.amd.com", True)])
def test_the_schedulers_claims_are_judged_by_the_backstop_and_never_by_the_webhook(
    device_class: str, denied: bool
) -> None:
    """A claim the scheduler makes for a DRA extended resource is created after its allocation: the webhook
    never touches it (it is not even sent). The backstop judges it like any claim (anyone can set the
    annotation): a training pod's amd.com/gpu makes one of the shared class, which passes; one of another
    GPU class in a training namespace is refused (the pod asking for it was already denied by the pod
    policy, so only a hand-made claim gets here)."""
    policy = default_policy()
    research = NAMESPACES[0]
    requests = [{"name": "container-0-request-0", "exactly": {"deviceClassName": device_class, "count": 1}}]
    obj = _claim(requests, "research", annotations={EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"})
    decision = webhook_claim(obj, research, policy, active=True)
    assert decision.rule == RULE_SCHEDULER_CLAIM and decision.patch == ()
    params = reserved_device_class(policy, "active")
    failed = params_verdict(rendered("default"), CLAIMS_POLICY, {"namespace": research}, obj, params)[1]
    assert bool(failed) == denied


def test_updates_are_judged_by_the_backstop_only_and_a_claim_being_deleted_by_neither() -> None:
    """A claim's spec is immutable, so the webhook checks CREATE only. The backstop also judges UPDATEs: the
    scheduler adding its finalizer to a claim of AMD's class made while no reservation was active is
    refused once one is (the claim gets no device). A claim being deleted is not judged (its finalizer's
    removal must pass)."""
    policy = default_policy()
    research = NAMESPACES[0]
    obj = _claim([{"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}], "research")
    decision = decide_claim(
        operation="UPDATE",
        claim=obj,
        kind=CLAIM_KIND,
        namespace=_namespace(research),
        policy=policy,
        devices=DeviceFacts(devices_reserved=True),
    )
    assert decision.rule == engine.RULE_OPERATION and decision.patch == ()
    params = reserved_device_class(policy, "active")
    finalized = copy.deepcopy(obj)
    finalized["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    where = {"namespace": research}
    assert params_verdict(rendered("default"), CLAIMS_POLICY, where, finalized, params, "UPDATE", obj)[1] == [0]
    # The finalizer removed from a claim being deleted.
    deleting = copy.deepcopy(obj)
    deleting["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[])
    assert params_verdict(rendered("default"), CLAIMS_POLICY, where, deleting, params, "UPDATE", finalized)[1] == []


def test_a_training_pod_using_a_claim_of_the_reserved_class_is_denied_by_the_webhook_only() -> None:
    """In a namespace that allows both classes, a claim of the reserved class is admitted by both (an
    inference pod may use it). A training pod of that namespace naming it is denied by the webhook, which
    resolves the claim; CEL cannot read the claim, so the pod policy admits the pod."""
    policy = policy_named("cel-devices")
    mixed = NAMESPACES[2]
    claim = claim_object(
        {"name": "inference-gpu", "requests": [{"name": "gpu", "exactly": {"deviceClassName": RESERVED}}]},
        TEMPLATE_KIND,
        "mixed",
    )
    params = reserved_device_class(policy, "active")
    assert webhook_claim(claim, mixed, policy, active=True).allowed
    assert params_verdict(rendered("cel-devices"), TEMPLATES_POLICY, {"namespace": mixed}, claim, params)[1] == []

    pod = pod_object({"name": "trainer", "containers": [{"name": "c", "image": "torch"}]}, "mixed")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "inference-gpu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    claims = ClaimFacts(templates={"inference-gpu": frozenset({RESERVED})})
    decision = webhook_pod(pod, mixed, policy, active=True, claims=claims)
    assert decision.rule == engine.DENY_RESERVED_DEVICES and not decision.allowed
    assert params_verdict(rendered("cel-devices"), PODS_POLICY, {"namespace": mixed}, pod, params)[1] == []


# --- portability ------------------------------------------------------------------------------------


def test_the_device_policies_are_rendered_into_the_manifests_the_portability_walk_reads() -> None:
    """tests/deploy/test_cel.py checks every ValidatingAdmissionPolicy of the rendered manifests for
    portable functions; the three device policies are among them."""
    for policy_name in ("default", "cel-rules"):
        names = {r["metadata"]["name"] for r in rendered(policy_name) if r["kind"] == "ValidatingAdmissionPolicy"}
        assert set(POLICY_NAMES) <= names, policy_name


@pytest.mark.parametrize("policy_name", POLICIES)
def test_the_device_policies_use_only_functions_kubernetes_and_cel_python_share(policy_name: str) -> None:
    expressions = policy_expressions(rendered(policy_name), "ValidatingAdmissionPolicy", POLICY_NAMES)
    assert len(expressions) >= 3 * 3
    for expression in expressions:
        without_strings = re.sub(r"'(?:[^'\\]|\\.)*'", "''", expression)
        called = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", without_strings))
        assert called <= PORTABLE_FUNCTIONS, (called - PORTABLE_FUNCTIONS, expression)
    if policy_name == "cel-devices":
        # The glob is rendered as a regular expression, for claims and for the implicit names.
        assert any(".matches(" in e and "gpu\\\\.example\\\\.com" in e for e in expressions), expressions
