"""The two DeviceClasses of device-level reservation, and the reservation they record.

Dynamic Resource Allocation reads a DeviceClass's CEL selectors at every allocation, and a class may be
edited at any time (``resource.k8s.io/v1`` DeviceClass: "mutable ... allocations are done once based on
whatever was set in classes at the time of allocation"): the classes are the live knob of the split,
and resizing it is editing them, with no node, kubelet, driver or control-plane restart.

- the **reserved** class (``reservedDevices.reservedClassName``) selects the driver's devices whose PCI
  bus ID (``resource.kubernetes.io/pciBusID``, the one stable per-device attribute AMD's driver publishes;
  partitions carry their GPU's) is one of the reserved ones: inference claims name it;
- the **shared** class (``reservedDevices.sharedClassName``) selects the others, and owns
  ``extendedResourceName`` (``amd.com/gpu``), so a pod asking for ``amd.com/gpu`` on a DRA node gets a
  shared device whatever its class;
- where the class that named ``extendedResourceName`` before ours admits less than every device of the
  driver (``narrows``: AMD's ``gpu.amd.com-spx``, whole GPUs only, under its AutoPartition gate), the name
  gets two classes of its own (``extended_class``), each its side's selector AND that class's selectors:
  the shared-side one owns the name, inference pods asking for it are rewritten to the reserved-side one's
  implicit name; the reserved and shared classes then keep every device of their side (claims steered to
  them keep their source class's selectors). The scheduler's claim for an extended resource names only the
  class (no selectors), so what the name admits can only be said by a class.

CEL selectors see a device's driver, attributes and capacity, not its node, pool or name: one set of
PCI bus IDs applies to every node of the driver. The reserved class carries the reservation itself
(``STATE_LABEL``, ``DEVICES_PER_NODE_ANNOTATION``, ``PCI_BUS_IDS_ANNOTATION``): ``pool`` reads it back,
the backstop ValidatingAdmissionPolicies take the class as their parameter (``reserved_devices.py``),
and the webhook's cache sees it. A release keeps both classes and widens them to every device of the
driver (``released``): deleting the class that owns ``amd.com/gpu`` would leave the name unmapped
instead of falling back to another class (kubernetes/kubernetes#141103, v1.36).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from webhook.core.claims import MANAGED_BY as MANAGED_BY
from webhook.core.claims import MANAGED_BY_LABEL as MANAGED_BY_LABEL
from webhook.core.claims import (
    MODE_CLASSES,
    MODE_TAINTS,
    PCI_DOMAIN,
    RESERVATION_ACTIVE,
    RESERVATION_LABEL,
    RESERVATION_MODE_ANNOTATION,
    RESERVATION_RELEASED,
)
from webhook.core.claims import PCI_BUS_ID_ATTRIBUTE as PCI_BUS_ID_ATTRIBUTE
from webhook.core.claims import pci_sort_key as pci_sort_key
from webhook.core.policy import Policy
from webhook.deploy.cel import quote, str_list

API_VERSION = "resource.k8s.io/v1"
STATE_LABEL = RESERVATION_LABEL
ACTIVE = RESERVATION_ACTIVE
RELEASED = RESERVATION_RELEASED
DEVICES_PER_NODE_ANNOTATION = "rocm-isolation.io/devices-per-node"
PCI_BUS_IDS_ANNOTATION = "rocm-isolation.io/reserved-pci-bus-ids"
ROLE_ANNOTATION = "rocm-isolation.io/role"
# The memory partition mode the classes pin while the reservation is active (AMD's AutoPartition: the mode
# is node-wide); written only when one is pinned, so classes written before it existed read as unpinned.
MEMORY_PARTITION_ANNOTATION = "rocm-isolation.io/memory-partition"
# The roles of the extended resource name's own classes (``extended_class``).
RESERVED_EXTENDED = "reserved-extended"
SHARED_EXTENDED = "shared-extended"
# The class whose selectors the shared class adds to its own because it took that class's
# extendedResourceName over (AMD's ``gpu.amd.com-spx``: whole GPUs only); '' when none.
INHERITED_FROM_ANNOTATION = "rocm-isolation.io/extended-resource-inherited-from"
# A device without the attribute is never reserved (and never fails the selector: an unknown attribute
# is an evaluation error that aborts the allocation, so it is tested with has() first).
_PCI = f"device.attributes[{quote(PCI_DOMAIN)}].pciBusID"


def memory_selector(driver: str, memory_partition: str) -> str:
    """CEL: a device without AMD's ``memoryPartition`` attribute, or of that memory partition mode."""
    attribute = f"device.attributes[{quote(driver)}].memoryPartition"
    return f"!has({attribute}) || {attribute} == {quote(memory_partition)}"


@dataclass(frozen=True)
class Inherited:
    """The class that named the shared class's extendedResourceName before it (the newest other class
    naming it), and its CEL selectors: the shared class ANDs them to its own, so that the extended
    resource keeps admitting only what that class admitted (AMD's ``gpu.amd.com-spx``: whole GPUs)."""

    name: str
    selectors: tuple[str, ...]


@dataclass(frozen=True)
class DeviceReservation:
    """What is reserved: the N GPUs with the lowest PCI bus IDs of each node, as the PCI bus IDs the
    classes select (the same on every node: CEL cannot see the node). ``by_taints``: DeviceTaintRules
    hold the reservation (the reserved devices of the chosen nodes, by name); the reserved class selects
    the union of their PCI bus IDs (where inference looks) and the shared class every device."""

    devices_per_node: int
    pci_bus_ids: tuple[str, ...]
    by_taints: bool = False
    # With taints: the reserved devices as (pool, device), read from our DeviceTaintRules (the class does
    # not record them: ``pool`` and the audit add them, ``with_tainted``).
    tainted: frozenset[tuple[str, str]] = frozenset()
    # The memory partition mode ``pool`` pinned (reservedDevices.memoryPartition, or the one it chose on
    # devices publishing several: ops/devices/memory_mode.py); "" when none. Recorded in the reserved class, so the
    # pin stays the same for every later reader (status, audit, the lending keeper, the next apply).
    memory_partition: str = ""

    @property
    def active(self) -> bool:
        return self.devices_per_node > 0 and bool(self.pci_bus_ids)


RELEASED_RESERVATION = DeviceReservation(0, ())


def reserved_selector(driver: str, reservation: DeviceReservation) -> str:
    """CEL: a device of ``driver`` whose PCI bus ID is reserved (every device of it once released)."""
    own = f"device.driver == {quote(driver)}"
    if not reservation.active:
        return own
    return f"{own} && has({_PCI}) && {_PCI} in {str_list(list(reservation.pci_bus_ids))}"


def shared_selector(driver: str, reservation: DeviceReservation) -> str:
    """CEL: a device of ``driver`` that is not reserved (every device of it once released, or when taints
    keep the reserved ones out)."""
    own = f"device.driver == {quote(driver)}"
    if not reservation.active or reservation.by_taints:
        return own
    return f"{own} && !(has({_PCI}) && {_PCI} in {str_list(list(reservation.pci_bus_ids))})"


def _metadata(name: str, role: str, reservation: DeviceReservation) -> dict[str, Any]:
    annotations = {
        ROLE_ANNOTATION: role,
        DEVICES_PER_NODE_ANNOTATION: str(reservation.devices_per_node),
        PCI_BUS_IDS_ANNOTATION: ",".join(reservation.pci_bus_ids),
        RESERVATION_MODE_ANNOTATION: MODE_TAINTS if reservation.by_taints else MODE_CLASSES,
    }
    if reservation.active and reservation.memory_partition:
        annotations[MEMORY_PARTITION_ANNOTATION] = reservation.memory_partition
    return {
        "name": name,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, STATE_LABEL: ACTIVE if reservation.active else RELEASED},
        "annotations": annotations,
    }


def pinned_memory_partition(policy: Policy, reservation: DeviceReservation | None) -> str:
    """The memory partition mode the classes select while ``reservation`` is active: the policy's
    (reservedDevices.memoryPartition: an explicit pin wins, a changed one is rewritten by the next apply),
    else the one the reservation records; "" when none (or no active reservation)."""
    if reservation is None or not reservation.active:
        return ""
    return policy.spec.reserved_devices.memory_partition or reservation.memory_partition


def _selectors(expression: str, policy: Policy, reservation: DeviceReservation) -> list[dict[str, Any]]:
    """The class's own selector, and the pinned memory partition mode while a reservation is active."""
    devices = policy.spec.reserved_devices
    found = [{"cel": {"expression": expression}}]
    mode = pinned_memory_partition(policy, reservation)
    if mode:
        found.append({"cel": {"expression": memory_selector(devices.driver, mode)}})
    return found


def reserved_class(policy: Policy, reservation: DeviceReservation) -> dict[str, Any]:
    devices = policy.spec.reserved_devices
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": _metadata(devices.reserved_class_name, "reserved", reservation),
        "spec": {"selectors": _selectors(reserved_selector(devices.driver, reservation), policy, reservation)},
    }


def narrows(driver: str, inherited: Inherited | None) -> bool:
    """Whether the class the extended resource name is taken over from admits less than every device of
    ``driver``: a selector of it other than ``device.driver == '<driver>'`` (AMD's ``gpu.amd.com-spx``:
    whole GPUs only). Then the name gets classes of its own (``extended_class``), and the reserved and shared
    classes keep every device of their side (claims steered to them keep their source class's selectors)."""
    if inherited is None:
        return False
    plain = {f"device.driver == {quote(driver)}", f'device.driver == "{driver}"', f"device.driver=={quote(driver)}"}
    return any(" ".join(s.split()) not in plain for s in inherited.selectors if s.strip())


def _inherit(selectors: list[dict[str, Any]], inherited: Inherited | None) -> list[dict[str, Any]]:
    """``selectors`` followed by those of ``inherited`` they lack."""
    if inherited is None:
        return selectors
    own = {selector["cel"]["expression"] for selector in selectors}
    return selectors + [{"cel": {"expression": e}} for e in dict.fromkeys(inherited.selectors) if e not in own]


def shared_class(
    policy: Policy, reservation: DeviceReservation, inherited: Inherited | None = None, *, extended: bool = False
) -> dict[str, Any]:
    """The shared class; ``inherited``: the class whose extendedResourceName it takes over, whose
    selectors it ANDs to its own (recorded in ``INHERITED_FROM_ANNOTATION``), kept after a release too, so
    that the name admits then exactly what that class admitted. ``extended``: the name has classes of its
    own (``extended_class``): the shared class names no extended resource and keeps every device of its side."""
    devices = policy.spec.reserved_devices
    selectors = _selectors(shared_selector(devices.driver, reservation), policy, reservation)
    metadata = _metadata(devices.shared_class_name, "shared", reservation)
    spec: dict[str, Any] = {"selectors": selectors}
    if devices.extended_resource_name:
        # '' once the name has classes of its own (an apply replaces the annotations it wrote before).
        metadata["annotations"][INHERITED_FROM_ANNOTATION] = "" if inherited is None or extended else inherited.name
    if devices.extended_resource_name and not extended:
        spec["selectors"] = _inherit(selectors, inherited)
        spec["extendedResourceName"] = devices.extended_resource_name
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": metadata, "spec": spec}


def extended_class(
    policy: Policy, reservation: DeviceReservation, role: str, inherited: Inherited | None
) -> dict[str, Any]:
    """The class of the extended resource name on one side (``role``: ``reserved-extended``, the reserved
    side, or ``shared-extended``, which owns ``extendedResourceName``): the side's selectors AND those of
    ``inherited`` (the class the name was taken over from), so that ``amd.com/gpu`` admits on each side
    exactly what that class admitted (AMD's ``gpu.amd.com-spx``: whole GPUs). Inference pods asking for the
    name are rewritten to the reserved one's implicit name (``deviceclass.resource.kubernetes.io/<name>``)."""
    devices = policy.spec.reserved_devices
    if role == RESERVED_EXTENDED:
        name, own = devices.reserved_extended_class_name, reserved_selector(devices.driver, reservation)
    else:
        name, own = devices.shared_extended_class_name, shared_selector(devices.driver, reservation)
    metadata = _metadata(name, role, reservation)
    metadata["annotations"][INHERITED_FROM_ANNOTATION] = inherited.name if inherited is not None else ""
    spec: dict[str, Any] = {"selectors": _inherit(_selectors(own, policy, reservation), inherited)}
    if role == SHARED_EXTENDED:
        spec["extendedResourceName"] = devices.extended_resource_name
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": metadata, "spec": spec}


def classes(
    policy: Policy, reservation: DeviceReservation, inherited: Inherited | None = None, *, extended: bool = False
) -> list[dict[str, Any]]:
    """Every class, in the order ``pool`` writes them: the reserved side's before the shared side's (a shared
    class that stops selecting a device is never written before the reserved class starts to), and with
    ``extended`` (the name's own classes: ``narrows``) the shared class, which stops naming the extended
    resource, before the class that owns it then (an update that removes the name from a class drops the
    scheduler's mapping of it; the owner's write maps it again)."""
    found = [reserved_class(policy, reservation)]
    if extended:
        found.append(extended_class(policy, reservation, RESERVED_EXTENDED, inherited))
    found.append(shared_class(policy, reservation, inherited, extended=extended))
    if extended:
        found.append(extended_class(policy, reservation, SHARED_EXTENDED, inherited))
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def reservation_of(device_class: Mapping[str, Any] | None) -> DeviceReservation | None:
    """The reservation a reserved class written by ``pool`` records; None when it is not one of ours
    (absent, or not labelled by us), ``RELEASED_RESERVATION`` once released."""
    if not isinstance(device_class, Mapping):
        return None
    metadata = device_class.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return None
    if labels.get(STATE_LABEL) != ACTIVE:
        return RELEASED_RESERVATION
    try:
        count = int(str(annotations.get(DEVICES_PER_NODE_ANNOTATION, "0")))
    except ValueError:
        count = 0
    ids = tuple(part for part in str(annotations.get(PCI_BUS_IDS_ANNOTATION, "")).split(",") if part)
    by_taints = annotations.get(RESERVATION_MODE_ANNOTATION) == MODE_TAINTS
    memory = str(annotations.get(MEMORY_PARTITION_ANNOTATION, ""))
    if count > 0 and ids:
        return DeviceReservation(count, ids, by_taints, memory_partition=memory)
    return RELEASED_RESERVATION


def with_tainted(reservation: DeviceReservation, tainted: Iterable[tuple[str, str]]) -> DeviceReservation:
    """The reservation with the devices our DeviceTaintRules taint (only when taints hold it)."""
    if not reservation.by_taints:
        return reservation
    return replace(reservation, tainted=frozenset(tainted))


def reservation_for(
    reserved_ids: Iterable[str],
    devices_per_node: int,
    *,
    tainted: Iterable[tuple[str, str]] | None = None,
) -> DeviceReservation:
    """The reservation of these PCI bus IDs, in ROCm's order; ``tainted`` (pool, device): held by taints."""
    ids = tuple(sorted(set(reserved_ids), key=pci_sort_key))
    if tainted is None:
        return DeviceReservation(devices_per_node, ids)
    return DeviceReservation(devices_per_node, ids, True, frozenset(tainted))


LENDING_ANNOTATION = "rocm-isolation.io/lending"
LENDING_OPEN = "open"
LENDING_CLOSED = "closed"
# A selector no device passes: the lendable class while nothing may be lent.
NOTHING = "false"


def lendable_class(policy: Policy, reservation: DeviceReservation, *, open_: bool) -> dict[str, Any]:
    """The lendable class (``reservedDevices.lendableClassName``), which a borrower's claim asks for after
    the shared one: the reserved class's selectors while lending is open, a selector no device passes while
    it is closed. Written by the lending keeper of ``serve`` (``service/device_lending.py``), never by
    ``pool``: it opens and closes it each round. Lends nothing while the reservation is released or held by
    DeviceTaintRules (a borrower would need the reserved-device toleration that no training claim may carry)."""
    devices = policy.spec.reserved_devices
    lent = open_ and reservation.active and not reservation.by_taints
    selectors = (
        _selectors(reserved_selector(devices.driver, reservation), policy, reservation)
        if lent
        else [{"cel": {"expression": NOTHING}}]
    )
    metadata = _metadata(devices.lendable_class_name, "lendable", reservation)
    metadata["annotations"][LENDING_ANNOTATION] = LENDING_OPEN if lent else LENDING_CLOSED
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": metadata, "spec": {"selectors": selectors}}
