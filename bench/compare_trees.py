"""Two checkouts' ``serve`` side by side at saturation: the same reviews, the servers alternated round by
round (in reverse order every other round), each pinned to the servers' CPU like ``make bench``.

``make bench`` runs take 35 minutes and a busy host moves a saturation row by 20-30% from one run to the
next; this compares two trees within one run, so a change's cost is not confused with the host's mood:

    python -m bench.compare_trees /path/to/before /path/to/after [--scenario training-denied] [--rounds 7]

Each tree must have been set up (``make setup``: its compiled modules, if any, next to its sources); both
servers run with this interpreter, each importing ``webhook`` from its own tree. Prints one line per
scenario and tree: reviews/s and server CPU per review, the median and every round (sorted).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path

from bench import reviews
from bench.run import Bench, Config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare_trees", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--scenario", action="append", choices=sorted(reviews.BUILDERS), help="default: all five")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for tree in trees.values():
        if not (tree / "webhook" / "__init__.py").is_file():
            parser.error(f"{tree}: not a checkout (no webhook/__init__.py)")
    bench = Bench(Config.from_env(), Path(tempfile.mkdtemp(prefix="rocm-isolation-compare-")))
    scenarios = args.scenario or list(reviews.BUILDERS)
    starts = [functools.partial(bench.start, name, "webhook serve", cwd=tree) for name, tree in trees.items()]
    with bench.running(starts) as group:
        for server in group:
            bench.load(server, scenarios, mode="closed", duration=5)  # warm-up
        for scenario in scenarios:
            one = functools.partial(bench.load, scenarios=[scenario], mode="closed", duration=args.seconds)
            runs = bench.alternated(group, args.rounds, one)
            for name, items in runs.items():
                rates = sorted(round(r["throughput"]) for r in items)
                cpu = sorted(round(r["server_cpu_per_review"] * 1e6) for r in items)
                print(
                    f"{scenario:16} {name:6}  reviews/s median {statistics.median(rates):>7,.0f}  {rates}"
                    f"  CPU per review median {statistics.median(cpu):.0f} µs  {cpu}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
