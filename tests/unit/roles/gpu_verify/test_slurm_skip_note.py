"""gpu_verify says when its Slurm check could not run (playbooks/verify.yml alone: gpu_slurm published nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
NOTE = "Say that the Slurm check did not run"


def _note_task() -> dict:
    tasks = yaml.safe_load((ROOT / "roles/gpu_verify/tasks/main.yml").read_text())
    (task,) = [task for task in tasks if task.get("name") == NOTE]
    return task


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        ({"gpu_slurm_enabled": True}, True),
        (
            {
                "gpu_slurm_enabled": True,
                "gpu_slurm_node_gres": "gpu:a100:2",
                "gpu_slurm_scontrol": {"node": "gpu01", "host": "gpu01"},
            },
            False,
        ),
        ({}, False),
    ],
)
def test_verify_alone_says_the_slurm_check_did_not_run(tmp_path, variables, said):
    playbook = tmp_path / "note.yml"
    play = {"hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": [_note_task()]}
    playbook.write_text(yaml.safe_dump([play]))
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("so Slurm's view of the node was not checked" in " ".join(done.stdout.split())) is said
