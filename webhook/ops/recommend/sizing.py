"""``pool recommend``: the reservation's size and headroom from inference's measured demand (issue 43). Pure.

Input: the history of the demand gauges (``ops/lending/demand.py``) on one grid (``ops/recommend/history.py``), per pool
and kind of node. Per kind with nodes in the history:

- **demand** = GPUs inference holds + GPUs it asked for and did not get, at each grid point; by hour of the day
  (UTC) its p50/p95/p99/max over the window;
- **the reservation** covers the demand's ``quantile`` in the busiest hour of the day (the largest of the hours'
  quantiles: the daily peak is what a reservation is for; in that hour inference waits at most ``1 - quantile``
  of the time), in the kind's own units: reserved nodes of the nodes' GPUs (whole), devices per node over every
  split node (split; at most a node's GPUs);
- **the headroom** (``lending.headroomGPUs``: never lent, so a burst binds at once instead of after a reclaim)
  covers the ``quantile`` of the demand's rises from one grid point to the next; one policy field for both kinds,
  so the larger;
- **expected** idle, lent and waiting GPU-hours per day and GPUs taken back from borrowers per day, today's size
  against the recommended one, by replaying the window's demand (``expected``: borrowers take whatever may be
  lent at once, a backlog always waiting, as in ``make bench-lending``; lending closes without a reclaim as
  demand rises into the headroom; a rise past the free GPUs takes that many GPUs back from borrowers). The
  headroom comes back at once in the replay, as if borrowers finished the moment lending closed: in a cluster it
  comes back as they finish, so the expected reclaims are a floor (``make bench-lending-recommend`` measures).

Refused, never guessed: a window shorter than a day (some hour of the day unseen), no sample at all, and a
gap (no sample for longer than ``max_gap``, including at the start or end of the window: history shorter than
the window asked).

Beside it, how busy the reserved GPUs actually were (``gpu_activity``): the mean and p95 of the background audit's
activity gauge over every reserved GPU and grid point with a value, and over those inference held. Overall, not
per kind of node: the gauge is labelled by node, GPU and inference only (nothing in it tells a whole node from a
split one). The recommendation never depends on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise

from webhook.ops.lending.demand import GAUGES, KINDS, SPLIT, WHOLE
from webhook.ops.recommend.history import Activity, History, Key

DAY = 86400.0
HOUR = 3600.0
NEEDED = ("inference", "waiting", "reserved", "nodes", "node_gpus")  # the figures a recommendation needs


class HistoryError(Exception):
    """The history cannot support a recommendation: what is missing, where, and what to do."""


def duration_text(seconds: float) -> str:
    """``14d``, ``2d 3h``, ``1h 20m``, ``45m``, ``30s``: how kubectl users write durations."""
    seconds = round(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return " ".join(parts[:2])


def when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile (a value that occurred: GPUs stay whole numbers); ``values`` not empty."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class HourStats:
    hour: int  # of the day, UTC
    samples: int
    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True)
class Expected:
    """What a reservation of ``reserved`` GPUs keeping ``headroom`` unlent gives over the window, per day."""

    reserved: int
    headroom: int  # as kept: whole nodes close whole nodes, so a multiple of their GPUs
    idle_gpu_hours: float
    lent_gpu_hours: float
    waiting_gpu_hours: float  # demand above the reservation
    waiting_hours: float  # hours with some of it
    taken_back_gpus: float  # GPUs taken back from borrowers (a reclaim each)
    reclaims: float  # grid steps in which some were taken back


@dataclass(frozen=True)
class Size:
    reserved: int  # GPUs
    units: int  # whole: reserved nodes; split: devices per node


@dataclass(frozen=True)
class KindReport:
    pool: str
    kind: str  # whole or split
    nodes: int
    gpus_per_node: int
    hours: tuple[HourStats, ...]
    peak_hour: int
    demand: int  # the busiest hour's quantile of the demand, rounded up
    burst: int  # the quantile of its rises
    today: Size
    recommended: Size
    expected_today: Expected
    expected: Expected
    observed_lent_gpu_hours: float | None  # per day, from the lent / idle gauges themselves
    observed_idle_gpu_hours: float | None
    covered: bool  # False: even every GPU of the nodes is short of the demand
    commands: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recommendation:
    start: float
    end: float
    step: float
    quantile: float
    headroom_today: int
    headroom: int
    kinds: tuple[KindReport, ...]
    policy_change: str | None  # the line of the policy to change, None: none
    notes: tuple[str, ...] = field(default=())


def _demand(history: History, key: Key, present: Sequence[bool]) -> list[float | None]:
    """held + waiting at each point ``present`` (``_present``), None elsewhere."""
    inference, waiting = history.series(key, "inference"), history.series(key, "waiting")
    return [
        a + b if ok and a is not None and b is not None else None
        for a, b, ok in zip(inference, waiting, present, strict=True)
    ]


def _present(history: History, key: Key) -> list[bool]:
    """The points with every needed figure, and nodes: zeros everywhere are a moment when no replica led the
    keeping (the others export zeros), not a demand of 0; a drop to 0 and back would read as a burst."""
    columns = [history.series(key, figure) for figure in NEEDED]
    nodes = history.series(key, "nodes")
    return [all(column[i] is not None for column in columns) and bool(nodes[i]) for i in range(history.grid.points)]


def _label(key: Key) -> str:
    return f"pool {key[0]}, {key[1]} nodes"


def check(history: History, window: float, max_gap: float) -> dict[Key, list[bool]]:
    """The (pool, nodes) kinds the history supports (nodes at some point), each with its points present
    (``_present``), or HistoryError: too short a window, no data, a gap longer than ``max_gap`` anywhere in the
    window (its start and end included)."""
    if window < DAY:
        raise HistoryError(
            f"--window {duration_text(window)} is too short: give at least 1d, so that every hour of the day is seen "
            "(the reservation must cover the daily peak; the default is 14d)"
        )
    grid = history.grid
    order = {kind: index for index, kind in enumerate(KINDS)}
    keys = sorted(
        (key for key in history.values if any(history.series(key, "nodes"))),
        key=lambda key: (key[0], order.get(key[1], len(order)), key[1]),
    )
    if not keys:
        raise HistoryError(
            f"no data: no sample of {GAUGES['nodes']} above 0 between {when(grid.start)} and {when(grid.end)} "
            f"(the lending keeper of serve exports the demand gauges while lending is on: docs/operations.md, "
            f'"Sizing the reservation"); nothing to recommend from'
        )
    times = grid.times()
    found: dict[Key, list[bool]] = {}
    for key in keys:
        present = found[key] = _present(history, key)
        missing = [figure for figure in NEEDED if all(v is None for v in history.series(key, figure))]
        if missing:
            raise HistoryError(f"{_label(key)}: no sample of {', '.join(GAUGES[m] for m in missing)} in the window")
        seen = [i for i, ok in enumerate(present) if ok]
        # The window's edges count as samples: history that starts late or stops early is a gap too.
        first_at = times[seen[0]]
        if first_at - grid.start > max_gap:
            if grid.end - first_at < DAY:
                raise HistoryError(
                    f"{_label(key)}: the history starts at {when(first_at)}: only "
                    f"{duration_text(grid.end - first_at)} of it, and a recommendation needs at least 1d (every hour "
                    "of the day); wait for more"
                )
            raise HistoryError(
                f"{_label(key)}: the history starts at {when(first_at)}, {duration_text(first_at - grid.start)} "
                f"into the {duration_text(window)} window: too short a history for the window (give --window "
                f"{duration_text(grid.end - first_at)} or less, or wait for more)"
            )
        last_at = times[seen[-1]]
        if grid.end - last_at > max_gap:
            raise HistoryError(
                f"{_label(key)}: no sample since {when(last_at)} ({duration_text(grid.end - last_at)} before the "
                f"window's end, {when(grid.end)}): is the lending keeper running and scraped?"
            )
        for before, after in pairwise(seen):
            if times[after] - times[before] > max_gap:
                raise HistoryError(
                    f"{_label(key)}: a gap of {duration_text(times[after] - times[before])} in the history, from "
                    f"{when(times[before])} to {when(times[after])} (no sample of the demand gauges; longer than "
                    f"--max-gap {duration_text(max_gap)}): a recommendation would guess what happened then. Choose "
                    "a window without it (--window), or raise --max-gap knowingly"
                )
    return found


def by_hour(times: Sequence[float], demand: Sequence[float | None]) -> dict[int, list[float]]:
    """The demand's values per hour of the day (UTC)."""
    found: dict[int, list[float]] = {}
    for at, value in zip(times, demand, strict=True):
        if value is not None:
            found.setdefault(int((at % DAY) // HOUR), []).append(value)
    return dict(sorted(found.items()))


def hourly(values: dict[int, list[float]]) -> tuple[HourStats, ...]:
    return tuple(
        HourStats(hour, len(v), quantile(v, 0.5), quantile(v, 0.95), quantile(v, 0.99), max(v))
        for hour, v in values.items()
    )


def rises(demand: Sequence[float | None]) -> list[float]:
    """The demand's increases from one grid point to the next (both present)."""
    return [b - a for a, b in pairwise(demand) if a is not None and b is not None and b > a]


def expected(demand: Sequence[float | None], step: float, reserved: int, headroom: int) -> Expected:
    """The window replayed at ``reserved`` GPUs keeping ``headroom`` unlent (see the module's docstring)."""
    idle = lent_hours = waiting_hours = waiting_gpu_hours = taken = 0.0
    reclaims = 0
    points = 0
    lent_before: float | None = None  # at the point before; None: none (the start, or a hole)
    for value in demand:
        if value is None:
            lent_before = None  # no guess across a hole: the replay starts again after it
            continue
        points += 1
        held = min(value, reserved)
        if lent_before is not None:
            # What inference now holds past the GPUs neither it nor borrowers held comes from borrowers.
            took = min(max(held + lent_before - reserved, 0.0), lent_before)
            if took > 0:
                taken += took
                reclaims += 1
        lent = max(reserved - headroom - held, 0.0)
        idle += (reserved - held - lent) * step / HOUR
        lent_hours += lent * step / HOUR
        waiting_gpu_hours += max(value - reserved, 0.0) * step / HOUR
        waiting_hours += (step / HOUR) if value > reserved else 0.0
        lent_before = lent
    days = max(points * step / DAY, 1e-9)
    return Expected(
        reserved,
        headroom,
        idle / days,
        lent_hours / days,
        waiting_gpu_hours / days,
        waiting_hours / days,
        taken / days,
        reclaims / days,
    )


def _kept(headroom: int, kind: str, gpus_per_node: int, reserved: int) -> int:
    """The headroom as the keeper keeps it: whole nodes closed until their free GPUs cover it."""
    if kind == WHOLE and headroom and gpus_per_node:
        headroom = math.ceil(headroom / gpus_per_node) * gpus_per_node
    return min(headroom, reserved)


def _last(values: Sequence[float | None]) -> float:
    return next((v for v in reversed(values) if v), 0.0)


def _per_day(history: History, key: Key, figure: str) -> float | None:
    values = [v for v in history.series(key, figure) if v is not None]
    return sum(values) / len(values) * 24.0 if values else None


def _commands(kind: str, today: Size, recommended: Size) -> tuple[str, ...]:
    prog = "rocm-isolation-webhook pool"
    if recommended.units == today.units:
        return ()
    if kind == SPLIT:
        per_node = f"--devices-per-node {recommended.units}"
        evict = " --evict" if recommended.units > today.units else ""  # devices that become reserved
        return (f"{prog} plan {per_node}", f"{prog} apply {per_node}{evict}")
    if recommended.units > today.units:
        # --gpus picks the nodes reserved already first, then enough others: the pool grows to that many GPUs.
        return (f"{prog} plan --gpus {recommended.reserved}", f"{prog} apply --gpus {recommended.reserved} --evict")
    fewer = today.units - recommended.units
    return (f"{prog} release --nodes NODE[,NODE...]  # {fewer} of the reserved nodes; pool status shows the idle ones",)


def recommend(history: History, window: float, quantile_: float, headroom_today: int, max_gap: float) -> Recommendation:
    """Per pool and kind of node, the size and headroom covering ``quantile_`` of the demand; HistoryError when
    the history cannot support one (``check``)."""
    grid = history.grid
    times = grid.times()
    demands = {key: _demand(history, key, present) for key, present in check(history, window, max_gap).items()}
    bursts = {key: math.ceil(quantile(ups, quantile_)) if (ups := rises(d)) else 0 for key, d in demands.items()}
    headroom = max(bursts.values())  # one policy field for every kind
    reports: list[KindReport] = []
    for key, demand in demands.items():
        values = by_hour(times, demand)
        # The busiest hour: the largest quantile (the earliest hour among equals).
        peak_hour = max(values, key=lambda hour: (quantile(values[hour], quantile_), -hour))
        need = math.ceil(quantile(values[peak_hour], quantile_))
        nodes = int(_last(history.series(key, "nodes")))
        gpus_per_node = round(_last(history.series(key, "node_gpus")) / nodes) if nodes else 0
        reserved_today = int(_last(history.series(key, "reserved")))
        notes: list[str] = []
        covered = True
        if key[1] == SPLIT:
            today = Size(reserved_today, round(reserved_today / nodes) if nodes else 0)
            per_node = max(1, math.ceil(need / nodes)) if nodes else 0
            if per_node > gpus_per_node:
                covered = False
                notes.append(f"{need} GPUs of demand need more than every GPU of the {nodes} split nodes: add nodes")
                per_node = gpus_per_node
            recommended = Size(per_node * nodes, per_node)
        else:
            today = Size(reserved_today, nodes)
            # At least one node: a pool of none would leave inference's placement nowhere to go.
            count = max(1, math.ceil(need / gpus_per_node)) if gpus_per_node else 0
            recommended = Size(count * gpus_per_node, count)
        moved = recommended.reserved - today.reserved
        if moved < 0:
            notes.append(f"{-moved} reserved GPUs go back to the shared pool: training runs there without reclaims")
        elif moved > 0:
            notes.append(f"{moved} GPUs more reserved: the shared pool gives them up")
        reports.append(
            KindReport(
                key[0],
                key[1],
                nodes,
                gpus_per_node,
                hourly(values),
                peak_hour,
                need,
                bursts[key],
                today,
                recommended,
                expected(
                    demand, grid.step, today.reserved, _kept(headroom_today, key[1], gpus_per_node, today.reserved)
                ),
                expected(
                    demand,
                    grid.step,
                    recommended.reserved,
                    _kept(headroom, key[1], gpus_per_node, recommended.reserved),
                ),
                _per_day(history, key, "lent"),
                _per_day(history, key, "idle"),
                covered,
                _commands(key[1], today, recommended),
                tuple(notes),
            )
        )
    change = f"spec.lending.headroomGPUs: {headroom}" if headroom != headroom_today else None
    return Recommendation(grid.start, grid.end, grid.step, quantile_, headroom_today, headroom, tuple(reports), change)


# -- the reserved GPUs' activity ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Busy:
    """Activity over GPU-points: how many GPUs, the mean and the p95 (%)."""

    gpus: int
    mean: float
    p95: float


@dataclass(frozen=True)
class GpuActivity:
    start: float  # the first and last grid point with a value
    end: float
    hours: float  # the window's hours with a value (a step per grid point with one)
    reserved: Busy  # every reserved GPU
    inference: Busy | None  # the GPUs while inference held them; None: inference held none


def _busy(columns: dict[tuple[str, str], list[float | None]]) -> Busy | None:
    values = [v for column in columns.values() for v in column if v is not None]
    if not values:
        return None
    gpus = sum(1 for column in columns.values() if any(v is not None for v in column))
    return Busy(gpus, sum(values) / len(values), quantile(values, 0.95))


def gpu_activity(activity: Activity) -> GpuActivity | None:
    """The reserved GPUs' activity over the window; None: no sample of the gauge in it. A GPU at one point is the
    highest of its series there (held by inference or not: at one instant there is one)."""
    points = activity.grid.points
    every: dict[tuple[str, str], list[float | None]] = {}
    held: dict[tuple[str, str], list[float | None]] = {}
    for (node, gpu, inference), column in activity.values.items():
        for target in (every, held) if inference == "true" else (every,):
            merged = target.setdefault((node, gpu), [None] * points)
            for index, value in enumerate(column):
                if value is not None:
                    current = merged[index]
                    merged[index] = value if current is None else max(current, value)
    reserved = _busy(every)
    if reserved is None:
        return None
    present = [i for i in range(points) if any(column[i] is not None for column in every.values())]
    times = activity.grid.times()
    hours = min(len(present), points - 1) * activity.grid.step / HOUR  # a point stands for a step; the window, at most
    return GpuActivity(times[present[0]], times[present[-1]], hours, reserved, _busy(held))
