"""A host whose container does not exist is in the fleet report with the connection's own message
(podman_pipelined quotes podman's) and the container fix (the callback plugin gpu_fleet.tf_hosts.host_failures, enabled in ansible.cfg);
a host stopped by a preflight check is in it as failed in that check, never as unreachable."""

from __future__ import annotations

import json
import uuid
import xml.etree.ElementTree as ET

from ansible_run import failures, latest_report
from sandbox_hosts import sandbox_inventory, site, start_converged, stop_container


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


def test_a_host_stopped_in_preflight_is_failed_in_check_preflight_in_every_report_format(tmp_path):
    """A second inventory name for a converged container (ansible_host), expecting 64 GPUs, stops at
    gpu_preflight's GPU count check; the first passes, so the verification play writes the report. The
    stopped host is FAIL with the check preflight and its cause "failed (check preflight)" in the JSON,
    text, Markdown, HTML and JUnit reports, and the summary counts no host unreachable."""
    name = start_converged("gpu-stopped")
    try:
        inventory = sandbox_inventory(tmp_path / "inventory", name)
        stopped = f"{name}-stopped"
        hosts = json.loads((inventory / "hosts.yml").read_text())
        hosts["gpu_hosts"]["hosts"][stopped] = {
            "ansible_connection": "podman_pipelined",
            "ansible_host": name,
            "gpu_verify_expected_gpu_count": 64,
        }
        (inventory / "hosts.yml").write_text(json.dumps(hosts))
        reports = tmp_path / "reports"
        out = site(inventory, "--tags", "preflight,verify", "-e", f"gpu_verify_report_dir={reports}")
        assert out.returncode != 0, out.stdout[-3000:]
        report = json.loads(latest_report(reports, "inventory").read_text())
    finally:
        stop_container(name)
    assert report["hosts"][name]["status"] == "PASS", failures(out.stdout)
    host = report["hosts"][stopped]
    assert (host["status"], host["unreachable"]) == ("FAIL", False)
    (problem,) = host["problems"]
    assert problem["check"] == "preflight" and host["rows"][0]["problems"] == "preflight"
    assert problem["cause"].startswith("Host failed (check preflight) before any change, at task "), problem
    assert "64" in problem["cause"]
    assert report["summary"]["unreachable"] == 0 and report["summary"]["failed"] == 1
    assert "2 hosts: 1 passed, 1 failed (0 unreachable)" in out.stdout
    assert f"{stopped} [preflight]: Host failed (check preflight)" in out.stdout
    for kind in ("md", "html"):
        shown = latest_report(reports, "inventory", f"fleet-report.{kind}").read_text()
        assert "failed (check preflight)" in shown and "unreachable</" not in shown and "`unreachable`" not in shown
    junit = ET.parse(latest_report(reports, "inventory", "fleet-report.junit.xml")).getroot()
    cases = [case for case in junit.iter("testcase") if case.get("classname") == stopped]
    (failure,) = [case.find("failure") for case in cases if case.find("failure") is not None]
    assert failure.get("type") == "preflight" and failure.get("message") == problem["cause"]
