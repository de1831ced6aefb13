"""Lending off (issue 42): the reserved nodes stay closed to the borrowers of before the switch while one is
pending (ops/lending.closed_after_lending, what the keeper of service/lending_loop.py writes as the
no-borrowers taint)."""

from __future__ import annotations

from typing import Any

from webhook.ops.lending.decisions import closed_after_lending

BORROWER_CLASS = "rocm-isolation-borrower"


def _pending(name: str, *, priority_class: str | None = None, placed: str | None = None, **spec: Any) -> dict[str, Any]:
    labels = {"rocm-isolation.io/placed": placed} if placed else {}
    body: dict[str, Any] = {"metadata": {"name": name, "labels": labels}, "spec": dict(spec)}
    if priority_class:
        body["spec"]["priorityClassName"] = priority_class
    return body


def test_lending_off_keeps_the_reserved_nodes_closed_while_a_borrower_of_before_is_pending() -> None:
    pending = _pending("b", priority_class=BORROWER_CLASS, placed="training")
    running = _pending("r", priority_class=BORROWER_CLASS, placed="training", nodeName="gpu-r1")
    leaving = _pending("l", priority_class=BORROWER_CLASS)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert closed_after_lending([pending], BORROWER_CLASS, ["inference"])
    # Running borrowers are left alone and keep nothing closed; nor do terminating ones or other pods.
    assert not closed_after_lending([running, leaving], BORROWER_CLASS, ["inference"])
    assert not closed_after_lending([_pending("t", placed="training")], BORROWER_CLASS, ["inference"])
    assert not closed_after_lending([], BORROWER_CLASS, ["inference"])
    # An inference pod waiting opens them (it cannot tolerate the taint with lending off); a bound one does not.
    assert not closed_after_lending([pending, _pending("llm", placed="inference")], BORROWER_CLASS, ["inference"])
    assert closed_after_lending(
        [pending, _pending("llm", placed="inference", nodeName="gpu-r1")], BORROWER_CLASS, ["inference"]
    )
