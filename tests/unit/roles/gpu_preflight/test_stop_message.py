"""gpu_preflight's stop: every problem found and every note, as sentences (not as a Python list), in a real
ansible-playbook run of check.yml's own stop task over problems given as the host check returns them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
PROBLEMS = [
    {"cause": "4 GPUs expected, 2 seen.", "fix": "Reseat the missing GPUs."},
    {"cause": "Tasks run as deploy, not root.", "fix": "Become root."},
]


def _stop_task() -> dict:
    tasks = yaml.safe_load((ROOT / "roles/gpu_preflight/tasks/check.yml").read_text())
    (stop,) = [task for task in tasks if "ansible.builtin.assert" in task]
    return stop


def _run(tmp_path: Path, problems: list[dict], warnings: list[dict]) -> tuple[int, str]:
    variables = {
        "__gpu_preflight_findmnt_ok": True,
        "__gpu_preflight_host": {"problems": problems, "warnings": warnings, "overridden": []},
        "gpu_preflight_cuda_default_symlink": "/usr/local/cuda",
        "__gpu_preflight_state": {"stat": {}},
    }
    play = {"hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": [_stop_task()]}
    (tmp_path / "stop.yml").write_text(yaml.safe_dump([play]))
    done = localhost_playbook(tmp_path / "stop.yml", {"ANSIBLE_STDOUT_CALLBACK": "json"})
    return done.returncode, done.stdout


def _result(out: str) -> dict:
    return json.loads(out)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_problems_and_notes_of_a_stop_read_as_sentences(tmp_path):
    rc, out = _run(tmp_path, PROBLEMS, [{"cause": "The GPUs differ in model."}])
    assert rc != 0
    assert _result(out)["msg"] == (
        "4 GPUs expected, 2 seen. Reseat the missing GPUs. Tasks run as deploy, not root. Become root. "
        "The GPUs differ in model."
    )


def test_the_notes_of_a_host_that_passes_read_as_sentences(tmp_path):
    rc, out = _run(tmp_path, [], [{"cause": "The GPUs differ in model."}, {"cause": "PCIe x8."}])
    assert rc == 0, out
    assert _result(out)["msg"] == "The GPUs differ in model. PCIe x8."
