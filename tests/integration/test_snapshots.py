"""The ``converged`` snapshot (tests/snapshots.py) as the tests that start hosts from it get it.

Built by the first part that needs it (its site.yml run and PASS are asserted while it is built);
here: it carries its key, a second ``ensure`` reuses it instead of building again, a container
started from it holds the converged stack, and an image of the same state under another key is
removed, never used.
"""

from __future__ import annotations

import subprocess

import pytest
import snapshots
from sandbox_hosts import start_converged, stop_container

pytestmark = pytest.mark.integration


def inspect(image: str, template: str) -> str:
    return snapshots.podman("image", "inspect", "--format", template, image).stdout.strip()


def test_the_snapshot_carries_its_key_and_is_reused():
    state = snapshots.STATES["converged"]
    image = snapshots.ensure("converged")
    key = snapshots.key(state)
    assert image == snapshots.image_name(state, key)
    assert inspect(image, '{{ index .Labels "io.gpu-fleet.snapshot-key" }}') == key
    built = inspect(image, "{{.Id}}")
    assert snapshots.ensure("converged") == image
    assert inspect(image, "{{.Id}}") == built, "a snapshot with the current key was built again"


def test_a_host_from_the_snapshot_holds_the_converged_stack():
    name = start_converged("gpu-snapshot-check")
    try:
        probe = (
            "readlink /usr/local/cuda && cat /var/lib/gpu_fleet/nvidia_driver.done && "
            "cat /opt/tensorflow/2.12/tf-lock.sha256 && "
            "/opt/tensorflow/2.12/bin/python -c 'import importlib.metadata as m; print(m.version(\"tensorflow\"))'"
        )
        done = subprocess.run(["podman", "exec", name, "sh", "-c", probe], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split("\n")
        assert lines[0] == "/usr/local/cuda-11.8"
        assert lines[1] == "520.61.05"
        assert lines[-2] == "2.12.1"
    finally:
        stop_container(name)


def test_an_image_of_the_state_under_another_key_is_removed(monkeypatch):
    # Whatever the shell says (GPU_FLEET_SNAPSHOT_PRUNE=0 keeps other keys' images for work trees side by side).
    monkeypatch.delenv("GPU_FLEET_SNAPSHOT_PRUNE", raising=False)
    state = snapshots.STATES["converged"]
    image = snapshots.ensure("converged")
    stale = f"{snapshots.REPOSITORY}:converged-{'0' * 16}"
    snapshots.podman("tag", image, stale)
    snapshots._prune(state, keep=image)
    assert not snapshots.exists(stale)
    assert snapshots.exists(image)


def test_a_host_kept_as_the_snapshot_is_not_committed_over_an_image_with_the_key():
    """Molecule default keeps its converged host (``keep``); with an image of the current key there
    already, nothing is committed and that image is the answer."""
    image = snapshots.ensure("converged")
    built = inspect(image, "{{.Id}}")
    name = start_converged("gpu-snapshot-keep")
    try:
        assert snapshots.keep("converged", name) == image
    finally:
        stop_container(name)
    assert inspect(image, "{{.Id}}") == built
