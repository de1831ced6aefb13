"""The exporter's series normalised (webhook/ops/gpus/series.py): both prefixes, both label schemes, partitions."""

from __future__ import annotations

from pathlib import Path

from webhook.ops.gpus.exposition import Sample, parse
from webhook.ops.gpus.series import SELECTOR, PodRef, collect, field_of

FIXTURES = Path(__file__).parents[2] / "fixtures" / "gpus"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_both_prefixes_name_the_same_fields_and_nothing_else_is_read() -> None:
    assert field_of("gpu_gfx_activity") == field_of("amd_gpu_gfx_activity") == "gfx_activity"
    assert field_of("gpu_junction_temperature") == "junction_temperature"
    assert field_of("gpu_power_usage") is None
    assert field_of("amd_gfx_activity") is None
    assert field_of("nvidia_gpu_used_vram") is None
    assert SELECTOR.startswith('{__name__=~"(amd_)?gpu_(gfx_activity|used_vram|health|')


def test_honored_labels_name_the_pod_and_an_unallocated_gpu_names_none() -> None:
    readings = collect(parse(read("kaiwo-mi300x.prom"), 1000.0))
    gpus = readings.gpus
    assert set(gpus) == {("tw038", "692409005328"), ("tw038", "692409005408")}
    busy, idle = gpus[("tw038", "692409005328")], gpus[("tw038", "692409005408")]
    assert busy.points[1000.0].pods == {PodRef("default", "high-utilization-57ls6", "workload")}
    assert busy.points[1000.0].activity == 100.0 and busy.gpu_ids == {"0"}
    assert idle.points[1000.0].pods == set() and idle.points[1000.0].activity == 0.0
    assert readings.end == 1000.0


def test_the_chart_prefix_with_timestamps_is_a_history_with_pids() -> None:
    readings = collect(parse(read("chart-amd-prefix.prom"), 0.0))
    gpu = readings.gpus[("mi325x8-110", "PHXS3250112")]
    assert len(gpu.points) == 13
    assert gpu.times()[-1] - gpu.times()[0] == 360.0
    point = gpu.points[gpu.newest]
    assert (point.activity, point.vram, point.health, point.temperature) == (83.0, 151232.0, 1.0, 82.0)
    assert point.pids == {"2912425"} and point.pods == set()
    assert readings.end == gpu.newest


def test_without_honor_labels_the_exported_pod_is_the_pod_and_the_exporters_own_names_nobody() -> None:
    readings = collect(parse(read("unhonored.prom"), 50.0))
    assert readings.gpus[("node-a", "S0")].points[50.0].pods == {PodRef("training", "train-0", "trainer")}
    # pod="amd-gpu-metrics-exporter-x7k2p" on GPU 1 is the exporter's own pod (same target, exported_* seen)
    assert readings.gpus[("node-a", "S1")].points[50.0].pods == set()


def test_partitions_of_one_gpu_are_one_gpu_activity_from_partition_zero_vram_summed() -> None:
    def sample(name: str, gpu_id: str, part: str, value: float, pod: str) -> Sample:
        labels = {"hostname": "n", "gpu_id": gpu_id, "gpu_partition_id": part, "serial_number": "S", "pod": pod}
        labels["namespace"] = "ns" if pod else ""
        return Sample(name, labels, value, 10.0)

    readings = collect(
        [
            sample("gpu_gfx_activity", "0", "0", 60, "a"),
            sample("gpu_used_vram", "0", "0", 100, "a"),
            sample("gpu_used_vram", "1", "1", 250, "b"),
            sample("gpu_health", "1", "1", 0, "b"),
            sample("gpu_health", "0", "0", 1, "a"),
        ]
    )
    (gpu,) = readings.gpus.values()
    point = gpu.points[10.0]
    assert (point.activity, point.vram, point.health) == (60.0, 350.0, 0.0)
    assert {p.name for p in point.pods} == {"a", "b"} and gpu.gpu_ids == {"0", "1"}


def test_a_series_without_hostname_is_said_not_guessed() -> None:
    readings = collect([Sample("gpu_gfx_activity", {"gpu_id": "0"}, 50, 1.0)])
    assert readings.gpus == {}
    assert readings.problems == [
        "1 GPU samples have no hostname label (the exporter's NODE_NAME): not mapped to a node"
    ]
