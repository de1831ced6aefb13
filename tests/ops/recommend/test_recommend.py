"""``pool recommend``'s analysis (webhook/ops/recommend/sizing.py) and history (webhook/ops/recommend/history.py), on the
demand histories of tests/fixtures/recommend (their shapes: generate.py there); the command's options and
output through ``pool.main``."""

from __future__ import annotations

import argparse
import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_stub import Prometheus, serving

from webhook.core.policy import default_policy
from webhook.ops.lending.demand import GAUGES
from webhook.ops.pool import command as pool
from webhook.ops.pool import recommend as pool_recommend
from webhook.ops.pool.output import Output
from webhook.ops.recommend.fetch import ACTIVITY_QUERY, query
from webhook.ops.recommend.history import (
    Activity,
    Grid,
    HistoryFormatError,
    Sample,
    activity_from_samples,
    from_matrix,
    from_samples,
    parse_openmetrics,
    to_openmetrics,
)
from webhook.ops.recommend.sizing import HistoryError, expected, quantile, recommend

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "recommend"
DAY = 86400.0
GAP = 900.0


def load(name: str, window: float = DAY, step: float = 60.0) -> Any:
    with gzip.open(FIXTURES / name, "rt", encoding="utf-8") as found:
        samples = parse_openmetrics(found.read(), name)
    return from_samples(samples, Grid.ending(max(s.timestamp for s in samples), window, step))


@dataclass(frozen=True)
class Case:
    name: str
    file: str
    window: float = DAY
    headroom_today: int = 0
    q: float = 0.99
    # per kind: (today's units, recommended units, recommended reserved GPUs, demand, burst)
    sizes: dict[str, tuple[int, int, int, int, int]] = field(default_factory=dict)
    headroom: int = 0
    error: str = ""


CASES = [
    Case(
        # split: 10 GPUs wanted at 14:00 over 4 nodes -> 3 per node; whole: 8 at 12-14 of 4-GPU nodes -> 2 nodes.
        # The rises: whole 4 (12:00), split 2, 2, 4: their q0.99 is 4, the headroom of both.
        "a day of both kinds",
        "daily.om.gz",
        sizes={"whole": (4, 2, 8, 8, 4), "split": (2, 3, 12, 10, 4)},
        headroom=4,
    ),
    Case(
        # The same day as two replicas scraped: the one without the Lease exports zeros, max by (pool, nodes).
        "two replicas, one holding the Lease",
        "two-replicas.om.gz",
        sizes={"whole": (4, 2, 8, 8, 4), "split": (2, 3, 12, 10, 4)},
        headroom=4,
    ),
    Case(
        # q0.5 of the busiest hour: split 13:00-14:00 is 4 then 6 (p50 = 4) but 14:00 is 10 all hour.
        "a lower quantile, today's headroom kept",
        "daily.om.gz",
        q=0.5,
        headroom_today=4,
        sizes={"whole": (4, 2, 8, 8, 4), "split": (2, 3, 12, 10, 2)},
        headroom=4,
    ),
    Case(
        "an hour without samples",
        "gap.om.gz",
        error="a gap of 1h in the history, from 2025-12-05 10:00 UTC to 2025-12-05 11:00 UTC",
    ),
    Case(
        "half a day of history for a day's window",
        "half-day.om.gz",
        error="the history starts at 2025-12-05 12:00 UTC: only 12h of it, and a recommendation needs at least 1d",
    ),
    Case(
        # A day of history, asked for two: say which window it supports.
        "a day of history for a two days' window",
        "daily.om.gz",
        window=2 * DAY,
        error="the history starts at 2025-12-05 00:00 UTC, 1d into the 2d window: too short a history for the window "
        "(give --window 1d or less",
    ),
    Case("no demand gauge", "empty.om.gz", error="no data: no sample of rocm_isolation_reserved_nodes"),
    Case("a window shorter than a day", "daily.om.gz", window=6 * 3600.0, error="--window 6h is too short"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_recommend_from_fixture_histories(case: Case) -> None:
    history = load(case.file, case.window)
    if case.error:
        with pytest.raises(HistoryError, match=case.error.replace("(", r"\(")):
            recommend(history, case.window, case.q, case.headroom_today, GAP)
        return
    found = recommend(history, case.window, case.q, case.headroom_today, GAP)
    sizes = {
        r.kind: (r.today.units, r.recommended.units, r.recommended.reserved, r.demand, r.burst) for r in found.kinds
    }
    assert sizes == case.sizes
    assert found.headroom == case.headroom
    assert found.policy_change == (
        None if case.headroom == case.headroom_today else f"spec.lending.headroomGPUs: {case.headroom}"
    )


def test_the_busiest_hour_and_the_commands() -> None:
    found = recommend(load("daily.om.gz"), DAY, 0.99, 0, GAP)
    whole, split = found.kinds
    assert [(r.kind, r.peak_hour) for r in found.kinds] == [("whole", 12), ("split", 14)]
    hour14 = next(h for h in split.hours if h.hour == 14)
    assert (hour14.p50, hour14.max, hour14.samples) == (10, 10, 60)
    assert split.commands == (
        "rocm-isolation-webhook pool plan --devices-per-node 3",
        "rocm-isolation-webhook pool apply --devices-per-node 3 --evict",
    )
    assert whole.commands[0].startswith("rocm-isolation-webhook pool release --nodes NODE[,NODE...]  # 2 of")


def test_expected_figures_replay_the_demand() -> None:
    found = recommend(load("daily.om.gz"), DAY, 0.99, 0, GAP)
    whole, split = found.kinds
    days = 1441 * 60 / DAY  # the grid's points, a minute each
    # Today, whole: 16 reserved, nothing kept: borrowers hold 12 for 22 h and 8 for 2 h; at 12:00 inference's 4 more
    # find nothing free: 4 GPUs taken back, once.
    assert whole.expected_today.lent_gpu_hours == pytest.approx((12 * 22 + 8 * 2) / days, abs=0.2)
    assert (round(whole.expected_today.taken_back_gpus), round(whole.expected_today.reclaims)) == (4, 1)
    # Recommended: 8 reserved keeping 4: nothing to lend at 4 held, the 12:00 rise lands in the headroom.
    assert whole.expected.taken_back_gpus == 0 and whole.expected.lent_gpu_hours == 0
    # Today, split: 8 reserved, 10 wanted at 14:00: 2 wait for an hour; 2 + 2 + 2 GPUs taken back.
    assert split.expected_today.waiting_gpu_hours == pytest.approx(2 / days, abs=0.05)
    assert round(split.expected_today.taken_back_gpus) == 6 and round(split.expected_today.reclaims) == 3
    # Recommended, 12 keeping 4: the same GPU-hours lent, none taken back, none waiting.
    assert split.expected.lent_gpu_hours == pytest.approx(split.expected_today.lent_gpu_hours)
    assert (split.expected.taken_back_gpus, split.expected.waiting_gpu_hours) == (0, 0)
    # The gauges' own lent figures agree with the replay of today's size (the fixture lends all it may).
    assert whole.observed_lent_gpu_hours == pytest.approx(whole.expected_today.lent_gpu_hours * days, rel=0.01)


@pytest.mark.parametrize(
    ("demand", "reserved", "headroom", "taken", "lent_hours"),
    [
        # 1 step an hour: rise 2 -> 6 with 8 reserved, none kept: free 0 before, 4 taken back.
        ([2.0, 6.0], 8, 0, 4.0, 6.0 + 2.0),
        # 2 kept: the rise of 4 finds 2 free, takes 2.
        ([2.0, 6.0], 8, 2, 2.0, 4.0 + 0.0),
        # a hole resets the replay: nothing is taken back across it
        ([2.0, None, 6.0], 8, 0, 0.0, 6.0 + 2.0),
        # demand past the reservation: held at the reservation, nothing more to take back
        ([8.0, 12.0], 8, 0, 0.0, 0.0),
    ],
)
def test_expected_replay_table(
    demand: list[float | None], reserved: int, headroom: int, taken: float, lent_hours: float
) -> None:
    found = expected(demand, 3600.0, reserved, headroom)
    points = sum(v is not None for v in demand)
    assert found.taken_back_gpus * points / 24 == pytest.approx(taken)
    assert found.lent_gpu_hours * points / 24 == pytest.approx(lent_hours)


def test_quantile_is_a_value_that_occurred() -> None:
    assert quantile([1, 2, 3, 4], 0.5) == 2
    assert quantile([1, 2, 3, 4], 0.99) == 4
    assert quantile([5], 0.01) == 5


# -- the history ----------------------------------------------------------------------------------------------


def test_openmetrics_lines_are_read_with_labels_and_timestamps() -> None:
    text = '# HELP x y\n# TYPE rocm_isolation_reserved_gpus gauge\nrocm_isolation_reserved_gpus{pool="reserved",nodes="whole",a="q\\"x"} 16 1700000000.5\n# EOF\n'
    assert parse_openmetrics(text) == [
        Sample("rocm_isolation_reserved_gpus", {"pool": "reserved", "nodes": "whole", "a": 'q"x'}, 16.0, 1700000000.5)
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rocm_isolation_reserved_gpus 4\n", "line 1: rocm_isolation_reserved_gpus has no timestamp"),
        ("# ok\nnot a sample at all {\n", "line 2: not an OpenMetrics sample"),
        ("m{pool=reserved} 1 2\n", "line 1: cannot read the labels"),
        ("m 1 yesterday\n", "line 1: could not convert"),
    ],
)
def test_unreadable_lines_say_where(text: str, message: str) -> None:
    with pytest.raises(HistoryFormatError, match=message):
        parse_openmetrics(text, "f.om")


def test_samples_are_looked_up_as_prometheus_does() -> None:
    name = "rocm_isolation_reserved_gpus"
    labels = {"pool": "reserved", "nodes": "whole"}
    samples = [
        Sample(name, labels, 4, 1000.0),
        Sample(name, labels, float("nan"), 1240.0),
        Sample(name, labels, 6, 1500),
    ]
    grid = Grid(960.0, 60.0, 11)  # 960 .. 1560
    column = from_samples(samples, grid).series(("reserved", "whole"), "reserved")
    # 960: before any sample; 1000-1239: 4; 1240-1499: NaN (no value); 1500-: 6
    assert column == [None, 4, 4, 4, 4, None, None, None, None, 6, 6]
    # past the lookback (300 s) the last sample is stale
    assert from_samples(samples[:1], Grid(1000.0, 100.0, 5)).series(("reserved", "whole"), "reserved") == [
        4, 4, 4, 4, None,
    ]  # fmt: skip


def test_prometheus_answers_go_on_the_grid_and_off_grid_points_are_refused() -> None:
    grid = Grid(600.0, 60.0, 3)
    answer = {"reserved": [{"metric": {"pool": "reserved", "nodes": "split"}, "values": [[600, "8"], [720, "8"]]}]}
    assert from_matrix(answer, grid).series(("reserved", "split"), "reserved") == [8, None, 8]
    with pytest.raises(HistoryFormatError, match="off the query's steps"):
        from_matrix({"reserved": [{"metric": {}, "values": [[630, "1"]]}]}, grid)


def test_grid_ending_is_aligned_on_its_step() -> None:
    grid = Grid.ending(1_000_030.0, DAY, 60.0)
    assert grid.end == 1_000_020.0 and grid.points == 1441 and grid.start % 60 == 0


# -- the command ----------------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    pool.add_arguments(parser)
    code = pool.main(parser.parse_args(["recommend", *argv]))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_command_prints_json_per_pool(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--from-file", str(FIXTURES / "daily.om.gz"), "--window", "1d", "-o", "json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert [(p["nodes"], p["today"], p["recommended"]) for p in document["pools"]] == [
        ("whole", {"reservedGPUs": 16, "reservedNodes": 4}, {"reservedGPUs": 8, "reservedNodes": 2}),
        ("split", {"reservedGPUs": 8, "devicesPerNode": 2}, {"reservedGPUs": 12, "devicesPerNode": 3}),
    ]
    assert document["headroomGPUs"] == {"today": 0, "recommended": 4}
    assert len(document["pools"][0]["demandByHour"]) == 24


def test_the_table_names_the_command_and_the_policy_change(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--from-file", str(FIXTURES / "daily.om.gz"), "--window", "1d")
    assert code == 0
    assert "  rocm-isolation-webhook pool apply --devices-per-node 3 --evict" in out.splitlines()
    assert "policy: spec.lending.headroomGPUs: 4 (today 0); render and apply the manifests" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--window", "1d"], "pool recommend needs --prometheus URL or --from-file FILE"),
        (["--from-file", "x.om", "--prometheus", "http://p:9090"], "needs --prometheus URL or --from-file FILE"),
        (["--prometheus", "p:9090"], "--prometheus p:9090: give a URL"),
        (["--from-file", "x.om", "--token", "t"], "--token, --token-file and the TLS options are for --prometheus"),
        (["--from-file", "x.om", "--quantile", "1.5"], "--quantile 1.5: give a value between 0.5 and 1"),
        (["--from-file", "x.om", "--count", "2"], "reads history, not nodes: --count does not apply"),
        (["--from-file", "x.om", "--save", "y.om"], "--save writes what --prometheus read"),
        (["--from-file", "/nonexistent/x.om"], "--from-file /nonexistent/x.om: No such file or directory"),
        (["--from-file", str(FIXTURES / "gap.om.gz"), "--window", "1d"], "a gap of 1h in the history"),
        (["--from-file", str(FIXTURES / "generate.py"), "--window", "1d"], "generate.py, line 1: not an OpenMetrics"),
    ],
)
def test_bad_options_and_history_exit_2_with_one_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_recommend_options_are_refused_with_other_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    pool.add_arguments(parser)
    assert pool.main(parser.parse_args(["status", "--window", "7d"])) == 2
    assert "--window is only for pool recommend" in capsys.readouterr().err


def test_a_saved_history_is_the_same_history_on_the_same_grid() -> None:
    history = load("gap.om.gz")
    again = from_samples(parse_openmetrics(to_openmetrics(history)), history.grid)
    assert again.values == history.values and again.values  # the gap saved as a gap, not filled


def test_a_moment_nobody_led_is_no_demand_and_no_burst() -> None:
    history = load("daily.om.gz")
    key = ("reserved", "whole")
    # 12:30-12:35: every replica exports zeros (the Lease changing hands): demand 8 -> 0 -> 8 would read as a rise of
    # 8, twice the real burst (4 at 12:00), and the busiest hour's demand would not change either way.
    for figure in ("nodes", "node_gpus", "reserved", "inference", "waiting", "lent", "idle"):
        column = history.values[key][figure]
        for index in range(750, 755):
            column[index] = 0.0
    whole = next(r for r in recommend(history, DAY, 0.99, 0, GAP).kinds if r.kind == "whole")
    assert (whole.burst, whole.demand) == (4, 8)
    assert next(h for h in whole.hours if h.hour == 12).samples == 55


# -- how busy the reserved GPUs were (the background audit's activity gauge) ------------------------------------

START = 1_764_892_800  # generate.py's START: the fixtures' day, 2025-12-05 00:00 UTC


def activity_lines() -> list[str]:
    """The activity gauge over the fixtures' day, every 5 minutes, as Prometheus scraped it from the Lease holder
    (pod and instance labels, which ``max by (node, gpu, inference)`` drops): r1's GPU 0 held by inference at 30 %,
    r1's GPU 1 idle and unheld, r2's GPU 0 held by inference at 60 % from 12:00 to 14:00 and 20 % otherwise.

    On the day's 1441 minutes: every GPU 4323 values (1441 x 0, 1321 x 20, 1441 x 30, 120 x 60): mean 76850 / 4323 =
    17.8 %, p95 the 4107th value, 30; inference's 2882 (1321 x 20, 1441 x 30, 120 x 60): mean 76850 / 2882 = 26.7 %,
    p95 the 2738th, 30."""
    gauge = "rocm_isolation_reserved_gpu_activity_percent"
    lines = [f"# TYPE {gauge} gauge"]
    for node, gpu, inference, shape in (
        ("r1", "gpu_id 0 (serial S0)", "true", lambda hour: 30),
        ("r1", "gpu_id 1 (serial S1)", "false", lambda hour: 0),
        ("r2", "gpu_id 0 (serial S9)", "true", lambda hour: 60 if 12 <= hour < 14 else 20),
    ):
        labels = f'gpu="{gpu}",inference="{inference}",instance="10.0.0.7:8443",node="{node}",pod="webhook-0"'
        lines += [f"{gauge}{{{labels}}} {shape((at - START) / 3600)} {at}" for at in range(START, START + 86401, 300)]
    return lines


def with_activity(path: Path) -> Path:
    with gzip.open(FIXTURES / "daily.om.gz", "rt", encoding="utf-8") as found:
        text = found.read()
    assert text.endswith("# EOF\n")
    path.write_text(text[: -len("# EOF\n")] + "\n".join(activity_lines()) + "\n# EOF\n", encoding="utf-8")
    return path


ACTIVITY_FOUND = {
    "gauge": "rocm_isolation_reserved_gpu_activity_percent",
    "read": True,
    "error": None,
    "start": "2025-12-05 00:00 UTC",
    "end": "2025-12-06 00:00 UTC",
    "hours": 24.0,
    "reserved": {"gpus": 3, "meanPercent": 17.8, "p95Percent": 30.0},
    "inference": {"gpus": 2, "meanPercent": 26.7, "p95Percent": 30.0},
    "inferenceLoadPercent": 40.0,
}


def test_recommend_says_how_busy_the_reserved_gpus_were_and_recommends_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = str(with_activity(tmp_path / "daily-activity.om"))
    code, out, err = run(capsys, "--from-file", history, "--window", "1d", "-o", "json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document["reservedGpuActivity"] == ACTIVITY_FOUND
    _, without, _ = run(capsys, "--from-file", str(FIXTURES / "daily.om.gz"), "--window", "1d", "-o", "json")
    assert document["pools"] == json.loads(without)["pools"]  # the recommendation does not depend on it
    code, out, _ = run(capsys, "--from-file", history, "--window", "1d")
    assert code == 0
    assert (
        "reserved GPUs' activity (rocm_isolation_reserved_gpu_activity_percent: 3 GPUs, 1d of the window): 17.8 % busy "
        "on average, p95 30.0 %; while inference held them: 26.7 % on average, p95 30.0 %; inference is expected to "
        "keep a reserved GPU at most 40 % busy"
    ) in out.splitlines()


def test_inference_over_its_expected_load_is_marked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = default_policy().document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["gpuMetrics"] = {"inferenceLoadPercent": 25}
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(document))
    history = str(with_activity(tmp_path / "daily-activity.om"))
    code, out, _ = run(capsys, "--from-file", history, "--window", "1d", "--policy", str(policy_file))
    assert code == 0
    assert "26.7 % on average, p95 30.0 % (over); inference is expected to keep a reserved GPU at most 25 % busy" in out


def test_without_the_activity_gauge_one_line_says_so_and_the_rest_is_as_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--from-file", str(FIXTURES / "daily.om.gz"), "--window", "1d")
    assert code == 0
    said = [line for line in out.splitlines() if "activity" in line]
    assert said == [
        "reserved GPUs' activity: no sample of rocm_isolation_reserved_gpu_activity_percent in the window (the "
        "background audit exports it: serve --audit-gpu-metrics)"
    ]
    _, out, _ = run(capsys, "--from-file", str(FIXTURES / "daily.om.gz"), "--window", "1d", "-o", "json")
    found = json.loads(out)["reservedGpuActivity"]
    assert (found["read"], found["hours"], found["reserved"], found["inference"]) == (True, 0, None, None)


def test_the_activity_is_saved_with_the_demand_and_read_back_the_same() -> None:
    samples = parse_openmetrics("\n".join(activity_lines()))
    grid = Grid.ending(START + DAY, DAY, 60.0)
    history, activity = load("daily.om.gz"), activity_from_samples(samples, grid)
    assert history.grid == grid and len(activity.values) == 3
    text = to_openmetrics(history, activity)
    again = parse_openmetrics(text)
    assert from_samples(again, grid).values == history.values
    assert activity_from_samples(again, grid).values == activity.values
    # No activity: the file is what it was before the gauge existed.
    assert to_openmetrics(history, Activity(grid)) == to_openmetrics(history)
    assert "activity" not in to_openmetrics(history)


def _answers(grid: Grid) -> dict[str, tuple[int, Any]]:
    """The fixture day as Prometheus answers its queries on ``grid``: the demand gauges, and the activity gauge."""
    history = load("daily.om.gz")
    assert history.grid == grid
    answers: dict[str, tuple[int, Any]] = {}
    times = grid.times()
    for figure in GAUGES:
        result = [
            {
                "metric": {"pool": pool, "nodes": nodes},
                "values": [
                    [t, f"{v:g}"]
                    for t, v in zip(times, history.series((pool, nodes), figure), strict=True)
                    if v is not None
                ],
            }
            for pool, nodes in history.values
        ]
        answers[query(figure)] = (200, {"status": "success", "data": {"resultType": "matrix", "result": result}})
    activity = activity_from_samples(parse_openmetrics("\n".join(activity_lines())), grid)
    result = [
        {
            "metric": dict(zip(("node", "gpu", "inference"), key, strict=True)),
            "values": [[t, f"{v:g}"] for t, v in zip(times, column, strict=True) if v is not None],
        }
        for key, column in activity.values.items()
    ]
    answers[ACTIVITY_QUERY] = (200, {"status": "success", "data": {"resultType": "matrix", "result": result}})
    return answers


def run_live(url: str, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    pool.add_arguments(parser)
    stdout, stderr = io.StringIO(), io.StringIO()
    args = parser.parse_args(["recommend", "--prometheus", url, "--window", "1d", *argv])
    code = pool_recommend.run(args, default_policy(), Output(stdout, stderr), now=START + DAY + 30)
    return code, stdout.getvalue(), stderr.getvalue()


def test_from_prometheus_the_activity_is_one_more_query_and_saved(tmp_path: Path) -> None:
    grid = Grid.ending(START + DAY + 30, DAY, 60.0)
    saved = tmp_path / "saved.om.gz"
    with serving() as url:
        Prometheus.answers = _answers(grid)
        code, out, err = run_live(url, "--token", "s3cret", "--save", str(saved), "-o", "json")
        seen = Prometheus.seen
    assert (code, err) == (0, "")
    assert [fields["query"] for _, fields, _ in seen] == [*(query(f) for f in GAUGES), ACTIVITY_QUERY]
    assert {auth for _, _, auth in seen} == {"Bearer s3cret"}
    assert json.loads(out)["reservedGpuActivity"] == ACTIVITY_FOUND
    # --save kept it: offline again, the same.
    with gzip.open(saved, "rt", encoding="utf-8") as found:
        again = activity_from_samples(parse_openmetrics(found.read()), grid)
    assert again.values == activity_from_samples(parse_openmetrics("\n".join(activity_lines())), grid).values


def test_an_activity_query_prometheus_refuses_is_one_line_and_the_same_recommendation(tmp_path: Path) -> None:
    grid = Grid.ending(START + DAY + 30, DAY, 60.0)
    with serving() as url:
        answers = _answers(grid)
        Prometheus.answers = answers
        _, before, _ = run_live(url, "-o", "json")
        answers[ACTIVITY_QUERY] = (422, {"status": "error", "errorType": "execution", "error": "query timed out"})
        code, out, err = run_live(url, "-o", "json")
        assert (code, err) == (0, "")
        assert json.loads(out)["pools"] == json.loads(before)["pools"]
        found = json.loads(out)["reservedGpuActivity"]
        assert (found["read"], found["reserved"]) == (False, None) and "query timed out" in found["error"]
        code, out, _ = run_live(url)
    said = [line for line in out.splitlines() if "activity" in line]
    assert code == 0 and len(said) == 1
    assert said[0].startswith("reserved GPUs' activity: not read (") and "query timed out" in said[0]
    assert said[0].endswith("the recommendation does not depend on it")
