"""The DeviceTaintRules of device-level reservation by taints: one per reserved device of a chosen node.

Why taints. A DeviceClass selects devices with CEL, which sees a device's driver, attributes and capacity,
never its node, pool or name: the classes alone reserve the same PCI bus IDs on every node of the driver.
A DeviceTaintRule selects one device by driver, pool and name (``spec.deviceSelector``; no CEL since 1.35),
so the reserved devices of *some* nodes, or of nodes whose GPUs sit in different PCI slots, can be told
apart. A ``NoSchedule`` taint keeps a device from every request that does not tolerate it
(``taintPreventsAllocation`` in the scheduler's allocator, adminAccess included); the scheduler's claims
for ``amd.com/gpu`` never carry tolerations, so no extended-resource pod gets one. Taints are not access
control: the webhook adds the toleration to inference requests for the reserved class, and the backstop
denies it everywhere else (``reserved_devices.py``).

Served as ``resource.k8s.io/v1`` from Kubernetes 1.37, ``v1beta2`` in 1.36 (with the
``DRADeviceTaintRules`` gate on kube-apiserver, kube-scheduler and kube-controller-manager). A rule is
mutable, and every rule is re-derived from the ResourceSlices at each ``pool apply``: AMD's device names
come from DRM minors and may change across reboots, the PCI bus ID does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.claims import MANAGED_BY, MANAGED_BY_LABEL, RESERVED_DEVICE_TAINT_EFFECT, RESERVED_DEVICE_TAINT_KEY
from webhook.core.policy import Policy

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2")  # newest first: pool writes the first one the cluster serves
KIND = "DeviceTaintRule"
RESOURCE = "devicetaintrules"
NAME_PREFIX = "rocm-isolation-reserved-"
NODE_ANNOTATION = "rocm-isolation.io/node"
PCI_BUS_ID_ANNOTATION = "rocm-isolation.io/pci-bus-id"
_MAX_NAME = 253


@dataclass(frozen=True)
class TaintedDevice:
    """A reserved device of a chosen node, as its rule selects it and records it."""

    node: str
    pool: str
    device: str
    pci_bus_id: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.pool, self.device)


def rule_name(pool: str, device: str) -> str:
    """``rocm-isolation-reserved-<pool>-<device>`` (pools and devices are DNS names already); a hash when
    that would be longer than a name may be."""
    name = f"{NAME_PREFIX}{pool}-{device}".lower()
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(f"{pool}/{device}".encode()).hexdigest()[:16]
    return f"{NAME_PREFIX}{digest}"


def taint(policy: Policy) -> dict[str, str]:
    """The taint: our key, the reserved class as its value (what the device is kept for), NoSchedule
    (never NoExecute: the device-taint eviction controller deletes pods without the Eviction API)."""
    return {
        "key": RESERVED_DEVICE_TAINT_KEY,
        "value": policy.spec.reserved_devices.reserved_class_name,
        "effect": RESERVED_DEVICE_TAINT_EFFECT,
    }


def rule(policy: Policy, device: TaintedDevice, version: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": KIND,
        "metadata": {
            "name": rule_name(device.pool, device.device),
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {NODE_ANNOTATION: device.node, PCI_BUS_ID_ANNOTATION: device.pci_bus_id},
        },
        "spec": {
            "deviceSelector": {
                "driver": policy.spec.reserved_devices.driver,
                "pool": device.pool,
                "device": device.device,
            },
            "taint": taint(policy),
        },
    }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def is_ours(obj: Mapping[str, Any]) -> bool:
    return _mapping(_mapping(obj.get("metadata")).get("labels")).get(MANAGED_BY_LABEL) == MANAGED_BY


def tainted_device(obj: Mapping[str, Any]) -> TaintedDevice | None:
    """The device one of our rules taints with our key (None for another tool's rule, or one that does
    not hold the reservation: no selector, or another taint)."""
    if not is_ours(obj):
        return None
    metadata = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    selector = _mapping(spec.get("deviceSelector"))
    pool, device = _text(selector.get("pool")), _text(selector.get("device"))
    if not pool or not device or _mapping(spec.get("taint")).get("key") != RESERVED_DEVICE_TAINT_KEY:
        return None
    annotations = _mapping(metadata.get("annotations"))
    return TaintedDevice(
        _text(annotations.get(NODE_ANNOTATION)), pool, device, _text(annotations.get(PCI_BUS_ID_ANNOTATION))
    )


def tainted_keys(rules: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """(pool, device) of every device our rules taint."""
    return frozenset(found.key for obj in rules if (found := tainted_device(obj)) is not None)


def spec_differs(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the rule must be rewritten: its selector, its taint's key, value or effect (``timeAdded`` is
    the apiserver's) or our annotations differ."""
    have, want = _mapping(current.get("spec")), _mapping(desired.get("spec"))
    taint_have = {k: v for k, v in _mapping(have.get("taint")).items() if k != "timeAdded"}
    annotations = _mapping(_mapping(current.get("metadata")).get("annotations"))
    wanted = _mapping(_mapping(desired.get("metadata")).get("annotations"))
    return (
        dict(_mapping(have.get("deviceSelector"))) != dict(_mapping(want.get("deviceSelector")))
        or taint_have != dict(_mapping(want.get("taint")))
        or any(annotations.get(k) != v for k, v in wanted.items())
    )


def replace_body(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The PUT body that makes ``current`` say what ``desired`` says (its spec, our labels; its other
    annotations kept, ``resourceVersion`` as read: 409 when it changed), or None when it already does."""
    if not spec_differs(current, desired):
        return None
    metadata = dict(_mapping(current.get("metadata")))
    metadata["annotations"] = {
        **_mapping(metadata.get("annotations")),
        **_mapping(_mapping(desired.get("metadata")).get("annotations")),
    }
    metadata.pop("managedFields", None)  # absent from an update: the apiserver keeps them
    return {**desired, "metadata": metadata}
