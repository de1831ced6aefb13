"""The reserved GPUs judged on what the exporter reports (webhook/ops/gpus/mapping.py, judge.py), against the
capacity model of whole and split nodes: sustained use, not one sample; stale nodes never read as idle."""

from __future__ import annotations

from pathlib import Path

from webhook.cluster.slices import Device
from webhook.deploy.device_classes import DeviceReservation
from webhook.ops.capacity import RESERVED, SHARED, CapacityModel, Holder
from webhook.ops.gpus.exposition import Sample, parse
from webhook.ops.gpus.judge import Observation, Thresholds, judge
from webhook.ops.gpus.mapping import UNKNOWN, place
from webhook.ops.gpus.series import collect

FIXTURES = Path(__file__).parents[2] / "fixtures" / "gpus"
DRIVER = "gpu.amd.com"
LIMITS = Thresholds(window_seconds=300, max_gap_seconds=120, stale_seconds=300)
KEPT_OFF = {"training"}


def bus(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


def whole(*nodes: tuple[str, int, bool]) -> CapacityModel:
    return CapacityModel.build(nodes, {}, None, (), DRIVER)


def split_model(node: str, gpus: int, reserved: int) -> tuple[CapacityModel, tuple[Device, ...]]:
    devices = tuple(Device(node, node, f"gpu-{i}", bus(i), DRIVER) for i in range(gpus))
    reservation = DeviceReservation(reserved, tuple(bus(i) for i in range(reserved)))
    return CapacityModel.build([(node, gpus, False)], {node: devices}, reservation, [node], DRIVER), devices


def history(
    node: str, serial: str, values: list[float], pod: str = "", namespace: str = "", **extra: str
) -> list[Sample]:
    """``gpu_gfx_activity`` of one GPU every 30 s, ending at t=1000+30*(len-1)."""
    labels = {"hostname": node, "gpu_id": serial[-1], "serial_number": serial, "pod": pod, "namespace": namespace}
    labels.update(extra)
    return [Sample("gpu_gfx_activity", labels, v, 1000.0 + 30 * i) for i, v in enumerate(values)]


def rules(found: list[Observation]) -> list[str]:
    return [o.rule for o in found]


def test_the_incident_a_reserved_gpu_busy_with_no_pod_is_found_with_since_and_pids() -> None:
    readings = collect(parse((FIXTURES / "chart-amd-prefix.prom").read_text(), 0.0))
    result = judge(readings, whole(("mi325x8-110", 8, True)), LIMITS, KEPT_OFF)
    assert rules(result.observations) == ["reserved-gpu-used-unallocated"]
    (found,) = result.observations
    assert found.node == "mi325x8-110" and found.pod is None
    assert "since 2026-08-06T" in found.message and "PIDs 2912425" in found.message
    assert "activity 83 %, VRAM 151232 MB" in found.message
    assert result.gpus_judged == 2 and result.lines == []


def test_the_same_gpus_on_a_shared_node_are_not_judged() -> None:
    readings = collect(parse((FIXTURES / "chart-amd-prefix.prom").read_text(), 0.0))
    result = judge(readings, whole(("mi325x8-110", 8, False)), LIMITS, KEPT_OFF)
    assert result.observations == [] and result.gpus_judged == 0


def test_one_busy_sample_is_not_use_and_a_gap_breaks_the_run() -> None:
    model = whole(("n", 2, True))
    short = collect(history("n", "S0", [0] * 8 + [99] * 5))  # busy 120 s of a 300 s window
    assert judge(short, model, LIMITS, KEPT_OFF).observations == []
    single = collect(history("n", "S0", [99]))
    assert judge(single, model, LIMITS, KEPT_OFF).observations == []
    gappy = [s for s in history("n", "S0", [99] * 13) if s.timestamp not in (1120.0, 1150.0, 1180.0, 1210.0)]
    assert judge(collect(gappy), model, LIMITS, KEPT_OFF).observations == []
    assert rules(judge(collect(history("n", "S0", [99] * 13)), model, LIMITS, KEPT_OFF).observations) == [
        "reserved-gpu-used-unallocated"
    ]


def test_vram_in_use_counts_as_use_without_activity() -> None:
    labels = {"hostname": "n", "gpu_id": "0", "serial_number": "S0"}
    samples = [Sample("gpu_used_vram", labels, 60000, 1000.0 + 30 * i) for i in range(11)]
    samples += [Sample("gpu_gfx_activity", labels, 0, 1000.0 + 30 * i) for i in range(11)]
    assert rules(judge(collect(samples), whole(("n", 1, True)), LIMITS, KEPT_OFF).observations) == [
        "reserved-gpu-used-unallocated"
    ]


def test_a_stale_node_is_not_read_as_idle_or_busy_and_is_said_in_one_line() -> None:
    samples = history("a", "S0", [99] * 13) + history("b", "S1", [0] * 30)  # a stopped 510 s before the end
    result = judge(collect(samples), whole(("a", 1, True), ("b", 1, True)), LIMITS, KEPT_OFF)
    assert result.observations == [] and result.stale == ["a"]
    assert result.lines == [
        "exporter series of node a stopped at 1970-01-01T00:22:40Z: its GPUs are not judged (not read as idle)"
    ]
    assert [load.node for load in result.loads] == ["b"]


def test_reserved_nodes_without_series_and_series_of_unknown_nodes_are_said() -> None:
    samples = history("a", "S0", [0] * 11) + history("ghost", "S9", [99] * 11)
    result = judge(collect(samples), whole(("a", 1, True), ("b", 4, True), ("c", 4, False)), LIMITS, KEPT_OFF)
    assert result.observations == []
    assert result.lines == [
        "exporter series for 1 node(s) the cluster does not have (ghost): not judged",
        "no exporter series for 1 node(s) with reserved GPUs (b): their GPUs are not judged",
    ]


def test_a_training_pod_busy_on_a_reserved_gpu_is_confirmed_by_the_gpu_a_borrower_is_not() -> None:
    model = whole(("n", 2, True))
    model.add_pod(Holder("ml", "train-0", "training"), "n", 1)
    model.add_pod(Holder("ml", "borrow-0", "training", borrower=True), "n", 1)
    samples = history("n", "S0", [97] * 11, pod="train-0", namespace="ml")
    samples += history("n", "S1", [97] * 11, pod="borrow-0", namespace="ml")
    result = judge(collect(samples), model, LIMITS, KEPT_OFF)
    assert rules(result.observations) == ["reserved-gpu-used-by-other-class"]
    assert result.observations[0].pod is not None and result.observations[0].pod.ref == ("ml", "train-0")
    idle = judge(collect(history("n", "S0", [3] * 11, pod="train-0", namespace="ml")), model, LIMITS, KEPT_OFF)
    assert idle.observations == []


def test_a_pod_the_cluster_does_not_know_on_the_gpu_leaves_it_unallocated() -> None:
    samples = history("n", "S0", [90] * 11, pod="gone-7", namespace="ml")
    result = judge(collect(samples), whole(("n", 1, True)), LIMITS, KEPT_OFF)
    assert rules(result.observations) == ["reserved-gpu-used-unallocated"]
    assert (
        "the exporter names ml/gone-7, which holds no GPU of this node in the cluster" in result.observations[0].message
    )
    assert "PIDs not reported" in result.observations[0].message


def test_unhealthy_hot_and_inference_load_on_reserved_gpus() -> None:
    model = whole(("n", 3, True))
    model.add_pod(Holder("inf", "serve-0", "inference", inference=True), "n", 1)
    labels = {"hostname": "n", "gpu_id": "0", "serial_number": "S0"}
    samples = history("n", "S2", [96] * 11, pod="serve-0", namespace="inf")
    samples += [Sample("gpu_health", labels, 0, 1300.0), Sample("gpu_junction_temperature", labels, 101, 1300.0)]
    samples += [Sample("gpu_edge_temperature", dict(labels, serial_number="S1"), 60, 1300.0)]
    result = judge(collect(samples), model, LIMITS, KEPT_OFF)
    assert sorted(rules(result.observations)) == [
        "reserved-gpu-hot",
        "reserved-gpu-inference-load-high",
        "reserved-gpu-unhealthy",
    ]
    loads = {load.gpu: (round(load.activity_percent), load.inference) for load in result.loads}
    assert loads["gpu_id 2 (serial S2)"] == (96, True)


def test_each_reserved_gpus_load_has_its_mean_peak_vram_and_holders_over_the_window() -> None:
    model = whole(("n", 2, True))
    serve = Holder("inf", "serve-0", "inference", inference=True)
    model.add_pod(serve, "n", 1)
    # 13 points every 30 s (1000..1360): the window (300 s) holds the last 11; the 99 before it is not counted.
    samples = history("n", "S0", [99, 99] + [20] * 8 + [50, 80, 30], pod="serve-0", namespace="inf")
    samples.append(Sample("gpu_used_vram", {"hostname": "n", "gpu_id": "0", "serial_number": "S0"}, 4096, 1360.0))
    samples += history("n", "S1", [0] * 13)
    loads = {load.gpu: load for load in judge(collect(samples), model, LIMITS, KEPT_OFF).loads}
    held = loads["gpu_id 0 (serial S0)"]
    assert (round(held.activity_percent, 1), held.peak_percent, held.vram_mb) == (29.1, 80.0, 4096.0)
    assert (held.holders, held.inference) == ((serve,), True)
    free = loads["gpu_id 1 (serial S1)"]
    assert (free.activity_percent, free.peak_percent, free.vram_mb, free.holders, free.inference) == (
        0.0,
        0.0,
        None,
        (),
        False,
    )


def test_a_split_node_places_attributed_gpus_by_their_pods_and_the_rest_by_elimination() -> None:
    model, _ = split_model("n", 4, 2)  # gpu-0, gpu-1 reserved
    model.add_pod(Holder("ml", "train-0", "training"), "n", 0, [(DRIVER, "n", "gpu-1")])
    model.add_pod(Holder("ml", "other", "training"), "n", 0, [(DRIVER, "n", "gpu-2")])
    model.add_pod(Holder("inf", "serve", "inference", inference=True), "n", 0, [(DRIVER, "n", "gpu-3")])
    # The exporter's gpu_ids say nothing of PCI order: shuffled on purpose.
    samples = history("n", "S3", [97] * 11, pod="train-0", namespace="ml")
    samples += history("n", "S0", [0] * 11, pod="other", namespace="ml")
    samples += history("n", "S1", [98] * 11)  # no pod: the one GPU no pod holds, gpu-0 (reserved)
    samples += history("n", "S2", [10] * 11, pod="serve", namespace="inf")
    placed = {p.gpu.key: (p.side, p.pci_bus_id) for p in place(collect(samples), model).placed}
    assert placed == {
        "S3": (RESERVED, bus(1)),
        "S0": (SHARED, bus(2)),
        "S1": (RESERVED, bus(0)),
        "S2": (SHARED, bus(3)),
    }
    result = judge(collect(samples), model, LIMITS, KEPT_OFF)
    assert sorted(rules(result.observations)) == ["reserved-gpu-used-by-other-class", "reserved-gpu-used-unallocated"]
    assert all(f"PCI {bus(0)}" in o.message or f"PCI {bus(1)}" in o.message for o in result.observations)


def test_a_split_node_with_free_gpus_on_both_sides_does_not_guess_but_reports_unallocated_use_as_maybe_reserved() -> (
    None
):
    model, _ = split_model("n", 4, 2)
    samples = history("n", "S0", [99] * 11, kfd_process_id="77") + history("n", "S1", [0] * 11)
    result = judge(collect(samples), model, LIMITS, KEPT_OFF)
    # Use nobody was allocated is the incident itself: reported, not guessed onto a side or a PCI bus ID.
    [found] = result.observations
    assert (found.rule, found.node, found.pod) == ("reserved-gpu-used-unallocated", "n", None)
    assert found.message == (
        "GPU on node n gpu_id 0 (serial S0) is in use with no pod allocated it since 1970-01-01T00:16:40Z (activity "
        "99 %, VRAM ? MB); PIDs 77: it is one of the node's 4 GPUs no pod holds, 2 of which are reserved, so it may "
        "be a reserved one (the exporter names no PCI bus ID to tell which); a process outside Kubernetes, or a "
        "container that reached it through AMD_VISIBLE_DEVICES"
    )
    # Not judged as a reserved GPU otherwise: no load, not counted.
    assert (result.gpus_judged, result.loads) == (0, [])
    placed = place(collect(samples), model).placed
    assert {(p.side, p.candidates, p.reserved_candidates) for p in placed} == {(UNKNOWN, 4, 2)}
    # Idle, or busy for less than the window: nothing.
    quiet = history("n", "S0", [0] * 5 + [99] * 6) + history("n", "S1", [0] * 11)
    assert judge(collect(quiet), model, LIMITS, KEPT_OFF).observations == []
    assert result.lines == [
        "split node n: 2 GPU(s) the exporter reports could not be placed on a side (gpu_id 0 (serial S0); gpu_id 1 "
        "(serial S1)): the exporter names no PCI bus ID, and the pods holding them do not tell"
    ]


def test_a_split_node_whose_free_gpus_are_all_reserved_knows_the_side_without_the_gpu() -> None:
    model, _ = split_model("n", 4, 2)
    model.add_pod(Holder("ml", "a", "training"), "n", 0, [(DRIVER, "n", "gpu-2")])
    model.add_pod(Holder("ml", "b", "training"), "n", 0, [(DRIVER, "n", "gpu-3")])
    samples = history("n", "S0", [99] * 11) + history("n", "S1", [0] * 11)
    placed = place(collect(samples), model).placed
    assert {(p.side, p.pci_bus_id) for p in placed} == {(RESERVED, "")}
    assert rules(judge(collect(samples), model, LIMITS, KEPT_OFF).observations) == ["reserved-gpu-used-unallocated"]
