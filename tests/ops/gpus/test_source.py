"""Where the exporter's series come from (webhook/ops/gpus/source.py): Prometheus's HTTP API, against a local HTTP
server answering as Prometheus does (the real one: tests/e2e/test_e2e_gpu_metrics.py), and files."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_stub import Prometheus, serving

from webhook.ops.gpus.judge import Thresholds
from webhook.ops.gpus.series import SELECTOR, PodRef
from webhook.ops.gpus.source import GpuSourceError, read_file, read_prometheus, step_for
from webhook.ops.prometheus import Server

NOW = 1_786_000_000.0


@pytest.fixture
def server() -> Iterator[str]:
    with serving() as url:
        yield url


FIXTURES = Path(__file__).parents[2] / "fixtures" / "gpus"


def matrix(*series: tuple[dict[str, str], list[list[Any]]]) -> dict[str, Any]:
    result = [{"metric": metric, "values": values} for metric, values in series]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


# As Prometheus answers for the exporter scraped without honorLabels: the pod is exported_pod.
UNHONORED = {
    "__name__": "gpu_gfx_activity",
    "exported_namespace": "training",
    "exported_pod": "train-0",
    "gpu_id": "0",
    "hostname": "node-a",
    "instance": "10.0.0.5:5000",
    "job": "amd-metrics-exporter",
    "namespace": "kube-amd-gpu",
    "pod": "amd-gpu-metrics-exporter-x7k2p",
    "serial_number": "S0",
}
CHART = {"__name__": "amd_gpu_used_vram", "gpu_id": "1", "hostname": "node-a", "serial_number": "S1"}


def test_one_range_query_of_both_prefixes_over_the_window_and_the_staleness_with_the_token(server: str) -> None:
    limits = Thresholds(window_seconds=300, max_gap_seconds=120, stale_seconds=300)
    values = [[NOW - 30, "97"], [NOW - 15, "96"], [NOW, "98"]]
    Prometheus.answers = {SELECTOR: (200, matrix((UNHONORED, values), (CHART, [[NOW, "2048"]])))}
    readings = read_prometheus(Server(server, token="s3cret"), NOW, limits)
    [(path, fields, auth)] = Prometheus.seen
    assert (path, auth) == ("/api/v1/query_range", "Bearer s3cret")
    assert (
        fields["query"]
        == SELECTOR
        == '{__name__=~"(amd_)?gpu_(gfx_activity|used_vram|health|edge_temperature|junction_temperature|memory_temperature)"}'
    )
    # The window and the staleness allowance before now, and a step more: a stale node's last samples are read.
    assert (float(fields["start"]), float(fields["end"]), float(fields["step"])) == (NOW - 300 - 300 - 15, NOW, 15.0)
    assert readings.end == NOW
    busy, memory = readings.gpus[("node-a", "S0")], readings.gpus[("node-a", "S1")]
    assert [busy.points[t].activity for t in busy.times()] == [97.0, 96.0, 98.0]
    # exported_pod is the pod; the pod label there is the exporter's own and names nobody.
    assert busy.pods() == {PodRef("training", "train-0")}
    assert memory.points[NOW].vram == 2048.0 and memory.pods() == set()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (401, "Unauthorized", "GPU metrics: http://127.0.0.1:"),
        (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, "query_range answered no matrix"),
        (200, {"status": "success", "data": {"resultType": "matrix", "result": [{"values": []}]}}, "not in the shape"),
        (200, matrix(({"__name__": "gpu_gfx_activity"}, [[NOW, "many"]])), "not in the shape of a matrix"),
        (200, matrix(), "has no series of AMD's device metrics exporter (gpu_*, amd_gpu_*) in the last window"),
    ],
)
def test_refusals_odd_answers_and_no_series_are_one_line(server: str, status: int, body: Any, message: str) -> None:
    Prometheus.answers = {"*": (status, body)}
    with pytest.raises(GpuSourceError) as raised:
        read_prometheus(Server(server), NOW, Thresholds())
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_unreachable_prometheus_is_one_line() -> None:
    with pytest.raises(GpuSourceError, match=r"^GPU metrics: cannot reach Prometheus at http://127\.0\.0\.1:9"):
        read_prometheus(Server("http://127.0.0.1:9"), NOW, Thresholds())


@pytest.mark.parametrize(
    ("window", "gap", "step"),
    [
        (300, 120, 15.0),  # the defaults: a point every 15 s
        (7200, 300, 120.0),  # a long window: 60 points over it
        (7200, 100, 50.0),  # never more than half the gap allowed
        (8, 4, 2.0),  # a short gap: a short step (the e2e's), not 15 s that every gap would break
        (8, 1, 1.0),  # at least a second
    ],
)
def test_the_step_is_within_half_the_gap_allowed(window: int, gap: int, step: float) -> None:
    assert step_for(Thresholds(window_seconds=window, max_gap_seconds=gap)) == step


def test_a_file_plain_or_gzipped_and_what_is_not_one(tmp_path: Path) -> None:
    text = (FIXTURES / "chart-amd-prefix.prom").read_text(encoding="utf-8")
    plain, packed = tmp_path / "now.prom", tmp_path / "now.prom.gz"
    plain.write_text(text, encoding="utf-8")
    packed.write_bytes(gzip.compress(text.encode()))
    assert (
        read_file(plain).gpus.keys()
        == read_file(packed).gpus.keys()
        == {
            ("mi325x8-110", "PHXS3250112"),
            ("mi325x8-110", "PHXS3250187"),
        }
    )
    other = tmp_path / "other.prom"
    other.write_text("node_cpu_seconds_total 1\n", encoding="utf-8")
    with pytest.raises(GpuSourceError, match="no series of AMD's device metrics exporter"):
        read_file(other)
    broken = tmp_path / "broken.prom"
    broken.write_text('gpu_gfx_activity{hostname="a" 1\n', encoding="utf-8")
    with pytest.raises(GpuSourceError, match="not the exporter's text format: line 1"):
        read_file(broken)
    with pytest.raises(GpuSourceError, match=r"missing\.prom"):
        read_file(tmp_path / "missing.prom")
