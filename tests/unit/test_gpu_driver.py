"""gpu_driver_module_version: the loaded kernel module's version, as nvidia_driver's configure.yml reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# tests/conftest.py puts ROOT/collections on sys.path, so the filter imports its parser by collection path.
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_driver

ROOT = Path(__file__).resolve().parents[2]
PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  520.61.05  Thu Sep 29 05:30:25 UTC 2022\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  (dvs-builder@x)\n"


def ansible_env() -> dict[str, str]:
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOME=str(ROOT / ".ansible"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [(PROPRIETARY, "520.61.05"), (OPEN_MODULE, "535.104.05"), ("", None), (None, None), ("GCC version: 12\n", None)],
)
def test_filter_returns_the_module_version(text: str | None, expected: str | None) -> None:
    assert gpu_driver.gpu_driver_module_version(text) == expected


def test_filter_is_registered() -> None:
    filters = gpu_driver.FilterModule().filters()
    assert filters == {"gpu_driver_module_version": gpu_driver.gpu_driver_module_version}


def test_a_version_that_only_starts_the_same_is_not_the_loaded_one() -> None:
    # The old check was a substring test: "520.61.0" in the text of a 520.61.05 module was True.
    assert gpu_driver.gpu_driver_module_version(PROPRIETARY) != "520.61.0"


def test_configure_yml_expression_through_ansible() -> None:
    """The role's when: condition, rendered by Ansible with the filter found by its FQCN."""
    expression = (
        "{{ [(proc | b64encode | b64decode | gpu_fleet.tf_hosts.gpu_driver_module_version) != '520.61.05',"
        " (proc | b64encode | b64decode | gpu_fleet.tf_hosts.gpu_driver_module_version) != '520.61.0'] }}"
    )
    out = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible")),
            "localhost",
            "-m",
            "ansible.builtin.debug",
            "-a",
            f"msg={expression}",
            "-e",
            json.dumps({"proc": PROPRIETARY}),
        ],
        capture_output=True,
        text=True,
        env=dict(ansible_env(), ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1"),
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["msg"] == [False, True]


def test_ansible_doc_renders_the_filter() -> None:
    out = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-doc")),
            "-t",
            "filter",
            "gpu_fleet.tf_hosts.gpu_driver_module_version",
        ],
        capture_output=True,
        text=True,
        env=ansible_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for text in ("gpu_driver_module_version", "/proc/driver/nvidia/version", "RETURN VALUES", "EXAMPLES"):
        assert text in out.stdout, text
