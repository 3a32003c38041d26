"""House rule: comments and docs cite public sources only.

A citation names a URL or a public document (title and section, a man page, a file of a public
repository), never private notes the repository does not have and never a path of a local machine.
This test fails when a tracked file mentions the private notes (a numbered "reference section",
"nvidia-tensorflow-facts", "shared/reference") or a path under the workplace's own top folder
(``WORK`` below; spelled in pieces here so that this file does not trip a plain grep for it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

WORK = "/" + "work/"
FORBIDDEN = [
    ("a citation of the private notes", re.compile(r"reference section", re.IGNORECASE)),
    ("a citation of the private notes", re.compile(r"nvidia-tensorflow-facts", re.IGNORECASE)),
    ("a path into the private notes", re.compile(r"shared/reference", re.IGNORECASE)),
    # WORK at the start of a path: not inside a URL or another path (a "work/" inside a URL is fine).
    ("a path of a local machine", re.compile(r"(?<![\w./~-])" + re.escape(WORK))),
]


def offences(name: str, text: str) -> list[str]:
    """``"<file>:<line>: <what> (<text>)"`` for each forbidden mention in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in FORBIDDEN:
            if pattern.search(line):
                found.append(f"{name}:{number}: {what} ({line.strip()[:120]})")
    return found


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    result = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, text=True)
    return [name for name in result.stdout.split("\0") if name and name != SELF]


def test_tracked_files_cite_public_sources_only():
    found = []
    for name in tracked_files():
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files carry no citations
        found.extend(offences(name, text))
    assert not found, "cite the public source (URL, or document title and section) instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "# minimum driver (reference " + "section 2.1)",
        "(reference ``nvidia-tensorflow-facts.md`` section 5.2)",
        "# see ../shared/" + "reference/notes.md",
        f"    path: {WORK}main/build",
        f'CACHE = "{WORK}cache"',
    ],
)
def test_the_check_catches_private_citations(line):
    assert offences("x.py", f"first line\n{line}\n") and offences("x.py", line)[0].startswith("x.py:1: ")


@pytest.mark.parametrize(
    "line",
    [
        "# CUDA Toolkit Release Notes, https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html",
        "# see https://example.org" + WORK + "item and docs" + WORK + "notes.md",
        "# the API reference of tf.sysconfig",
        'BACKUP = "/root/fault-backup"',
    ],
)
def test_the_check_lets_public_citations_pass(line):
    assert offences("x.py", line) == []
