"""tf_venv's tasks/pip.yml after pip fails, in a real ansible-playbook run on localhost: a venv the run made
goes (a folder that was there before stays, emptied), a venv that was there before keeps what it held, the
wheels pushed for it go, and the stop says which. pip fails for real: the lock pins a distribution that the
empty wheel folder (pip.conf: no-index, find-links) does not hold. One run holds the three cases, each in a
block whose rescue keeps the stop in a file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]

HEAD = """\
- hosts: localhost
  gather_facts: false
  vars_files:
    - {root}/roles/tf_venv/defaults/main.yml
    - {root}/roles/tf_venv/vars/main.yml
  tasks:
"""
CASE = """\
    - name: Case {case}
      block:
        - name: Run the role's pip tasks
          ansible.builtin.include_tasks: {root}/roles/tf_venv/tasks/pip.yml
          vars:
            __tf_venv_stack:
              name: tf-test
              venv: "{venv}"
              tensorflow: {{version: "2.12.1"}}
              python: {{version: "3.11.2"}}
            __tf_venv_wheel_dir: /controller/wheels/cp311-x86_64
            __tf_venv_lock_plan: {{locked: true}}
            __tf_venv_lock_path: /controller/locks/tensorflow-2.12.1-py3.11.txt
            __tf_venv_current: false
            __tf_venv_has_python: {has_python}
            __tf_venv_had_folder: {had_folder}
            __tf_venv_drift: {{extra: []}}
            __tf_venv_incomplete: []
            __tf_venv_wheelhouse_pushed: true
            tf_venv_wheelhouse: "{wheels}"
            tf_venv_wheelhouse_host_dir: "{wheels}"
            __tf_venv_poll: 1
      rescue:
        - name: Keep the stop
          ansible.builtin.copy:
            content: "{{{{ ansible_failed_result.msg }}}}"
            dest: "{stop}"
            mode: "0644"
"""
LOCK = "no-such-distribution==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
# case -> (the venv had its interpreter before the run, its folder was there before the run)
CASES = {"made": (False, False), "made_in_a_folder": (False, True), "there_before": (True, True)}


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """Run the three cases; return (their stops by case, the folder of each case)."""
    tmp = tmp_path_factory.mktemp("failed-pip")
    text = HEAD.format(root=ROOT)
    for case, (has_python, had_folder) in CASES.items():
        venv, wheels = tmp / case / "venv", tmp / case / "wheels"
        wheels.mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        (venv / "bin" / "pip").symlink_to(Path(sys.executable).with_name("pip"))
        (venv / "pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {wheels}\n")
        (venv / "tf-lock.txt").write_text(LOCK)
        fields = {"root": ROOT, "case": case, "venv": venv, "wheels": wheels, "stop": tmp / case / "stop.txt"}
        text += CASE.format(has_python=has_python, had_folder=had_folder, **fields)
    playbook = tmp / "pip.yml"
    playbook.write_text(textwrap.dedent(text))
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    stops = {case: (tmp / case / "stop.txt").read_text() for case in CASES if (tmp / case / "stop.txt").exists()}
    assert set(stops) == set(CASES), done.stdout
    return stops, tmp


@pytest.mark.parametrize("case", ["made", "made_in_a_folder"])
def test_a_venv_this_run_made_does_not_stay_half_built(failed, case):
    stops, tmp = failed
    venv = tmp / case / "venv"
    assert "pip could not install the lock tensorflow-2.12.1-py3.11.txt into" in stops[case]
    # A folder that was there before the run (a mount point, say) stays, empty; else the folder goes.
    if case == "made":
        assert f"The venv {venv} that this run made was removed" in stops[case]
        assert not venv.exists()
    else:
        assert f"{venv} was an empty folder before this run: the venv this run made in it was removed" in stops[case]
        assert list(venv.iterdir()) == []


def test_a_venv_that_was_there_before_keeps_what_it_held(failed):
    stops, tmp = failed
    venv = tmp / "there_before" / "venv"
    assert f"{venv} was there before this run and keeps what it held" in stops["there_before"]
    assert (venv / "bin" / "python").exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_wheels_pushed_for_it_are_removed(failed, case):
    stops, tmp = failed
    assert not (tmp / case / "wheels").exists()
    assert f"The wheels pushed to {tmp / case / 'wheels'} for it were removed." in stops[case]
