"""The host's default pointers against the default stack, as a program outside any venv finds them.

The default stack owns ``/usr/local/cuda`` (the cuda_toolkit role's symbolic link) and what a login
shell gets from ``/etc/profile.d`` (the gpu_env role: ``CUDA_HOME`` and the toolkit's ``bin`` on
``PATH``). The system library path is checked by ``libraries.py``: gpu_verify.py runs the default
stack with its venv's own binding off, so the libraries load as any program loads them. Run for the
default stack only::

    python3 /opt/gpu-verify/pointers.py --cuda-root /usr/local/cuda-11.8 --symlink /usr/local/cuda

gpu_verify.py ``--default-symlink`` runs the same check (:func:`check`) and puts under ``default``::

    {"symlink", "points_at": path | null, "cuda_home": str | null, "nvcc": path | null, "ok": bool,
     "problems": [{"check": "default", "cause", "fix"}]}

Exit codes: 0 the pointers serve the default stack, 1 one does not, 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from verify_common import print_section, problem

RERUN_FIX = (
    "Rerun the playbook (site.yml, or site.yml --tags cuda --limit <host>): cuda_toolkit points {symlink} at the "
    "default stack's toolkit and gpu_env writes the login shells' PATH and CUDA_HOME; a pointer changed by hand "
    "is put back"
)
# What a login shell of root gets (/etc/profile and /etc/profile.d), from an environment as bare as cron's.
LOGIN_PROBE = 'printf "%s\\n%s\\n" "${CUDA_HOME:-}" "$(command -v nvcc || true)"'


def login_shell_view(shell: str = "/bin/sh") -> tuple[str | None, str | None]:
    """``(CUDA_HOME, the nvcc found on PATH)`` in a login shell started from a bare environment."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C"}
    try:
        done = subprocess.run(
            [shell, "-lc", LOGIN_PROBE], capture_output=True, text=True, env=env, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    lines = (done.stdout.splitlines() + ["", ""])[:2]
    return lines[0] or None, lines[1] or None


def _same(path: str | None, target: str) -> bool:
    return path is not None and os.path.realpath(path) == os.path.realpath(target)


def check(cuda_root: str, symlink: str, view: tuple[str | None, str | None] | None = None) -> dict[str, Any]:
    """The default pointers against the default stack's toolkit ``cuda_root``; ``view`` is what a
    login shell sees (:func:`login_shell_view` when not given)."""
    points_at = os.path.realpath(symlink) if os.path.lexists(symlink) else None
    cuda_home, nvcc = view if view is not None else login_shell_view()
    fix = RERUN_FIX.format(symlink=symlink)
    problems = []
    if points_at is None:
        problems.append(problem("default", f"{symlink} is missing; the default stack's toolkit is {cuda_root}.", fix))
    elif not _same(symlink, cuda_root):
        cause = f"{symlink} points at {points_at}, not at the default stack's toolkit {cuda_root}."
        problems.append(problem("default", cause, fix))
    if not _same(cuda_home, cuda_root):
        cause = f"A login shell's CUDA_HOME is {cuda_home or 'unset'}, not the default stack's toolkit {cuda_root}."
        problems.append(problem("default", cause, fix))
    wanted = os.path.join(cuda_root, "bin", "nvcc")
    if os.path.exists(wanted) and not _same(nvcc, wanted):
        cause = f"A login shell finds nvcc at {nvcc or 'no path'}, not the default stack's {wanted}."
        problems.append(problem("default", cause, fix))
    section = {"symlink": symlink, "points_at": points_at, "cuda_home": cuda_home, "nvcc": nvcc}
    return dict(section, ok=not problems, problems=problems)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        description="Check /usr/local/cuda and a login shell's CUDA_HOME and nvcc against the default stack.",
        epilog="Exit codes: 0 they serve the default stack, 1 one does not, 2 usage error.",
    )
    parser.add_argument("--cuda-root", required=True, help="the default stack's toolkit, e.g. /usr/local/cuda-11.8")
    parser.add_argument("--symlink", default="/usr/local/cuda", help="the default symlink (default /usr/local/cuda)")
    args = parser.parse_args(argv)
    section = check(args.cuda_root, args.symlink)
    return print_section(section)


if __name__ == "__main__":
    sys.exit(main())
