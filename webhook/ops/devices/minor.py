"""Device-level reservation on the cluster's Kubernetes minor (issue 47; ``deploy/minors.py``: what it serves).

- No DRA (1.33: no ``resource.k8s.io``): ``pool --devices-per-node`` / ``release --devices`` are refused, naming the
  minor, before anything is written.
- DRA without DRA extended resources (1.34, 1.35 as they ship: ``DRAExtendedResource`` off): the apiserver drops a
  DeviceClass's ``extendedResourceName``, so what the policy asks (``reservedDevices.extendedResourceName``) cannot be
  stored. The reservation is made, planned, checked and shown without it (the policy with no extended resource name):
  ``amd.com/gpu`` stays the device plugin's (a DRA-only node publishes none, so no pod asking for it lands there), the
  split holds for claims, and ``pool status`` / ``audit`` do not ask for a class the apiserver cannot keep.
No I/O: the caller reads what the cluster serves."""

from __future__ import annotations

from webhook.core.policy import Policy, compile_policy
from webhook.deploy import minors


def no_dra_refusal(served: minors.Served | None) -> str | None:
    """Why device-level reservation cannot be made on this cluster, None when it can (or is not known)."""
    if served is None or served.dra:
        return None
    return (
        f"Kubernetes {served.minor} serves no resource.k8s.io (DRA: 1.34 or later): device-level reservation "
        "(--devices-per-node, --devices) needs DeviceClasses; reserve whole nodes instead (pool apply --nodes ...)"
    )


def policy_for(policy: Policy, served: minors.Served | None) -> tuple[Policy, list[str]]:
    """``policy`` as this cluster can hold it, and one note per thing changed (none when nothing is)."""
    devices = policy.spec.reserved_devices
    if served is None or not served.dra or served.extended_resources or not devices.extended_resource_name:
        return policy, []
    document = policy.document
    spec = document.spec.model_copy(
        update={"reserved_devices": devices.model_copy(update={"extended_resource_name": ""})}
    )
    changed = compile_policy(document.model_copy(update={"spec": spec}), source=policy.source)
    note = (
        f"Kubernetes {served.minor}: no DRA extended resources ({minors.EXTENDED_RESOURCE_GATE} off): the apiserver "
        f"cannot keep a DeviceClass's extendedResourceName, so the classes are written without "
        f"{devices.extended_resource_name} (it stays the device plugin's; the split holds for claims)"
    )
    return changed, [note]
