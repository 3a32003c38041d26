"""An air-gap bundle alone converges a fresh sandbox host, with pip restricted to --no-index.

playbooks/airgap_bundle.yml collects the NVIDIA artifacts and the wheels on the controller; the
run then gets the bundle's nvidia/ as its artifact folder and its wheels/ as the wheelhouse, and
the pip index points at a closed loopback port, so any index access would fail the run.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess

import pytest
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_lock import normalize_name, parse_lock
from ansible_run import latest_report
from sandbox_hosts import ROOT, site, small_inventory, start_container, stop_container

DEAD_INDEX = "http://127.0.0.1:9/simple"
LOCK = ROOT / "data" / "locks" / "tensorflow-cpu-2.12.1-py3.11.txt"
VENV = "/opt/tensorflow/2.12"
# A distribution installed by hand (its dist-info alone, with the RECORD pip uninstalls by).
HANDMADE = "handmade-1.0.dist-info"
HANDMADE_SCRIPT = (
    "d=$(echo {venv}/lib/python3*/site-packages)/{info} && mkdir $d && "
    "printf 'Metadata-Version: 2.1\\nName: handmade\\nVersion: 1.0\\n' > $d/METADATA && "
    "printf '{info}/METADATA,,\\n{info}/RECORD,,\\n' > $d/RECORD"
)
RECAP = re.compile(r"^\S+\s+: ok=\d+\s+changed=(\d+)", re.MULTILINE)


def wheel_name(path: str) -> str:
    """The distribution a wheel file name is of (``tensorflow_cpu-2.12.1-...whl`` -> ``tensorflow-cpu``)."""
    return normalize_name(path.rsplit("/", 1)[-1].split("-", 1)[0])


def podman(name: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", name, *argv], capture_output=True, text=True)


@pytest.fixture
def bare_host(tmp_path):
    """A fresh sandbox container without the test session's wheelhouse: only the bundle's wheels."""
    name = start_container("gpu-airgap", wheelhouse=False)
    yield name, small_inventory(tmp_path / "inventory", name)
    stop_container(name)


def test_bundle_alone_converges_a_fresh_host(bare_host, tmp_path):
    name, inventory = bare_host
    bundle = tmp_path / "bundle"
    built = site(inventory, "-e", f"gpu_bundle_dir={bundle}", playbook="playbooks/airgap_bundle.yml")
    assert built.returncode == 0, built.stdout[-4000:]
    sums = (bundle / "SHA256SUMS").read_text()
    assert "nvidia/cuda_11.8.0_520.61.05_linux.run" in sums
    assert "wheels/tensorflow_cpu-2.12.1-cp311-cp311-" in sums
    wheels = sorted(wheel_name(line.split()[1]) for line in sums.splitlines() if line.split()[1].startswith("wheels/"))
    assert wheels == sorted(parse_lock(LOCK.read_text())), "the bundle's wheels are not exactly the lock"
    check = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout

    run = site(
        inventory,
        "-e",
        f"gpu_artifacts_controller_dir={bundle}/nvidia",
        "-e",
        f"tf_venv_wheelhouse={bundle}/wheels",
        "-e",
        f"tf_venv_pip_index_url={DEAD_INDEX}",
        "-e",
        f"gpu_verify_report_dir={tmp_path}/reports",
    )
    assert run.returncode == 0, run.stdout[-4000:]
    # pushed for the install, then removed once the venv was built (tf_venv_keep_wheelhouse is false)
    assert "TASK [gpu_fleet.tf_hosts.tf_venv : Copy the wheelhouse to the host]" in run.stdout
    assert podman(name, "test", "-e", "/var/cache/tf-wheelhouse").returncode == 1
    assert_locked(name, tmp_path)
    assert_drift_is_found_and_removed(name, inventory, bundle)
    conf = subprocess.run(
        ["podman", "exec", name, "cat", "/opt/tensorflow/2.12/pip.conf"], capture_output=True, text=True
    )
    assert "no-index = true" in conf.stdout
    version = subprocess.run(
        [
            "podman",
            "exec",
            name,
            "/opt/tensorflow/2.12/bin/python",
            "-c",
            "import importlib.metadata as m; print(m.version('tensorflow-cpu'))",
        ],
        capture_output=True,
        text=True,
    )
    assert version.stdout.strip() == "2.12.1"


def assert_locked(name: str, tmp_path) -> None:
    """The venv holds its lock and the record of its install; the report shows the lock's digest."""
    assert podman(name, "cat", f"{VENV}/tf-lock.txt").stdout == LOCK.read_text()
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    assert podman(name, "cat", f"{VENV}/tf-lock.sha256").stdout == f"{digest}  tf-lock.txt\n"
    report = json.loads(latest_report(tmp_path / "reports", "inventory").read_text())
    [row] = report["hosts"][name]["rows"]
    assert row["lock"] == digest[:12]
    assert row["checks"]["lock"] == {"status": "pass", "passed": True, "reason": None}


def assert_drift_is_found_and_removed(name: str, inventory, bundle) -> None:
    """A package added by hand is drift (venv_lock.py says so); tf_venv removes it; then a rerun
    changes nothing."""
    assert podman(name, "sh", "-c", HANDMADE_SCRIPT.format(venv=VENV, info=HANDMADE)).returncode == 0
    check = [f"{VENV}/bin/python", "/opt/gpu-verify/venv_lock.py"]
    drifted = podman(name, *check)
    assert drifted.returncode == 1, drifted.stdout
    assert json.loads(drifted.stdout)["drift"]["lines"] == ["handmade 1.0 not in the lock"]
    args = ("-e", f"tf_venv_wheelhouse={bundle}/wheels", "-e", f"tf_venv_pip_index_url={DEAD_INDEX}")
    restore = site(inventory, "--tags", "tf_venv", *args)
    assert restore.returncode == 0, restore.stdout[-4000:]
    assert podman(name, *check).returncode == 0, "the rerun left the venv off its lock"
    again = site(inventory, "--tags", "tf_venv", *args)
    assert again.returncode == 0, again.stdout[-4000:]
    assert RECAP.findall(again.stdout) == ["0"], "a rerun on a venv that matches its lock changed something"
