"""A hold lifted by hand on the new host (after the scenario's final state): `--check --diff` shows the
hold nvidia_driver would put back through Ansible's dpkg_selections and changes nothing; the next run
puts it back, and only it. A new pin from a managed mirror: `--check --diff` shows the repository file
(Ansible's copy, with its diff) and writes nothing (the driver playbook, one host; ansible_run)."""

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


REPOSITORY_TASK = "TASK [gpu_fleet.tf_hosts.nvidia_driver : Add the driver repository]"
REPOSITORY_FILE = "/etc/apt/sources.list.d/gpu-fleet-nvidia-driver.list"
REPOSITORY_LINE = "deb [signed-by=/etc/apt/keyrings/gpu-fleet-nvidia-driver.asc] file:/srv/site-mirror /"


def test_a_repository_to_add_is_shown_under_check_with_its_line_and_nothing_changes(inventory, tmp_path):
    # A new pin from a managed mirror (a site mirror the host does not list yet; a URL that is already a
    # source stops preflight, so not the stand-in repository):
    # `--check --diff` shows the repository file that the run would write, and writes nothing.
    key = tmp_path / "mirror-key.asc"
    key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nstand-in\n-----END PGP PUBLIC KEY BLOCK-----\n")
    version = subprocess.run(
        ["podman", "exec", HOST, "dpkg-query", "-W", "-f", "${Version}", "nvidia-smi"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    planned = run_playbook(
        "playbooks/driver.yml", inventory, "--check", "--diff",
        "-e", "nvidia_driver_version=535.104.05", "-e", "nvidia_driver_package_repository_manage=true",
        "-e", "nvidia_driver_package_repository_url=file:/srv/site-mirror",
        "-e", f"nvidia_driver_package_repository_key={key}",
    )  # fmt: skip
    assert planned.returncode == 0, planned.stdout[-4000:]
    start = planned.stdout.index(REPOSITORY_TASK)
    section = planned.stdout[start : planned.stdout.index("TASK [", start + len(REPOSITORY_TASK))]
    assert f"changed: [{HOST}]" in section, section
    assert "+" + REPOSITORY_LINE in section, section
    absent = subprocess.run(["podman", "exec", HOST, "test", "-e", REPOSITORY_FILE], check=False)
    assert absent.returncode == 1, "--check wrote the repository file"
    after = subprocess.run(
        ["podman", "exec", HOST, "dpkg-query", "-W", "-f", "${Version}", "nvidia-smi"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert after == version, "--check changed the driver packages"
