"""The namespace-rule servers of ``make bench`` (bench/run.py, ``Bench.namespace_rules``): one server per
policy, all running together, measured in alternated rounds, the median round of CPU per review kept;
none left running when one fails to start. The servers and the load generator are stand-ins here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from bench import run

# CPU per review (µs) of each round, per number of rules: the medians are 150, 160, 170 and 180 µs.
CPU_ROUNDS = {
    1: [150, 400, 140, 155, 149],
    10: [160, 161, 500, 159, 100],
    100: [170, 90, 171, 169, 300],
    1000: [226, 180, 175, 181, 179],
}


@dataclass
class FakeServer:
    name: str
    rules: int
    events: list[str]
    stopped: bool = False
    measured: list[int] = field(default_factory=list)

    def stop(self) -> None:
        self.stopped = True
        self.events.append(f"stop {self.name}")


class FakeBench(run.Bench):
    """``Bench`` with its server start, warm-up and load generator replaced (no certificates, no processes)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.config = run.Config(quick=False)
        self.events: list[str] = []
        self.servers: list[FakeServer] = []
        self.fail_at = fail_at

    def start(self, name: str, module: str, rules: int = 1, cwd: Any = None) -> Any:
        if rules == self.fail_at:
            raise RuntimeError(f"{name} did not become healthy")
        server = FakeServer(name, rules, self.events)
        self.servers.append(server)
        self.events.append(f"start {name}")
        return server

    def warm_up(self, server: Any) -> None:
        self.events.append(f"warm {server.name}")

    def load(self, server: Any, scenarios: list[str], **job: Any) -> dict[str, Any]:
        assert not server.stopped
        assert scenarios == ["inference-small", "training-small"]
        assert job == {"mode": "closed", "duration": self.config.scaling_seconds}
        self.events.append(f"load {server.name}")
        cpu = CPU_ROUNDS[server.rules][len(server.measured)]
        server.measured.append(cpu)
        # Throughput rising round after round: its median round (the 3rd) is not the median CPU round.
        rounds = len(server.measured)
        return {"throughput": 1000.0 * rounds, "server_cpu_per_review": cpu * 1e-6, "round": rounds}


def test_the_servers_run_together_and_are_measured_in_alternated_rounds() -> None:
    bench = FakeBench()
    rules = bench.namespace_rules()
    names = [f"rules-{count}" for count in CPU_ROUNDS]
    assert bench.events[:8] == [*(f"start {n}" for n in names), *(f"warm {n}" for n in names)]
    loads = [event.removeprefix("load ") for event in bench.events if event.startswith("load ")]
    rounds = bench.config.saturation_rounds
    assert rounds == 5
    assert loads == [name for round_ in range(rounds) for name in (names if round_ % 2 == 0 else names[::-1])]
    assert bench.events[-4:] == [f"stop {n}" for n in names]
    assert set(rules) == set(CPU_ROUNDS)


def test_per_server_the_round_with_the_median_cpu_per_review_is_kept() -> None:
    rules = FakeBench().namespace_rules()
    assert {count: round(run_["server_cpu_per_review"] * 1e6) for count, run_ in rules.items()} == {
        1: 150,
        10: 160,
        100: 170,
        1000: 180,
    }
    assert rules[1000]["round"] == 2  # the whole round, not a figure put together from several
    assert [round(value * 1e6) for value in rules[1]["cpu_per_review_runs"]] == CPU_ROUNDS[1]


def test_a_server_that_fails_to_start_leaves_none_running() -> None:
    bench = FakeBench(fail_at=100)
    with pytest.raises(RuntimeError, match="rules-100 did not become healthy"):
        bench.namespace_rules()
    assert [server.name for server in bench.servers] == ["rules-1", "rules-10"]
    assert all(server.stopped for server in bench.servers)
    assert not any(event.startswith(("warm", "load")) for event in bench.events)
