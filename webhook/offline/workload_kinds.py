"""The shapes of the workload table (``controllers.TABLE``): a template rule, a workload kind, a template found.

Pure: no I/O. ``workloads.py`` says how the dry run uses them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Shape = Literal["template", "inline", "override"]
TEMPLATE: Shape = "template"
INLINE: Shape = "inline"
OVERRIDE: Shape = "override"
PLACEHOLDER = "dry-run-placeholder"

Path = tuple[str | int, ...]
# (the object, the template node, what the wildcards matched) -> label key -> value or PLACEHOLDER
LabelRule = Callable[[Mapping[str, Any], Mapping[str, Any], tuple[str, ...]], dict[str, str]]


# (the object, the template found) -> the pod's metadata and spec (OVERRIDE: what the controller will make)
PodBuilder = Callable[[Mapping[str, Any], "Template"], tuple[Any, Any]]
# the object -> resource limits the controller sets on the template's first container (Kaiwo's ``gpus``)
LimitsRule = Callable[[Mapping[str, Any]], dict[str, int]]


def no_labels(body: Mapping[str, Any], node: Mapping[str, Any], matched: tuple[str, ...]) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class TemplateRule:
    """A pattern of template paths in a kind, how to name what it finds, and its pods' controller labels."""

    pattern: str
    label: str | None = None  # "{} template": the wildcard matches fill the braces; None for core kinds
    shape: Shape = TEMPLATE
    labels: LabelRule = no_labels
    # INLINE: the component's own containers besides ``containers`` (KServe predictor.model, ...)
    containers: tuple[str, ...] = ()
    # INLINE: False when the component has no metadata fields (the class annotation is not written)
    has_metadata: bool = True
    # OVERRIDE: how the controller makes the pod (None: a Trainer override, ``_override_pod``)
    build: PodBuilder | None = None
    # limits the controller puts on the pod's first container, over the template's own (Kaiwo)
    limits: LimitsRule | None = None
    # looked at only when no other rule of the kind finds a template (Kaiwo's generated pod)
    fallback: bool = False

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(t for t in re.split(r"\.|(?=\[\*\])", self.pattern) if t)


@dataclass(frozen=True)
class Workload:
    kind: str
    groups: frozenset[str]
    templates: tuple[TemplateRule, ...]
    reference: str = ""  # the API reference the paths were read from (docs/workloads.md)


@dataclass(frozen=True)
class Template:
    """One pod template found in an object: the rule that found it, where it is, what the wildcards matched."""

    rule: TemplateRule
    path: Path
    matched: tuple[str, ...]
    node: Mapping[str, Any]

    @property
    def name(self) -> str | None:
        if self.rule.label is None:
            return None
        return self.rule.label.format(*self.matched)

    @property
    def dotted(self) -> str:
        return dotted(self.path)


def dotted(path: Path) -> str:
    out = ""
    for token in path:
        out += f"[{token}]" if isinstance(token, int) else (f".{token}" if out else token)
    return out


def item_label(item: Any, index: int) -> str:
    if isinstance(item, Mapping):
        for key in ("name", "groupName", "manager"):
            value = item.get(key)
            if isinstance(value, str) and value:
                return value
    return str(index)
