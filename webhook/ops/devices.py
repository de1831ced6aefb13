"""The devices a DRA driver publishes, per node: their PCI bus IDs, ROCm's order, GPUs counted once per PCI
bus ID (partitions share their GPU's), and which of them an active device reservation reserves.

Pure: ``pool_read.py`` (and the audit) read the ResourceSlices and pass them in raw; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.dra_capacity import device_fields, keep_newest, pool_generation
from webhook.deploy.device_classes import PCI_BUS_ID_ATTRIBUTE, DeviceReservation, pci_sort_key

RESERVED, SHARED, UNRESERVED = "reserved", "shared", "unreserved"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Device:
    """One device of the driver in a node's ResourceSlices."""

    node: str
    pool: str
    name: str
    pci_bus_id: str  # resource.kubernetes.io/pciBusID; "" when the device publishes none (never reserved)

    @property
    def key(self) -> tuple[str, str]:
        """(pool, device): how an allocation result names it (with the driver)."""
        return (self.pool, self.name)


def pci_bus_id(device: Mapping[str, Any]) -> str:
    """The device's ``resource.kubernetes.io/pciBusID`` (a string attribute: ``{"string": "0000:19:00.0"}``)."""
    attribute = _mapping(_mapping(device_fields(device).get("attributes")).get(PCI_BUS_ID_ATTRIBUTE))
    return _text(attribute.get("string"))


def _device_order(device: Device) -> tuple[bool, tuple[int, ...] | tuple[float], str]:
    return (not device.pci_bus_id, pci_sort_key(device.pci_bus_id) if device.pci_bus_id else (0,), device.name)


@dataclass
class PublishedDevices:
    """The driver's devices in the ResourceSlices, added one by one (a list may start over: ``clear``);
    per pool, only the newest generation counts (older slices are being replaced: ``dra_capacity.keep_newest``,
    as for the audit's capacity). Slices for a node selector or all nodes belong to no node: left out."""

    driver: str
    _pools: dict[str, tuple[int, list[Device]]] = field(default_factory=dict)

    def clear(self) -> None:
        self._pools.clear()

    def add(self, resource_slice: Mapping[str, Any]) -> None:
        spec = _mapping(resource_slice.get("spec"))
        pool = spec.get("pool")
        if _text(spec.get("driver")) != self.driver or not isinstance(pool, Mapping):
            return
        pool_name = _text(pool.get("name"))
        node = _text(spec.get("nodeName"))
        devices = []
        for raw in _items(spec.get("devices")):
            if not isinstance(raw, Mapping):
                continue
            # perDeviceNodeSelection: each device names its node.
            on, name = node or _text(device_fields(raw).get("nodeName")), _text(raw.get("name"))
            if on and name:
                devices.append(Device(on, pool_name, name, pci_bus_id(raw)))
        keep_newest(self._pools, pool_name, pool_generation(pool), devices)

    def per_node(self) -> dict[str, tuple[Device, ...]]:
        """Each node's devices, in ROCm's order (PCI bus ID; devices without one last, by name)."""
        found: dict[str, list[Device]] = {}
        for _, devices in self._pools.values():
            for device in devices:
                found.setdefault(device.node, []).append(device)
        return {node: tuple(sorted(set(devices), key=_device_order)) for node, devices in sorted(found.items())}


def published_devices(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[str, tuple[Device, ...]]:
    published = PublishedDevices(driver)
    for resource_slice in slices:
        published.add(resource_slice)
    return published.per_node()


def gpu_ids(devices: Iterable[Device]) -> tuple[str, ...]:
    """The node's GPUs as their distinct PCI bus IDs, lowest first (partitions carry their GPU's ID)."""
    return tuple(sorted({d.pci_bus_id for d in devices if d.pci_bus_id}, key=pci_sort_key))


def gpu_key(device: Device) -> str:
    """What one GPU of a node is for counting: its PCI bus ID (partitions share their GPU's), else the
    device itself."""
    return device.pci_bus_id or f"{device.pool}/{device.name}"


def gpu_count(devices: Sequence[Device]) -> int:
    """GPUs of a node: one per PCI bus ID, plus each device that has none."""
    return len(gpu_ids(devices)) + sum(1 for d in devices if not d.pci_bus_id)


def device_state(device: Device, reservation: DeviceReservation | None) -> str:
    """reserved / shared while a reservation is active; unreserved (any class may get it) otherwise."""
    if reservation is None or not reservation.active:
        return UNRESERVED
    if reservation.by_taints:
        return RESERVED if device.key in reservation.tainted else SHARED
    return RESERVED if device.pci_bus_id and device.pci_bus_id in reservation.pci_bus_ids else SHARED


def split_nodes(published: Mapping[str, Sequence[Device]], reservation: DeviceReservation | None) -> set[str]:
    """The nodes the reservation splits: every node of the driver by classes, those with a tainted device
    by taints; none once released."""
    if reservation is None or not reservation.active:
        return set()
    if not reservation.by_taints:
        return set(published)
    return {node for node, devices in published.items() if any(d.key in reservation.tainted for d in devices)}
