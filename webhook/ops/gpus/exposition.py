"""The Prometheus text exposition format (version 0.0.4, what the exporter's ``/metrics`` serves), read. Pure.

Each line is ``name{label="value",...} value [timestamp]`` (timestamp in milliseconds); ``#`` lines are
comments (``# HELP``, ``# TYPE``) and skipped; label values escape ``\\``, ``"`` and newlines. A file may hold
several scrapes, each line with its timestamp (the same series at several instants: its history); a line
without a timestamp is taken at the instant the caller gives (the moment it was read).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class ExpositionError(ValueError):
    """A line that is not a sample of the text format: which line, and what is wrong with it."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float  # Unix seconds


def _value(text: str, line: int) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise ExpositionError(f"line {line}: {text!r} is not a number") from None


def _labels(text: str, pos: int, line: int) -> tuple[dict[str, str], int]:
    """The label set starting after ``{`` at ``pos``; returns it and the position after ``}``."""
    labels: dict[str, str] = {}
    while True:
        rest = text[pos:].lstrip()
        pos = len(text) - len(rest)
        if rest.startswith("}"):
            return labels, pos + 1
        match = _LABEL.match(text, pos)
        if match is None:
            raise ExpositionError(f'line {line}: a label name and =" expected at column {pos + 1}')
        pos = match.end()
        value: list[str] = []
        while True:
            if pos >= len(text):
                raise ExpositionError(f"line {line}: unterminated label value of {match.group(1)}")
            char = text[pos]
            if char == "\\" and pos + 1 < len(text):
                value.append(_ESCAPES.get(text[pos + 1], "\\" + text[pos + 1]))
                pos += 2
            elif char == '"':
                pos += 1
                break
            else:
                value.append(char)
                pos += 1
        labels[match.group(1)] = "".join(value)
        rest = text[pos:].lstrip()
        pos = len(text) - len(rest)
        if rest.startswith(","):
            pos += 1
        elif not rest.startswith("}"):
            raise ExpositionError(f"line {line}: , or }} expected after the value of {match.group(1)}")


def parse(text: str, now: float) -> Iterator[Sample]:
    """The samples of ``text``; a sample without a timestamp is at ``now``. Raises ``ExpositionError``."""
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _NAME.match(stripped)
        if match is None:
            raise ExpositionError(f"line {number}: a metric name expected: {stripped[:80]!r}")
        pos = match.end()
        labels: dict[str, str] = {}
        if pos < len(stripped) and stripped[pos] == "{":
            labels, pos = _labels(stripped, pos + 1, number)
        fields = stripped[pos:].split()
        if len(fields) not in (1, 2):
            raise ExpositionError(f"line {number}: a value and an optional timestamp expected: {stripped[:80]!r}")
        value = _value(fields[0], number)
        if len(fields) == 2:
            try:
                timestamp = int(fields[1]) / 1000.0
            except ValueError:
                raise ExpositionError(f"line {number}: {fields[1]!r} is not a timestamp in milliseconds") from None
        else:
            timestamp = now
        yield Sample(match.group(), labels, value, timestamp)
