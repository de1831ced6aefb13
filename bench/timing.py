"""In-process timing of small calls, shared by the ``decide()`` and metrics micro-benchmarks."""

from __future__ import annotations

import timeit
from collections.abc import Callable, Hashable
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)


def interleaved_best(calls: dict[Key, Callable[[], object]], seconds: float, rounds: int = 5) -> dict[Key, float]:
    """Seconds per call of each ``calls`` entry: the best of ``rounds`` rounds, each running every entry
    once for about ``seconds`` (a passing slowdown of the machine hits every entry alike)."""
    timers = {key: timeit.Timer(call) for key, call in calls.items()}
    numbers = {key: max(1, int(timer.autorange()[0] * seconds / 0.2)) for key, timer in timers.items()}
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for key, timer in timers.items():
            best[key] = min(best[key], timer.timeit(numbers[key]) / numbers[key])
    return best
