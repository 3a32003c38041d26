"""gpu_verify's script list as its install task reads it (vars/main.yml, in a real ansible-playbook
run): every script of files/verify and the shared modules of plugins/module_utils they import by
name, into one folder, where each script then runs with no PYTHONPATH of ours."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars_files:
    - {defaults}
    - {vars_file}
  vars:
    gpu_verify_install_dir: /opt/gpu-verify
  tasks:
    - name: Write the files down
      ansible.builtin.copy:
        content: "{{{{ __gpu_verify_script_files | to_json }}}}"
        dest: {out}
        mode: "0644"
"""


def script_files(tmp_path: Path) -> list[dict]:
    playbook = tmp_path / "files.yml"
    role = ROOT / "roles" / "gpu_verify"
    playbook.write_text(
        textwrap.dedent(
            PLAYBOOK.format(defaults=role / "defaults/main.yml", vars_file=role / "vars/main.yml", out=tmp_path / "out")
        )
    )
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((tmp_path / "out").read_text())


def test_the_scripts_and_the_shared_modules_go_into_one_folder_and_run_there(tmp_path):
    files = script_files(tmp_path)
    names = {Path(item["dest"]).name for item in files}
    scripts = {path.name for path in (ROOT / "files" / "verify").glob("*.py")}
    assert names == scripts | {"gpu_parsers.py", "gpu_lock.py"}
    assert {Path(item["dest"]).parent for item in files} == {Path("/opt/gpu-verify")}
    assert {item["mode"] for item in files} == {"0644"}  # run through a venv's python, not executed
    shared = {Path(item["src"]).name: Path(item["src"]) for item in files if Path(item["src"]).name.startswith("gpu_")}
    assert shared["gpu_parsers.py"].resolve() == ROOT / "plugins/module_utils/gpu_parsers.py"

    folder = tmp_path / "gpu-verify"  # the host's folder, as gpu_files writes it
    folder.mkdir()
    for item in files:
        shutil.copy(item["src"], folder / Path(item["dest"]).name)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    for script in ("gpu_count.py", "venv_lock.py", "gpu_verify.py"):
        done = subprocess.run([sys.executable, script, "--help"], cwd=folder, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{script}: {done.stderr}"
