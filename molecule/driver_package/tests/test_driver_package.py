"""Both hosts after converge, idempotence and side_effect (upgrade to 535.104.05, then downgrade):
the 520.61.05 packages from the stand-in repository, held, recorded, out of unattended upgrades;
the switched host has no runfile driver left; the new host also has the fabric manager of the
driver's branch and version (testinfra, podman backend)."""

from __future__ import annotations

import re

DRIVER = "520.61.05"
PACKAGES = ("nvidia-driver-cuda", "libcuda1", "libnvidia-ml1", "nvidia-smi")
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def test_packages_at_the_pinned_version(host):
    for name in PACKAGES:
        package = host.package(name)
        assert package.is_installed and package.version == f"{DRIVER}-1", (name, package.version)


def test_packages_are_held(host):
    held = set(host.check_output("apt-mark showhold").split())
    assert held >= set(PACKAGES), held


def test_no_kernel_packages_in_a_container(host):
    for name in ("nvidia-kernel-dkms", "nvidia-kernel-open-dkms"):
        assert not host.package(name).is_installed, name


def test_nvidia_smi_reports_the_pin(host):
    assert host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader").split() == [DRIVER] * 2


def test_only_the_pinned_libcuda_is_there(host):
    assert host.file(f"{LIBDIR}/libcuda.so.{DRIVER}").is_file
    assert host.file(f"{LIBDIR}/libcuda.so.1").linked_to == f"{LIBDIR}/libcuda.so.{DRIVER}"
    assert not host.file(f"{LIBDIR}/libcuda.so.535.104.05").exists


def test_completion_record_names_version_and_method(host):
    assert host.file("/var/lib/gpu_fleet/nvidia_driver.done").content_string.split() == [DRIVER, "package"]


def test_runfile_driver_is_gone(host):
    # The switched host ran the runfile's uninstaller before the packages went in.
    assert not host.file("/usr/bin/nvidia-uninstall").exists


def test_unattended_upgrades_leave_the_driver_alone(host):
    conf = host.file("/etc/apt/apt.conf.d/51gpu-fleet-nvidia-driver")
    assert conf.mode == 0o644
    text = conf.content_string
    assert "Unattended-Upgrade::Package-Blacklist {" in text
    # unattended-upgrades matches each entry as a regular expression against package names.
    patterns = re.findall(r'^\s*"([^"]+)";$', text, re.M)
    for name in PACKAGES:
        assert any(re.match(pattern, name) for pattern in patterns), (name, patterns)
    assert not any(re.match(pattern, "python3") for pattern in patterns)


def test_fabric_manager_at_the_drivers_version_where_asked(host):
    wanted = host.backend.get_hostname() == "molecule-drvpkg-new"
    package = host.package("nvidia-fabricmanager-520")
    assert package.is_installed == wanted
    assert not host.package("nvidia-fabricmanager-535").is_installed
    if wanted:
        assert package.version == f"{DRIVER}-1"
        assert "nvidia-fabricmanager-520" in host.check_output("apt-mark showhold").split()
        assert host.check_output("nv-fabricmanager --version").strip() == f"Fabric Manager version is : {DRIVER}"
