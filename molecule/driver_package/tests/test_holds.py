"""A hold lifted by hand on the new host (after the scenario's final state): `--check --diff` shows the
hold nvidia_driver would put back through Ansible's dpkg_selections and changes nothing; the next run
puts it back, and only it (the driver playbook, one host; testinfra's host plus ansible_run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import run_playbook
from snapshots import write_inventory

HOST = "molecule-drvpkg-new"
LIFTED = "nvidia-smi"
HOLD_TASK = "TASK [gpu_fleet.tf_hosts.nvidia_driver : Hold the driver packages at the pinned version]"


def held() -> set[str]:
    done = subprocess.run(["podman", "exec", HOST, "apt-mark", "showhold"], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    folder = write_inventory(tmp_path_factory.mktemp("holds") / "inventory", HOST, {})
    (folder / "host_vars").symlink_to(ROOT / "molecule/driver_package/host_vars")
    return folder


def hold_section(stdout: str) -> str:
    start = stdout.index(HOLD_TASK)
    return stdout[start : stdout.index("TASK [", start + len(HOLD_TASK))]


def test_a_lifted_hold_is_shown_under_check_and_put_back_by_the_next_run(inventory):
    subprocess.run(["podman", "exec", HOST, "apt-mark", "unhold", LIFTED], check=True, capture_output=True)
    before = held()
    assert LIFTED not in before
    planned = run_playbook("playbooks/driver.yml", inventory, "--check", "--diff")
    assert planned.returncode == 0, planned.stdout[-4000:]
    section = hold_section(planned.stdout)
    assert f"changed: [{HOST}] => (item={LIFTED})" in section, section
    assert section.count("changed:") == 1, section  # the other names are still held: not looked at again
    assert held() == before, "--check changed a hold"
    run = run_playbook("playbooks/driver.yml", inventory)
    assert run.returncode == 0, run.stdout[-4000:]
    assert f"changed: [{HOST}] => (item={LIFTED})" in hold_section(run.stdout)
    assert held() == before | {LIFTED}
