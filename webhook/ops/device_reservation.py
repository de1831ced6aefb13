"""Temporary: the names ``audit.py`` still imports from here, now defined in ``devices.py``,
``device_ownership.py``, ``device_plan.py`` and ``device_split.py``. To be removed once audit imports them
from there."""

from __future__ import annotations

from webhook.ops.device_ownership import ClassInfo, class_infos, current_reservation, ownership
from webhook.ops.device_plan import NodeSplit, reservation_text
from webhook.ops.device_split import split_label
from webhook.ops.devices import (
    RESERVED,
    SHARED,
    Device,
    PublishedDevices,
    device_state,
    gpu_count,
    gpu_ids,
    gpu_key,
    split_nodes,
)

__all__ = [
    "RESERVED",
    "SHARED",
    "ClassInfo",
    "Device",
    "NodeSplit",
    "PublishedDevices",
    "class_infos",
    "current_reservation",
    "device_state",
    "gpu_count",
    "gpu_ids",
    "gpu_key",
    "ownership",
    "reservation_text",
    "split_label",
    "split_nodes",
]
