"""The reserved pool's capacity, one model: per node and per side, how many GPUs, who holds them, how many are free.

``audit`` (its capacity section and the background audit's gauges, which are that section), ``pool status``
and ``pool apply/release`` (who changes side) read this model and count nothing themselves. Pure: built
from what the commands read (nodes, the devices of ``cluster/slices.py``, the device reservation) and fed
pods one by one (``audit`` streams them), as Kueue's ClusterQueue snapshot is fed workloads.

The sides. A node reserved whole (the reserved label) is all ``reserved``; a node whose GPUs a device-level
reservation splits has both sides: the GPUs whose PCI bus ID is reserved (or, by taints, whose device is
tainted) are ``reserved``, the others ``shared``; every other node is all ``shared``. A node is reserved
whole or split, never both: a labelled node is whole.

The unit is the GPU (``slices.Device.gpu``): one per PCI bus ID (every partition or AutoPartition layout
of a GPU carries its GPU's), else one per set of shared counters, else one per device. What kubelet counts
(``amd.com/`` resources of the device plugin, and DRA extended resources, which name GPUs too) is in the
same unit: the node's allocatable, the pod's request.

What a pod holds, counted once (a claim several pods share counts for the first pod that holds it):
- on a split node, the devices of the reservation's driver that its claims were allocated, each GPU on
  its side;
- otherwise, its GPU resources (kubelet's count) and the GPUs its claims were allocated, on its node's
  side; a pod on a node that is not known (deleted meanwhile) counts in the shared pool, with no node;
- a DRA extended resource (``amd.com/gpu`` served by a DeviceClass) is counted by the GPUs of the claim the
  scheduler made for it, not by the request's number: two partitions of one GPU are one GPU.

Where the readers disagreed before this model, the answers now: a device without a PCI bus ID is its own
GPU (or its counter set's) and is never reserved; a pre-partitioned GPU (several devices, one PCI bus ID)
is one GPU on whole nodes too (before, the whole-node count counted each partition); a GPU held by pods of
two classes counts for the first (before, the audit's split nodes counted it for both classes); a tainted
device counts in capacity (``audit`` reports reserved ones).

``free = capacity - allocated`` per node and side (negative only when the readings disagree: a claim
allocated on a device its node no longer publishes). ``fits`` and ``free_without`` answer lending's
question: would an inference pod fit there if these borrowers left.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from webhook.cluster.slices import Device, Gpu, gpu_of
from webhook.deploy.device_classes import DeviceReservation

RESERVED: Final = "reserved"
SHARED: Final = "shared"
UNRESERVED: Final = "unreserved"
SIDES: Final = (RESERVED, SHARED)


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


def split_node_names(
    published: Mapping[str, Sequence[Device]],
    reservation: DeviceReservation | None,
    *,
    labelled: Iterable[str] = (),
    rule_nodes: Iterable[str] = (),
    whole: Iterable[str] = (),
) -> frozenset[str]:
    """The nodes the capacity counts on both sides while a reservation is active: the nodes it splits, those
    our DeviceTaintRules name (``rule_nodes``, published or not) and those ``labelled`` split, but never a
    node reserved ``whole`` (pool apply never splits it: the taint keeps others off all its GPUs)."""
    if reservation is None or not reservation.active:
        return frozenset()
    chosen = split_nodes(published, reservation) | (set(rule_nodes) if reservation.by_taints else set())
    return frozenset((chosen | set(labelled)) - set(whole))


def gpus_in_state(devices: Iterable[Device], state: str, reservation: DeviceReservation | None) -> int:
    """GPUs among ``devices`` in ``state`` (reserved, shared, unreserved)."""
    return len({d.gpu for d in devices if device_state(d, reservation) == state})


@dataclass(frozen=True)
class GpuView:
    """One GPU of a node as ``pool status`` and ``audit`` show it: its devices (one for a whole-GPU driver;
    a partition or AutoPartition layout each otherwise, all with the GPU's PCI bus ID) and those allocated
    (the layout the GPU is in, under AutoPartition: one layout per GPU at a time)."""

    key: str  # Device.gpu: the PCI bus ID, else the counter set, else pool/device
    pci_bus_id: str
    state: str
    devices: tuple[Device, ...]
    allocated: tuple[Device, ...]

    @property
    def layouts(self) -> bool:
        """Published as several devices (partitions, AutoPartition layouts), not as one whole GPU."""
        return len(self.devices) > 1

    def text(self) -> str:
        """Its device (a whole GPU), else the devices allocated (the layout it is in), else how many it has."""
        shown = self.allocated if self.layouts else self.devices
        return ", ".join(d.name for d in shown) or f"({len(self.devices)} devices, none allocated)"


def gpu_views(
    devices: Sequence[Device], reservation: DeviceReservation | None, allocated: Container[tuple[str, str]]
) -> list[GpuView]:
    """A node's GPUs, in the order of their first device (PCI order); ``allocated``: the keys of the devices
    some pod holds."""
    by_gpu: dict[str, list[Device]] = {}
    for d in devices:
        by_gpu.setdefault(d.gpu, []).append(d)
    return [
        GpuView(
            key,
            found[0].pci_bus_id,
            device_state(found[0], reservation),
            tuple(found),
            tuple(d for d in found if d.key in allocated),
        )
        for key, found in by_gpu.items()
    ]


@dataclass(frozen=True)
class Holder:
    """A pod that holds GPUs (or that the policy classifies), as the capacity counts it."""

    namespace: str
    name: str
    class_name: str  # "" when the policy does not classify it (out of scope, excluded namespace)
    inference: bool = False
    uid: str = ""
    borrower: bool = False  # core/lending.is_borrower: a training pod at the borrowers' PriorityClass
    created: datetime | None = None

    @property
    def ref(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def borrows(self) -> bool:
        """What it holds of a reserved side is lent, and it may be taken back: a borrower, never an inference
        pod (the one test lending, its gauges, the audit and the reclaims count by)."""
        return self.borrower and not self.inference


@dataclass
class Side:
    """One side of one node: its GPUs, and the pods holding GPUs there with how many each."""

    capacity: int = 0
    holders: list[tuple[Holder, int]] = field(default_factory=list)

    @property
    def allocated(self) -> int:
        return sum(gpus for _, gpus in self.holders)

    @property
    def free(self) -> int:
        return self.capacity - self.allocated

    def allocated_by_class(self, unclassified: str) -> dict[str, int]:
        """GPUs allocated per class (a holder with no class under ``unclassified``); classes holding none
        are left out."""
        out: dict[str, int] = {}
        for holder, gpus in self.holders:
            if gpus:
                name = holder.class_name or unclassified
                out[name] = out.get(name, 0) + gpus
        return dict(sorted(out.items()))


@dataclass
class NodeCapacity:
    name: str
    split: bool  # both sides (device-level reservation); otherwise the one side of ``whole``
    whole: str = SHARED  # the side of a node that is not split
    known: bool = True  # False: a node the pods name that was not read (counted in the shared pool)
    sides: dict[str, Side] = field(default_factory=dict)

    def side(self, name: str) -> Side:
        return self.sides.setdefault(name, Side())


@dataclass
class CapacityModel:
    """The cluster's GPUs per node and side, and what the pods hold. Build with ``build``, then ``add_pod``."""

    driver: str  # the device reservation's driver
    reservation: DeviceReservation | None  # active or not; None: no reservation recorded
    nodes: dict[str, NodeCapacity] = field(default_factory=dict)
    # The reservation driver's published devices, by (pool, device), and per node (PCI order)
    _devices: dict[tuple[str, str], Device] = field(default_factory=dict)
    _published: dict[str, tuple[Device, ...]] = field(default_factory=dict)
    # The reservation driver's devices each pod holds, by (namespace, name), on every node that publishes
    # them (split or not): who changes side when the split does
    held: dict[tuple[str, str], list[Device]] = field(default_factory=dict)
    # GPUs already counted for a holder (a claim several pods share counts once)
    _counted: set[Gpu] = field(default_factory=set)

    @classmethod
    def build(
        cls,
        whole: Iterable[tuple[str, int, bool]],
        published: Mapping[str, Sequence[Device]],
        reservation: DeviceReservation | None,
        split: Iterable[str],
        driver: str,
    ) -> CapacityModel:
        """``whole``: every node read, as (name, allocatable GPUs, reserved whole); ``published``: the
        reservation driver's devices per node; ``split``: the nodes the reservation splits (``split_nodes``
        and the nodes labelled split), of which the nodes reserved whole are not."""
        model = cls(driver, reservation)
        reserved_whole = set()
        for name, gpus, reserved in whole:
            node = NodeCapacity(name, False, RESERVED if reserved else SHARED)
            node.side(node.whole).capacity = gpus
            model.nodes[name] = node
            if reserved:
                reserved_whole.add(name)
        for name in sorted(set(split) - reserved_whole):
            node = model.nodes.get(name) or NodeCapacity(name, True, known=False)
            node.split = True
            node.sides = {}
            devices = published.get(name, ())
            for state in SIDES:
                node.side(state).capacity = gpus_in_state(devices, state, reservation)
            model.nodes[name] = node
        model._devices = {device.key: device for devices in published.values() for device in devices}
        model._published = {name: tuple(devices) for name, devices in published.items()}
        return model

    def clear_pods(self) -> None:
        """The pod list started over (expired continue token): forget what was counted."""
        self._counted.clear()
        self.held.clear()
        for node in self.nodes.values():
            for side in node.sides.values():
                side.holders.clear()

    def device(self, driver: str, pool: str, name: str) -> Device | None:
        """The reservation driver's device an allocation result names, None when it is not one."""
        return self._devices.get((pool, name)) if driver == self.driver else None

    def _node(self, name: str) -> NodeCapacity:
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = NodeCapacity(name, False, SHARED, known=False)
        return node

    def _new(self, gpus: Iterable[Gpu]) -> int:
        found = set(gpus) - self._counted
        self._counted |= found
        return len(found)

    def add_pod(
        self,
        holder: Holder,
        node: str,
        resource_gpus: int,
        claim_results: Sequence[tuple[str, str, str]] = (),
        extended_results: Sequence[tuple[str, str, str]] = (),
        gpu_by_result: Mapping[tuple[str, str, str], Gpu] | None = None,
    ) -> None:
        """A bound, unfinished pod: ``resource_gpus`` its GPU resources as kubelet counts them,
        ``claim_results`` the (driver, pool, device)s of the GPU drivers its own claims were allocated,
        ``extended_results`` those of the claim the scheduler made for its DRA extended resources (when
        there are any, they are what its extended resources got: counted instead of ``resource_gpus``).
        ``gpu_by_result``: the GPU of each published device (``PublishedDevices.gpus_by_result``)."""
        place = self._node(node)
        per_side: dict[str, list[Gpu]] = {}
        elsewhere: list[Gpu] = []
        for result in (*claim_results, *extended_results):
            device = self.device(*result)
            if device is not None:
                held = self.held.setdefault(holder.ref, [])
                if device not in held:
                    held.append(device)
            split = device is not None and device.node in self.nodes and self.nodes[device.node].split
            if device is not None and split and place.split:
                per_side.setdefault(device_state(device, self.reservation), []).append(gpu_of(device))
            else:
                elsewhere.append(gpu_of(device) if device is not None else _gpu(result, gpu_by_result))
        # The claim the scheduler made for DRA extended resources is what the request got: its GPUs count, not
        # the request's number (two partitions of one GPU are one GPU).
        resource_gpus = 0 if extended_results else resource_gpus
        own = resource_gpus + self._new(elsewhere)
        if place.split:
            for state in SIDES:
                if state in per_side:
                    place.side(state).holders.append((holder, self._new(per_side[state])))
            if own or not per_side:
                place.side(SHARED).holders.append((holder, own))
        else:
            place.side(place.whole).holders.append((holder, own))

    # -- questions -----------------------------------------------------------------------------------

    def holding(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        """The pods (namespace, name) holding each of the reservation driver's devices, by (pool, device)."""
        found: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for ref, devices in self.held.items():
            for device in devices:
                found.setdefault(device.key, []).append(ref)
        return found

    def gpu_views(self, node: str, holding: Container[tuple[str, str]] | None = None) -> list[GpuView]:
        """The GPUs ``node`` publishes (the reservation driver's), each with its side and the devices pods hold
        (``holding``: ``self.holding()``, computed once by a caller asking for many nodes)."""
        return gpu_views(
            self._published.get(node, ()), self.reservation, self.holding() if holding is None else holding
        )

    def split_names(self) -> list[str]:
        return sorted(name for name, node in self.nodes.items() if node.split)

    def pool_nodes(self, side: str) -> list[NodeCapacity]:
        """The nodes with GPUs on ``side``: the nodes reserved whole (with or without GPUs) or the shared
        nodes with GPUs, and every split node (it has GPUs on both sides; one our DeviceTaintRules name is
        split even when its Node is gone)."""
        return [
            node
            for _, node in sorted(self.nodes.items())
            if node.split or (node.known and node.whole == side and (side == RESERVED or node.side(side).capacity > 0))
        ]

    def sides(self, side: str) -> Iterable[Side]:
        """Every node's ``side`` that counts in the pool: the pool's nodes, and the pods of nodes that are
        not (a shared node without GPUs, a node not read) in the shared pool."""
        for _, node in sorted(self.nodes.items()):
            if side in node.sides and (node.split or node.whole == side):
                yield node.sides[side]

    def capacity(self, side: str) -> int:
        return sum(node.side(side).capacity for node in self.pool_nodes(side))

    def allocated(self, side: str) -> int:
        return sum(s.allocated for s in self.sides(side))

    def allocated_by_class(self, side: str, unclassified: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for found in self.sides(side):
            for name, gpus in found.allocated_by_class(unclassified).items():
                out[name] = out.get(name, 0) + gpus
        return dict(sorted(out.items()))

    def holders(self, side: str) -> list[tuple[Holder, int]]:
        return [entry for found in self.sides(side) for entry in found.holders]

    def free_without(self, node: str, side: str, leaving: Iterable[tuple[str, str]]) -> int:
        """GPUs free on ``node``'s ``side`` once the pods ``leaving`` (namespace, name) are gone."""
        found = self.nodes.get(node)
        if found is None or side not in found.sides:
            return 0
        gone = set(leaving)
        return found.sides[side].capacity - sum(g for h, g in found.sides[side].holders if h.ref not in gone)

    def fits(self, node: str, side: str, gpus: int, leaving: Iterable[tuple[str, str]] = ()) -> bool:
        return self.free_without(node, side, leaving) >= gpus


def _gpu(result: tuple[str, str, str], gpu_by_result: Mapping[tuple[str, str, str], Gpu] | None) -> Gpu:
    found = (gpu_by_result or {}).get(result)
    return found if found is not None else Gpu(result[0], result[1], f"{result[1]}/{result[2]}")
