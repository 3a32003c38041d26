"""Rolling reprovisioning: playbooks/reprovision.yml over three sandbox hosts, one per batch.

The first run takes the hosts in the order busy -> healthy -> failing: the busy host (a stand-in job
on its GPUs, prepare.yml) is skipped and named, the healthy one is drained, reprovisioned, verified
and undrained before the failing one starts, and the failing one (4 GPUs expected, 2 on its PCI bus)
stops in preflight, which stops the rollout (max_fail_percentage 0). The second run takes the failing
host first: the rollout stops after it, and the fleet report says the other two were not reached,
keeping their last results. The drain and undrain hooks are Slurm's commands, answered by a
stand-in scontrol that records each call in SCONTROL_LOG.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import latest_report, run_playbook

BUSY, HEALTHY, FAILING = "molecule-fleet-busy", "molecule-fleet-healthy", "molecule-fleet-failing"
# Paths inside the sandbox containers.
SCONTROL_LOG = "/var/log/scontrol-standin.log"
RUN_LOCK = "/run/gpu-fleet/run.lock"  # gpu_preflight_run_lock_path's default
CUDA = "/usr/local/cuda-11.8"
VENV = "/opt/tensorflow/2.12"
# Both runs' inventories are folders named `inventory`: one report history (gpu_verify names the
# report folder after the -i folder).
INVENTORY = "inventory"
JOB = "python3 pid 4242 (1024 MiB on GPU-89fdc1e1-18b2-f499-c12b-82bcb9bfb3fa)"
GPU_COUNT_CAUSE = "4 GPUs expected"


def inventory(folder: Path, order: list[str], drain: list[str] | None = None) -> Path:
    """An inventory folder with the hosts in ``order``, the sandbox's group_vars, Slurm's drain and
    undrain commands as the hooks (``drain`` replaces the drain command), and on the failing host a GPU
    count its PCI bus does not have."""
    folder.mkdir(parents=True)
    hosts = {
        host: {"ansible_connection": "podman_pipelined"}
        | ({"gpu_verify_expected_gpu_count": 4} if host == FAILING else {})
        for host in order
    }
    hooks = {
        "gpu_rollout_drain_command": [
            "scontrol",
            "update",
            "nodename={{ inventory_hostname }}",
            "state=DRAIN",
            "reason=gpu_fleet reprovision",
        ],
        "gpu_rollout_undrain_command": ["scontrol", "update", "nodename={{ inventory_hostname }}", "state=RESUME"],
    }
    if drain:
        hooks["gpu_rollout_drain_command"] = drain
    (folder / "hosts.yml").write_text(json.dumps({"gpu_hosts": {"hosts": hosts, "vars": hooks}}))
    (folder / "group_vars").symlink_to(ROOT / "inventories/sandbox/group_vars")
    return folder


def rollout(
    tmp: Path, reports: Path, order: list[str], *extra: str, drain: list[str] | None = None
) -> subprocess.CompletedProcess:
    return run_playbook(
        "playbooks/reprovision.yml",
        inventory(tmp / INVENTORY, order, drain),
        "-e",
        "gpu_rollout_serial=1",
        "-e",
        f"gpu_verify_report_dir={reports}",
        *extra,
        timeout=600,
    )


def podman_exec(host: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True)


def scontrol_calls(host: str) -> list[str]:
    done = podman_exec(host, "cat", SCONTROL_LOG)
    return done.stdout.splitlines() if done.returncode == 0 else []


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="module")
def first(tmp_path_factory, reports) -> tuple[subprocess.CompletedProcess, dict]:
    """busy -> healthy -> failing; the run and the last fleet report."""
    run = rollout(tmp_path_factory.mktemp("first"), reports, [BUSY, HEALTHY, FAILING])
    path = latest_report(reports, INVENTORY)
    assert path.exists(), run.stdout[-6000:]
    return run, json.loads(path.read_text())


@pytest.fixture(scope="module")
def second(tmp_path_factory, reports, first) -> tuple[subprocess.CompletedProcess, dict]:
    """failing -> busy -> healthy, after the first run."""
    run = rollout(tmp_path_factory.mktemp("second"), reports, [FAILING, BUSY, HEALTHY])
    return run, json.loads(latest_report(reports, INVENTORY).read_text())


def _position(text: str, needle: str) -> int:
    assert needle in text, f"{needle!r} not in the output"
    return text.index(needle)


def test_batches_run_one_host_at_a_time_in_inventory_order(first):
    run, _report = first
    starts = [_position(run.stdout, f"Batch {n} of 3 ({host})") for n, host in enumerate([BUSY, HEALTHY, FAILING], 1)]
    assert starts == sorted(starts)


def test_the_busy_host_is_skipped_and_named(first):
    run, report = first
    assert f"Skipped: {BUSY}'s GPUs run compute processes: {JOB}." in run.stdout
    entry = report["hosts"][BUSY]
    assert entry["status"] == "SKIPPED"
    assert entry["rows"][0]["status"].startswith(f"skipped: its GPUs run compute processes: {JOB}; it was not drained")
    assert entry["rows"][0]["checks"]["verification"]["passed"] is None
    # Nothing on it was touched: not drained, nothing installed.
    assert scontrol_calls(BUSY) == []
    assert podman_exec(BUSY, "test", "-e", CUDA).returncode != 0
    assert podman_exec(BUSY, "test", "-e", VENV).returncode != 0


def test_the_healthy_host_is_reprovisioned_verified_and_undrained(first):
    _run, report = first
    entry = report["hosts"][HEALTHY]
    assert entry["status"] == "PASS", entry["problems"]
    assert entry["results"][0]["fit"]["loss_end"] < entry["results"][0]["fit"]["loss_start"]
    assert podman_exec(HEALTHY, "test", "-s", "/etc/ld.so.conf.d/gpu-env.conf").returncode == 0  # repaired
    assert scontrol_calls(HEALTHY) == [
        f"update nodename={HEALTHY} state=DRAIN reason=gpu_fleet reprovision",
        f"update nodename={HEALTHY} state=RESUME",
    ]


def test_handlers_run_inside_the_healthy_hosts_batch_before_its_verification(first):
    """nvidia_driver's reboot and gpu_env's ldconfig are handlers: each batch flushes them before
    verifying (a container never reboots, so gpu_env's handler shows it)."""
    run, _report = first
    batch = _position(run.stdout, f"Batch 2 of 3 ({HEALTHY})")
    handler = run.stdout.index("RUNNING HANDLER [gpu_fleet.tf_hosts.gpu_env : Refresh the dynamic linker cache]", batch)
    verify = run.stdout.index("TASK [gpu_fleet.tf_hosts.gpu_verify : Run the checks", batch)
    assert handler < verify < _position(run.stdout, f"Batch 3 of 3 ({FAILING})")


def test_the_failing_host_stops_the_rollout_before_any_change(first):
    run, report = first
    assert run.returncode != 0
    assert GPU_COUNT_CAUSE in run.stdout
    assert re.search(rf"{FAILING}\s*: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=[1-9]", run.stdout)
    entry = report["hosts"][FAILING]
    assert entry["status"] == "FAIL"
    assert GPU_COUNT_CAUSE in entry["problems"][0]["cause"]
    # Its preflight stopped it: never drained, nothing installed.
    assert scontrol_calls(FAILING) == []
    assert podman_exec(FAILING, "test", "-e", CUDA).returncode != 0


def test_the_last_batchs_report_replaced_the_earlier_batchs_that_said_what_was_still_to_come(first, reports):
    """Batch 2 (healthy verified) and batch 3 (failing) each wrote a report (batch 1 verified nothing);
    the last, of the same run id, replaced batch 2's, which said the failing host was not reached yet."""
    _run, report = first
    runs = sorted(p for p in (reports / INVENTORY).iterdir() if p.name != "latest")
    assert [p.name for p in runs] == [report["run_folder"]], runs
    assert report["run_id"].startswith("rollout-") and len(report["supersedes"]) == 1
    assert report["supersedes"][0] < report["run_folder"]
    assert "not reached yet" not in json.dumps(report)
    assert report["hosts"][HEALTHY]["status"] == "PASS"
    assert (report["summary"]["passed"], report["summary"]["failed"], report["summary"]["not_in_run"]) == (1, 1, 1)


def test_the_junit_report_skips_the_busy_host(reports, first):
    suite = ET.parse(latest_report(reports, INVENTORY, "fleet-report.junit.xml")).getroot()
    busy = [case for case in suite.iter("testcase") if case.get("classname") == BUSY]
    # its verification, and its GPU health (a host carried over: never a current result)
    assert [case.get("name") for case in busy] == ["verification", "health"]
    assert all(case.find("skipped") is not None for case in busy)
    assert JOB in busy[0].find("skipped").get("message")


def test_hosts_after_the_failing_one_are_not_reached(second, first):
    run, report = second
    assert run.returncode != 0
    assert "Batch 1 of 3 (molecule-fleet-failing)" in run.stdout
    assert "Batch 2 of 3" not in run.stdout
    generated = first[1]["generated_at"]
    for host, last in ((BUSY, "never: unknown"), (HEALTHY, f"{generated}: PASS")):
        entry = report["hosts"][host]
        assert entry["status"] == "NOT REACHED"
        assert entry["rows"][0]["status"] == (
            f"not reached: the rollout stopped after {FAILING} failed (last seen {last})"
        ), entry["rows"][0]["status"]
    assert report["hosts"][FAILING]["status"] == "FAIL"
    assert (report["summary"]["passed"], report["summary"]["failed"], report["summary"]["not_in_run"]) == (0, 1, 2)
    # The healthy host was not touched again.
    assert len(scontrol_calls(HEALTHY)) == 2


def test_the_markdown_report_names_every_host(reports, second):
    text = latest_report(reports, INVENTORY, "fleet-report.md").read_text()
    for host in (BUSY, HEALTHY, FAILING):
        assert host in text
    assert f"not reached: the rollout stopped after {FAILING} failed" in text


# --- a job that outlives the guard ----------------------------------------------------------------
# The stand-in nvidia-smi lists the `compute_apps` of its GPU description (tests/fixtures/nvidia/README.md).
GPUS_JSON = "/etc/nvidia-standin/gpus.json"
SET_JOBS = (
    "import json, sys; d = json.load(open(sys.argv[1])); "
    "d['compute_apps'] = [dict(pid=5151, process_name='train.py', gpu_uuid=d['gpus'][0]['uuid'], "
    "used_memory_mib=2048)][:int(sys.argv[2])]; json.dump(d, open(sys.argv[1], 'w'))"
)
LATE_JOB = "train.py pid 5151 (2048 MiB on GPU-"
WAIT_TASK = "Wait for the GPUs to have no compute process after the drain"
# The first task of the reprovisioning after the drain that the checks before it do not run.
INSTALL_PHASE = "TASK [gpu_fleet.tf_hosts.cuda_toolkit : Decide what each toolkit and the default symlink need"


def drain_with_a_job(host: str, ends_after: int) -> list[str]:
    """The Slurm drain, after which a job shows on the host's first GPU (it started after the guard
    looked); with ``ends_after`` > 0 the job ends that many seconds later, else it runs on."""
    end = f'(sleep {ends_after}; python3 -c "$0" {GPUS_JSON} 0) >/dev/null 2>&1 </dev/null &' if ends_after else ""
    script = f'scontrol update nodename={host} state=DRAIN reason=gpu_fleet; python3 -c "$0" {GPUS_JSON} 1; {end}'
    return ["sh", "-c", script, SET_JOBS]


@pytest.fixture(scope="module")
def waited(tmp_path_factory, reports, second) -> tuple[subprocess.CompletedProcess, dict, list[str]]:
    """The healthy host alone; a job shows on it at the drain and ends 10 s later (the wait's first
    poll, a task or two after the drain, must still see it)."""
    before = len(scontrol_calls(HEALTHY))
    drain = drain_with_a_job(HEALTHY, ends_after=10)
    run = rollout(tmp_path_factory.mktemp("waited"), reports, [HEALTHY], "-e", "gpu_rollout_drain_poll=2", drain=drain)
    return run, json.loads(latest_report(reports, INVENTORY).read_text()), scontrol_calls(HEALTHY)[before:]


@pytest.fixture(scope="module")
def given_back(tmp_path_factory, reports, waited) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The healthy host alone; a job shows on it at the drain and outlives a 4 s wait."""
    before = len(scontrol_calls(HEALTHY))
    drain = drain_with_a_job(HEALTHY, ends_after=0)
    extra = ("-e", "gpu_rollout_drain_timeout=4", "-e", "gpu_rollout_drain_poll=2")
    try:
        run = rollout(tmp_path_factory.mktemp("given-back"), reports, [HEALTHY], *extra, drain=drain)
    finally:
        podman_exec(HEALTHY, "python3", "-c", SET_JOBS, GPUS_JSON, "0")
    return run, scontrol_calls(HEALTHY)[before:]


def test_a_job_that_ends_after_the_drain_is_waited_for_then_the_host_is_reprovisioned(waited):
    run, report, calls = waited
    assert run.returncode == 0, run.stdout[-4000:]
    retrying = f"FAILED - RETRYING: [{HEALTHY}]: {WAIT_TASK}"
    assert retrying in run.stdout, run.stdout[-4000:]
    # Nothing of the reprovisioning started before the job ended.
    assert run.stdout.rindex(retrying) < _position(run.stdout, INSTALL_PHASE)
    assert report["hosts"][HEALTHY]["status"] == "PASS"
    assert calls == [
        f"update nodename={HEALTHY} state=DRAIN reason=gpu_fleet",
        f"update nodename={HEALTHY} state=RESUME",
    ]


def test_a_job_that_outlives_the_wait_leaves_the_host_unchanged_and_given_back(given_back):
    run, calls = given_back
    assert run.returncode == 0, run.stdout[-4000:]
    skipped = _position(run.stdout, f"Skipped: {HEALTHY}'s GPUs still run compute processes 4 s after the drain: ")
    assert LATE_JOB in run.stdout[skipped:]
    assert INSTALL_PHASE not in run.stdout
    assert "TASK [gpu_fleet.tf_hosts.gpu_verify : Run the checks" not in run.stdout
    assert calls == [
        f"update nodename={HEALTHY} state=DRAIN reason=gpu_fleet",
        f"update nodename={HEALTHY} state=RESUME",
    ]
    # The checks took the run lock before the drain; the skip (meta: end_host) gave it back with the host.
    lock = podman_exec(HEALTHY, "test", "-e", RUN_LOCK)
    assert lock.returncode == 1, f"{RUN_LOCK} left on the host given back"
