"""tf_venv with a stack whose package has extras (``tensorflow[and-cuda]``: CUDA from NVIDIA's wheels): the lock it
installs from and the controller's fetch of that lock's wheels (tf_venv_wheels_from: controller), as vars/main.yml
and tasks/wheels.yml evaluate them, in a real ansible-playbook run."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import yaml
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
LOCK = ROOT / "data" / "locks" / "tensorflow-and-cuda-2.18.1-py3.11.txt"

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars_files:
    - {defaults}
    - {vars_file}
    - {settings}
  tasks:
    - name: Write what the stack installs from and what the controller fetches
      ansible.builtin.copy:
        content: >-
          {{{{ {{'plan': __tf_venv_lock_plan, 'need': __tf_venv_wheel_need, 'push': __tf_venv_wheel_push | bool,
               'argv': __tf_venv_wheel_need | gpu_fleet.tf_hosts.gpu_venv_download_argv('python3')}} | to_json }}}}
        dest: {result}
        mode: "0644"
"""


def _settings(tmp_path: Path, package: str) -> dict:
    """The inventory's settings (a later vars file than the role's defaults, so they win)."""
    return {
        "ansible_facts": {"architecture": "x86_64"},
        "tf_venv_lock_dir": str(LOCK.parent),
        "tf_venv_wheels_from": "controller",
        "tf_venv_wheel_cache_dir": str(tmp_path / "cache"),
        "__tf_venv_stack": {
            "name": "tf2.18-wheels",
            "venv": "/opt/tensorflow/2.18-wheels",
            "tensorflow": {"version": "2.18.1", "package": package},
            "python": {"version": "3.11.2"},
        },
    }


def _run(tmp_path: Path, package: str) -> dict:
    settings, result = tmp_path / "settings.yml", tmp_path / "result.json"
    settings.write_text(yaml.safe_dump(_settings(tmp_path, package)))
    playbook = tmp_path / "wheels.yml"
    playbook.write_text(
        textwrap.dedent(
            PLAYBOOK.format(
                defaults=ROOT / "roles/tf_venv/defaults/main.yml",
                vars_file=ROOT / "roles/tf_venv/vars/main.yml",
                settings=settings,
                result=result,
            )
        )
    )
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(result.read_text())


def test_a_stack_with_extras_installs_from_its_lock_and_the_controller_fetches_that_locks_wheels(tmp_path):
    result = _run(tmp_path, "tensorflow[and-cuda]")
    assert result["plan"] == {"locked": True, "problem": ""}
    need = result["need"]
    assert Path(need["lock"]).name == LOCK.name == need["name"]
    assert need["dir"].startswith(f"{tmp_path}/cache/") and need["dir"].endswith("/cp311-x86_64")
    assert result["push"] is True
    argv = result["argv"]
    assert Path(argv[argv.index("-r") + 1]).name == LOCK.name and "--require-hashes" in argv and "--no-deps" in argv
