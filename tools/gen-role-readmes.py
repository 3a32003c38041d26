#!/usr/bin/env python3
"""Write each role's README.md from its meta/argument_specs.yml (one source for the variables).

Usage: tools/gen-role-readmes.py [--check]
  --check   write nothing; exit 1 when a README differs from what would be written.
Exit codes: 0 up to date (or written); 1 --check found a stale README; 2 usage error.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _text(value: object) -> str:
    """Ansible doc markup (C(), V(), I()) -> Markdown, lists joined, pipes escaped."""
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    # One level of parentheses inside the markup, as in C(not in this run (last seen ...)).
    inner = r"((?:[^()]|\([^()]*\))*)"
    text = re.sub(r"[CV]\(" + inner + r"\)", r"`\1`", str(value or ""))
    text = re.sub(r"I\(" + inner + r"\)", r"*\1*", text)
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _default(option: dict) -> str:
    if "default" not in option:
        return "**required**" if option.get("required") else "—"
    text = yaml.safe_dump(option["default"], default_flow_style=True, width=1000).strip().removesuffix("...").strip()
    # A pipe splits a Markdown table cell even inside a code span (GFM spec, "Tables").
    return "`" + text.replace("|", "\\|") + "`"


def render(role: Path) -> str:
    """README text of one role."""
    spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]
    main = spec["main"]
    lines = [f"# {role.name}", "", _text(main.get("short_description")), ""]
    for para in main.get("description") or []:
        lines += [_text(para), ""]
    for entry_name, entry in spec.items():
        title = "Variables" if entry_name == "main" else f"Entry point `{entry_name}`"
        lines += [f"## {title}", ""]
        if entry_name != "main":
            lines += [_text(entry.get("short_description")), ""]
        options = entry.get("options") or {}
        if not options:
            lines += ["None.", ""]
            continue
        lines += ["| variable | type | default | description |", "|---|---|---|---|"]
        for name, option in options.items():
            kind = option.get("type", "")
            if option.get("elements"):
                kind += f" of {option['elements']}"
            if option.get("choices"):
                kind += " (" + ", ".join(str(c) for c in option["choices"]) + ")"
            lines.append(f"| `{name}` | {kind} | {_default(option)} | {_text(option.get('description'))} |")
        lines.append("")
    lines += ["_Generated from `meta/argument_specs.yml` by `tools/gen-role-readmes.py`._", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale READMEs (exit 1)")
    args = parser.parse_args(argv)
    stale = []
    for role in sorted(p for p in (ROOT / "roles").iterdir() if (p / "meta/argument_specs.yml").exists()):
        text = render(role)
        readme = role / "README.md"
        if not readme.exists() or readme.read_text() != text:
            stale.append(readme)
            if not args.check:
                readme.write_text(text)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
