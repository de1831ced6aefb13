"""The demand gauges' history, on one time grid, whatever it was read from (``pool recommend``, issue 43). Pure.

Two sources, one shape:

- Prometheus's HTTP API (``ops/prometheus.py`` reads it): one ``query_range`` per gauge,
  ``max by (pool, nodes) (GAUGE)``, on the grid's start, end and step; Prometheus has already looked each point
  up (the last sample within its lookback, 5 minutes by default) and taken the maximum over the replicas (only
  the Lease holder counts; the others export zeros). ``from_matrix`` puts the answer on the grid.
- a file of exported samples (``--from-file``): the OpenMetrics text ``promtool tsdb create-blocks-from
  openmetrics`` backfills (every sample with its timestamp, in seconds), which is also what the e2e test loads
  into a real Prometheus. ``from_samples`` does what Prometheus would: per grid point, the last sample of each
  series within ``LOOKBACK``, then the maximum per (pool, nodes).

A grid point with no value is ``None``: a gap, which ``ops/recommend/sizing.py`` refuses to guess across.

Beside the demand, the reserved GPUs' activity as the background audit exports it (``Activity``: the gauge
``ops/gpus/judge.ACTIVITY_GAUGE``, per node, GPU and whether inference held it; ``serve --audit-gpu-metrics``), on
the same grid, from the same sources (``max by (node, gpu, inference)``), saved in the same file; optional: the
demand's history never depends on it.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.ops.gpus.judge import ACTIVITY_GAUGE
from webhook.ops.lending.demand import GAUGES

LOOKBACK = 300.0  # seconds: Prometheus's default query.lookback-delta, so both sources agree
Key = tuple[str, str]  # (pool, nodes)
ActivityKey = tuple[str, str, str]  # (node, gpu, inference: "true" or "false")
ACTIVITY_LABELS = ("node", "gpu", "inference")


class HistoryFormatError(ValueError):
    """Samples that cannot be read (a line of the file, an answer of Prometheus): where, and what."""


@dataclass(frozen=True)
class Grid:
    """Evenly spaced instants: ``start``, ``start + step``, ... ``start + (points - 1) * step`` (Unix seconds)."""

    start: float
    step: float
    points: int

    @property
    def end(self) -> float:
        return self.start + (self.points - 1) * self.step

    def times(self) -> list[float]:
        return [self.start + i * self.step for i in range(self.points)]

    @classmethod
    def ending(cls, end: float, window: float, step: float) -> Grid:
        """The grid of ``window`` seconds up to ``end``, aligned on ``step`` (as Prometheus's own steps are not:
        aligning makes two reads of the same history give the same points)."""
        last = math.floor(end / step) * step
        points = int(window // step) + 1
        return cls(last - (points - 1) * step, step, points)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float


@dataclass
class History:
    """Each gauge (by its field in ``GAUGES``) per (pool, nodes), one value or None per grid point."""

    grid: Grid
    values: dict[Key, dict[str, list[float | None]]] = field(default_factory=dict)

    def series(self, key: Key, figure: str) -> list[float | None]:
        return self.values.get(key, {}).get(figure) or [None] * self.grid.points


@dataclass
class Activity:
    """The reserved GPUs' activity gauge (``ACTIVITY_GAUGE``, % gfx activity, each value the mean over the policy's
    window at one audit) per (node, gpu, inference), one value or None per grid point."""

    grid: Grid
    values: dict[ActivityKey, list[float | None]] = field(default_factory=dict)


# -- OpenMetrics text ------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+(\S+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _labels(text: str, where: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    at = 0
    while at < len(text):
        match = _LABEL.match(text, at)
        if match is None:
            raise HistoryFormatError(f"{where}: cannot read the labels {{{text}}}")
        labels[match.group(1)] = re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], match.group(2))
        at = match.end()
    return labels


def parse_openmetrics(text: str, source: str = "the file") -> list[Sample]:
    """The samples of an OpenMetrics text (``# TYPE``/``# HELP``/``# EOF`` and other comments skipped); a sample
    without a timestamp is refused: history needs to know when."""
    found: list[Sample] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}, line {number}"
        match = _SAMPLE.match(line)
        if match is None:
            raise HistoryFormatError(f"{where}: not an OpenMetrics sample: {line[:80]!r}")
        name, _, label_text, value, timestamp = match.groups()
        if timestamp is None:
            raise HistoryFormatError(f"{where}: {name} has no timestamp (history needs one per sample)")
        try:
            found.append(Sample(name, _labels(label_text or "", where), float(value), float(timestamp)))
        except ValueError as err:
            raise HistoryFormatError(f"{where}: {err}") from err
    return found


# -- onto the grid ---------------------------------------------------------------------------------------------


def _key(labels: Mapping[str, str]) -> Key:
    return (labels.get("pool", ""), labels.get("nodes", ""))


def _put(history: History, key: Key, figure: str, index: int, value: float) -> None:
    column = history.values.setdefault(key, {}).setdefault(figure, [None] * history.grid.points)
    current = column[index]
    column[index] = value if current is None else max(current, value)


Series = dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]


def _series(samples: Iterable[Sample], names: Iterable[str]) -> Series:
    wanted = set(names)
    per_series: Series = {}
    for sample in samples:
        if sample.name in wanted:
            per_series.setdefault((sample.name, tuple(sorted(sample.labels.items()))), []).append(
                (sample.timestamp, sample.value)
            )
    return per_series


def _looked_up(points: list[tuple[float, float]], grid: Grid, lookback: float) -> Iterator[tuple[int, float]]:
    """One series' value at each grid point, as Prometheus looks it up (the last sample at or before the point and
    at most ``lookback`` older; a NaN is no value): (index, value) where there is one."""
    points.sort()
    stamps = [t for t, _ in points]
    for index, at in enumerate(grid.times()):
        before = bisect_right(stamps, at) - 1
        if before < 0 or at - stamps[before] > lookback or math.isnan(points[before][1]):
            continue
        yield index, points[before][1]


def from_samples(samples: Iterable[Sample], grid: Grid, lookback: float = LOOKBACK) -> History:
    """Each demand gauge's samples looked up as Prometheus does (per series, the last sample at or before each
    grid point and at most ``lookback`` older; a NaN is no value), then ``max by (pool, nodes)``."""
    figures = {name: figure for figure, name in GAUGES.items()}
    history = History(grid)
    for (name, labels), points in _series(samples, figures).items():
        for index, value in _looked_up(points, grid, lookback):
            _put(history, _key(dict(labels)), figures[name], index, value)
    return history


def _activity_key(labels: Mapping[str, str]) -> ActivityKey:
    return (labels.get("node", ""), labels.get("gpu", ""), labels.get("inference", ""))


def _put_activity(activity: Activity, key: ActivityKey, index: int, value: float) -> None:
    column = activity.values.setdefault(key, [None] * activity.grid.points)
    current = column[index]
    column[index] = value if current is None else max(current, value)


def activity_from_samples(samples: Iterable[Sample], grid: Grid, lookback: float = LOOKBACK) -> Activity:
    """The activity gauge's samples looked up as ``from_samples`` does, then ``max by (node, gpu, inference)``
    (the replicas, and the labels a scrape adds)."""
    activity = Activity(grid)
    for (_, labels), points in _series(samples, [ACTIVITY_GAUGE]).items():
        for index, value in _looked_up(points, grid, lookback):
            _put_activity(activity, _activity_key(dict(labels)), index, value)
    return activity


def _on_grid(result: Mapping[str, Any], grid: Grid) -> Iterator[tuple[int, float]]:
    """One series of a ``query_range`` answer: (index, value) of each point with a value; a point off the grid's
    instants is a misread, refused."""
    for pair in result.get("values") or []:
        try:
            at, value = float(pair[0]), float(pair[1])
        except (TypeError, ValueError, IndexError) as err:
            raise HistoryFormatError(f"Prometheus answered a point that is not [time, value]: {pair!r}") from err
        index = round((at - grid.start) / grid.step)
        if not 0 <= index < grid.points or abs(grid.start + index * grid.step - at) > 1e-3:
            raise HistoryFormatError(f"Prometheus answered a point off the query's steps: {at}")
        if not math.isnan(value):
            yield index, value


def from_matrix(answers: Mapping[str, Sequence[Mapping[str, Any]]], grid: Grid) -> History:
    """Prometheus's ``query_range`` results (``data.result`` of a matrix) per figure of ``GAUGES``, on ``grid``:
    a point off the grid's instants is a misread, refused."""
    history = History(grid)
    for figure, results in answers.items():
        for result in results:
            labels = result.get("metric") or {}
            for index, value in _on_grid(result, grid):
                _put(history, _key(labels), figure, index, value)
    return history


def activity_from_matrix(results: Sequence[Mapping[str, Any]], grid: Grid) -> Activity:
    """The answer of ``max by (node, gpu, inference) (ACTIVITY_GAUGE)`` on ``grid``, as ``from_matrix``."""
    activity = Activity(grid)
    for result in results:
        labels = result.get("metric") or {}
        for index, value in _on_grid(result, grid):
            _put_activity(activity, _activity_key(labels), index, value)
    return activity


def to_openmetrics(history: History, activity: Activity | None = None) -> str:
    """The history as OpenMetrics text, one sample per grid point with a value (``pool recommend --save``): read
    back on the same grid (``from_samples``, ``activity_from_samples``) it is the same history, so a recommendation
    can be made again offline, or in CI. The activity gauge's family only when it has series (without them, the
    text is what it was before it existed)."""
    lines: list[str] = []
    times = history.grid.times()
    for figure, name in GAUGES.items():
        lines.append(f"# TYPE {name} gauge")
        for (pool, nodes), columns in sorted(history.values.items()):
            lines += _samples(f'{name}{{pool="{_escape(pool)}",nodes="{_escape(nodes)}"}}', times, columns.get(figure))
    if activity is not None and activity.values:
        lines.append(f"# TYPE {ACTIVITY_GAUGE} gauge")
        for key, column in sorted(activity.values.items()):
            labels = ",".join(f'{label}="{_escape(value)}"' for label, value in zip(ACTIVITY_LABELS, key, strict=True))
            lines += _samples(f"{ACTIVITY_GAUGE}{{{labels}}}", activity.grid.times(), column)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _samples(series: str, times: Sequence[float], column: Sequence[float | None] | None) -> list[str]:
    lines = []
    before: float | None = None
    for at, value in zip(times, column or [], strict=False):
        if value is not None:
            lines.append(f"{series} {value:.10g} {at:.3f}")
        elif before is not None:
            # A NaN where the values stop: read back, the last value would otherwise fill the lookback.
            lines.append(f"{series} NaN {at:.3f}")
        before = value
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
