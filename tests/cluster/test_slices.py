"""The one ResourceSlice reader: the GPUs DRA drivers publish per node, and those a claim's allocation takes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import yaml

from webhook.cluster.slices import Gpu, PublishedDevices, allocated_gpus

FIXTURE = yaml.safe_load((Path(__file__).parents[1] / "fixtures/cluster/resource-slices.yaml").read_text())
GPU_DRIVERS = frozenset({"gpu.amd.com"})


def published(slices: list[dict[str, Any]]) -> PublishedDevices:
    found = PublishedDevices(GPU_DRIVERS)
    for resource_slice in slices:
        found.add(resource_slice)
    return found


def test_gpus_per_node() -> None:
    assert published(FIXTURE["slices"]).gpus_per_node() == FIXTURE["expected"]


def test_the_order_slices_are_listed_in_does_not_matter() -> None:
    # The older generation listed after the newer one, or before: the newest wins either way.
    for seed in range(20):
        slices = list(FIXTURE["slices"])
        random.Random(seed).shuffle(slices)
        assert published(slices).gpus_per_node() == FIXTURE["expected"], seed


def test_a_restarted_list_forgets_what_it_read() -> None:
    found = published(FIXTURE["slices"])
    found.clear()
    found.add(FIXTURE["slices"][0])
    assert found.gpus_per_node() == {"r-dra": 8}


def test_malformed_slices_are_skipped_not_fatal() -> None:
    found = published(
        [
            {},
            {"spec": None},
            {"spec": {"driver": "gpu.amd.com", "pool": "r-dra", "nodeName": "x", "devices": [{"name": "g"}]}},
            {
                "spec": {
                    "driver": "gpu.amd.com",
                    "pool": {"name": "p", "generation": "2"},
                    "nodeName": "y",
                    "devices": "g",
                }
            },
            {
                "spec": {
                    "driver": "gpu.amd.com",
                    "pool": {"name": "p"},
                    "nodeName": "z",
                    "devices": [7, {"name": 3}, {}],
                }
            },
        ]
    )
    assert found.gpus_per_node() == {}


def test_allocated_devices_count_in_the_slots_they_were_published_in() -> None:
    gpus = published(FIXTURE["slices"]).gpus_by_result()
    # Two partition modes of the same GPU are one slot (they are mutually exclusive), a plain device is
    # its own, and a device no slice publishes any more still counts (its own slot).
    results = [
        ("gpu.amd.com", "auto", "gpu-0-cpx-nps4"),
        ("gpu.amd.com", "auto", "gpu-0-spx-nps1"),
        ("gpu.amd.com", "auto", "gpu-1-cpx-nps4"),
        ("gpu.amd.com", "r-dra", "gpu-3"),
        ("gpu.amd.com", "r-dra", "gone-7"),
    ]
    assert allocated_gpus(results, gpus) == {
        Gpu("gpu.amd.com", "auto", "counters:gpu-0-mutex"),
        Gpu("gpu.amd.com", "auto", "counters:gpu-1-mutex"),
        Gpu("gpu.amd.com", "r-dra", "r-dra/gpu-3"),
        Gpu("gpu.amd.com", "r-dra", "r-dra/gone-7"),
    }


def _slice(node: str, *devices: dict[str, Any], driver: str = "gpu.amd.com") -> dict[str, Any]:
    return {
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1}, "devices": list(devices)}
    }


def _device(name: str, bus: str = "", **more: Any) -> dict[str, Any]:
    attributes = {"resource.kubernetes.io/pciBusID": {"string": bus}} if bus else {}
    return {"name": name, "attributes": attributes, **more}


def test_devices_sharing_a_pci_bus_id_are_one_gpu_whether_or_not_they_consume_counters() -> None:
    # Where the readers disagreed: the whole-node count took each partition of a pre-partitioned GPU as a
    # GPU, the device reservation one per PCI bus ID. One per PCI bus ID: a partition is on its GPU's side.
    found = published(
        [
            _slice(
                "n1",
                _device("gpu-0-cpx-0", "0000:11:00.0"),
                _device("gpu-0-cpx-1", "0000:11:00.0"),
                _device("gpu-1", "0000:22:00.0"),
                _device("no-bus-id"),
            )
        ]
    )
    assert found.gpus_per_node() == {"n1": 3}
    gpus = found.gpus_by_result()
    assert gpus[("gpu.amd.com", "n1", "gpu-0-cpx-0")] == gpus[("gpu.amd.com", "n1", "gpu-0-cpx-1")]
    assert [d.name for d in found.per_node("gpu.amd.com")["n1"]] == ["gpu-0-cpx-0", "gpu-0-cpx-1", "gpu-1", "no-bus-id"]


def test_a_tainted_device_still_counts_and_its_taints_are_read() -> None:
    taint = {"key": "gpu.amd.com/unhealthy", "effect": "NoExecute"}
    found = published(
        [_slice("n1", _device("gpu-0", "0000:11:00.0", taints=[taint]), _device("gpu-1", "0000:22:00.0"))]
    )
    assert found.gpus_per_node() == {"n1": 2}
    assert found.tainted("gpu.amd.com") == {("n1", "gpu-0"): (("gpu.amd.com/unhealthy", "", "NoExecute"),)}


def test_drivers_are_kept_apart() -> None:
    found = PublishedDevices(frozenset({"gpu.amd.com", "other.example.com"}))
    found.add(_slice("n1", _device("gpu-0", "0000:11:00.0")))
    found.add(_slice("n1", _device("x-0"), driver="other.example.com"))
    assert [d.name for d in found.per_node("gpu.amd.com")["n1"]] == ["gpu-0"]
    assert found.gpus_per_node(frozenset({"gpu.amd.com"})) == {"n1": 1}
    assert found.gpus_per_node() == {"n1": 2}
