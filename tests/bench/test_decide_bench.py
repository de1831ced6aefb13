"""Micro-benchmarks of ``decide()`` alone (no network): regressions show here first.

``make bench`` runs them with ``--benchmark-only``; in ``make test`` each runs once and only its
result is checked. The reviews are the ones the HTTPS benchmark sends (bench/reviews.py).

(No conftest.py here: a second ``conftest`` module would shadow tests/conftest.py, which the service
tests import by name.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from bench import policies, reviews
from webhook.core.decision import Decision, DeviceFacts, NamespaceFacts, NodeFacts
from webhook.core.device_claims import decide_claim
from webhook.core.engine import decide
from webhook.core.policy import Policy

POLICY = policies.policy(1)


@pytest.fixture(autouse=True)
def _once_unless_benchmarking(request: pytest.FixtureRequest) -> None:
    """Outside ``--benchmark-only`` each benchmarked call runs once: checked, and the suite stays fast."""
    if "benchmark" not in request.fixturenames:
        return
    config = request.config
    if config.getoption("benchmark_only") or config.getoption("benchmark_enable"):
        return
    benchmark: Any = request.getfixturevalue("benchmark")
    benchmark.disabled = True


# scenario -> (allowed, rule, number of patch operations)
EXPECTED: dict[str, tuple[bool, str, int]] = {
    # Every mutated pod: the placement's and the record's operations, the placed label one of them.
    "inference-small": (True, "mutated", 7),
    "training-small": (True, "mutated", 5),
    "training-denied": (False, "deny-node-selector", 0),
    "large": (True, "mutated", 41),
    "non-gpu": (True, "not-gpu-pod", 0),
}


def _call(review: dict[str, Any], policy: Policy = POLICY, namespace: str | None = None) -> Callable[[], Decision]:
    request = review["request"]
    pod = request["object"]
    facts = NamespaceFacts(namespace or request["namespace"])
    nodes = NodeFacts()

    def call() -> Decision:
        return decide(operation="CREATE", pod=pod, namespace=facts, nodes=nodes, policy=policy)

    return call


@pytest.mark.parametrize("name", list(reviews.BUILDERS))
def test_decide_scenario(benchmark: Any, name: str) -> None:
    decision = benchmark(_call(reviews.BUILDERS[name]()))
    allowed, rule, operations = EXPECTED[name]
    assert (decision.allowed, decision.rule, len(decision.patch)) == (allowed, rule, operations)


@pytest.mark.parametrize("containers", [1, 10, 30, 100])
def test_decide_pod_size(benchmark: Any, containers: int) -> None:
    decision = benchmark(_call(reviews.sized_pod(containers)))
    assert decision.allowed
    # One env operation per container, one per affinity term (8), the two annotations, the placed label.
    assert len(decision.patch) == containers + 8 + 3


@pytest.mark.parametrize("rules", [1, 10, 100, 1000])
def test_decide_namespace_rules(benchmark: Any, rules: int) -> None:
    policy = policies.policy(rules)
    decision = benchmark(_call(reviews.inference_small(), policy))
    assert decision.workload_class == "inference"
    assert decision.audit_annotations["class"] == "inference"


@pytest.mark.parametrize("rules", [1, 1000])
def test_decide_namespace_rules_new_namespace(benchmark: Any, rules: int) -> None:
    """A namespace never seen before: the compiled rules are scanned, not the per-namespace cache."""
    policy = policies.policy(rules)
    review = reviews.inference_small()
    counter = iter(range(10**9))

    def call() -> Decision:
        return _call(review, policy, f"inference-new-{next(counter)}")()

    decision = benchmark(call)
    assert decision.workload_class == "inference"


def test_review_files_are_generated() -> None:
    """bench/reviews/*.json are what ``python -m bench.reviews`` writes (edit the generator, not the files)."""
    for name, build in reviews.BUILDERS.items():
        assert json.loads(reviews.path(name).read_text()) == build(), f"run python -m bench.reviews ({name})"


# Device-level reservation: ResourceClaim(Template) reviews are rarer than pods (one per claim, none for
# the scheduler's extended-resource claims) but have their own path, decide_claim: its row.
CLAIM_CASES = {
    # (namespace, class of the request, kind) -> (rule, operations)
    "training-template-steered": ("ml-training", "gpu.amd.com", "ResourceClaimTemplate", "mutated", 2),
    # The class, the reserved-device taint's toleration, the class annotation.
    "inference-claim-steered": ("inference-serving", "gpu.amd.com", "ResourceClaim", "mutated", 3),
    "training-claim-already-shared": ("ml-training", "rocm-isolation-shared", "ResourceClaim", "no-gpu-request", 0),
}


def claim_object(kind: str, namespace: str, device_class: str) -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 2}}]}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"generateName": "job-0-gpu-", "namespace": namespace},
        "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec,
    }


@pytest.mark.parametrize("name", list(CLAIM_CASES))
def test_decide_claim(benchmark: Any, name: str) -> None:
    namespace, device_class, kind, rule, operations = CLAIM_CASES[name]
    claim = claim_object(kind, namespace, device_class)
    facts = NamespaceFacts(namespace, {"rocm-isolation.io/class": namespace.split("-")[0]})
    devices = DeviceFacts(devices_reserved=True)

    def call() -> Decision:
        return decide_claim(operation="CREATE", claim=claim, kind=kind, namespace=facts, policy=POLICY, devices=devices)

    decision = benchmark(call)
    assert (decision.allowed, decision.rule, len(decision.patch)) == (True, rule, operations)
