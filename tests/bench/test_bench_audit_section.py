"""``make bench-audit`` rewrites its own section of docs/benchmarks.md and nothing else (issue 42: it used to
cut every section after its own)."""

from __future__ import annotations

from pathlib import Path

from bench import audit_scale

ROOT = Path(__file__).resolve().parents[2]

BEFORE = "# Benchmarks\n\n## Budget\n\nbudget text\n\n"
AFTER = "## `mutate`'s YAML reading and printing\n\nyaml text\n\n## Lending (issue 36)\n\nlending text\n"


def _section(figure: str) -> str:
    return "\n".join([audit_scale.MARKER, "## Audit at scale", "", f"wall time {figure}", audit_scale.END_MARKER, ""])


def test_a_new_section_replaces_the_old_one_and_keeps_the_sections_after_it(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(BEFORE + _section("18.0 s") + "\n" + AFTER, encoding="utf-8")
    audit_scale.write_section(_section("12.5 s"), doc)
    assert doc.read_text(encoding="utf-8") == BEFORE + _section("12.5 s") + "\n" + AFTER
    # writing again changes nothing more: the section is replaced, never appended a second time
    audit_scale.write_section(_section("12.5 s"), doc)
    assert doc.read_text(encoding="utf-8") == BEFORE + _section("12.5 s") + "\n" + AFTER


def test_a_section_written_before_the_end_marker_ends_at_the_next_heading(tmp_path: Path) -> None:
    legacy = "\n".join([audit_scale.MARKER, "## Audit at scale", "", "wall time 18.0 s", "", ""])
    doc = tmp_path / "benchmarks.md"
    doc.write_text(BEFORE + legacy + AFTER, encoding="utf-8")
    audit_scale.write_section(_section("12.5 s"), doc)
    assert doc.read_text(encoding="utf-8") == BEFORE + _section("12.5 s") + "\n" + AFTER


def test_the_last_section_and_a_missing_one(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(BEFORE + _section("18.0 s"), encoding="utf-8")
    audit_scale.write_section(_section("12.5 s"), doc)
    assert doc.read_text(encoding="utf-8") == BEFORE + _section("12.5 s")
    doc.write_text(BEFORE, encoding="utf-8")
    audit_scale.write_section(_section("12.5 s"), doc)
    assert doc.read_text(encoding="utf-8") == BEFORE + _section("12.5 s")


def test_the_rendered_section_ends_with_its_marker_and_the_doc_has_it() -> None:
    """The section the bench renders carries the end marker, and docs/benchmarks.md has both markers with
    sections after them, which a run keeps."""
    text = audit_scale.section(
        {
            "seconds": 18.0,
            "cpu_seconds": 8.2,
            "rss_mib": 111.0,
            "exit": 1,
            "findings": 55,
            "capacity": {
                "reserved": {"nodes": 500, "gpusAllocatable": 4000},
                "shared": {"nodes": 4500, "gpusAllocatable": 36000},
            },
        },
        {"pod_bytes": 2**20, "finished": 1, "gpu": 1, "pending": 1},
        5000,
        150000,
    )
    assert text.startswith(audit_scale.MARKER) and text.rstrip("\n").endswith(audit_scale.END_MARKER)
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    begin = doc.index(audit_scale.MARKER)
    assert doc.index(audit_scale.END_MARKER) > begin
    assert "\n## " in doc[doc.index(audit_scale.END_MARKER) :]
