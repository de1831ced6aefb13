"""The ``decide()`` micro-benchmarks run fully only under ``--benchmark-only`` (``make bench``).

In a plain ``pytest`` run (``make test``) each benchmarked call runs once: the result is still
checked, the suite stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# The benchmark package lives at the top of the repository (``python -m pytest`` has it on the path already).
REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(autouse=True)
def _once_unless_benchmarking(request: pytest.FixtureRequest) -> None:
    if "benchmark" not in request.fixturenames:
        return
    config = request.config
    if config.getoption("benchmark_only") or config.getoption("benchmark_enable"):
        return
    benchmark: Any = request.getfixturevalue("benchmark")
    benchmark.disabled = True
