"""The GPUs that Dynamic Resource Allocation publishes and hands out, counted for the audit's capacity.

A node that runs AMD's DRA driver instead of the device plugin has no ``amd.com/`` resource in its
``allocatable``: its GPUs are the devices of the GPU drivers (the policy's ``scope.gpuDrivers``) in the
ResourceSlices of that node (``spec.nodeName``, or a device's own ``nodeName`` with
``perDeviceNodeSelection``), in the newest generation of each pool (older generations are being
replaced). Slices for a node selector or for all nodes belong to no one node and are not counted.

The unit is the *slot*: one device, except that devices drawing on the same counter sets (KEP-4815
partitionable devices: AMD's driver in AutoPartition mode publishes each partition mode of a GPU as a
device, made mutually exclusive by a counter set) are one slot, the GPU they share. A claim's allocated
devices (``status.allocation.devices.results``) are counted in the same slots, each slot once however
many claims share it (consumable capacity), so what is requested never exceeds what is published.

``DeviceTaints`` reads the taints a driver publishes on its devices (``spec.devices[].taints``), for the
audit of device-level reservation: AMD's DRA driver publishes no health attribute, a taint is what keeps
a device from the claims that do not tolerate it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")


@dataclass(frozen=True)
class Slot:
    """What one GPU counts as: a device, or the counter sets its partition devices share."""

    driver: str
    pool: str
    name: str


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def device_fields(device: Mapping[str, Any]) -> Mapping[str, Any]:
    """resource.k8s.io/v1beta1 nests a device's fields under ``basic``; v1beta2 and v1 do not."""
    basic = device.get("basic")
    return basic if isinstance(basic, Mapping) else device


def _slot(driver: str, pool: str, name: str, device: Mapping[str, Any]) -> Slot:
    fields = device_fields(device)
    counter_sets = sorted(
        {_text(c.get("counterSet")) for c in _items(fields.get("consumesCounters")) if isinstance(c, Mapping)} - {""}
    )
    if counter_sets:
        return Slot(driver, pool, "counters:" + ",".join(counter_sets))
    return Slot(driver, pool, name)


def pool_generation(pool: Mapping[str, Any]) -> int:
    generation = pool.get("generation")
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else 0


def keep_newest(pools: dict[Any, tuple[int, list[_T]]], key: Any, generation: int, items: list[_T]) -> None:
    """A pool's devices from one slice: a newer generation replaces what was read of the pool (its older
    slices are being replaced), the same generation adds to it, an older one is left out. Every reader of
    ResourceSlices uses it (``PublishedGpus``, ``DeviceTaints``, ``ops/device_reservation.PublishedDevices``)."""
    known = pools.get(key)
    if known is None or generation > known[0]:
        pools[key] = (generation, items)
    elif generation == known[0]:
        known[1].extend(items)


@dataclass
class PublishedGpus:
    """The ResourceSlices of the GPU drivers, added one by one (a list may start over: ``clear``)."""

    drivers: frozenset[str]
    # (driver, pool) -> (generation, [(node, device name, slot)])
    _pools: dict[tuple[str, str], tuple[int, list[tuple[str, str, Slot]]]] = field(default_factory=dict)

    def clear(self) -> None:
        self._pools.clear()

    def add(self, resource_slice: Mapping[str, Any]) -> None:
        spec = resource_slice.get("spec")
        if not isinstance(spec, Mapping):
            return
        driver = _text(spec.get("driver"))
        pool = spec.get("pool")
        if driver not in self.drivers or not isinstance(pool, Mapping):
            return
        pool_name = _text(pool.get("name"))
        node = _text(spec.get("nodeName"))
        devices = []
        for device in _items(spec.get("devices")):
            if not isinstance(device, Mapping):
                continue
            # perDeviceNodeSelection: each device names its node.
            on, name = node or _text(device_fields(device).get("nodeName")), _text(device.get("name"))
            if on and name:
                devices.append((on, name, _slot(driver, pool_name, name, device)))
        keep_newest(self._pools, (driver, pool_name), pool_generation(pool), devices)

    def per_node(self) -> dict[str, int]:
        """Slots per node."""
        slots: dict[str, set[Slot]] = {}
        for _, devices in self._pools.values():
            for node, _, slot in devices:
                slots.setdefault(node, set()).add(slot)
        return {node: len(found) for node, found in slots.items()}

    def slots(self) -> dict[tuple[str, str, str], Slot]:
        """(driver, pool, device) -> its slot, for reading allocations."""
        return {
            (slot.driver, slot.pool, name): slot for _, devices in self._pools.values() for _, name, slot in devices
        }


def allocated(results: Iterable[tuple[str, str, str]], slots: Mapping[tuple[str, str, str], Slot]) -> set[Slot]:
    """The slots of a claim's allocated devices; a device no slice publishes (any more) is its own slot."""
    return {slots.get(result) or Slot(*result) for result in results}


Taint = tuple[str, str, str]  # (key, value, effect) of a device taint; value "" when it has none


@dataclass
class DeviceTaints:
    """The taints one driver publishes on its devices (``spec.devices[].taints``), newest generation of each
    pool, added slice by slice (a list may start over: ``clear``). Taints that a DeviceTaintRule adds are not
    in the slices: the scheduler applies them to its own view."""

    driver: str
    # pool -> (generation, [(device, its taints)])
    _pools: dict[str, tuple[int, list[tuple[str, tuple[Taint, ...]]]]] = field(default_factory=dict)

    def clear(self) -> None:
        self._pools.clear()

    def add(self, resource_slice: Mapping[str, Any]) -> None:
        spec = resource_slice.get("spec")
        if not isinstance(spec, Mapping) or _text(spec.get("driver")) != self.driver:
            return
        pool = spec.get("pool")
        if not isinstance(pool, Mapping):
            return
        devices = []
        for device in _items(spec.get("devices")):
            if not isinstance(device, Mapping):
                continue
            taints = tuple(
                (_text(t.get("key")), _text(t.get("value")), _text(t.get("effect")))
                for t in _items(device_fields(device).get("taints"))
                if isinstance(t, Mapping)
            )
            devices.append((_text(device.get("name")), taints))
        keep_newest(self._pools, _text(pool.get("name")), pool_generation(pool), devices)

    def tainted(self) -> dict[tuple[str, str], tuple[Taint, ...]]:
        """(pool, device) -> its taints, for the devices that have any."""
        return {
            (pool, name): taints for pool, (_, devices) in self._pools.items() for name, taints in devices if taints
        }
