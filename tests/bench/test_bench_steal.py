"""The hypervisor's steal time as the benchmark reads it from /proc/stat (bench/steal.py), and where a
fixed-rate measurement keeps it per round (bench/run.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import run, steal

# A 2-CPU virtual machine: user nice system idle iowait irq softirq steal guest guest_nice.
BEFORE = """\
cpu  2453181 6810 242298 1898373 7802 0 45261 30855 0 0
cpu0 972207 3435 76893 1244693 1304 0 22350 16185 0 0
cpu1 1480973 3374 165404 653680 6497 0 22910 14670 0 0
intr 22975376 0 0 0 0 0 0
ctxt 123456789
btime 1764576000
processes 4242
procs_running 1
procs_blocked 0
softirq 1 2 3 4 5 6 7 8 9 10 11
"""
# 6 s later: 70 ticks stolen from CPU 0, 3 from CPU 1.
AFTER = """\
cpu  2453981 6810 242398 1899273 7802 0 45281 30928 0 0
cpu0 972507 3435 76943 1244993 1304 0 22360 16255 0 0
cpu1 1481473 3374 165454 654280 6497 0 22920 14673 0 0
intr 22985376 0 0 0 0 0 0
"""
# A kernel older than 2.6.11: seven counters per line, no steal column.
NO_STEAL = """\
cpu  2453181 6810 242298 1898373 7802 0 45261
cpu0 972207 3435 76893 1244693 1304 0 22350
cpu1 1480973 3374 165404 653680 6497 0 22910
intr 22975376 0 0 0
"""
TICK = 1 / os.sysconf("SC_CLK_TCK")


def test_the_steal_counter_of_each_cpu_line_and_of_the_total() -> None:
    assert steal.parse(BEFORE) == {"cpu": 30855, "cpu0": 16185, "cpu1": 14670}


def test_no_steal_column_reads_as_unknown() -> None:
    assert steal.parse(NO_STEAL) is None
    assert steal.parse("") is None


def test_seconds_stolen_per_pinned_cpu_and_from_all_cpus_when_not_pinned() -> None:
    before, after = steal.parse(BEFORE), steal.parse(AFTER)
    assert steal.seconds(before, after, "0") == pytest.approx(70 * TICK)
    assert steal.seconds(before, after, "1") == pytest.approx(3 * TICK)
    assert steal.seconds(before, after, None) == pytest.approx(73 * TICK)
    assert steal.stolen(before, after, "0", "1") == {
        "server": pytest.approx(70 * TICK),
        "client": pytest.approx(3 * TICK),
    }
    assert steal.stolen(before, after, None, None) == {
        "server": pytest.approx(73 * TICK),
        "client": pytest.approx(73 * TICK),
    }


def test_unknown_when_a_reading_or_the_cpu_is_missing(tmp_path: Path) -> None:
    before, after = steal.parse(BEFORE), steal.parse(AFTER)
    assert steal.read(tmp_path / "no-proc-stat") is None
    assert steal.seconds(None, after, "0") is None
    assert steal.seconds(before, None, None) is None
    assert steal.seconds(before, after, "7") is None  # no such CPU
    assert steal.stolen(steal.parse(NO_STEAL), steal.parse(NO_STEAL), "0", "1") == {"server": None, "client": None}


def test_read_parses_the_file(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(AFTER)
    assert steal.read(stat) == {"cpu": 30928, "cpu0": 16255, "cpu1": 14673}


def _fixed_rate_run(p99: float, server: float | None, client: float | None) -> dict[str, object]:
    return {
        "latency_from_schedule": {"p50": p99 / 2, "p99": p99},
        "stolen_seconds": {"server": server, "client": client},
    }


def test_the_median_p99_round_keeps_every_rounds_steal_next_to_its_p99() -> None:
    rounds = [
        _fixed_rate_run(0.0011, 0.0, 0.0),
        _fixed_rate_run(0.0120, 0.70, 0.03),
        _fixed_rate_run(0.0009, 0.0, 0.01),
    ]
    chosen = run.median_p99_run(rounds)
    assert chosen["latency_from_schedule"]["p99"] == 0.0011
    assert chosen["p99_runs"] == [0.0011, 0.0120, 0.0009]
    assert chosen["stolen_runs"] == [
        {"server": 0.0, "client": 0.0},
        {"server": 0.70, "client": 0.03},
        {"server": 0.0, "client": 0.01},
    ]
