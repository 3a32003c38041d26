"""Jupyter kernels of three stacks on one host (testinfra, podman backend): the stacks' locks hold
ipykernel (tests/fixtures/locks-jupyter), so tf_venv wrote a kernel spec for each and the
verification started each kernel. Here each kernel is started again as Jupyter starts it (kernel.py:
jupyter_client, the spec's argv, one cell) from a user's environment with a library folder of the
user's own, and must run in its own venv with its own stack's libcudart and libcudnn, that folder
kept; with a module ipykernel needs moved away, the check fails naming the import error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import latest_report

# The scenario's report folder (gpu_verify_report_dir in .config/molecule/config.yml), of Molecule's
# inventory folder `inventory`.
REPORTS = ROOT / "reports" / "molecule-multi_stack"

KERNELS = "/usr/local/share/jupyter/kernels"
# tf2.18w's CUDA is NVIDIA's wheels in its venv: the folders its environment file puts first (the version
# matrix's cuda_wheels.library_folders).
WHEELS = "/opt/tensorflow/2.18-wheels/lib/python3.11/site-packages/nvidia"
WHEEL_FOLDERS = ("cuda_runtime", "cublas", "cudnn", "cufft", "curand", "cusolver", "cusparse", "nccl", "nvjitlink")
WHEEL_DIRS = [f"{WHEELS}/{folder}/lib" for folder in (*WHEEL_FOLDERS, "cuda_cupti", "cuda_nvrtc")]
STACKS = {  # name: (venv, where CUDA comes from: kernel.py's arguments, the first library folder, CUDA, cuDNN)
    "tf2.12": ("/opt/tensorflow/2.12", "--cuda-root /usr/local/cuda-11.8", "/usr/local/cuda-11.8/lib64", "11.8", "8.6"),
    "tf2.18": ("/opt/tensorflow/2.18", "--cuda-root /usr/local/cuda-12.5", "/usr/local/cuda-12.5/lib64", "12.5", "9.3"),
    "tf2.18w": (
        "/opt/tensorflow/2.18-wheels",
        "--cuda-source wheels " + " ".join(f"--library-dir {folder}" for folder in WHEEL_DIRS),
        WHEEL_DIRS[0],
        "12.5",
        "9.3",
    ),
}


def kernel_check(host, name: str):
    venv, source, _first, cuda, cudnn = STACKS[name]
    command = (
        f"{venv}/bin/python /opt/gpu-verify/kernel.py --stack {name} {source} "
        f"--cuda {cuda} --cudnn {cudnn} --kernel-dir {KERNELS}"
    )
    return host.run(command)


@pytest.mark.parametrize("name", sorted(STACKS))
def test_each_kernel_starts_and_runs_a_cell_with_its_own_stack_and_the_users_library_path(host, name):
    venv, _source, first, _cuda, _cudnn = STACKS[name]
    spec = json.loads(host.file(f"{KERNELS}/tf-stack-{name}/kernel.json").content_string)
    assert spec["argv"][:4] == ["/usr/local/bin/tf-stack", "run", name, "--"] and "env" not in spec
    out = kernel_check(host, name)
    assert out.rc == 0, out.stdout + out.stderr
    section = json.loads(out.stdout)
    assert section["started"] is True and section["prefix"] == venv
    assert section["ld_library_path"][0] == first
    assert section["ld_library_path"][-1] == "/opt/gpu-verify-user-libraries"
    home = WHEELS if name == "tf2.18w" else first.removesuffix("/lib64")
    assert all(path.startswith(f"{home}/") for path in section["loaded"].values()), section["loaded"]


def test_the_verification_reported_each_kernel():
    entry = next(iter(json.loads(latest_report(REPORTS, "inventory").read_text())["hosts"].values()))
    kernels = {doc["stack"]: doc["kernel"] for doc in entry["results"]}
    assert {name: (k["ok"], k["name"]) for name, k in kernels.items()} == {n: (True, f"tf-stack-{n}") for n in STACKS}
    assert all(row["checks"]["kernel"]["status"] == "pass" for row in entry["rows"])


@pytest.fixture
def zmq_moved(host):
    """pyzmq's module moved out of tf2.18's venv (a package removed by hand), put back afterwards."""
    site = host.check_output(
        "/opt/tensorflow/2.18/bin/python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))'"
    )
    host.run_expect([0], f"mv {site}/zmq {site}/zmq.moved")
    yield
    host.run_expect([0], f"mv {site}/zmq.moved {site}/zmq")


def test_a_kernel_that_cannot_start_fails_the_check_naming_the_import_error(host, zmq_moved):
    out = kernel_check(host, "tf2.18")
    assert out.rc == 1, out.stdout + out.stderr
    (found,) = json.loads(out.stdout)["problems"]
    assert found["check"] == "kernel"
    assert "does not import (ModuleNotFoundError: No module named 'zmq')" in found["cause"]
    assert "tf-stack-tf2.18 cannot start" in found["cause"] and "tools/locks.py" in found["fix"]
