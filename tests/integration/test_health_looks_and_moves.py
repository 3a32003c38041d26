"""The health check on a converged sandbox host, where a run changes things on purpose and people look by hand
(about 60 s on an idle 2-core machine: one
verification with its fit, and a few runs of the check):

- a run that re-pinned the driver (the baseline still pins the one before, the host runs the new pin) reports the
  host healthy, says what moved - in the run's output and the fleet report - and its verification moves the
  baseline to the new pin, against which the check by hand is healthy;
- the run names the folder its metrics go to, which no node_exporter reads in the sandbox, with the fix;
- a hand run of ``gpu-health`` between two timer runs (``gpu-health --record``, what ``gpu-health.service`` runs)
  leaves the next timer run's Xid finding in place, and that timer run takes it.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from ansible_run import latest_report
from sandbox_hosts import sandbox_inventory, site, start_converged, stop_container

pytestmark = pytest.mark.integration

BASELINE = "/var/lib/gpu-health/baseline.json"
KERNEL_LOG = "/var/log/kern.log"  # the sandbox inventory's gpu_health_kernel_log
PINNED, BEFORE = "520.61.05", "515.65.01"  # the sandbox's driver, and a pin from before the (imagined) re-pin
XID_79 = "NVRM: Xid (PCI:0000:0f:00): 79, pid=48213, name=python3, GPU has fallen off the bus."


def shell(host: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", host, "sh", "-ec", script], capture_output=True, text=True, check=False)


def gpu_health(host: str, *args: str) -> tuple[int, dict]:
    done = shell(host, "gpu-health --format json " + " ".join(args))
    assert done.returncode in (0, 1, 2), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def host():
    name = start_converged("gpu-health-moves")
    yield name
    stop_container(name)


def test_a_driver_the_run_re_pinned_is_moved_healthy_and_then_the_baseline(host, tmp_path):
    repin = f"import json; p = '{BASELINE}'; d = json.load(open(p)); d['driver_version'] = '{BEFORE}'; json.dump(d, open(p, 'w'))"
    assert shell(host, f'python3 -c "{repin}"').returncode == 0
    inventory = sandbox_inventory(tmp_path / "inventory", host)
    run = site(inventory, "-e", f"gpu_verify_report_dir={tmp_path / 'reports'}", playbook="playbooks/verify.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    output = " ".join(run.stdout.split())
    assert f"GPU health of {host}: healthy. Moved on purpose by this run" in output
    assert f"driver {BEFORE} -> {PINNED}" in output
    assert "gpu_fleet_health.prom, but no node_exporter runs on this host" in output  # the sandbox runs none
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in output
    health = json.loads(latest_report(tmp_path / "reports", "inventory").read_text())["hosts"][host]["health"]
    assert (health["status"], health["findings"], health["moved"]) == ("healthy", [], [f"driver {BEFORE} -> {PINNED}"])
    markdown = latest_report(tmp_path / "reports", "inventory", "fleet-report.md").read_text()
    assert f"moved on purpose by this run: driver {BEFORE} -> {PINNED}" in markdown
    assert json.loads(shell(host, f"cat {BASELINE}").stdout)["driver_version"] == PINNED  # the baseline followed
    rc, report = gpu_health(host)
    assert (rc, report["findings"], report["moved"]) == (0, [], [])


def test_a_hand_run_between_two_timer_runs_leaves_the_xid_to_the_next_timer_run(host):
    rc, _ = gpu_health(host, "--record")  # the timer: records the time of the check
    assert rc == 0
    stamp = "up=$(cut -d' ' -f1 /proc/uptime)"
    assert shell(host, f"{stamp}; printf '[%12.6f] gpu-node kernel: {XID_79}\\n' $up >> {KERNEL_LOG}").returncode == 0
    state = shell(host, "cat /var/lib/gpu-health/state.json").stdout
    rc, report = gpu_health(host)  # an administrator looks
    assert rc == 1 and [item["check"] for item in report["findings"]] == ["xid"]
    assert shell(host, "cat /var/lib/gpu-health/state.json").stdout == state
    rc, report = gpu_health(host, "--record")  # the timer's next run still has it
    assert rc == 1 and [item["check"] for item in report["findings"]] == ["xid"]
    assert "79" in report["findings"][0]["cause"]
    prom = shell(host, "cat /var/lib/prometheus/node-exporter/gpu_fleet_health.prom").stdout
    assert 'gpu_fleet_health_xid_events{bus_id="0000:0f:00.0",xid="79"} 1' in prom
    rc, _ = gpu_health(host, "--record")  # and took it: read no more
    assert rc == 0
