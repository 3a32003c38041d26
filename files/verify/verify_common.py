"""Small helpers shared by the GPU verification scripts (stdlib only).

Every check reports failures as *problems*: ``{"check": str, "cause": str, "fix": str}``, one
sentence each, so the fleet report can print them as they are.

Exit codes used by every script in this folder:
    0  all checks passed
    1  a check failed (the JSON output says which, with cause and fix)
    2  usage error (bad command-line arguments)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from typing import Any, Dict

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2

# A run-time alias: typing.Dict because hosts may run Python 3.8, where dict[...] raises.
Problem = Dict[str, str]


def problem(check: str, cause: str, fix: str) -> Problem:
    """Build one problem record.

    Args:
        check: which check failed (``gpu_count``, ``libcuda``, ``libcudart``, ``libcudnn``,
            ``libraries`` (mixed CUDA majors), ``driver``, ``tensorflow``, ``fit``, ``multiworker``,
            ``scaling``).
        cause: what is wrong, with the numbers/paths involved.
        fix: what an administrator should do about it; starts with a capital (it follows the
            cause as a sentence of its own).
    """
    return {"check": check, "cause": cause, "fix": fix[:1].upper() + fix[1:]}


def parse_version(text: str, parts: int, what: str = "version") -> tuple[int, ...]:
    """Parse a dotted version such as ``"11.8"`` or ``"8.6.0"`` into a tuple of ``parts`` ints.

    Extra components (``"8.6.0.163"``) are ignored; missing ones are an error.

    Raises:
        ValueError: the text has fewer than ``parts`` numeric components.
    """
    pieces = str(text).strip().split(".")
    try:
        numbers = tuple(int(p) for p in pieces[:parts])
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a dotted version like {'.'.join(['1'] * parts)}") from None
    if len(numbers) < parts:
        raise ValueError(f"{what} {text!r} needs {parts} components, like {'.'.join(['1'] * parts)}")
    return numbers


def dumps(document: Any) -> str:
    """Serialise ``document`` as indented, key-sorted JSON (stable for diffs and tests)."""
    return json.dumps(document, indent=2, sort_keys=True, default=str)


def print_section(section: dict[str, Any] | None) -> int:
    """Print a check's section as JSON (``null`` when the check does not apply) and return the exit
    code of a script run alone: EXIT_OK unless the section says it is not ``ok``."""
    sys.stdout.write(dumps(section) + "\n")
    return EXIT_OK if section is None or section.get("ok") else EXIT_CHECK_FAILED


def write_json_atomic(path: str, document: Any) -> None:
    """Write ``document`` as JSON to ``path`` through a temp file + rename, so a reader
    (Ansible's fetch) never sees half a file.

    Raises:
        OSError: the folder is not writable.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(dumps(document))
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def tail(text: str | None, limit: int = 2000) -> str:
    """Return the last ``limit`` characters of ``text`` (empty string for None)."""
    if not text:
        return ""
    return text[-limit:]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1; raises argparse.ArgumentTypeError otherwise."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0; raises argparse.ArgumentTypeError otherwise."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (seconds for time limits, a fraction for thresholds, a
    learning rate); raises argparse.ArgumentTypeError otherwise (also for nan and inf)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return value
