"""docs/testing_map.md answers, for every role and task file, "which tests exercise this".

Every role has a section, every task file of a role and every playbook a row, every row names at least
one test, and every test path named exists (a Molecule path names a scenario folder).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "testing_map.md"
PLAYBOOKS = "playbooks"
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
# A backticked path in the tests column that names a test: a scenario or a file under tests/.
TEST_PATH = re.compile(r"`((?:molecule|tests)/[^`\s]*)`")
FIRST_CELL = re.compile(r"^`([^`]+)`$")


@dataclass
class Section:
    """One ``## <name>`` section of the map: its rows as (task file, tests cell), in order."""

    name: str
    rows: list[tuple[str, str]] = field(default_factory=list)


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse(text: str) -> dict[str, Section]:
    """The map's sections by name; a row's first cell is its backticked task file."""
    sections: dict[str, Section] = {}
    current: Section | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            name = line[3:].strip()
            assert name not in sections, f"line {number}: section {name!r} appears twice"
            current = sections[name] = Section(name)
        elif line.startswith("|") and current is not None:
            cells = _cells(line)
            if cells == ["task file", "tests"] or all(set(cell) <= set("-: ") for cell in cells):
                continue  # the header and the separator
            assert len(cells) == 2, f"line {number}: a row has two cells, task file and tests: {line!r}"
            match = FIRST_CELL.match(cells[0])
            assert match, f"line {number}: the first cell is one backticked path: {cells[0]!r}"
            current.rows.append((match.group(1), cells[1]))
    return sections


@pytest.fixture(scope="module")
def sections() -> dict[str, Section]:
    return parse(MAP.read_text(encoding="utf-8"))


def _listed(section: Section) -> list[str]:
    return [task_file for task_file, _ in section.rows]


def _role_task_files(role: str) -> list[str]:
    return sorted(f"tasks/{p.name}" for p in (ROOT / "roles" / role / "tasks").glob("*.yml"))


def _playbook_files() -> list[str]:
    found = [*(ROOT / "playbooks").glob("*.yml"), *(ROOT / "playbooks" / "tasks").glob("*.yml")]
    return sorted(str(p.relative_to(ROOT)) for p in found)


def test_every_role_has_a_section_and_every_section_is_a_role_or_the_playbooks(sections):
    assert ROLES, "no roles found"
    assert sorted(set(ROLES) - set(sections)) == [], "roles without a ## section"
    assert sorted(set(sections) - {*ROLES, PLAYBOOKS}) == [], "sections that are neither a role nor playbooks"


@pytest.mark.parametrize("role", ROLES)
def test_every_task_file_of_a_role_has_one_row_and_every_row_names_a_task_file(sections, role):
    if role not in sections:
        pytest.fail(f"no ## {role} section")
    listed = _listed(sections[role])
    present = _role_task_files(role)
    assert sorted(set(present) - set(listed)) == [], f"task files of roles/{role} without a row"
    assert sorted(set(listed) - set(present)) == [], f"rows of ## {role} naming no file in roles/{role}/tasks"
    assert sorted({f for f in listed if listed.count(f) > 1}) == [], f"task files listed twice under ## {role}"


def test_every_playbook_and_playbook_task_file_has_one_row(sections):
    if PLAYBOOKS not in sections:
        pytest.fail(f"no ## {PLAYBOOKS} section")
    listed = _listed(sections[PLAYBOOKS])
    present = _playbook_files()
    assert present, "no playbooks found"
    assert sorted(set(present) - set(listed)) == [], "playbooks without a row"
    assert sorted(set(listed) - set(present)) == [], "rows of ## playbooks naming no file in playbooks/"
    assert sorted({f for f in listed if listed.count(f) > 1}) == [], "playbooks listed twice"


def test_every_row_names_at_least_one_test(sections):
    bare = [
        f"{s.name}: {task_file}"
        for s in sections.values()
        for task_file, tests in s.rows
        if not TEST_PATH.search(tests)
    ]
    assert bare == [], "rows that name no `molecule/<scenario>` or `tests/...` path"


def test_every_test_path_exists_and_molecule_paths_name_a_scenario(sections):
    wrong = []
    for section in sections.values():
        for task_file, tests in section.rows:
            for path in TEST_PATH.findall(tests):
                where = f"{section.name}: {task_file}: {path}"
                parts = Path(path).parts
                if parts[0] == "molecule":
                    if len(parts) != 2 or not (ROOT / path / "molecule.yml").is_file():
                        wrong.append(f"{where} (not a scenario folder molecule/<name>)")
                elif not (ROOT / path).is_file():
                    wrong.append(f"{where} (no such file)")
    assert wrong == [], "\n".join(wrong)


def test_the_parser_reads_sections_rows_and_test_paths():
    text = (
        "# What tests each role\n\nIntro.\n\n## cudnn\n\n| task file | tests |\n|---|---|\n"
        "| `tasks/main.yml` | `molecule/default` (converge); `tests/unit/test_x.py` (y) |\n"
        "| `tasks/set_vars.yml` | nothing yet |\n"
    )
    parsed = parse(text)
    assert list(parsed) == ["cudnn"]
    assert _listed(parsed["cudnn"]) == ["tasks/main.yml", "tasks/set_vars.yml"]
    assert TEST_PATH.findall(parsed["cudnn"].rows[0][1]) == ["molecule/default", "tests/unit/test_x.py"]
    assert TEST_PATH.findall(parsed["cudnn"].rows[1][1]) == []
