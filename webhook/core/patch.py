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


def pointer(*tokens: str | int) -> str:
    return _pointer(tokens)


@lru_cache(maxsize=4096)
def _pointer(tokens: tuple[str | int, ...]) -> str:
    # The same few paths recur in every patch, so they are escaped once (bounded cache).
    return "".join(["/" + escape(str(token)) for token in tokens])


def add(path: str, value: Any) -> Operation:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> Operation:
    return {"op": "replace", "path": path, "value": value}


def remove(path: str) -> Operation:
    return {"op": "remove", "path": path}


def set_map_entries(document: dict[str, Any], map_path: tuple[str, ...], entries: dict[str, Any]) -> list[Operation]:
    """Operations that make ``document[map_path...]`` contain ``entries``, creating missing maps.

    ``map_path`` must lead through objects only (e.g. ``("metadata", "annotations")``).
    """
    if not entries:
        return []
    node: dict[str, Any] = document
    for depth, token in enumerate(map_path):
        child = node.get(token)
        if child is None or (type(child) is not dict and not isinstance(child, Mapping)):
            # Build the whole missing (or null) subtree in one operation.
            nested: Any = dict(entries)
            for inner in reversed(map_path[depth + 1 :]):
                nested = {inner: nested}
            return [add(_pointer(map_path[: depth + 1]), nested)]
        node = child if type(child) is dict else dict(child)
    prefix = _pointer(map_path) + "/"
    operations = []
    for key, value in entries.items():
        current = node.get(key)
        if current is None:  # absent or null: add creates (or sets) the member
            operations.append(add(prefix + escape(key), value))
        elif current != value:
            operations.append(replace(prefix + escape(key), value))
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


def append_to_list(current: Any, list_pointer: str, items: Sequence[Any]) -> list[Operation]:
    """Operations that append ``items`` to the list at ``list_pointer`` (already escaped), whose value
    the caller has read (``current``): appended to when it is a list, created when absent or null.

    The parent of the list must exist and be an object.
    """
    if not items:
        return []
    if isinstance(current, list):
        end = list_pointer + "/-"
        return [add(end, item) for item in items]
    return [add(list_pointer, list(items))]
