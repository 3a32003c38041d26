"""Dependency locks of the TensorFlow venvs: names, parsing and the comparison with a venv.

A *lock* is a pip requirements file that pins every distribution a stack's venv holds, each with
its sha256 hashes (``name==version \\ --hash=sha256:...``), made by ``make locks``
(tools/locks.py, ``uv pip compile --generate-hashes``) and kept per TensorFlow package, version
and Python X.Y: ``data/locks/tensorflow-cpu-2.12.1-py3.11.txt``, or for a package with extras
(``tensorflow[and-cuda]``) ``data/locks/tensorflow-and-cuda-2.18.1-py3.11.txt``. tf_venv installs one with
``pip install --require-hashes --no-deps -r <lock>`` and pushes it to ``<venv>/tf-lock.txt``.

Shared by the ``gpu_tf_lock_name``, ``gpu_tf_lock_problem`` and ``gpu_lock_drift`` filters
(controller), tools/locks.py and the verification scripts in files/verify (gpu_verify copies this
file beside them, and they import it as ``gpu_lock``). Standard library
only, Python 3.8+; no function here runs a command or reads a file.

Sources:

- Requirements file format (one requirement per line, ``\\`` continues a line, ``#`` starts a
  comment, ``--hash`` per requirement): pip documentation, "Requirements File Format",
  https://pip.pypa.io/en/stable/reference/requirements-file-format/
- Hash-checking mode (``--require-hashes`` needs every requirement pinned with ``==`` and hashed):
  https://pip.pypa.io/en/stable/topics/secure-installs/#hash-checking-mode
- Name normalisation (runs of ``-``, ``_`` and ``.`` are one ``-``, lower case): PEP 503,
  https://peps.python.org/pep-0503/#normalized-names
- A requirement's extras (``name[extra,...]``, the extra's name spelled like a distribution's) are no part
  of the distribution's name: PEP 508, "Extras", https://peps.python.org/pep-0508/#extras; extras
  are normalised as names are: PEP 685, https://peps.python.org/pep-0685/
- ``pip freeze`` leaves out pip, setuptools, wheel and distribute unless ``--all`` is given
  (https://pip.pypa.io/en/stable/cli/pip_freeze/): ``python -m venv`` puts them there
  (ensurepip), so a venv holds them whether or not the lock names them.
"""

from __future__ import annotations

import re
from typing import Mapping

# The files tf_venv keeps in each venv: the lock it installed from, and the sha256 of the lock
# last installed in full (written only after pip succeeded).
VENV_LOCK_FILE = "tf-lock.txt"
VENV_LOCK_RECORD = "tf-lock.sha256"

# Distributions a venv holds from ``python -m venv`` (ensurepip): compared only when the lock
# names them (pip freeze's default leaves them out).
BOOTSTRAP = frozenset(("pip", "setuptools", "wheel", "distribute"))

_SEPARATORS = re.compile(r"[-_.]+")
# ``name[extras]==version`` then anything (hashes, a marker); the name per PEP 508.
_PINNED = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*===?\s*([^\s;\\]+)")
_SERIES = re.compile(r"^([0-9]+)\.([0-9]+)")
# A package as a stack or tools/locks.py names it: a distribution name (PEP 508) and, optionally, its extras in
# brackets, ``tensorflow[and-cuda]``.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PACKAGE = re.compile(rf"^\s*({_NAME})\s*(?:\[\s*((?:{_NAME}\s*,\s*)*{_NAME})?\s*\])?\s*$")


def normalize_name(name: str) -> str:
    """PEP 503 normalised form of a distribution name: ``Typing_Extensions`` -> ``typing-extensions``."""
    return _SEPARATORS.sub("-", str(name)).lower()


def python_series(version: str) -> str:
    """``3.11.2`` -> ``3.11``; '' when the text does not start with X.Y."""
    match = _SERIES.match(str(version or "").strip())
    return f"{match.group(1)}.{match.group(2)}" if match else ""


def split_package(package: str) -> tuple[str, tuple[str, ...]]:
    """A package and its extras: ``TensorFlow[and_cuda]`` -> ``("tensorflow", ("and-cuda",))``, each name PEP 503
    normalised, the extras sorted and each once (``packaging.requirements.Requirement``'s ``name`` and
    ``extras``, normalised, without that package: the verification scripts run with the standard library only).

    Raises:
        ValueError: the text is not a name with optional extras (a version, a marker or a URL is no package).
    """
    match = _PACKAGE.match(str(package or ""))
    if not match:
        raise ValueError(
            f"package {package!r} is not a distribution name with optional extras in brackets "
            "(tensorflow, tensorflow-cpu, tensorflow[and-cuda])"
        )
    extras = {normalize_name(extra.strip()) for extra in (match.group(2) or "").split(",") if extra.strip()}
    return normalize_name(match.group(1)), tuple(sorted(extras))


def distribution_name(package: str) -> str:
    """The distribution a package installs, without its extras: ``tensorflow[and-cuda]`` -> ``tensorflow``, the
    name ``pip freeze`` and ``importlib.metadata`` list it by (PEP 503 normalised; :func:`split_package`)."""
    return split_package(package)[0]


def lock_file_name(package: str, version: str, python_version: str) -> str:
    """The lock's file name: ``tensorflow-cpu-2.12.1-py3.11.txt`` (package PEP 503 normalised, each extra
    after it as ``-<extra>``: ``tensorflow-and-cuda-2.18.1-py3.11.txt``; the Python version cut to X.Y).

    Raises:
        ValueError: the Python version has no X.Y (the stack's interpreter was not read), or the package is
            not a name with optional extras (:func:`split_package`).
    """
    series = python_series(python_version)
    if not series:
        raise ValueError(f"Python version {python_version!r} has no X.Y to choose a lock by")
    name, extras = split_package(package)
    return f"{'-'.join((name, *extras))}-{version}-py{series}.txt"


def package_requirement(package: str, version: str) -> str:
    """The exact pin of a package at a version, its extras kept: ``tensorflow[and-cuda]==2.18.1`` (names
    normalised, :func:`split_package`)."""
    name, extras = split_package(package)
    return f"{name}{'[' + ','.join(extras) + ']' if extras else ''}=={version}"


def _logical_lines(text: str) -> list[str]:
    """The lines of a requirements file with ``\\`` continuations joined and comments removed."""
    lines: list[str] = []
    pending = ""
    for raw in str(text or "").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            lines.append(line)
    if pending.strip():
        lines.append(pending.strip())
    return lines


def parse_lock(text: str) -> dict[str, str]:
    """``{normalised name: version}`` of every ``name==version`` requirement in a lock's text.

    Option lines (``--index-url``, ``-r``) are skipped; a requirement without ``==`` is not a pin
    and is left out (a lock made by tools/locks.py has none).
    """
    pins: dict[str, str] = {}
    for line in _logical_lines(text):
        match = _PINNED.match(line)
        if match and not line.startswith("-"):
            pins[normalize_name(match.group(1))] = match.group(2)
    return pins


_HASH = re.compile(r"--hash[= ]sha256:([0-9a-fA-F]{64})")
# A wheel's file name: {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl (PEP 427,
# "File name convention"); the distribution's own dashes are written as underscores.
_WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$"
)
# A Python tag: interpreter (py: any, cp: CPython), major version, minor version if any.
_PYTHON_TAG = re.compile(r"^(py|cp)(\d)(\d*)$")


def lock_hashes(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """``{normalised name: (version, sha256 digests)}`` of every pin of a lock's text."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for line in _logical_lines(text):
        match = _PINNED.match(line)
        if match and not line.startswith("-"):
            digests = frozenset(h.lower() for h in _HASH.findall(line))
            found[normalize_name(match.group(1))] = (match.group(2), digests)
    return found


def wheelhouse_problems(text: str, wheels: Mapping[str, str]) -> list[str]:
    """The wheels of a wheelhouse (``{file name: sha256}``) that are a pinned release but not a file
    the lock lists a hash for, each named with both digests. Other files (other releases, other
    distributions, sdists) are left alone: pip installs only what the lock pins, by hash."""
    pins = lock_hashes(text)
    problems = []
    for name, digest in sorted(wheels.items()):
        match = _WHEEL.match(name)
        if not match:
            continue
        version, digests = pins.get(normalize_name(match.group("name")), (None, frozenset()))
        if version == match.group("version") and str(digest).lower() not in digests:
            listed = ", ".join(sorted(d[:16] for d in digests)) or "none"
            problems.append(
                f"{name} is not the file the lock pins: its sha256 is {str(digest)[:16]}…, the lock lists "
                f"{listed} for {match.group('name')}=={version}"
            )
    return problems


def _python_fits(python_tags: str, abi_tags: str, series: str) -> bool:
    """Whether CPython ``series`` (X.Y) takes a wheel of these Python and ABI tags (dot-separated
    alternatives): ``pyX``/``pyXZ`` (Z <= Y) with ABI ``none``, ``cpXY`` with ``cpXY``, ``abi3`` or
    ``none``, ``cpXZ`` (Z < Y) with ``abi3`` - the tags pip accepts (PEP 425, PEP 384; packaging.tags,
    cpython_tags and compatible_tags)."""
    major, minor = (series.split(".") + [""])[:2]
    abis = set(abi_tags.split("."))
    for tag in python_tags.split("."):
        match = _PYTHON_TAG.match(tag)
        if not match or match.group(2) != major:
            continue
        kind, tag_minor = match.group(1), match.group(3)
        if kind == "py" and "none" in abis and (not tag_minor or int(tag_minor) <= int(minor or 0)):
            return True
        if kind == "cp" and tag_minor == minor and abis & {f"cp{major}{minor}", "abi3", "none"}:
            return True
        if kind == "cp" and tag_minor and int(tag_minor) < int(minor or 0) and "abi3" in abis:
            return True
    return False


def _platform_fits(platform_tags: str, arch: str) -> bool:
    """Whether a glibc Linux host of ``arch`` (``uname -m``) takes a wheel of these platform tags: ``any``,
    ``linux_<arch>`` or a manylinux tag of that arch (PEP 600; its glibc floor is not compared)."""
    return any(
        tag == "any"
        or re.match(rf"^(linux|manylinux1|manylinux2010|manylinux2014|manylinux_\d+_\d+)_{re.escape(arch)}$", tag)
        for tag in platform_tags.split(".")
    )


def wheel_fits(file_name: str, python: str = "", arch: str = "") -> bool:
    """Whether pip on CPython ``python`` (X.Y) on a Linux host of ``arch`` installs the wheel ``file_name``;
    an empty ``python`` or ``arch`` is not compared. A name that is no wheel's fits nothing."""
    match = _WHEEL.match(file_name)
    if not match:
        return False
    if python and not _python_fits(match.group("python"), match.group("abi"), python_series(python)):
        return False
    return not arch or _platform_fits(match.group("platform"), arch)


def wheelhouse_missing(text: str, wheels: Mapping[str, str], python: str = "", arch: str = "") -> list[str]:
    """The pins of a lock (``name==version``, sorted) that no wheel of a wheelhouse (``{file name:
    sha256}``) is a locked file of, for CPython ``python`` on ``arch`` (:func:`wheel_fits`; empty: any):
    what ``pip install --no-index --require-hashes`` would not find there. A folder with none of these
    and no :func:`wheelhouse_problems` holds the whole lock."""
    held: set[str] = set()
    pins = lock_hashes(text)
    for name, digest in wheels.items():
        match = _WHEEL.match(name)
        if match and wheel_fits(name, python, arch):
            key = normalize_name(match.group("name"))
            version, digests = pins.get(key, (None, frozenset()))
            if version == match.group("version") and str(digest).lower() in digests:
                held.add(key)
    return [f"{name}=={pins[name][0]}" for name in sorted(set(pins) - held)]


def _pins(lock: object) -> dict[str, str]:
    """A lock given as its text or as parsed pins."""
    if isinstance(lock, Mapping):
        return {normalize_name(name): str(version) for name, version in lock.items()}
    return parse_lock(str(lock or ""))


def lock_drift(lock: object, installed: Mapping[str, str]) -> dict[str, object]:
    """Compare what a venv holds with its lock, ``pip freeze`` style.

    Args:
        lock: the lock's text, or ``{name: version}`` pins.
        installed: ``{name: version}`` of every distribution in the venv (any spelling of the
            names: they are compared PEP 503 normalised).

    Returns:
        ``{"ok": bool, "missing": [{"name", "locked"}], "changed": [{"name", "locked",
        "installed"}], "extra": [{"name", "installed"}], "lines": [str, ...]}``, each list sorted by
        name; ``ok`` is true when all three are empty. pip, setuptools, wheel and distribute are
        compared only when the lock names them (:data:`BOOTSTRAP`). ``lines`` says each difference
        in words (:func:`drift_lines`).
    """
    pins = _pins(lock)
    have = {normalize_name(name): str(version) for name, version in (installed or {}).items() if name}
    missing = [{"name": name, "locked": pins[name]} for name in sorted(set(pins) - set(have))]
    changed = [
        {"name": name, "locked": pins[name], "installed": have[name]}
        for name in sorted(set(pins) & set(have))
        if have[name] != pins[name]
    ]
    extra = [{"name": name, "installed": have[name]} for name in sorted(set(have) - set(pins)) if name not in BOOTSTRAP]
    drift: dict[str, object] = {"missing": missing, "changed": changed, "extra": extra}
    drift["ok"] = not (missing or changed or extra)
    drift["lines"] = drift_lines(drift)
    return drift


def drift_lines(drift: Mapping[str, object]) -> list[str]:
    """Each difference of :func:`lock_drift` in words: ``numpy 1.26.4 installed, the lock has
    1.24.3``, ``keras 2.12.0 missing``, ``pandas 2.2.3 not in the lock``."""
    lines = [f"{d['name']} {d['installed']} installed, the lock has {d['locked']}" for d in drift.get("changed") or []]
    lines += [f"{d['name']} {d['locked']} missing" for d in drift.get("missing") or []]
    lines += [f"{d['name']} {d['installed']} not in the lock" for d in drift.get("extra") or []]
    return lines


def unlocked_requirements(lock: object, requirements: list[str]) -> list[str]:
    """The requirements (``name==version``) that the lock does not pin at that version: what
    ``pip install --require-hashes -r <lock>`` would leave out. A requirement that is not an
    exact pin is never in a lock, so it is returned too."""
    pins = _pins(lock)
    left: list[str] = []
    for requirement in requirements or []:
        match = _PINNED.match(str(requirement).strip())
        if not match or pins.get(normalize_name(match.group(1))) != match.group(2):
            left.append(str(requirement))
    return left


def short_digest(sha256: str | None) -> str:
    """The first 12 hex digits of a sha256 (as the report shows a lock), or '-' for none."""
    return str(sha256)[:12] if sha256 else "-"
