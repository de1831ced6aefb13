"""The eviction loop with scripted apiserver answers and a fake clock (no waiting).

The answers are the apiserver's own bodies (tests/fixtures/pool/eviction-*.json); the loop against
the fake Kubernetes API over HTTP is in tests/ops/pool/test_pool.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from webhook.ops.pool.eviction import EVICTED, FAILED, GONE, REFUSED, SKIPPED, evict_pods, eviction_body
from webhook.ops.reservation import PoolPod

FIXTURES = Path(__file__).parents[2] / "fixtures" / "pool"


def answer(name: str) -> tuple[int, Mapping[str, Any]]:
    body = json.loads((FIXTURES / name).read_text())
    return int(body["code"]), body


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def pod(name: str, **kw: Any) -> PoolPod:
    return PoolPod("research", name, "n1", "Job/" + name, 1, "training", False, **kw)


def scripted(script: dict[str, list[tuple[int, Mapping[str, Any]]]], calls: list[str]) -> Any:
    def evict(p: PoolPod) -> tuple[int, Mapping[str, Any]]:
        calls.append(p.name)
        answers = script[p.name]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    return evict


def test_refused_by_a_budget_then_allowed() -> None:
    clock, calls = Clock(), []
    refused, ok = answer("eviction-429-pdb.json"), answer("eviction-201.json")
    evict = scripted({"a": [refused, refused, ok], "b": [ok]}, calls)
    results = evict_pods([pod("a"), pod("b")], evict, timeout=60, clock=clock, sleep=clock.sleep)
    assert [(r.pod.name, r.outcome, r.attempts) for r in results] == [("a", EVICTED, 3), ("b", EVICTED, 1)]
    assert calls == ["a", "b", "a", "a"]
    assert clock.sleeps == [1.0, 2.0]  # exponential backoff


def test_still_refused_at_the_deadline_is_reported_never_forced() -> None:
    clock, calls = Clock(), []
    evict = scripted({"a": [answer("eviction-429-pdb.json")]}, calls)
    [result] = evict_pods([pod("a")], evict, timeout=10, clock=clock, sleep=clock.sleep)
    assert result.outcome == REFUSED and not result.done
    assert result.message == (
        "Cannot evict pod as it would violate the pod's disruption budget. "
        "(The disruption budget train-pdb needs 2 healthy pods and has 2 currently)"
    )
    assert clock.sleeps == [1.0, 2.0, 4.0, 3.0]  # the last wait ends at the deadline
    assert len(calls) == 5


def test_retry_after_from_the_apiserver_is_honoured() -> None:
    clock, calls = Clock(), []
    evict = scripted({"a": [answer("eviction-429-pdb-processing.json"), answer("eviction-201.json")]}, calls)
    [result] = evict_pods([pod("a")], evict, timeout=60, clock=clock, sleep=clock.sleep)
    assert result.outcome == EVICTED
    assert clock.sleeps == [10.0]


def test_gone_skipped_and_failed() -> None:
    clock, calls = Clock(), []
    evict = scripted({"gone": [answer("eviction-404.json")], "two-pdbs": [answer("eviction-500-two-pdbs.json")]}, calls)
    pods = [
        pod("gone"),
        pod("ds", daemonset=True),
        pod("static", mirror=True),
        pod("two-pdbs"),
    ]
    results = evict_pods(pods, evict, timeout=0, clock=clock, sleep=clock.sleep)
    assert [(r.pod.name, r.outcome) for r in results] == [
        ("gone", GONE),
        ("ds", SKIPPED),
        ("static", SKIPPED),
        ("two-pdbs", FAILED),
    ]
    assert results[3].message == (
        "HTTP 500: This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    )
    assert calls == ["gone", "two-pdbs"]  # DaemonSet and mirror pods are never posted
    assert clock.sleeps == []


def test_eviction_body_is_policy_v1() -> None:
    assert eviction_body(pod("a")) == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "a", "namespace": "research"},
    }
    assert eviction_body(pod("a"), dry_run=True)["deleteOptions"] == {"dryRun": ["All"]}
