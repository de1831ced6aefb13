"""Reading the demand history from Prometheus's HTTP API (webhook/ops/recommend/fetch.py over webhook/ops/prometheus.py), against a local HTTP server
answering as Prometheus does (the real one: tests/e2e/test_e2e_recommend.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_stub import Prometheus, serving

from webhook.ops.lending.demand import GAUGES
from webhook.ops.prometheus import PrometheusError, Server
from webhook.ops.recommend.fetch import MAX_POINTS, query, read_history, step_for
from webhook.ops.recommend.history import Grid


@pytest.fixture
def server() -> Iterator[str]:
    with serving() as url:
        yield url


def matrix(values: list[list[Any]]) -> dict[str, Any]:
    result = [{"metric": {"pool": "reserved", "nodes": "whole"}, "values": values}]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def test_one_range_query_per_gauge_with_the_bearer_token(server: str) -> None:
    grid = Grid(6000.0, 60.0, 3)
    Prometheus.answers = {"*": (200, matrix([[6000, "1"], [6060, "2"], [6120, "3"]]))}
    history = read_history(Server(server, token="s3cret"), grid)
    assert [fields["query"] for _, fields, _ in Prometheus.seen] == [query(f) for f in GAUGES]
    assert {(path, fields["start"], fields["end"], fields["step"], auth) for path, fields, auth in Prometheus.seen} == {
        ("/api/v1/query_range", "6000.000", "6120.000", "60", "Bearer s3cret")
    }
    assert history.series(("reserved", "whole"), "inference") == [1, 2, 3]


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (401, "Unauthorized", "HTTP 401: give a bearer token (--token or --token-file)"),
        (
            400,
            {"status": "error", "errorType": "bad_data", "error": "exceeded maximum resolution"},
            "HTTP 400: exceeded",
        ),
        (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, "answered no matrix"),
        (502, "<html>bad gateway</html>", "HTTP 502: <html>bad gateway</html>"),
    ],
)
def test_refusals_and_odd_answers_are_one_clear_error(server: str, status: int, body: Any, message: str) -> None:
    Prometheus.answers = {"*": (status, body)}
    with pytest.raises(PrometheusError) as raised:
        read_history(Server(server), Grid(0.0, 60.0, 2))
    assert message in str(raised.value)


def test_an_unreachable_server_says_so() -> None:
    with pytest.raises(PrometheusError, match=r"cannot reach Prometheus at http://127\.0\.0\.1:9"):
        read_history(Server("http://127.0.0.1:9"), Grid(0.0, 60.0, 2))


def test_the_step_keeps_a_window_within_prometheus_points_per_series() -> None:
    assert step_for(86400.0) == 60.0
    for window in (7 * 86400.0, 14 * 86400.0, 90 * 86400.0):
        step = step_for(window)
        assert step % 60 == 0 and window / step + 1 < MAX_POINTS and window / (step - 60) + 1 >= MAX_POINTS - 1000
