"""Bad inputs stop a fresh sandbox host before anything is installed, with cause and fix.

Each test starts a fresh podman container from the sandbox image, runs the real site.yml against
it with one bad input, and checks the message and that nothing was installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

from conftest import STANDINS, site

INSTALLED_PATHS = [
    "/usr/local/cuda-11.8",
    "/usr/local/cuda",
    "/opt/tensorflow",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05",
    "/var/cache/gpu-artifacts",
    "/etc/ld.so.conf.d/gpu-env.conf",
    "/etc/profile.d/gpu-env.sh",
]


def _nothing_installed(name: str) -> list[str]:
    found = []
    for path in INSTALLED_PATHS:
        if subprocess.run(["podman", "exec", name, "test", "-e", path]).returncode == 0:
            found.append(path)
    return found


def test_checksum_mismatch_stops_the_host_before_any_change(fresh_host, tmp_path):
    name, inventory = fresh_host
    artifacts = tmp_path / "artifacts"
    shutil.copytree(STANDINS, artifacts, symlinks=True)
    runfile = artifacts / "cuda_11.8.0_520.61.05_linux.run"
    with runfile.open("ab") as handle:
        handle.write(b"\n# tampered\n")
    actual = subprocess.run(["sha256sum", str(runfile)], capture_output=True, text=True).stdout.split()[0]
    out = site(inventory, "-e", f"gpu_artifacts_controller_dir={artifacts}")
    assert out.returncode != 0
    assert f"cuda_11.8.0_520.61.05_linux.run has sha256 {actual}, but the manifest pins" in out.stdout
    assert "download it again and compare" in out.stdout
    assert _nothing_installed(name) == []


def test_missing_artifact_stops_the_host_before_any_change(fresh_host, tmp_path):
    name, inventory = fresh_host
    artifacts = tmp_path / "artifacts"
    shutil.copytree(STANDINS, artifacts, symlinks=True)
    (artifacts / "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz").unlink()
    out = site(inventory, "-e", f"gpu_artifacts_controller_dir={artifacts}")
    assert out.returncode != 0
    assert f"cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz is not in {artifacts} on the controller" in out.stdout
    assert _nothing_installed(name) == []


def test_tensorflow_pin_outside_host_python_stops_the_host(fresh_host):
    name, inventory = fresh_host
    stacks = {
        "gpu_preflight_stacks": [{"name": "tf2.10", "tensorflow": "2.10", "package": "tensorflow-cpu"}],
        "gpu_preflight_default_stack": "tf2.10",
    }
    out = site(inventory, "-e", json.dumps(stacks))
    assert out.returncode != 0
    python = subprocess.run(
        ["podman", "exec", name, "python3", "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert (
        f"tf2.10: TensorFlow 2.10 supports Python 3.7-3.10; /usr/bin/python3 on this host is {python}. "
        "Point the stack's python at a Python 3.7-3.10 interpreter, or pin TensorFlow 2.12-2.21 for Python 3.11."
    ) in out.stdout
    # Every problem of the host in one run: 2.10 also needs CUDA 11.2 and cuDNN 8.1, which the manifest lacks.
    assert "No CUDA 11.2 runfile is in the artifact manifest." in out.stdout
    assert _nothing_installed(name) == []
