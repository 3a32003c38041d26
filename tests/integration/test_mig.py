"""MIG layouts on a converged sandbox host turned into a stand-in H100 host (two H100 80GB GPUs, the nvidia-smi
stand-in of this tree, which keeps its MIG state between calls):

- the driver playbook with gpu_mig_enabled creates the layout's instances (nvidia-smi -L lists them); a second
  run changes nothing;
- a changed layout stops while a compute application runs on a GPU to change, nothing changed, and is applied
  once none runs;
- a profile the GPU's model does not have stops preflight before any change;
- the verification counts the MIG devices: the layout's passes and the health check's baseline keeps the count;
  with one GPU's instances gone, gpu-health finds it (check gpus) and the host fails verification with check mig
  in the fleet report.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from ansible_run import latest_report
from helpers import NVIDIA_FIXTURES, load_builder
from sandbox_hosts import sandbox_inventory, site, start_converged, stop_container

pytestmark = pytest.mark.integration

DESCRIPTION = "/etc/nvidia-standin/gpus.json"
BASELINE = "/var/lib/gpu-health/baseline.json"
DRIVER = "520.61.05"  # the sandbox's driver (inventories/sandbox), whose nvidia-smi the host has
RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", re.MULTILINE)
LAYOUT = [{"gpus": [0], "profiles": ["3g.40gb", "3g.40gb"]}, {"gpus": [1], "profiles": ["4g.40gb", "2g.20gb"]}]


def shell(host: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", host, "sh", "-ec", script], capture_output=True, text=True, check=False)


def mig_devices(host: str) -> list[str]:
    """``GPU <n>: <profile>`` for each MIG line of nvidia-smi -L."""
    found, gpu = [], None
    for line in shell(host, "nvidia-smi -L").stdout.splitlines():
        if line.startswith("GPU "):
            gpu = line.split(":")[0]
        elif line.startswith("  MIG "):
            found.append(f"{gpu}: {line.split()[1]}")
    return found


def layout_vars(layout: list) -> str:
    return json.dumps({"gpu_mig_enabled": True, "gpu_mig_layout": layout})


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A converged host with the two-H100 description and this tree's nvidia-smi stand-in (MIG answers)."""
    name = start_converged("gpu-mig")
    smi = tmp_path_factory.mktemp("smi") / "nvidia-smi"
    smi.write_text(load_builder().render_nvidia_smi(DRIVER, 11080), encoding="utf-8")
    for source, dest in (
        (NVIDIA_FIXTURES / "gpus" / "2xH100-SXM5-80GB.json", DESCRIPTION),
        (smi, "/usr/bin/nvidia-smi"),
    ):
        subprocess.run(["podman", "cp", str(source), f"{name}:{dest}"], check=True)
    assert shell(name, "chmod 0755 /usr/bin/nvidia-smi && nvidia-smi -L").returncode == 0
    yield name
    stop_container(name)


@pytest.fixture(scope="module")
def inventory(host, tmp_path_factory):
    return sandbox_inventory(tmp_path_factory.mktemp("mig") / "inventory", host)


def driver_play(inventory, layout: list) -> subprocess.CompletedProcess:
    return site(inventory, "-e", layout_vars(layout), playbook="playbooks/driver.yml")


def test_the_layout_is_created_and_a_second_run_changes_nothing(host, inventory):
    first = driver_play(inventory, LAYOUT)
    assert first.returncode == 0, first.stdout[-3000:]
    assert sorted(mig_devices(host)) == ["GPU 0: 3g.40gb", "GPU 0: 3g.40gb", "GPU 1: 2g.20gb", "GPU 1: 4g.40gb"]
    second = driver_play(inventory, LAYOUT)
    assert second.returncode == 0, second.stdout[-3000:]
    assert RECAP.findall(second.stdout) == [(host, "0", "0")]


def test_a_changed_layout_waits_for_idle_gpus(host, inventory):
    app = "import json; p = '%s'; d = json.load(open(p)); d['compute_apps'] = %s; json.dump(d, open(p, 'w'))"
    busy = [{"pid": 4242, "process_name": "python3", "gpu_uuid": "GPU-1c3e8a1f-52d0-4b7e-9a61-0f4d2b8e7c01"}]
    assert shell(host, f'python3 -c "{app % (DESCRIPTION, busy)}"').returncode == 0
    changed = [{"gpus": "all", "profiles": ["7g.80gb"]}]
    stopped = driver_play(inventory, changed)
    assert stopped.returncode != 0
    output = " ".join(stopped.stdout.split())
    assert "compute applications run on them: pid 4242 (python3) on GPU 1" in output
    assert "Drain the host" in output and "nothing was changed" in output
    assert sorted(mig_devices(host)) == ["GPU 0: 3g.40gb", "GPU 0: 3g.40gb", "GPU 1: 2g.20gb", "GPU 1: 4g.40gb"]
    assert shell(host, f'python3 -c "{app % (DESCRIPTION, [])}"').returncode == 0
    applied = driver_play(inventory, changed)
    assert applied.returncode == 0, applied.stdout[-3000:]
    assert mig_devices(host) == ["GPU 0: 7g.80gb", "GPU 1: 7g.80gb"]


def test_a_profile_the_model_lacks_stops_preflight_before_any_change(host, inventory):
    before = shell(host, "cat /var/lib/nvidia-standin/mig.json").stdout
    run = site(
        inventory, "-e", layout_vars([{"gpus": [0], "profiles": ["3g.20gb"]}]), playbook="playbooks/preflight.yml"
    )
    assert run.returncode != 0
    output = " ".join(run.stdout.split())
    assert "Check the MIG layout against the GPUs' models" in output
    assert "GPU 0 (NVIDIA H100 80GB HBM3) has no MIG profile 3g.20gb" in output and "Fix gpu_mig_layout" in output
    assert shell(host, "cat /var/lib/nvidia-standin/mig.json").stdout == before


def test_the_verification_counts_the_mig_devices(host, inventory, tmp_path):
    layout = [{"gpus": "all", "profiles": ["7g.80gb"]}]
    reports = tmp_path / "reports"
    passed = site(
        inventory, "-e", layout_vars(layout), "-e", f"gpu_verify_report_dir={reports}", playbook="playbooks/verify.yml"
    )
    assert passed.returncode == 0, passed.stdout[-3000:]
    assert json.loads(shell(host, f"cat {BASELINE}").stdout)["mig_devices"] == 2  # the health check's baseline
    assert shell(host, "nvidia-smi mig -i 1 -dci && nvidia-smi mig -i 1 -dgi").returncode == 0  # GPU 1's instance gone
    health = shell(host, "gpu-health --format json")
    assert health.returncode == 1, health.stdout + health.stderr
    causes = [item["cause"] for item in json.loads(health.stdout)["findings"] if item["check"] == "gpus"]
    assert causes == ["nvidia-smi -L lists 1 MIG devices; the baseline (the host's MIG layout) expects 2."]
    failed = site(
        inventory, "-e", layout_vars(layout), "-e", f"gpu_verify_report_dir={reports}", playbook="playbooks/verify.yml"
    )
    assert failed.returncode != 0
    output = " ".join(failed.stdout.split())
    assert (
        "The MIG devices differ from gpu_mig_layout (2 asked for): GPU 1: MIG devices none; the layout asks for 7g.80gb"
        in output
    )
    entry = json.loads(latest_report(reports, "inventory").read_text())["hosts"][host]
    assert entry["status"] == "FAIL" and "The MIG devices differ from gpu_mig_layout" in json.dumps(entry)
