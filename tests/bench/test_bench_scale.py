"""The pure parts of ``make bench-scale`` (bench/scale_figures.py and the figures of bench/scale.py): the apiserver's
metrics parsed and differenced, a histogram's quantiles, ``/proc`` read, the extrapolation, the goals and the section
written in place. The run itself needs a control plane (``make bench-scale``)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import scale, sections
from bench import scale_figures as sf

APISERVER_BEFORE = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="status",verb="PATCH",version="v1"} 1
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 1e+06
apiserver_response_sizes_count{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 10
apiserver_watch_events_total{group="",resource="nodes",version="v1"} 100
apiserver_watch_events_sizes_sum{group="",resource="nodes",version="v1"} 50000
apiserver_longrunning_requests{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
"""

APISERVER_AFTER = """\
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 22
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 6
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="status",verb="PATCH",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="leases",scope="namespace",subresource="",verb="PUT",version="v1"} 30
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 2.2e+06
apiserver_response_sizes_count{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 22
apiserver_watch_events_total{group="",resource="nodes",version="v1"} 160
apiserver_watch_events_sizes_sum{group="",resource="nodes",version="v1"} 80000
apiserver_longrunning_requests{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 0
"""


def test_prometheus_text_is_parsed_with_labels_and_comments_skipped() -> None:
    samples = sf.parse_prometheus(APISERVER_BEFORE)
    key = (
        "apiserver_response_sizes_sum",
        frozenset(
            {
                ("component", "apiserver"),
                ("group", ""),
                ("resource", "pods"),
                ("scope", "cluster"),
                ("subresource", ""),
                ("verb", "LIST"),
                ("version", "v1"),
            }
        ),
    )
    assert samples[key] == 1e6
    assert len(samples) == 9


def test_parsing_keeps_only_the_wanted_names_and_reads_escapes_and_timestamps() -> None:
    text = 'a_total{path="/x \\"y\\""} 3 1700000000000\nb_total 4\nbad line\nc_total{x="1"} NaNish\n'
    samples = sf.parse_prometheus(text, ["a_total"])
    assert samples == {("a_total", frozenset({("path", '/x "y"')})): 3.0}
    assert sf.parse_prometheus(text)[("b_total", frozenset())] == 4.0


def test_difference_counts_new_samples_from_zero_and_a_restart_from_its_new_value() -> None:
    before = {("x", frozenset()): 10.0, ("y", frozenset()): 5.0}
    after = {("x", frozenset()): 15.0, ("y", frozenset()): 2.0, ("z", frozenset()): 7.0}
    assert sf.difference(before, after) == {("x", frozenset()): 5.0, ("y", frozenset()): 2.0, ("z", frozenset()): 7.0}


def test_traffic_per_minute_by_verb_and_resource_with_watch_bytes_from_the_events() -> None:
    diff = sf.difference(sf.parse_prometheus(APISERVER_BEFORE), sf.parse_prometheus(APISERVER_AFTER))
    flows = sf.traffic(diff, 30.0)  # a 30 s window: everything doubles per minute
    assert flows["LIST"]["pods"] == sf.Flow(requests=24.0, bytes=2.4e6)
    assert flows["LIST"]["nodes"] == sf.Flow(requests=6.0, bytes=0.0)
    assert flows["PATCH"]["pods/status"].requests == 6.0
    assert flows["PUT"]["leases"].requests == 60.0
    assert flows["WATCH"]["nodes"] == sf.Flow(requests=0.0, bytes=60000.0, events=120.0)
    assert sf.all_bytes(flows) == pytest.approx(2.4e6 + 6e4)
    assert sf.verb_total(flows, "LIST") == sf.Flow(requests=30.0, bytes=2.4e6)
    assert sf.open_watches(sf.parse_prometheus(APISERVER_AFTER)) == {"nodes": 3.0}
    with pytest.raises(ValueError):
        sf.traffic(diff, 0)


def test_background_is_subtracted_and_never_below_zero() -> None:
    window = {"LIST": {"pods": sf.Flow(10, 1000)}, "WATCH": {"nodes": sf.Flow(0, 50, 5)}}
    background = {"LIST": {"pods": sf.Flow(2, 1500)}, "WATCH": {"leases": sf.Flow(0, 10, 1)}}
    assert sf.minus(window, background) == {"LIST": {"pods": sf.Flow(8, 0)}, "WATCH": {"nodes": sf.Flow(0, 50, 5)}}


def test_watch_events_of_older_apiservers_name_the_kind() -> None:
    diff = {("apiserver_watch_events_sizes_sum", frozenset({("kind", "Pod"), ("group", "")})): 600.0}
    assert sf.traffic(diff, 60.0)["WATCH"]["Pod"].bytes == 600.0


def round_histogram(counts: dict[str, float], count: float, total: float) -> sf.Samples:
    name = "rocm_isolation_lending_round_seconds"
    samples: sf.Samples = {(f"{name}_bucket", frozenset({("le", le)})): c for le, c in counts.items()}
    samples[f"{name}_count", frozenset()] = count
    samples[f"{name}_sum", frozenset()] = total
    return samples


def test_quantiles_of_a_differenced_histogram_as_histogram_quantile() -> None:
    before = round_histogram({"0.1": 5, "0.5": 5, "1.0": 5, "+Inf": 5}, 5, 0.3)
    after = round_histogram({"0.1": 5, "0.5": 15, "1.0": 25, "+Inf": 25}, 25, 10.3)
    buckets, count, total = sf.histogram(sf.difference(before, after), "rocm_isolation_lending_round_seconds")
    assert buckets == [(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (float("inf"), 20.0)]
    assert (count, total) == (20.0, 10.0)
    assert sf.quantile(0.5, buckets) == pytest.approx(0.5)  # rank 10: the top of (0.1, 0.5]
    assert sf.quantile(0.25, buckets) == pytest.approx(0.3)  # rank 5: half way through (0.1, 0.5]
    assert sf.quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * 9.8 / 10)


def test_quantile_in_the_infinite_bucket_is_the_highest_bound_and_none_without_rounds() -> None:
    assert sf.quantile(0.99, [(1.0, 1.0), (30.0, 1.0), (float("inf"), 3.0)]) == 30.0
    assert sf.quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    assert sf.quantile(0.5, []) is None
    assert sf.quantile(0.5, [(0.25, 4.0), (float("inf"), 4.0)]) == pytest.approx(0.125)


def test_proc_stat_and_status_are_read_even_with_a_command_holding_spaces_and_parentheses() -> None:
    fields = ["S", *["0"] * 10, "250", "50", "30", "20", *["0"] * 30]
    stat = "1234 (python -m (x)) " + " ".join(fields)
    assert sf.parse_stat(stat, 100.0) == sf.CpuTimes(own=3.0, children=0.5)
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert sf.parse_status_kib(status, "VmRSS") == 102400.0
    assert sf.parse_status_kib(status, "VmHWM") == 204800.0
    assert sf.parse_status_kib(status, "VmSwap") is None


def test_least_squares_finds_the_line_and_says_how_well() -> None:
    fit = sf.least_squares([1000, 5000, 15000, 30000], [2.0 + 0.001 * x for x in (1000, 5000, 15000, 30000)])
    assert fit.slope == pytest.approx(0.001) and fit.intercept == pytest.approx(2.0) and fit.r2 == pytest.approx(1.0)
    assert fit.at(150000) == pytest.approx(152.0)
    flat = sf.least_squares([1, 2, 3], [5, 5, 5])
    assert flat.slope == 0 and flat.r2 is None
    single = sf.least_squares([7], [3])
    assert single.at(100) == 3 and single.r2 is None
    noisy = sf.least_squares([0, 1, 2, 3], [0, 1, 1, 3])
    assert 0 < noisy.r2 < 1  # type: ignore[operator]
    with pytest.raises(ValueError):
        sf.least_squares([1, 2], [1])


def test_sizes_are_parsed_growing() -> None:
    assert sf.parse_sizes("50:1000, 200:5000") == [sf.Size(50, 1000), sf.Size(200, 5000)]
    for bad in ("", "50", "50:x", "200:5000,50:1000", "1:10"):
        with pytest.raises(ValueError):
            sf.parse_sizes(bad)


BEGIN, END = "<!-- s: begin -->", "<!-- s: end -->"


def test_the_section_replaces_only_itself() -> None:
    document = f"# Title\n\n## A\n\ntext a\n\n{BEGIN}\n## S\nold\n{END}\n\n## B\n\ntext b\n"
    updated = sections.replace_section(document, BEGIN, END, f"{BEGIN}\n## S\nnew\n{END}\n")
    assert updated == f"# Title\n\n## A\n\ntext a\n\n{BEGIN}\n## S\nnew\n{END}\n\n## B\n\ntext b\n"
    # again: the same document (idempotent), other sections untouched
    assert sections.replace_section(updated, BEGIN, END, f"{BEGIN}\n## S\nnew\n{END}\n") == updated


def test_the_section_is_appended_when_absent_and_refused_when_its_markers_are_broken() -> None:
    section = f"{BEGIN}\nx\n{END}"
    assert sections.replace_section("# T\n\n## A\n", BEGIN, END, section) == f"# T\n\n## A\n\n{section}\n"
    assert sections.replace_section("", BEGIN, END, section) == f"{section}\n"
    for broken in (f"# T\n{BEGIN}\nno end\n## B\n", f"# T\n{END}\n", f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n"):
        with pytest.raises(ValueError):
            sections.replace_section(broken, BEGIN, END, section)
    with pytest.raises(ValueError):
        sections.replace_section("# T\n", BEGIN, END, "no markers")


def test_the_real_document_keeps_every_other_section(tmp_path: Any) -> None:
    current = scale.DOC.read_text(encoding="utf-8")
    section = f"{scale.SECTION_BEGIN}\n{scale.TITLE}\n\nx\n{scale.SECTION_END}\n"
    once = sections.replace_section(current, scale.SECTION_BEGIN, scale.SECTION_END, section)
    twice = sections.replace_section(once, scale.SECTION_BEGIN, scale.SECTION_END, section.replace("x", "y"))
    headings = [line for line in current.splitlines() if line.startswith("## ") and line != scale.TITLE]
    for text in (once, twice):
        assert [line for line in text.splitlines() if line.startswith("## ") and line != scale.TITLE] == headings
        assert text.count(scale.SECTION_BEGIN) == 1


def row(pods: int, nodes: int, bytes_per_min: float, rss: float, p99: float, **extra: Any) -> dict[str, Any]:
    return {
        "nodes": nodes,
        "pods": pods,
        "serve_bytes_per_min": bytes_per_min,
        "serve_cpu_s_per_min": pods / 1000,
        "serve_rss_mib": rss,
        "round_p99_s": p99,
        "audit": {"bytes": pods * 2000},
        **extra,
    }


def test_extrapolation_and_goals() -> None:
    rows = [
        row(1000, 50, 30e6, 120, 0.1),
        row(5000, 200, 150e6, 200, 0.5),
        row(30000, 1000, 900e6, 700, 4.0, reclaim={"inference_bind_s": 14.2, "bound_within_s": 10}),
    ]
    x = scale.extrapolate(rows)
    assert x["serve_bytes_per_min"]["at_target"] == pytest.approx(4.5e9, rel=1e-6)
    assert x["audit_bytes"]["at_target"] == pytest.approx(3e8)
    g = scale.goals(rows, x)
    assert g["bytes_ratio_largest_to_smallest"] == 30.0 and not g["bytes_flat"]
    assert not g["round_p99_ok"] and not g["reclaim_ok"] and g["reclaim_s"] == 14.2
    assert g["rss_at_target_mib"] > 1024 and not g["rss_ok"]
    flat = [
        row(1000, 50, 1.0e6, 120, 0.01),
        row(30000, 1000, 1.1e6, 150, 0.02, reclaim={"inference_bind_s": 7.0, "bound_within_s": 10}),
    ]
    g = scale.goals(flat, scale.extrapolate(flat))
    assert g["bytes_flat"] and g["round_p99_ok"] and g["reclaim_ok"] and g["rss_ok"]


def test_the_section_renders_the_figures_and_the_before_table() -> None:
    rows = [
        row(1000, 50, 30e6, 120, 0.1),
        row(5000, 200, 150e6, 200, 0.5, reclaim={"inference_bind_s": 9.0, "bound_within_s": 10, "nodes": ["a", "b"]}),
    ]
    for r in rows:
        r.update(
            list_requests_per_min=100.0,
            pod_list_requests_per_min=50.0,
            pod_list_bytes_per_min=20e6,
            watch_events_per_min=3.0,
            watch_bytes_per_min=2e3,
            background_bytes_per_min=1e5,
            rounds_per_min=12.0,
            round_p50_s=0.05,
            apiserver_cpu_s_per_min=2.0,
            by_resource={"LIST": {"pods": {"requests": 50.0, "bytes": 20e6, "events": 0}}, "WATCH": {}, "other": {}},
        )
        r["audit"].update(seconds=1.0, cpu_s=0.5, peak_rss_mib=80.0)
    x = scale.extrapolate(rows)
    figures = {"label": "before the watched view", "sizes": rows, "extrapolated": x, "goals": scale.goals(rows, x)}
    meta = {
        "commit": "abc1234",
        "label": "before the watched view",
        "date": "2026-12-05 08:00 UTC",
        "cpus": 2,
        "load_start": 1.0,
        "load_end": 2.0,
        "minutes": 12.0,
        "notes": ["a note"],
        "plotted": True,
        "settings": {"grace": 5, "lending_seconds": 5.0, "audit_interval": 3600.0, "background": 15.0, "window": 60.0},
    }
    text = scale.section(figures, meta, {"commit": "0000000", "date": "earlier", "figures": figures})
    assert text.startswith(scale.SECTION_BEGIN) and text.rstrip().endswith(scale.SECTION_END)
    assert scale.TITLE in text and "before the watched view" in text and "- a note" in text
    assert "| 5,000 | 150,000 |" not in text  # the target is a row of the fits, not of the sizes
    assert "**Before the watched view** (commit `0000000`" in text
    assert "bench-scale.png" in text
    # the run that is itself the "before" run shows its table once
    assert "**Before the watched view**" not in scale.section(
        figures, meta, {"commit": "abc1234", "date": "now", "figures": figures}
    )
