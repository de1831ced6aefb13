"""Label and field selectors, evaluated as the apiserver evaluates them, for reads answered from memory.

The Lease holder's view of the cluster (``cluster/view.py``) answers the ``list`` calls that ``audit``,
``pool`` and the lending keeper make with selectors, so it must select exactly what the apiserver would.

- labels (``k8s.io/apimachinery/pkg/labels``): terms separated by commas, all of which must hold:
  ``key=value``, ``key==value``, ``key!=value`` (also true when the key is absent), ``key in (a,b)``,
  ``key notin (a,b)`` (also true when absent), ``key`` (exists), ``!key`` (absent);
- fields (``pkg/fields``): ``path=value``, ``path==value``, ``path!=value`` on dotted paths of the object
  (``status.phase``, ``spec.nodeName``, ``metadata.name``); an absent field reads as "".

A selector this does not understand raises ``ValueError``: answering a read with the wrong objects would be
worse than failing the read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9./_-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_KEY = re.compile(r"^[A-Za-z0-9./_-]+$")


def _terms(selector: str) -> list[str]:
    """Split on the commas outside parentheses (``a in (x,y),b=c`` is two terms)."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term.strip() for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    found = _SET_TERM.match(term)
    if found:
        if found.group(1):
            raise ValueError(f"unsupported label selector term {term!r}")
        key, operator = found.group(2), found.group(3)
        values = frozenset(v.strip() for v in found.group(4).split(",") if v.strip())
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for operator in ("!=", "==", "="):
        if operator in term:
            key, _, value = (part.strip() for part in term.partition(operator))
            if not _KEY.match(key):
                raise ValueError(f"unsupported label selector term {term!r}")
            if operator == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if term.startswith("!") and _KEY.match(term[1:].strip()):
        absent = term[1:].strip()
        return lambda labels: absent not in labels
    if _KEY.match(term):
        return lambda labels: term in labels
    raise ValueError(f"unsupported label selector term {term!r}")


def label_matcher(selector: str | None) -> Matcher:
    """Whether an object's ``metadata.labels`` satisfy ``selector`` (everything for none)."""
    terms = [_label_term(term) for term in _terms(selector or "")]
    if not terms:
        return lambda obj: True

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def _field(obj: Mapping[str, Any], path: tuple[str, ...]) -> str:
    value: Any = obj
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_matcher(selector: str | None) -> Matcher:
    """Whether an object satisfies the field ``selector`` (everything for none)."""
    checks: list[tuple[tuple[str, ...], bool, str]] = []  # (path, equal, value)
    for term in _terms(selector or ""):
        for operator in ("!=", "==", "="):
            if operator in term:
                path, _, value = (part.strip() for part in term.partition(operator))
                if not _KEY.match(path):
                    raise ValueError(f"unsupported field selector term {term!r}")
                checks.append((tuple(path.split(".")), operator != "!=", value))
                break
        else:
            raise ValueError(f"unsupported field selector term {term!r}")

    if not checks:
        return lambda obj: True

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field(obj, path) == value) == equal for path, equal, value in checks)

    return matches
