"""The node-wide memory partition mode of AMD's AutoPartition layouts, and the device reservation.

AMD's driver publishes one virtual device per compute+memory layout of a GPU (``gpu-<i>-spx-nps1``,
``-dpx-nps2``, ``-cpx-nps1``, ``-cpx-nps4``). The memory mode is node-wide: the first allocation of a layout
sets it, and the driver taints every layout of another mode on the node ``NoExecute``
(``gpu.amd.com/memory-partition-conflict``) until they are all released. A split node whose classes select
every mode lets a claim on a shared GPU set a mode that locks inference out of its reserved GPUs (issue 42).

So on devices publishing more than one memory mode, ``pool apply --devices-per-node N`` never leaves the
mode open: it pins one in both classes, recorded in the reserved class (``DeviceReservation.memory_partition``).
The mode, first that applies:

1. ``reservedDevices.memoryPartition`` of the policy (the operator's explicit choice);
2. the one the active reservation records (a re-apply or a resize keeps it: the mode never moves under
   running pods unless the policy says so);
3. the one inference's existing allocations use (a running inference pod keeps its node in its mode);
4. the one of the whole-GPU layout, which AMD's ``gpu.amd.com-spx`` class admits (its selector:
   ``!has(computePartition) || computePartition == "spx"``), the layout ``amd.com/gpu`` gives.

When 3 or 4 names more than one mode, or none, ``pool`` refuses and says which policy field to set
(``PinError``). ``pool status`` and ``audit`` report a reservation that pins none on such nodes
(``unpinned``). docs/operations.md "Partitions, AutoPartition and memory modes".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from webhook.cluster.slices import Device
from webhook.core.policy import Policy
from webhook.deploy.device_classes import DeviceReservation, pinned_memory_partition

FIELD = "reservedDevices.memoryPartition"
# The compute mode of a whole GPU (AMD: SPX, one partition); the layout gpu.amd.com-spx admits.
WHOLE_GPU_COMPUTE = "spx"
# What each memory mode allows (AMD's layouts), for the messages.
ALLOWS = "nps1 allows spx and cpx-nps1, nps2 dpx, nps4 cpx-nps4"

# Where the pinned mode came from (``Pin.source``; pool plan's JSON).
POLICY_SOURCE = "policy"
RECORDED_SOURCE = "reservation"
INFERENCE_SOURCE = "inference-allocations"
WHOLE_GPU_SOURCE = "whole-gpu-layout"


class PinError(Exception):
    """No one mode can be chosen: the operator has to pin one (the message says how)."""


@dataclass(frozen=True)
class Pin:
    mode: str  # "" when nothing needs pinning (no node publishes more than one mode) and the policy pins none
    source: str  # POLICY_SOURCE, RECORDED_SOURCE, INFERENCE_SOURCE, WHOLE_GPU_SOURCE; "" with no mode
    why: str  # for the plan: where the mode comes from
    mixed: Mapping[str, tuple[str, ...]]  # the nodes publishing more than one memory mode, and the modes


def modes(devices: Iterable[Device]) -> tuple[str, ...]:
    """The memory modes these devices publish (sorted; devices without the attribute publish none)."""
    return tuple(sorted({d.memory_partition for d in devices if d.memory_partition}))


def mixed_nodes(published: Mapping[str, Sequence[Device]]) -> dict[str, tuple[str, ...]]:
    """The nodes whose devices publish more than one memory mode: where the mode can be left open."""
    found = {node: modes(devices) for node, devices in published.items()}
    return {node: found_modes for node, found_modes in sorted(found.items()) if len(found_modes) > 1}


def every_mode(mixed: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Every memory mode the nodes of ``mixed_nodes`` publish (sorted)."""
    return tuple(sorted({m for found in mixed.values() for m in found}))


def _text(mixed: Mapping[str, tuple[str, ...]]) -> str:
    every = every_mode(mixed)
    names = sorted(mixed)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{shown} publish{'es' if len(names) == 1 else ''} devices in memory modes {', '.join(every)}"


def _refuse(mixed: Mapping[str, tuple[str, ...]], driver: str, why: str, devices_per_node: int) -> PinError:
    return PinError(
        f"{_text(mixed)} ({driver}, AutoPartition): the memory mode is node-wide (the first allocation sets it and "
        f"the driver taints the other modes' layouts NoExecute), so a claim on a shared GPU could lock inference "
        f"out of its reserved GPUs; pool pins one mode, but {why}. Set {FIELD} in the policy to the mode inference "
        f"needs ({ALLOWS}), then run: rocm-isolation-webhook pool apply --devices-per-node {devices_per_node}"
    )


def choose(
    policy: Policy,
    published: Mapping[str, Sequence[Device]],
    before: DeviceReservation | None,
    inference: Iterable[Device],
    devices_per_node: int,
) -> Pin:
    """The memory mode ``pool apply`` pins (module docstring); ``inference``: the devices inference's pods hold
    now. PinError when the nodes publish several modes and no one mode can be chosen."""
    driver = policy.spec.reserved_devices.driver
    mixed = mixed_nodes(published)
    explicit = policy.spec.reserved_devices.memory_partition
    if explicit:
        return Pin(explicit, POLICY_SOURCE, f"{FIELD} of the policy", mixed)
    if not mixed:
        return Pin("", "", "", mixed)
    recorded = pinned_memory_partition(policy, before)
    if recorded and recorded in every_mode(mixed):
        return Pin(recorded, RECORDED_SOURCE, "the mode the reservation already pins", mixed)
    held = modes(inference)
    if len(held) > 1:
        raise _refuse(
            mixed, driver, f"inference's pods hold layouts of several modes ({', '.join(held)})", devices_per_node
        )
    if held:
        return Pin(held[0], INFERENCE_SOURCE, "the mode inference's running pods use", mixed)
    whole = modes(
        d
        for devices in published.values()
        for d in devices
        if d.memory_partition and d.compute_partition in ("", WHOLE_GPU_COMPUTE)
    )
    if len(whole) == 1:
        return Pin(
            whole[0],
            WHOLE_GPU_SOURCE,
            f"the mode of the whole-GPU layout ({WHOLE_GPU_COMPUTE}-{whole[0]}), the one AMD's gpu.amd.com-spx class "
            "and amd.com/gpu give",
            mixed,
        )
    why = (
        f"whole GPUs ({WHOLE_GPU_COMPUTE}) are published in several modes ({', '.join(whole)})"
        if whole
        else f"no device is published as a whole GPU ({WHOLE_GPU_COMPUTE}) to take the mode from"
    )
    raise _refuse(mixed, driver, why, devices_per_node)


def other_mode_holders(pin: str, holds: Iterable[tuple[str, Sequence[Device]]]) -> list[tuple[str, str, list[Device]]]:
    """(node, pod, devices) of the pods holding layouts of another memory mode than ``pin``: until they end,
    their node stays in that mode and the pinned mode's layouts there are tainted. No pin (no node publishes
    more than one mode, and the policy names none): no mode is another's."""
    if not pin:
        return []
    found = []
    for pod, devices in holds:
        other = [d for d in devices if d.memory_partition and d.memory_partition != pin]
        if other:
            found.append((other[0].node, pod, other))
    return sorted(found, key=lambda f: (f[0], f[1]))


def unpinned(
    policy: Policy,
    reservation: DeviceReservation | None,
    published: Mapping[str, Sequence[Device]],
    split: Iterable[str],
) -> dict[str, tuple[str, ...]]:
    """The split nodes (``split``) publishing more than one memory mode while the active ``reservation`` pins
    none: the exposure ``pool status`` and ``audit`` report."""
    if reservation is None or not reservation.active or pinned_memory_partition(policy, reservation):
        return {}
    mixed = mixed_nodes(published)
    return {node: mixed[node] for node in sorted(set(split)) if node in mixed}


def unpinned_message(policy: Policy, node: str, found: Sequence[str], again: str) -> str:
    """Why an unpinned reservation on ``node`` is exposed, and what to run."""
    devices = policy.spec.reserved_devices
    return (
        f"node {node} publishes {devices.driver} devices in memory modes {', '.join(found)} and the device "
        f"reservation pins none (deviceclass/{devices.reserved_class_name} records no memory mode, {FIELD} is "
        f"empty): the mode is node-wide, so a claim on a shared GPU can set one that the driver answers by tainting "
        f"the other modes' layouts NoExecute (gpu.amd.com/memory-partition-conflict), inference's reserved GPUs "
        f"included; {again} pins one (or set {FIELD} in the policy first)"
    )
