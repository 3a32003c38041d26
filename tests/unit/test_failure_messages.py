"""A failing task says why and what to do: the house rule on every task of roles/*/tasks,
roles/*/handlers and playbooks/ (tests/role_tasks.py walks them).

- ``ansible.builtin.fail`` has a ``msg`` and ``ansible.builtin.assert`` a ``fail_msg`` (or ``msg``).
- No task decides failure with ``failed_when`` (only ``failed_when: false``): a module result that
  ``failed_when`` turns into a failure keeps the module's own message, which is empty for a command
  that exited 0 with a complaint on stderr (ldconfig's "… is not a symbolic link") or a ``stat`` of a
  missing file, and "non-zero return code" for a command that failed. Such a task registers its result
  with ``failed_when: false`` and a ``fail`` task after it names the cause and the fix.
"""

from __future__ import annotations

import pytest
from role_tasks import ROOT, file_tasks, task_files, walk

FAIL = {"fail", "ansible.builtin.fail"}
ASSERT = {"assert", "ansible.builtin.assert"}


def message_problems(task: dict) -> list[str]:
    """What the task lacks for a failure to explain itself; [] when it has it."""
    name = task.get("name", "(unnamed task)")
    found = []
    for key in FAIL & task.keys():
        if not str((task[key] or {}).get("msg") or "").strip():
            found.append(f"{name}: fail without msg")
    for key in ASSERT & task.keys():
        args = task[key] or {}
        if not str(args.get("fail_msg") or args.get("msg") or "").strip():
            found.append(f"{name}: assert without fail_msg")
    if "failed_when" in task and task["failed_when"] not in (False, "false"):
        found.append(
            f"{name}: failed_when {task['failed_when']!r} (register with failed_when: false, then fail with msg)"
        )
    return found


def offenders() -> list[str]:
    return [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in task_files()
        for task, _ in file_tasks(path)
        for problem in message_problems(task)
    ]


def test_every_failure_of_a_task_has_its_cause_and_fix():
    assert offenders() == []


@pytest.mark.parametrize(
    "task",
    [
        {"name": "a", "ansible.builtin.fail": {}},
        {"name": "b", "ansible.builtin.fail": {"msg": "  "}},
        {"name": "c", "ansible.builtin.assert": {"that": ["x"]}},
        {"name": "d", "ansible.builtin.command": {"argv": ["ldconfig"]}, "failed_when": "out.stderr | length > 0"},
        {"name": "e", "ansible.builtin.stat": {"path": "/x"}, "failed_when": "not out.stat.exists"},
    ],
)
def test_the_rule_catches_a_failure_without_its_message(task):
    (problem,) = message_problems(task)
    assert problem.startswith(task["name"] + ": ")
    assert list(walk([{"block": [task]}], {})) == [(task, {})]


@pytest.mark.parametrize(
    "task",
    [
        {"name": "a", "ansible.builtin.fail": {"msg": "The disk is full: free 2 GiB and rerun."}},
        {"name": "b", "ansible.builtin.assert": {"that": ["x"], "fail_msg": "x is false: set it."}},
        {"name": "c", "ansible.builtin.command": {"argv": ["grep", "-q", "x", "/y"]}, "failed_when": False},
    ],
)
def test_the_rule_passes_a_failure_that_explains_itself(task):
    assert message_problems(task) == []
