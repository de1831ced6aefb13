"""``decide_claim``: ResourceClaims and ResourceClaimTemplates under device-level reservation.

While a reservation is active (the reserved DeviceClass says so: ``DeviceFacts.devices_reserved``), a
claim's GPU requests are steered at CREATE, the only time they can be (a claim's and a template's
spec are immutable afterwards), so that pod authors change nothing:

- in a namespace whose class is the inference one (``placement: reserved``), a request naming any
  other GPU DeviceClass (AMD's ``gpu.amd.com``, ...) is pointed at the reserved class; with
  ``reservedDevices.inferenceSpillover`` an ``exactly`` request becomes ``firstAvailable: [reserved,
  shared]`` instead (reserved devices first, shared ones when they are taken);
- in any other namespace, such a request is pointed at the shared class, and a request naming the
  reserved class itself is denied (unless the namespace also allows the inference class).

Tolerations of the reserved-device taint (``RESERVED_DEVICE_TAINT_KEY``, ``NoSchedule``: with
``device-reservation-mode: taints`` DeviceTaintRules taint the reserved devices of the chosen nodes, and
the allocator gives a tainted device only to a request that tolerates the taint):

- in a namespace that may use the reserved class, every request (``exactly``) and every ``firstAvailable``
  subrequest whose class is, after the steering, the reserved one gets ``{key: rocm-isolation.io/
  reserved-device, operator: Exists, effect: NoSchedule}`` unless one of its tolerations already tolerates
  that taint whatever its value (empty or that key, ``Exists``, empty or ``NoSchedule`` effect). Added in
  either mode: harmless while the classes alone hold the reservation, and a template made then still
  works after a switch to taints. A spill-over gets it on its reserved subrequest only;
- in any other namespace, a toleration of any request or subrequest that could tolerate the taint (its
  key, or an empty key with ``Exists``; whatever the effect) is denied: taints are not access control,
  and the shared class selects the reserved devices too in that mode.

Requests of classes that hand out no GPU are left alone. Claims the scheduler makes for a DRA extended
resource (``resource.kubernetes.io/extended-resource-claim``) are created after their allocation:
changing or denying them would only leave their pod Pending, so they are never touched (the backstop
ValidatingAdmissionPolicies judge them like any claim, since anyone can set that annotation). Only
``resource.k8s.io/v1`` is read: the webhook is registered for v1 with ``matchPolicy: Equivalent``, so
the apiserver converts other versions before calling it.
"""

from __future__ import annotations

from typing import Any

from webhook.core import patch
from webhook.core.claims import (
    CLAIM_KIND,
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    RESERVED_DEVICE_TAINT_EFFECT,
    RESERVED_DEVICE_TAINT_KEY,
    TEMPLATE_KIND,
)
from webhook.core.decision import Decision, DeviceFacts, NamespaceFacts, Violation
from webhook.core.engine import (
    CLASS_ANNOTATION,
    RULE_COMPLIANT,
    RULE_EXCLUDED,
    RULE_MUTATED,
    RULE_OPERATION,
    namespace_mode,
)
from webhook.core.lending import borrows_devices, namespace_may_borrow
from webhook.core.policy import Mode, Policy

RULE_NOT_RESERVED = "no-device-reservation"
RULE_SCHEDULER_CLAIM = "extended-resource-claim"
RULE_NO_GPU_REQUEST = "no-gpu-request"
RULE_MALFORMED_CLAIM = "malformed-claim"
DENY_RESERVED_CLASS = "deny-reserved-device-class"
DENY_RESERVED_TOLERATION = "deny-reserved-device-toleration"
# What a request for the reserved class gets (value-independent: Exists).
RESERVED_TOLERATION: dict[str, str] = {
    "key": RESERVED_DEVICE_TAINT_KEY,
    "operator": "Exists",
    "effect": RESERVED_DEVICE_TAINT_EFFECT,
}


def may_tolerate_reserved(toleration: dict[str, Any]) -> bool:
    """Could this DeviceToleration tolerate the reserved-device taint: its key, or an empty key with
    ``Exists`` (every taint)? Whatever the effect and value (what is denied outside inference)."""
    key = toleration.get("key") or ""
    return key == RESERVED_DEVICE_TAINT_KEY or (not key and toleration.get("operator") == "Exists")


def tolerates_reserved(toleration: dict[str, Any]) -> bool:
    """Does this DeviceToleration tolerate the reserved-device taint whatever its value (``Exists``, an
    empty or ``NoSchedule`` effect)? Then a request for the reserved class needs no other."""
    return (
        toleration.get("operator") == "Exists"
        and (toleration.get("key") or "") in ("", RESERVED_DEVICE_TAINT_KEY)
        and (toleration.get("effect") or "") in ("", RESERVED_DEVICE_TAINT_EFFECT)
    )


class _Malformed(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _dict(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Malformed(field, "must be an object")
    return value


def _items(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Malformed(field, "must be a list")
    return value


def _allow(rule: str, message: str, mode: Mode) -> Decision:
    return Decision(allowed=True, rule=rule, message=message, mode=mode)


def decide_claim(
    *,
    operation: str,
    claim: Any,
    kind: str,
    namespace: NamespaceFacts,
    policy: Policy,
    devices: DeviceFacts,
    owner: Any = None,
) -> Decision:
    """Decide what to do with one ResourceClaim (``kind`` ResourceClaim) or ResourceClaimTemplate. Pure;
    never raises. ``owner``: the pod the claim was made for, as stored (``core/lending.owner_to_read`` says
    when the caller reads it), else None."""
    spec = policy.spec
    mode, mode_warnings = namespace_mode(spec, namespace)
    if operation != "CREATE":
        # The spec is immutable: nothing an UPDATE can change is ours to check.
        return _allow(RULE_OPERATION, f"{operation} of a {kind} is not checked", mode)
    if namespace.name in spec.excluded_namespaces:
        return _allow(RULE_EXCLUDED, f"namespace {namespace.name} is excluded by the policy", mode)
    if not devices.devices_reserved:
        return _allow(RULE_NOT_RESERVED, "no device-level reservation is active", mode)
    try:
        return _decide(claim, kind, namespace, policy, devices, mode, mode_warnings, owner)
    except _Malformed as err:
        return Decision(
            allowed=False,
            rule=RULE_MALFORMED_CLAIM,
            message=f"the {kind} cannot be checked: {err}",
            mode=mode,
            code=400,
            violations=(Violation(RULE_MALFORMED_CLAIM, err.field, str(err)),),
        )


def _decide(
    claim: Any,
    kind: str,
    namespace: NamespaceFacts,
    policy: Policy,
    devices: DeviceFacts,
    mode: Mode,
    warnings: list[str],
    owner: Any,
) -> Decision:
    spec = policy.spec
    reserved_devices = spec.reserved_devices
    claim = _dict(claim, "object")
    metadata = _dict(claim.get("metadata"), "metadata")
    annotations = _dict(metadata.get("annotations"), "metadata.annotations")
    if annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true" and kind == CLAIM_KIND:
        return _allow(RULE_SCHEDULER_CLAIM, "made by the scheduler for an extended resource: never changed", mode)
    classes = policy.namespace_classes(namespace.name, namespace.labels)
    class_name = classes.default
    inference = spec.classes[class_name].placement == "reserved"
    may_use_reserved = any(spec.classes[name].placement == "reserved" for name in classes.allowed)
    root: tuple[str, ...] = ("spec", "spec") if kind == TEMPLATE_KIND else ("spec",)
    claim_spec = _dict(_dict(claim.get("spec"), "spec").get("spec"), "spec.spec") if kind == TEMPLATE_KIND else None
    claim_spec = claim_spec if claim_spec is not None else _dict(claim.get("spec"), "spec")
    where = ".".join(root)
    requests = _items(_dict(claim_spec.get("devices"), f"{where}.devices").get("requests"), f"{where}.devices.requests")

    target = reserved_devices.reserved_class_name if inference else reserved_devices.shared_class_name
    lendable = reserved_devices.lendable_class_name
    # A borrower's claim (made for a borrower pod, lending on, the lendable class there): shared devices
    # first, then the reserved ones the lending keeper lends now (firstAvailable: [shared, lendable]).
    borrowing = (
        kind == CLAIM_KIND
        and not inference
        and lendable in devices.gpu_classes
        and namespace_may_borrow(policy, namespace.name, namespace.labels)
        and borrows_devices(claim, owner, policy)
    )
    ops: list[dict[str, Any]] = []
    changed: list[str] = []
    violations: list[Violation] = []

    def is_gpu(name: str) -> bool:
        return bool(policy.gpu_device_classes(name)) or name in devices.gpu_classes

    # Our classes: never steered. The reserved side's (the reserved class, and the extended resource
    # name's own class of that side) are denied outside inference and get the toleration inside.
    reserved_side = (reserved_devices.reserved_class_name, reserved_devices.reserved_extended_class_name)
    products = (*reserved_side, reserved_devices.shared_class_name, reserved_devices.shared_extended_class_name)

    def steer(name: Any, field: str, pointer: str) -> str:
        """Steer one deviceClassName; the class the request names afterwards ('' when none)."""
        if not isinstance(name, str):
            return ""
        if not name or not is_gpu(name):
            return name
        if borrowing and name == lendable:
            return name
        if name in products:
            if name in reserved_side and not may_use_reserved:
                violations.append(
                    Violation(
                        DENY_RESERVED_CLASS,
                        field,
                        f"{field}: DeviceClass {name} hands out the GPUs reserved for inference, and namespace "
                        f"{namespace.name} (class {class_name}) allows no inference class; use "
                        f"{reserved_devices.shared_class_name}{_inference_hint(policy)}",
                    )
                )
            return name
        ops.append(patch.replace(pointer, target))
        changed.append(f"{field}: {name} -> {target}")
        return target

    def keep_selectors(body: dict[str, Any], source: Any, field: str, pointer: str) -> None:
        """A request steered away from ``source`` keeps that class's CEL selectors as its own (the
        allocator ANDs a request's selectors with its class's): steering ``gpu.amd.com-spx`` (whole GPUs
        only) to a product class never widens what the request may get."""
        listed = _items(body.get("selectors"), f"{field}.selectors")
        kept = _kept_selectors(body, source, devices, field)
        if len(kept) > len(listed):
            ops.extend(patch.append_to_list(body.get("selectors"), f"{pointer}/selectors", kept[len(listed) :]))
            changed.append(f"{field}.selectors: + the selectors of DeviceClass {source}")

    def tolerations(body: dict[str, Any], field: str, pointer: str, device_class: str) -> None:
        """Deny a toleration of the reserved-device taint outside inference; add it to a request for the
        reserved class that lacks it."""
        listed = _tolerations(body, field)
        if not may_use_reserved:
            for k, toleration in enumerate(listed):
                if may_tolerate_reserved(toleration):
                    tolerations_field = f"{field}.tolerations[{k}]"
                    violations.append(
                        _toleration_violation(tolerations_field, toleration, namespace, class_name, policy)
                    )
            return
        if device_class in reserved_side and not any(map(tolerates_reserved, listed)):
            toleration = dict(RESERVED_TOLERATION)
            ops.extend(patch.append_to_list(body.get("tolerations"), f"{pointer}/tolerations", [toleration]))
            changed.append(f"{field}.tolerations: + {RESERVED_DEVICE_TAINT_KEY} ({RESERVED_DEVICE_TAINT_EFFECT})")

    for i, request in enumerate(requests):
        field = f"{where}.devices.requests[{i}]"
        request = _dict(request, field)
        pointer = patch.pointer(*root, "devices", "requests", i)
        exactly = request.get("exactly")
        if exactly is not None:
            exactly = _dict(exactly, f"{field}.exactly")
            name = exactly.get("deviceClassName")
            spill = (
                inference
                and reserved_devices.inference_spillover
                and isinstance(name, str)
                and is_gpu(name)
                and name not in products
                and not exactly.get("adminAccess")
            )
            borrow = (
                borrowing
                and isinstance(name, str)
                and is_gpu(name)
                and name not in (*reserved_side, lendable)
                and not exactly.get("adminAccess")
            )
            if borrow:
                # The selectors of the class it named go with it, but never a product class's own (a template
                # steered at its CREATE names the shared class): they leave out the devices that may be lent.
                source = None if name in products else name
                kept = _kept_selectors(exactly, source, devices, f"{field}.exactly")
                exactly = {**exactly, "selectors": kept} if kept else exactly
                ops.extend(_first_available(request, exactly, pointer, [
                    ("shared", reserved_devices.shared_class_name, False), ("lendable", lendable, False)
                ]))  # fmt: skip
                changed.append(f"{field}.exactly: {name} -> firstAvailable [shared, lendable] (a borrower's claim)")
            elif spill:
                kept = _kept_selectors(exactly, name, devices, f"{field}.exactly")
                exactly = {**exactly, "selectors": kept} if kept else exactly
                tolerate = may_use_reserved and not any(
                    map(tolerates_reserved, _tolerations(exactly, f"{field}.exactly"))
                )
                ops.extend(_first_available(request, exactly, pointer, [
                    ("reserved", reserved_devices.reserved_class_name, tolerate),
                    ("shared", reserved_devices.shared_class_name, False),
                ]))  # fmt: skip
                changed.append(f"{field}.exactly: {name} -> firstAvailable [reserved, shared]")
            else:
                steered = steer(name, f"{field}.exactly.deviceClassName", f"{pointer}/exactly/deviceClassName")
                if steered != name:
                    keep_selectors(exactly, name, f"{field}.exactly", f"{pointer}/exactly")
                tolerations(exactly, f"{field}.exactly", f"{pointer}/exactly", steered)
        for j, sub in enumerate(_items(request.get("firstAvailable"), f"{field}.firstAvailable")):
            sub_field = f"{field}.firstAvailable[{j}]"
            sub = _dict(sub, sub_field)
            sub_pointer = f"{pointer}/firstAvailable/{j}"
            steered = steer(
                sub.get("deviceClassName"), f"{sub_field}.deviceClassName", f"{sub_pointer}/deviceClassName"
            )
            if steered != sub.get("deviceClassName"):
                keep_selectors(sub, sub.get("deviceClassName"), sub_field, sub_pointer)
            tolerations(sub, sub_field, sub_pointer, steered)

    if not ops and not violations:
        return _allow(RULE_NO_GPU_REQUEST, f"class {class_name}: no GPU request to steer", mode)
    if ops and annotations.get(CLASS_ANNOTATION) != class_name:
        ops.extend(patch.set_map_entries(claim, ("metadata", "annotations"), {CLASS_ANNOTATION: class_name}))
    return _finish(ops, changed, violations, warnings, mode, class_name)


def _kept_selectors(body: dict[str, Any], source: Any, devices: DeviceFacts, field: str) -> list[Any]:
    """The request's selectors followed by those of DeviceClass ``source`` it lacks (as CEL text)."""
    listed = _items(body.get("selectors"), f"{field}.selectors")
    present = {
        _dict(_dict(item, f"{field}.selectors[{k}]").get("cel"), f"{field}.selectors[{k}].cel").get("expression")
        for k, item in enumerate(listed)
    }
    own = devices.class_selectors.get(source, ()) if isinstance(source, str) else ()
    return [*listed, *({"cel": {"expression": e}} for e in own if e not in present)]


def _first_available(
    request: dict[str, Any], exactly: dict[str, Any], pointer: str, choices: list[tuple[str, str, bool]]
) -> list[dict[str, Any]]:
    """The request with ``exactly`` as ``firstAvailable``, one subrequest per (name, class, tolerate) in
    order: an inference spill-over ``[reserved, shared]``, a borrower's ``[shared, lendable]``. A subrequest
    has every field of an exact request but ``adminAccess`` (a request asking for it is never rewritten,
    and an ``adminAccess: false`` is left out); ``tolerate``: that subrequest also gets the toleration of the
    reserved-device taint."""
    fields = {key: value for key, value in exactly.items() if key not in ("deviceClassName", "adminAccess")}
    body = {key: value for key, value in request.items() if key != "exactly"}
    subrequests = []
    for name, device_class, tolerate in choices:
        sub = {"name": name, **fields, "deviceClassName": device_class}
        if tolerate:
            sub["tolerations"] = [*(exactly.get("tolerations") or []), dict(RESERVED_TOLERATION)]
        subrequests.append(sub)
    body["firstAvailable"] = subrequests
    return [patch.replace(pointer, body)]


def _tolerations(body: dict[str, Any], field: str) -> list[dict[str, Any]]:
    return [
        _dict(item, f"{field}.tolerations[{k}]")
        for k, item in enumerate(_items(body.get("tolerations"), f"{field}.tolerations"))
    ]


def _toleration_violation(
    field: str, toleration: dict[str, Any], namespace: NamespaceFacts, class_name: str, policy: Policy
) -> Violation:
    what = (
        "tolerates every taint (empty key, operator Exists)"
        if not toleration.get("key")
        else f"tolerates the taint {RESERVED_DEVICE_TAINT_KEY}"
    )
    return Violation(
        DENY_RESERVED_TOLERATION,
        field,
        f"{field}: {what}, which DeviceTaintRules put on the GPUs reserved for inference, and namespace "
        f"{namespace.name} (class {class_name}) allows no inference class; remove the toleration (or give it "
        f"another key){_inference_hint(policy)}",
    )


def _inference_hint(policy: Policy) -> str:
    spec = policy.spec
    reserved = [name for name, cls in spec.classes.items() if cls.placement == "reserved"]
    return f", or a namespace labelled {spec.labels.namespace_class}={reserved[0]}" if reserved else ""


def _finish(
    ops: list[dict[str, Any]],
    changed: list[str],
    violations: list[Violation],
    warnings: list[str],
    mode: Mode,
    class_name: str,
) -> Decision:
    audit = {"class": class_name, "mode": mode}
    denial = "; ".join(v.message for v in violations)
    if mode == "audit":
        audit["would-patch-operations"] = str(len(ops))
        if violations:
            audit["would-deny"] = denial[:1000]
        return Decision(
            allowed=True,
            rule=violations[0].rule if violations else RULE_MUTATED,
            message="audit mode: nothing changed" + (f"; would deny: {denial}" if violations else ""),
            mode=mode,
            workload_class=class_name,
            audit_annotations=audit,
            violations=tuple(violations),
        )
    if violations and mode == "enforce":
        audit["decision"] = "denied"
        return Decision(
            allowed=False,
            rule=violations[0].rule,
            message=denial,
            mode=mode,
            workload_class=class_name,
            audit_annotations=audit,
            violations=tuple(violations),
            code=403,
        )
    notes = [f"rocm-isolation: device-level reservation: {change}" for change in changed]
    if violations:
        notes = [f"would be denied in enforce mode: {v.message}" for v in violations] + notes
    audit["decision"] = "patched" if ops else "allowed"
    return Decision(
        allowed=True,
        rule=violations[0].rule if violations else (RULE_MUTATED if ops else RULE_COMPLIANT),
        message=f"class {class_name}: " + ("; ".join(changed) or "compliant"),
        mode=mode,
        workload_class=class_name,
        patch=tuple(ops),
        warnings=tuple(notes + warnings),
        audit_annotations=audit,
        violations=tuple(violations),
    )
