"""The host's default pointers against the default stack, as a program outside any venv finds them.

The default stack owns ``/usr/local/cuda`` (the cuda_toolkit role's symbolic link) and what a login
shell gets from ``/etc/profile.d`` (the gpu_env role: ``CUDA_HOME`` and the toolkit's ``bin`` on
``PATH``). The system library path is checked by ``libraries.py``: gpu_verify.py runs the default
stack with its venv's own binding off, so the libraries load as any program loads them. Run for the
default stack only::

    python3 /opt/gpu-verify/pointers.py --cuda-root /usr/local/cuda-11.8 --symlink /usr/local/cuda

A default stack whose CUDA comes from NVIDIA's wheels in its venv (``tensorflow[and-cuda]``) has no
toolkit, and the host then has no system CUDA: no link of ours at ``/usr/local/cuda`` (a symbolic
link; a folder there is no pointer of ours), no folder in gpu_env's ``/etc/ld.so.conf.d/gpu-env.conf``
and no ``CUDA_HOME`` or toolkit ``nvcc`` in a login shell, so that nothing shadows the wheels::

    python3 /opt/gpu-verify/pointers.py --wheels --symlink /usr/local/cuda

gpu_verify.py ``--default-symlink`` runs the same check (:func:`check`, ``cuda_root`` None for a wheels
stack) and puts under ``default``::

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
WHEELS_FIX = (
    "Rerun the playbook (site.yml, or site.yml --tags cuda --limit <host>): where the default stack's CUDA comes from "
    "NVIDIA's wheels, cuda_toolkit removes the link {symlink} and gpu_env writes no folder into {ld_conf} and no "
    "CUDA_HOME or toolkit bin into the login shells' profile; remove a CUDA_HOME or PATH set elsewhere (another "
    "/etc/profile.d script) by hand"
)
WHEELS = "the default stack takes CUDA from NVIDIA's wheels in its venv"
# gpu_env's system library path file (gpu_env_ld_conf_path's default).
LD_CONF = "/etc/ld.so.conf.d/gpu-env.conf"
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


def conf_folders(path: str) -> list[str]:
    """The folders a loader configuration file names (ld.so.conf(5): one per line, ``#`` comments); none
    when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line.split("#", 1)[0].strip() for line in handle]
    except (OSError, UnicodeDecodeError):
        return []
    return [line for line in lines if line]


def _toolkit_problems(cuda_root: str, symlink: str, points_at: str | None, view: tuple) -> list[dict[str, str]]:
    """A runfile default: the link, CUDA_HOME and nvcc point at its toolkit ``cuda_root``."""
    cuda_home, nvcc = view
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
    return problems


def _wheels_problems(symlink: str, points_at: str | None, view: tuple, ld_conf: str) -> list[dict[str, str]]:
    """A default whose CUDA comes from NVIDIA's wheels: no link of ours at ``symlink``, no folder in ``ld_conf``,
    no CUDA_HOME and no toolkit's nvcc (one under ``symlink``, /usr/local/cuda*) in a login shell."""
    cuda_home, nvcc = view
    fix = WHEELS_FIX.format(symlink=symlink, ld_conf=ld_conf)
    causes = []
    if os.path.islink(symlink):
        causes.append(f"{symlink} is a link to {points_at}; {WHEELS}, so the host has no default toolkit.")
    folders = conf_folders(ld_conf)
    if folders:
        causes.append(f"{ld_conf} puts {', '.join(folders)} on the system library path; {WHEELS}.")
    if cuda_home:
        causes.append(f"A login shell's CUDA_HOME is {cuda_home}; {WHEELS}.")
    if nvcc and (nvcc.startswith(symlink) or os.path.realpath(nvcc).startswith(symlink)):
        causes.append(f"A login shell finds a CUDA toolkit's nvcc at {nvcc}; {WHEELS}.")
    return [problem("default", cause, fix) for cause in causes]


def check(
    cuda_root: str | None,
    symlink: str,
    view: tuple[str | None, str | None] | None = None,
    ld_conf: str = LD_CONF,
) -> dict[str, Any]:
    """The default pointers against the default stack's toolkit ``cuda_root``, or, with ``cuda_root`` None, against
    a default stack whose CUDA comes from NVIDIA's wheels (``ld_conf``: gpu_env's library path file); ``view`` is
    what a login shell sees (:func:`login_shell_view` when not given)."""
    points_at = os.path.realpath(symlink) if os.path.lexists(symlink) else None
    view = view if view is not None else login_shell_view()
    if cuda_root is None:
        problems = _wheels_problems(symlink, points_at, view, ld_conf)
    else:
        problems = _toolkit_problems(cuda_root, symlink, points_at, view)
    section = {"symlink": symlink, "points_at": points_at, "cuda_home": view[0], "nvcc": view[1]}
    return dict(section, ok=not problems, problems=problems)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        description="Check /usr/local/cuda, a login shell's CUDA_HOME and nvcc (and for a wheels default gpu_env's "
        "library path file) against the default stack.",
        epilog="Exit codes: 0 they serve the default stack, 1 one does not, 2 usage error.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--cuda-root", help="the default stack's toolkit, e.g. /usr/local/cuda-11.8")
    source.add_argument(
        "--wheels",
        action="store_true",
        help="the default stack's CUDA comes from NVIDIA's wheels in its venv: the host must have no system CUDA",
    )
    parser.add_argument("--symlink", default="/usr/local/cuda", help="the default symlink (default /usr/local/cuda)")
    parser.add_argument("--ld-conf", default=LD_CONF, help=f"gpu_env's library path file (default {LD_CONF})")
    args = parser.parse_args(argv)
    section = check(None if args.wheels else args.cuda_root, args.symlink, ld_conf=args.ld_conf)
    return print_section(section)


if __name__ == "__main__":
    sys.exit(main())
