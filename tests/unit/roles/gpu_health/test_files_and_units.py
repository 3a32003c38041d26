"""gpu_health's files as its install task writes them (defaults, vars and templates in a real ansible-playbook
run): the check and the modules it imports land in one folder and run there; the command runs the check with
the host's settings; the systemd units pass ``systemd-analyze verify``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
ROLE = ROOT / "roles" / "gpu_health"
TEMPLATES = ("gpu-health.sh.j2", "gpu-health.service.j2", "gpu-health.timer.j2")

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  # vars_files win over play vars: the settings of the test come last.
  vars_files:
    - {defaults}
    - {vars_file}
    - {settings}
  tasks:
    - name: Write the file list down
      ansible.builtin.copy:
        content: "{{{{ __gpu_health_script_files | to_json }}}}"
        dest: {out}/files.json
        mode: "0644"
    - name: Render the templates
      ansible.builtin.template:
        src: {templates}/{{{{ item }}}}
        dest: {out}/{{{{ item | regex_replace('[.]j2$', '') }}}}
        mode: "0644"
      loop: {names}
"""


def render(tmp_path: Path, kernel_log: str = "") -> Path:
    """Renders the role's file list and templates into tmp_path/out; the command is tmp_path/out/gpu-health.sh."""
    out = tmp_path / "out"
    out.mkdir(parents=True)
    install_dir = tmp_path / "gpu-health"
    settings = {
        "gpu_health_install_dir": str(install_dir),
        "gpu_health_command": str(out / "gpu-health.sh"),
        "gpu_health_state_dir": str(out / "state"),
        "gpu_health_textfile_dir": str(out / "textfile"),
        "gpu_health_kernel_log": kernel_log,
    }
    (tmp_path / "settings.yml").write_text(json.dumps(settings))
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        textwrap.dedent(
            PLAYBOOK.format(
                defaults=ROLE / "defaults/main.yml",
                vars_file=ROLE / "vars/main.yml",
                settings=tmp_path / "settings.yml",
                out=out,
                templates=ROLE / "templates",
                names=json.dumps(list(TEMPLATES)),
            )
        )
    )
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    install_dir.mkdir()
    for item in json.loads((out / "files.json").read_text()):
        assert Path(item["dest"]).parent == install_dir
        shutil.copy(item["src"], item["dest"])  # as gpu_files writes them: plain files in one folder
    return out


def test_the_check_runs_from_its_folder_through_its_command(tmp_path):
    out = render(tmp_path)
    names = {path.name for path in (tmp_path / "gpu-health").iterdir()}
    assert {"gpu_health.py", "gpu_parsers.py", "gpu_lock.py", "gpu_metrics.py", "xid.yml"} <= names
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}  # no PYTHONPATH: the folder alone must do
    done = subprocess.run(["sh", str(out / "gpu-health.sh"), "--help"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "EXIT STATUS" in done.stdout
    # No nvidia-smi here: the check runs and says it could not check. By hand it only looks (the command's
    # default, --no-record); with --record, as the timer runs it, it still writes its metrics.
    for record, written in (([], False), (["--record"], True)):
        done = subprocess.run(
            ["sh", str(out / "gpu-health.sh"), "--format", "json", *record], capture_output=True, text=True, env=env
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert json.loads(done.stdout)["up"] is False
        textfile = out / "textfile" / "gpu_fleet_health.prom"
        assert textfile.exists() is written
    assert "gpu_fleet_health_up 0" in textfile.read_text()


def test_the_kernel_log_option_is_passed_only_when_set(tmp_path):
    assert "--kernel-log" not in render(tmp_path / "unset").joinpath("gpu-health.sh").read_text()
    text = render(tmp_path / "set", kernel_log="/var/log/kern.log").joinpath("gpu-health.sh").read_text()
    assert "--kernel-log /var/log/kern.log" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None and not os.environ.get("CI"), reason="no systemd-analyze")
def test_the_systemd_units_verify(tmp_path):
    out = render(tmp_path)
    (out / "gpu-health.sh").chmod(0o755)  # ExecStart must name an executable
    units = [str(out / "gpu-health.service"), str(out / "gpu-health.timer")]
    done = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True)
    assert (done.returncode, done.stderr.strip()) == (0, ""), done.stdout + done.stderr
    assert (
        "ExecStart=" + str(out / "gpu-health.sh") + " --record --format text"
        in (out / "gpu-health.service").read_text()
    )
    timer = (out / "gpu-health.timer").read_text()
    assert "OnUnitInactiveSec=5min" in timer
