"""The benchmarks run outside pytest (``make bench``, ``make bench-apiserver``): each module imports in a fresh
interpreter as the Makefile starts it, without the path pytest sets up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "module",
    [
        "bench.run",
        "bench.apiserver_admission",
        "bench.audit_scale",
        "bench.instructions",
        "bench.soak",
        "bench.lending",
        "bench.scale",
        "bench.lending_recommend",
    ],
)
def test_a_bench_module_imports_as_make_runs_it(module: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
