"""The benchmark's load generator (bench/loadgen.py) against a real ``serve`` on loopback.

The benchmark's figures are only as honest as its client: these tests check that it sends what it
says (every request answered and counted by the server), checks every reply (a wrong expectation
is reported as an error), keeps the offered rate in open loop, and survives the server closing a
connection.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PKI, Server, ServerFactory, make_pki

from bench import loadgen, policies, reviews, servers

REVIEWS = reviews.REVIEWS_DIR


def _reviews_total(server: Server) -> int:
    return servers.reviews_total(server.metrics())


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path / "certs")


@pytest.fixture
def server(running_server: ServerFactory, pki: PKI, tmp_path: Path) -> Server:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policies.policy_text(1))
    return running_server(cert_dir=pki.dir, ca_file=pki.ca_file, policy=policy)


def _job(server: Server, **fields: object) -> loadgen.Job:
    spec: dict[str, object] = {
        "port": server.port,
        "ca_file": str(server.ca_file),
        "mode": "closed",
        "connections": 4,
        "duration": 30.0,
        "reviews": [
            (str(REVIEWS / "inference-small.json"), True),
            (str(REVIEWS / "training-denied.json"), False),
        ],
    }
    spec.update(fields)
    return loadgen.Job(**spec)  # type: ignore[arg-type]


def test_closed_loop_sends_exactly_the_requests_and_the_server_answers_each(server: Server) -> None:
    before = _reviews_total(server)
    result = loadgen.run(_job(server, max_requests=300))
    assert result["errors"] == 0, result["error_samples"]
    assert result["requests"] == 300
    assert result["latency_from_send"]["count"] == 300
    assert result["latency_from_schedule"] == {}  # closed loop has no schedule
    assert _reviews_total(server) - before == 300
    assert result["connections_replaced"] == 0


def test_a_reply_that_contradicts_the_expectation_is_an_error(server: Server) -> None:
    # training-denied is denied: expecting it allowed must be reported for every such request.
    job = _job(server, max_requests=100, reviews=[(str(REVIEWS / "training-denied.json"), True)])
    result = loadgen.run(job)
    assert result["requests"] == 100
    assert result["errors"] == 100
    assert "allowed is not True" in result["error_samples"][0]


def test_open_loop_keeps_the_offered_rate_and_measures_from_the_schedule(server: Server) -> None:
    result = loadgen.run(_job(server, mode="open", rate=400.0, duration=1.5, connections=8))
    assert result["errors"] == 0, result["error_samples"]
    assert result["requests"] == 600
    assert 300 <= result["throughput"] <= 440
    from_schedule, from_send = result["latency_from_schedule"], result["latency_from_send"]
    assert from_schedule["count"] == from_send["count"] == 600
    # A request is never sent before its scheduled time.
    assert from_schedule["p50"] >= from_send["p50"]
    assert from_schedule["max"] >= from_send["max"]
    # The hypervisor's steal counters read around the timed window (bench/run.py reports the difference).
    before, after = result["steal_readings"]
    if before is not None:  # a machine with /proc/stat's steal column
        assert set(before) == set(after) and "cpu" in before
        assert all(after[cpu] >= before[cpu] for cpu in before)


def test_idle_connections_the_server_closes_are_replaced_without_errors(
    running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    # Keep-alive of 1 s: the connections the open loop leaves idle (it reuses the most recently used
    # one first) are closed by the server during the run, and must be replaced, not counted as failures.
    policy = tmp_path / "policy.yaml"
    policy.write_text(policies.policy_text(1))
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, policy=policy, args=["--keep-alive-seconds", "1"])
    before = _reviews_total(server)
    result = loadgen.run(_job(server, mode="open", rate=20.0, duration=3.0, connections=4))
    assert result["errors"] == 0, result["error_samples"]
    assert result["requests"] == 60
    assert result["connections_replaced"] >= 1
    assert _reviews_total(server) - before == 60
