"""``pool recommend``: size the reservation from inference's measured demand (issue 43).

The command's glue: its options, where the history comes from (Prometheus's HTTP API through
``ops/recommend/fetch.py``, or a file of exported samples through ``ops/recommend/history.py``), the analysis
(``ops/recommend/sizing.py``, pure) and how it is printed, as a table or ``-o json``. It reads no cluster: the history
says what the reservation was; ``--policy`` says today's headroom (the same file ``pool``'s other verbs take).

Beside the recommendation, how busy the reserved GPUs actually were over the window: the history of the activity
gauge the background audit exports (``serve --audit-gpu-metrics``), from the same source (and ``--save``d with the
demand); absent or unreadable, one line says so and the recommendation is the same.

Exit status as ``pool``'s: 0 a recommendation printed, 2 no recommendation: the history could not be read, or
cannot support one (no data, too short a window, a gap), or the options are wrong.
"""

from __future__ import annotations

import argparse
import gzip
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.core.policy import Policy
from webhook.ops.gpus.judge import ACTIVITY_GAUGE
from webhook.ops.lending.demand import SPLIT, WHOLE
from webhook.ops.pool.output import EXIT_BAD, EXIT_OK, Output
from webhook.ops.prometheus import CREDENTIALS, PrometheusError, Server, add_prometheus_options
from webhook.ops.recommend.fetch import read_activity, read_history, step_for
from webhook.ops.recommend.history import (
    Activity,
    Grid,
    HistoryFormatError,
    activity_from_samples,
    from_samples,
    parse_openmetrics,
    to_openmetrics,
)
from webhook.ops.recommend.sizing import (
    Busy,
    Expected,
    GpuActivity,
    HistoryError,
    KindReport,
    Recommendation,
    duration_text,
    gpu_activity,
    recommend,
    when,
)
from webhook.ops.reservation import columns

EXAMPLES = """\
  rocm-isolation-webhook pool recommend --prometheus https://prometheus.monitoring:9090 --token-file /var/run/token
  rocm-isolation-webhook pool recommend --prometheus http://localhost:9090 --window 7d --quantile 0.95 -o json
  rocm-isolation-webhook pool recommend --prometheus http://localhost:9090 --save demand.om.gz
  rocm-isolation-webhook pool recommend --from-file demand.om.gz
"""


class RecommendUsageError(Exception):
    """Options that do not go together, or a file that is not there: exit 2."""


def add_arguments(parser: argparse.ArgumentParser, duration: Callable[[str], float]) -> None:
    """recommend's options; ``duration``: ``pool.duration``, the project's duration parsing (pool imports this
    module, so it hands it over)."""
    group = parser.add_argument_group("recommend (history of the demand gauges: docs/operations.md)")
    group.add_argument("--prometheus", metavar="URL", help="recommend: read the history from this Prometheus")
    group.add_argument(
        "--from-file",
        metavar="FILE",
        help="recommend: read exported samples instead (OpenMetrics text with timestamps, as promtool backfills; "
        "FILE.gz: gzipped)",
    )
    group.add_argument(
        "--window", type=duration, metavar="DURATION", help="recommend: how much history (default 14d; at least 1d)"
    )
    group.add_argument(
        "--quantile",
        type=float,
        metavar="Q",
        help="recommend: the demand the reservation covers in the busiest hour (default 0.99)",
    )
    group.add_argument(
        "--max-gap",
        type=duration,
        metavar="DURATION",
        help="recommend: the longest stretch without samples accepted (default 15m)",
    )
    group.add_argument(
        "--save",
        metavar="FILE",
        help="recommend --prometheus: also write the history read to FILE (OpenMetrics; FILE.gz: gzipped), for "
        "--from-file later, offline or in CI",
    )
    add_prometheus_options(group, "recommend")


OPTIONS = (
    "prometheus",
    "from_file",
    "save",
    "window",
    "quantile",
    "max_gap",
    "token",
    "token_file",
    "certificate_authority",
)
DEFAULT_WINDOW = 14 * 86400.0
DEFAULT_MAX_GAP = 15 * 60.0
DEFAULT_QUANTILE = 0.99


def check_usage(args: argparse.Namespace) -> None:
    """recommend's own options only with recommend; with recommend, its source given once and none of the other
    verbs' options."""
    given = [name for name in OPTIONS if getattr(args, name, None) is not None]
    if getattr(args, "insecure_skip_tls_verify", False):
        given.append("insecure_skip_tls_verify")
    if args.action != "recommend":
        if args.action == "status" and getattr(args, "gpu_metrics", None) is not None:
            given = [name for name in given if name not in CREDENTIALS]
        if given:
            also = ", or pool status --gpu-metrics" if given[0] in CREDENTIALS else ""
            raise RecommendUsageError(f"--{given[0].replace('_', '-')} is only for pool recommend{also}")
        return
    for name in ("nodes", "selector", "count", "gpus", "devices_per_node"):
        if getattr(args, name, None) is not None:
            raise RecommendUsageError(
                f"pool recommend reads history, not nodes: --{name.replace('_', '-')} does not apply"
            )
    if (args.prometheus is None) == (args.from_file is None):
        raise RecommendUsageError("pool recommend needs --prometheus URL or --from-file FILE (one of them)")
    if args.from_file is not None and any(getattr(args, n) for n in CREDENTIALS):
        raise RecommendUsageError("--token, --token-file and the TLS options are for --prometheus, not --from-file")
    if args.save is not None and args.prometheus is None:
        raise RecommendUsageError("--save writes what --prometheus read: give --prometheus URL")
    if args.token is not None and args.token_file is not None:
        raise RecommendUsageError("give --token or --token-file, not both")
    if args.prometheus is not None and not args.prometheus.startswith(("http://", "https://")):
        raise RecommendUsageError(f"--prometheus {args.prometheus}: give a URL (http:// or https://)")
    if args.quantile is not None and not 0.5 <= args.quantile <= 1.0:
        raise RecommendUsageError(f"--quantile {args.quantile}: give a value between 0.5 and 1")
    if args.max_gap is not None and args.max_gap <= 0:
        raise RecommendUsageError("--max-gap: give a positive duration")
    for name in ("evict", "force", "all", "devices", "device_taint_rules"):
        if getattr(args, name, False):
            raise RecommendUsageError(f"--{name.replace('_', '-')} is not for pool recommend")
    if args.dry_run != "none":
        raise RecommendUsageError("--dry-run is only for pool apply / release")


def _server(args: argparse.Namespace) -> Server:
    token = args.token
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except OSError as err:
            raise RecommendUsageError(f"--token-file {args.token_file}: {err.strerror or err}") from err
    if args.certificate_authority is not None and not Path(args.certificate_authority).is_file():
        raise RecommendUsageError(f"--certificate-authority {args.certificate_authority}: no such file")
    return Server(args.prometheus, token, args.certificate_authority, bool(args.insecure_skip_tls_verify))


def read_text(path: Path) -> str:
    """The file's text; gzipped when its name ends in .gz (exports of 14 days are large, and compress well)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as found:
            return found.read()
    return path.read_text(encoding="utf-8")


def save(path: Path, text: str) -> None:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "wt", encoding="utf-8") as out:
                out.write(text)
        else:
            path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise RecommendUsageError(f"--save {path}: {err.strerror or err}") from err


@dataclass(frozen=True)
class ReservedActivity:
    """How busy the reserved GPUs were over the window (None: no sample of the gauge), or why it was not read;
    and the load inference is expected to keep a reserved GPU at most (``spec.gpuMetrics.inferenceLoadPercent``)."""

    found: GpuActivity | None
    expected_percent: float
    error: str | None = None


def run(args: argparse.Namespace, policy: Policy, out: Output, now: float | None = None) -> int:
    """Read the history, recommend, print; every failure is one ``error:`` line and exit 2."""
    window = args.window if args.window is not None else DEFAULT_WINDOW
    max_gap = args.max_gap if args.max_gap is not None else DEFAULT_MAX_GAP
    quantile = args.quantile if args.quantile is not None else DEFAULT_QUANTILE
    step = step_for(window)
    activity: Activity | None = None
    activity_error: str | None = None
    try:
        if args.from_file is not None:
            try:
                text = read_text(Path(args.from_file))
            except (OSError, EOFError, UnicodeDecodeError) as err:
                reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
                raise RecommendUsageError(f"--from-file {args.from_file}: {reason}") from err
            samples = parse_openmetrics(text, args.from_file)
            if not samples:
                raise HistoryError(f"no data: {args.from_file} holds no sample")
            # A file's window ends at its last sample: it was exported then, not now.
            grid = Grid.ending(max(s.timestamp for s in samples), window, step)
            history = from_samples(samples, grid)
            activity = activity_from_samples(samples, grid)
        else:
            grid = Grid.ending(time.time() if now is None else now, window, step)
            server = _server(args)
            history = read_history(server, grid)
            try:
                activity = read_activity(server, grid)
            except (PrometheusError, HistoryFormatError) as err:  # the recommendation does not depend on it
                activity_error = str(err)
            if args.save is not None:
                # Before the analysis: a history it refuses is worth keeping too (to see the gap).
                save(Path(args.save), to_openmetrics(history, activity))
        found = recommend(history, window, quantile, policy.spec.lending.headroom_gpus, max_gap)
    except (RecommendUsageError, PrometheusError, HistoryFormatError) as err:
        out.error(str(err))
        return EXIT_BAD
    except HistoryError as err:
        out.error(f"{err}; no recommendation")
        return EXIT_BAD
    busy = ReservedActivity(
        gpu_activity(activity) if activity is not None else None,
        policy.spec.gpu_metrics.inference_load_percent,
        activity_error,
    )
    if args.output == "json":
        out.json(as_json(found, window, busy))
    else:
        for line in as_text(found, window, busy):
            out.line(line)
    return EXIT_OK


# -- output ---------------------------------------------------------------------------------------------------


def _n(value: float) -> str:
    return f"{value:,.1f}" if value != int(value) else f"{int(value):,}"


def _size(report: KindReport, reserved: int, units: int) -> str:
    if report.kind == SPLIT:
        return f"{reserved} ({units} per node)"
    return f"{reserved} ({units} node{'' if units == 1 else 's'})"


def _pct(value: float) -> str:
    return f"{value:.1f} %"


def activity_line(busy: ReservedActivity) -> str:
    """One line: how busy the reserved GPUs were, or why that is not known."""
    if busy.error is not None:
        return f"reserved GPUs' activity: not read ({busy.error}); the recommendation does not depend on it"
    found = busy.found
    if found is None:
        return (
            f"reserved GPUs' activity: no sample of {ACTIVITY_GAUGE} in the window (the background audit exports it: "
            "serve --audit-gpu-metrics)"
        )
    every, held = found.reserved, found.inference
    line = (
        f"reserved GPUs' activity ({ACTIVITY_GAUGE}: {every.gpus} GPU{'' if every.gpus == 1 else 's'}, "
        f"{duration_text(found.hours * 3600)} of the window): {_pct(every.mean)} busy on average, p95 "
        f"{_pct(every.p95)}; "
    )
    if held is None:
        line += "inference held none of them"
    else:
        line += f"while inference held them: {_pct(held.mean)} on average, p95 {_pct(held.p95)}"
        if held.mean > busy.expected_percent:
            line += " (over)"
    return line + f"; inference is expected to keep a reserved GPU at most {busy.expected_percent:g} % busy"


def as_text(found: Recommendation, window: float, busy: ReservedActivity | None = None) -> list[str]:
    lines = [
        f"history: {when(found.start)} to {when(found.end)} ({duration_text(window)}, a point every "
        f"{duration_text(found.step)}); demand = GPUs inference holds + GPUs it waits for; hours UTC",
    ]
    for report in found.kinds:
        lines += ["", _heading(report), ""]
        rows = [["HOUR", "P50", "P95", "P99", "MAX"]]
        rows += [[f"{h.hour:02d}", _n(h.p50), _n(h.p95), _n(h.p99), _n(h.max)] for h in report.hours]
        lines += columns(rows)
        lines += [
            "",
            f"q{found.quantile:g} of the demand in the busiest hour ({report.peak_hour:02d}:00): {report.demand} GPUs; "
            f"q{found.quantile:g} of its rises from one point to the next: {report.burst} GPUs",
            "",
        ]
        lines += columns(_compare(report))
        for note in report.notes:
            lines.append(f"note: {note}")
        if report.commands:
            lines += ["", "to get there:", *(f"  {command}" for command in report.commands)]
        else:
            lines += ["", "the size stays: nothing to apply"]
    lines += [""]
    if busy is not None:
        lines.append(activity_line(busy))
    if found.policy_change:
        lines.append(f"policy: {found.policy_change} (today {found.headroom_today}); render and apply the manifests")
    else:
        lines.append(f"policy: no change (lending.headroomGPUs stays {found.headroom_today})")
    lines.append(
        "expected figures replay the window's demand at each size: borrowers take whatever may be lent at once, and "
        "give back what the headroom needs as soon as it is needed without a reclaim (they finish), so the expected "
        "reclaims are a floor; `make bench-lending-recommend` measures a recommendation on a real control plane"
    )
    return lines


def _heading(report: KindReport) -> str:
    what = "nodes reserved whole" if report.kind == WHOLE else "split nodes' reserved devices"
    return (
        f"pool {report.pool}, {what}: {report.nodes} node{'' if report.nodes == 1 else 's'} of "
        f"{report.gpus_per_node} GPUs"
    )


def _compare(report: KindReport) -> list[list[str]]:
    today, rec = report.expected_today, report.expected
    rows = [
        ["", "TODAY", "RECOMMENDED"],
        [
            "reserved GPUs",
            _size(report, report.today.reserved, report.today.units),
            _size(report, report.recommended.reserved, report.recommended.units),
        ],
        ["headroom GPUs (kept unlent)", _n(today.headroom), _n(rec.headroom)],
    ]
    rows += [[name, _n(round(pick(today), 1)), _n(round(pick(rec), 1))] for name, pick in _FIGURES]
    if report.observed_lent_gpu_hours is not None and report.observed_idle_gpu_hours is not None:
        rows.append(
            [
                "measured lent / idle GPU-h per day",
                f"{_n(round(report.observed_lent_gpu_hours, 1))} / {_n(round(report.observed_idle_gpu_hours, 1))}",
                "",
            ]
        )
    return rows


_FIGURES: list[tuple[str, Callable[[Expected], float]]] = [
    ("expected idle GPU-h per day", lambda e: e.idle_gpu_hours),
    ("expected lent GPU-h per day", lambda e: e.lent_gpu_hours),
    ("expected GPUs taken back per day", lambda e: e.taken_back_gpus),
    ("expected reclaims per day", lambda e: e.reclaims),
    ("expected waiting GPU-h per day", lambda e: e.waiting_gpu_hours),
    ("expected hours per day inference waits", lambda e: e.waiting_hours),
]


def _expected_json(found: Expected) -> dict[str, Any]:
    return {
        "reservedGPUs": found.reserved,
        "headroomGPUs": found.headroom,
        "idleGPUHoursPerDay": round(found.idle_gpu_hours, 2),
        "lentGPUHoursPerDay": round(found.lent_gpu_hours, 2),
        "takenBackGPUsPerDay": round(found.taken_back_gpus, 2),
        "reclaimsPerDay": round(found.reclaims, 2),
        "waitingGPUHoursPerDay": round(found.waiting_gpu_hours, 2),
        "waitingHoursPerDay": round(found.waiting_hours, 3),
    }


def _busy_json(busy: Busy | None) -> dict[str, Any] | None:
    if busy is None:
        return None
    return {"gpus": busy.gpus, "meanPercent": round(busy.mean, 1), "p95Percent": round(busy.p95, 1)}


def activity_json(busy: ReservedActivity) -> dict[str, Any]:
    found = busy.found
    return {
        "gauge": ACTIVITY_GAUGE,
        "read": busy.error is None,
        "error": busy.error,
        "start": when(found.start) if found else None,
        "end": when(found.end) if found else None,
        "hours": round(found.hours, 2) if found else 0,
        "reserved": _busy_json(found.reserved if found else None),
        "inference": _busy_json(found.inference if found else None),
        "inferenceLoadPercent": busy.expected_percent,
    }


def as_json(found: Recommendation, window: float, busy: ReservedActivity | None = None) -> dict[str, Any]:
    activity = {"reservedGpuActivity": activity_json(busy)} if busy is not None else {}
    return {
        "window": {"start": when(found.start), "end": when(found.end), "seconds": window, "stepSeconds": found.step},
        "quantile": found.quantile,
        "headroomGPUs": {"today": found.headroom_today, "recommended": found.headroom},
        "policyChange": found.policy_change,
        "pools": [
            {
                "pool": r.pool,
                "nodes": r.kind,
                "nodeCount": r.nodes,
                "gpusPerNode": r.gpus_per_node,
                "demandByHour": [
                    {"hour": h.hour, "samples": h.samples, "p50": h.p50, "p95": h.p95, "p99": h.p99, "max": h.max}
                    for h in r.hours
                ],
                "peakHour": r.peak_hour,
                "demandGPUs": r.demand,
                "burstGPUs": r.burst,
                "today": {"reservedGPUs": r.today.reserved, _unit(r): r.today.units},
                "recommended": {"reservedGPUs": r.recommended.reserved, _unit(r): r.recommended.units},
                "covered": r.covered,
                "expectedToday": _expected_json(r.expected_today),
                "expectedRecommended": _expected_json(r.expected),
                "measured": {
                    "lentGPUHoursPerDay": None
                    if r.observed_lent_gpu_hours is None
                    else round(r.observed_lent_gpu_hours, 2),
                    "idleGPUHoursPerDay": None
                    if r.observed_idle_gpu_hours is None
                    else round(r.observed_idle_gpu_hours, 2),
                },
                "commands": list(r.commands),
                "notes": list(r.notes),
            }
            for r in found.kinds
        ],
        **activity,
    }


def _unit(report: KindReport) -> str:
    return "devicesPerNode" if report.kind == SPLIT else "reservedNodes"
