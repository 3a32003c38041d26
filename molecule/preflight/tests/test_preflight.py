"""Preflight on bad stacks and unfit hosts: each stops before any change, with all its problems.

The real site.yml runs once against every host of the scenario except the healthy one; every host
must fail in preflight, so the later plays install nothing. The healthy 4 x RTX 3090 host (x8
links, no NVLink) runs playbooks/preflight.yml and passes with warnings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import testinfra

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import run_playbook

BAD_HOSTS = ["tf215-cudnn86", "cuda122-drv525", "tf217-cc52", "py312", "noexec", "disk", "gpucount"]
INSTALLED_PATHS = [
    "/usr/local/cuda-11.8",
    "/usr/local/cuda",
    "/opt/tensorflow",
    "/var/cache/gpu-artifacts",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05",
    "/etc/ld.so.conf.d/gpu-env.conf",
]


def _playbook(playbook: str, limit: str) -> subprocess.CompletedProcess:
    return run_playbook(playbook, os.environ["MOLECULE_INVENTORY_FILE"], "--limit", limit)


@pytest.fixture(scope="module")
def site_run():
    return _playbook("site.yml", ",".join(f"molecule-pf-{h}" for h in BAD_HOSTS))


def _failure(run: subprocess.CompletedProcess, host: str) -> str:
    """The output of the preflight stop for ``host``: its ``fatal:`` result up to the next task."""
    match = re.search(rf"fatal: \[molecule-pf-{host}\]: FAILED! =>(.*?)(?:\nfatal:|\nTASK |\nPLAY )", run.stdout, re.S)
    assert match, f"no failure for {host}:\n{run.stdout[-3000:]}"
    return match.group(1)


def test_every_bad_host_fails_and_the_run_says_so(site_run):
    assert site_run.returncode != 0
    for host in BAD_HOSTS:
        assert re.search(rf"molecule-pf-{host}\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=1", site_run.stdout), (
            host
        )


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_nothing_was_installed(site_run, host):
    remote = testinfra.get_host(f"podman://molecule-pf-{host}")
    assert [p for p in INSTALLED_PATHS if remote.file(p).exists] == []


def test_tf215_with_cudnn86(site_run):
    msg = _failure(site_run, "tf215-cudnn86")
    assert (
        "tf2.15: TensorFlow 2.15 was built with cuDNN 8.9; it refuses cuDNN 8.6 (it needs the same major and "
        "an equal or higher minor). Pin cuDNN 8.9 for TensorFlow 2.15."
    ) in msg


def test_cuda122_with_driver_525(site_run):
    msg = _failure(site_run, "cuda122-drv525")
    assert (
        "tf2.15: CUDA 12.2.2 needs driver >= 535.104.05; the pinned driver is 525.147.05. "
        "Raise nvidia_driver_version to >= 535.104.05 or pin TensorFlow 2.4-2.14."
    ) in msg


def test_tf217_on_compute_capability_52(site_run):
    msg = _failure(site_run, "tf217-cc52")
    assert (
        "tf2.17: GPU 0 (NVIDIA GeForce GTX 980) has compute capability 5.2; the TensorFlow 2.17 wheel needs >= 6.0."
    ) in msg


def test_tf212_on_python_312(site_run):
    msg = _failure(site_run, "py312")
    assert (
        "tf2.12: TensorFlow 2.12 supports Python 3.8-3.11; /opt/python-3.12/bin/python3 on this host is 3.12.1. "
        "Point the stack's python at a Python 3.8-3.11 interpreter, or pin TensorFlow 2.16-2.21 for Python 3.12."
    ) in msg


def test_noexec_tmpdir(site_run):
    msg = _failure(site_run, "noexec")
    assert (
        "/var/tmp/cuda-installer (CUDA installer scratch) is on /var/tmp/cuda-installer, mounted noexec; "
        "NVIDIA's installers run programs from it."
    ) in msg


def test_too_little_disk_lists_every_location(site_run):
    msg = _failure(site_run, "disk")
    for purpose in (
        "artifact cache",
        "CUDA installer scratch",
        "CUDA toolkits",
        "driver installer scratch",
        "TensorFlow venvs",
    ):
        assert f"({purpose}) is on" in msg, purpose
    assert "104,857,600 MiB is needed" in msg


def test_fewer_gpus_than_expected_before_any_driver(site_run):
    msg = _failure(site_run, "gpucount")
    # nvidia-smi is named as not installed, with where it was looked for (the host's PATH and the sbin folders).
    assert "4 GPUs expected, 2 seen: nvidia-smi is not installed (not on PATH (" in msg
    assert (
        "nor in /sbin, /usr/sbin, /usr/local/sbin), /usr/share/gpu-sandbox/pci-devices "
        "(gpu_preflight_pci_devices_path) lists 2 NVIDIA GPUs; "
        "bus IDs seen: 0000:07:00.0, 0000:0f:00.0. Reseat or power the missing GPUs"
    ) in msg
    assert "gpu_verify_expected_gpu_count" in msg


def test_rtx3090_x8_passes_with_warnings(host):
    run = _playbook("playbooks/preflight.yml", "molecule-pf-rtx3090")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "PCIe links below x16 on a multi-GPU host: GPU 2 at x8, GPU 3 at x8" in run.stdout
    assert "4 GPUs without NVLink" in run.stdout
    assert not host.file("/usr/local/cuda-11.8").exists
