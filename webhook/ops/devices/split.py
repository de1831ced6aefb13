"""Which devices of which nodes a device-level reservation reserves (``--devices-per-node N``), the split
nodes' label, whether DeviceTaintRules may hold the split on this cluster, and which nodes to split.

Pure: the devices come from ``devices.py``, the nodes as ``PoolNode``; nothing here does I/O.

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from webhook.cluster.slices import Device, gpu_ids
from webhook.core.policy import Policy
from webhook.deploy.device_classes import DeviceReservation, reservation_for
from webhook.deploy.device_taint_rules import TaintedDevice
from webhook.ops.reservation import PoolNode, Reservation, SelectionError

DEVICE_PLUGIN_PREFIX = "amd.com/"


DOCS = 'docs/operations.md, "Device-level reservation"'


# --- the split ---------------------------------------------------------------------------------


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


# --- the split label ---------------------------------------------------------------------------


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


# --- which nodes -------------------------------------------------------------------------------


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
