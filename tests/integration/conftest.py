"""Fixtures for runs of the real playbooks against fresh sandbox containers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ansible_run import run_playbook

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("GPU_SANDBOX_IMAGE", "localhost/gpu-sandbox-debian:12")
STANDINS = ROOT / "build/standins"


def start_container(prefix: str, *options: str) -> str:
    """Start a new sandbox container named ``<prefix>-<random>`` (extra ``podman run`` options
    before the image); returns its name."""
    if shutil.which("podman") is None or not (STANDINS / "artifacts.yml").exists():
        pytest.fail("needs podman, the sandbox image and the stand-ins: run `make image standins` first")
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, GPU_SANDBOX_NAME=name, GPU_SANDBOX_IMAGE=IMAGE)
    subprocess.run([str(ROOT / "tools/sandbox.sh"), "up", *options], check=True, capture_output=True, env=env)
    return name


def stop_container(name: str) -> None:
    subprocess.run(["podman", "rm", "-f", "-t", "1", name], capture_output=True)


@pytest.fixture
def fresh_host(tmp_path):
    """A new sandbox container and an inventory for it that reuses the sandbox's group_vars.

    Yields ``(container name, inventory folder)``; the container is removed afterwards."""
    name = start_container("gpu-fresh")
    yield name, sandbox_inventory(tmp_path / "inventory", name)
    stop_container(name)


def sandbox_inventory(folder: Path, host: str) -> Path:
    """An inventory folder with ``host`` (a podman container) in gpu_hosts and the sandbox's group_vars."""
    folder.mkdir()
    (folder / "hosts.yml").write_text(
        f"gpu_hosts:\n  hosts:\n    {host}:\n      ansible_connection: gpu_fleet.tf_hosts.podman_pipelined\n"
    )
    (folder / "group_vars").symlink_to(ROOT / "inventories/sandbox/group_vars")
    return folder


def site(inventory: Path, *extra: str, playbook: str = "site.yml", timeout: int = 900) -> subprocess.CompletedProcess:
    """Run ``playbook`` (relative to the project) against ``inventory`` with extra arguments."""
    return run_playbook(playbook, inventory, *extra, timeout=timeout)
