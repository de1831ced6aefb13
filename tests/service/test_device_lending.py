"""The pure parts of taking lent devices back (webhook/service/device_lending.py): what a waiting inference
pod needs, read from its claims. The rounds themselves run against the real control plane:
tests/e2e/test_e2e_device_lending.py."""

from __future__ import annotations

from typing import Any

from webhook.service.device_lending import requested_devices, waiting_for_devices

RESERVED = "rocm-isolation-reserved"


def claim(name: str, *requests: dict[str, Any], allocated: bool = False) -> dict[str, Any]:
    status = {"allocation": {"devices": {"results": [{"driver": "gpu.amd.com", "pool": "n", "device": "d"}]}}}
    return {
        "metadata": {"name": name, "namespace": "serve"},
        "spec": {"devices": {"requests": list(requests)}},
        **({"status": status} if allocated else {}),
    }


def pod(name: str, *claims: tuple[str, str]) -> dict[str, Any]:
    """A pod whose claims are made from templates, named as the resourceclaim controller named them."""
    return {
        "metadata": {
            "name": name,
            "namespace": "serve",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-12-04T07:00:00Z",
        },
        "spec": {"resourceClaims": [{"name": entry, "resourceClaimTemplateName": "t"} for entry, _ in claims]},
        "status": {"resourceClaimStatuses": [{"name": entry, "resourceClaimName": made} for entry, made in claims]},
    }


def test_requested_devices_counts_each_request_and_a_first_available_by_its_first_entry() -> None:
    assert requested_devices(claim("c", {"name": "a", "exactly": {"deviceClassName": RESERVED}})) == 1
    assert requested_devices(claim("c", {"name": "a", "exactly": {"deviceClassName": RESERVED, "count": 3}})) == 3
    first = {"name": "a", "firstAvailable": [{"name": "x", "deviceClassName": RESERVED, "count": 2}, {"name": "y"}]}
    assert requested_devices(claim("c", first, {"name": "b", "exactly": {"allocationMode": "All"}})) == 3


def test_a_pod_waits_for_devices_only_for_unallocated_claims_of_the_reserved_classes() -> None:
    claims = [
        claim("a-gpu", {"name": "g", "exactly": {"deviceClassName": RESERVED, "count": 2}}),
        claim("b-gpu", {"name": "g", "exactly": {"deviceClassName": RESERVED}}, allocated=True),
        claim("c-nic", {"name": "n", "exactly": {"deviceClassName": "nic.example.com"}}),
    ]
    found = waiting_for_devices([pod("a", ("gpu", "a-gpu")), pod("b", ("gpu", "b-gpu")), pod("c", ("nic", "c-nic"))],
                                claims, {RESERVED})  # fmt: skip
    assert [(w.name, w.gpus, w.devices) for w in found] == [("a", 2, True)]
