"""A role that reads the resolved stacks, run in a play that did not resolve them first, stops before
anything else with gpu_preflight's message (filter gpu_stacks_unresolved): the roles never resolve the
stacks themselves (playbooks/tasks/stacks.yml does, once per run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

# (role, entry point): every entry point that reads the stacks and is reached before any host task.
# Required inputs of a role are given (gpu_artifacts, gpu_verify), so that only the stacks are missing.
REQUIRED = {"gpu_artifacts_controller_dir": "/nonexistent", "gpu_verify_expected_gpu_count": 1}
ENTRY_POINTS = [
    ("cuda_toolkit", "main"),
    ("cuda_toolkit", "check"),
    ("cudnn", "main"),
    ("gpu_artifacts", "main"),
    ("gpu_env", "main"),
    ("gpu_verify", "main"),
    ("tf_venv", "lock"),
]


@pytest.mark.parametrize(("role", "entry"), ENTRY_POINTS)
def test_a_role_run_before_the_stacks_are_resolved_stops_naming_the_fix(tmp_path, role, entry):
    include = {"name": f"gpu_fleet.tf_hosts.{role}", "tasks_from": entry}
    play = [
        {
            "name": "alone",
            "hosts": "all",
            "gather_facts": False,
            "vars": REQUIRED,
            "tasks": [{"name": "the role alone", "ansible.builtin.include_role": include}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_HOME=str(tmp_path / ".ansible"),
    )
    run = subprocess.run(
        [str(PLAYBOOK), str(tmp_path / "play.yml"), "-i", "localhost,", "-c", "local"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout[-2000:]
    assert "Stop when no earlier task of the run resolved the pinned stacks" in run.stdout
    assert f"{role} reads the pinned stacks that gpu_preflight resolves" in run.stdout
    assert "changed=0" in run.stdout and "failed=1" in run.stdout
