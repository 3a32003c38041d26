"""Every role documents its variables in meta/argument_specs.yml, and the spec agrees with defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES)
def test_spec_and_defaults_agree(role):
    spec = _load(ROOT / "roles" / role / "meta/argument_specs.yml")["argument_specs"]
    defaults_file = ROOT / "roles" / role / "defaults/main.yml"
    defaults = _load(defaults_file) if defaults_file.exists() else {}
    documented = {}
    for entry in spec.values():
        for name, option in (entry.get("options") or {}).items():
            assert option.get("description"), f"{role}: {name} has no description"
            assert option.get("type"), f"{role}: {name} has no type"
            if option.get("type") == "list":
                assert option.get("elements"), f"{role}: list option {name} has no elements"
            if "default" in option:
                documented[name] = option["default"]
    assert set(defaults) == set(documented), f"{role}: defaults and argument_specs list different variables"
    for name, value in defaults.items():
        assert documented[name] == value, f"{role}: {name} default differs between defaults/ and the spec"


@pytest.mark.parametrize("role", ROLES)
def test_public_variables_carry_the_role_prefix(role):
    spec = _load(ROOT / "roles" / role / "meta/argument_specs.yml")["argument_specs"]
    for entry in spec.values():
        for name in entry.get("options") or {}:
            assert name.startswith(f"{role}_"), f"{role}: {name} lacks the role prefix"


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_lists_every_variable(role):
    readme = ROOT / "roles" / role / "README.md"
    assert readme.exists(), f"{role} has no README.md"
    text = readme.read_text()
    spec = _load(ROOT / "roles" / role / "meta/argument_specs.yml")["argument_specs"]
    for entry in spec.values():
        for name in entry.get("options") or {}:
            assert f"`{name}`" in text, f"{role}: README does not list {name}"


def test_role_readmes_are_generated_from_the_specs():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, str(ROOT / "tools/gen-role-readmes.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, f"run tools/gen-role-readmes.py: {result.stdout}"


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_tables_keep_their_columns(role):
    """A stray pipe (a Jinja filter in a default) would split a cell and shift the row."""
    for line in (ROOT / "roles" / role / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            assert len(cells) == 4, f"{role}: {line}"
