"""Fault injection: the field's real faults on converged sandbox hosts, each reported with its cause.

Every round puts at most one fault on each host, runs the real ``playbooks/verify.yml`` against
those hosts from a non-login context (Ansible's ``podman exec``), reads the fleet report it wrote
and undoes the faults. The healthy round and the multi-worker round run first, on both hosts.
Faults touch only files a fault would touch in the field; NVIDIA's pieces are the stand-ins.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import testinfra

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import latest_report, run_playbook

A, B = "molecule-faults-a", "molecule-faults-b"
# Paths inside the sandbox containers A and B, not on the machine that runs the tests.
# Molecule runs ansible-playbook with `-i <ephemeral dir>/inventory` (a folder holding
# ansible_inventory.yml, which the tests get as MOLECULE_INVENTORY_FILE): gpu_verify names the
# report folder after it, so the reports are under <report dir>/inventory/.
MOLECULE_INVENTORY = "inventory"
CUDA = "/usr/local/cuda-11.8"
LIB64 = f"{CUDA}/lib64"
BACKUP = "/root/fault-backup"
GPUS_JSON = "/etc/nvidia-standin/gpus.json"
LOGIN_ONLY = "/etc/profile.d/cuda-ld-library-path.sh"
STRAY_CONF = "/etc/ld.so.conf.d/00-cuda-12.2.conf"


class Fault:
    """A fault: shell to apply and to undo it on a host, files to copy in first, extra vars."""

    def __init__(self, apply: str, undo: str, copy: dict[str, str] | None = None, extra_vars: str | None = None):
        self.apply, self.undo, self.copy, self.extra_vars = apply, undo, copy or {}, extra_vars


def faults(standins: Path) -> dict[str, Fault]:
    cudnn85 = standins / "libs" / "cudnn-8.5.0.96" / "libcudnn.so.8.5.0"
    cuda122 = standins / "libs" / "cuda-12.2.2" / "libcudart.so.12.2.140"
    return {
        "libcudnn_removed": Fault(
            f"mkdir -p {BACKUP} && mv {LIB64}/libcudnn.so* {BACKUP}/ && ldconfig",
            f"mv {BACKUP}/libcudnn.so* {LIB64}/ && ldconfig",
        ),
        # ldconfig points libcudnn.so.8 at the newest file with that soname, so 8.6 leaves the folder.
        "cudnn_8_5": Fault(
            f"mkdir -p {BACKUP} && mv {LIB64}/libcudnn.so.8.6.0 {BACKUP}/ && cp /tmp/libcudnn.so.8.5.0 {LIB64}/ "
            f"&& ln -sfn libcudnn.so.8.5.0 {LIB64}/libcudnn.so.8 && ldconfig",
            f"rm {LIB64}/libcudnn.so.8.5.0 && mv {BACKUP}/libcudnn.so.8.6.0 {LIB64}/ "
            f"&& ln -sfn libcudnn.so.8.6.0 {LIB64}/libcudnn.so.8 && ldconfig",
            copy={str(cudnn85): "/tmp/libcudnn.so.8.5.0"},
        ),
        "cuda12_runtime_first": Fault(
            "mkdir -p /usr/local/cuda-12.2/lib64 && cp /tmp/libcudart.so.12.2.140 /usr/local/cuda-12.2/lib64/ "
            "&& ln -sfn libcudart.so.12.2.140 /usr/local/cuda-12.2/lib64/libcudart.so.12 "
            f"&& echo /usr/local/cuda-12.2/lib64 > {STRAY_CONF} && ldconfig",
            f"rm -rf /usr/local/cuda-12.2 {STRAY_CONF} && ldconfig",
            copy={str(cuda122): "/tmp/libcudart.so.12.2.140"},
        ),
        "login_shells_only": Fault(
            f"mkdir -p {BACKUP} && mv /etc/ld.so.conf.d/gpu-env.conf {BACKUP}/ "
            f"&& echo 'export LD_LIBRARY_PATH={LIB64}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}' > {LOGIN_ONLY} "
            "&& ldconfig",
            f"mv {BACKUP}/gpu-env.conf /etc/ld.so.conf.d/ && rm {LOGIN_ONLY} && ldconfig",
        ),
        "gpu_fell_off_bus": Fault(
            f"mkdir -p {BACKUP} && cp {GPUS_JSON} {BACKUP}/gpus.json && cp /tmp/one-missing.json {GPUS_JSON}",
            f"cp {BACKUP}/gpus.json {GPUS_JSON}",
            copy={str(ROOT / "tests/fixtures/nvidia/gpus/2xA100-one-missing.json"): "/tmp/one-missing.json"},
        ),
        # The kernel module still loaded is 515 while user space is 520 (an upgrade without reboot).
        "module_mismatch": Fault(
            f"mkdir -p {BACKUP} && cp {GPUS_JSON} {BACKUP}/gpus.json && python3 -c "
            + shlex.quote(
                f"import json; p = '{GPUS_JSON}'; d = json.load(open(p)); "
                "d['kernel_module_version'] = '515.65.01'; json.dump(d, open(p, 'w'))"
            ),
            f"cp {BACKUP}/gpus.json {GPUS_JSON}",
        ),
        "nan_loss": Fault("true", "true", extra_vars="gpu_verify_fit_learning_rate=1e30"),
        # The default stack owns /usr/local/cuda: the link moved away (kept to put back).
        "cuda_symlink_removed": Fault(
            f"mkdir -p {BACKUP} && mv /usr/local/cuda {BACKUP}/cuda-link", f"mv {BACKUP}/cuda-link /usr/local/cuda"
        ),
    }


# Each round: {host: fault}; a fault's extra vars apply to the whole play (every host of its round).
ROUNDS = [
    {A: "libcudnn_removed", B: "cudnn_8_5"},
    {A: "cuda12_runtime_first", B: "login_shells_only"},
    {A: "gpu_fell_off_bus", B: "module_mismatch"},
    {A: "nan_loss", B: "cuda_symlink_removed"},  # B's fit gets nan_loss's learning rate too: its own check is asserted
]

# fault -> (check, texts the cause must contain, text the fix must contain)
EXPECTED = {
    "libcudnn_removed": ("libcudnn", ["Cannot load libcudnn.so.8", "/etc/ld.so.conf.d"], "cudnn"),
    "cudnn_8_5": ("libcudnn", ["is 8.5.0, the stack pins 8.6", "refuses it"], "another cuDNN"),
    "cuda12_runtime_first": (
        "libcudart",
        ["CUDA 12 runtime /usr/local/cuda-12.2/lib64/libcudart.so.12", STRAY_CONF, "before the pinned CUDA 11.8"],
        "remove /usr/local/cuda-12.2/lib64",
    ),
    "login_shells_only": (
        "libcudart",
        [f"It is installed at {LIB64}/libcudart.so.11.0", f"only {LOGIN_ONLY} add it", "login shells"],
        "/etc/ld.so.conf.d/",
    ),
    "gpu_fell_off_bus": (
        "gpu_count",
        ["Expected 2 GPUs, nvidia-smi sees 1", "on the PCI bus but not in nvidia-smi: 0000:0f:00.0"],
        "fallen off the bus",
    ),
    "module_mismatch": (
        "driver",
        ["Driver/library version mismatch", "Failed to initialize NVML"],
        "reboot",
    ),
    "nan_loss": ("fit", ["Loss is not finite"], "learning rate"),
    "cuda_symlink_removed": (
        "default",
        ["/usr/local/cuda is missing; the default stack's toolkit is /usr/local/cuda-11.8."],
        "cuda_toolkit points /usr/local/cuda",
    ),
}


def podman(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done


def shell(host: str, script: str) -> None:
    podman("exec", host, "sh", "-ec", script)


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> Path:
    """The extra stand-ins the faults need: cuDNN 8.5 for CUDA 11 and a CUDA 12.2 runtime."""
    out = tmp_path_factory.mktemp("fault-standins")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests/fixtures/nvidia/build_standins.py"),
            "--out",
            str(out),
            "--cuda",
            "12.2.2:535.104.05:12.2.140",
            "--cudnn",
            "8.5.0.96:11",
        ],
        check=True,
        capture_output=True,
    )
    return out


def verify_run(tmp_path_factory, hosts: list[str], *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run playbooks/verify.yml on ``hosts``; returns the run and the fleet-report.json it wrote."""
    reports = tmp_path_factory.mktemp("reports")
    run = run_playbook(
        "playbooks/verify.yml",
        os.environ["MOLECULE_INVENTORY_FILE"],
        "--limit",
        ",".join(hosts),
        "-e",
        f"gpu_verify_report_dir={reports}",
        # One name for the report folder, also for runs that add an inventory source with -i.
        "-e",
        f"gpu_verify_inventory_name={MOLECULE_INVENTORY}",
        *extra,
    )
    path = latest_report(reports, MOLECULE_INVENTORY)
    assert path.exists(), run.stdout[-4000:]
    return run, json.loads(path.read_text())


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return verify_run(tmp_path_factory, [A, B])


@pytest.fixture(scope="module")
def multiworker(tmp_path_factory, healthy):
    # A hang shows at the time limit; 240 s is ample for the sandbox's fit (about 10 s).
    return verify_run(tmp_path_factory, [A, B], "-e", "gpu_verify_multiworker=true", "-e", "gpu_verify_timeout=240")


@pytest.fixture(scope="module")
def fault_reports(tmp_path_factory, standins, multiworker) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    """Every round: apply, verify, undo; ``{fault: (run, report)}``."""
    known = faults(standins)
    found: dict[str, tuple[subprocess.CompletedProcess, dict]] = {}
    for round_ in ROUNDS:
        applied = []
        try:
            for host, name in round_.items():
                for src, dest in known[name].copy.items():
                    podman("cp", src, f"{host}:{dest}")
                shell(host, known[name].apply)
                applied.append((host, name))
            extra = [arg for _, name in applied if known[name].extra_vars for arg in ("-e", known[name].extra_vars)]
            result = verify_run(tmp_path_factory, list(round_), *extra)
            for _, name in applied:
                found[name] = result
        finally:
            for host, name in reversed(applied):
                shell(host, known[name].undo)
    return found


def _host(report: dict, host: str) -> dict:
    return report["hosts"][host]


def test_healthy_hosts_pass_with_no_problem(healthy):
    run, report = healthy
    assert run.returncode == 0, run.stdout[-4000:]
    for host in (A, B):
        assert _host(report, host)["status"] == "PASS"
        assert _host(report, host)["problems"] == []
    # Three counts agree: PCI (the lspci stand-in), NVML and the inventory.
    doc = _host(report, A)["results"][0]
    assert doc["gpus"]["pci_bus_ids"] == ["0000:07:00.0", "0000:0f:00.0"]
    assert doc["gpus"]["seen"] == doc["gpus"]["expected"] == 2


def test_multiworker_fit_across_two_hosts(multiworker):
    run, report = multiworker
    assert run.returncode == 0, run.stdout[-4000:]
    summary = report["multiworker"]
    assert summary["workers"] == 2
    assert summary["status"] == "PASS"
    assert summary["chief"] == A
    # One replica per worker on the sandbox's CPUs: 2 in sync across the hosts.
    assert summary["num_replicas_in_sync"] == 2
    assert summary["samples_per_second"] > 0
    for host in (A, B):
        doc = _host(report, host)["results"][0]
        assert doc["multiworker"]["workers"] == 2
        assert doc["fit"]["loss_end"] < doc["fit"]["loss_start"]


def test_the_faults_leave_the_hosts_healthy_again(fault_reports, tmp_path_factory):
    run, report = verify_run(tmp_path_factory, [A, B])
    assert run.returncode == 0, run.stdout[-4000:]
    assert all(_host(report, h)["status"] == "PASS" for h in (A, B))


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_fault_is_reported_with_its_cause(fault_reports, fault):
    run, report = fault_reports[fault]
    host = next(h for round_ in ROUNDS for h, name in round_.items() if name == fault)
    check, causes, fix = EXPECTED[fault]
    assert run.returncode != 0, f"{fault}: the run must fail"
    entry = _host(report, host)
    assert entry["status"] == "FAIL"
    matching = [p for p in entry["problems"] if p["check"] == check]
    assert matching, f"{fault}: no {check} problem in {entry['problems']}"
    text = " ".join(p["cause"] for p in matching)
    for part in causes:
        assert part in text, f"{fault}: {part!r} not in {text!r}"
    assert any(fix.lower() in p["fix"].lower() for p in matching), (
        f"{fault}: {fix!r} not in {[p['fix'] for p in matching]}"
    )
    # The failing task names the cause too, not only the report.
    assert causes[0] in run.stdout


def test_login_shells_do_find_the_runtime_under_that_fault(standins):
    """The login-only fault is what it claims: a login shell loads libcudart, a plain command does not."""
    fault = faults(standins)["login_shells_only"]
    shell(A, fault.apply)
    try:
        probe = "python3 -c 'import ctypes; ctypes.CDLL(\"libcudart.so.11.0\")'"
        assert subprocess.run(["podman", "exec", A, "bash", "-lc", probe]).returncode == 0
        assert subprocess.run(["podman", "exec", A, "sh", "-c", probe], capture_output=True).returncode != 0
    finally:
        shell(A, fault.undo)


def test_a_worker_that_cannot_be_reached_fails_the_cluster_in_time(tmp_path_factory, fault_reports):
    """B's address in TF_CONFIG leads nowhere (TEST-NET-1): the cluster never forms. Every worker
    stops with a cause, by TensorFlow's own gRPC error or at gpu_verify_timeout, instead of
    hanging the run."""
    extra_inventory = tmp_path_factory.mktemp("inventory") / "unreachable.yml"
    extra_inventory.write_text(
        json.dumps({"gpu_hosts": {"hosts": {B: {"gpu_verify_multiworker_address": "192.0.2.1"}}}})
    )
    run, report = verify_run(
        tmp_path_factory,
        [A, B],
        "-i",
        str(extra_inventory),
        "-e",
        "gpu_verify_multiworker=true",
        "-e",
        "gpu_verify_timeout=45",
    )
    assert run.returncode != 0
    assert report["multiworker"]["status"] == "FAIL"
    assert "192.0.2.1:12345" in report["multiworker"]["cluster"]
    chief = _host(report, A)
    causes = " ".join(p["cause"] for p in chief["problems"] if p["check"] == "fit")
    assert "could not be reached" in causes or "did not finish within 45 s" in causes, causes
    assert chief["results"][0]["seconds"] < 45 + 60


def test_check_mode_still_verifies_and_reports_a_broken_host(tmp_path_factory, standins, fault_reports):
    """--check changes nothing on the host, but the checks are read-only and run for real; the
    report is printed and not written (check mode changes nothing on the controller either). With
    --diff, a host whose verification scripts differ from the controller's is not verified and says
    why, and the scripts' text is not printed (on a fresh host, thousands of lines that bury the plan)."""
    fault = faults(standins)["libcudnn_removed"]
    reports = tmp_path_factory.mktemp("check")
    marker = "# molecule-faults: a line not in the copy on the controller"
    script = "/opt/gpu-verify/verify_common.py"
    shell(A, fault.apply)
    shell(B, f"echo '{marker}' >> {script}")
    try:
        inventory = os.environ["MOLECULE_INVENTORY_FILE"]
        run = run_playbook(
            "playbooks/verify.yml", inventory, "--check", "--diff", "-e", f"gpu_verify_report_dir={reports}"
        )
    finally:
        shell(A, fault.undo)
        shell(B, f"sed -i '$d' {script}")
    assert run.returncode != 0
    assert re.search(rf"{re.escape(A)}( \([^)]*\))?\s+FAIL\s", run.stdout), run.stdout[-4000:]
    assert re.search(rf"{re.escape(A)}( \([^)]*\))? \[libcudnn\]: ", run.stdout), run.stdout[-4000:]
    assert (
        f"Not verified under --check: the verification scripts in /opt/gpu-verify are missing or outdated on {B}"
        in " ".join(run.stdout.split())
    )
    assert marker not in run.stdout
    assert list(reports.iterdir()) == []


def test_a_run_that_fails_early_still_writes_its_report_beside_the_last_one(tmp_path_factory, fault_reports):
    """A multi-worker run on one host fails before the verification: the report, written after every step that
    can fail a host, says FAIL with the cause, as the exit code says; `latest` points at it, and the last
    completed verification's folder stays."""
    reports = tmp_path_factory.mktemp("stale")
    inventory_dir = reports / MOLECULE_INVENTORY
    (inventory_dir / "20260101T000000Z").mkdir(parents=True)
    (inventory_dir / "20260101T000000Z" / "fleet-report.json").write_text("{}")
    (inventory_dir / "latest").symlink_to("20260101T000000Z")
    run = run_playbook(
        "playbooks/verify.yml",
        os.environ["MOLECULE_INVENTORY_FILE"],
        "--limit",
        A,
        "-e",
        f"gpu_verify_report_dir={reports}",
        "-e",
        "gpu_verify_multiworker=true",
    )
    assert run.returncode != 0
    assert "needs at least 2 hosts in the play, got 1" in run.stdout
    folders = sorted(p.name for p in inventory_dir.iterdir())
    assert len(folders) == 3 and folders[0] == "20260101T000000Z" and folders[-1] == "latest", folders
    assert os.readlink(inventory_dir / "latest") == folders[1]
    host = _host(json.loads(latest_report(reports, MOLECULE_INVENTORY).read_text()), A)
    assert host["status"] == "FAIL" and any("needs at least 2 hosts" in p["cause"] for p in host["problems"]), host


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("gpu_verify_timeout", "-5", "gpu_verify_timeout is -5; it must be a number of seconds above 0"),
        (
            "gpu_verify_fit_learning_rate",
            "nan",
            "gpu_verify_fit_learning_rate is nan; it must be a finite number above 0",
        ),
        ("gpu_verify_scaling_threshold", "1.5", "gpu_verify_scaling_threshold is 1.5; it must be a fraction above 0"),
        (
            "gpu_verify_expected_gpu_count",
            "0",
            "gpu_verify_expected_gpu_count is 0; it must be a whole number of GPUs of at least 1",
        ),
        (
            "gpu_verify_expected_gpu_count",
            "-2",
            "gpu_verify_expected_gpu_count is -2; it must be a whole number of GPUs of at least 1",
        ),
    ],
)
def test_bad_verification_options_stop_before_anything_runs(tmp_path_factory, option, value, message):
    reports = tmp_path_factory.mktemp("bad-option")
    run = run_playbook(
        "playbooks/verify.yml",
        os.environ["MOLECULE_INVENTORY_FILE"],
        "--limit",
        A,
        "-e",
        f"gpu_verify_report_dir={reports}",
        "-e",
        f"{option}={value}",
    )
    assert run.returncode != 0
    assert message in run.stdout
    assert "Fix it in the inventory or on the -e command line." in run.stdout
    # Nothing ran or changed after the check: no copy of the scripts, no verification; the report (written after
    # every step that can fail a host) says FAIL with the option's message, as the exit code says.
    assert "TASK [gpu_fleet.tf_hosts.gpu_verify : Copy the verification scripts" not in run.stdout
    assert "TASK [gpu_fleet.tf_hosts.gpu_verify : Run the checks" not in run.stdout
    checked = "TASK [gpu_fleet.tf_hosts.gpu_verify : Stop when no earlier task of the run resolved the pinned stacks"
    assert checked in run.stdout
    host = _host(json.loads(latest_report(reports, MOLECULE_INVENTORY).read_text()), A)
    assert host["status"] == "FAIL" and any(message in problem["cause"] for problem in host["problems"]), host


def test_a_bad_verification_option_stops_site_yml_in_preflight(tmp_path_factory):
    run = run_playbook(
        "site.yml",
        os.environ["MOLECULE_INVENTORY_FILE"],
        "--limit",
        A,
        "-e",
        f"gpu_verify_report_dir={tmp_path_factory.mktemp('bad-site')}",
        "-e",
        "gpu_verify_timeout=0",
    )
    assert run.returncode != 0
    assert "gpu_verify_timeout is 0; it must be a number of seconds above 0" in run.stdout
    # The first play stopped the host: no driver, toolkit or venv task ran, and no NVIDIA file was pushed.
    assert "TASK [gpu_fleet.tf_hosts.nvidia_driver" not in run.stdout
    assert not re.search(r"^TASK \[gpu_fleet\.tf_hosts\.\w+ : Push ", run.stdout, re.MULTILINE)


def test_a_rerun_repairs_a_damaged_host(tmp_path_factory, standins, fault_reports):
    """Damage that a marker or a link alone would hide: the CUDA runtime's file removed (its links
    dangle) on A; a newer stale cuDNN 8 file left in the tree on B, which ldconfig then prefers.
    The next site.yml run must see both by content, reinstall, refresh the loader cache and pass."""
    shell(A, f"rm -f $(readlink -f {LIB64}/libcudart.so.11.0) && ldconfig")
    podman("cp", str(standins / "libs" / "cudnn-8.5.0.96" / "libcudnn.so.8.5.0"), f"{B}:{LIB64}/libcudnn.so.8.9.9")
    shell(B, "ldconfig")
    reports = tmp_path_factory.mktemp("repair")
    run = run_playbook(
        "site.yml",
        os.environ["MOLECULE_INVENTORY_FILE"],
        "--limit",
        f"{A},{B}",
        "-e",
        f"gpu_verify_report_dir={reports}",
    )
    report = json.loads(latest_report(reports, MOLECULE_INVENTORY).read_text())
    assert run.returncode == 0, run.stdout[-4000:]
    assert [_host(report, h)["status"] for h in (A, B)] == ["PASS", "PASS"]
    for host in (A, B):
        changed = re.search(rf"^{host}\s+: ok=\d+\s+changed=(\d+)", run.stdout, re.MULTILINE)
        assert changed and int(changed.group(1)) > 0, f"{host} was not repaired (changed=0)"
    assert podman("exec", B, "sh", "-c", f"ls {LIB64}/ | grep -c 8.9.9 || true").stdout.strip() == "0"
    cudnn = podman("exec", B, "readlink", "-f", f"{LIB64}/libcudnn.so.8").stdout.strip()
    assert cudnn.endswith("libcudnn.so.8.6.0"), cudnn


def test_testinfra_sees_the_restored_toolkit(host):
    assert host.file(f"{LIB64}/libcudnn.so.8").linked_to.endswith("libcudnn.so.8.6.0")
    assert not host.file(STRAY_CONF).exists
    assert testinfra.get_host(f"podman://{B}").file("/etc/ld.so.conf.d/gpu-env.conf").exists
