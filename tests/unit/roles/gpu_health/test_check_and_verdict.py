"""gpu_health's assertions in a real ansible-playbook run on localhost, with a stand-in for the check's command:
a check without a report stops the host naming its exit status and error; an unhealthy host passes, named with
its findings, and is published; after the verification an unhealthy host fails only with
gpu_health_fail_on_findings."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import yaml
from helpers import localhost_playbook

UNHEALTHY = {"up": True, "exit_code": 1, "findings": [{"check": "ecc", "cause": "3 ECC errors.", "fix": "Drain it."}]}


def run(tmp_path: Path, script: str, entries: list[str], **settings) -> str:
    command = tmp_path / "gpu-health"
    command.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    command.chmod(0o755)
    tasks = [
        {"name": entry, "ansible.builtin.include_role": {"name": "gpu_fleet.tf_hosts.gpu_health", "tasks_from": entry}}
        for entry in entries
    ]
    here = {"gpu_health_command": str(command), "gpu_health_textfile_dir": str(tmp_path)}
    play = {"hosts": "all", "gather_facts": False, "vars": here | settings}
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play | {"tasks": tasks}]))
    done = localhost_playbook(tmp_path / "play.yml", {"ANSIBLE_HOME": str(tmp_path / ".ansible")})
    return done.stdout + done.stderr


def test_a_check_without_a_report_stops_naming_its_exit_status_and_error(tmp_path):
    out = " ".join(run(tmp_path, "echo boom >&2; exit 3\n", ["check"]).split())
    assert f"{tmp_path}/gpu-health on localhost ended with exit status 3 and no report: boom. Run `" in out
    assert "failed=1" in out


def test_an_unhealthy_host_is_named_and_fails_only_after_its_verification_when_asked(tmp_path):
    script = f"echo '{json.dumps(UNHEALTHY)}'; exit 1\n"
    out = run(tmp_path, script, ["check", "record"], gpu_verify_results={}, gpu_health_fail_on_findings=True)
    summary = "GPU health of localhost: 1 finding(s): [ecc] 3 ECC errors. Fix: Drain it."
    assert f"{summary} (It fails because gpu_health_fail_on_findings is true.)" in " ".join(out.split())
    assert "failed=1" in out
    kept = run(tmp_path, script, ["check", "record"], gpu_verify_results={})
    assert kept.count(summary) == 1 and "failed=0" in kept


def test_main_stops_on_a_bad_option_before_it_writes_anything(tmp_path):
    out = " ".join(run(tmp_path, "exit 0\n", ["main"], gpu_health_interval="every 5 minutes").split())
    assert "gpu_health_interval is every 5 minutes; it must be a systemd time span of at least a minute" in out
    assert "Install the health check, its command and its systemd units" in out
    assert "changed=0" in out and "failed=1" in out


def test_the_runs_check_is_told_what_the_run_pins_and_records_where_no_timer_runs(tmp_path):
    """The run's pins go to the check (a re-pin is moved, not drift); without systemd (no timer) the run's
    check is the one that records, and the move is said."""
    moved = {"up": True, "exit_code": 0, "findings": [], "moved": [{"text": "driver 520.61.05 -> 555.42.06"}]}
    script = f"""printf '%s\\n' "$@" > {tmp_path}/args\necho '{json.dumps(moved)}'\n"""
    driver = {"version": "555.42.06"}
    out = " ".join(run(tmp_path, script, ["check"], gpu_preflight_resolved_driver=driver).split())
    args = (tmp_path / "args").read_text().splitlines()
    assert args[:2] == ["--format", "json"] and args[-1] == "--record", args
    assert json.loads(args[args.index("--intended") + 1])["driver_version"] == "555.42.06"
    assert "healthy. Moved on purpose by this run" in out and "driver 520.61.05 -> 555.42.06" in out
