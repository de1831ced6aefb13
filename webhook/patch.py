"""RFC 6902 JSON patch operations that the apiserver can always apply.

A patch the apiserver cannot apply fails the pod creation even with ``failurePolicy: Ignore``,
so every helper here checks the document it patches: parents are created when absent (or null),
keys are escaped (RFC 6901), and ``add`` is preferred over ``replace``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

Operation = dict[str, Any]


def escape(token: str) -> str:
    """Escape one JSON-pointer reference token: ``~`` first, then ``/`` (RFC 6901 section 4)."""
    return token.replace("~", "~0").replace("/", "~1")


@lru_cache(maxsize=4096, typed=True)
def _reference(token: str | int) -> str:
    """``/`` and the escaped token; the same few tokens recur in every patch, so they are cached (bounded)."""
    return "/" + escape(str(token))


def pointer(*tokens: str | int) -> str:
    return "".join([_reference(token) for token in tokens])


def add(path: str, value: Any) -> Operation:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> Operation:
    return {"op": "replace", "path": path, "value": value}


def set_map_entries(
    document: Mapping[str, Any], map_path: Sequence[str], entries: Mapping[str, Any]
) -> list[Operation]:
    """Operations that make ``document[map_path...]`` contain ``entries``, creating missing maps.

    ``map_path`` must lead through objects only (e.g. ``("metadata", "annotations")``).
    """
    if not entries:
        return []
    node: Any = document
    for depth, token in enumerate(map_path):
        child = node.get(token) if isinstance(node, Mapping) else None
        if not isinstance(child, Mapping):
            # Build the whole missing (or null) subtree in one operation.
            nested: Any = dict(entries)
            for inner in reversed(map_path[depth + 1 :]):
                nested = {inner: nested}
            return [add(pointer(*map_path[: depth + 1]), nested)]
        node = child
    operations = []
    for key, value in entries.items():
        current = node.get(key)
        if current is None:  # absent or null: add creates (or sets) the member
            operations.append(add(pointer(*map_path, key), value))
        elif current != value:
            operations.append(replace(pointer(*map_path, key), value))
    return operations


def resolve(document: Any, path: Sequence[str | int]) -> Any:
    """The value at ``path`` (object keys and list indexes), or None when any step is missing."""
    node = document
    for token in path:
        if type(node) is dict or isinstance(node, Mapping):
            node = node.get(token)
        elif isinstance(node, list) and isinstance(token, int) and 0 <= token < len(node):
            node = node[token]
        else:
            return None
    return node


def append_to_list(current: Any, list_path: Sequence[str | int], items: Sequence[Any]) -> list[Operation]:
    """Operations that append ``items`` to the list at ``list_path``, whose value the caller has read
    (``current``): appended to when it is a list, created when absent or null.

    The parent of the list must exist and be an object.
    """
    if not items:
        return []
    if isinstance(current, list):
        return [add(pointer(*list_path, "-"), item) for item in items]
    return [add(pointer(*list_path), list(items))]
