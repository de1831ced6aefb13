"""``audit`` with lending (policy spec.lending): the borrowers in the capacity, and the lending rules, against
the stateful fake API (tests/fake_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from cluster_objects import INFERENCE_TOLERATION, namespace, node, pod
from fake_cluster import FakeCluster

from webhook.cluster.kubeapi import KubeApi
from webhook.core.policy import Policy, default_policy, parse_policy
from webhook.ops.audit import command

NOW = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)
BORROW = {"rocm-isolation.io/borrow": "true"}
# The three fields the Priority admission plugin and the webhook leave on a borrower.
BORROWER_PRIORITY = {"priorityClassName": "rocm-isolation-borrower", "priority": -100, "preemptionPolicy": "Never"}

# (rule, namespace/name) of the lending rules: test_audit's "every documented rule is exercised" reads it.
LENDING_EXPECTED = {
    ("borrower-above-borrower-priority", "ml/high-borrower"),
    ("inference-waits-on-borrowers", "serve/llm-waiting"),
    ("borrower-while-lending-off", "ml/borrower"),
}


def lending_policy(enabled: bool) -> Policy:
    document = default_policy().document.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["lending"] = {"enabled": enabled, "reclaimGraceSeconds": 30}
    return parse_policy(yaml.safe_dump(document))


def borrower(name: str, **spec: Any) -> dict[str, Any]:
    obj = pod(name, "ml", node="r1", gpus={"amd.com/gpu": "2"}, labels=BORROW, tolerations=[INFERENCE_TOLERATION])
    obj["spec"].update({**BORROWER_PRIORITY, **spec})
    return obj


@pytest.fixture(name="fake")
def lending_cluster() -> Iterator[FakeCluster]:
    cluster = FakeCluster().start()
    cluster.add(
        node("r1", reserved=True, allocatable={"amd.com/gpu": "8"}),
        node("s1", allocatable={"amd.com/gpu": "8"}),
        namespace("ml", {"rocm-isolation.io/class": "training", "rocm-isolation.io/lending": "allowed"}),
        namespace("serve", {"rocm-isolation.io/class": "inference"}),
        borrower("borrower"),
        borrower("high-borrower", priorityClassName="high", priority=1000, preemptionPolicy="PreemptLowerPriority"),
        # Created at 08:29:50, 10 s before the audit: within the grace period, not a finding.
        pod("llm-new", "serve", gpus={"amd.com/gpu": "4"}, created="2026-12-01T08:29:50Z"),
        pod("llm-waiting", "serve", gpus={"amd.com/gpu": "4"}, created="2026-12-01T08:00:00Z"),
    )
    yield cluster
    cluster.stop()


def run(fake: FakeCluster, policy: Policy) -> command.Report:
    return command.run_audit(KubeApi(fake.api_client(), page_size=3), policy, now=NOW)


def lending_findings(report: command.Report) -> set[tuple[str, str]]:
    rules = {rule for rule, _ in LENDING_EXPECTED}
    return {(f.rule, f"{f.namespace}/{f.name}") for f in report.findings if f.rule in rules}


def test_lending_on_a_borrower_out_of_priority_and_inference_waiting_past_the_grace_are_found(
    fake: FakeCluster,
) -> None:
    report = run(fake, lending_policy(True))
    assert lending_findings(report) == LENDING_EXPECTED - {("borrower-while-lending-off", "ml/borrower")}
    waiting = next(f for f in report.findings if f.rule == "inference-waits-on-borrowers")
    assert "waited 1800s" in waiting.message and "borrowers hold 2 reserved GPUs" in waiting.message
    # The borrowers' GPUs are the reserved pool's, as training's (the class they run as).
    assert report.to_json()["capacity"]["reserved"]["gpusRequested"] == {"training": 4}


def test_lending_off_a_borrower_still_on_a_reserved_node_is_found_and_nobody_waits_on_borrowers(
    fake: FakeCluster,
) -> None:
    report = run(fake, lending_policy(False))
    assert lending_findings(report) == {
        ("borrower-while-lending-off", "ml/borrower"),
        ("borrower-while-lending-off", "ml/high-borrower"),
    }
