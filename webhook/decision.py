"""What the engine returns, and the facts it is given. Plain data: no I/O, no web framework.

Immutable records (NamedTuple: built for every review, and a tenth of the cost of a frozen dataclass).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from webhook.policy import Mode

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
Outcome = Literal["allowed", "patched", "denied"]


class NamespaceFacts(NamedTuple):
    """The namespace a pod is created in. ``labels`` is None when they are unknown (no cluster)."""

    name: str
    labels: Mapping[str, str] | None = None


class NodeFacts(NamedTuple):
    """Names of the reserved nodes, or None when unknown (no cluster)."""

    reserved_node_names: frozenset[str] | None = None


class Violation(NamedTuple):
    """One way a pod breaks the policy. ``rule`` is a stable identifier (metrics label, docs)."""

    rule: str
    field: str
    message: str


class Decision(NamedTuple):
    """The engine's answer for one pod.

    ``violations`` are recorded in every mode; whether they deny depends on ``mode``
    (enforce: denied; warn: turned into warnings; audit: only recorded).
    """

    allowed: bool
    rule: str
    message: str
    mode: Mode
    workload_class: str | None = None
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    audit_annotations: Mapping[str, str] = MappingProxyType({})
    violations: tuple[Violation, ...] = ()
    code: int = 200

    @property
    def outcome(self) -> Outcome:
        if not self.allowed:
            return "denied"
        return "patched" if self.patch else "allowed"
