"""Docs and code cite sources a reader can follow (upstream repositories, files, versions), never a path on a
developer's machine (issue 46): no tracked file names the workplace's folders."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A developer machine's folders, and the shared notes outside the repository a clone does not have. The envtest
# archive beside the clone (../shared/envtest) is CI's layout, named where CI unpacks it, so it is not here.
MACHINE_PATHS = re.compile(r"/work/|/root/|/Users/|shared/reference")


def tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [
        ROOT / name for name in names if not name.endswith((".png", ".gz", ".xz")) and name != "tests/test_sources.py"
    ]


def test_no_tracked_file_names_a_path_of_the_developers_machine() -> None:
    found = []
    for path in tracked_text_files():
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        found += [
            f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if MACHINE_PATHS.search(line)
        ]
    assert found == []


def test_the_check_finds_such_a_path() -> None:
    assert MACHINE_PATHS.search("Sources: `/work/shared/reference/rocm-facts.md`")
    assert not MACHINE_PATHS.search("xz -dc ../shared/envtest/kubernetes-v1.36.2-linux-amd64.tar.xz")
