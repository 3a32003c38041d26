"""Sandbox containers for the tests that run the real playbooks: fresh ones from the base image, or
converged ones from the ``converged`` snapshot (tests/snapshots.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from ansible_run import run_playbook
from snapshots import SMALL_GROUP_VARS, ensure, write_inventory
from wheelhouse import container_options

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("GPU_SANDBOX_IMAGE", "localhost/gpu-sandbox-debian:12")
STANDINS = ROOT / "build/standins"
SMALL_STANDINS = ROOT / "build/standins-small"


def start_container(prefix: str, *options: str, image: str = IMAGE, wheelhouse: bool = True) -> str:
    """Start a new sandbox container named ``<prefix>-<random>`` from ``image`` (extra ``podman run``
    options before the image; with ``wheelhouse``, pip on the host installs from the session's
    wheelhouse: tests/wheelhouse.py); returns its name."""
    if shutil.which("podman") is None or not (STANDINS / "artifacts.yml").exists():
        pytest.fail("needs podman, the sandbox image and the stand-ins: run `make image standins` first")
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, GPU_SANDBOX_NAME=name, GPU_SANDBOX_IMAGE=image)
    wheels = container_options() if wheelhouse else []
    subprocess.run([str(ROOT / "tools/sandbox.sh"), "up", *wheels, *options], check=True, capture_output=True, env=env)
    return name


def start_converged(prefix: str, *options: str) -> str:
    """A new container from the ``converged`` snapshot (built first if no snapshot has the current
    key: GPU_SNAPSHOT_CONVERGED may name it when the caller ensured it already)."""
    image = os.environ.get("GPU_SNAPSHOT_CONVERGED") or ensure("converged")
    return start_container(prefix, *options, image=image)


def link_or_copy(source: str, dest: str) -> str:
    """A hard link of ``source`` at ``dest``, a copy where they are on two file systems (shutil.copytree's
    ``copy_function``): NVIDIA's real files in build/standins are gigabytes."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)
    return dest


def stop_container(name: str) -> None:
    subprocess.run(["podman", "rm", "-f", "-t", "1", name], capture_output=True)


def sandbox_inventory(folder: Path, host: str) -> Path:
    """An inventory folder with ``host`` (a podman container) in gpu_hosts and the sandbox's group_vars
    (NVIDIA's real files, TensorFlow's GPU build: what a host of the ``converged`` snapshot has)."""
    return write_inventory(folder, host, {})


def small_inventory(folder: Path, host: str) -> Path:
    """The same for a fresh host of a test of the roles' logic: the stand-ins built from source and
    TensorFlow's CPU build (tests/fixtures/inventory/small)."""
    return write_inventory(folder, host, {}, SMALL_GROUP_VARS)


def site(inventory: Path, *extra: str, playbook: str = "site.yml", timeout: int = 900) -> subprocess.CompletedProcess:
    """Run ``playbook`` (relative to the project) against ``inventory`` with extra arguments."""
    return run_playbook(playbook, inventory, *extra, timeout=timeout)
