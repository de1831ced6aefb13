"""The one reader of ResourceSlices: the devices DRA drivers publish, per node, and the GPU each is part of.

Every command that counts GPUs published through Dynamic Resource Allocation reads slices here (``audit``'s
capacity and device checks, every ``pool`` verb); the capacity model (``ops/capacity.py``) counts what it
gives. What a device is:

- a node's device: the slice's ``spec.nodeName``, or, with ``perDeviceNodeSelection``, the device's own
  ``nodeName``; slices for a node selector or for all nodes belong to no one node and are left out;
- of the newest generation of its pool (older slices are being replaced: ``keep_newest``);
- part of one **GPU**, the unit of capacity everywhere: its ``resource.kubernetes.io/pciBusID`` (a
  partition, or an AutoPartition layout, carries its GPU's), else the counter sets it consumes (KEP-4815:
  AutoPartition's layouts of one GPU draw on one counter set, so one is active at a time), else the device
  alone. Two devices with one PCI bus ID are one GPU even when they consume no counter (a pre-partitioned
  GPU): the reservation is made and enforced per PCI bus ID, so counting by it makes N reserved GPUs read
  as N and partitions always count on their GPU's side;
- with its taints (``spec.devices[].taints``): a tainted device still counts in capacity (it is the node's
  GPU, as a node tainted ``amd-gpu-unhealthy`` keeps its allocatable), and ``audit`` reports reserved ones.
  Taints a DeviceTaintRule adds are not in the slices: the scheduler applies them to its own view.

resource.k8s.io/v1beta1 nests a device's fields under ``basic``; v1beta2 and v1 do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from webhook.core.claims import PCI_BUS_ID_ATTRIBUTE, pci_sort_key

_T = TypeVar("_T")

Taint = tuple[str, str, str]  # (key, value, effect) of a device taint; value "" when it has none


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Device:
    """One device of a driver in a node's ResourceSlices. Equal devices are the same device (node, pool,
    name, PCI bus ID); what else the slice says of it is carried along, not compared."""

    node: str
    pool: str
    name: str
    pci_bus_id: str  # resource.kubernetes.io/pciBusID; "" when the device publishes none (never reserved)
    driver: str = field(default="", compare=False)
    counter_sets: tuple[str, ...] = field(default=(), compare=False)  # the shared counter sets it consumes
    taints: tuple[Taint, ...] = field(default=(), compare=False)
    # AMD's AutoPartition layouts: the layout's compute and memory partition modes (``computePartition``,
    # ``memoryPartition`` of the driver's domain; "" when the device publishes none). The memory mode is
    # node-wide, so ``pool`` pins one (ops/devices/memory_mode.py).
    compute_partition: str = field(default="", compare=False)
    memory_partition: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[str, str]:
        """(pool, device): how an allocation result names it (with the driver)."""
        return (self.pool, self.name)

    @property
    def gpu(self) -> str:
        """The GPU it is part of, within its node: its PCI bus ID, else its counter sets, else itself."""
        if self.pci_bus_id:
            return self.pci_bus_id
        if self.counter_sets:
            return "counters:" + ",".join(self.counter_sets)
        return f"{self.pool}/{self.name}"

    @cached_property
    def as_gpu(self) -> Gpu:
        """Its GPU in the cluster (``gpu_of``), worked out once per device: the lending keeper's view hands
        every round the same devices (a slice is parsed once: ``_PARSED``)."""
        return Gpu(self.driver, self.pool, self.gpu)


def device_fields(device: Mapping[str, Any]) -> Mapping[str, Any]:
    """resource.k8s.io/v1beta1 nests a device's fields under ``basic``; v1beta2 and v1 do not."""
    basic = device.get("basic")
    return basic if isinstance(basic, Mapping) else device


def pci_bus_id(device: Mapping[str, Any]) -> str:
    """The device's ``resource.kubernetes.io/pciBusID`` (a string attribute: ``{"string": "0000:19:00.0"}``)."""
    attribute = _mapping(_mapping(device_fields(device).get("attributes")).get(PCI_BUS_ID_ATTRIBUTE))
    return _text(attribute.get("string"))


def partition_attribute(fields: Mapping[str, Any], driver: str, name: str) -> str:
    """A string attribute of the driver's domain: ``name`` unqualified (a driver's own domain), or
    ``<driver>/<name>``, as CEL's ``device.attributes["<driver>"].<name>`` reads both."""
    attributes = _mapping(fields.get("attributes"))
    for key in (name, f"{driver}/{name}"):
        value = _text(_mapping(attributes.get(key)).get("string"))
        if value:
            return value
    return ""


def _counter_sets(fields: Mapping[str, Any]) -> tuple[str, ...]:
    found = {_text(c.get("counterSet")) for c in _items(fields.get("consumesCounters")) if isinstance(c, Mapping)}
    return tuple(sorted(found - {""}))


def _taints(fields: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        (_text(t.get("key")), _text(t.get("value")), _text(t.get("effect")))
        for t in _items(fields.get("taints"))
        if isinstance(t, Mapping)
    )


def device_order(device: Device) -> tuple[bool, tuple[int, ...] | tuple[float], str]:
    """ROCm's enumeration order: by PCI bus ID; devices without one last, by name."""
    return (not device.pci_bus_id, pci_sort_key(device.pci_bus_id) if device.pci_bus_id else (0,), device.name)


def pool_generation(pool: Mapping[str, Any]) -> int:
    generation = pool.get("generation")
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else 0


def keep_newest(pools: dict[Any, tuple[int, list[_T]]], key: Any, generation: int, items: list[_T]) -> None:
    """A pool's devices from one slice: a newer generation replaces what was read of the pool (its older
    slices are being replaced), the same generation adds to it, an older one is left out."""
    known = pools.get(key)
    if known is None or generation > known[0]:
        pools[key] = (generation, items)
    elif generation == known[0]:
        known[1].extend(items)


@dataclass(frozen=True)
class Gpu:
    """One GPU of the cluster: its driver, pool and ``Device.gpu`` (a PCI bus ID is unique within a node,
    and AMD's driver names each node's pool after the node)."""

    driver: str
    pool: str
    key: str


def _devices_of(spec: Mapping[str, Any], driver: str, pool_name: str) -> tuple[Device, ...]:
    node = _text(spec.get("nodeName"))
    devices = []
    for raw in _items(spec.get("devices")):
        if not isinstance(raw, Mapping):
            continue
        fields = device_fields(raw)
        # perDeviceNodeSelection: each device names its node.
        on, name = node or _text(fields.get("nodeName")), _text(raw.get("name"))
        if on and name:
            devices.append(
                Device(
                    on,
                    pool_name,
                    name,
                    pci_bus_id(raw),
                    driver,
                    _counter_sets(fields),
                    _taints(fields),
                    partition_attribute(fields, driver, "computePartition"),
                    partition_attribute(fields, driver, "memoryPartition"),
                )
            )
    return tuple(devices)


# A slice's devices by the identity of the slice read (the object is kept, so its id is not reused): the lending
# keeper's view hands the same unchanged objects to every round (it replaces, never mutates, an object that
# changes), so each is parsed once; a command reading fresh JSON simply misses.
_PARSED: dict[int, tuple[Mapping[str, Any], tuple[Device, ...]]] = {}
_PARSED_MAX = 50_000


@dataclass
class PublishedDevices:
    """The ResourceSlices of some drivers, added one by one (a list may start over: ``clear``)."""

    drivers: frozenset[str]
    # (driver, pool) -> (generation, [devices])
    _pools: dict[tuple[str, str], tuple[int, list[Device]]] = field(default_factory=dict)
    _by_result: dict[tuple[str, str, str], Gpu] | None = None

    def clear(self) -> None:
        self._pools.clear()
        self._by_result = None

    def add(self, resource_slice: Mapping[str, Any]) -> None:
        spec = _mapping(resource_slice.get("spec"))
        driver = _text(spec.get("driver"))
        pool = spec.get("pool")
        if driver not in self.drivers or not isinstance(pool, Mapping):
            return
        pool_name = _text(pool.get("name"))
        known = _PARSED.get(id(resource_slice))
        if known is not None and known[0] is resource_slice:
            devices = known[1]
        else:
            devices = _devices_of(spec, driver, pool_name)
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[id(resource_slice)] = (resource_slice, devices)
        keep_newest(self._pools, (driver, pool_name), pool_generation(pool), list(devices))
        self._by_result = None

    def _devices(self, driver: str | None = None, drivers: frozenset[str] | None = None) -> Iterable[Device]:
        for (found, _), (_, devices) in self._pools.items():
            if (driver is None or found == driver) and (drivers is None or found in drivers):
                yield from devices

    def per_node(self, driver: str | None = None) -> dict[str, tuple[Device, ...]]:
        """Each node's devices (of ``driver``, or of every driver read), in ROCm's order."""
        found: dict[str, set[Device]] = {}
        for device in self._devices(driver):
            found.setdefault(device.node, set()).add(device)
        return {node: tuple(sorted(devices, key=device_order)) for node, devices in sorted(found.items())}

    def gpus_per_node(self, drivers: frozenset[str] | None = None) -> dict[str, int]:
        """GPUs per node, of ``drivers`` (every driver read by default; one per ``Device.gpu``)."""
        gpus: dict[str, set[Gpu]] = {}
        for device in self._devices(drivers=drivers):
            gpus.setdefault(device.node, set()).add(gpu_of(device))
        return {node: len(found) for node, found in gpus.items()}

    def gpus_by_result(self) -> dict[tuple[str, str, str], Gpu]:
        """(driver, pool, device) -> its GPU, for reading allocations (worked out once per reading)."""
        if self._by_result is None:
            self._by_result = {(d.driver, d.pool, d.name): gpu_of(d) for d in self._devices()}
        return self._by_result

    def tainted(self, driver: str) -> dict[tuple[str, str], tuple[Taint, ...]]:
        """(pool, device) -> its taints, for the devices of ``driver`` that have any."""
        return {d.key: d.taints for d in self._devices(driver) if d.taints}


def gpu_of(device: Device) -> Gpu:
    return device.as_gpu


def published_devices(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[str, tuple[Device, ...]]:
    published = PublishedDevices(frozenset({driver}))
    for resource_slice in slices:
        published.add(resource_slice)
    return published.per_node(driver)


def allocated_gpus(results: Iterable[tuple[str, str, str]], gpus: Mapping[tuple[str, str, str], Gpu]) -> set[Gpu]:
    """The GPUs of a claim's allocated devices; a device no slice publishes (any more) is its own GPU."""
    return {gpus.get(result) or Gpu(result[0], result[1], f"{result[1]}/{result[2]}") for result in results}


def gpu_ids(devices: Iterable[Device]) -> tuple[str, ...]:
    """The node's GPUs as their distinct PCI bus IDs, lowest first (partitions carry their GPU's ID)."""
    return tuple(sorted({d.pci_bus_id for d in devices if d.pci_bus_id}, key=pci_sort_key))


def gpu_count(devices: Iterable[Device]) -> int:
    """GPUs of a node (one per ``Device.gpu``)."""
    return len({d.gpu for d in devices})
