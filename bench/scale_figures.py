"""The pure parts of ``make bench-scale`` (bench/scale.py): Prometheus text parsed and differenced, the apiserver's
traffic per verb and resource, a histogram's quantiles, ``/proc`` read, the least-squares extrapolation and the
section of docs/benchmarks.md written in place. No network, no processes: tests/bench/test_bench_scale.py."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Labels = frozenset[tuple[str, str]]
Samples = dict[tuple[str, Labels], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Size:
    nodes: int
    pods: int

    def __str__(self) -> str:
        return f"{self.nodes} nodes/{self.pods} pods"


def parse_sizes(text: str) -> list[Size]:
    """``NODES:PODS,NODES:PODS,...``: growing (the cluster is grown, never shrunk), each at least one node."""
    sizes: list[Size] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        nodes, sep, pods = part.partition(":")
        if not sep or not nodes.strip().isdigit() or not pods.strip().isdigit():
            raise ValueError(f"{part!r} is not NODES:PODS")
        size = Size(int(nodes), int(pods))
        if size.nodes < 2:
            raise ValueError(f"{part!r}: at least two nodes (the reclaim uses two)")
        if sizes and (size.nodes < sizes[-1].nodes or size.pods < sizes[-1].pods):
            raise ValueError(f"{part!r} is smaller than the size before it")
        sizes.append(size)
    if not sizes:
        raise ValueError("no size")
    return sizes


def parse_prometheus(text: str, wanted: Iterable[str] | None = None) -> Samples:
    """The samples of a Prometheus text exposition: ``(name, labels) -> value``. ``wanted``: the metric names to
    keep (exact names; a histogram's are ``NAME_bucket``, ``NAME_count``, ``NAME_sum``), every sample when None.
    Comments, malformed lines and values that are not numbers are skipped."""
    keep = set(wanted) if wanted is not None else None
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        name, label_text, value = match.groups()
        if keep is not None and name not in keep:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        labels: Labels = frozenset(
            (key, raw.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
            for key, raw in _LABEL.findall(label_text or "")
        )
        out[name, labels] = number
    return out


def difference(before: Samples, after: Samples) -> Samples:
    """``after - before`` per sample, for counters: a sample new in ``after`` counts from 0; one smaller than it
    was (the process restarted) counts from 0 again (its value in ``after``)."""
    out: Samples = {}
    for key, value in after.items():
        old = before.get(key, 0.0)
        out[key] = value - old if value >= old else value
    return out


def total(samples: Samples, name: str, group_by: str | None = None, **match: str) -> dict[str, float]:
    """The sum of the samples of ``name`` whose labels include ``match``, per value of the label ``group_by``
    (one key ``""`` without it)."""
    out: dict[str, float] = defaultdict(float)
    for (metric, labels), value in samples.items():
        if metric != name:
            continue
        found = dict(labels)
        if any(found.get(k) != v for k, v in match.items()):
            continue
        out[found.get(group_by, "") if group_by else ""] += value
    return dict(out)


# The apiserver's metrics that bench-scale reads (v1.36).
REQUESTS = "apiserver_request_total"
RESPONSE_BYTES = "apiserver_response_sizes_sum"
RESPONSE_COUNT = "apiserver_response_sizes_count"
WATCH_EVENTS = "apiserver_watch_events_total"
WATCH_EVENT_BYTES = "apiserver_watch_events_sizes_sum"
LONGRUNNING = "apiserver_longrunning_requests"
APISERVER_METRICS = (REQUESTS, RESPONSE_BYTES, RESPONSE_COUNT, WATCH_EVENTS, WATCH_EVENT_BYTES, LONGRUNNING)


def _resource_key(labels: Mapping[str, str]) -> str:
    """``resource`` (``resource/subresource`` when there is one); the watch events' metrics name the ``kind`` in
    older versions, the ``resource`` in newer ones."""
    resource = labels.get("resource") or labels.get("kind") or ""
    sub = labels.get("subresource") or ""
    return f"{resource}/{sub}" if sub else resource


@dataclass(frozen=True)
class Flow:
    """One verb on one resource over a window: requests and bytes per minute (WATCH: the events and their bytes
    sent to watchers)."""

    requests: float = 0.0
    bytes: float = 0.0
    events: float = 0.0

    def __add__(self, other: Flow) -> Flow:
        return Flow(self.requests + other.requests, self.bytes + other.bytes, self.events + other.events)

    def minus(self, other: Flow) -> Flow:
        """What is left after ``other`` (a background rate), never below 0."""
        return Flow(
            max(0.0, self.requests - other.requests),
            max(0.0, self.bytes - other.bytes),
            max(0.0, self.events - other.events),
        )

    def scaled(self, factor: float) -> Flow:
        return Flow(self.requests * factor, self.bytes * factor, self.events * factor)


Traffic = dict[str, dict[str, Flow]]  # verb -> resource -> per minute


def traffic(diff: Samples, seconds: float) -> Traffic:
    """The apiserver's traffic over a window of ``seconds``, per minute, from the difference of two scrapes: every
    verb's requests by resource (``apiserver_request_total``), the response bytes where the apiserver measures them
    (``apiserver_response_sizes``: GET and LIST), and for WATCH the events and bytes it sent to watchers
    (``apiserver_watch_events_total`` and ``_sizes_sum``: a watch's response is never measured as a whole)."""
    if seconds <= 0:
        raise ValueError("a window of no time")
    per_minute = 60.0 / seconds
    requests: dict[tuple[str, str], float] = defaultdict(float)
    sizes: dict[tuple[str, str], float] = defaultdict(float)
    events: dict[str, float] = defaultdict(float)
    event_bytes: dict[str, float] = defaultdict(float)
    for (metric, label_set), value in diff.items():
        labels = dict(label_set)
        resource = _resource_key(labels)
        if metric == REQUESTS:
            requests[labels.get("verb", ""), resource] += value
        elif metric == RESPONSE_BYTES:
            sizes[labels.get("verb", ""), resource] += value
        elif metric == WATCH_EVENTS:
            events[resource] += value
        elif metric == WATCH_EVENT_BYTES:
            event_bytes[resource] += value
    out: Traffic = defaultdict(dict)
    for verb, resource in set(requests) | set(sizes):
        out[verb][resource] = Flow(requests[verb, resource], sizes[verb, resource]).scaled(per_minute)
    for resource in set(events) | set(event_bytes):
        seen = out["WATCH"].get(resource, Flow())
        out["WATCH"][resource] = Flow(
            seen.requests, seen.bytes + event_bytes[resource] * per_minute, events[resource] * per_minute
        )
    return {verb: dict(by_resource) for verb, by_resource in out.items()}


def minus(window: Traffic, background: Traffic) -> Traffic:
    """``window`` less a ``background`` rate (both per minute), per verb and resource, never below 0."""
    out: Traffic = {}
    for verb, by_resource in window.items():
        out[verb] = {r: flow.minus(background.get(verb, {}).get(r, Flow())) for r, flow in by_resource.items()}
    return out


def verb_total(flows: Traffic, verb: str) -> Flow:
    result = Flow()
    for flow in flows.get(verb, {}).values():
        result = result + flow
    return result


def all_bytes(flows: Traffic) -> float:
    """Every byte the apiserver sent over the window: responses measured (GET, LIST) and watch events."""
    return sum(flow.bytes for by_resource in flows.values() for flow in by_resource.values())


def open_watches(samples: Samples) -> dict[str, float]:
    """The watches open at a scrape, by resource (``apiserver_longrunning_requests{verb="WATCH"}``)."""
    out: dict[str, float] = defaultdict(float)
    for (metric, label_set), value in samples.items():
        labels = dict(label_set)
        if metric == LONGRUNNING and labels.get("verb") == "WATCH":
            out[_resource_key(labels)] += value
    return {k: v for k, v in out.items() if v}


# --- histograms ------------------------------------------------------------------------------------------------


def histogram(diff: Samples, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """The cumulative buckets ``[(le, count)]`` (sorted, +Inf last), the count and the sum of the histogram
    ``name`` (its ``_bucket``, ``_count``, ``_sum`` samples), summed over any other labels."""
    buckets: dict[float, float] = defaultdict(float)
    count = total_sum = 0.0
    for (metric, label_set), value in diff.items():
        if metric == f"{name}_bucket":
            buckets[float(dict(label_set).get("le", "+Inf"))] += value
        elif metric == f"{name}_count":
            count += value
        elif metric == f"{name}_sum":
            total_sum += value
    return sorted(buckets.items()), count, total_sum


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's ``histogram_quantile``: linear within the bucket the rank falls in (from 0 for the first
    bucket); the highest finite bound when the rank falls in +Inf. None without observations."""
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    observed = buckets[-1][1]
    if observed <= 0:
        return None
    rank = q * observed
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


# --- /proc -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of CPU of a process (``utime + stime``) and of its children it has waited for
    (``cutime + cstime``), from ``/proc/PID/stat``."""

    own: float
    children: float


def parse_stat(text: str, ticks_per_second: float) -> CpuTimes:
    # The command (field 2) is in parentheses and may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is the state (field 3): utime, stime, cutime, cstime are fields 14-17.
    utime, stime, cutime, cstime = (float(fields[i]) for i in (11, 12, 13, 14))
    return CpuTimes((utime + stime) / ticks_per_second, (cutime + cstime) / ticks_per_second)


def parse_status_kib(text: str, field: str) -> float | None:
    """A ``kB`` field of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``) in KiB."""
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return float(line.split()[1])
    return None


# --- the slope ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """``y = intercept + slope * x`` by ordinary least squares, and its r²."""

    slope: float
    intercept: float
    r2: float | None

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def least_squares(xs: list[float], ys: list[float]) -> Fit:
    if len(xs) != len(ys) or not xs:
        raise ValueError("need as many x as y, at least one")
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return Fit(0.0, mean_y, None)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    syy = sum((y - mean_y) ** 2 for y in ys)
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return Fit(slope, intercept, None if syy == 0 else 1.0 - residual / syy)


# --- docs/benchmarks.md: bench/sections.replace_section ----------------------------------------------------------
