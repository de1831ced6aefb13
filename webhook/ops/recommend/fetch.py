"""Reading the demand gauges' history from Prometheus's HTTP API, for ``pool recommend`` (issue 43).

One ``GET /api/v1/query_range`` per gauge of ``ops/lending/demand.GAUGES``, ``max by (pool, nodes)`` (only the
Lease holder counts; the other replicas export zeros), on the grid ``ops/recommend/history.Grid`` says; the answers
go to ``history.from_matrix``. The transport and its errors are ``ops/prometheus.py``'s.

``read_activity``: one more, ``max by (node, gpu, inference)`` of the reserved GPUs' activity gauge the background
audit exports (``ops/gpus/judge.ACTIVITY_GAUGE``), on the same grid, read apart: the recommendation never depends
on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from urllib3 import PoolManager

from webhook.ops.gpus.judge import ACTIVITY_GAUGE
from webhook.ops.lending.demand import GAUGES
from webhook.ops.prometheus import PrometheusError, Server, connect, get
from webhook.ops.recommend.history import Activity, Grid, History, activity_from_matrix, from_matrix

MAX_POINTS = 11_000  # Prometheus refuses a query_range of more points per series than this


def step_for(window: float) -> float:
    """The grid step: a minute, or coarser (whole minutes) to stay within Prometheus's points per series."""
    step = 60.0
    while window / step + 1 > MAX_POINTS - 1000:
        step += 60.0
    return step


def query(figure: str) -> str:
    return f"max by (pool, nodes) ({GAUGES[figure]})"


ACTIVITY_QUERY = f"max by (node, gpu, inference) ({ACTIVITY_GAUGE})"


def _matrix(pool: PoolManager, server: Server, promql: str, grid: Grid) -> list[Mapping[str, Any]]:
    data = get(
        pool,
        server,
        "/api/v1/query_range",
        {"query": promql, "start": f"{grid.start:.3f}", "end": f"{grid.end:.3f}", "step": f"{grid.step:g}"},
    )
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PrometheusError(f"{server.url}: query_range answered no matrix for {promql}")
    return list(data["result"])


def read_history(server: Server, grid: Grid) -> History:
    """The demand gauges on ``grid``, one query each."""
    pool = connect(server)
    answers: dict[str, list[Mapping[str, Any]]] = {}
    try:
        for figure in GAUGES:
            answers[figure] = _matrix(pool, server, query(figure), grid)
    finally:
        pool.clear()
    return from_matrix(answers, grid)


def read_activity(server: Server, grid: Grid) -> Activity:
    """The reserved GPUs' activity gauge on ``grid``, one query."""
    pool = connect(server)
    try:
        return activity_from_matrix(_matrix(pool, server, ACTIVITY_QUERY, grid), grid)
    finally:
        pool.clear()
