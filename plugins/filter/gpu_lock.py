"""Filters for the TensorFlow venvs' dependency locks (plugins/module_utils/gpu_lock.py).

``gpu_tf_lock_name``: a resolved stack -> the file name of its lock (``tensorflow-cpu-2.12.1-py3.11.txt``;
``tensorflow-and-cuda-2.18.1-py3.11.txt`` for ``tensorflow[and-cuda]``).
``gpu_tf_lock_plan``: a stack's lock text (or none) -> whether tf_venv installs from it, or the
problem (cause and fix) that stops the host in preflight.
``gpu_lock_drift``: a lock's text and a venv's ``{name: version}`` -> what differs.
``gpu_lock_wheelhouse``: a lock's text and the wheelhouse's hashed files -> the wheels that are a pinned
release but not the locked file (with ``complete``, also each pin no wheel there is the locked file of).

Each is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_lock import (
    lock_drift,
    lock_file_name,
    python_series,
    unlocked_requirements,
    wheelhouse_missing,
    wheelhouse_problems,
)

LOCK_TOOL = "tools/locks.py"


def gpu_tf_lock_name(stack: dict, default_package: str = "tensorflow") -> str:
    """``{{ stack | gpu_fleet.tf_hosts.gpu_tf_lock_name(tf_venv_package) }}``: the lock file name of a
    stack resolved by ``gpu_stacks_resolve`` (its package, TensorFlow version and Python X.Y)."""
    tensorflow = stack.get("tensorflow") or {}
    package = tensorflow.get("package") or default_package
    try:
        return lock_file_name(package, str(tensorflow.get("version") or ""), (stack.get("python") or {}).get("version"))
    except ValueError as error:
        raise AnsibleFilterError(f"stack {stack.get('name')}: {error}") from None


def _lock_command(stack: dict, default_package: str, extras: list[str]) -> str:
    """The tools/locks.py command line that makes this stack's lock, quoted for a shell where needed (a package
    with extras, ``'tensorflow[and-cuda]'``, is a pattern to the shell otherwise)."""
    tensorflow = stack.get("tensorflow") or {}
    series = python_series((stack.get("python") or {}).get("version"))
    command = (
        f"{LOCK_TOOL} --package {shlex.quote(str(tensorflow.get('package') or default_package))} "
        f"--tensorflow {tensorflow.get('version')} --python {series}"
    )
    return command + "".join(f" --extra {shlex.quote(str(extra))}" for extra in extras)


def tf_lock_plan(
    lock_text: str | None,
    stack: dict,
    path: str,
    default_package: str = "tensorflow",
    extras: list[str] | None = None,
    require: bool = True,
) -> dict[str, Any]:
    """Whether tf_venv installs ``stack`` from its lock, or why the host must stop.

    Args:
        lock_text: the lock file's text, or None when ``path`` does not exist.
        stack: the resolved stack (``name``, ``tensorflow``, ``python``).
        path: where the lock was looked for (``tf_venv_lock_dir``/``gpu_tf_lock_name``).
        default_package: ``tf_venv_package``.
        extras: ``tf_venv_extra_packages``: a locked install takes only what the lock pins, so
            each must be in it at its version.
        require: ``tf_venv_require_lock``; when false, a stack without a usable lock is
            installed the old way (TensorFlow and the extras pinned, their dependencies not).

    Returns:
        ``{"locked": bool, "problem": str}``: ``problem`` is '' or one message (cause and fix).
    """
    extras = list(extras or [])
    name = stack.get("name")
    if lock_text is None:
        cause = f"Stack {name} has no dependency lock: {path} does not exist."
        fix = (
            f"Make it with `make locks` (add the stack to data/locks/targets.yml) or `{_lock_command(stack, default_package, extras)}"
            " --out-dir <tf_venv_lock_dir>`, or set tf_venv_require_lock: false to install with only TensorFlow pinned."
        )
        return {"locked": False, "problem": f"{cause} {fix}" if require else ""}
    left = unlocked_requirements(lock_text, extras)
    if not left:
        return {"locked": True, "problem": ""}
    cause = (
        f"tf_venv_extra_packages {', '.join(left)} not in stack {name}'s lock {path} at that version; a locked "
        "install takes only what the lock pins (pip --require-hashes --no-deps)."
    )
    fix = (
        f"Make a lock that holds them (`{_lock_command(stack, default_package, extras)} --out-dir <folder>`) and point "
        "tf_venv_lock_dir at that folder, or set tf_venv_require_lock: false to install them unlocked."
    )
    return {"locked": False, "problem": f"{cause} {fix}" if require else ""}


def gpu_lock_drift(lock_text: str, installed: dict[str, str] | None) -> dict[str, Any]:
    """``{{ lock_text | gpu_fleet.tf_hosts.gpu_lock_drift(installed) }}``: see ``lock_drift``."""
    return lock_drift(lock_text, installed or {})


def gpu_lock_wheelhouse(
    lock_text: str, wheels: list[dict[str, Any]] | None, complete: bool = False, python: str = "", arch: str = ""
) -> list[str]:
    """``{{ lock_text | gpu_fleet.tf_hosts.gpu_lock_wheelhouse(query('gpu_fleet.tf_hosts.artifact_sha256', ...)) }}``:
    see ``wheelhouse_problems``; ``wheels`` are the lookup's ``{path, checksum}`` entries. With
    ``complete``, each pin that no wheel is the locked file of (for CPython ``python`` on ``arch`` where
    given) follows (``wheelhouse_missing``): an empty list then means the folder holds the whole lock."""
    found = {posixpath.basename(w["path"]): w.get("checksum") or "" for w in wheels or []}
    problems = wheelhouse_problems(lock_text or "", found)
    if complete:
        problems += [f"no locked wheel of {pin}" for pin in wheelhouse_missing(lock_text or "", found, python, arch)]
    return problems


class FilterModule:
    """Dependency lock filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_tf_lock_name": gpu_tf_lock_name,
            "gpu_tf_lock_plan": tf_lock_plan,
            "gpu_lock_drift": gpu_lock_drift,
            "gpu_lock_wheelhouse": gpu_lock_wheelhouse,
        }
