"""Where the exporter's series come from: a file (offline, CI) or Prometheus's HTTP API (``audit --gpu-metrics``,
``serve``'s background audit). What cannot be read is ``GpuSourceError``: one line, and the audit goes on.

- A file (``FILE``, ``FILE.gz``): the text exposition of the exporter's ``/metrics`` (``curl
  http://NODE:5000/metrics``), or of several scrapes with timestamps (the history a sustained use needs). Lines
  without a timestamp are taken as read now (the file's modification time).
- Prometheus: one ``query_range`` of every field read (``series.SELECTOR``, both prefixes) over the window and the
  staleness allowance, ending now, with ``pool recommend``'s credentials (``ops/prometheus.py``).
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from webhook.ops.gpus.exposition import ExpositionError, Sample, parse
from webhook.ops.gpus.judge import Thresholds
from webhook.ops.gpus.series import SELECTOR, Readings, collect
from webhook.ops.prometheus import PrometheusError, Server, connect, get


class GpuSourceError(Exception):
    """The exporter's series could not be read: why, in one line."""


Reader = Callable[[float, Thresholds], Readings]  # (now, the policy's thresholds) -> the exporter's series


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def reader(
    given: str,
    token: str | None = None,
    token_file: str | None = None,
    certificate_authority: str | None = None,
    insecure_skip_tls_verify: bool = False,
) -> Reader:
    """Where ``--gpu-metrics URL|FILE`` reads the exporter's series (``audit``, ``pool status``), with
    ``pool recommend``'s credentials for a URL. The token file is read at each read (a ServiceAccount's token is
    rotated); what cannot be read, that file included, is a ``GpuSourceError`` then."""
    if not is_url(given):
        return lambda now, limits: read_file(Path(given))

    def read(now: float, limits: Thresholds) -> Readings:
        bearer = token
        if token_file:
            try:
                bearer = Path(token_file).read_text().strip()
            except OSError as err:
                raise GpuSourceError(f"GPU metrics: cannot read the token file: {err}") from err
        server = Server(given, bearer, certificate_authority, insecure_skip_tls_verify)
        return read_prometheus(server, now, limits)

    return read


def read_file(path: Path) -> Readings:
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode("utf-8")
        now = path.stat().st_mtime
        readings = collect(parse(text, now))
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as err:
        raise GpuSourceError(f"GPU metrics file {path}: {err}") from err
    except ExpositionError as err:
        raise GpuSourceError(f"GPU metrics file {path}: not the exporter's text format: {err}") from err
    if not readings.gpus:
        raise GpuSourceError(f"GPU metrics file {path}: no series of AMD's device metrics exporter (gpu_*, amd_gpu_*)")
    return readings


def step_for(limits: Thresholds) -> float:
    """A point every 15 s, coarser for long windows (60 points over the window), but always at most half the gap
    allowed (a gap between two points is never one the judgement refuses), and at least a second."""
    wanted = max(15.0, math.ceil(limits.window_seconds / 60.0))
    return max(1.0, min(wanted, limits.max_gap_seconds / 2))


def read_prometheus(server: Server, now: float, limits: Thresholds) -> Readings:
    step = step_for(limits)
    start = now - limits.window_seconds - limits.stale_seconds - step
    try:
        result = query_range(server, SELECTOR, start, now, step)
        readings = collect(_samples(result), end=now)
    except PrometheusError as err:
        raise GpuSourceError(f"GPU metrics: {err}") from err
    except (TypeError, ValueError, KeyError) as err:
        raise GpuSourceError(f"GPU metrics: {server.url}: an answer not in the shape of a matrix: {err}") from err
    if not readings.gpus:
        raise GpuSourceError(
            f"GPU metrics: {server.url} has no series of AMD's device metrics exporter (gpu_*, amd_gpu_*) in the "
            "last window: is the exporter scraped?"
        )
    return readings


def query_range(server: Server, query: str, start: float, end: float, step: float) -> list[Mapping[str, Any]]:
    """One ``query_range``: its matrix's series (``metric``, ``values``)."""
    pool = connect(server)
    try:
        fields = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = get(pool, server, "/api/v1/query_range", fields)
    finally:
        pool.clear()
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PrometheusError(f"{server.url}: query_range answered no matrix for {query}")
    return list(data["result"])


def _samples(result: list[Mapping[str, Any]]) -> Iterator[Sample]:
    for series in result:
        labels = {str(k): str(v) for k, v in dict(series["metric"]).items()}
        name = labels.pop("__name__", "")
        for at, value in series["values"]:
            yield Sample(name, labels, float(value), float(at))
