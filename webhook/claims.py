"""Dynamic Resource Allocation: which device classes a ResourceClaim or ResourceClaimTemplate asks for.

A pod reaches a GPU through DRA by naming, in ``spec.resourceClaims``, a ResourceClaim
(``resourceClaimName``) or a ResourceClaimTemplate (``resourceClaimTemplateName``) of its namespace.
The claim's requests name DeviceClasses; AMD's DRA driver (ROCm/k8s-gpu-dra-driver) serves
``gpu.amd.com``. The request shapes differ by API version, and all are read:

- ``resource.k8s.io/v1`` and ``v1beta2``: ``spec.devices.requests[].exactly.deviceClassName`` and
  ``spec.devices.requests[].firstAvailable[].deviceClassName``;
- ``v1beta1``: ``spec.devices.requests[].deviceClassName`` and ``...firstAvailable[].deviceClassName``.

A ResourceClaimTemplate holds the claim's spec one level down (``spec.spec``). Pure: the cache
(``cluster.py``) and the dry run (``dryrun.py``) both read claims with these functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "resource.k8s.io"
# Newest first: the cache lists the first version the cluster serves.
VERSIONS = ("v1", "v1beta2", "v1beta1")
CLAIM_KIND = "ResourceClaim"
TEMPLATE_KIND = "ResourceClaimTemplate"


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
