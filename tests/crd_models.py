"""Check a workload CRD object against its project's published API models (OpenAPI-generated pydantic).

The generated models ignore unknown fields when they parse, so the field names are checked here by walking
the object along the models' annotations: every key must be a field (by its JSON name) of the model at
that place. Types are then checked by the models' own parser (``from_dict``: strict scalars; it reads a
resource quantity as Kubernetes does, a number or a string)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel


def problems(model: type[BaseModel], data: Any) -> list[str]:
    """Unknown fields of ``data`` (dotted paths), and the model's own type errors."""
    found = _unknown(model, data, "")
    try:
        model.from_dict(data)  # type: ignore[attr-defined]  # the generated models' own parser
    except ValueError as err:
        found.append(str(err))
    return found


def _unknown(model: type[BaseModel], data: Any, where: str) -> list[str]:
    if not isinstance(data, dict):
        return []
    fields = {(field.alias or name): field for name, field in model.model_fields.items()}
    found = []
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            found.append(f"{where}.{key}".lstrip(".") + ": unknown field")
        else:
            found.extend(_walk(field.annotation, value, f"{where}.{key}"))
    return found


def _walk(annotation: Any, value: Any, where: str) -> list[str]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _walk(args[0], value, where)
    if origin in (typing.Union, types.UnionType):
        return [problem for arg in args for problem in _walk(arg, value, where)]
    if origin is list and isinstance(value, list):
        return [problem for i, item in enumerate(value) for problem in _walk(args[0], item, f"{where}[{i}]")]
    if origin is dict and isinstance(value, dict):
        return [problem for key, item in value.items() for problem in _walk(args[1], item, f"{where}.{key}")]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _unknown(annotation, value, where)
    return []
