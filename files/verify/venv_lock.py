"""Compare this venv with its dependency lock and print one JSON document (or a short line).

Run with the TensorFlow venv's interpreter: the distributions compared are the ones that
interpreter sees (``importlib.metadata.distributions()``, what ``pip freeze`` lists), and the lock is
``<venv>/tf-lock.txt``, which tf_venv pushes there and installs with ``pip install
--require-hashes --no-deps``::

    /opt/tensorflow/2.12/bin/python /opt/gpu-verify/venv_lock.py --format table

gpu_verify.py runs the same check (:func:`check`) and puts the document under ``lock``::

    {"path", "sha256": hex | null, "pins": int | null, "ok": true | false | null,
     "drift": null | {"missing": [{"name", "locked"}], "changed": [{"name", "locked", "installed"}],
                      "extra": [{"name", "installed"}], "lines": [str]},
     "note": str | null, "problems": [{"check": "lock", "cause", "fix"}]}

``ok`` is null when there is no lock to compare with (a venv installed unlocked, with
tf_venv_require_lock false, or before 0.11.0): then ``note`` says so and nothing is judged. The
comparison itself is ``gpu_lock.lock_drift`` (names PEP 503 normalised; pip, setuptools, wheel and
distribute only when the lock names them).

Exit codes: 0 the venv matches its lock (or has none), 1 it differs or the lock is unreadable,
2 usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from gpu_lock import VENV_LOCK_FILE, lock_drift, parse_lock, short_digest
from verify_common import EXIT_CHECK_FAILED, EXIT_OK, problem

DEFAULT_LOCK = os.path.join(sys.prefix, VENV_LOCK_FILE)
RESTORE_FIX = (
    "Rerun the playbook (site.yml, or playbooks/tensorflow.yml --limit <host>) to restore the lock: tf_venv "
    "removes what the lock does not name and installs exactly its pins; install packages through "
    "tf_venv_extra_packages and a lock that holds them, not by hand"
)


def installed_distributions() -> dict[str, str]:
    """``{name: version}`` of every distribution this interpreter sees (a broken one without a
    name is left out)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name] = dist.version
    return found


def lock_section(path: str, lock_text: str | None, installed: dict[str, str]) -> dict[str, Any]:
    """The document's ``lock`` section for a lock's text (None: no lock file) and what the venv holds."""
    if lock_text is None:
        return {
            "path": path,
            "sha256": None,
            "pins": None,
            "ok": None,
            "drift": None,
            "note": f"no lock at {path}: the venv was installed without one (tf_venv_require_lock false, or before 0.11.0)",
            "problems": [],
        }
    sha256 = hashlib.sha256(lock_text.encode("utf-8")).hexdigest()
    pins = parse_lock(lock_text)
    drift = lock_drift(pins, installed)
    problems = []
    if not drift["ok"]:
        problems.append(
            problem(
                "lock",
                f"The venv differs from its lock {path} (sha256 {short_digest(sha256)}): {'; '.join(drift['lines'])}.",
                RESTORE_FIX,
            )
        )
    if not pins:
        drift["ok"] = False
        problems.append(problem("lock", f"{path} pins nothing (not a lock made by tools/locks.py).", RESTORE_FIX))
    return {
        "path": path,
        "sha256": sha256,
        "pins": len(pins),
        "ok": not problems,
        "drift": drift,
        "note": None,
        "problems": problems,
    }


def check(path: str = DEFAULT_LOCK) -> dict[str, Any]:
    """Read the lock at ``path`` and compare it with this interpreter's distributions."""
    try:
        with open(path, encoding="utf-8") as handle:
            text: str | None = handle.read()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as error:
        cause = f"The venv's lock {path} cannot be read: {error}."
        section = {"path": path, "sha256": None, "pins": None, "ok": False, "drift": None, "note": None}
        return dict(section, problems=[problem("lock", cause, RESTORE_FIX)])
    return lock_section(path, text, installed_distributions())


def format_line(section: dict[str, Any]) -> str:
    """One line for people: ``lock tf-lock.txt sha256 0123456789ab, 45 pins: matches``."""
    where = f"lock {section['path']}"
    if section["ok"] is None:
        return f"{where}: not compared ({section['note']})"
    head = f"{where} sha256 {short_digest(section['sha256'])}, {section['pins']} pins"
    if section["ok"]:
        return f"{head}: the venv matches it"
    return f"{head}: " + ("; ".join(p["cause"] for p in section.get("problems") or []) or "the venv differs from it")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        description="Compare this venv's distributions with its dependency lock; print JSON (or a line).",
        epilog="Exit codes: 0 matches (or no lock), 1 differs or unreadable, 2 usage error.",
    )
    parser.add_argument("--lock", default=DEFAULT_LOCK, help=f"the lock (default {DEFAULT_LOCK})")
    parser.add_argument("--format", choices=("json", "table"), default="json", help="stdout format (default json)")
    args = parser.parse_args(argv)
    section = check(args.lock)
    print(format_line(section) if args.format == "table" else json.dumps(section, indent=2, sort_keys=True))
    return EXIT_CHECK_FAILED if section["ok"] is False else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
