"""The sections the benchmarks write into docs/benchmarks.md, each between its own two markers: one writer, so
that no bench deletes another's section (bench-audit once cut every section after its own)."""

from __future__ import annotations

from pathlib import Path


def replace_section(document: str, begin: str, end: str, section: str) -> str:
    """``document`` with the text from the line ``begin`` to the line ``end`` (both included) replaced by
    ``section`` (which carries both markers), or ``section`` appended after a blank line when ``begin`` is not
    there. Everything else is kept byte for byte. A ``begin`` without its ``end`` after it, or a marker twice, is
    refused: the document's owner decides, nothing is deleted."""
    if not section.startswith(begin) or end not in section:
        raise ValueError("the section must start with its begin marker and hold its end marker")
    if document.count(begin) > 1 or document.count(end) > 1:
        raise ValueError(f"{begin!r} or {end!r} appears more than once")
    body = section if section.endswith("\n") else section + "\n"
    start = document.find(begin)
    if start < 0:
        if end in document:
            raise ValueError(f"{end!r} without {begin!r}")
        if not document:
            return body
        return document.rstrip("\n") + "\n\n" + body
    stop = document.find(end, start)
    if stop < 0:
        raise ValueError(f"{begin!r} without {end!r} after it")
    stop += len(end)
    if document[stop : stop + 1] == "\n":
        stop += 1
    return document[:start] + body + document[stop:]


def write_section(doc: Path, begin: str, end: str, section: str) -> None:
    """``replace_section`` on the file ``doc``."""
    doc.write_text(replace_section(doc.read_text(encoding="utf-8"), begin, end, section), encoding="utf-8")
