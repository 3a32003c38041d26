"""gpu_bundle with a stack whose package has extras (``tensorflow[and-cuda]``: CUDA from NVIDIA's wheels): the lock
its wheels are downloaded from, as vars/main.yml evaluates it, in a real ansible-playbook run."""

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
    - name: Write the stack's lock, whether the bundle downloads from it, and the download
      ansible.builtin.copy:
        content: >-
          {{{{ {{'lock': __gpu_bundle_lock, 'plan': __gpu_bundle_plan,
               'argv': __gpu_bundle_download | gpu_fleet.tf_hosts.gpu_bundle_pip_download(['-r', __gpu_bundle_lock])}}
             | to_json }}}}
        dest: {result}
        mode: "0644"
"""


def test_the_bundle_downloads_a_stack_with_extras_from_its_lock(tmp_path):
    settings, result = tmp_path / "settings.yml", tmp_path / "result.json"
    stack = {
        "name": "tf2.18-wheels",
        "venv": "/opt/tensorflow/2.18-wheels",
        "tensorflow": {"version": "2.18.1", "package": "tensorflow[and-cuda]"},
        "python": {"version": "3.11"},
    }
    settings.write_text(
        yaml.safe_dump(
            {"item": stack, "tf_venv_lock_dir": str(LOCK.parent), "gpu_bundle_dir": str(tmp_path / "bundle")}
        )
    )
    playbook = tmp_path / "bundle.yml"
    files = {"defaults": "roles/gpu_bundle/defaults/main.yml", "vars_file": "roles/gpu_bundle/vars/main.yml"}
    playbook.write_text(
        textwrap.dedent(
            PLAYBOOK.format(**{key: ROOT / path for key, path in files.items()}, settings=settings, result=result)
        )
    )
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(result.read_text())
    assert found["lock"] == str(LOCK)
    assert found["plan"] == {"locked": True, "problem": ""}
    argv = found["argv"]
    assert argv[argv.index("-r") + 1] == str(LOCK) and argv[argv.index("--python-version") + 1] == "3.11"
