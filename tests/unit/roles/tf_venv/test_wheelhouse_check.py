"""tf_venv's wheelhouse check as its task evaluates it: vars/main.yml's wheel list (fileglob, then the
artifact_sha256 lookup) through the gpu_lock_wheelhouse filter, in a real ansible-playbook run."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars_files:
    - {vars_file}
  vars:
    tf_venv_wheelhouse: {wheelhouse}/
    lock_text: "{{{{ lookup('ansible.builtin.file', '{lock}') }}}}"
  tasks:
    - name: Show the problems
      ansible.builtin.debug:
        msg: "PROBLEMS={{{{ lock_text | gpu_fleet.tf_hosts.gpu_lock_wheelhouse(__tf_venv_wheel_files) | to_json }}}}"
"""


def _run(tmp_path: Path, wheels: dict[str, bytes], locked: bytes) -> str:
    house = tmp_path / "wheels"
    house.mkdir()
    for name, data in wheels.items():
        (house / name).write_bytes(data)
    lock = tmp_path / "lock.txt"
    lock.write_text(f"six==1.17.0 \\\n    --hash=sha256:{hashlib.sha256(locked).hexdigest()}\n")
    playbook = tmp_path / "check.yml"
    playbook.write_text(
        textwrap.dedent(PLAYBOOK.format(vars_file=ROOT / "roles/tf_venv/vars/main.yml", wheelhouse=house, lock=lock))
    )
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_an_altered_wheel_is_found_on_the_controller(tmp_path):
    out = _run(tmp_path, {"six-1.17.0-py2.py3-none-any.whl": b"altered"}, locked=b"the real wheel")
    assert 'PROBLEMS=["six-1.17.0-py2.py3-none-any.whl is not the file the lock pins' in out, out


def test_the_locked_wheel_passes(tmp_path):
    out = _run(tmp_path, {"six-1.17.0-py2.py3-none-any.whl": b"the real wheel"}, locked=b"the real wheel")
    assert "PROBLEMS=[]" in out, out
