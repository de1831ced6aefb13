"""Where a pod can be scheduled, and how to narrow it, reasoned on node affinity as the scheduler does.

``nodeSelectorTerms`` are ORed and the requirements inside one term are ANDed, so a requirement must
be added to *every* term (appending a new term would widen placement). An empty term matches no node
and is left alone. The reachability question is: can *every* way the pod could be scheduled only
lead to a reserved node?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from webhook.core import pods

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TERMS_PATH = ("spec", "affinity", "nodeAffinity", REQUIRED, "nodeSelectorTerms")


class Reserved(NamedTuple):
    """How reserved nodes are recognised: one node label, and their names when known."""

    key: str
    value: str
    node_names: frozenset[str] | None

    def selects_only_reserved(self, requirement: dict[str, Any]) -> bool:
        values = requirement.get("values") or []
        return (
            requirement.get("key") == self.key
            and requirement.get("operator") == "In"
            and bool(values)
            and all(value == self.value for value in values)
        )

    def excludes_reserved(self, requirement: dict[str, Any]) -> bool:
        if requirement.get("key") != self.key:
            return False
        operator = requirement.get("operator")
        values = requirement.get("values") or []
        return (
            operator == "DoesNotExist"
            or (operator == "NotIn" and self.value in values)
            or (operator == "In" and self.value not in values)
        )

    def fields_select_only_reserved(self, requirement: dict[str, Any]) -> bool:
        values = requirement.get("values") or []
        return (
            self.node_names is not None
            and requirement.get("key") == "metadata.name"
            and requirement.get("operator") == "In"
            and bool(values)
            and all(value in self.node_names for value in values)
        )


class Term:
    """One required node-selector term of the pod: where it is, and its requirements (read once)."""

    __slots__ = ("body", "expressions", "fields", "index")

    def __init__(
        self, index: int, expressions: list[dict[str, Any]], fields: list[dict[str, Any]], body: dict[str, Any]
    ) -> None:
        self.index: Final = index
        self.expressions: Final = expressions
        self.fields: Final = fields
        self.body: Final = body

    @property
    def empty(self) -> bool:
        # The API: "null or empty node selector term matches no objects".
        return not self.expressions and not self.fields


def required_terms(spec: dict[str, Any]) -> list[Term] | None:
    """The required node-affinity terms, or None when the pod has no required node affinity."""
    affinity = pods.mapping(spec.get("affinity"), "spec.affinity")
    node_affinity = pods.mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = node_affinity.get(REQUIRED)
    if required is None:
        return None
    field = f"spec.affinity.nodeAffinity.{REQUIRED}"
    required = pods.mapping(required, field)
    raw_terms = pods.sequence(required.get("nodeSelectorTerms"), f"{field}.nodeSelectorTerms")
    if not raw_terms:
        return None
    terms = []
    for index, body in pods.objects(raw_terms, f"{field}.nodeSelectorTerms"):
        plain = _plain_requirements(body.get("matchExpressions")), _plain_requirements(body.get("matchFields"))
        if plain[0] is not None and plain[1] is not None:
            # Well typed (what the apiserver sends): no field names to format.
            terms.append(Term(index, plain[0], plain[1], body))
            continue
        where = f"{field}.nodeSelectorTerms[{index}]"
        expressions = [expr for _, expr in pods.objects(body.get("matchExpressions"), f"{where}.matchExpressions")]
        fields = [expr for _, expr in pods.objects(body.get("matchFields"), f"{where}.matchFields")]
        for expr in (*expressions, *fields):
            pods.string(expr.get("key"), f"{where}: key")
            for value in pods.sequence(expr.get("values"), f"{where}: values"):
                pods.string(value, f"{where}: values")
        terms.append(Term(index, expressions, fields, body))
    return terms


def _plain_requirements(value: Any) -> list[dict[str, Any]] | None:
    """A copy of the requirement list when every item is a dict with a string key and string values
    (absent counts as empty); None when anything else is there (checked field by field instead)."""
    if value is None:
        return []
    if type(value) is not list:
        return None
    for expr in value:
        if type(expr) is not dict or type(expr.get("key")) is not str:
            return None
        values = expr.get("values")
        if values is not None and (type(values) is not list or any(type(v) is not str for v in values)):
            return None
    return list(value)


def term_only_reserved(term: Term, reserved: Reserved) -> bool:
    return any(reserved.selects_only_reserved(e) for e in term.expressions) or any(
        reserved.fields_select_only_reserved(f) for f in term.fields
    )


def affinity_only_reserved(terms: list[Term] | None, reserved: Reserved) -> bool:
    """True when every term that can match a node selects reserved nodes only."""
    if not terms:
        return False
    live = [term for term in terms if not term.empty]
    return bool(live) and all(term_only_reserved(term, reserved) for term in live)


def affinity_excludes_reserved(terms: list[Term] | None, reserved: Reserved) -> bool:
    """True when every term that can match a node keeps off the reserved nodes (by their label)."""
    if not terms:
        return False
    live = [term for term in terms if not term.empty]
    return bool(live) and all(any(reserved.excludes_reserved(e) for e in term.expressions) for term in live)


def _implies(expression: dict[str, Any], alternative: dict[str, Any]) -> bool:
    """Whether ``expression`` already asks for ``alternative``: the same requirement (values as a
    multiset), or, for ``In``, a narrower one (``In [inference]`` implies ``In [inference,
    inference-devices]``: a pod placed by an earlier version, or by its author, is left as it is)."""
    if expression.get("key") != alternative.get("key") or expression.get("operator") != alternative.get("operator"):
        return False
    values = expression.get("values") or []
    wanted = alternative.get("values") or []
    if alternative.get("operator") == "In":
        return bool(values) and all(value in wanted for value in values)
    return sorted(values) == sorted(wanted)


@dataclass(frozen=True)
class Requirement:
    """One requirement the policy adds to every term; ``alternatives`` are equivalent spellings (ORed)."""

    alternatives: tuple[dict[str, Any], ...]
    satisfied_by_exclusion: Reserved | None = None  # for "not reserved": any expression excluding them counts

    def satisfied(self, term: Term) -> bool:
        for expression in term.expressions:
            if self.satisfied_by_exclusion is not None and self.satisfied_by_exclusion.excludes_reserved(expression):
                return True
            if any(_implies(expression, alt) for alt in self.alternatives):
                return True
        return False


def _fresh(expression: dict[str, Any]) -> dict[str, Any]:
    """A copy owned by the patch (requirements are shared by every review of a policy)."""
    out = dict(expression)
    if "values" in out:
        out["values"] = list(out["values"])
    return out


def splits(terms: list[Term], requirements: Sequence[Requirement]) -> bool:
    """Whether narrowing splits a term: a term (not empty) lacks a requirement that has several spellings."""
    return any(
        len(r.alternatives) > 1 and not term.empty and not r.satisfied(term) for term in terms for r in requirements
    )


def missing_requirements(term: Term, requirements: Sequence[Requirement]) -> list[dict[str, Any]]:
    """What narrowing appends to one term when nothing ``splits``: the requirements the term does not
    satisfy yet (nothing for an empty term, which matches no node)."""
    if term.empty:
        return []
    return [_fresh(r.alternatives[0]) for r in requirements if not r.satisfied(term)]


def narrow_terms(terms: list[Term] | None, requirements: Sequence[Requirement]) -> list[dict[str, Any]]:
    """The terms with every requirement ANDed in; a requirement with several spellings splits a term
    into one term per spelling (terms are ORed).

    Empty terms match nothing and stay as they are. With no terms at all, one term is created.
    """
    out: list[dict[str, Any]] = []
    originals: list[Term | None] = list(terms) if terms else [None]
    for original in originals:
        body = dict(original.body) if original is not None else {}
        variants = [body]
        if original is not None and original.empty:
            out.append(body)
            continue
        for requirement in requirements:
            if original is not None and requirement.satisfied(original):
                continue
            next_variants = []
            for variant in variants:
                for alternative in requirement.alternatives:
                    expressions = [*(variant.get("matchExpressions") or []), _fresh(alternative)]
                    next_variants.append({**variant, "matchExpressions": expressions})
            variants = next_variants
        out.extend(variants)
    return out


def tolerates(toleration: dict[str, Any], key: str, value: str, effect: str) -> bool:
    """Kubernetes' ToleratesTaint: does this pod toleration tolerate the taint ``key=value:effect``?"""
    wanted_effect = toleration.get("effect") or ""
    if wanted_effect and wanted_effect != effect:
        return False
    wanted_key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not wanted_key:
        # An empty key with operator Exists tolerates every taint.
        return operator == "Exists"
    if wanted_key != key:
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == value
