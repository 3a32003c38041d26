"""A role that reads the resolved stacks, run in a play that did not resolve them first, stops before
anything else with gpu_preflight's message (filter gpu_stacks_unresolved): the roles never resolve the
stacks themselves (playbooks/tasks/stacks.yml does, once per run)."""

from __future__ import annotations

import pytest
import yaml
from helpers import localhost_playbook

# (role, entry point): every entry point that reads the stacks and is reached before any host task.
# Required inputs of a role are given (gpu_artifacts, gpu_verify), so that only the stacks are missing.
REQUIRED = {"gpu_artifacts_controller_dir": "/nonexistent", "gpu_verify_expected_gpu_count": 1}
STOP = "Stop when no earlier task of the run resolved the pinned stacks"
# (role, entry point, the task that stops): a role whose first task reads the stacks stops there (filter
# gpu_stacks_required), the others in a task of their own.
ENTRY_POINTS = [
    ("cuda_toolkit", "main", "Look at the default symlink's path and the files of each toolkit"),
    ("cudnn", "main", "Look at the files of cuDNN in every toolkit tree"),
    ("gpu_artifacts", "main", STOP),
    ("gpu_preflight", "main", "Look at the mounts, installers, GPU processes and what is installed"),
    ("gpu_env", "main", "Put the toolkit on the system library path, on PATH for login shells and on sudo"),
    ("gpu_verify", "main", STOP),
    ("nvidia_driver", "main", "Look at the driver's files"),
    ("tf_venv", "check", STOP),
]


@pytest.mark.parametrize(("role", "entry", "task"), ENTRY_POINTS)
def test_a_role_run_before_the_stacks_are_resolved_stops_naming_the_fix(tmp_path, role, entry, task):
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
    run = localhost_playbook(tmp_path / "play.yml", {"ANSIBLE_HOME": str(tmp_path / ".ansible")})
    assert run.returncode == 2, run.stdout[-2000:]
    # The stopping task is the last one printed, right after the argument spec's.
    assert run.stdout.rsplit("TASK [", 1)[1].startswith(f"gpu_fleet.tf_hosts.{role} : {task}"), run.stdout[-2000:]
    assert f"{role} reads the pinned stacks (gpu_preflight_resolved_stacks, the stack model)" in run.stdout
    assert "changed=0" in run.stdout and "failed=1" in run.stdout
