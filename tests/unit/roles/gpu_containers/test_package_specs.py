"""gpu_containers' package data (roles/gpu_containers/vars/main.yml), rendered by Ansible's templar as the role
renders it: per package manager, the four packages at exactly X.Y.Z-1 in the form NVIDIA's install guide writes
(apt: name=X.Y.Z-1; dnf: name-X.Y.Z-1), the repository line and the query of the installed versions."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[4]
VARS = yaml.safe_load((ROOT / "roles/gpu_containers/vars/main.yml").read_text())
DEFAULTS = yaml.safe_load((ROOT / "roles/gpu_containers/defaults/main.yml").read_text())


def trusted(value):
    """Values as a role's vars file gives them: templates Ansible may render (ansible-core 2.19 renders no others)."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    return [trusted(v) for v in value] if isinstance(value, list) else value


def render(name: str, pkg_mgr: str, **extra):
    variables = trusted({**DEFAULTS, **VARS}) | {"ansible_facts": {"pkg_mgr": pkg_mgr}, **extra}
    return Templar(loader=DataLoader(), variables=variables).template(trusted(VARS[name]))


@pytest.mark.parametrize(("pkg_mgr", "form"), [("apt", "{}=1.17.8-1"), ("dnf", "{}-1.17.8-1")], ids=["apt", "dnf"])
def test_every_package_pinned_in_the_managers_form(pkg_mgr, form):
    assert render("__gpu_containers_specs", pkg_mgr) == [form.format(p) for p in VARS["__gpu_containers_packages"]]


def test_a_site_mirror_replaces_nvidias_repository():
    assert render("__gpu_containers_url", "apt") == "https://nvidia.github.io/libnvidia-container/stable/deb/amd64"
    mirror = "https://mirror.example/nvidia-container-toolkit/deb/amd64"
    assert render("__gpu_containers_url", "dnf", gpu_containers_repository_url=mirror) == mirror


def test_the_installed_versions_print_in_the_specs_form():
    managers = VARS["__gpu_containers_managers"]
    assert managers["apt"]["query_command"][-1] == "--showformat=${Package}=${Version}\\n"
    assert managers["dnf"]["query_command"][-1] == "--queryformat=%{NAME}-%{VERSION}-%{RELEASE}\\n"


def _daemon(config: dict) -> dict:
    return {"__gpu_containers_daemon_json": {"content": base64.b64encode(json.dumps(config).encode()).decode()}}


def test_docker_configured_until_it_has_nvidias_runtime_and_cdi():
    runtime = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    assert render("__gpu_containers_docker_stale", "apt", __gpu_containers_daemon_json={"failed": True})
    # The runtime alone (what `nvidia-ctk runtime configure` without --cdi.enabled writes): CDI still off.
    assert render("__gpu_containers_docker_stale", "apt", **_daemon(runtime))
    assert render("__gpu_containers_docker_stale", "apt", **_daemon({**runtime, "features": {"cdi": False}}))
    assert not render("__gpu_containers_docker_stale", "apt", **_daemon({**runtime, "features": {"cdi": True}}))


@pytest.mark.parametrize(
    ("ps", "busy"),
    [
        ({"rc": 0, "stdout": ""}, False),
        ({"rc": 0, "stdout": "3f2a9c1d0b7e\n"}, True),
        ({"rc": 1, "stdout": "", "stderr": "Cannot connect to the Docker daemon"}, True),
    ],
    ids=["no-containers", "a-container-runs", "no-answer"],
)
def test_docker_restarts_only_without_running_containers(ps, busy):
    assert render("__gpu_containers_docker_busy", "apt", __gpu_containers_docker_ps=ps) is busy


def test_dnf_installs_the_versionlock_plugin_and_releases_old_locks_before_a_new_pin():
    tasks = yaml.safe_load((ROOT / "roles/gpu_containers/tasks/package_dnf.yml").read_text())
    names = [task["name"] for task in tasks]
    plugin, release, install = (
        names.index("Install dnf's versionlock plugin, which holds the packages"),
        names.index("Release the version locks for the new pin"),
        names.index("Install the pinned container toolkit packages"),
    )
    assert plugin < release < install
    manager = render("__gpu_containers_manager", "dnf")
    assert manager["hold_requires"] == ["python3-dnf-plugin-versionlock"]
    assert tasks[plugin]["ansible.builtin.dnf"]["name"] == "{{ __gpu_containers_manager.hold_requires }}"
    assert manager["release_command"] + VARS["__gpu_containers_packages"] == [
        "dnf",
        "versionlock",
        "delete",
        *VARS["__gpu_containers_packages"],
    ]
    # Released only when the packages are to change: a rerun with the same pin keeps its locks.
    assert tasks[release]["when"] == tasks[install]["when"] == "__gpu_containers_packages_stale | bool"


@pytest.mark.parametrize(("installed", "stale"), [(["{}-1.17.8-1"], False), (["{}-1.16.2-1"], True), ([], True)])
def test_packages_change_only_when_not_at_the_pin(installed, stale):
    lines = [form.format(p) for form in installed for p in VARS["__gpu_containers_packages"]]
    got = render(
        "__gpu_containers_packages_stale",
        "dnf",
        __gpu_containers_installed={"stdout_lines": lines},
        ansible_check_mode=False,
    )
    assert got is stale
