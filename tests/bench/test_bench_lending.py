"""The pure parts of ``make bench-lending`` (bench/lending_trace.py): the daily inference curve, the training
backlog, the work lost to an eviction, GPU-hour accounting and the figures of the two runs. The run itself
needs a control plane (``make bench-lending``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import lending, lending_model
from bench.lending_trace import (
    DEVICE_PLUGIN,
    DRA,
    BacklogShape,
    DailyCurve,
    Job,
    Progress,
    RunResult,
    Sample,
    gpu_hours,
    make_backlog,
    percentile,
    spans,
    summary,
)

GRID = [h / 60.0 for h in range(24 * 60)]  # every trace minute of a day


def test_the_daily_curve_has_a_mean_of_40_percent_and_a_peak_that_fills_the_reserved_gpus() -> None:
    curve = DailyCurve(0.4)
    values = [curve.fraction(h) for h in GRID]
    assert sum(values) / len(values) == pytest.approx(0.4, abs=1e-9)
    assert max(values) == pytest.approx(1.0) and curve.fraction(curve.peak_hour) == pytest.approx(1.0)
    assert min(values) >= 0.0
    assert curve.fraction(curve.peak_hour + 12) == pytest.approx(min(values))


@pytest.mark.parametrize("mean", [0.2, 0.3, 0.4, 0.5, 0.7])
def test_the_curve_reaches_any_mean_with_a_peak_of_one(mean: float) -> None:
    curve = DailyCurve(mean)
    values = [curve.fraction(h) for h in GRID]
    assert sum(values) / len(values) == pytest.approx(mean, abs=1e-9)
    assert max(values) == pytest.approx(1.0) and min(values) >= 0.0


def test_replicas_of_eight_nodes_keep_the_mean_and_fill_every_node_at_the_peak() -> None:
    curve = DailyCurve(0.4)
    replicas = [curve.replicas(h, 8) for h in GRID]
    assert max(replicas) == 8 and min(replicas) == 0
    # Whole replicas: the mean of the steps stays within half a replica's share of 40 %.
    assert sum(replicas) / len(replicas) / 8 == pytest.approx(0.4, abs=0.5 / 8)


def test_the_backlog_is_the_same_for_a_seed_and_has_borrowers_and_not_on_both_routes() -> None:
    shape = BacklogShape(jobs_per_route=200)
    jobs = make_backlog(7, shape)
    assert jobs == make_backlog(7, shape) and jobs != make_backlog(8, shape)
    assert len(jobs) == 400 and len({j.id for j in jobs}) == 400
    plugin = [j for j in jobs if j.route == DEVICE_PLUGIN]
    dra = [j for j in jobs if j.route == DRA]
    assert all(j.borrower for j in plugin), "only borrowing reaches the device-plugin (reserved) nodes"
    assert {j.gpus for j in plugin} == {1, 2, 4} and {j.gpus for j in dra} == {1, 2}
    assert 0.3 < sum(j.borrower for j in dra) / len(dra) < 0.7
    assert all(shape.min_hours <= j.hours <= shape.max_hours for j in jobs)


def test_an_eviction_loses_the_work_since_the_last_checkpoint_times_the_gpus() -> None:
    progress = Progress(Job(1, DRA, gpus=2, hours=5.0, borrower=True), checkpoint_hours=0.5)
    progress.run(1.2)
    assert (progress.done, progress.saved) == (pytest.approx(1.2), pytest.approx(1.0))
    assert progress.interrupt() == pytest.approx(0.2 * 2)
    assert progress.done == pytest.approx(1.0) and progress.remaining == pytest.approx(4.0)
    # Resumed from the checkpoint: the next interruption loses only what followed it.
    progress.run(0.4)
    assert progress.interrupt() == pytest.approx(0.4 * 2)
    progress.run(10.0)
    assert progress.finished and progress.done == pytest.approx(5.0) and progress.interrupt() == 0.0
    assert progress.interruptions == 3


def test_continuous_checkpoints_lose_nothing() -> None:
    progress = Progress(Job(1, DEVICE_PLUGIN, gpus=4, hours=3.0, borrower=True), checkpoint_hours=0.0)
    progress.run(1.37)
    assert progress.interrupt() == 0.0 and progress.done == pytest.approx(1.37)


def test_gpu_hours_are_the_samples_counts_times_the_trace_hours_they_stand_for() -> None:
    # Samples 1 s apart in real time, the last one 2 s before the end, at 240x: 4 and 8 trace minutes.
    hours = spans([0.0, 1.0, 2.0], end=4.0, time_factor=240.0)
    assert hours == pytest.approx([240 / 3600, 240 / 3600, 480 / 3600])
    samples = [
        Sample(0.0, hours[0], reserved=48, inference=8, borrowers=30, reclaiming=4),
        Sample(0.07, hours[1], reserved=48, inference=12, borrowers=20),
        Sample(0.13, hours[2], reserved=48, inference=48, borrowers=0),
    ]
    assert [s.idle for s in samples] == [6, 16, 0]
    assert gpu_hours(samples, "idle") == pytest.approx((6 + 16) * 240 / 3600)
    assert gpu_hours(samples, "borrowers") == pytest.approx(50 * 240 / 3600)
    assert gpu_hours(samples, "reserved") == pytest.approx(48 * 960 / 3600)


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 99) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)


def _run(mode: str, idle: int, borrowed: int, bind: list[float]) -> RunResult:
    result = RunResult(
        mode, samples=[Sample(0.0, 10.0, reserved=48, inference=48 - idle - borrowed, borrowers=borrowed)]
    )
    result.bind_seconds = bind
    result.lost_gpu_hours = 3.25 if mode == "lending" else 0.0
    return result


def test_the_summary_puts_the_required_keys_first_and_divides_borrowed_by_strict_idle() -> None:
    strict = _run("strict", idle=30, borrowed=0, bind=[0.4, 0.5])
    lent = _run("lending", idle=6, borrowed=24, bind=[0.5, 5.2, 5.6])
    figures = summary(strict, lent, grace_s=5, time_factor=240.0)
    required = [
        "idle_reserved_gpu_hours",
        "borrowed_gpu_hours",
        "borrowed_ratio",
        "inference_bind_p99_s",
        "inference_bind_max_s",
        "grace_s",
        "inference_evicted",
        "nonborrowers_on_reserved",
        "lost_gpu_hours",
        "time_factor",
    ]
    assert list(figures)[: len(required)] == required
    assert figures["idle_reserved_gpu_hours"] == 300.0 and figures["borrowed_gpu_hours"] == 240.0
    assert figures["borrowed_ratio"] == 0.8
    assert figures["inference_bind_max_s"] == 5.6 and math.isclose(figures["inference_bind_p99_s"], 5.59, abs_tol=0.01)
    assert figures["lost_gpu_hours"] == 3.25 and figures["strict"]["inference_bind_max_s"] == 0.5


def test_the_docs_section_replaces_its_own_text_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Before\n\ntext\n", encoding="utf-8")
    monkeypatch.setattr(lending, "DOC", doc)
    first = f"{lending.SECTION_BEGIN}\n## Lending\nold\n{lending.SECTION_END}\n"
    lending.write_section(first)
    doc.write_text(doc.read_text(encoding="utf-8") + "\n## After\n\nkept\n", encoding="utf-8")
    lending.write_section(first.replace("old", "new"))
    text = doc.read_text(encoding="utf-8")
    assert "## Before" in text and "## After\n\nkept" in text and "new" in text and "old" not in text
    assert text.count(lending.SECTION_BEGIN) == 1


def test_the_model_lends_nothing_under_strict_and_more_with_devices_lent() -> None:
    plain = lending_model.compare(lending_model.ModelSettings(nodes=16))
    devices = lending_model.compare(lending_model.ModelSettings(nodes=16, lend_devices=True))
    strict = lending_model.Model(lending_model.ModelSettings(nodes=16), lending=False).run().figures()
    assert strict["borrowed_gpu_hours"] == 0 and strict["interruptions"] == 0
    assert plain["idle_reserved_gpu_hours"] == pytest.approx(strict["idle_reserved_gpu_hours"])
    # Whole nodes alone hold 2/3 of the reserved GPUs: lending them alone stays below that share of the idle ones.
    assert 0.3 < plain["borrowed_ratio"] < 2 / 3
    assert devices["borrowed_ratio"] > plain["borrowed_ratio"]
    assert (
        devices["training_gpu_hours_lending"] > plain["training_gpu_hours_lending"] > plain["training_gpu_hours_strict"]
    )


def test_the_report_and_the_plot_are_written_from_two_runs(tmp_path: Path) -> None:
    strict = _run("strict", idle=30, borrowed=0, bind=[0.4, 0.5])
    lent = _run("lending", idle=6, borrowed=24, bind=[0.5, 5.2, 5.6])
    settings = lending.Settings(hours=10.0)
    figures = summary(strict, lent, grace_s=5, time_factor=240.0)
    meta = {"commit": "abc", "date": "today", "cpus": 2, "load_start": 1.0, "load_end": 2.0, "minutes": 14.0}
    text = lending.section(
        figures,
        settings,
        meta,
        [lending_model.compare(lending_model.ModelSettings(nodes=16)) | {"lend_devices": False}],
    )
    assert "**Borrowed / idle under strict: 0.8** (goal ≥ 0.8: **met**)" in text
    assert "| 16 | 48 | no |" in text and "time factor 240" in text
    lending.plot(strict, lent, settings, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
