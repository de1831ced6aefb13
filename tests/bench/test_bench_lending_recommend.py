"""The tools of ``make bench-lending-recommend`` (bench/lending_recommend.py): the webhook's demand gauges recorded
at each sample become the OpenMetrics file ``pool recommend --from-file`` reads, series by series in time order."""

from __future__ import annotations

from bench.lending_recommend import TRACE_START, gauge_lines, openmetrics
from webhook.ops.recommend.history import Grid, from_samples, parse_openmetrics

SCRAPE = """\
# HELP rocm_isolation_reserved_gpus Reserved GPUs (the reserved side of those nodes): the reservation's size.
# TYPE rocm_isolation_reserved_gpus gauge
rocm_isolation_reserved_gpus{nodes="whole",pool="reserved"} 32.0
rocm_isolation_reserved_gpus{nodes="split",pool="reserved"} 16.0
rocm_isolation_reserved_gpus_inference{nodes="whole",pool="reserved"} %d
rocm_isolation_lending_closed_nodes 3.0
"""


def test_recorded_scrapes_become_openmetrics_that_recommend_reads() -> None:
    records = [(TRACE_START + minute * 60.0, gauge_lines(SCRAPE % held)) for minute, held in ((0, 4), (1, 8), (2, 12))]
    assert all(len(lines) == 3 for _, lines in records)  # the demand gauges only
    text = openmetrics(reversed(records))  # in any order: written in time order per series
    samples = parse_openmetrics(text)
    held = [s for s in samples if s.name == "rocm_isolation_reserved_gpus_inference"]
    assert [(s.timestamp - TRACE_START, s.value) for s in held] == [(0, 4), (60, 8), (120, 12)]
    assert text.endswith("# EOF\n") and text.count("# TYPE rocm_isolation_reserved_gpus gauge") == 1
    history = from_samples(samples, Grid(TRACE_START, 60.0, 3))
    assert history.series(("reserved", "whole"), "inference") == [4, 8, 12]
    assert history.series(("reserved", "split"), "reserved") == [16, 16, 16]
