"""Debian's real NVIDIA driver user space on a host whose kernel module is not loaded.

A host of the ``converged`` snapshot (NVIDIA's real CUDA 11.8 and cuDNN 8.6 files, TensorFlow's GPU
build) gives up the stand-in driver (its ``nvidia-uninstall``: no more simulated GPU answers) for
Debian 12's own ``nvidia-smi``, ``libcuda1`` and ``libnvidia-ml1`` from the non-free component, as an
administrator would install them. A container has no NVIDIA kernel module, as a host has none before
its first reboot after the install: the real ``nvidia-smi`` exits 9. Preflight, the verification and
the health check each name that "NVIDIA kernel module not loaded", with the fix for a host and, first,
for a container; the verification reads the real libcuda (535.x) and the real runtime's answer to it.

apt's downloads go to the machine's test cache (``apt-debian12/``), mounted as the host's
``/var/cache/apt/archives``: the packages are downloaded once per machine. A mirror's passing failure
gets two more tries; when apt gives up, the test shows apt's own message. About 40 s on an idle
2-core machine.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import retry
from ansible_run import latest_report
from sandbox_hosts import ROOT, sandbox_inventory, site, start_converged, stop_container
from wheelhouse import cache_dir

pytestmark = pytest.mark.integration

APT_CACHE = cache_dir() / "apt-debian12"
PACKAGES = ["nvidia-smi", "libcuda1", "libnvidia-ml1"]
NON_FREE = "s/ bookworm main$/ bookworm main contrib non-free non-free-firmware/"
REAL = ROOT / "tests/fixtures/nvidia_smi/real-535.261.03-no-module"
CONTAINER_FIRST = (
    "NVIDIA kernel module not loaded: in a container the NVIDIA kernel module belongs to the host's kernel"
)
MODULE = "(NVIDIA kernel module not loaded)"


def podman_exec(host: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def real_driver(tmp_path_factory):
    """The converged host with Debian's driver user space in place of the stand-in's, and its inventory."""
    APT_CACHE.mkdir(parents=True, exist_ok=True)
    host = start_converged("gpu-realdrv", "-v", f"{APT_CACHE}:/var/cache/apt/archives")
    try:
        removed = podman_exec(host, "nvidia-uninstall", "--silent")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert podman_exec(host, "sed", "-i", NON_FREE, "/etc/apt/sources.list").returncode == 0
        retry.apt_install(host, *PACKAGES)
        yield host, sandbox_inventory(tmp_path_factory.mktemp("realdrv") / "inventory", host)
    finally:
        stop_container(host)


def test_the_host_holds_debians_driver_packages_and_no_stand_in(real_driver):
    host, _inventory = real_driver
    listed = podman_exec(host, "dpkg-query", "-W", "-f", "${Package} ${Version} ${Maintainer}\\n", *PACKAGES)
    assert listed.returncode == 0, listed.stderr
    for line in listed.stdout.splitlines():
        _name, version, maintainer = line.split(" ", 2)
        assert version.startswith("535.") and "Debian NVIDIA Maintainers" in maintainer, line
    assert podman_exec(host, "test", "-e", "/var/lib/nvidia-standin/installed-files").returncode != 0


def test_the_real_nvidia_smi_says_the_driver_is_not_there(real_driver):
    host, _inventory = real_driver
    answer = podman_exec(host, "nvidia-smi", "-L")
    assert answer.returncode == 9
    assert answer.stdout == (REAL / "L.txt").read_text()


def test_preflight_names_the_kernel_module_and_the_run_goes_on(real_driver, tmp_path):
    _host, inventory = real_driver
    run = site(inventory, playbook="playbooks/preflight.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "--query-gpu exited 9: NVIDIA-SMI has failed because it couldn't communicate" in run.stdout
    assert CONTAINER_FIRST in run.stdout


def test_the_verification_fails_naming_the_kernel_module_and_reads_the_real_libcuda(real_driver, tmp_path):
    host, inventory = real_driver
    run = site(inventory, "-e", f"gpu_verify_report_dir={tmp_path}", playbook="playbooks/verify.yml")
    assert run.returncode != 0
    report = json.loads(latest_report(tmp_path, "inventory").read_text())
    entry = report["hosts"][host]
    assert entry["status"] == "FAIL"
    doc = entry["results"][0]
    (found,) = [p for p in doc["problems"] if p["check"] == "gpu_count"]
    assert f"nvidia-smi failed with exit 9 {MODULE}" in found["cause"]
    assert found["fix"].startswith("In a container the NVIDIA kernel module belongs to the host's kernel")
    assert "modprobe nvidia" in found["fix"]
    libcuda, libcudart = doc["libraries"]["libcuda"], doc["libraries"]["libcudart"]
    assert libcuda["release"].startswith("535.") and libcuda["version"] == "12.2"
    assert libcuda["path"].startswith("/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.")
    assert libcudart["call_error"].startswith("cudaRuntimeGetVersion returned 100 (cudaErrorNoDevice")
    assert {p["check"] for p in doc["problems"]} == {"gpu_count"}, doc["problems"]
    assert "reinstall" not in json.dumps(doc["problems"])


def test_the_health_check_names_the_kernel_module(real_driver):
    host, _inventory = real_driver
    checked = podman_exec(host, "gpu-health", "--format", "json")
    assert checked.returncode == 2, checked.stdout + checked.stderr
    error = json.loads(checked.stdout)["error"]
    assert f"failed with exit status 9 {MODULE}" in error["cause"]
    assert error["fix"].startswith("In a container the NVIDIA kernel module belongs to the host's kernel")
