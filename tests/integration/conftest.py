"""Fixtures for runs of the real playbooks against sandbox containers (tests/sandbox_hosts.py)."""

from __future__ import annotations

import pytest
from sandbox_hosts import sandbox_inventory, start_container, stop_container


@pytest.fixture
def fresh_host(tmp_path):
    """A new sandbox container and an inventory for it that reuses the sandbox's group_vars.

    Yields ``(container name, inventory folder)``; the container is removed afterwards."""
    name = start_container("gpu-fresh")
    yield name, sandbox_inventory(tmp_path / "inventory", name)
    stop_container(name)
