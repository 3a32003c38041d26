#!/usr/bin/env python3
"""Write the TensorFlow venvs' dependency locks: every distribution pinned, with its hashes.

``make locks`` runs this with no arguments: one lock per row and Python version of
data/locks/targets.yml, written to data/locks/<package>-<version>-py<X.Y>.txt (a package's extras follow
its name: ``tensorflow[and-cuda]`` -> tensorflow-and-cuda-2.18.1-py3.11.txt). tf_venv installs a
stack's venv from its lock with ``pip install --require-hashes --no-deps -r <lock>``.

Each lock is ``uv pip compile --generate-hashes`` of ``<package>==<version>`` (plus ``--extra``
pins) for the hosts' Python and platform (``--python-version``, ``--python-platform``), never this
machine's: uv resolves for a target it does not run on, which pip-compile cannot (it resolves with
the interpreter that runs it). ``--exclude-newer`` makes the result depend on the targets file only,
not on the day it runs. uv documentation, "Locking environments" and the ``uv pip compile``
reference: https://docs.astral.sh/uv/pip/compile/ and https://docs.astral.sh/uv/reference/cli/#uv-pip-compile

Where the index's metadata leaves out a bound that a release needs (``constraints`` in the targets
file), a lock whose resolution holds that distribution is resolved again under the bound (uv's
``--constraint``), and its header says which and why.

A lock for your own stack, with extra packages (then point tf_venv_lock_dir at the folder)::

    tools/locks.py --package tensorflow --tensorflow 2.12.1 --python 3.10 \\
        --extra pandas==2.2.3 --out-dir /srv/tf-locks

Exit codes: 0 locks written (or, with --check, unchanged); 1 uv failed or, with --check, a lock
differs from what the targets make; 2 usage error (bad targets file or arguments, uv not found).
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
from gpu_lock import lock_file_name, normalize_name, package_requirement, python_series, split_package  # noqa: E402

TARGETS = ROOT / "data" / "locks" / "targets.yml"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PINS_FILE = "pins.in"
CONSTRAINTS_FILE = "constraints.txt"
# uv settings a caller's environment could add behind the targets' back (uv reads UV_* variables,
# https://docs.astral.sh/uv/reference/environment/); the network ones (proxy, TLS) are kept.
UV_KEPT = ("UV_CACHE_DIR", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_OFFLINE")


class Lock(NamedTuple):
    """One lock to write."""

    package: str
    tensorflow: str
    python: str
    extras: tuple[str, ...] = ()

    @property
    def file(self) -> str:
        return lock_file_name(self.package, self.tensorflow, self.python)

    @property
    def pins(self) -> list[str]:
        return [package_requirement(self.package, self.tensorflow), *self.extras]


class Constraint(NamedTuple):
    """A bound the index's metadata does not state (the targets file's ``constraints``): ``pin``
    (a requirement, ``ipython<8.23``) for the locks of the TensorFlow releases in ``tensorflow`` (a
    version specifier) whose resolution holds the pin's distribution."""

    pin: str
    tensorflow: str
    why: str

    @property
    def name(self) -> str:
        return normalize_name(Requirement(self.pin).name)

    def applies(self, lock: Lock, resolved: str) -> bool:
        """Whether this constraint is for ``lock``'s release and ``resolved`` (uv's output) holds the
        distribution it bounds."""
        held = {normalize_name(line.split("==")[0]) for line in resolved.splitlines() if line[:1].isalnum()}
        return Version(lock.tensorflow) in SpecifierSet(self.tensorflow) and self.name in held


class Settings(NamedTuple):
    """How every lock is made (the targets file's top-level keys)."""

    index_url: str
    platform: str
    exclude_newer: str
    constraints: tuple[Constraint, ...] = ()


class UsageError(ValueError):
    """A bad targets file or command line."""


def load_targets(path: Path = TARGETS) -> tuple[Settings, list[Lock]]:
    """The settings and the locks of a targets file (see data/locks/targets.yml).

    Raises:
        UsageError: a key is missing, a version is not X.Y.Z, a Python is not X.Y.
    """
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    try:
        constraints = tuple(
            Constraint(str(row["pin"]), str(row["tensorflow"]), " ".join(str(row["why"]).split()))
            for row in data.get("constraints") or []
        )
        for constraint in constraints:
            constraint.applies(Lock("tensorflow", "0.0.0", "3.0"), "")  # a bad pin or specifier raises here
        settings = Settings(str(data["index_url"]), str(data["platform"]), str(data["exclude_newer"]), constraints)
        locks = [
            Lock(str(row["package"]), str(row["tensorflow"]), str(python))
            for row in data["locks"]
            for python in row["python"]
        ]
    except (KeyError, TypeError) as error:
        raise UsageError(f"{path}: missing or malformed key {error}") from None
    except (InvalidRequirement, InvalidSpecifier) as error:
        raise UsageError(f"{path}: a constraint's pin or tensorflow range is malformed: {error}") from None
    for lock in locks:
        check_lock(lock)
    return settings, locks


def check_lock(lock: Lock) -> None:
    """A lock names a package (extras allowed: ``tensorflow[and-cuda]``), an exact TensorFlow release and a
    Python X.Y.

    Raises:
        UsageError: otherwise.
    """
    try:
        split_package(lock.package)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if len(lock.tensorflow.split(".")) != 3 or not lock.tensorflow.replace(".", "").isdigit():
        raise UsageError(f"TensorFlow {lock.tensorflow!r} is not an exact release X.Y.Z (locks pin one release)")
    if python_series(lock.python) != lock.python:
        raise UsageError(f"Python {lock.python!r} is not X.Y")
    for extra in lock.extras:
        if not pinned_exactly(extra):
            raise UsageError(f"--extra {extra!r} is not pinned as name==version (one package, one exact version)")


def pinned_exactly(text: str) -> bool:
    """Whether ``text`` is one requirement ``name==version`` (PEP 508: no marker, no URL, nothing else
    on the line), as pins.in and the lock's header take it."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return False
    specifiers = list(requirement.specifier)
    exact = len(specifiers) == 1 and specifiers[0].operator == "==" and "*" not in specifiers[0].version
    return exact and not (requirement.marker or requirement.url) and text == text.strip() and "\n" not in text


def uv_command(uv: str, settings: Settings, lock: Lock, constrained: bool = False) -> list[str]:
    """The ``uv pip compile`` command line of one lock (run in a folder holding ``pins.in`` and, when
    ``constrained``, ``constraints.txt``)."""
    return [
        uv,
        "pip",
        "compile",
        "--generate-hashes",
        "--no-header",
        "--only-binary",
        ":all:",
        "--python-version",
        lock.python,
        "--python-platform",
        settings.platform,
        "--exclude-newer",
        settings.exclude_newer,
        "--index-url",
        settings.index_url,
        "--no-config",
        "--quiet",
        *(["--constraint", CONSTRAINTS_FILE] if constrained else []),
        PINS_FILE,
    ]


def header(uv_version: str, command: list[str], lock: Lock, constraints: Sequence[Constraint] = ()) -> str:
    """The comment block at the top of a lock: what it is and how it was made (no time stamp)."""
    shown = " ".join(["uv", *command[1:]])
    bounds = "".join(f"#   {CONSTRAINTS_FILE}: {c.pin} ({c.why})\n" for c in constraints)
    return (
        f"# Dependency lock of {' '.join(lock.pins)} for CPython {lock.python} on Linux x86_64:\n"
        "# every distribution pinned, with the sha256 of each of its files on the index.\n"
        f"# Made by `make locks` (tools/locks.py) with {uv_version}, from {PINS_FILE} = {' '.join(lock.pins)}:\n"
        f"#   {shown}\n{bounds}"
        "# Do not edit: change data/locks/targets.yml (or the tools/locks.py arguments) and make it again.\n"
        f"# tf_venv installs it with: pip install --require-hashes --no-deps -r <venv>/tf-lock.txt\n"
    )


def uv_environment() -> dict[str, str]:
    """This process's environment without the UV_* settings that would change a resolution."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_KEPT}


def make_lock(uv: str, uv_version: str, settings: Settings, lock: Lock) -> str:
    """The text of one lock (header and uv's output). Where the resolution holds a distribution a
    constraint of the targets bounds for this release, it is resolved again under the constraints.

    Raises:
        subprocess.CalledProcessError: uv failed (its stderr says why).
    """
    with tempfile.TemporaryDirectory(prefix="tf-lock-") as work:
        Path(work, PINS_FILE).write_text("\n".join(lock.pins) + "\n", encoding="utf-8")
        command = uv_command(uv, settings, lock)
        resolved = _compile(command, work)
        constraints = [c for c in settings.constraints if c.applies(lock, resolved)]
        if constraints:
            Path(work, CONSTRAINTS_FILE).write_text("".join(f"{c.pin}\n" for c in constraints), encoding="utf-8")
            command = uv_command(uv, settings, lock, constrained=True)
            resolved = _compile(command, work)
    return header(uv_version, command, lock, constraints) + resolved


def _compile(command: list[str], work: str) -> str:
    return subprocess.run(command, cwd=work, env=uv_environment(), capture_output=True, text=True, check=True).stdout


def find_uv(given: str | None) -> str:
    """uv: --uv, else the one beside this Python (the project's .venv), else on PATH.

    Raises:
        UsageError: none found.
    """
    beside = Path(sys.executable).with_name("uv")
    found = given or (str(beside) if beside.exists() else shutil.which("uv"))
    if not found:
        raise UsageError("uv not found: run `make venv` (requirements.txt pins it) or pass --uv PATH")
    return found


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Write the TensorFlow venvs' dependency locks (uv pip compile --generate-hashes): every row of "
        "data/locks/targets.yml, or the one lock --package/--tensorflow/--python name.",
        epilog="Exit codes: 0 written (or unchanged with --check), 1 uv failed or a lock differs, 2 usage error.",
    )
    parser.add_argument("--targets", type=Path, default=TARGETS, help="targets file (default data/locks/targets.yml)")
    parser.add_argument("--out-dir", type=Path, help="where the locks go (default: the targets file's folder)")
    parser.add_argument(
        "--package",
        help="one lock: pip package, tensorflow, tensorflow-cpu or tensorflow[and-cuda] (CUDA from NVIDIA's wheels)",
    )
    parser.add_argument("--tensorflow", metavar="X.Y.Z", help="one lock: TensorFlow release")
    parser.add_argument("--python", metavar="X.Y", help="one lock: the hosts' Python")
    parser.add_argument(
        "--extra", action="append", default=[], metavar="NAME==VERSION", help="one lock: a further pin (repeat)"
    )
    parser.add_argument("--check", action="store_true", help="write nothing; fail when a lock differs")
    parser.add_argument("--uv", help="uv executable (default: .venv/bin/uv, else PATH)")
    return parser


def planned(args: argparse.Namespace) -> tuple[Settings, list[Lock], Path]:
    """What to write and where, from the arguments.

    Raises:
        UsageError: a one-lock option is missing, or the targets file is bad.
    """
    settings, locks = load_targets(args.targets)
    one = (args.package, args.tensorflow, args.python)
    if any(one) or args.extra:
        if not all(one):
            raise UsageError("one lock needs --package, --tensorflow and --python together")
        locks = [Lock(args.package, args.tensorflow, args.python, tuple(args.extra))]
        check_lock(locks[0])
    return settings, locks, args.out_dir or args.targets.parent


def write_or_compare(path: Path, text: str, check: bool) -> bool:
    """Write ``text`` to ``path`` (or, with ``check``, compare); True when the file already held it."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if check:
        if old != text:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), str(path), "new"))
        return old == text
    if old != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return old == text


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        settings, locks, out_dir = planned(args)
        uv = find_uv(args.uv)
    except (UsageError, OSError, yaml.YAMLError) as error:
        print(f"locks: {error}", file=sys.stderr)
        return EXIT_USAGE
    uv_version = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split("(")[0]
    status = EXIT_OK
    for lock in locks:
        try:
            text = make_lock(uv, uv_version.strip(), settings, lock)
        except subprocess.CalledProcessError as error:
            print(f"locks: {lock.file}: uv failed: {error.stderr.strip()}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        same = write_or_compare(out_dir / lock.file, text, args.check)
        status = status if same or not args.check else EXIT_FAILED
        print(f"{lock.file}: {'unchanged' if same else ('differs' if args.check else 'written')}")
    return status


if __name__ == "__main__":
    sys.exit(main())
