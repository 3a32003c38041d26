"""docs/usage.md's recipes hold settings the roles take: each a documented option, of its type and choices, with the
sandbox inventory's value where the sandbox sets it too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.gpu_fleet.tf_hosts.plugins.action.gpu_option_checks import unknown_variables
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import documented_options, role_of

ROOT = Path(__file__).resolve().parents[2]
USAGE = (ROOT / "docs/usage.md").read_text()
SANDBOX = yaml.safe_load((ROOT / "inventories/sandbox/group_vars/gpu_hosts.yml").read_text())


def recipe(section: str) -> dict:
    """The YAML block of the section of docs/usage.md headed ``section``."""
    text = USAGE.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    return yaml.safe_load(block)


STAGING = recipe("A staging host without a GPU")


def test_the_staging_recipe_gathers_the_settings_of_a_host_without_a_gpu():
    assert {
        "gpu_preflight_pci_devices_path",
        "gpu_health_pci_devices_path",
        "gpu_verify_expected_gpu_count",
        "gpu_verify_cpu_replicas",
        "nvidia_driver_kernel_modules",
        "gpu_artifacts_controller_dir",
        "gpu_preflight_manifest_overlays",
    } <= set(STAGING)


def test_every_setting_of_the_staging_recipe_is_an_option_preflight_takes():
    assert unknown_variables(STAGING) == []


@pytest.mark.parametrize("name", sorted(STAGING))
def test_every_setting_of_the_staging_recipe_keeps_its_roles_specification(name):
    value = STAGING[name]
    if "{{" in str(value):
        pytest.skip("a template: its value is known on the controller only")
    specs = documented_options(role_of(name))
    assert ArgumentSpecValidator({name: specs[name]}).validate({name: value}).error_messages == []


@pytest.mark.parametrize("name", sorted(set(STAGING) & set(SANDBOX)))
def test_the_staging_recipe_says_what_the_sandbox_inventory_does(name):
    assert STAGING[name] == SANDBOX[name]
