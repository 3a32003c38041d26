#!/usr/bin/env python3
"""Measure the house rules on the source tree and write the architecture map.

Reads roles/*/{tasks,handlers,vars,defaults}, playbooks/*.yml, playbooks/tasks/*.yml and the action
and module plugins, and computes:

- each role's entry points (task files) used from outside the role, with their callers;
- cross-role ``include_role``/``import_role`` with ``tasks_from``, and every ``tasks_from`` use;
- the include depth from playbooks/site.yml (include edges in the longest chain) and that chain;
- the published facts (``<role>_*`` names set by ``set_fact``, ``register`` or a plugin's
  ``ansible_facts``) with their writers and readers, and the names with more than one writer file;
- the templated values (``{{``/``{%``) in roles/ and playbooks/ longer than 300 characters;
- the README's length.

Only the source is read: no role runs. A templated include name is reported and counts an edge to
each file named in quotes inside it, or else to each file its literal parts match (none when it has
none).

    tools/house_map.py              a short table of the figures against their targets
    tools/house_map.py --json       everything, for machines
    tools/house_map.py --markdown   the map docs/architecture_map.md holds
    tools/house_map.py --write      write docs/architecture_map.md
    tools/house_map.py --check      compare docs/architecture_map.md with what the code makes

Exit codes: 0 done (with --check: the map is current); 1 with --check, the map is not current;
2 usage error.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MAP_PATH = "docs/architecture_map.md"
SITE = "playbooks/site.yml"
LONG_VALUE = 300
VERY_LONG_VALUE = 600
TEMPLATED = re.compile(r"{{|{%")
TEMPLATE_PART = re.compile(r"{{.*?}}|{%.*?%}")
QUOTED_FILE = re.compile(r"""['"]([^'"{}]+\.ya?ml)['"]""")
INCLUDES = {"include_role", "import_role", "include_tasks", "import_tasks", "import_playbook"}
ROLE_INCLUDES = {"include_role", "import_role"}
# Strings in a plugin that document it; a name they mention is not read.
PLUGIN_DOCS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
READER_SUFFIXES = {".yml", ".yaml", ".j2", ".py", ".sh", ".cfg", ".ini", ".json", ".service", ".timer"}

# The targets of the house rules; the figures are measured.
TARGETS = {
    "cross_role_tasks_from": 6,
    "entry_points_used_from_outside": 12,
    "include_depth": 4,
    "multi_writer_facts": 0,
    "templated_values_over_300": 0,
    "readme_lines": 250,
}
MEASURES = {
    "cross_role_tasks_from": "cross-role `include_role`/`import_role` with `tasks_from`",
    "entry_points_used_from_outside": "role entry points used from outside their role",
    "include_depth": "include depth from `playbooks/site.yml`",
    "multi_writer_facts": "published facts with more than one writer file",
    "templated_values_over_300": "templated values in roles/ and playbooks/ over 300 characters",
    "readme_lines": "README.md lines",
}


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads Ansible's ``!unsafe`` and ``!vault`` values as plain strings."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node))


@dataclass(frozen=True)
class Include:
    """One include edge as written: ``source`` includes ``written`` and resolves to ``targets``."""

    source: str
    task: str
    action: str
    written: str
    role: str | None = None
    entry: str | None = None
    tasks_from: bool = False
    templated: bool = False
    targets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Writer:
    """A place that sets a published fact: a file and the task (or plugin function) there."""

    path: str
    task: str


@dataclass(frozen=True)
class LongValue:
    """A templated string value in roles/ or playbooks/ longer than LONG_VALUE characters."""

    path: str
    key: str
    length: int


@dataclass
class House:
    """Everything measured on one tree."""

    roles: list[str]
    includes: list[Include]
    writers: dict[str, list[Writer]]
    readers: dict[str, list[str]]
    inputs: set[str]
    long_values: list[LongValue]
    readme_lines: int
    depth: int = 0
    chain: list[str] = field(default_factory=list)


def load_yaml(path: Path) -> Any:
    """The YAML document in ``path``; None for an empty or unreadable one."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (yaml.YAMLError, UnicodeDecodeError):
        return None


def rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def list_roles(root: Path) -> list[str]:
    folder = root / "roles"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def role_of(path: str) -> str | None:
    """The role a file belongs to (``roles/<role>/...``), None for a playbook."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "roles" else None


def action_of(task: dict[str, Any]) -> tuple[str, Any]:
    """The task's action by its short name (``ansible.builtin.include_role`` → ``include_role``) and
    its arguments; ``("", None)`` for a task none of whose keys this tool follows."""
    for key, value in task.items():
        short = str(key).rsplit(".", 1)[-1]
        if short in INCLUDES or short == "set_fact":
            return short, value
    return "", None


def walk_tasks(items: Any, prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every task in a task list with its key path, blocks (``block``, ``rescue``, ``always``)
    opened; the block itself is not yielded."""
    if not isinstance(items, list):
        return
    for index, task in enumerate(items):
        if not isinstance(task, dict):
            continue
        here = f"{prefix}[{index}]"
        sections = [s for s in ("block", "rescue", "always") if s in task]
        if sections:
            for section in sections:
                yield from walk_tasks(task[section], f"{here}.{section}")
        else:
            yield here, task


def play_tasks(plays: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The tasks of a playbook's plays (pre_tasks, tasks, post_tasks, handlers), with key paths."""
    for index, play in enumerate(plays if isinstance(plays, list) else []):
        if not isinstance(play, dict):
            continue
        for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            yield from walk_tasks(play.get(section), f"[{index}].{section}")


def task_sources(root: Path) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every task this tool reads, by file: role tasks and handlers, playbook task files, plays."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for pattern in ("roles/*/tasks/**/*.yml", "roles/*/handlers/**/*.yml", "playbooks/tasks/*.yml"):
        for path in sorted(root.glob(pattern)):
            found[rel(root, path)] = list(walk_tasks(load_yaml(path)))
    for path in sorted(root.glob("playbooks/*.yml")):
        found[rel(root, path)] = list(play_tasks(load_yaml(path)))
    return found


def glob_candidates(folder: Path, written: str) -> list[Path]:
    """Files in ``folder`` a templated name can be: the file names quoted inside its template parts
    (``{{ 'a.yml' if x else 'b.yml' }}``), else its template parts as wildcards. A name whose literal
    parts are only a file extension matches nothing."""
    if not folder.is_dir():
        return []
    quoted = [q for part in TEMPLATE_PART.findall(written) for q in QUOTED_FILE.findall(part)]
    if quoted:
        return sorted({folder / q for q in quoted if (folder / q).is_file()})
    pattern = TEMPLATE_PART.sub("*", written)
    literal = re.sub(r"\*|\.ya?ml$", "", pattern)
    if not literal.strip("/"):
        return []
    return sorted(p for p in folder.glob(pattern) if p.is_file())


def resolve_file(root: Path, source: str, written: str) -> tuple[str, ...]:
    """The files an ``import_tasks``/``include_tasks``/``import_playbook`` name can mean: next to the
    including file, then in its role's tasks/ folder, then in playbooks/."""
    here = (root / source).parent
    role = role_of(source)
    folders = [here] + ([root / "roles" / role / "tasks"] if role else []) + [root / "playbooks"]
    if "." in written and "/" not in written and not written.endswith((".yml", ".yaml")):
        written = "playbooks/" + written.rsplit(".", 1)[-1] + ".yml"  # a collection playbook by FQCN
        folders = [root]
    for folder in folders:
        if TEMPLATED.search(written):
            matches = glob_candidates(folder, written)
        else:
            matches = [folder / written] if (folder / written).is_file() else []
        if matches:
            return tuple(rel(root, p.resolve()) for p in matches)
    return ()


def role_include(root: Path, source: str, task: str, action: str, args: Any) -> Include:
    """An ``include_role``/``import_role`` task or a play's ``roles:`` entry as an Include."""
    args = args if isinstance(args, dict) else {"name": args}
    name = str(args.get("name") or args.get("role") or "")
    role = name.rsplit(".", 1)[-1]
    tasks_from = args.get("tasks_from")
    entry = re.sub(r"\.ya?ml$", "", str(tasks_from)) if tasks_from else "main"
    templated = bool(TEMPLATED.search(name + entry))
    target = root / "roles" / role / "tasks" / f"{entry}.yml"
    targets = (rel(root, target),) if not templated and target.is_file() else ()
    written = f"{name}:{tasks_from}" if tasks_from else name
    return Include(source, task, action, written, role, entry, bool(tasks_from), templated, targets)


def task_include(root: Path, source: str, task: dict[str, Any]) -> Include | None:
    action, args = action_of(task)
    name = str(task.get("name", ""))
    if action in ROLE_INCLUDES:
        return role_include(root, source, name, action, args)
    if action in INCLUDES:
        written = str(args.get("file", "") if isinstance(args, dict) else args)
        templated = bool(TEMPLATED.search(written))
        return Include(source, name, action, written, templated=templated, targets=resolve_file(root, source, written))
    return None


def play_includes(root: Path, source: str, plays: Any) -> list[Include]:
    """A playbook's ``import_playbook`` entries and the ``roles:`` entries of its plays."""
    found = []
    for play in plays if isinstance(plays, list) else []:
        if not isinstance(play, dict):
            continue
        include = task_include(root, source, play)
        if include:
            found.append(include)
        for entry in play.get("roles") or []:
            found.append(role_include(root, source, str(play.get("name", "")), "roles", entry))
    return found


def collect_includes(root: Path, sources: dict[str, list[tuple[str, dict[str, Any]]]]) -> list[Include]:
    found = []
    for source, tasks in sources.items():
        if source.startswith("playbooks/") and source.count("/") == 1:
            found += play_includes(root, source, load_yaml(root / source))
        for _, task in tasks:
            include = task_include(root, source, task)
            if include:
                found.append(include)
    return found


def public_role(name: str, roles: list[str]) -> str | None:
    """The role a public name belongs to (the longest role name it starts with, then ``_``)."""
    if name.startswith("_"):
        return None
    matches = [r for r in roles if name.startswith(r + "_")]
    return max(matches, key=len) if matches else None


def set_names(action: str, args: Any, task: dict[str, Any]) -> list[str]:
    """The variable names a task sets: ``set_fact`` keys (``cacheable`` aside; ``k=v`` form too)
    and its ``register``. Templated keys are skipped."""
    names = []
    if action == "set_fact":
        if isinstance(args, dict):
            names += [str(k) for k in args if k != "cacheable"]
        elif isinstance(args, str):
            names += [part.split("=", 1)[0] for part in args.split() if "=" in part]
    if isinstance(task.get("register"), str):
        names.append(task["register"])
    return [n for n in names if not TEMPLATED.search(n)]


def task_writers(sources: dict[str, list[tuple[str, dict[str, Any]]]], roles: list[str]) -> dict[str, list[Writer]]:
    found: dict[str, list[Writer]] = {}
    for source, tasks in sources.items():
        for _, task in tasks:
            action, args = action_of(task)
            for name in set_names(action, args, task):
                if public_role(name, roles):
                    found.setdefault(name, []).append(Writer(source, str(task.get("name", ""))))
    return found


def fact_keys(node: ast.AST) -> list[str]:
    """The string keys of a dict literal (``ansible_facts``' value)."""
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return [k.arg for k in node.keywords if k.arg]
    return []


def plugin_fact_names(tree: ast.AST) -> Iterator[tuple[str, str]]:
    """(name, function) for each ``ansible_facts`` key a plugin returns: a keyword
    ``ansible_facts={...}``, a dict entry ``"ansible_facts": {...}``, or ``x["ansible_facts"] = {...}``
    and ``x["ansible_facts"]["name"] = ...``."""
    for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for node in ast.walk(func):
            values: list[ast.AST] = []
            if isinstance(node, ast.keyword) and node.arg == "ansible_facts":
                values.append(node.value)
            elif isinstance(node, ast.Dict):
                values += [v for k, v in zip(node.keys, node.values) if _is_const(k, "ansible_facts")]
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Subscript) and _is_const(target.slice, "ansible_facts"):
                        values.append(node.value)
                    elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Subscript):
                        if _is_const(target.value.slice, "ansible_facts") and isinstance(target.slice, ast.Constant):
                            yield str(target.slice.value), func.name
            for value in values:
                for name in fact_keys(value):
                    yield name, func.name


def _is_const(node: ast.AST | None, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def plugin_writers(root: Path, roles: list[str]) -> dict[str, list[Writer]]:
    found: dict[str, list[Writer]] = {}
    for path in sorted([*root.glob("plugins/action/*.py"), *root.glob("plugins/modules/*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, function in sorted(set(plugin_fact_names(tree))):
            if public_role(name, roles):
                found.setdefault(name, []).append(Writer(rel(root, path), f"{function}()"))
    return found


def argument_spec_inputs(root: Path) -> set[str]:
    """Every option named in a role's meta/argument_specs.yml."""
    names: set[str] = set()
    for path in root.glob("roles/*/meta/argument_specs.yml"):
        specs = (load_yaml(path) or {}).get("argument_specs") or {}
        for entry in specs.values():
            names.update(str(k) for k in (entry or {}).get("options") or {})
    return names


def without_plugin_docs(text: str) -> str:
    """A plugin's source with its DOCUMENTATION, EXAMPLES and RETURN strings blanked."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in PLUGIN_DOCS for t in node.targets):
            for number in range(node.lineno - 1, node.end_lineno or node.lineno):
                lines[number] = ""
    return "\n".join(lines)


def reader_texts(root: Path) -> dict[str, str]:
    """The files that can read a fact: roles (not their README or meta/), playbooks, plugins' Python
    (not their docs), and the scripts in files/."""
    found: dict[str, str] = {}
    for folder in ("roles", "playbooks", "plugins", "files"):
        for path in sorted((root / folder).rglob("*")):
            name = rel(root, path)
            if not path.is_file() or path.suffix not in READER_SUFFIXES or "/meta/" in name:
                continue
            if folder == "plugins" and path.suffix != ".py":
                continue  # a filter's .yml is its documentation
            text = path.read_text(encoding="utf-8", errors="replace")
            found[name] = without_plugin_docs(text) if folder == "plugins" else text
    return found


def fact_readers(root: Path, writers: dict[str, list[Writer]]) -> dict[str, list[str]]:
    """For each published fact, the files other than its writers' that mention it."""
    texts = reader_texts(root)
    found = {}
    for name, places in writers.items():
        mention = re.compile(r"(?<!\w)" + re.escape(name) + r"(?!\w)")
        own = {w.path for w in places}
        found[name] = sorted(path for path, text in texts.items() if path not in own and mention.search(text))
    return found


def walk_values(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every string value in a YAML document with its key path (``[3].block[0].<module>.msg``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk_values(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk_values(item, f"{key}[{index}]")
    elif isinstance(value, str):
        yield key, value


def long_templated_values(root: Path) -> list[LongValue]:
    """The templated values over LONG_VALUE characters in the roles' tasks, vars, defaults and
    handlers and in playbooks/ (plays and their task files)."""
    found = []
    patterns = [f"roles/*/{kind}/**/*.yml" for kind in ("tasks", "vars", "defaults", "handlers")]
    for pattern in [*patterns, "playbooks/*.yml", "playbooks/tasks/*.yml"]:
        for path in sorted(root.glob(pattern)):
            for key, value in walk_values(load_yaml(path)):
                if TEMPLATED.search(value) and len(value) > LONG_VALUE:
                    found.append(LongValue(rel(root, path), key, len(value)))
    return sorted(found, key=lambda v: (-v.length, v.path, v.key))


def include_edges(includes: list[Include]) -> dict[str, list[str]]:
    """File → the files it includes, each once, in source order."""
    edges: dict[str, list[str]] = {}
    for include in includes:
        targets = edges.setdefault(include.source, [])
        targets += [t for t in include.targets if t not in targets]
    return edges


def longest_chain(edges: dict[str, list[str]], start: str) -> list[str]:
    """The longest include chain from ``start`` (files, start included); an include back into the
    chain (a loop) is not followed."""
    memo: dict[str, list[str]] = {}

    def visit(node: str, stack: tuple[str, ...]) -> list[str]:
        if node in memo:
            return memo[node]
        best: list[str] = []
        for target in edges.get(node, []):
            if target not in stack:
                chain = visit(target, (*stack, node))
                best = chain if len(chain) > len(best) else best
        memo[node] = [node, *best]
        return memo[node]

    return visit(start, ())


def node_label(path: str) -> str:
    """``<role>/<entry>`` for a role's task file, the path for a playbook."""
    role = role_of(path)
    if role and path.split("/")[2] == "tasks":
        return role + "/" + re.sub(r"\.ya?ml$", "", "/".join(path.split("/")[3:]))
    return path


def measure(root: Path = ROOT) -> House:
    """Everything this tool reports, measured on the tree at ``root``."""
    roles = list_roles(root)
    sources = task_sources(root)
    includes = collect_includes(root, sources)
    writers = task_writers(sources, roles)
    for name, places in plugin_writers(root, roles).items():
        writers.setdefault(name, []).extend(places)
    readme = root / "README.md"
    house = House(
        roles=roles,
        includes=includes,
        writers=writers,
        readers=fact_readers(root, writers),
        inputs=argument_spec_inputs(root) & set(writers),
        long_values=long_templated_values(root),
        readme_lines=len(readme.read_text(encoding="utf-8").splitlines()) if readme.is_file() else 0,
    )
    if (root / SITE).is_file():
        house.chain = longest_chain(include_edges(includes), SITE)
        house.depth = len(house.chain) - 1
    return house


def outside(include: Include, roles: list[str]) -> bool:
    """An include of one of this tree's roles from a playbook or from another role."""
    return include.role in roles and role_of(include.source) != include.role


def entry_points(house: House) -> dict[tuple[str, str], list[str]]:
    """(role, entry point) used from outside the role → its callers' files."""
    found: dict[tuple[str, str], set[str]] = {}
    for include in house.includes:
        if include.action in (*ROLE_INCLUDES, "roles") and outside(include, house.roles):
            found.setdefault((str(include.role), str(include.entry)), set()).add(include.source)
    return {key: sorted(found[key]) for key in sorted(found)}


def tasks_from_uses(house: House) -> list[Include]:
    return sorted(
        (i for i in house.includes if i.tasks_from),
        key=lambda i: (i.source, str(i.role), str(i.entry), i.task),
    )


def cross_role_tasks_from(house: House) -> list[Include]:
    """``tasks_from`` includes in a role's files that name another role."""
    return [i for i in tasks_from_uses(house) if role_of(i.source) and outside(i, house.roles)]


def multi_writer_facts(house: House) -> list[str]:
    return sorted(name for name, places in house.writers.items() if len({w.path for w in places}) > 1)


def figures(house: House) -> dict[str, int]:
    return {
        "cross_role_tasks_from": len(cross_role_tasks_from(house)),
        "entry_points_used_from_outside": len(entry_points(house)),
        "include_depth": house.depth,
        "multi_writer_facts": len(multi_writer_facts(house)),
        "templated_values_over_300": len(house.long_values),
        "readme_lines": house.readme_lines,
    }


def templated_includes(house: House) -> list[Include]:
    return sorted((i for i in house.includes if i.templated), key=lambda i: (i.source, i.written))


def as_json(house: House) -> dict[str, Any]:
    """Everything, for machines."""
    return {
        "figures": figures(house),
        "targets": TARGETS,
        "templated_values_over_600": sum(v.length > VERY_LONG_VALUE for v in house.long_values),
        "include_chain": [node_label(n) for n in house.chain],
        "entry_points": [
            {"role": role, "entry": entry, "callers": callers} for (role, entry), callers in entry_points(house).items()
        ],
        "cross_role_tasks_from": [asdict(i) for i in cross_role_tasks_from(house)],
        "tasks_from": [asdict(i) for i in tasks_from_uses(house)],
        "templated_includes": [asdict(i) for i in templated_includes(house)],
        "facts": {
            name: {
                "writers": [asdict(w) for w in sorted(set(house.writers[name]), key=lambda w: (w.path, w.task))],
                "readers": house.readers[name],
                "also_an_input": name in house.inputs,
            }
            for name in sorted(house.writers)
        },
        "multi_writer_facts": multi_writer_facts(house),
        "long_templated_values": [asdict(v) for v in house.long_values],
    }


def _code(items: list[str]) -> str:
    return ", ".join(f"`{item}`" for item in items) if items else "—"


def markdown_figures(house: House) -> list[str]:
    lines = ["| measure | today | target |", "|---|---|---|"]
    for key, value in figures(house).items():
        target = TARGETS[key]
        lines.append(f"| {MEASURES[key]} | {value} | {'at most ' if target else ''}{target} |")
    chain = " → ".join(f"`{node_label(n)}`" for n in house.chain)
    return [*lines, "", f"The deepest include chain ({house.depth} include edges): {chain}."]


def markdown_roles(house: House) -> list[str]:
    lines = []
    used = entry_points(house)
    for role in house.roles:
        rows = [(entry, callers) for (r, entry), callers in used.items() if r == role]
        lines += ["", f"### {role}", ""]
        if not rows:
            lines.append("No entry point is used from outside the role.")
            continue
        lines += ["| entry point | called from outside by |", "|---|---|"]
        lines += [f"| `{entry}` | {_code(callers)} |" for entry, callers in rows]
    return lines


def markdown_tasks_from(house: House) -> list[str]:
    lines = ["| in | task | includes |", "|---|---|---|"]
    for include in cross_role_tasks_from(house):
        task = include.task.replace("|", "\\|")
        lines.append(f"| `{include.source}` | {task} | `{include.role}/{include.entry}` |")
    return lines


def markdown_other_figures(house: House) -> list[str]:
    """Figures with no target of their own, to read beside the table."""
    lines = [
        f"- `tasks_from` anywhere (roles and playbooks): {len(tasks_from_uses(house))}.",
        f"- Templated values in roles/ and playbooks/ over {VERY_LONG_VALUE} characters: "
        f"{sum(v.length > VERY_LONG_VALUE for v in house.long_values)} (`tools/house_map.py --json` lists them all).",
    ]
    for include in templated_includes(house):
        targets = _code([node_label(t) for t in include.targets]) if include.targets else "nothing it can name"
        lines.append(f"- `{include.source}` includes the templated name `{include.written}`: counted as {targets}.")
    return lines


def markdown_facts(house: House) -> list[str]:
    lines = ["| fact | written by | read by |", "|---|---|---|"]
    several = set(multi_writer_facts(house))
    for name in sorted(house.writers):
        writer_files = sorted({w.path for w in house.writers[name]})
        flags = [" (several writers)" if name in several else "", " (also an input)" if name in house.inputs else ""]
        lines.append(f"| `{name}`{''.join(flags)} | {_code(writer_files)} | {_code(house.readers[name])} |")
    return lines


def markdown(house: House) -> str:
    """The architecture map docs/architecture_map.md holds."""
    lines = [
        "# Architecture map",
        "",
        "Generated by `tools/house_map.py --write`; a unit test (`tests/unit/test_house_map.py`) checks it is",
        "current. Do not edit it by hand: change the code, then run `python tools/house_map.py --write`.",
        "",
        "## The house rules in figures",
        "",
        *markdown_figures(house),
        "",
        *markdown_other_figures(house),
        "",
        "## Roles and the entry points used from outside them",
        "",
        "A play's `roles:` entry and an `include_role`/`import_role` without `tasks_from` call `main`.",
        *markdown_roles(house),
        "",
        "## Cross-role includes with `tasks_from`",
        "",
        *markdown_tasks_from(house),
        "",
        "## Published facts",
        "",
        "A public name (`<role>_*`) that a task sets (`set_fact`, `register`) or a plugin returns in",
        "`ansible_facts`; its readers are the other files of roles/, playbooks/, plugins/ and files/ that",
        "name it. Inputs (meta/argument_specs.yml) that no task sets are not listed.",
        "",
        *markdown_facts(house),
    ]
    return "\n".join(lines) + "\n"


def summary(house: House) -> str:
    """The short table for people."""
    rows = [(MEASURES[k].replace("`", ""), str(v), str(TARGETS[k])) for k, v in figures(house).items()]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure':<{width}}  today  target"]
    lines += [f"{m:<{width}}  {v:>5}  {t:>6}" for m, v, t in rows]
    lines.append("deepest chain: " + " → ".join(node_label(n) for n in house.chain))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to measure (default: this repository)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print everything as JSON")
    output.add_argument("--markdown", action="store_true", help=f"print the map {MAP_PATH} holds")
    output.add_argument("--write", action="store_true", help=f"write {MAP_PATH}")
    output.add_argument("--check", action="store_true", help=f"exit 1 when {MAP_PATH} is not current")
    args = parser.parse_args(argv)
    house = measure(args.root)
    target = args.root / MAP_PATH
    if args.json:
        print(json.dumps(as_json(house), indent=2, sort_keys=True))
    elif args.markdown:
        print(markdown(house), end="")
    elif args.write:
        target.write_text(markdown(house), encoding="utf-8")
    elif args.check:
        if not target.is_file() or target.read_text(encoding="utf-8") != markdown(house):
            print(f"{MAP_PATH} is not current: run `python tools/house_map.py --write`.", file=sys.stderr)
            return 1
    else:
        print(summary(house))
    return 0


if __name__ == "__main__":
    sys.exit(main())
