"""Read a pod (a plain dict) defensively: every accessor checks the type of what it reads.

The apiserver always sends well-typed pods, but the offline ``mutate`` command and hostile
clients may not; a wrong type raises ``MalformedPod`` naming the field, never a KeyError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

CONTAINER_LISTS = ("initContainers", "containers")


class MalformedPod(Exception):
    """A field of the pod has a type Kubernetes would never send."""

    def __init__(self, field: str, expected: str) -> None:
        self.field = field
        self.expected = expected
        super().__init__(f"{field} must be {expected}")


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    """The value as a mapping; absent or null reads as empty."""
    if type(value) is dict:  # fast path: what JSON decoding gives (the ABC check below is slow)
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedPod(field, "an object")
    return value


def sequence(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedPod(field, "a list")
    return value


def string(value: Any, field: str) -> str:
    if type(value) is str:
        return value
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedPod(field, "a string")
    return value


def string_map(value: Any, field: str) -> dict[str, str]:
    out = {}
    for key, item in mapping(value, field).items():
        if not isinstance(item, str):
            raise MalformedPod(f"{field}[{key}]", "a string")
        out[key] = item
    return out


def objects(value: Any, field: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """Index and item of a list whose items must be objects."""
    for index, item in enumerate(sequence(value, field)):
        # The field name is only formatted when the item is not a plain dict.
        yield index, (item if type(item) is dict else mapping(item, f"{field}[{index}]"))


@dataclass(frozen=True)
class ContainerRef:
    """A container and where it sits in the pod (``containers`` or ``initContainers``, index)."""

    list_name: str
    index: int
    body: Mapping[str, Any]

    @property
    def field(self) -> str:
        return f"spec.{self.list_name}[{self.index}]"


def containers(spec: Mapping[str, Any]) -> Iterator[ContainerRef]:
    for list_name in CONTAINER_LISTS:
        for index, body in objects(spec.get(list_name), f"spec.{list_name}"):
            yield ContainerRef(list_name, index, body)


def resource_names(container: ContainerRef) -> set[str]:
    # mapping() only when the value is not a plain dict: the field names are formatted for errors only.
    resources = container.body.get("resources")
    if type(resources) is not dict:
        resources = mapping(resources, f"{container.field}.resources")
    names: set[str] = set()
    for kind in ("requests", "limits"):
        value = resources.get(kind)
        names.update(value if type(value) is dict else mapping(value, f"{container.field}.resources.{kind}"))
    return names


def gpu_containers(spec: Mapping[str, Any], is_gpu_resource: Callable[[str], bool]) -> list[ContainerRef]:
    return [c for c in containers(spec) if any(is_gpu_resource(name) for name in resource_names(c))]


def pod_name(pod: Mapping[str, Any]) -> str:
    """The pod's name, or its generateName prefix (names are empty on CREATE with generateName)."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    name = metadata.get("name") or ""
    if not name and isinstance(metadata.get("generateName"), str):
        return str(metadata["generateName"])
    return name if isinstance(name, str) else ""
