"""House rules that keep the collection easy to live in, checked on the source tree.

- Roles meet only through published outputs: no role names another role's private (``__``)
  variables, no role notifies another role's handler, and no plugin reads a role's private names.
- One supported-OS list (data/supported_os.yml) that role metadata and the README agree with.
- No product or tool function longer than a screen (60 lines).
- No code comment names one of this project's issues: comments say why (a public tracker's issue, named
  with its repository or URL, is a source and may be cited).
- The verification's tail (health, verification, record) is written once, in playbooks/tasks/verification.yml,
  which playbooks/verify.yml and playbooks/reprovision.yml import.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
PRIVATE = re.compile(r"\b__([a-z][a-z0-9_]*)")
MAX_FUNCTION_LINES = 60
PRODUCT_PYTHON = ["plugins", "files/verify", "files/health", "roles", "tools"]


def owner(private_name: str) -> str | None:
    """The role a private name (without its leading ``__``) belongs to: the longest role name it
    starts with, followed by ``_`` or nothing."""
    matches = [r for r in ROLES if private_name == r or private_name.startswith(r + "_")]
    return max(matches, key=len) if matches else None


def role_files(role: str) -> list[Path]:
    return [p for p in (ROOT / "roles" / role).rglob("*") if p.is_file() and p.suffix in (".yml", ".j2", ".py")]


def foreign_private_names(role: str) -> set[str]:
    found = set()
    for path in role_files(role):
        for name in PRIVATE.findall(path.read_text(encoding="utf-8")):
            if owner(name) not in (None, role):
                found.add(f"{path.relative_to(ROOT)}: __{name}")
    return found


@pytest.mark.parametrize("role", ROLES)
def test_no_role_names_another_roles_private_variables(role):
    assert not foreign_private_names(role), "use the owning role's published output instead"


def test_the_private_name_check_catches_a_foreign_name(tmp_path, monkeypatch):
    assert owner("gpu_verify_results") == "gpu_verify"
    assert owner("cuda_toolkit") == "cuda_toolkit"
    assert owner("gpu_verifyx") is None
    fake = tmp_path / "roles" / "cudnn" / "tasks"
    fake.mkdir(parents=True)
    (fake / "main.yml").write_text("x: '{{ __gpu_env_root }} {{ __cudnn_stack }}'\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert foreign_private_names("cudnn") == {"roles/cudnn/tasks/main.yml: __gpu_env_root"}


def test_plugins_read_no_private_role_variables():
    offenders = [
        f"{path.relative_to(ROOT)}: __{name}"
        for path in (ROOT / "plugins").rglob("*.py")
        for name in PRIVATE.findall(path.read_text(encoding="utf-8"))
        if owner(name)
    ]
    assert not offenders, "plugins read published facts (<role>_*), never a role's __ variables"


def handler_topics(role: str) -> set[str]:
    path = ROOT / "roles" / role / "handlers" / "main.yml"
    handlers = yaml.safe_load(path.read_text()) if path.exists() else []
    topics = set()
    for handler in handlers or []:
        topics.add(handler["name"])
        listen = handler.get("listen") or []
        topics.update([listen] if isinstance(listen, str) else listen)
    return topics


def notified_topics(role: str) -> set[str]:
    topics = set()
    for path in role_files(role):
        if path.suffix != ".yml":
            continue
        for match in re.finditer(r"^\s*notify:\s*(.+)$", path.read_text(encoding="utf-8"), re.MULTILINE):
            value = yaml.safe_load(match.group(1))
            topics.update([value] if isinstance(value, str) else value or [])
    return topics


@pytest.mark.parametrize("role", ROLES)
def test_roles_notify_only_their_own_handlers(role):
    missing = notified_topics(role) - handler_topics(role)
    assert not missing, f"{role} notifies handlers it does not own: {sorted(missing)}"


def supported_os() -> dict:
    return yaml.safe_load((ROOT / "data" / "supported_os.yml").read_text())["supported_os"]


def galaxy_platforms() -> list[dict]:
    platforms: dict[str, list[str]] = {}
    for entry in supported_os().values():
        versions = platforms.setdefault(entry["galaxy"]["name"], [])
        versions += [str(v) for v in entry["galaxy"]["versions"] if str(v) not in versions]
    return [{"name": name, "versions": versions} for name, versions in platforms.items()]


@pytest.mark.parametrize("role", ROLES)
def test_role_metadata_lists_the_supported_os(role):
    meta = yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text())
    listed = [
        {"name": p["name"], "versions": [str(v) for v in p["versions"]]} for p in meta["galaxy_info"]["platforms"]
    ]
    assert listed == galaxy_platforms()


def test_readme_states_the_supported_os_list():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for distribution, entry in supported_os().items():
        row = f"| {distribution} | {', '.join(str(v) for v in entry['versions'])} | {entry['tested']} |"
        assert row in readme, f"README.md lacks the row {row!r}"


def test_every_supported_family_has_its_per_os_data():
    """Per-OS data is a ``*_of_os_family`` table in a role's vars/main.yml (or a vars file named after an OS family
    or distribution): each has an entry for every supported OS."""
    families = {"Debian": "Debian", "Ubuntu": "Debian", "RedHat": "RedHat", "Rocky": "RedHat"}
    os_names = set(families) | set(families.values())
    tables = 0
    for vars_dir in sorted((ROOT / "roles").glob("*/vars")):
        per_os = {p.stem for p in vars_dir.glob("*.yml")} & os_names
        main = vars_dir / "main.yml"
        by_family = {
            key: value
            for key, value in (yaml.safe_load(main.read_text()) if main.is_file() else {}).items()
            if key.endswith("_of_os_family")
        }
        tables += len(by_family)
        for distribution in supported_os():
            family = families[distribution]
            if per_os:
                assert family in per_os or distribution in per_os, f"{vars_dir} has no data for {distribution}"
            for key, table in by_family.items():
                assert family in table, f"{main}: {key} has no {family} entry (for {distribution})"
    assert tables >= 4, "the per-OS tables of vars/main.yml were not found"


def long_functions(folder: Path) -> list[str]:
    found = []
    for path in folder.rglob("*.py"):
        if path.is_symlink():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("folder", PRODUCT_PYTHON)
def test_no_product_function_is_longer_than_a_screen(folder):
    assert not long_functions(ROOT / folder)


# "issue 12", "Issue 12, item 4", "issue #12": this project's tracker, which a reader of the code cannot open.
# A public one is cited as "<owner>/<repo> issue #N" or by URL, and is left alone.
OWN_ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
CODE_FOLDERS = ["roles", "plugins", "playbooks", "files", "tools", "tests", "molecule", "inventories", ".ci"]
CODE_SUFFIXES = {".py", ".yml", ".yaml", ".j2", ".sh", ".cfg"}


def own_issue_mentions(text: str) -> list[str]:
    """The places in ``text`` that name an issue of this project rather than cite a public one."""
    found = []
    for line in text.splitlines():
        for match in OWN_ISSUE.finditer(line):
            before = line[: match.start()].rstrip()
            if "github.com" in line or re.search(r"[\w.-]+/[\w.-]+$", before):
                continue
            found.append(line.strip())
    return found


def test_the_issue_rule_tells_a_project_issue_from_a_public_citation():
    assert own_issue_mentions("# the two stacks of issue 12: TF 2.12 and 2.18")
    assert own_issue_mentions('"""Interrupted runs (Issue 13, item 5): ..."""')
    assert not own_issue_mentions("# quoted in tensorflow/tensorflow issue #62626, where")
    assert not own_issue_mentions("# https://github.com/ansible/ansible/issues/18131")


def test_no_comment_names_a_project_issue():
    this = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}: {line}"
        for folder in CODE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*"))
        if path.is_file()
        and path.suffix in CODE_SUFFIXES
        and path.resolve() != this
        and ".venv" not in path.parts
        and "__pycache__" not in path.parts
        for line in own_issue_mentions(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert found == [], "say why instead of naming an issue number:\n" + "\n".join(found)


# The role entry points that make up the verification's tail; only its one file may call them.
TAIL_FILE = "playbooks/tasks/verification.yml"
TAIL_STEPS = {("gpu_health", "main"), ("gpu_verify", "main"), ("gpu_health", "record")}


def role_calls(tasks: object) -> list[tuple[str, str]]:
    """(role, entry point) of every include_role/import_role in a task list or play list, blocks opened."""
    found = []
    for item in tasks if isinstance(tasks, list) else []:
        if not isinstance(item, dict):
            continue
        for section in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "roles"):
            found += role_calls(item.get(section))
        for key, args in item.items():
            if str(key).rsplit(".", 1)[-1] in ("include_role", "import_role") and isinstance(args, dict):
                found.append((str(args.get("name", "")).rsplit(".", 1)[-1], str(args.get("tasks_from", "main"))))
    return found


def tail_copies(root: Path) -> dict[str, list[tuple[str, str]]]:
    """The playbook files other than the tail's own that call one of its steps, with the steps."""
    found = {}
    for path in sorted([*root.glob("playbooks/*.yml"), *root.glob("playbooks/tasks/*.yml")]):
        name = path.relative_to(root).as_posix()
        steps = [c for c in role_calls(yaml.safe_load(path.read_text(encoding="utf-8"))) if c in TAIL_STEPS]
        if steps and name != TAIL_FILE:
            found[name] = steps
    return found


def test_the_verification_tail_is_written_once():
    assert (ROOT / TAIL_FILE).is_file()
    assert set(role_calls(yaml.safe_load((ROOT / TAIL_FILE).read_text(encoding="utf-8")))) >= TAIL_STEPS
    assert tail_copies(ROOT) == {}, f"import {TAIL_FILE} instead of spelling its steps out again"


def test_a_second_copy_of_the_verification_tail_is_found(tmp_path):
    (tmp_path / "playbooks" / "tasks").mkdir(parents=True)
    (tmp_path / TAIL_FILE).write_text((ROOT / TAIL_FILE).read_text(encoding="utf-8"))
    (tmp_path / "playbooks" / "again.yml").write_text(
        "- hosts: all\n  tasks:\n    - block:\n        - ansible.builtin.import_role: {name: gpu_fleet.tf_hosts.gpu_verify}\n"
        "      always:\n        - ansible.builtin.include_role: {name: gpu_health, tasks_from: record}\n"
    )
    assert tail_copies(tmp_path) == {"playbooks/again.yml": [("gpu_verify", "main"), ("gpu_health", "record")]}


def untagged_includes(folder: Path) -> list[str]:
    """Each ``include_tasks`` of a role's tasks/main.yml whose ``apply`` tags its tasks but which is not tagged
    itself: ``--tags`` skips such an include, so its tasks never run under the tags they are given (Ansible docs,
    "Tags", "Adding tags to includes"). Files imported by others may inherit their tags, so only main.yml."""
    found = []
    for path in sorted(folder.glob("*/tasks/main.yml")):
        for task in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
            include = task.get("ansible.builtin.include_tasks") if isinstance(task, dict) else None
            applied = include.get("apply", {}).get("tags") if isinstance(include, dict) else None
            if applied and not set(applied) <= set(task.get("tags") or []):
                found.append(f"{path.relative_to(folder)}: {task.get('name')}")
    return found


def test_every_tagged_include_is_tagged_itself():
    assert untagged_includes(ROOT / "roles") == []


def test_an_untagged_include_is_found(tmp_path):
    (tmp_path / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "r" / "tasks" / "main.yml").write_text(
        "- name: Count\n  ansible.builtin.include_tasks: {file: x.yml, apply: {tags: [a]}}\n"
    )
    assert untagged_includes(tmp_path) == ["r/tasks/main.yml: Count"]
