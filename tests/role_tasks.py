"""The tasks of the roles and playbooks, for the house-rule tests: every task file of roles/*/tasks,
roles/*/handlers and playbooks/, each task with the keywords it inherits from enclosing blocks and
plays (blocks, rescue and always sections walked; included and imported files are read where they
live)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONTROLLER = {"localhost", "127.0.0.1"}
INHERITED = ("delegate_to", "connection")


def task_files() -> list[Path]:
    folders = [*(ROOT / "roles").glob("*/tasks"), *(ROOT / "roles").glob("*/handlers"), ROOT / "playbooks"]
    return sorted(p for folder in folders for p in folder.rglob("*.yml"))


def walk(tasks: list | None, inherited: dict) -> Iterator[tuple[dict, dict]]:
    """Each task with the keywords it inherits from enclosing blocks, block sections walked."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        scope = dict(inherited, **{k: task[k] for k in INHERITED if k in task})
        sections = [task[s] for s in ("block", "rescue", "always") if s in task]
        if sections:
            for section in sections:
                yield from walk(section, scope)
        else:
            yield task, scope


def file_tasks(path: Path) -> Iterator[tuple[dict, dict]]:
    document = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    if path.parent.name != "playbooks":
        yield from walk(document, {})
        return
    for play in document:
        scope = {"delegate_to": "localhost"} if play.get("hosts") in CONTROLLER else {}
        scope.update({k: play[k] for k in INHERITED if k in play})
        for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            yield from walk(play.get(section), scope)
