"""Fields of raw Kubernetes JSON (as the API returns it), read without trusting their types: a field that
is not what it should be reads as empty."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
