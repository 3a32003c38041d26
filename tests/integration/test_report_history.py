"""Reports keep history and merge: a `--limit` run writes a new run folder,
points `latest` at it and keeps the hosts it did not verify with their last result, never as a
pass; `--check` writes nothing on the controller.

One fresh sandbox host (never provisioned: its verification fails for want of a venv, which is
enough here) and a second host that exists only in the inventory, limited out of every run.
"""

from __future__ import annotations

import json
import os
import uuid

from ansible_run import latest_report
from sandbox_hosts import site

SEEN = "2026-01-01T00:00:00Z"
OLD_RUN = "20260101T000000Z"


def _seed_previous_report(reports, other: str) -> None:
    """The last full picture: `other` passed on 1 January (rows as an older report wrote them)."""
    folder = reports / "inventory" / OLD_RUN
    folder.mkdir(parents=True)
    row = {"host": other, "status": "PASS", "driver": "535.104.05", "tensorflow": "2.12.1"}
    previous = {
        "generated_at": SEEN,
        "run_folder": OLD_RUN,
        "hosts": {other: {"status": "PASS", "rows": [row], "problems": [], "results": []}},
        "summary": {"hosts": 1, "passed": 1, "failed": 0, "unreachable": 0},
    }
    (folder / "fleet-report.json").write_text(json.dumps(previous))
    (reports / "inventory" / "latest").symlink_to(OLD_RUN)


def test_a_limited_run_merges_and_check_mode_writes_nothing(fresh_host, tmp_path, monkeypatch):
    name, inventory = fresh_host
    other = f"gpu-limited-out-{uuid.uuid4().hex[:8]}"  # never started: only ever limited out
    (inventory / "hosts.yml").write_text(
        "gpu_hosts:\n  hosts:\n"
        f"    {name}:\n      ansible_connection: podman_pipelined\n"
        f"    {other}:\n      ansible_connection: podman_pipelined\n"
    )
    reports = tmp_path / "reports"
    _seed_previous_report(reports, other)
    monkeypatch.setenv("ANSIBLE_SHOW_CUSTOM_STATS", "true")
    args = ("--limit", name, "-e", f"gpu_verify_report_dir={reports}")

    run = site(inventory, *args, playbook="playbooks/verify.yml")
    assert run.returncode != 0  # the fresh host has no venv: its verification fails
    report = json.loads(latest_report(reports, "inventory").read_text())
    assert os.readlink(reports / "inventory" / "latest") == report["run_folder"] != OLD_RUN
    assert (reports / "inventory" / OLD_RUN / "fleet-report.json").exists()  # history kept
    assert report["limit"] == name and report["merged_from"] == OLD_RUN
    assert report["hosts"][name]["status"] == "FAIL"
    carried = report["hosts"][other]
    assert (carried["status"], carried["last_seen"], carried["last_status"]) == ("NOT IN THIS RUN", SEEN, "PASS")
    assert carried["rows"][0]["status"] == f"not in this run (last seen {SEEN}: PASS)"
    assert {k: report["summary"][k] for k in ("hosts", "passed", "failed", "rechecked", "not_in_run")} == {
        "hosts": 2,
        "passed": 0,
        "failed": 1,
        "rechecked": 1,
        "not_in_run": 1,
    }
    junit = latest_report(reports, "inventory", "fleet-report.junit.xml").read_text()
    assert f'<testcase classname="{other}" name="verification"><skipped message="not in this run' in junit
    stats = run.stdout[run.stdout.index("CUSTOM STATS") :]
    assert '"not_in_run": 1' in stats and f'"run_dir": "{reports / "inventory" / report["run_folder"]}"' in stats
    assert f"Written to {reports / 'inventory' / report['run_folder']} (JSON, Markdown, HTML, JUnit)" in run.stdout

    before = sorted(str(p) for p in reports.rglob("*"))
    checked = site(inventory, *args, "--check", playbook="playbooks/verify.yml")
    assert checked.returncode != 0
    assert "1 not in this run" in checked.stdout, checked.stdout[-4000:]  # the merged table, printed
    assert "CHECK MODE (--check)" in checked.stdout and "(check mode: not written)" in checked.stdout
    assert sorted(str(p) for p in reports.rglob("*")) == before  # and nothing written or deleted
