"""The oldest and the newest ansible-core the collection supports, installed for the tests that run under them.

Each release line has its lock, tests/requirements/ansible-core-<X.Y>.txt (hashes included), and the
CPython it runs on here: 2.16 (what Automation Platform 2.5 ships) on this machine's Python 3.11, 2.21
(which needs Python 3.12 or later) on Debian 13's Python 3.13, in a container of the Debian 13 sandbox
image. ``install`` puts a line into build/ansible-core/<X.Y>/ with ``pip install --target`` for that
Python's wheels, once: a folder whose stamp holds the lock's digest is kept. It is run as
``python3 -m ansible <tool>`` (ansible-core's own ``python -m ansible``) with the folder first on
``sys.path``, which needs no virtual environment inside the container; ``launch`` puts it there
without PYTHONPATH, which the local connection would pass on to the host's own Python commands.

Usage: python tests/ansible_cores.py X.Y     install that line if needed, print its folder
Exit codes: 0 done; 1 pip failed; 2 unknown release line.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvidia"))

import retry
from nvidia_files import locked

REQUIREMENTS = ROOT / "tests" / "requirements"
INSTALLS = Path(os.environ.get("GPU_TEST_ANSIBLE_CORES", ROOT / "build" / "ansible-core"))
# Release line -> the CPython X.Y it runs on in the tests.
PYTHON = {"2.16": "3.11", "2.21": "3.13"}
OLDEST, NEWEST = "2.16", "2.21"
# Where a line's folder is mounted in a container.
CONTAINER_DIR = "/opt/ansible-core"


def requirements(line: str) -> Path:
    return REQUIREMENTS / f"ansible-core-{line}.txt"


def install(line: str) -> Path:
    """The folder holding ansible-core ``line`` and its dependencies for its Python, installed if needed."""
    lock = requirements(line)
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    folder = INSTALLS / line
    stamp = folder / ".lock-sha256"
    # Two parts of one run may want the same line at once (sanity:newest and integration:debian13):
    # the second waits for the first's install instead of removing it midway.
    with locked(INSTALLS, f"install-{line}"):
        if stamp.is_file() and stamp.read_text().strip() == digest:
            return folder
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        retry.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--require-hashes", "-r", str(lock),
             "--target", str(folder), "--only-binary=:all:", "--implementation=cp", f"--python-version={PYTHON[line]}",
             "--platform=manylinux2014_x86_64", "--platform=manylinux_2_17_x86_64", "--platform=linux_x86_64"],
        )  # fmt: skip
        stamp.write_text(digest + "\n")
    return folder


def launch(tool: str, folder: str, python: str = "python3") -> list[str]:
    """``ansible-<tool>`` (playbook, galaxy, test, ...) as ``<python> -m ansible <tool>`` with ``folder``
    (a line's install, as the machine that runs it sees it) first on ``sys.path``."""
    code = f"import runpy, sys; sys.path.insert(0, {folder!r}); runpy.run_module('ansible', run_name='__main__', alter_sys=True)"
    return [python, "-c", code, tool]


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PYTHON:
        print(f"usage: {sys.argv[0]} {{{','.join(PYTHON)}}}", file=sys.stderr)
        sys.exit(2)
    try:
        print(install(sys.argv[1]))
    except (subprocess.CalledProcessError, retry.RetryError) as exc:
        print(f"ansible_cores: the install failed: {exc}", file=sys.stderr)
        sys.exit(1)
