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


def _role_tasks(tasks: list | None) -> list[dict]:
    """The tasks of a play section with every block's tasks in its place, and the tasks of each task file of
    playbooks/tasks it imports (as Ansible runs them there)."""
    found = []
    for task in tasks or []:
        imported = task.get("ansible.builtin.import_tasks")
        if "block" in task:
            found += _role_tasks(task["block"] + task.get("rescue", []) + task.get("always", []))
        elif isinstance(imported, str) and (ROOT / "playbooks" / imported).is_file():
            found += _role_tasks(yaml.safe_load((ROOT / "playbooks" / imported).read_text()))
        else:
            found.append(task)
    return found


def _unvalidated() -> list[tuple[str, int, str, str]]:
    """(playbook or task file, play index, role, entry point) of every role import that skips its argument spec's
    validation; a task file of playbooks/tasks counts as one play (index 0)."""
    found = []
    for path in sorted((ROOT / "playbooks").glob("*.yml")) + sorted((ROOT / "playbooks/tasks").glob("*.yml")):
        for index, play in enumerate(_plays(path)):
            for task in _role_tasks((play.get("tasks") or []) + (play.get("post_tasks") or [])):
                include = task.get("ansible.builtin.import_role") or task.get("ansible.builtin.include_role") or {}
                if include.get("rolespec_validate") is False:
                    found.append((path, index, include["name"].split(".")[-1], include.get("tasks_from", "main")))
    return found


def _plays(path: Path) -> list[dict]:
    """A playbook's plays, or a task file as one play."""
    return _load_all(path) if path.parent.name == "playbooks" else [{"tasks": yaml.safe_load(path.read_text()) or []}]


def _validated_before(play: dict, role: str, entry: str) -> list[str]:
    """What validated options earlier in the play than ``role``'s import of ``entry``: ``<role>/main`` for each
    role main ran of (a play's roles, an import or include), ``<role>/options`` for each role a
    gpu_option_checks task checked."""
    steps = [r["role"].split(".")[-1] + "/main" for r in play.get("roles") or []]
    for task in _role_tasks(play.get("tasks")):
        include = task.get("ansible.builtin.import_role") or task.get("ansible.builtin.include_role") or {}
        checked = (task.get("gpu_fleet.tf_hosts.gpu_option_checks") or {}).get("roles") or []
        steps += [f"{name}/options" for name in checked]
        if include:
            step = include["name"].split(".")[-1] + "/" + include.get("tasks_from", "main")
            if step == f"{role}/{entry}":
                break
            steps.append(step)
    return steps


def test_an_entry_point_skips_its_validation_only_after_its_options_were_validated():
    """An import with rolespec_validate false is an entry point whose options are all main's, after main of that
    role, or a gpu_option_checks task naming that role (it checks main's specification), earlier in the same
    play: the same values were validated once already."""
    skipped = _unvalidated()
    assert skipped, "no import skips its validation: drop this test"
    for path, index, role, entry in skipped:
        spec = _load(ROOT / "roles" / role / "meta/argument_specs.yml")["argument_specs"]
        assert set(spec[entry].get("options") or {}) <= set(spec["main"].get("options") or {}), (path.name, role, entry)
        steps = _validated_before(_plays(path)[index], role, entry)
        assert {f"{role}/main", f"{role}/options"} & set(steps), (
            f"{path.name}: {role}/{entry} skips its validation before {role}/main ran or gpu_option_checks checked it"
        )


def _load_all(path: Path) -> list[dict]:
    return [play for play in yaml.safe_load(path.read_text()) or [] if "hosts" in play]
