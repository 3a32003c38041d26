"""The health check between runs, on a converged and verified sandbox host: each fault the field sees is
found by ``gpu-health`` (exit 1, the fault named with its cause and fix), shows in the metrics that
node_exporter serves from its textfile collector, and is gone once undone. The healthy host before and
after shows no alarm at all. NVIDIA's pieces are the stand-ins; each fault is a knob of the stand-in
nvidia-smi's GPU description (tests/fixtures/nvidia/README.md, "Fault knobs"), a kernel log line, or a
change to a venv.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import run_playbook

A = "molecule-faults-a"
# Paths inside the sandbox container, not on the machine that runs the tests.
GPUS_JSON = "/etc/nvidia-standin/gpus.json"
KERNEL_LOG = "/var/log/kern.log"  # the sandbox inventory's gpu_health_kernel_log
BASELINE = "/var/lib/gpu-health/baseline.json"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
VENV = "/opt/tensorflow/2.12"
BACKUP = "/root/health-backup"
PORT = 9910  # node_exporter on the container's loopback only
GPU0, GPU1 = "0000:07:00.0", "0000:0f:00.0"


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    assert not check or done.returncode == 0, f"podman {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def shell(script: str) -> str:
    return podman("exec", A, "sh", "-ec", script).stdout


def edit_gpus(change: str) -> str:
    """Shell that keeps the description and applies ``change`` (Python on ``d``, the description)."""
    code = f"import json; p = '{GPUS_JSON}'; d = json.load(open(p)); {change}; json.dump(d, open(p, 'w'))"
    return f"mkdir -p {BACKUP} && cp {GPUS_JSON} {BACKUP}/gpus.json && python3 -c {shlex.quote(code)}"


RESTORE_GPUS = f"cp {BACKUP}/gpus.json {GPUS_JSON}"


def kernel_lines(*lines: str) -> str:
    """Shell that appends kernel lines stamped just after now (seconds since boot, as the kernel stamps them)."""
    body = "\\n".join(lines)
    return (
        f"mkdir -p {BACKUP} && cp {KERNEL_LOG} {BACKUP}/kern.log && up=$(cut -d' ' -f1 /proc/uptime) "
        f"&& printf '[%12.6f] gpu-node kernel: {body}\\n' $up >> {KERNEL_LOG}"
    )


RESTORE_KERNEL_LOG = f"cp {BACKUP}/kern.log {KERNEL_LOG}"
SIX = f"$(ls -d {VENV}/lib/python3*/site-packages/six-*.dist-info)"

# fault -> (apply, undo, check, bus id or None, words of the cause, the served sample that shows it: name,
# some of its labels, value)
FAULTS = {
    "gpu_gone": (
        edit_gpus("d['gpus'][1]['visible'] = False"),
        RESTORE_GPUS,
        "gpus",
        GPU1,
        ["0000:0f:00.0"],
        ("gpu_fleet_health_gpu_present", {"bus_id": GPU1}, 0),
    ),
    "pcie_x8": (
        edit_gpus("d['gpus'][0]['pcie_link_width_current'] = 8"),
        RESTORE_GPUS,
        "pcie",
        GPU0,
        ["x8", "x16"],
        ("gpu_fleet_health_pcie_link_width", {"bus_id": GPU0}, 8),
    ),
    "nvlink_down": (
        edit_gpus("d['gpus'][0]['nvlink_down'] = 4"),
        RESTORE_GPUS,
        "nvlink",
        GPU0,
        ["8", "12"],
        ("gpu_fleet_health_nvlink_active_links", {"bus_id": GPU0}, 8),
    ),
    "ecc_uncorrectable": (
        edit_gpus("d['gpus'][0]['ecc_uncorrected_volatile'] = 3"),
        RESTORE_GPUS,
        "ecc",
        GPU0,
        ["3", "uncorrectable"],
        ("gpu_fleet_health_ecc_uncorrected_volatile_errors_total", {"bus_id": GPU0}, 3),
    ),
    "retired_pages_pending": (
        edit_gpus("d['gpus'][0]['retired_pages_pending'] = 'Yes'"),
        RESTORE_GPUS,
        "ecc",
        GPU0,
        ["retire"],
        ("gpu_fleet_health_retired_pages_pending", {"bus_id": GPU0}, 1),
    ),
    "row_remap_failure": (
        edit_gpus("d['gpus'][1]['remapped_rows_failure'] = 'Yes'"),
        RESTORE_GPUS,
        "ecc",
        GPU1,
        ["remap"],
        ("gpu_fleet_health_remapped_rows_failure", {"bus_id": GPU1}, 1),
    ),
    "xid_79": (
        kernel_lines("NVRM: Xid (PCI:0000:0f:00): 79, pid=48213, name=python3, GPU has fallen off the bus."),
        RESTORE_KERNEL_LOG,
        "xid",
        GPU1,
        ["79", "fallen off the bus"],
        ("gpu_fleet_health_xid_events", {"xid": "79"}, 1),
    ),
    "xid_48": (
        kernel_lines("NVRM: Xid (PCI:0000:07:00): 48, An uncorrectable double bit error (DBE) has been detected."),
        RESTORE_KERNEL_LOG,
        "xid",
        GPU0,
        ["48"],
        ("gpu_fleet_health_xid_events", {"xid": "48"}, 1),
    ),
    "thermal_slowdown": (
        edit_gpus("d['gpus'][0]['clocks_event_reasons'] = ['hw_thermal_slowdown']"),
        RESTORE_GPUS,
        "clocks",
        GPU0,
        ["thermal"],
        ("gpu_fleet_health_clocks_event_active", {"bus_id": GPU0, "reason": "hw_thermal_slowdown"}, 1),
    ),
    "persistence_off": (
        edit_gpus("d['gpus'][1]['persistence_mode'] = 'Disabled'"),
        RESTORE_GPUS,
        "persistence",
        GPU1,
        ["ersistence"],
        ("gpu_fleet_health_persistence_mode", {"bus_id": GPU1}, 0),
    ),
    "driver_module_mismatch": (
        edit_gpus("d['kernel_module_version'] = '515.65.01'"),
        RESTORE_GPUS,
        "driver",
        None,
        ["differ", "Driver/library version mismatch"],
        ("gpu_fleet_health_finding", {"check": "driver"}, 1),
    ),
    "venv_drift": (
        f"mkdir -p {BACKUP} && mv {SIX} {BACKUP}/",
        f"mv {BACKUP}/six-*.dist-info {VENV}/lib/python3*/site-packages/",
        "venv",
        None,
        ["tf2.12", "six"],
        ("gpu_fleet_health_finding", {"check": "venv"}, 1),
    ),
}


def gpu_health(*args: str, timeout: float = 60) -> tuple[int, dict]:
    """The installed command, as the timer runs it (--record: it writes the metrics and the time of the check); its
    JSON report."""
    done = podman("exec", A, "gpu-health", "--record", "--format", "json", *args, check=False, timeout=timeout)
    assert done.returncode in (0, 1, 2), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


def served_metrics() -> str:
    """What node_exporter serves, read with curl in the container."""
    return shell(f"curl -sf http://127.0.0.1:{PORT}/metrics")


def served_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each gpu_fleet_* sample node_exporter serves (it sorts the labels)."""
    found = []
    for line in text.splitlines():
        match = re.match(r"(gpu_fleet_[a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if match:
            labels = dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            found.append((match.group(1), labels, float(match.group(3))))
    return found


def alarms(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every served sample that says something is wrong: a finding, a check not ok, the check not up."""
    return [
        (name, labels, value)
        for name, labels, value in served_samples(text)
        if (name == "gpu_fleet_health_finding" and value > 0)
        or (name in ("gpu_fleet_health_up", "gpu_fleet_health_check_ok") and value != 1)
    ]


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """A host verified by playbooks/verify.yml, so it has its baseline (test_faults.py leaves one; alone, run it)."""
    if podman("exec", A, "test", "-s", BASELINE, check=False).returncode != 0:
        reports = tmp_path_factory.mktemp("reports")
        run = run_playbook(
            "playbooks/verify.yml",
            os.environ["MOLECULE_INVENTORY_FILE"],
            "--limit",
            A,
            "-e",
            f"gpu_verify_report_dir={reports}",
        )
        assert run.returncode == 0, run.stdout[-4000:]
    return json.loads(shell(f"cat {BASELINE}"))


@pytest.fixture(scope="module")
def exporter(verified):
    """Debian's node_exporter with only its textfile collector, on the container's loopback."""
    podman(
        "exec", "-d", A, "prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{PORT}",
        "--collector.disable-defaults", "--collector.textfile", f"--collector.textfile.directory={TEXTFILE_DIR}",
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while podman(
        "exec", A, "curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{PORT}/metrics", check=False
    ).returncode:
        assert time.monotonic() < deadline, "node_exporter did not answer within 20 s"
        time.sleep(0.5)
    yield
    podman("exec", A, "pkill", "-f", "prometheus-node-exporter", check=False)


def test_the_baseline_is_what_the_verified_host_has(verified):
    assert verified["expected_gpus"] == 2
    assert set(verified["gpus"]) == {GPU0, GPU1}
    assert verified["gpus"][GPU0]["pcie_link_width_max"] == 16
    assert verified["gpus"][GPU0]["nvlink_active_links"] == 12
    assert set(verified["stacks"]) == {"tf2.12"}


def test_the_healthy_host_shows_no_alarm(exporter):
    rc, report = gpu_health()
    assert (rc, report["findings"]) == (0, [])
    text = served_metrics()
    assert "gpu_fleet_health_up 1" in text
    assert "gpu_fleet_verification_passed 1" in text
    assert alarms(text) == []


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_found_named_and_shown(exporter, fault):
    apply, undo, check, bus_id, words, sample = FAULTS[fault]
    shell(apply)
    try:
        rc, report = gpu_health()
        text = served_metrics()
    finally:
        shell(undo)
    ours = [item for item in report["findings"] if item["check"] == check]
    assert rc == 1 and ours, json.dumps(report["findings"], indent=1)
    if bus_id:
        assert bus_id in {item["bus_id"] for item in ours}
    cause = " ".join(item["cause"] for item in ours)
    assert all(word in cause for word in words), cause
    assert all(item["fix"] for item in ours)
    assert f'gpu_fleet_health_check_ok{{check="{check}"}} 0' in text
    name, labels, value = sample
    assert any(
        got == name and labels.items() <= got_labels.items() and got_value == value
        for got, got_labels, got_value in served_samples(text)
    ), (sample, [line for line in text.splitlines() if line.startswith(name)])
    # Undone, the next check is healthy again (the Xid was before this check: not read again).
    rc, report = gpu_health()
    assert (rc, report["findings"]) == (0, [])


def test_a_hanging_nvidia_smi_is_killed_and_named(exporter):
    shell(edit_gpus("d['hang_seconds'] = 120"))
    try:
        started = time.monotonic()
        rc, report = gpu_health("--timeout", "2", timeout=60)
        seconds = time.monotonic() - started
        text = served_metrics()
    finally:
        shell(RESTORE_GPUS)
    assert seconds < 30
    assert rc == 1 and [item["check"] for item in report["findings"]] == ["nvidia_smi"]
    assert "did not answer within 2 s" in report["findings"][0]["cause"]
    assert any(
        name == "gpu_fleet_health_finding" and labels["check"] == "nvidia_smi" for name, labels, _ in alarms(text)
    )
    # nothing left running (the image has no procps: the processes' command lines)
    left = shell(
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | grep '[n]vidia-smi' || true"
    )
    assert left.strip() == "", left


def test_the_textfiles_pass_promtool(exporter, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None and not os.environ.get("CI"):
        pytest.skip("promtool is not installed (make deps installs it)")
    for name in ("gpu_fleet_health.prom", "gpu_fleet_verification.prom"):
        path = tmp_path / name
        path.write_text(shell(f"cat {TEXTFILE_DIR}/{name}"))
        done = subprocess.run(
            [promtool or "promtool", "check", "metrics"], input=path.read_text(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
