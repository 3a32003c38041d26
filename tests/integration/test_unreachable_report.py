"""A host whose container does not exist is in the fleet report with the connection's own message
(podman_pipelined quotes podman's) and the container fix (the callback plugin gpu_fleet.tf_hosts.host_failures, enabled in ansible.cfg)."""

from __future__ import annotations

import json
import uuid

from ansible_run import latest_report
from sandbox_hosts import site


def test_missing_container_is_reported_with_ansibles_message(fresh_host, tmp_path):
    name, inventory = fresh_host
    gone = f"gpu-gone-{uuid.uuid4().hex[:8]}"  # never started
    (inventory / "hosts.yml").write_text(
        "gpu_hosts:\n  hosts:\n"
        f"    {name}:\n      ansible_connection: podman_pipelined\n"
        f"    {gone}:\n      ansible_connection: podman_pipelined\n"
    )
    reports = tmp_path / "reports"
    out = site(inventory, "--tags", "verify", "-e", f"gpu_verify_report_dir={reports}")
    assert out.returncode != 0
    report = json.loads(latest_report(reports, "inventory").read_text())
    (problem,) = report["hosts"][gone]["problems"]
    cause = f"Host unreachable: podman could not run a command in container {gone}: Error: no container"
    assert problem["cause"].startswith(cause), problem
    assert "no such container" in problem["cause"]
    assert f"`podman ps -a --filter name={gone}`" in problem["fix"]
    markdown = latest_report(reports, "inventory", "fleet-report.md").read_text()
    assert cause in markdown
    junit = latest_report(reports, "inventory", "fleet-report.junit.xml").read_text()
    assert f'message="{cause}' in junit
