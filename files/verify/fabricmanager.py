"""NVIDIA's fabric manager on NVSwitch hosts: running, and at exactly the driver's version.

NVIDIA Fabric Manager User Guide (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/):
on NVSwitch systems (HGX A100/H100) CUDA initialisation fails with error 802 ("system not yet
initialized") until the fabric manager has configured the switches, and the fabric manager must be
the same version as the driver. Stdlib only (hosts may run Python 3.8).
"""

from __future__ import annotations

import os
import re
import subprocess

from verify_common import Problem, problem

PROCESS = "nv-fabricmanager"
SERVICE = "nvidia-fabricmanager"
VERSION = re.compile(r"version\D*?(\d+\.\d+(?:\.\d+)?)", re.I)


def fabricmanager_problems(
    required: bool, running: bool, fm_version: str | None, driver_version: str | None
) -> list[Problem]:
    """Problems of the fabric manager on a host with NVSwitches (``required``); none elsewhere."""
    if not required:
        return []
    if not running:
        return [
            problem(
                "fabricmanager",
                f"This host has NVSwitches and NVIDIA's fabric manager ({PROCESS}) is not running; CUDA "
                "initialisation fails (error 802, system not yet initialized) until it has set up the switches.",
                f"start it (`systemctl enable --now {SERVICE}`; `journalctl -u {SERVICE}` says why it stopped), "
                "or rerun the nvidia_driver role with nvidia_driver_method: package, which installs and starts it",
            )
        ]
    if fm_version and driver_version and fm_version != driver_version:
        return [
            problem(
                "fabricmanager",
                f"The fabric manager is version {fm_version} and the driver {driver_version}; they must be the "
                "same version, or the fabric manager refuses the switches.",
                f"install the fabric manager package of driver {driver_version} (rerun the nvidia_driver role) "
                f"and restart it (`systemctl restart {SERVICE}`)",
            )
        ]
    return []


def parse_version(text: str) -> str | None:
    """The version in ``nv-fabricmanager --version``'s output, or None."""
    match = VERSION.search(text or "")
    return match.group(1) if match else None


def is_running(proc: str = "/proc") -> bool:
    """Whether a process named nv-fabricmanager runs (works with or without systemd)."""
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc, pid, "comm")) as comm:
                if comm.read().strip() == PROCESS:
                    return True
        except OSError:
            continue
    return False


def check(required: bool, driver_version: str | None, binary: str = PROCESS) -> dict[str, object]:
    """Probe this host: ``{required, running, version, problems}``."""
    if not required:
        return {"required": False, "running": None, "version": None, "problems": []}
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    running, version = is_running(), parse_version(out)
    return {
        "required": True,
        "running": running,
        "version": version,
        "problems": fabricmanager_problems(True, running, version, driver_version),
    }
