"""Debian 12's real Slurm (22.05: ``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``) for the Slurm test
(tests/integration/test_slurm.py): images built once per machine and kept, a shared munge key, and a
slurm.conf for one controller and its GPU nodes.

Two images, each made by ``apt-get install`` in a container of its base and ``podman commit``:
the controller from the sandbox base image, the GPU nodes from the converged snapshot (its image ID in the
tag, so a new snapshot gets its own). Downloads run through tests/retry.py (tried again, then a clear
give-up message with apt's own output).
"""

from __future__ import annotations

import os
import subprocess
import uuid

from retry import apt_install
from sandbox_hosts import IMAGE

CONTROLLER_IMAGE = "localhost/gpu-slurm-controller:12"
NODE_PACKAGES = ("slurmd", "slurm-client", "munge")
CONTROLLER_PACKAGES = ("slurmctld", "slurm-client", "munge")
RUN_OPTIONS = ("--runtime=runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")


def _exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0


def _image_id(image: str) -> str:
    done = subprocess.run(
        ["podman", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()[:12]


def _build(base: str, tag: str, packages: tuple[str, ...]) -> str:
    """``tag``, made once: ``packages`` installed in a container of ``base``, committed."""
    if _exists(tag):
        return tag
    name = f"gpu-slurm-build-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["podman", "run", "-d", "--name", name, *RUN_OPTIONS, base, "sleep", "infinity"],
        check=True,
        capture_output=True,
    )
    try:
        apt_install(name, *packages, timeout=900)
        subprocess.run(["podman", "commit", "-q", name, tag], check=True, capture_output=True)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "1", name], capture_output=True, check=False)
    return tag


NODE_REPOSITORY = "localhost/gpu-slurm-node"


def controller_image() -> str:
    return _build(IMAGE, CONTROLLER_IMAGE, CONTROLLER_PACKAGES)


def node_image(converged: str) -> str:
    """The converged snapshot with slurmd and munge, tagged by the snapshot's image ID. The node images of
    other snapshots go: each holds its whole converged snapshot (about 6 GB) after tests/snapshots.py pruned it."""
    tag = _build(converged, f"{NODE_REPOSITORY}:{_image_id(converged)}", NODE_PACKAGES)
    listed = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference={NODE_REPOSITORY}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    for image in listed:
        if image != tag:
            subprocess.run(["podman", "rmi", "-f", image], capture_output=True, check=False)
    return tag


if __name__ == "__main__":  # build both ahead of a test run: python tests/slurm_sandbox.py
    print(controller_image())
    print(node_image(os.environ.get("GPU_SNAPSHOT_CONVERGED", "localhost/gpu-dev-converged:main")))
