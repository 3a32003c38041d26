"""gpu_fleet_report: gpu_verify's report writer run on the controller, its table printed and its summary published
as the job's custom stats, in real ansible-playbook runs against localhost."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_verify import (
    gpu_verify_location_args,
    gpu_verify_report_args,
)
from helpers import localhost_playbook

UNREACHABLE = {"unreachable": True, "error": "ssh: connect to host h2 port 22: No route to host", "failed": None}


def _run(tmp_path: Path, options: list[str], **env: str) -> subprocess.CompletedProcess:
    results = {"h2": dict(UNREACHABLE, connection="ssh")}
    task = {"name": "Report", "gpu_fleet.tf_hosts.gpu_fleet_report": {"options": options, "results": results}}
    play = {"hosts": "localhost", "gather_facts": False, "tasks": [task]}
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    env = {"ANSIBLE_HOME": str(tmp_path / ".ansible"), "ANSIBLE_SHOW_CUSTOM_STATS": "1", **env}
    return localhost_playbook(tmp_path / "play.yml", env)


def _play(tmp_path: Path, options: list[str]) -> tuple[int, str]:
    done = _run(tmp_path, options)
    return done.returncode, done.stdout + done.stderr


def _options(tmp_path: Path, keep: int = 5, dry_run: bool = False) -> list[str]:
    location = {"out_dir": str(tmp_path / "reports"), "keep": keep, "inventory_name": "fleet"}
    settings = {"inventory_hosts": ["h2"], "location_args": gpu_verify_location_args(location), "check_mode": dry_run}
    return gpu_verify_report_args(settings)


def test_the_report_is_written_printed_and_published(tmp_path):
    rc, out = _play(tmp_path, _options(tmp_path))
    assert rc == 0, out
    latest = tmp_path / "reports" / "fleet" / "latest"
    report = json.loads((latest / "fleet-report.json").read_text())
    assert report["hosts"]["h2"]["status"] == "FAIL" and report["hosts"]["h2"]["unreachable"] is True
    # The table, then where it went; the summary as the job's custom stats.
    assert "h2" in out and "FAIL" in out
    assert f"Written to {tmp_path / 'reports' / 'fleet' / report['run_folder']} (JSON, Markdown, HTML, JUnit)" in out
    stats = out[out.index("CUSTOM STATS") :]
    assert "gpu_verify_report_summary" in stats and "failed: 1" in stats and "written: true" in stats


def test_the_table_is_on_stdout_for_people(tmp_path):
    done = _run(tmp_path, _options(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Written to " in done.stdout and "Written to " not in done.stderr


def test_under_the_json_callback_stdout_is_one_document_with_the_table_in_the_result(tmp_path):
    done = _run(tmp_path, _options(tmp_path), ANSIBLE_STDOUT_CALLBACK="json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    (result,) = document["plays"][0]["tasks"][0]["hosts"].values()
    assert any(line.startswith("h2") and "FAIL" in line for line in result["table"]), result["table"]
    assert result["table"][-1].startswith("Written to ") and result["summary"]["failed"] == 1
    # A person still sees the table, on stderr.
    assert "Written to " in done.stderr


def test_a_dry_run_writes_nothing(tmp_path):
    rc, out = _play(tmp_path, _options(tmp_path, dry_run=True))
    assert rc == 0, out
    assert not (tmp_path / "reports").exists()
    assert "Written to" not in out and "FAIL" in out


def test_a_writer_that_fails_fails_the_task_with_its_reason(tmp_path):
    rc, out = _play(tmp_path, _options(tmp_path, keep=0))
    assert rc != 0
    assert "The fleet report could not be written" in out and "--keep is 0; keep at least 1 run" in out


def test_bad_arguments_are_named(tmp_path):
    task = {"gpu_fleet.tf_hosts.gpu_fleet_report": {"options": ["--input", "-"]}}
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    done = localhost_playbook(tmp_path / "play.yml", {"ANSIBLE_HOME": str(tmp_path / ".ansible")})
    assert done.returncode != 0
    assert "gpu_fleet_report: missing required arguments: results" in done.stdout
