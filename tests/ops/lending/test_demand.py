"""Inference's demand on the reservation per kind of node (webhook/ops/lending/demand.py), from the capacity model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from webhook.cluster.slices import Device
from webhook.deploy.device_classes import reservation_for
from webhook.ops.capacity import CapacityModel, Holder
from webhook.ops.lending.decisions import Waiting
from webhook.ops.lending.demand import SPLIT, WHOLE, Demand, reserved_demand

DRIVER = "gpu.amd.com"
BORROWER = Holder("ml", "b", "training", borrower=True)
INFERENCE = Holder("serve", "i", "inference", inference=True)
TRAINING = Holder("ml", "t", "training")  # not a borrower: a violation, neither lent nor idle
DEVICES = {
    node: tuple(Device(node, node, f"gpu-{i}", f"0000:{0x10 + i:02x}:00.0", DRIVER) for i in range(4))
    for node in ("d0", "d1")
}
# The two lowest PCI bus IDs of every split node reserved (pool apply --devices-per-node 2).
RESERVATION = reservation_for([d.pci_bus_id for d in DEVICES["d0"][:2]], 2)


def model() -> CapacityModel:
    """Two nodes reserved whole (4 GPUs each), a shared node, two DRA nodes split 2 + 2."""
    return CapacityModel.build(
        [("r0", 4, True), ("r1", 4, True), ("s0", 4, False), ("d0", 0, False), ("d1", 0, False)],
        DEVICES,
        RESERVATION,
        ["d0", "d1"],
        DRIVER,
    )


def device(node: str, index: int) -> tuple[str, str, str]:
    return (DRIVER, node, f"gpu-{index}")


@dataclass(frozen=True)
class Case:
    name: str
    pods: tuple[tuple[Holder, str, int, tuple[tuple[str, str, str], ...]], ...]
    waiting: tuple[Waiting, ...]
    whole: Demand
    split: Demand


EMPTY_WHOLE = Demand(nodes=2, node_gpus=8, reserved=8, idle=8)
EMPTY_SPLIT = Demand(nodes=2, node_gpus=8, reserved=4, idle=4)
CASES = [
    Case("nothing runs: every reserved GPU idle", (), (), EMPTY_WHOLE, EMPTY_SPLIT),
    Case(
        "whole nodes: inference, a borrower, a violation, waiting pods",
        (
            (INFERENCE, "r0", 3, ()),
            (BORROWER, "r1", 2, ()),
            (TRAINING, "r1", 1, ()),
            (Holder("ml", "shared", "training"), "s0", 4, ()),  # the shared pool is not the reservation's
        ),
        (Waiting("serve", "w1", "u1", 4), Waiting("serve", "w2", "u2", 1)),
        Demand(nodes=2, node_gpus=8, reserved=8, inference=3, waiting=5, lent=2, idle=2),
        EMPTY_SPLIT,
    ),
    Case(
        "split nodes: reserved devices by side; shared devices are not the reservation's",
        (
            (INFERENCE, "d0", 0, (device("d0", 0), device("d0", 1))),
            (BORROWER, "d1", 0, (device("d1", 0), device("d1", 2))),  # one reserved device lent, one shared
        ),
        (Waiting("serve", "w", "u", 2, devices=True),),
        EMPTY_WHOLE,
        Demand(nodes=2, node_gpus=8, reserved=4, inference=2, waiting=2, lent=1, idle=1),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reserved_demand_per_kind_of_node(case: Case) -> None:
    found = model()
    for holder, node, gpus, results in case.pods:
        found.add_pod(holder, node, gpus, results)
    assert reserved_demand(found, case.waiting) == {WHOLE: case.whole, SPLIT: case.split}


def test_a_kind_without_nodes_is_zero_and_over_allocation_is_not_negative_idle() -> None:
    found = CapacityModel.build([("r0", 2, True)], {}, None, [], DRIVER)
    found.add_pod(INFERENCE, "r0", 3)  # readings that disagree: more held than the node has
    assert reserved_demand(found, ()) == {
        WHOLE: Demand(nodes=1, node_gpus=2, reserved=2, inference=3, idle=0),
        SPLIT: Demand(),
    }
