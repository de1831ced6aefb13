"""Evicting pods through the Eviction API, as ``kubectl drain`` does, never by force.

A policy/v1 ``Eviction`` POSTed to ``pods/{name}/eviction`` is a DELETE that the apiserver makes
only when the pod's PodDisruptionBudget allows it. Its answers (kube-apiserver
``pkg/registry/core/pod/storage/eviction.go``):

- 201 (a ``Status`` with ``status: Success``; the docs say 200): the pod is being deleted;
- 404: the pod is already gone, which is what was wanted;
- 429 ``TooManyRequests`` "Cannot evict pod as it would violate the pod's disruption budget.":
  the budget allows no disruption now; try again later (``details.retryAfterSeconds`` when the
  apiserver suggests a delay). The same code comes from API Priority and Fairness throttling,
  which also means "later";
- 500 "This pod has more than one PodDisruptionBudget...", 403 and the rest: not retried.

Refused pods are retried together with exponential backoff until the deadline; what is still
refused then is reported, never deleted another way. DaemonSet pods (their controller would
recreate them on the same node) and mirror pods (the kubelet's static pods, which the API cannot
delete) are skipped, as ``kubectl drain --ignore-daemonsets`` skips them.

The transport is passed in (``evict(pod) -> (HTTP status, body)``), and so are the clock and
``sleep``, so the loop is tested against the fake API without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.ops.reservation import PoolPod

Evict = Callable[[PoolPod], tuple[int, Mapping[str, Any]]]

EVICTED = "evicted"
GONE = "gone"
SKIPPED = "skipped"
REFUSED = "refused"  # still refused (PodDisruptionBudget) when the time ran out
FAILED = "failed"


def eviction_body(pod: PoolPod, *, dry_run: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    }
    if dry_run:
        body["deleteOptions"] = {"dryRun": ["All"]}
    return body


@dataclass(frozen=True)
class EvictionResult:
    pod: PoolPod
    outcome: str
    message: str
    attempts: int

    @property
    def done(self) -> bool:
        return self.outcome in (EVICTED, GONE, SKIPPED)


def status_message(body: Mapping[str, Any]) -> str:
    """The Status message, with the causes the apiserver gives (e.g. which budget refused)."""
    message = str(body.get("message") or body.get("reason") or "no message")
    details = body.get("details")
    causes = details.get("causes") if isinstance(details, Mapping) else None
    if isinstance(causes, list):
        extra = [str(c.get("message")) for c in causes if isinstance(c, Mapping) and c.get("message")]
        if extra:
            message += " (" + "; ".join(extra) + ")"
    return message


def _retry_after(body: Mapping[str, Any]) -> float:
    details = body.get("details")
    seconds = details.get("retryAfterSeconds") if isinstance(details, Mapping) else None
    return float(seconds) if isinstance(seconds, int) and seconds > 0 else 0.0


def evict_pods(
    pods: Iterable[PoolPod],
    evict: Evict,
    *,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    backoff_initial: float = 1.0,
    backoff_max: float = 16.0,
    on_result: Callable[[EvictionResult], None] | None = None,
) -> list[EvictionResult]:
    """Evict every pod that may be evicted; retry the refused ones with backoff until ``timeout``."""
    results: dict[str, EvictionResult] = {}
    order: list[str] = []

    def record(result: EvictionResult) -> None:
        results[result.pod.ref] = result
        if on_result is not None and result.outcome != REFUSED:
            on_result(result)

    pending: list[PoolPod] = []
    for pod in pods:
        order.append(pod.ref)
        reason = pod.skip_reason
        if reason is not None:
            record(EvictionResult(pod, SKIPPED, reason, 0))
        else:
            pending.append(pod)
    attempts: dict[str, int] = {}
    deadline = clock() + timeout
    delay = backoff_initial
    while pending:
        refused: list[PoolPod] = []
        wait = delay
        for pod in pending:
            attempts[pod.ref] = attempts.get(pod.ref, 0) + 1
            status, body = evict(pod)
            if status in (200, 201):
                record(EvictionResult(pod, EVICTED, "evicted", attempts[pod.ref]))
            elif status == 404:
                record(EvictionResult(pod, GONE, "already gone", attempts[pod.ref]))
            elif status == 429:
                results[pod.ref] = EvictionResult(pod, REFUSED, status_message(body), attempts[pod.ref])
                wait = max(wait, _retry_after(body))
                refused.append(pod)
            else:
                record(EvictionResult(pod, FAILED, f"HTTP {status}: {status_message(body)}", attempts[pod.ref]))
        pending = refused
        remaining = deadline - clock()
        if not pending or remaining <= 0:
            break
        sleep(min(wait, remaining))
        delay = min(delay * 2, backoff_max)
    for pod in pending:
        result = results[pod.ref]
        if on_result is not None:
            on_result(result)
    return [results[ref] for ref in order]
