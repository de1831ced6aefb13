"""Device-level reservation on the cluster's Kubernetes minor (issue 47; ``deploy/minors.py``: what it serves).

- No DRA (1.33: no ``resource.k8s.io``): ``pool --devices-per-node`` / ``release --devices`` are refused, naming the
  minor, before anything is written.
- DRA without DRA extended resources (1.34, 1.35 as they ship: ``DRAExtendedResource`` off): the apiserver drops a
  DeviceClass's ``extendedResourceName``, so what the policy asks (``reservedDevices.extendedResourceName``) cannot be
  stored. The reservation is made, planned, checked and shown without it (the policy with no extended resource name):
  ``amd.com/gpu`` stays the device plugin's (a DRA-only node publishes none, so no pod asking for it lands there), the
  split holds for claims, and ``pool status`` / ``audit`` do not ask for a class the apiserver cannot keep.
- DRA without partitionable devices (1.34, 1.35 as they ship: ``DRAPartitionableDevices`` off): the apiserver drops
  the shared counters of AMD's AutoPartition layouts (measured: the slices are stored without ``sharedCounters`` and
  ``consumesCounters``), so the scheduler takes each layout of a GPU for a GPU of its own. The split still holds (the
  classes select by PCI bus ID: every layout of a reserved GPU stays on the reserved side, and the pinned memory mode
  on both), but two claims of one side can be handed two layouts of one GPU: said on ``plan``/``apply``.
No I/O: the caller reads what the cluster serves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from webhook.cluster.slices import Device
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


def layouts_without_counters(
    served: minors.Served | None, published: Mapping[str, Sequence[Device]], driver: str
) -> str | None:
    """What the split cannot hold where the cluster drops AutoPartition's shared counters, None when nothing is lost
    (partitionable devices served, or no GPU published as several layouts: whole GPUs, static partitions)."""
    if served is None or not served.dra or served.partitionable_devices:
        return None
    nodes = sorted(node for node, devices in published.items() if _several_layouts(devices))
    if not nodes:
        return None
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    return (
        f"Kubernetes {served.minor}: no partitionable devices ({minors.PARTITIONABLE_GATE} off): the apiserver keeps "
        f"no shared counters, so the scheduler takes each AutoPartition layout of {driver} on {shown} for a GPU of its "
        "own and can hand two layouts of one GPU to two claims; the split still holds (the classes select by PCI bus "
        "ID: every layout of a reserved GPU stays reserved), but two claims of one side can share a GPU "
        f"(turn {minors.PARTITIONABLE_GATE} on, or AutoPartition off in the driver)"
    )


def _several_layouts(devices: Sequence[Device]) -> bool:
    """A GPU of these devices is published as more than one compute+memory layout (AutoPartition), not as
    partitions of one layout."""
    layouts: dict[str, set[tuple[str, str]]] = {}
    for device in devices:
        if device.compute_partition or device.memory_partition:
            layouts.setdefault(device.gpu, set()).add((device.compute_partition, device.memory_partition))
    return any(len(found) > 1 for found in layouts.values())
