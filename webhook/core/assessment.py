"""One decision's working state (``Assessment``), shared by the checks and the plan, and the wording of a
denial: what was refused, where, and what to do."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final

from webhook.core import pods, scheduling
from webhook.core.decision import (
    NamespaceFacts,
    NodeFacts,
    Violation,
)
from webhook.core.policy import Policy, PolicySpec, Taint


@lru_cache(maxsize=64)
def reserved_nodes(policy: Policy, node_names: frozenset[str] | None) -> scheduling.Reserved:
    key, value = policy.spec.reserved_nodes.label
    return scheduling.Reserved(key, value, node_names)


class Assessment:
    """Working state of one decision."""

    __slots__ = (
        "direct", "done", "metadata", "namespace", "operations", "pod", "policy", "reserved", "spec", "terms",
        "tolerations", "violations", "warnings",
    )  # fmt: skip

    def __init__(
        self,
        *,
        pod: dict[str, Any],
        spec: dict[str, Any],
        metadata: dict[str, Any],
        policy: Policy,
        namespace: NamespaceFacts,
        reserved: scheduling.Reserved,
        warnings: list[str],
    ) -> None:
        self.pod: Final = pod
        self.spec: Final = spec
        self.metadata: Final = metadata
        self.policy: Final = policy
        self.namespace: Final = namespace
        self.reserved: Final = reserved
        self.warnings: Final = warnings
        self.operations: Final[list[dict[str, Any]]] = []
        self.done: Final[list[str]] = []
        self.violations: Final[list[Violation]] = []
        # Read once by the check (in the order its errors are reported), reused by the plan.
        self.terms: list[scheduling.Term] | None = None
        self.tolerations: list[tuple[int, dict[str, Any]]] = []
        # The routes by which the pod reaches GPUs without the device plugin or DRA (named in denials).
        self.direct: list[pods.Route] = []


def start_assessment(
    pod: dict[str, Any],
    spec: dict[str, Any],
    metadata: dict[str, Any],
    policy: Policy,
    namespace: NamespaceFacts,
    nodes: NodeFacts,
    mode_warnings: list[str],
    routes: list[pods.Route],
) -> Assessment:
    review = Assessment(
        pod=pod,
        spec=spec,
        metadata=metadata,
        policy=policy,
        namespace=namespace,
        reserved=reserved_nodes(policy, nodes.reserved_node_names),
        warnings=list(mode_warnings),
    )
    # The routes by which the pod reaches GPUs without the device plugin or DRA (named in denials).
    review.direct = [route for route in routes if route.direct]
    return review


def class_hint(spec: PolicySpec, class_name: str) -> str:
    if class_name not in spec.classes:
        return ""
    return f", or run the pod in a namespace labelled {spec.labels.namespace_class}={class_name}"


@lru_cache(maxsize=64)
def reserved_hint(policy: Policy) -> str:
    spec = policy.spec
    reserved = [name for name, cls in spec.classes.items() if cls.placement == "reserved"]
    if not reserved:
        return ""
    return f"; to use them, run the pod in a namespace labelled {spec.labels.namespace_class}={reserved[0]}"


def denied(review: Assessment, class_name: str, rule: str, where: str, what: str) -> None:
    key, value = review.reserved.key, review.reserved.value
    review.violations.append(
        Violation(
            rule,
            where,
            f"{class_name} pods may not use the reserved nodes ({key}={value}): {where} {what}"
            + direct_note(review.direct)
            + reserved_hint(review.policy),
        )
    )


def reserved_taint(review: Assessment) -> Taint | None:
    return review.policy.spec.reserved_nodes.taint


def read_tolerations(spec: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    found = pods.objects(spec.get("tolerations"), "spec.tolerations")
    for index, tol in found:
        if (
            type(tol.get("key")) in _STRING_OR_NULL
            and type(tol.get("operator")) in _STRING_OR_NULL
            and type(tol.get("value")) in _STRING_OR_NULL
            and type(tol.get("effect")) in _STRING_OR_NULL
        ):
            continue
        for name in ("key", "operator", "value", "effect"):
            pods.string(tol.get(name), f"spec.tolerations[{index}].{name}")
    return found


_STRING_OR_NULL = (str, type(None))


def direct_note(direct: list[pods.Route]) -> str:
    """Why a pod that asks for no GPU is a GPU pod: the route and the field (first one found)."""
    if not direct:
        return ""
    route = direct[0]
    return f" (a GPU pod through {route.field}: {route.describe()})"
