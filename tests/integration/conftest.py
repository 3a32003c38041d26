"""Fixtures for runs of the real playbooks against sandbox containers (tests/sandbox_hosts.py)."""

from __future__ import annotations

import pytest
from sandbox_hosts import small_inventory, start_container, stop_container


@pytest.fixture
def fresh_host(tmp_path):
    """A new sandbox container and an inventory for it with the sandbox's group_vars and the small
    stand-ins (tests/fixtures/inventory/small): the tests that take it test the roles' logic.

    Yields ``(container name, inventory folder)``; the container is removed afterwards."""
    name = start_container("gpu-fresh")
    yield name, small_inventory(tmp_path / "inventory", name)
    stop_container(name)
