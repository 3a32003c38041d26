"""Run the project's real playbooks from tests, the way an administrator would.

Shared by tests/integration and the Molecule verify steps (which put tests/ on sys.path).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def run_playbook(playbook: str, inventory: str | Path, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run ``ansible-playbook <ROOT>/<playbook> -i <inventory> <extra...>`` with the project's
    ansible.cfg; returns the finished process (text output). Results are printed as JSON, which
    keeps each message on one line (the YAML format folds long ones), so tests can search them.

    Raises subprocess.TimeoutExpired after ``timeout`` seconds.
    """
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_FORCE_COLOR="0",
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, str(ROOT / playbook), "-i", str(inventory), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def failures(stdout: str) -> str:
    """Each ``fatal:``/``failed:`` line of a playbook's output under its task header: what an assertion
    on a run that failed elsewhere should show, where pytest would cut the whole output short."""
    shown, task = [], ""
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith(("fatal: [", "failed: [")):
            shown += [task, line]
    return "\n".join(shown) or stdout[-2000:]


def latest_report(report_dir: str | Path, inventory: str, name: str = "fleet-report.json") -> Path:
    """``<report_dir>/<inventory>/latest/<name>``: the report of the last completed verification
    against the inventory named ``inventory`` (gpu_verify writes one folder per run and points
    ``latest`` at it). Test inventories are folders named ``inventory``, as is Molecule's."""
    return Path(report_dir) / inventory / "latest" / name
