"""Device-level reservation as data: the devices a DRA driver publishes per node, which of them the split
reserves, what the two DeviceClasses must say, which pods hold which devices, and the plan.

Pure: ``pool.py`` reads ResourceSlices, ResourceClaims and DeviceClasses and passes them in raw, with the
nodes and pods as ``PoolNode``/``PoolPod``; nothing here does I/O, so every choice is tested without a
cluster. The classes themselves are rendered by ``webhook.deploy.device_classes``.

Why the split nodes are labelled. The inference class is placed (required node affinity) on nodes whose
reserved-nodes label key (``rocm-isolation.io/pool``) says either the whole-node value (``inference``) or
``reservedDevices.nodeLabelValue`` (``inference-devices``): ``apply`` gives every split node that value,
``release --devices`` takes it away. No taint: every other class still uses the split nodes' shared devices.

Why every node at once. The classes split the devices with CEL selectors, and CEL sees a device's driver,
attributes and capacity, not its node, pool or name (resource.k8s.io/v1 ``CELDeviceSelector``): the
reserved set is one list of PCI bus IDs, applied on every node that publishes the driver's devices. Each
node wants its N GPUs with the lowest PCI bus IDs (ROCm's enumeration order); the classes select the union
of those IDs, so a node whose GPUs sit in other PCI slots than its neighbours' gets more than N reserved.
Selecting devices of some nodes only needs DeviceTaintRules (driver, pool and device by name), which this
version does not write.

Why the newest class. The scheduler maps an ``extendedResourceName`` (``amd.com/gpu``) to one DeviceClass:
when several name it, the newest (``creationTimestamp``), then the lower name on a tie
(k8s.io/dynamic-resource-allocation ``extendedresourcecache.updateResourceName2class``, v1.36). AMD's
chart ships ``gpu.amd.com`` naming ``amd.com/gpu``; our shared class must be the one that wins, or
``amd.com/gpu`` pods on DRA nodes may get reserved devices.

Why the shared class records the other classes that name its extended resource
(``ALSO_NAMED_BY_ANNOTATION``). In v1.36, an update that removes the name from a class, or the deletion of
a class naming it, deletes the scheduler's mapping of that name, whichever class it pointed to; an update
event of the class that still names it maps it again. Recording the others makes ``pool apply`` rewrite
the shared class (one update event) exactly when that list changed, and write nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.cluster.inventory import parse_time, reserved_for
from webhook.cluster.slices import device_fields, keep_newest, pool_generation
from webhook.core.claims import (
    MODE_CLASSES,
    MODE_TAINTS,
    RESERVED_DEVICE_TAINT_EFFECT,
    RESERVED_DEVICE_TAINT_KEY,
    MalformedClaim,
    allocated_results,
)
from webhook.core.policy import Policy
from webhook.deploy import device_classes, device_taint_rules
from webhook.deploy.device_classes import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PCI_BUS_ID_ATTRIBUTE,
    RELEASED_RESERVATION,
    DeviceReservation,
    pci_sort_key,
    reservation_for,
    reservation_of,
    with_tainted,
)
from webhook.deploy.device_taint_rules import TaintedDevice
from webhook.ops.reservation import PoolNode, PoolPod, Reservation, SelectionError, columns, plural

ALSO_NAMED_BY_ANNOTATION = "rocm-isolation.io/extended-resource-also-named-by"
TAINT_TEXT = f"{RESERVED_DEVICE_TAINT_KEY}:{RESERVED_DEVICE_TAINT_EFFECT}"
RESERVED, SHARED, UNRESERVED = "reserved", "shared", "unreserved"
DEVICE_PLUGIN_PREFIX = "amd.com/"
DOCS = 'docs/operations.md, "Device-level reservation"'


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# --- the devices a driver publishes ------------------------------------------------------------------


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


def split(
    published: Mapping[str, Sequence[Device]],
    devices_per_node: int,
    chosen: Iterable[str] | None = None,
    *,
    by_taints: bool = False,
) -> tuple[DeviceReservation, dict[str, tuple[str, ...]]]:
    """The reservation the classes will record (the union of the chosen nodes' N lowest PCI bus IDs; every
    node when none are chosen), and what each chosen node wanted for itself. ``by_taints``: those devices
    of the chosen nodes are tainted, exactly (``TaintedDevice``), and no other."""
    names = sorted(published) if chosen is None else sorted(set(chosen) & set(published))
    wanted = {node: gpu_ids(published[node])[:devices_per_node] for node in names}
    ids = (i for found in wanted.values() for i in found)
    if not by_taints:
        return reservation_for(ids, devices_per_node), wanted
    return reservation_for(ids, devices_per_node, tainted={d.key for d in tainted_devices(published, wanted)}), wanted


def tainted_devices(
    published: Mapping[str, Sequence[Device]], wanted: Mapping[str, Sequence[str]]
) -> list[TaintedDevice]:
    """Every device of a chosen node whose PCI bus ID the node wants reserved (partitions share theirs)."""
    return [
        TaintedDevice(node, d.pool, d.name, d.pci_bus_id)
        for node, ids in sorted(wanted.items())
        for d in published.get(node, ())
        if d.pci_bus_id and d.pci_bus_id in ids
    ]


def slots_differ(published: Mapping[str, Sequence[Device]], wanted: Mapping[str, Sequence[str]]) -> list[str]:
    """The chosen nodes on which the union of the wanted PCI bus IDs reserves more than the node wants
    (its GPUs sit in other PCI slots than its neighbours')."""
    union = {i for ids in wanted.values() for i in ids}
    return sorted(node for node, ids in wanted.items() if (set(gpu_ids(published.get(node, ()))) & union) - set(ids))


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


def split_label(policy: Policy) -> tuple[str, str]:
    """The label of a split node: the reserved-nodes key with ``reservedDevices.nodeLabelValue``."""
    return policy.spec.reserved_nodes.label[0], policy.spec.reserved_devices.node_label_value


def split_label_patch(node: PoolNode, label: tuple[str, str]) -> dict[str, Any] | None:
    """The merge patch that labels a split node (our label key only, ``resourceVersion`` as read), or None."""
    key, value = label
    if node.labels.get(key) == value:
        return None
    return {"metadata": {"labels": {key: value}, "resourceVersion": node.resource_version}}


def unsplit_label_patch(node: PoolNode, label: tuple[str, str]) -> dict[str, Any] | None:
    """The merge patch that removes the split label (only that value: a whole-node label is not ours to
    remove here), or None."""
    key, value = label
    if node.labels.get(key) != value:
        return None
    return {"metadata": {"labels": {key: None}, "resourceVersion": node.resource_version}}


def split_labelled(node: PoolNode, reservation: Reservation, split_value: str) -> bool:
    """The node carries the split label (and no taint with our key): split, not reserved whole. Whole-node
    ``release`` and ``status`` leave it to the device reservation."""
    key, _ = reservation.label
    return node.labels.get(key) == split_value and not any(reservation.has_our_key(t) for t in node.taints)


def label_action(node: PoolNode | None, label: tuple[str, str], *, release: bool) -> str:
    """add, replace (another value of our key), keep; remove or none on a release; "-" without a Node."""
    if node is None:
        return "-"
    key, value = label
    current = node.labels.get(key)
    if release:
        return "remove" if current == value else "none"
    return "keep" if current == value else "add" if current is None else "replace"


# --- which nodes -------------------------------------------------------------------------------------


class SubsetError(SelectionError):
    """Some of the driver's nodes were asked for, not all: CEL cannot say which node (``subset_message``)."""

    def __init__(self, option: str, chosen: Sequence[str], every: Sequence[str], driver: str) -> None:
        self.option, self.chosen, self.every, self.driver = option, tuple(chosen), tuple(every), driver
        super().__init__(subset_message(self, "whether the cluster serves them was not read"))


# The first Kubernetes 1.36 patch release whose kube-scheduler does not panic on a DeviceTaintRule: v1.36.0
# to v1.36.2 assert the rules of their v1beta2 informer as v1alpha3 (resourceslice/tracker.go ``typedSlice``)
# at every ResourceSlice or DeviceClass event once one exists ("interface conversion: interface {} is
# *v1beta2.DeviceTaintRule, not *v1alpha3.DeviceTaintRule", seen on v1.36.2: the scheduler exits);
# kubernetes/kubernetes#139651, cherry-picked to release-1.36 as #139681 (2026-06-12).
SCHEDULER_FIXED_1_36 = (1, 36, 3)
PANIC_ISSUE = "kubernetes/kubernetes#139651"


def version_text(version: tuple[int, int, int]) -> str:
    return "v" + ".".join(str(part) for part in version)


def taint_rules_unusable(
    versions: Sequence[str] | None, server: tuple[int, int, int] | None, *, opted_in: bool
) -> str | None:
    """Why DeviceTaintRules may not hold a split on this cluster, or None when they may: served as v1
    (1.37, GA: every component honours them); as v1beta2 only with ``--device-taint-rules`` (1.36: the
    DRADeviceTaintRules gate must be on in kube-scheduler and kube-controller-manager too, which the API
    cannot show) and from ``SCHEDULER_FIXED_1_36`` on (earlier schedulers panic)."""
    if versions is None:
        return "whether this cluster serves devicetaintrules could not be read (API discovery of resource.k8s.io)"
    if not versions:
        return "this cluster serves no devicetaintrules (API discovery of resource.k8s.io)"
    if "v1" in versions:
        return None
    served = "this cluster serves devicetaintrules in resource.k8s.io/v1beta2"
    if server is not None and server[:2] == (1, 36) and server < SCHEDULER_FIXED_1_36:
        return (
            f"{served}, but its kube-apiserver is {version_text(server)}, and the kube-scheduler of v1.36.0 to "
            f"v1.36.2 panics as soon as a DeviceTaintRule exists and a ResourceSlice or DeviceClass changes "
            f"({PANIC_ISSUE}; seen on v1.36.2): upgrade the control plane to {version_text(SCHEDULER_FIXED_1_36)} "
            "or later"
        )
    if not opted_in:
        return (
            f"{served}: if the DRADeviceTaintRules feature gate is on in kube-apiserver, kube-scheduler and "
            "kube-controller-manager (the API cannot show the scheduler's; with it off, the scheduler ignores the "
            "rules and other classes would get the reserved devices) and kube-scheduler is at least "
            f"{version_text(SCHEDULER_FIXED_1_36)} ({PANIC_ISSUE}), add --device-taint-rules"
        )
    if server is None:
        return f"{served}, but the kube-apiserver's version could not be read (GET /version)"
    return None


def subset_message(err: SubsetError, why_not: str) -> str:
    """Why a subset of the driver's nodes cannot be split, and what could do it (``why_not``: why the
    cluster's DeviceTaintRules may not be used, ``taint_rules_unusable``)."""
    left = [n for n in err.every if n not in err.chosen]
    served = why_not
    return (
        f"{err.option}: device-level reservation splits every node that publishes {err.driver} devices, not some: "
        f"{', '.join(left)} also publish{'es' if len(left) == 1 else ''} them. The DeviceClasses select devices "
        "with CEL, which sees a device's driver, attributes and capacity but not its node, so the same PCI bus IDs "
        "are reserved on every node. Splitting some nodes only would need DeviceTaintRules (they select driver, "
        "pool and device by name): resource.k8s.io/v1beta2 in Kubernetes 1.36 with the DRADeviceTaintRules "
        f"feature gate, v1 in 1.37; {served}. Otherwise split every node "
        f"(leave out --nodes/--selector), or reserve whole nodes with pool apply --nodes "
        "(without --devices-per-node) while no device reservation is active"
    )


def dra_nodes_whole(
    nodes: Sequence[PoolNode], published: Mapping[str, Sequence[Device]], reservation: Reservation
) -> list[str]:
    """The driver's nodes that are reserved whole (the reserved label, or a taint with our key)."""
    return sorted(
        n.name
        for n in nodes
        if n.name in published and (n.labelled(reservation) or any(reservation.has_our_key(t) for t in n.taints))
    )


def choose_device_nodes(
    nodes: Sequence[PoolNode],
    published: Mapping[str, Sequence[Device]],
    plugin_gpus: Mapping[str, int],
    reservation: Reservation,
    driver: str,
    *,
    names: Sequence[str] | None = None,
    selector: Mapping[str, str] | None = None,
    allow_subset: bool = False,
) -> tuple[str, ...]:
    """The nodes to split: every node publishing the driver's devices. ``--nodes``/``--selector`` must name
    exactly those (SubsetError otherwise) unless ``allow_subset`` (DeviceTaintRules: any of them); a chosen
    node that serves GPUs through the device plugin only, or one reserved whole, is refused
    (SelectionError: exit 2, nothing changed)."""
    every = tuple(sorted(published))
    known = {n.name for n in nodes} | set(every)
    if names is not None:
        unknown = [name for name in names if name not in known]
        if unknown:
            raise SelectionError(f"node{'s' if len(unknown) > 1 else ''} not found: {', '.join(unknown)}")
        chosen, option = list(names), f"--nodes {','.join(names)}"
    elif selector is not None:
        option = f"--selector {','.join(f'{k}={v}' for k, v in selector.items())}"
        chosen = [n.name for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]
        chosen = [name for name in chosen if name in published or plugin_gpus.get(name, 0) > 0]
        if not chosen:
            raise SelectionError(f"no node with GPUs matches {option}")
    else:
        chosen, option = list(every), ""
    plugin = [name for name in chosen if name not in published and plugin_gpus.get(name, 0) > 0]
    if plugin:
        raise SelectionError(
            f"node{'s' if len(plugin) > 1 else ''} {', '.join(plugin)} serve{'s' if len(plugin) == 1 else ''} "
            f"GPUs through the device plugin ({DEVICE_PLUGIN_PREFIX}* allocatable) and publish{'es' if len(plugin) == 1 else ''} "
            f"no {driver} devices: device-level reservation needs AMD's DRA driver, because the device plugin "
            "cannot choose devices per pod (kubelet's GetPreferredAllocation carries no pod). Move the node to the "
            f"DRA driver ({DOCS}), or reserve it whole (pool apply --nodes NAME)"
        )
    bare = [name for name in chosen if name not in published]
    if bare:
        raise SelectionError(f"{', '.join(bare)}: no {driver} devices in its ResourceSlices")
    if not every:
        raise SelectionError(
            f"no node publishes {driver} devices in its ResourceSlices: device-level reservation needs AMD's DRA "
            f"driver ({DOCS})"
        )
    subset = bool(option) and set(chosen) != set(every)
    if subset and not allow_subset:
        raise SubsetError(option, chosen, every, driver)
    picked = tuple(sorted(set(chosen))) if subset else every
    whole = dra_nodes_whole(nodes, {name: published[name] for name in picked}, reservation)
    if whole:
        raise SelectionError(
            f"{', '.join(whole)} {'is' if len(whole) == 1 else 'are'} reserved whole (label {reservation.label_text} "
            f"or taint {reservation.taint_text}) and publish{'es' if len(whole) == 1 else ''} {driver} devices: "
            "a node is reserved whole or split, never both"
            + ("" if subset else ", and without DeviceTaintRules the split applies to every node of the driver")
            + ". "
            f"Release {'it' if len(whole) == 1 else 'them'} first: pool release --nodes {','.join(whole)}"
        )
    return picked


# --- the DeviceClasses -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassInfo:
    """What the plan needs of a DeviceClass."""

    name: str
    ours: bool  # labelled app.kubernetes.io/managed-by: rocm-isolation-webhook
    created: str  # creationTimestamp as read
    extended_resource_name: str
    raw: Mapping[str, Any]

    @property
    def created_seconds(self) -> float:
        parsed = parse_time(self.created)
        return parsed.timestamp() if parsed is not None else float("-inf")


def class_info(obj: Mapping[str, Any]) -> ClassInfo:
    metadata = _mapping(obj.get("metadata"))
    return ClassInfo(
        name=_text(metadata.get("name")),
        ours=_mapping(metadata.get("labels")).get(MANAGED_BY_LABEL) == MANAGED_BY,
        created=_text(metadata.get("creationTimestamp")),
        extended_resource_name=_text(_mapping(obj.get("spec")).get("extendedResourceName")),
        raw=obj,
    )


def class_infos(objects: Iterable[Mapping[str, Any]]) -> dict[str, ClassInfo]:
    found = (class_info(obj) for obj in objects)
    return {info.name: info for info in found if info.name}


def winner(claimants: Iterable[ClassInfo]) -> ClassInfo | None:
    """The class the scheduler maps an extended resource name to: the newest, the lower name on a tie."""
    return min(claimants, key=lambda c: (-c.created_seconds, c.name), default=None)


@dataclass(frozen=True)
class Ownership:
    """Who maps the policy's extendedResourceName, and whether ``apply`` must re-create our shared class."""

    name: str  # the extended resource name ("" when the policy sets none)
    shared_class: str
    others: tuple[ClassInfo, ...]  # the other classes naming it, newest first
    owner_now: ClassInfo | None
    recreate: bool  # ours exists, names it (or will) and loses to another class: delete and re-create

    @property
    def others_text(self) -> str:
        return ",".join(sorted(c.name for c in self.others))


def ownership(policy: Policy, classes: Mapping[str, ClassInfo]) -> Ownership:
    devices = policy.spec.reserved_devices
    name, shared = devices.extended_resource_name, devices.shared_class_name
    if not name:
        return Ownership("", shared, (), None, False)
    others = tuple(
        sorted(
            (c for c in classes.values() if c.name != shared and c.extended_resource_name == name),
            key=lambda c: (-c.created_seconds, c.name),
        )
    )
    ours = classes.get(shared)
    current = [*others, ours] if ours is not None and ours.extended_resource_name == name else list(others)
    owner_now = winner(current)
    recreate = False
    if ours is not None and ours.ours and others:
        after = winner([*others, ClassInfo(ours.name, True, ours.created, name, ours.raw)])
        recreate = after is not None and after.name != shared
    return Ownership(name, shared, others, owner_now, recreate)


def inherited(owner: Ownership) -> device_classes.Inherited | None:
    """The class whose extendedResourceName the shared class takes over: the newest other class naming
    it that is not ours (AMD's ``gpu.amd.com-spx``), with its CEL selectors; None when there is none.
    Read from the cluster at every apply and release (that class keeps naming the name, older than
    ours), so re-applying is idempotent and a release keeps what it admits."""
    for info in owner.others:
        if info.ours:
            continue
        selectors = tuple(
            str(_mapping(_mapping(selector).get("cel")).get("expression", ""))
            for selector in _items(_mapping(info.raw.get("spec")).get("selectors"))
        )
        return device_classes.Inherited(info.name, tuple(s for s in selectors if s))
    return None


def desired_classes(policy: Policy, reservation: DeviceReservation, owner: Ownership) -> list[dict[str, Any]]:
    """Both classes as ``device_classes`` renders them, the shared one recording the other classes that
    name its extended resource (see the module docstring); reserved first (the order they are written)."""
    reserved, shared = device_classes.classes(policy, reservation, inherited(owner))
    if owner.name:
        shared["metadata"]["annotations"][ALSO_NAMED_BY_ANNOTATION] = owner.others_text
    return [reserved, shared]


def replace_body(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The PUT body that makes ``current`` say what ``desired`` says (our labels, annotations, selectors and
    extendedResourceName; everything else of it kept, ``resourceVersion`` as read: 409 when it changed), or
    None when it already does."""
    metadata = dict(_mapping(current.get("metadata")))
    want_meta = _mapping(desired.get("metadata"))
    labels = {**_mapping(metadata.get("labels")), **_mapping(want_meta.get("labels"))}
    annotations = {**_mapping(metadata.get("annotations")), **_mapping(want_meta.get("annotations"))}
    spec = dict(_mapping(current.get("spec")))
    want_spec = _mapping(desired.get("spec"))
    spec["selectors"] = want_spec.get("selectors")
    if "extendedResourceName" in want_spec:
        spec["extendedResourceName"] = want_spec["extendedResourceName"]
    else:
        spec.pop("extendedResourceName", None)
    if (
        labels == _mapping(metadata.get("labels"))
        and annotations == _mapping(metadata.get("annotations"))
        and spec == _mapping(current.get("spec"))
    ):
        return None
    metadata.pop("managedFields", None)  # absent from an update: the apiserver keeps them
    metadata["labels"], metadata["annotations"] = labels, annotations
    return {"apiVersion": device_classes.API_VERSION, "kind": "DeviceClass", "metadata": metadata, "spec": spec}


def foreign_class_error(name: str, role: str) -> SelectionError:
    return SelectionError(
        f"deviceclass/{name} exists and is not managed by rocm-isolation-webhook (label "
        f"{MANAGED_BY_LABEL}={MANAGED_BY}): pool never edits a class that is not its own. Name another "
        f"{role} class in the policy (reservedDevices.{role}ClassName), or delete that class if it is a leftover"
    )


@dataclass(frozen=True)
class ClassChange:
    name: str
    role: str  # reserved, shared
    action: str  # create, replace, unchanged, recreate
    desired: dict[str, Any]
    current: Mapping[str, Any] | None


def class_changes(
    policy: Policy,
    reservation: DeviceReservation,
    classes: Mapping[str, ClassInfo],
    owner: Ownership,
    *,
    ensure_owner: bool = True,
) -> tuple[ClassChange, ClassChange]:
    """What writing the classes does (``ensure_owner``: re-create the shared class when another class
    wins its extended resource name); SelectionError when a class of that name is not ours."""
    reserved, shared = desired_classes(policy, reservation, owner)
    changes = []
    for role, desired in (("reserved", reserved), ("shared", shared)):
        name = desired["metadata"]["name"]
        info = classes.get(name)
        if info is None:
            action = "create"
        elif not info.ours:
            raise foreign_class_error(name, role)
        elif role == "shared" and owner.recreate and ensure_owner:
            action = "recreate"
        else:
            action = "unchanged" if replace_body(info.raw, desired) is None else "replace"
        changes.append(ClassChange(name, role, action, desired, info.raw if info is not None else None))
    return changes[0], changes[1]


def current_reservation(policy: Policy, classes: Mapping[str, ClassInfo]) -> DeviceReservation | None:
    """The reservation our reserved class records; None when it does not exist (or is not ours)."""
    info = classes.get(policy.spec.reserved_devices.reserved_class_name)
    return reservation_of(info.raw) if info is not None else None


# --- who holds which device --------------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """A pod and the driver's devices it holds (the allocations of the claims reserved for it)."""

    pod: PoolPod
    devices: tuple[Device, ...]


def holds(
    claims: Iterable[Mapping[str, Any]],
    driver: str,
    published: Mapping[str, Sequence[Device]],
    pods: Iterable[PoolPod],
    uids: Mapping[tuple[str, str], str] | None = None,
) -> tuple[list[Hold], list[str]]:
    """Which pod holds which device: a claim's allocated devices (``claims.allocated_results``) are held by
    the pods it is reserved for (``inventory.reserved_for``), as the audit reads them. Also, notes about claims reserved for
    pods that are not among the running pods read (finished or deleted meanwhile)."""
    by_key = {d.key: d for devices in published.values() for d in devices}
    by_ref = {(p.namespace, p.name): p for p in pods}
    held: dict[tuple[str, str], dict[tuple[str, str], Device]] = {}
    notes: list[str] = []
    for claim in claims:
        metadata = _mapping(claim.get("metadata"))
        namespace, claim_name = _text(metadata.get("namespace")), _text(metadata.get("name"))
        try:
            results = allocated_results(claim)
        except MalformedClaim:
            continue
        devices = [by_key[(pool, name)] for on, pool, name in results if on == driver and (pool, name) in by_key]
        if not devices:
            continue
        for pod_name, uid in reserved_for(claim):
            pod_ref = (namespace, pod_name)
            pod = by_ref.get(pod_ref)
            if pod is None or (uids is not None and uid and uids.get(pod_ref, uid) != uid):
                notes.append(
                    f"resourceclaim/{claim_name} -n {namespace} is reserved for pod {pod_name}, which is not "
                    "among the running pods read (finished or deleted meanwhile)"
                )
                continue
            for device in devices:
                held.setdefault(pod_ref, {})[device.key] = device
    out = [Hold(by_ref[ref], tuple(sorted(found.values(), key=_device_order))) for ref, found in held.items()]
    out.sort(key=lambda h: (h.devices[0].node, h.pod.namespace, h.pod.name))
    return out, notes


# --- the DeviceTaintRules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleChange:
    name: str
    action: str  # create, replace, unchanged, delete
    device: TaintedDevice
    desired: dict[str, Any] | None  # None: delete
    current: Mapping[str, Any] | None


def rule_changes(
    policy: Policy, devices: Sequence[TaintedDevice], rules: Iterable[Mapping[str, Any]], version: str | None
) -> tuple[RuleChange, ...]:
    """What writing the rules does: one rule per device to taint (created, or replaced when it says
    something else), and our rules for other devices deleted. SelectionError when a rule of our name is
    not ours, or rules are wanted and the cluster serves none."""
    current: dict[str, Mapping[str, Any]] = {}
    for obj in rules:
        name = _text(_mapping(obj.get("metadata")).get("name"))
        if name:
            current[name] = obj
    if devices and version is None:
        raise SelectionError("the cluster serves no devicetaintrules (resource.k8s.io): cannot taint devices")
    changes = []
    wanted = set()
    for device in devices:
        desired = device_taint_rules.rule(policy, device, version or device_taint_rules.VERSIONS[0])
        name = desired["metadata"]["name"]
        wanted.add(name)
        found = current.get(name)
        if found is None:
            changes.append(RuleChange(name, "create", device, desired, None))
        elif not device_taint_rules.is_ours(found):
            raise SelectionError(
                f"devicetaintrule/{name} exists and is not managed by rocm-isolation-webhook ({MANAGED_BY_LABEL}="
                f"{MANAGED_BY}): pool never edits a rule that is not its own; delete it if it is a leftover"
            )
        else:
            action = "replace" if device_taint_rules.spec_differs(found, desired) else "unchanged"
            changes.append(RuleChange(name, action, device, desired, found))
    for name, found in sorted(current.items()):
        tainted = device_taint_rules.tainted_device(found)
        if name not in wanted and tainted is not None:
            changes.append(RuleChange(name, "delete", tainted, None, found))
    return tuple(changes)


# --- the plan ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSplit:
    node: str
    devices: tuple[Device, ...]
    wanted: tuple[str, ...]  # its own N lowest PCI bus IDs
    before: DeviceReservation | None
    after: DeviceReservation
    label: str = "-"  # what happens to its split label: label_action

    @property
    def gpus(self) -> int:
        return gpu_count(self.devices)

    def count(self, state: str, reservation: DeviceReservation | None) -> int:
        """GPUs of the node in ``state`` (one per PCI bus ID, each device without one)."""
        ids = {d.pci_bus_id for d in self.devices if d.pci_bus_id and device_state(d, reservation) == state}
        bare = sum(1 for d in self.devices if not d.pci_bus_id and device_state(d, reservation) == state)
        return len(ids) + bare

    @property
    def reserved_after(self) -> int:
        return self.count(RESERVED, self.after)

    @property
    def shared_after(self) -> int:
        return self.count(SHARED, self.after)


@dataclass(frozen=True)
class DevicePlan:
    driver: str
    before: DeviceReservation | None  # as the reserved class records it; None: no class yet
    after: DeviceReservation
    nodes: tuple[NodeSplit, ...]
    evicting: tuple[Hold, ...]  # pods of other classes holding devices reserved after
    keeping: tuple[Hold, ...]  # inference pods holding devices that stop being reserved (they keep them)
    owner: Ownership
    classes: tuple[ClassChange, ClassChange]
    notes: tuple[str, ...] = ()

    label: tuple[str, str] = ("", "")  # the split nodes' label (key, value)
    rules: tuple[RuleChange, ...] = ()  # our DeviceTaintRules: created first, deleted after the classes
    rule_version: str | None = None  # the resource.k8s.io version they are written in

    @property
    def changes(self) -> bool:
        return (
            any(c.action != "unchanged" for c in self.classes)
            or any(n.label in ("add", "replace", "remove") for n in self.nodes)
            or any(r.action != "unchanged" for r in self.rules)
        )

    @property
    def release(self) -> bool:
        return not self.after.active


def _node_notes(
    node: str,
    devices: Sequence[Device],
    wanted: Sequence[str],
    after: DeviceReservation,
    wanted_by: Mapping[str, list[str]],
) -> list[str]:
    notes = []
    n = after.devices_per_node
    bare = [d.name for d in devices if not d.pci_bus_id]
    if bare:
        notes.append(
            f"{node}: {', '.join(bare)} publish{'es' if len(bare) == 1 else ''} no {PCI_BUS_ID_ATTRIBUTE}: "
            "never reserved (the classes select PCI bus IDs), always shared"
        )
    ids = gpu_ids(devices)
    if len(ids) < n:
        notes.append(
            f"{node} has {plural(len(ids), 'GPU')} with a PCI bus ID, fewer than {n}: all of them are reserved"
        )
    extra = [i for i in ids if i in after.pci_bus_ids and i not in wanted]
    if extra and after.by_taints:
        by = ", ".join(
            f"{i} ({', '.join(d.name for d in devices if d.pci_bus_id == i)}, reserved on "
            f"{', '.join(wanted_by.get(i, []))})"
            for i in extra
        )
        notes.append(
            f"{node}: only its own {plural(len(wanted), 'GPU')} {'is' if len(wanted) == 1 else 'are'} tainted, but "
            f"the inference class selects one list of PCI bus IDs on every node (CEL cannot see the node): {by} "
            f"{'stays' if len(extra) == 1 else 'stay'} shared here and an inference claim may also get "
            f"{'it' if len(extra) == 1 else 'them'} when {node}'s reserved devices are taken"
        )
    elif extra:
        by = ", ".join(
            f"{i} ({', '.join(d.name for d in devices if d.pci_bus_id == i)}, reserved on "
            f"{', '.join(wanted_by.get(i, []))})"
            for i in extra
        )
        notes.append(
            f"CEL cannot see the node: {node} gets {plural(len(wanted) + len(extra), 'reserved GPU')}, not "
            f"{len(wanted)}: the classes select the same PCI bus IDs on every node, and {by} "
            f"{'is' if len(extra) == 1 else 'are'} in the reserved set"
        )
    reserved_here = wanted if after.by_taints else after.pci_bus_ids
    if len(ids) >= n and not bare and all(i in reserved_here for i in ids):
        notes.append(f"{node} keeps no shared GPU: other classes get none of its devices")
    return notes


def build_device_plan(
    policy: Policy,
    published: Mapping[str, Sequence[Device]],
    after: DeviceReservation,
    wanted: Mapping[str, Sequence[str]],
    classes: Mapping[str, ClassInfo],
    held: Sequence[Hold],
    notes: Sequence[str] = (),
    *,
    ensure_owner: bool = True,
    nodes: Mapping[str, PoolNode] | None = None,
    rules: Sequence[Mapping[str, Any]] = (),
    rule_version: str | None = None,
) -> DevicePlan:
    """The plan of ``apply --devices-per-node`` (``after`` from ``split``: ``wanted`` names the split
    nodes) or of ``release --devices`` (``after`` = ``RELEASED_RESERVATION``, nothing wanted,
    ``ensure_owner`` off: a release deletes no class). ``rules``: our DeviceTaintRules as read."""
    devices = policy.spec.reserved_devices
    owner = ownership(policy, classes)
    changes = class_changes(policy, after, classes, owner, ensure_owner=ensure_owner)
    current = current_reservation(policy, classes)
    before = with_tainted(current, device_taint_rules.tainted_keys(rules)) if current is not None else None
    to_taint = tainted_devices(published, wanted) if after.active and after.by_taints else []
    rule_plan = rule_changes(policy, to_taint, rules, rule_version)
    wanted_by: dict[str, list[str]] = {}
    for node, ids in sorted(wanted.items()):
        for i in ids:
            wanted_by.setdefault(i, []).append(node)
    all_notes: list[str] = []
    label = split_label(policy)
    splits = []
    for node, found in sorted(published.items()):
        own = tuple(wanted.get(node, ()))
        known = (nodes or {}).get(node)
        in_split = after.active and node in wanted
        action = label_action(known, label, release=not in_split) if nodes is not None else "-"
        splits.append(NodeSplit(node, tuple(found), own, before, after, action))
        if in_split:
            all_notes += _node_notes(node, found, own, after, wanted_by)
        if nodes is not None and known is None:
            all_notes.append(
                f"{node} publishes {devices.driver} devices but no Node of that name was read: not labelled"
            )
    evicting = tuple(
        h for h in held if not h.pod.inference and any(device_state(d, after) == RESERVED for d in h.devices)
    )
    keeping = tuple(
        h
        for h in held
        if h.pod.inference
        and any(device_state(d, before) == RESERVED and device_state(d, after) != RESERVED for d in h.devices)
    )
    all_notes += list(notes)
    return DevicePlan(
        devices.driver,
        before,
        after,
        tuple(splits),
        evicting,
        keeping,
        owner,
        changes,
        tuple(all_notes),
        label,
        rule_plan,
        rule_version,
    )


# --- output ------------------------------------------------------------------------------------------


def reservation_text(reservation: DeviceReservation | None) -> str:
    if reservation is None:
        return "no device reservation (the classes do not exist)"
    if not reservation.active:
        return "released (both classes select every device)"
    if reservation.by_taints:
        return (
            f"{plural(reservation.devices_per_node, 'device')} per chosen node, "
            f"{plural(len(reservation.tainted), 'device')} tainted by DeviceTaintRules (PCI bus IDs "
            f"{', '.join(reservation.pci_bus_ids)})"
        )
    return (
        f"{plural(reservation.devices_per_node, 'device')} per node, PCI bus IDs {', '.join(reservation.pci_bus_ids)}"
    )


def reservation_json(reservation: DeviceReservation | None) -> dict[str, Any] | None:
    if reservation is None:
        return None
    return {
        "active": reservation.active,
        "mode": MODE_TAINTS if reservation.by_taints else MODE_CLASSES,
        "devicesPerNode": reservation.devices_per_node,
        "pciBusIds": list(reservation.pci_bus_ids),
        "taintedDevices": [{"pool": pool, "device": name} for pool, name in sorted(reservation.tainted)],
    }


def _pod_text(pod: PoolPod) -> str:
    return f"{pod.namespace}/{pod.name} ({pod.class_name or 'out of scope'})"


def ownership_lines(owner: Ownership, *, recreate_planned: bool, creating: bool) -> list[str]:
    """What the scheduler maps the extended resource to, today and after ``apply``."""
    if not owner.name:
        return [
            "The policy sets no reservedDevices.extendedResourceName: no extended resource maps to the shared class."
        ]
    lines = [
        f"{owner.name}: the scheduler maps it to the newest DeviceClass naming it (the lower name on a tie): "
        + (f"deviceclass/{owner.owner_now.name} today." if owner.owner_now else "no class names it today.")
    ]
    for other in owner.others:
        lines.append(
            f"  deviceclass/{other.name} also names {owner.name} (created {other.created or 'at an unknown time'})"
            + ("" if other.ours else "; not ours: pool never edits it")
        )
    if recreate_planned:
        lines.append(
            f"  apply deletes deviceclass/{owner.shared_class} and creates it again, so that it is the newest: it is "
            f"ours and not the class {owner.name} maps to ({owner.name} maps to no class only between the delete "
            "and the create)"
        )
    elif creating:
        lines.append(f"  apply creates deviceclass/{owner.shared_class}, which is then the newest")
    elif owner.recreate:
        lines.append(
            f"  deviceclass/{owner.shared_class} is not the newest; a release deletes nothing: pool apply "
            "--devices-per-node N re-creates it"
        )
    elif owner.owner_now is not None and owner.owner_now.name == owner.shared_class:
        lines.append(f"  deviceclass/{owner.shared_class} is the newest: it keeps {owner.name}")
    if owner.others:
        lines.append(f'  (AMD\'s chart stops its class naming it with deviceClass.extendedResourceName: ""; {DOCS})')
    return lines


def plan_lines(plan: DevicePlan, policy: Policy) -> list[str]:
    devices = policy.spec.reserved_devices
    lines = [
        f"Device-level reservation (driver {plan.driver}): deviceclass/{devices.reserved_class_name} for inference, "
        f"deviceclass/{devices.shared_class_name} for every other class"
        + (f" and {devices.extended_resource_name}" if devices.extended_resource_name else ""),
        f"Now: {reservation_text(plan.before)}.",
        f"After {'release' if plan.release else 'apply'}: {reservation_text(plan.after)}"
        + (
            f" (each chosen node's {plan.after.devices_per_node} lowest, in ROCm's order, tainted by name)."
            if plan.after.by_taints
            else f" (each node's {plan.after.devices_per_node} lowest, in ROCm's order; one list for every node)."
            if plan.after.active
            else "."
        ),
        f"Split nodes are labelled {plan.label[0]}={plan.label[1]} (inference is placed on them, no node taint: "
        "every class uses their shared devices).",
    ]
    if plan.after.by_taints:
        lines += [
            f"DeviceTaintRules (resource.k8s.io/{plan.rule_version}) taint the reserved devices {TAINT_TEXT}: a request "
            "that does not tolerate it never gets them (adminAccess included); the webhook adds the toleration to "
            f"inference requests for deviceclass/{devices.reserved_class_name}, the backstop denies it elsewhere. "
            f"deviceclass/{devices.shared_class_name} selects every device.",
        ]
        if devices.extended_resource_name:
            lines.append(
                f"{devices.extended_resource_name}: the scheduler's claims for it carry no tolerations, so every pod "
                f"asking for it, inference included, gets a shared device; inference gets reserved devices through a "
                f"ResourceClaimTemplate of deviceclass/{devices.reserved_class_name}."
            )
    lines.append("")
    rows = [["NODE", "GPUS", "RESERVED", "SHARED", "LABEL"]]
    rows += [
        [
            n.node,
            str(n.gpus),
            *((str(n.reserved_after), str(n.shared_after)) if plan.after.active else ("-", "-")),
            n.label,
        ]
        for n in plan.nodes
    ]
    lines += columns(rows)
    lines.append("")
    rows = [["NODE", "DEVICE", "PCI BUS ID", "NOW", "AFTER"]]
    rows += [
        [n.node, d.name, d.pci_bus_id or "-", device_state(d, plan.before), device_state(d, plan.after)]
        for n in plan.nodes
        for d in n.devices
    ]
    lines += columns(rows)
    lines.append("")
    if plan.evicting:
        lines.append(
            "Running pods of other classes that hold devices that become reserved (they keep them until they end; "
            "pool apply --evict evicts them):"
        )
        rows = [["NODE", "NAMESPACE", "POD", "OWNER", "CLASS", "RESERVED DEVICES", "EVICT"]]
        rows += [
            [
                h.devices[0].node,
                h.pod.namespace,
                h.pod.name,
                h.pod.owner or "-",
                h.pod.class_name or "-",
                ",".join(d.name for d in h.devices if device_state(d, plan.after) == RESERVED),
                "yes" if h.pod.skip_reason is None else f"no: {h.pod.skip_reason}",
            ]
            for h in plan.evicting
        ]
        lines += columns(rows)
    elif plan.after.active:
        lines.append("No pod of another class holds a device that becomes reserved.")
    if plan.keeping:
        if lines[-1]:
            lines.append("")
        lines.append("Inference pods holding devices that stop being reserved (they keep them):")
        rows = [["NODE", "NAMESPACE", "POD", "DEVICES NO LONGER RESERVED"]]
        rows += [
            [h.devices[0].node, h.pod.namespace, h.pod.name, ",".join(d.name for d in _unreserved(h, plan))]
            for h in plan.keeping
        ]
        lines += columns(rows)
    if lines[-1]:
        lines.append("")
    creating = plan.classes[1].action == "create"
    lines += ownership_lines(plan.owner, recreate_planned=plan.classes[1].action == "recreate", creating=creating)
    lines.append("")
    for change in plan.classes:
        lines.append(f"deviceclass/{change.name} ({change.role}): {_action_text(change)}")
    for rule in plan.rules:
        lines.append(
            f"devicetaintrule/{rule.name} ({rule.device.node or '?'} {rule.device.device} "
            f"{rule.device.pci_bus_id or '-'}): {rule.action}"
            + (
                " (after the classes)"
                if rule.action == "delete"
                else " (before the classes)"
                if rule.action != "unchanged"
                else ""
            )
        )
    lines += [f"note: {note}" for note in plan.notes]
    if not plan.changes:
        lines.append("Nothing to change: the classes" + (", the rules" if plan.rules else "") + " already say this.")
    return lines


def _unreserved(hold: Hold, plan: DevicePlan) -> list[Device]:
    """The devices of ``hold`` that are reserved now and not after."""
    return [
        d for d in hold.devices if device_state(d, plan.before) == RESERVED and device_state(d, plan.after) != RESERVED
    ]


def _action_text(change: ClassChange) -> str:
    return {
        "create": "create",
        "replace": "replace",
        "unchanged": "unchanged",
        "recreate": "delete and create again (see above)",
    }[change.action]


def _device_json(device: Device, before: DeviceReservation | None, after: DeviceReservation) -> dict[str, Any]:
    return {
        "name": device.name,
        "pciBusId": device.pci_bus_id or None,
        "now": device_state(device, before),
        "after": device_state(device, after),
    }


def hold_json(hold: Hold) -> dict[str, Any]:
    pod = hold.pod
    out: dict[str, Any] = {
        "namespace": pod.namespace,
        "name": pod.name,
        "node": hold.devices[0].node,
        "owner": pod.owner or None,
        "class": pod.class_name,
        "devices": [d.name for d in hold.devices],
        "evictable": pod.skip_reason is None,
    }
    if pod.skip_reason is not None:
        out["skipReason"] = pod.skip_reason
    return out


def ownership_json(owner: Ownership) -> dict[str, Any]:
    return {
        "name": owner.name or None,
        "ownerNow": owner.owner_now.name if owner.owner_now else None,
        "alsoNamedBy": [{"name": c.name, "created": c.created, "ours": c.ours} for c in owner.others],
        "recreateShared": owner.recreate,
    }


def plan_json(plan: DevicePlan) -> dict[str, Any]:
    return {
        "driver": plan.driver,
        "label": {"key": plan.label[0], "value": plan.label[1]},
        "before": reservation_json(plan.before),
        "after": reservation_json(plan.after),
        "nodes": [
            {
                "name": n.node,
                "gpus": n.gpus,
                "reserved": n.reserved_after,
                "shared": n.shared_after,
                "wanted": list(n.wanted),
                "label": n.label,
                "devices": [_device_json(d, plan.before, plan.after) for d in n.devices],
            }
            for n in plan.nodes
        ],
        "podsHoldingReserved": [hold_json(h) for h in plan.evicting],
        "inferenceKeeping": [hold_json(h) for h in plan.keeping],
        "extendedResource": ownership_json(plan.owner),
        "classes": [{"name": c.name, "role": c.role, "action": c.action, "object": c.desired} for c in plan.classes],
        "taintRuleVersion": plan.rule_version,
        "taintRules": [
            {
                "name": r.name,
                "action": r.action,
                "node": r.device.node or None,
                "pool": r.device.pool,
                "device": r.device.device,
                "pciBusId": r.device.pci_bus_id or None,
            }
            for r in plan.rules
        ],
        "changes": plan.changes,
        "notes": list(plan.notes),
    }


# --- status ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceStatus:
    driver: str
    reserved_class: str
    reservation: DeviceReservation | None
    foreign: tuple[str, ...]  # our class names taken by classes that are not ours
    published: Mapping[str, tuple[Device, ...]]
    held: tuple[Hold, ...]
    owner: Ownership
    out_of_date: tuple[str, ...]  # what the classes say differs from the recorded reservation


def device_status(
    policy: Policy,
    published: Mapping[str, tuple[Device, ...]],
    classes: Mapping[str, ClassInfo],
    held: Sequence[Hold],
    nodes: Mapping[str, PoolNode] | None = None,
    rules: Sequence[Mapping[str, Any]] = (),
) -> DeviceStatus:
    devices = policy.spec.reserved_devices
    foreign = tuple(
        name
        for name in (devices.reserved_class_name, devices.shared_class_name)
        if name in classes and not classes[name].ours
    )
    reservation = None if foreign else current_reservation(policy, classes)
    if reservation is not None:
        reservation = with_tainted(reservation, device_taint_rules.tainted_keys(rules))
    owner = ownership(policy, classes)
    stale: list[str] = []
    if reservation is not None:
        again = (
            "pool apply --devices-per-node " + str(reservation.devices_per_node)
            if reservation.active
            else ("pool release --devices --all")
        )
        for desired in desired_classes(policy, reservation, owner):
            name = desired["metadata"]["name"]
            info = classes.get(name)
            if info is None:
                stale.append(f"deviceclass/{name} is missing: {again} writes it")
            elif replace_body(info.raw, desired) is not None:
                stale.append(f"deviceclass/{name} does not say what the reservation records: {again} rewrites it")
        if owner.recreate:
            stale.append(
                f"deviceclass/{owner.owner_now.name if owner.owner_now else '?'} is newer than deviceclass/"
                f"{owner.shared_class}: {owner.name} maps to it; {again} re-creates ours"
            )
        label = split_label(policy)
        by_key = {d.key: d for found in published.values() for d in found}
        split_nodes = set(published)
        if reservation.by_taints:
            split_nodes = {by_key[key].node for key in reservation.tainted if key in by_key}
            again += " --nodes " + ",".join(sorted(split_nodes)) if split_nodes else ""
            for key in sorted(reservation.tainted - set(by_key)):
                stale.append(
                    f"a DeviceTaintRule taints {key[1]} of pool {key[0]}, which no ResourceSlice publishes (a device "
                    f"renamed after a reboot, or a node gone): {again} derives the rules from the slices again"
                )
        elif rules and device_taint_rules.tainted_keys(rules):
            stale.append(f"DeviceTaintRules of ours are left from a split by taints: {again} deletes them")
        for name in published:
            node = (nodes or {}).get(name)
            in_split = reservation.active and name in split_nodes
            action = label_action(node, label, release=not in_split) if node is not None else "-"
            if action in ("add", "replace"):
                stale.append(
                    f"node/{name} lacks the label {label[0]}={label[1]}: inference is not placed there; {again} "
                    "labels it"
                )
            elif action == "remove":
                stale.append(
                    f"node/{name} still carries the label {label[0]}={label[1]} of a released split: {again} removes it"
                )
    return DeviceStatus(
        devices.driver, devices.reserved_class_name, reservation, foreign, published, tuple(held), owner, tuple(stale)
    )


@dataclass(frozen=True)
class SplitCapacity:
    """The split nodes' share of the pools in ``pool status``, as the audit counts it: per side (reserved,
    shared), their GPUs (one per PCI bus ID) and the pods holding GPUs there, each with its GPUs on that side
    (a GPU several pods hold counts for the first)."""

    nodes: frozenset[str]
    gpus: Mapping[str, int]
    pods: Mapping[str, tuple[PoolPod, ...]]


def split_capacity(status: DeviceStatus, nodes: Iterable[str]) -> SplitCapacity:
    reservation = status.reservation
    names = frozenset(nodes)
    gpus = {
        state: sum(
            NodeSplit(name, status.published.get(name, ()), (), reservation, RELEASED_RESERVATION).count(
                state, reservation
            )
            for name in names
        )
        for state in (RESERVED, SHARED)
    }
    counted: set[tuple[str, str]] = set()
    pods: dict[str, list[PoolPod]] = {RESERVED: [], SHARED: []}
    for hold in status.held:
        mine: dict[str, set[tuple[str, str]]] = {}
        for device in hold.devices:
            if device.node in names:
                mine.setdefault(device_state(device, reservation), set()).add((device.node, gpu_key(device)))
        for state, found in mine.items():
            pods[state].append(replace(hold.pod, gpus=len(found - counted)))
            counted |= found
    return SplitCapacity(names, gpus, {state: tuple(found) for state, found in pods.items()})


def _holders(status: DeviceStatus) -> dict[tuple[str, str], list[PoolPod]]:
    found: dict[tuple[str, str], list[PoolPod]] = {}
    for hold in status.held:
        for device in hold.devices:
            found.setdefault(device.key, []).append(hold.pod)
    return found


def _by_class(pods: Iterable[PoolPod]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in {(p.namespace, p.name): p for p in pods}.values():
        name = pod.class_name or "(out of scope)"
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class GpuView:
    """One GPU of a node as status shows it: its devices (one for a whole-GPU driver; a partition or
    AutoPartition layout each otherwise, all with the GPU's PCI bus ID) and those allocated (the layout
    the GPU is in, under AutoPartition: one layout per GPU at a time)."""

    key: str  # gpu_key: the PCI bus ID, else pool/device
    pci_bus_id: str
    state: str
    devices: tuple[Device, ...]
    allocated: tuple[Device, ...]


def gpu_views(devices: Sequence[Device], status: DeviceStatus) -> list[GpuView]:
    """The node's GPUs, each device without a PCI bus ID its own."""
    holders = _holders(status)
    by_gpu: dict[str, list[Device]] = {}
    for d in devices:
        by_gpu.setdefault(gpu_key(d), []).append(d)
    views = [
        GpuView(
            key,
            found[0].pci_bus_id,
            device_state(found[0], status.reservation),
            tuple(found),
            tuple(d for d in found if holders.get(d.key)),
        )
        for key, found in by_gpu.items()
    ]
    return views  # in the order of their first device (``PublishedDevices.per_node``: PCI order)


def status_json(status: DeviceStatus) -> dict[str, Any]:
    holders = _holders(status)
    nodes = []
    for node, devices in status.published.items():
        by_state: dict[str, list[PoolPod]] = {}
        for d in devices:
            by_state.setdefault(device_state(d, status.reservation), []).extend(holders.get(d.key, []))
        split_node = NodeSplit(node, devices, (), status.reservation, status.reservation or RELEASED_RESERVATION)
        nodes.append(
            {
                "name": node,
                "gpus": split_node.gpus,
                "reserved": split_node.count(RESERVED, status.reservation),
                "shared": split_node.count(SHARED, status.reservation),
                "podsByClass": {state: _by_class(pods) for state, pods in sorted(by_state.items())},
                "gpuList": [
                    {
                        "pciBusId": g.pci_bus_id or None,
                        "state": g.state,
                        "devices": len(g.devices),
                        "allocated": [d.name for d in g.allocated],
                        "pods": [
                            {"namespace": p.namespace, "name": p.name, "class": p.class_name}
                            for d in g.allocated
                            for p in holders.get(d.key, [])
                        ],
                    }
                    for g in gpu_views(devices, status)
                ],
                "devices": [
                    {
                        "name": d.name,
                        "pciBusId": d.pci_bus_id or None,
                        "state": device_state(d, status.reservation),
                        "pods": [
                            {"namespace": p.namespace, "name": p.name, "class": p.class_name}
                            for p in holders.get(d.key, [])
                        ],
                    }
                    for d in devices
                ],
            }
        )
    strays = [
        h
        for h in status.held
        if not h.pod.inference and any(device_state(d, status.reservation) == RESERVED for d in h.devices)
    ]
    return {
        "driver": status.driver,
        "reservedClass": status.reserved_class,
        "reservation": reservation_json(status.reservation),
        "notOurs": list(status.foreign),
        "nodes": nodes,
        "nonInferenceOnReserved": [hold_json(h) for h in strays],
        "extendedResource": ownership_json(status.owner),
        "outOfDate": list(status.out_of_date),
    }


def status_lines(status: DeviceStatus) -> list[str]:
    lines = [f"Device-level reservation (driver {status.driver}): {reservation_text(status.reservation)}"]
    for name in status.foreign:
        lines.append(f"  deviceclass/{name} exists and is not ours ({MANAGED_BY_LABEL}): pool will not edit it")
    lines.append("")
    holders = _holders(status)
    rows = [["NODE", "DEVICE", "PCI BUS ID", "STATE", "PODS"]]
    for node, devices in status.published.items():
        for view in gpu_views(devices, status):
            # A GPU published as several devices (partitions, AutoPartition layouts): one row, the devices
            # allocated (the layout it is in) or how many it has; a whole GPU: its device, as before.
            shown = view.allocated if len(view.devices) > 1 else view.devices
            name = ", ".join(d.name for d in shown) or f"({len(view.devices)} devices, none allocated)"
            pods = [p for d in view.devices for p in holders.get(d.key, [])]
            rows.append([node, name, view.pci_bus_id or "-", view.state, ", ".join(_pod_text(p) for p in pods) or "-"])
    lines += columns(rows)
    if status.reservation is not None and status.reservation.active:
        lines.append("")
        rows = [["NODE", "RESERVED", "SHARED", "PODS ON RESERVED", "PODS ON SHARED"]]
        for node, devices in status.published.items():
            split_node = NodeSplit(node, devices, (), status.reservation, status.reservation)
            on: dict[str, list[PoolPod]] = {RESERVED: [], SHARED: []}
            for d in devices:
                on[device_state(d, status.reservation)].extend(holders.get(d.key, []))
            rows.append(
                [
                    node,
                    str(split_node.count(RESERVED, status.reservation)),
                    str(split_node.count(SHARED, status.reservation)),
                    ", ".join(f"{k} {v}" for k, v in _by_class(on[RESERVED]).items()) or "-",
                    ", ".join(f"{k} {v}" for k, v in _by_class(on[SHARED]).items()) or "-",
                ]
            )
        lines += columns(rows)
        strays = [
            h
            for h in status.held
            if not h.pod.inference and any(device_state(d, status.reservation) == RESERVED for d in h.devices)
        ]
        if strays:
            lines += [
                "",
                "Non-inference pods holding reserved devices (pool apply --devices-per-node "
                f"{status.reservation.devices_per_node} --evict moves them):",
            ]
            lines += [
                f"  {_pod_text(h.pod)} on {h.devices[0].node}: {', '.join(d.name for d in h.devices)}" for h in strays
            ]
    lines.append("")
    owner = status.owner
    if owner.name:
        lines.append(
            f"{owner.name} maps to "
            + (f"deviceclass/{owner.owner_now.name}" if owner.owner_now else "no class")
            + " (the newest DeviceClass naming it)"
            + (f"; also named by {', '.join('deviceclass/' + c.name for c in owner.others)}" if owner.others else "")
        )
    lines += [f"warning: {text}" for text in status.out_of_date]
    return lines
