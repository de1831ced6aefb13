"""What each per-review metric costs: the calls ``webhook.service.app._record`` makes, timed in-process.

prometheus-client picks its value class when it is imported: in-memory floats behind a lock, or,
with ``PROMETHEUS_MULTIPROC_DIR`` set (``serve --workers N``), one mmapped file per metric type and
process. Each mode is measured in its own interpreter (best of 5 rounds of ``timeit``).

``python -m bench.metrics_cost`` prints a JSON object: mode -> call -> seconds per call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from bench.servers import REPO
from bench.timing import interleaved_best

# call -> when _record makes it
CALLS: dict[str, str] = {
    "reviews": "every review (`admission_reviews_total`, child looked up in the label cache)",
    "latency": "every review (`admission_review_duration_seconds` histogram)",
    "patch_operations": "patched reviews (`patch_operations_total`)",
    "denials": "denied reviews (`denials_total`, label cache)",
    "violations": "once per violation (`violations_total`, label cache)",
    "review_counts": "every review (the summary line's counts; not a metric)",
}


def _calls() -> dict[str, Callable[[], object]]:
    from webhook.service.logs import ReviewCounts
    from webhook.service.metrics import Metrics

    metrics = Metrics()
    counts = ReviewCounts()
    reviews, denials, violations = metrics.reviews, metrics.denials, metrics.violations
    return {
        "reviews": lambda: metrics.labelled(reviews, "CREATE", "inference", "patched", "enforce").inc(),
        "latency": lambda: metrics.latency.observe(0.00008),
        "patch_operations": lambda: metrics.patch_operations.inc(6),
        "denials": lambda: metrics.labelled(denials, "deny-node-selector").inc(),
        "violations": lambda: metrics.labelled(violations, "deny-node-selector", "enforce").inc(),
        "review_counts": lambda: counts.add("patched"),
    }


def measure_here(seconds: float = 0.2, rounds: int = 5) -> dict[str, float]:
    """Seconds per call of each entry of ``CALLS`` in this process's prometheus-client mode."""
    return interleaved_best(_calls(), seconds, rounds)


def measure(seconds: float = 0.2) -> dict[str, dict[str, float]]:
    """Both modes, each in a fresh interpreter: ``single`` (in memory) and ``multiprocess`` (mmap files)."""
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rocm-isolation-metrics-cost-") as directory:
        for mode in ("single", "multiprocess"):
            env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
            if mode == "multiprocess":
                env["PROMETHEUS_MULTIPROC_DIR"] = directory
            done = subprocess.run(
                [sys.executable, "-m", "bench.metrics_cost", "--here", str(seconds)],
                capture_output=True,
                text=True,
                cwd=REPO,
                env=env,
                check=True,
            )
            out[mode] = json.loads(done.stdout)
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--here":
        print(json.dumps(measure_here(float(sys.argv[2]) if len(sys.argv) > 2 else 0.2)))
        return 0
    result = measure()
    for name in CALLS:
        single, multi = result["single"][name], result["multiprocess"][name]
        print(f"{name:18s} {single * 1e9:7.0f} ns  multiprocess {multi * 1e9:7.0f} ns", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
