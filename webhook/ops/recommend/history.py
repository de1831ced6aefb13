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
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.ops.lending.demand import GAUGES

LOOKBACK = 300.0  # seconds: Prometheus's default query.lookback-delta, so both sources agree
Key = tuple[str, str]  # (pool, nodes)


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


def from_samples(samples: Iterable[Sample], grid: Grid, lookback: float = LOOKBACK) -> History:
    """Each demand gauge's samples looked up as Prometheus does (per series, the last sample at or before each
    grid point and at most ``lookback`` older; a NaN is no value), then ``max by (pool, nodes)``."""
    figures = {name: figure for figure, name in GAUGES.items()}
    per_series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for sample in samples:
        if sample.name in figures:
            per_series.setdefault((sample.name, tuple(sorted(sample.labels.items()))), []).append(
                (sample.timestamp, sample.value)
            )
    history = History(grid)
    times = grid.times()
    for (name, labels), points in per_series.items():
        points.sort()
        stamps = [t for t, _ in points]
        for index, at in enumerate(times):
            before = bisect_right(stamps, at) - 1
            if before < 0 or at - stamps[before] > lookback or math.isnan(points[before][1]):
                continue
            _put(history, _key(dict(labels)), figures[name], index, points[before][1])
    return history


def from_matrix(answers: Mapping[str, Sequence[Mapping[str, Any]]], grid: Grid) -> History:
    """Prometheus's ``query_range`` results (``data.result`` of a matrix) per figure of ``GAUGES``, on ``grid``:
    a point off the grid's instants is a misread, refused."""
    history = History(grid)
    for figure, results in answers.items():
        for result in results:
            labels = result.get("metric") or {}
            for pair in result.get("values") or []:
                try:
                    at, value = float(pair[0]), float(pair[1])
                except (TypeError, ValueError, IndexError) as err:
                    raise HistoryFormatError(
                        f"Prometheus answered a point that is not [time, value]: {pair!r}"
                    ) from err
                index = round((at - grid.start) / grid.step)
                if not 0 <= index < grid.points or abs(grid.start + index * grid.step - at) > 1e-3:
                    raise HistoryFormatError(f"Prometheus answered a point off the query's steps: {at}")
                if not math.isnan(value):
                    _put(history, _key(labels), figure, index, value)
    return history


def to_openmetrics(history: History) -> str:
    """The history as OpenMetrics text, one sample per grid point with a value (``pool recommend --save``): read
    back on the same grid (``from_samples``) it is the same history, so a recommendation can be made again offline,
    or in CI."""
    lines: list[str] = []
    times = history.grid.times()
    for figure, name in GAUGES.items():
        lines.append(f"# TYPE {name} gauge")
        for (pool, nodes), columns in sorted(history.values.items()):
            series = f'{name}{{pool="{_escape(pool)}",nodes="{_escape(nodes)}"}}'
            before: float | None = None
            for at, value in zip(times, columns.get(figure) or [], strict=False):
                if value is not None:
                    lines.append(f"{series} {value:.10g} {at:.3f}")
                elif before is not None:
                    # A NaN where the values stop: read back, the last value would otherwise fill the lookback.
                    lines.append(f"{series} NaN {at:.3f}")
                before = value
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
