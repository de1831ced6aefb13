"""Device-level reservation on the cluster's minor (``ops/devices/minor.py``, issue 47): where the apiserver drops
AutoPartition's shared counters (DRAPartitionableDevices off: 1.34, 1.35 as they ship), ``pool`` says what the split
cannot hold; the slices here are stored as such an apiserver stores them (measured on v1.36.2 emulating 1.35:
``sharedCounters`` and ``consumesCounters`` gone), and the split that still holds is proven on it by
tests/e2e/test_e2e_minor_autopartition.py."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_objects import autopartition_slices, gpu_device, node_slice

from webhook.cluster import slices as slice_reader
from webhook.deploy import minors
from webhook.ops.devices import minor

DRIVER = "gpu.amd.com"
PCI = ("0000:05:00.0", "0000:26:00.0")


def as_stored_without_counters(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for resource_slice in slices:
        resource_slice["spec"].pop("sharedCounters", None)
        for device in resource_slice["spec"].get("devices") or []:
            device.pop("consumesCounters", None)
            device.pop("allowMultipleAllocations", None)
    return slices


def published(*nodes: str, layouts: Any = None) -> dict[str, tuple[slice_reader.Device, ...]]:
    options = {"layouts": layouts} if layouts else {}
    slices = [s for node in nodes for s in autopartition_slices(node, PCI, **options)]
    return slice_reader.published_devices(as_stored_without_counters(slices), DRIVER)


@pytest.mark.parametrize("kubernetes", ["1.34", "1.35"])
def test_autopartition_layouts_without_counters_are_said_with_what_still_holds(kubernetes: str) -> None:
    said = minor.layouts_without_counters(minors.for_minor(kubernetes), published("ap-1", "ap-2"), DRIVER)
    assert said is not None
    assert said.startswith(f"Kubernetes {kubernetes}: no partitionable devices (DRAPartitionableDevices off)"), said
    assert "on ap-1, ap-2 for a GPU of its own" in said and "every layout of a reserved GPU stays reserved" in said


def test_many_nodes_are_named_by_the_first_three() -> None:
    said = minor.layouts_without_counters(minors.for_minor("1.35"), published(*(f"n{i}" for i in range(5))), DRIVER)
    assert said is not None and "on n0, n1, n2 and 2 more" in said, said


def test_nothing_is_said_where_nothing_is_lost() -> None:
    whole = slice_reader.published_devices(
        [node_slice("n", gpu_device("gpu-0", PCI[0]), gpu_device("gpu-1", PCI[1]))], DRIVER
    )
    one_layout = published("ap-1", layouts=(("cpx", "nps1"),))  # partitions of one layout, no alternatives
    cases = {
        "1.36 keeps the counters": (minors.for_minor("1.36"), published("ap-1")),
        "1.33 has no DRA": (minors.for_minor("1.33"), published("ap-1")),
        "not known": (None, published("ap-1")),
        "whole GPUs": (minors.for_minor("1.35"), whole),
        "one layout": (minors.for_minor("1.35"), one_layout),
    }
    for case, (served, devices) in cases.items():
        assert minor.layouts_without_counters(served, devices, DRIVER) is None, case
