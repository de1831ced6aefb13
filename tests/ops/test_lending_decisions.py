"""Lending as decisions on the capacity model: which reserved nodes take no new borrowers, whom to evict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from webhook.cluster.slices import Device
from webhook.deploy.device_classes import reservation_for
from webhook.ops.capacity import CapacityModel, Holder
from webhook.ops.lending import Waiting, closed_nodes, lent_per_node, reclaim

DRIVER = "gpu.amd.com"
T0 = datetime(2026, 12, 4, tzinfo=UTC)


def borrower(name: str, minutes: int = 0) -> Holder:
    return Holder("ml", name, "training", borrower=True, created=T0 + timedelta(minutes=minutes))


def inference(name: str) -> Holder:
    return Holder("serve", name, "inference", inference=True, created=T0)


def whole_nodes(*gpus: int) -> CapacityModel:
    return CapacityModel.build([(f"r{i}", n, True) for i, n in enumerate(gpus)], {}, None, [], DRIVER)


def test_headroom_closes_the_emptiest_idle_nodes_until_their_free_gpus_cover_it() -> None:
    model = whole_nodes(4, 4, 4, 4)
    model.add_pod(borrower("b0"), "r0", 4)  # lent: stays open
    model.add_pod(inference("i1"), "r1", 3)  # 1 free
    assert closed_nodes(model, 0, []) == set()
    assert closed_nodes(model, 4, []) == {"r2"}
    assert closed_nodes(model, 5, []) == {"r2", "r3"}
    assert closed_nodes(model, 100, []) == {"r1", "r2", "r3"}  # never a node where borrowers run
    assert lent_per_node(model) == {"r0": 4, "r1": 0, "r2": 0, "r3": 0}


def test_every_reserved_node_is_closed_while_inference_waits() -> None:
    model = whole_nodes(4, 4)
    model.add_pod(borrower("b0"), "r0", 4)
    assert closed_nodes(model, 0, [Waiting("serve", "llm", "u", 2)]) == {"r0", "r1"}


def test_reclaim_takes_the_fewest_borrowers_then_the_youngest_never_inference() -> None:
    model = whole_nodes(4, 4)
    model.add_pod(borrower("old-big", 0), "r0", 3)
    model.add_pod(inference("i0"), "r0", 1)
    model.add_pod(borrower("young-1", 5), "r1", 1)
    model.add_pod(borrower("young-2", 6), "r1", 1)
    model.add_pod(borrower("young-3", 7), "r1", 2)
    found = reclaim(model, Waiting("serve", "llm", "u", 3))
    assert found is not None and found.node == "r0" and [h.name for h in found.victims] == ["old-big"]
    found = reclaim(model, Waiting("serve", "llm", "u", 2))
    # One victim either way: r1's youngest two-GPU borrower over r0's older one.
    assert found is not None and (found.node, [h.name for h in found.victims]) == ("r1", ["young-3"])


def test_a_borrower_a_budget_protects_is_spared_and_another_taken() -> None:
    model = whole_nodes(2, 2)
    model.add_pod(borrower("b0", 1), "r0", 2)
    model.add_pod(borrower("b1", 0), "r1", 2)
    found = reclaim(model, Waiting("serve", "llm", "u", 2), spared=[("ml", "b0")])
    assert found is not None and [h.name for h in found.victims] == ["b1"]
    assert reclaim(model, Waiting("serve", "llm", "u", 2), spared=[("ml", "b0"), ("ml", "b1")]) is None


def test_nothing_to_reclaim_when_it_fits_or_never_could() -> None:
    model = whole_nodes(4)
    model.add_pod(borrower("b0"), "r0", 1)
    assert reclaim(model, Waiting("serve", "llm", "u", 3)) is None  # fits now: the scheduler places it
    model.add_pod(Holder("ml", "strict", "training"), "r0", 3)  # a non-borrower is never evicted
    assert reclaim(model, Waiting("serve", "llm", "u", 4)) is None


def test_devices_are_reclaimed_on_split_nodes_only() -> None:
    devices = tuple(Device("d1", "d1", f"gpu-{i}", f"0000:{0x10 + i:02x}:00.0", DRIVER) for i in range(4))
    reservation = reservation_for([d.pci_bus_id for d in devices[:2]], 2)
    model = CapacityModel.build([("d1", 0, False), ("r0", 2, True)], {"d1": devices}, reservation, ["d1"], DRIVER)
    model.add_pod(borrower("b-dev"), "d1", 0, [(DRIVER, "d1", "gpu-0"), (DRIVER, "d1", "gpu-1")])
    model.add_pod(borrower("b-node"), "r0", 2)
    found = reclaim(model, Waiting("serve", "llm", "u", 1, devices=True))
    assert found is not None and (found.node, [h.name for h in found.victims]) == ("d1", ["b-dev"])
    found = reclaim(model, Waiting("serve", "llm", "u", 1))
    assert found is not None and found.node == "r0"
