"""An air-gap bundle alone converges a fresh sandbox host, with pip restricted to --no-index.

playbooks/airgap_bundle.yml collects the NVIDIA artifacts and the wheels on the controller; the
run then gets the bundle's nvidia/ as its artifact folder and its wheels/ as the wheelhouse, and
the pip index points at a closed loopback port, so any index access would fail the run.
"""

from __future__ import annotations

import subprocess

from conftest import site

DEAD_INDEX = "http://127.0.0.1:9/simple"


def test_bundle_alone_converges_a_fresh_host(fresh_host, tmp_path):
    name, inventory = fresh_host
    bundle = tmp_path / "bundle"
    built = site(inventory, "-e", f"gpu_bundle_dir={bundle}", playbook="playbooks/airgap_bundle.yml")
    assert built.returncode == 0, built.stdout[-4000:]
    sums = (bundle / "SHA256SUMS").read_text()
    assert "nvidia/cuda_11.8.0_520.61.05_linux.run" in sums
    assert "wheels/tensorflow_cpu-2.12.1-cp311-cp311-" in sums
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
