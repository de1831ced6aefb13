"""``make bench-lending-recommend``: the trace of ``make bench-lending`` at the size ``pool recommend`` gives, beside
the hand-chosen one (issue 43, item 4).

1. **hand-chosen**: lending on the daily trace of bench/lending.py (8 whole nodes, 8 split nodes with 2 reserved
   devices each, headroom 0), a fresh control plane; every sample the bench also reads the webhook's ``/metrics``
   (its Lease holder's demand gauges, ``rocm_isolation_reserved_*``) and keeps them, stamped in trace time (a day
   from 00:00 UTC), as the OpenMetrics file an operator would export from Prometheus.
2. **recommend**: ``rocm-isolation-webhook pool recommend --from-file FILE --window 1d -o json``, the product's
   command as an operator runs it (``--max-gap 30m``: a second of real time is 4 trace minutes, so a busy
   machine's late sample is a trace gap of minutes; ``--policy``: the run's policy, for today's headroom).
3. **recommended**: the same trace, seed and demand (the Deployments' replicas are the trace's, whatever the
   size) on a fresh control plane at the recommended devices per node and ``headroomGPUs``. The whole nodes'
   count is the trace's (its whole replicas fill every device-plugin node at the peak); a different recommended
   count is reported, not run.

Reported side by side: inference creation-to-binding p99 (bound: grace + 5 s), borrowed and idle reserved
GPU-hours, borrowers taken back, GPU-hours of work lost; docs/benchmarks.md gets a section of its own (markers
below), the last line printed is the figures as JSON.

    KUBEBUILDER_ASSETS=.cache/envtest/bin python -m bench.lending_recommend [--quantile 0.99] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import lending, sections
from bench.lending import DOC, ROOT, Run, Settings, log, policy_text, run_mode
from bench.lending_trace import RunResult
from tests.e2e.controlplane import ASSETS_ENV, HOW_TO_GET_BINARIES, loopback_only, missing_binaries
from webhook.ops.lending.demand import GAUGES

SECTION_BEGIN = "<!-- bench-lending-recommend: written by make bench-lending-recommend (bench/lending_recommend.py) -->"
SECTION_END = "<!-- bench-lending-recommend: end -->"
TRACE_START = 1_764_892_800  # 2025-12-05 00:00 UTC: the trace's hour 0 (hours of the day are the trace's)


def gauge_lines(metrics_text: str) -> list[tuple[str, str]]:
    """The demand gauges' samples of one ``/metrics`` answer: (name with labels, value). By their names
    (``ops/demand.GAUGES``), not a prefix: ``rocm_isolation_reserved_names_syncs_total`` is no demand gauge."""
    names = set(GAUGES.values())
    found = []
    for line in metrics_text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.partition("{")[0] in names:
            found.append((head, value))
    return found


def openmetrics(records: Iterable[tuple[float, list[tuple[str, str]]]]) -> str:
    """The recorded samples (trace time, gauges) as OpenMetrics text, each series' samples together and in time
    order (what ``promtool tsdb create-blocks-from openmetrics`` and ``pool recommend --from-file`` read)."""
    series: dict[str, list[tuple[float, str]]] = {}
    for at, lines in records:
        for head, value in lines:
            series.setdefault(head, []).append((at, value))
    families: dict[str, list[str]] = {}
    for head in sorted(series):
        families.setdefault(head.partition("{")[0], []).append(head)
    out: list[str] = []
    for family, heads in families.items():
        out.append(f"# TYPE {family} gauge")
        for head in heads:
            out += [f"{head} {value} {at:.3f}" for at, value in sorted(series[head])]
    out.append("# EOF")
    return "\n".join(out) + "\n"


class RecordingRun(Run):
    """A lending run that keeps the webhook's demand gauges at every sample, stamped in trace time."""

    def __init__(self, settings: Settings, mode: str, workdir: Path) -> None:
        super().__init__(settings, mode, workdir)
        self.records: list[tuple[float, list[tuple[str, str]]]] = []
        self.scrape_errors = 0

    def observe(self, hour: float) -> None:
        try:
            status, text = self.webhook.get("/metrics")
        except OSError:
            self.scrape_errors += 1
            return
        if status == 200:
            self.records.append((TRACE_START + hour * 3600.0, gauge_lines(text)))
        else:
            self.scrape_errors += 1


def recommend(history: Path, policy: Path, quantile: float, max_gap: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "webhook", "pool", "recommend", "--from-file", str(history), "--window", "1d",
            "--max-gap", max_gap, "--quantile", str(quantile), "--policy", str(policy), "-o", "json"]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pool recommend exited {result.returncode}: {result.stderr.strip()}")
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def pools(document: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {p["nodes"]: p for p in document["pools"]}


ROWS = [
    ("reserved GPUs", "reserved"),
    ("headroomGPUs", "headroom"),
    ("inference creation-to-binding p99 s (real)", "inference_bind_p99_s"),
    ("max s", "inference_bind_max_s"),
    ("inference pods bound", "inference_pods_bound"),
    ("borrowed GPU-hours", "borrowed_gpu_hours"),
    ("idle reserved GPU-hours", "idle_reserved_gpu_hours"),
    ("borrowers evicted or preempted", "interruptions"),
    ("GPU-hours of work lost to them", "lost_gpu_hours"),
    ("training GPU-hours (any capacity)", "training_gpu_hours"),
    ("training jobs finished", "jobs_finished"),
    ("inference pods evicted or preempted", "inference_evicted"),
    ("non-borrowers seen on reserved capacity", "nonborrowers_on_reserved"),
]


def figures(result: RunResult, settings: Settings) -> dict[str, Any]:
    return result.figures() | {"reserved": settings.reserved_gpus, "headroom": settings.headroom}


def section(hand: dict[str, Any], chosen: dict[str, Any], advice: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "—"
        return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}".rstrip("0").rstrip(".")

    bound = meta["grace"] + 5
    lines = [
        SECTION_BEGIN,
        "## The recommended size on the daily trace (issue 43, `make bench-lending-recommend`)",
        "",
        f"Generated by `make bench-lending-recommend` (`python -m bench.lending_recommend`), commit `{meta['commit']}`, "
        f"{meta['date']}; {meta['cpus']} CPUs, load average {meta['load_start']:.2f} at the start, "
        f"{meta['load_end']:.2f} at the end; {meta['minutes']:.1f} min for both runs.",
        "",
        "The trace, cluster and control plane of `make bench-lending` (above), lending on, twice on fresh control "
        "planes: **hand-chosen** (2 devices per split node, headroom 0), its webhook's demand gauges "
        "(`rocm_isolation_reserved_*`) read at every sample and exported as OpenMetrics in trace time; "
        f"`pool recommend --from-file ... --window 1d --quantile {meta['quantile']}` on that export; then "
        "**recommended**: the same trace and demand at what it said.",
        "",
        f"What `pool recommend` said: {meta['said']}.",
        "",
        "| | hand-chosen | recommended |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {name} | {cell(hand.get(key))} | {cell(chosen.get(key))} |" for name, key in ROWS]
    p99 = chosen["inference_bind_p99_s"]
    held = p99 is not None and p99 <= bound
    pairs = [(chosen[k], hand[k]) for k in ("interruptions", "lost_gpu_hours")]
    fewer = (
        "fewer" if all(a <= b for a, b in pairs) and any(a < b for a, b in pairs)
        else "as many" if all(a == b for a, b in pairs) else "more"
    )  # fmt: skip
    lines += [
        "",
        f"- Bound (grace + 5 = {bound} s) at the recommended size: p99 {cell(p99)} s: **{'held' if held else 'NOT held'}**.",
        f"- Borrowers taken back {hand['interruptions']} → {chosen['interruptions']}, work lost "
        f"{cell(hand['lost_gpu_hours'])} → {cell(chosen['lost_gpu_hours'])} GPU-hours: "
        f"**{fewer}**; borrowed {cell(hand['borrowed_gpu_hours'])} → "
        f"{cell(chosen['borrowed_gpu_hours'])} GPU-hours.",
    ]
    if hand["reserved"] == chosen["reserved"]:
        lines.append(
            "- The hand-chosen size is already right for this trace: its busiest hour's demand fills the reservation "
            "(the trace's peak is 100 % of it), so `pool recommend` keeps the size and changes the headroom only."
        )
    if hand["borrowed_gpu_hours"]:
        cost = 1 - chosen["borrowed_gpu_hours"] / hand["borrowed_gpu_hours"]
        lines.append(
            f"- The price of the headroom: {cost:.0%} fewer GPU-hours lent (kept idle for a burst instead)."
            + (
                f" Inference still waits about a grace period when a burst outgrows it (p50 {cell(p50)} s)."
                if (p50 := chosen.get("inference_bind_p50_s")) is not None and p50 >= 0.8 * meta["grace"]
                else ""
            )
        )
    lines.append(
        "- One run of each, on a machine shared with other work: a difference of a few reclaims is within what "
        "separates two runs of the same size (compare the hand-chosen column with `make bench-lending`'s lending "
        "run above)."
    )
    lines += [f"- {note}" for note in meta["notes"]]
    lines += ["", "The last line `make bench-lending-recommend` printed:", "", "```json", json.dumps(meta["json"]),
              "```", SECTION_END]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    sections.write_section(DOC, SECTION_BEGIN, SECTION_END, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quantile", type=float, default=0.99, help="pool recommend --quantile")
    parser.add_argument("--history", type=Path, help="keep the exported gauges here (default: a temporary file)")
    parser.add_argument(
        "--time-factor",
        type=float,
        default=Settings().time_factor,
        help="trace seconds per real second (a quick try: 2400)",
    )
    parser.add_argument(
        "--max-gap",
        default="30m",
        help="pool recommend --max-gap, trace time (a sample every 4 trace minutes at the default time factor; a "
        "quick try at 2400: 2h)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only: docs/benchmarks.md untouched")
    args = parser.parse_args(argv)
    missing = missing_binaries(os.environ.get(ASSETS_ENV))
    if missing:
        print(f"bench.lending_recommend needs {ASSETS_ENV} ({', '.join(missing)} missing): {HOW_TO_GET_BINARIES}")
        return 2
    loopback_only()
    warnings.filterwarnings("ignore", "Attribute's length must be", UserWarning)
    began = time.monotonic()
    load_start = os.getloadavg()[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    hand_settings = Settings(time_factor=args.time_factor)
    runs: list[RecordingRun] = []

    class Keep(RecordingRun):
        def __init__(self, settings: Settings, mode: str, workdir: Path) -> None:
            super().__init__(settings, mode, workdir)
            runs.append(self)

    hand = run_mode(hand_settings, "lending", Keep)
    recorded = runs[0]
    log(f"hand-chosen: {json.dumps(hand.figures())}; {len(recorded.records)} scrapes, {recorded.scrape_errors} failed")
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-lending-recommend-") as directory:
        history = args.history or Path(directory) / "demand.om"
        history.write_text(openmetrics(recorded.records), encoding="utf-8")
        policy = Path(directory) / "policy.yaml"
        policy.write_text(policy_text(hand_settings, True), encoding="utf-8")
        advice = recommend(history, policy, args.quantile, args.max_gap)
    by_kind = pools(advice)
    per_node = (
        by_kind["split"]["recommended"]["devicesPerNode"] if "split" in by_kind else hand_settings.devices_per_node
    )
    if per_node > lending.GPUS_PER_NODE:
        raise RuntimeError(f"pool recommend said {per_node} devices per node: more than a node's GPUs")
    whole_nodes = by_kind["whole"]["recommended"]["reservedNodes"] if "whole" in by_kind else hand_settings.whole_nodes
    if whole_nodes != hand_settings.whole_nodes:
        notes.append(
            f"pool recommend said {whole_nodes} whole nodes; the trace's whole replicas fill all "
            f"{hand_settings.whole_nodes} at the peak, so the run kept {hand_settings.whole_nodes}"
        )
    headroom = advice["headroomGPUs"]["recommended"]
    said = (
        f"{per_node} devices per split node (today {hand_settings.devices_per_node}), "
        f"{whole_nodes} whole nodes (today {hand_settings.whole_nodes}), headroomGPUs {headroom} (today "
        f"{hand_settings.headroom}); busiest hour's demand: "
        + ", ".join(
            f"{k} {p['demandGPUs']} GPUs at {p['peakHour']:02d}:00, burst {p['burstGPUs']}" for k, p in by_kind.items()
        )
    )
    log(f"pool recommend: {said}")
    chosen_settings = Settings(time_factor=args.time_factor, devices_per_node=per_node, headroom=headroom)
    chosen = run_mode(chosen_settings, "lending")
    log(f"recommended: {json.dumps(chosen.figures())}")
    hand_figures, chosen_figures = figures(hand, hand_settings), figures(chosen, chosen_settings)
    minutes = (time.monotonic() - began) / 60.0
    keys = ("inference_bind_p99_s", "borrowed_gpu_hours", "idle_reserved_gpu_hours", "interruptions", "lost_gpu_hours")
    result = {
        "recommended": {"devices_per_node": per_node, "whole_nodes": whole_nodes, "headroom_gpus": headroom},
        "hand_chosen": {k: hand_figures[k] for k in keys},
        "at_recommended": {k: chosen_figures[k] for k in keys},
        "grace_s": hand_settings.grace,
        "quantile": args.quantile,
        "run_minutes": round(minutes, 1),
    }
    if not args.no_write:
        meta = {
            "commit": commit.strip(),
            "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "cpus": os.cpu_count(),
            "load_start": load_start,
            "load_end": os.getloadavg()[0],
            "minutes": minutes,
            "grace": hand_settings.grace,
            "quantile": args.quantile,
            "said": said,
            "notes": notes + hand.notes[:3] + chosen.notes[:3],
            "json": result,
        }
        write_section(section(hand_figures, chosen_figures, advice, meta))
        log(f"written: {DOC.relative_to(ROOT)}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
