"""Dynamic Resource Allocation: which device classes a ResourceClaim or ResourceClaimTemplate asks for.

A pod reaches a GPU through DRA by naming, in ``spec.resourceClaims``, a ResourceClaim
(``resourceClaimName``) or a ResourceClaimTemplate (``resourceClaimTemplateName``) of its namespace.
The claim's requests name DeviceClasses; AMD's DRA driver (ROCm/k8s-gpu-dra-driver) serves
``gpu.amd.com``. The request shapes differ by API version, and all are read:

- ``resource.k8s.io/v1`` and ``v1beta2``: ``spec.devices.requests[].exactly.deviceClassName`` and
  ``spec.devices.requests[].firstAvailable[].deviceClassName``;
- ``v1beta1``: ``spec.devices.requests[].deviceClassName`` and ``...firstAvailable[].deviceClassName``.

A ResourceClaimTemplate holds the claim's spec one level down (``spec.spec``). Pure: the cache
(``cluster/cache.py``) and the dry run (``offline/dryrun.py``) both read claims with these functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.decision import DeviceFacts

GROUP = "resource.k8s.io"
# Newest first: the cache lists the first version the cluster serves.
VERSIONS = ("v1", "v1beta2", "v1beta1")
CLAIM_KIND = "ResourceClaim"
# Device-level reservation: the reserved DeviceClass that ``pool`` writes says whether a reservation is
# active (webhook.deploy.device_classes renders it; the webhook and the backstop read the label).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "rocm-isolation-webhook"
RESERVATION_LABEL = "rocm-isolation.io/device-reservation"
RESERVATION_ACTIVE = "active"
RESERVATION_RELEASED = "released"
# How the reservation keeps other classes off the reserved devices (annotation of the reserved class):
# "classes", the shared class's CEL selector leaves the reserved PCI bus IDs out (every node of the
# driver, same slots); "taints", DeviceTaintRules taint the reserved devices of the chosen nodes by name
# and the shared class selects every device (a subset of the nodes, or slots that differ per node).
RESERVATION_MODE_ANNOTATION = "rocm-isolation.io/device-reservation-mode"
MODE_CLASSES = "classes"
MODE_TAINTS = "taints"
# The taint of a reserved device (DeviceTaintRule, mode "taints"). The webhook adds the toleration to
# every request for the reserved class; the backstop denies it to namespaces that allow no inference
# class (taints are not access control: any claim may tolerate them).
RESERVED_DEVICE_TAINT_KEY = "rocm-isolation.io/reserved-device"
RESERVED_DEVICE_TAINT_EFFECT = "NoSchedule"
# The scheduler's claims for DRA extended resources (created after allocation: never denied or changed).
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# The standard attribute of a device's PCI address (KEP-5004); ROCm enumerates GPUs in its order.
PCI_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID_ATTRIBUTE = f"{PCI_DOMAIN}/pciBusID"
TEMPLATE_KIND = "ResourceClaimTemplate"
DEVICE_CLASS_KIND = "DeviceClass"


class MalformedClaim(ValueError):
    """The object is not shaped like a ResourceClaim(Template) of any served version."""


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedClaim(f"{field} must be a list")
    return value


def _object(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedClaim(f"{field} must be an object")
    return value


def _class_name(request: Mapping[str, Any], field: str, found: set[str]) -> None:
    name = request.get("deviceClassName")
    if name is None:
        return
    if not isinstance(name, str):
        raise MalformedClaim(f"{field}.deviceClassName must be a string")
    if name:
        found.add(name)


def spec_device_classes(claim_spec: Any, field: str = "spec") -> frozenset[str]:
    """The device classes named by a ResourceClaimSpec (any version)."""
    devices = _object(_object(claim_spec, field).get("devices"), f"{field}.devices")
    found: set[str] = set()
    for i, request in enumerate(_list(devices.get("requests"), f"{field}.devices.requests")):
        where = f"{field}.devices.requests[{i}]"
        request = _object(request, where)
        _class_name(request, where, found)  # v1beta1
        _class_name(_object(request.get("exactly"), f"{where}.exactly"), f"{where}.exactly", found)
        for j, sub in enumerate(_list(request.get("firstAvailable"), f"{where}.firstAvailable")):
            _class_name(_object(sub, f"{where}.firstAvailable[{j}]"), f"{where}.firstAvailable[{j}]", found)
    return frozenset(found)


def device_classes(obj: Mapping[str, Any], kind: str | None = None) -> frozenset[str]:
    """The device classes a ResourceClaim or ResourceClaimTemplate object asks for. ``kind`` for the
    items of a list, which the apiserver sends without ``kind``."""
    kind = kind or obj.get("kind")
    spec = _object(obj.get("spec"), "spec")
    if kind == TEMPLATE_KIND:
        return spec_device_classes(spec.get("spec"), "spec.spec")
    if kind == CLAIM_KIND:
        return spec_device_classes(spec, "spec")
    raise MalformedClaim(f"kind {kind!r} is neither {CLAIM_KIND} nor {TEMPLATE_KIND}")


def is_claim_kind(api_version: str, kind: str) -> bool:
    group, _, version = api_version.rpartition("/")
    return group == GROUP and version in VERSIONS and kind in (CLAIM_KIND, TEMPLATE_KIND)


@dataclass(frozen=True)
class DeviceClassInfo:
    """What a DeviceClass says about the devices it selects: its CEL selectors (as text) and its
    ``extendedResourceName`` (DRA extended resources, '' when none)."""

    selectors: tuple[str, ...]
    extended_resource_name: str
    # Written by ``pool`` and saying that a device-level reservation is active (``RESERVATION_LABEL``).
    reservation_active: bool = False
    # The reservation is held by DeviceTaintRules (``RESERVATION_MODE_ANNOTATION``: ``MODE_TAINTS``).
    reserved_by_taints: bool = False


def device_class_info(obj: Mapping[str, Any]) -> DeviceClassInfo:
    """A DeviceClass of any served version (``spec.selectors[].cel.expression``, ``spec.extendedResourceName``)."""
    spec = _object(obj.get("spec"), "spec")
    expressions: list[str] = []
    for i, selector in enumerate(_list(spec.get("selectors"), "spec.selectors")):
        cel = _object(_object(selector, f"spec.selectors[{i}]").get("cel"), f"spec.selectors[{i}].cel")
        expression = cel.get("expression")
        if not isinstance(expression, str):
            raise MalformedClaim(f"spec.selectors[{i}].cel.expression must be a string")
        expressions.append(expression)
    name = spec.get("extendedResourceName") or ""
    if not isinstance(name, str):
        raise MalformedClaim("spec.extendedResourceName must be a string")
    labels = _object(_object(obj.get("metadata"), "metadata").get("labels"), "metadata.labels")
    active = labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(RESERVATION_LABEL) == RESERVATION_ACTIVE
    annotations = _object(_object(obj.get("metadata"), "metadata").get("annotations"), "metadata.annotations")
    tainted = active and annotations.get(RESERVATION_MODE_ANNOTATION) == MODE_TAINTS
    return DeviceClassInfo(tuple(expressions), name, active, tainted)


def selects_driver(info: DeviceClassInfo, drivers: Iterable[str]) -> bool:
    """Whether a DeviceClass may hand out devices of one of ``drivers`` (AMD's: ``gpu.amd.com``).

    Its selectors are CEL that only the apiserver evaluates; read as text, failing toward isolation:
    a class counts when a selector names one of the drivers (``device.driver == 'gpu.amd.com'``, or an
    attribute of its domain), and also when no selector pins ``device.driver`` at all (no selectors,
    or only capacity and attribute checks: AMD's devices may match). Only a class that pins another
    driver and never names ours is left out."""
    names = tuple(drivers)
    if any(driver in expression for expression in info.selectors for driver in names):
        return True
    return not any("device.driver" in expression for expression in info.selectors)


def device_facts(
    classes: Mapping[str, DeviceClassInfo], drivers: Iterable[str], reserved_class: str = ""
) -> DeviceFacts:
    """The DeviceFacts of a cluster's (or a dry run's) DeviceClasses: the GPU classes, their
    extendedResourceNames, and whether ``reserved_class`` (``reservedDevices.reservedClassName``) says
    that a device-level reservation is active."""
    names = tuple(drivers)
    gpu = {name: info for name, info in classes.items() if selects_driver(info, names)}
    reserved = classes.get(reserved_class) if reserved_class else None
    return DeviceFacts(
        frozenset(gpu),
        frozenset(info.extended_resource_name for info in gpu.values() if info.extended_resource_name),
        devices_reserved=reserved is not None and reserved.reservation_active,
        devices_tainted=reserved is not None and reserved.reserved_by_taints,
        class_selectors={name: info.selectors for name, info in gpu.items()},
    )


def is_device_class_kind(api_version: str, kind: str) -> bool:
    group, _, version = api_version.rpartition("/")
    return group == GROUP and version in VERSIONS and kind == DEVICE_CLASS_KIND


def allocated_results(obj: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """The devices allocated to a ResourceClaim, as (driver, pool, device) of
    ``status.allocation.devices.results[]``: the ground truth of what a pod got, whatever its DeviceClass
    is called."""
    status = _object(obj.get("status"), "status")
    allocation = _object(status.get("allocation"), "status.allocation")
    devices = _object(allocation.get("devices"), "status.allocation.devices")
    found = []
    for i, result in enumerate(_list(devices.get("results"), "status.allocation.devices.results")):
        entry = _object(result, f"status.allocation.devices.results[{i}]")
        driver, pool, device = (entry.get(key) for key in ("driver", "pool", "device"))
        if isinstance(driver, str) and driver:
            found.append((driver, pool if isinstance(pool, str) else "", device if isinstance(device, str) else ""))
    return tuple(found)


def pci_sort_key(bus_id: str) -> tuple[int, ...] | tuple[float]:
    """ROCm enumerates GPUs in PCI bus order: ``domain:bus:device.function`` compared as numbers
    (``0000:9a:00.0`` before ``0000:c1:00.0``); an ID that does not parse sorts last."""
    try:
        domain, bus, rest = bus_id.split(":")
        device, function = rest.split(".")
        return tuple(int(part, 16) for part in (domain, bus, device, function))
    except ValueError:
        return (float("inf"),)
