"""Write the plan of a ``--check`` run (runs on the controller): what a real run would change, one
line per host and phase.

Input (``--input FILE`` or ``-`` for stdin): the ``gpu_plan_collect`` filter's result, ``{host:
{"phases": [{"phase", "change", "line"}], "changes": n, "failed": bool}}``.

Output, unless no host has a phase of a provisioning role (a run of gpu_verify alone has nothing to
plan): a new folder
``<out-dir>/<inventory name>/plans/<UTC time>/`` with ``plan.json`` and ``plan.md``, and
``<out-dir>/<inventory name>/plans/latest`` pointed at it; the last ``--keep`` plan folders are
kept. The fleet report's own run folders and its ``latest`` are not touched: a plan is not a
verification. stdout: the plan as text, or JSON ``{table, summary, plan_dir, written}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import fleet_report
import report_history

PLANS = "plans"
TITLE = "Plan of a --check run: what a real run would change (nothing was changed)"


def summarize(plan: dict[str, Any]) -> dict[str, int]:
    """``{hosts, would_change, nothing_to_do, no_plan}``."""
    rows = [host for host in plan.values() if isinstance(host, dict)]
    changing = sum(1 for host in rows if host.get("changes"))
    failed = sum(1 for host in rows if host.get("failed") and not host.get("changes"))
    return {
        "hosts": len(rows),
        "would_change": changing,
        "nothing_to_do": len(rows) - changing - failed,
        "no_plan": failed,
    }


def _host_lines(phases: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """A host's (phase, line) pairs; a host with nothing to change in any phase is one line."""
    if phases and not any(p.get("change") for p in phases) and all(p.get("phase") != "host" for p in phases):
        return [("", "nothing to do")]
    return [(str(p.get("phase", "")), str(p.get("line", ""))) for p in phases]


def format_text(document: dict[str, Any]) -> str:
    """The plan for a terminal: a header, then each host's lines."""
    summary = document["summary"]
    lines = [
        f"{TITLE}. Inventory {document['inventory']}: {summary['hosts']} host{'' if summary['hosts'] == 1 else 's'}, {summary['would_change']} would "
        f"change, {summary['nothing_to_do']} nothing to do"
        + (f", {summary['no_plan']} no plan" if summary["no_plan"] else "")
    ]
    width = max((len(host) for host in document["hosts"]), default=4)
    for host, entry in document["hosts"].items():
        for number, (phase, line) in enumerate(_host_lines(entry.get("phases", []))):
            name = host if number == 0 else ""
            lines.append(f"{name:<{width}}  {phase:<11}  {line}".rstrip() if phase else f"{name:<{width}}  {line}")
    return "\n".join(lines) + "\n"


def format_markdown(document: dict[str, Any]) -> str:
    """The plan as a Markdown table, one row per host and phase."""
    out = [f"# {TITLE}", "", f"Inventory `{document['inventory']}`, generated {document['generated_at']}."]
    if document.get("limit"):
        out.append(f"Limited to `{document['limit']}`.")
    out += ["", "| host | phase | plan |", "|---|---|---|"]
    for host, entry in document["hosts"].items():
        for phase, line in _host_lines(entry.get("phases", [])):
            out.append(f"| {fleet_report._md(host)} | {fleet_report._md(phase)} | {fleet_report._md(line)} |")
    return "\n".join(out) + "\n"


def render(document: dict[str, Any]) -> dict[str, str]:
    return {
        "plan.json": json.dumps(document, indent=2, sort_keys=True) + "\n",
        "plan.md": format_markdown(document),
    }


def run(args: argparse.Namespace, plan: dict[str, Any], now: datetime.datetime) -> dict[str, Any]:
    """Build and (when any host has a phase) write the plan; returns what ``--emit json`` prints."""
    name = report_history.inventory_name(args.inventory_source, args.inventory_name)
    document = {
        "generated_at": now.astimezone(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),  # noqa: UP017
        "inventory": name,
        "limit": args.limit or None,
        "hosts": plan,
        "summary": summarize(plan),
    }
    folder = None
    if any(
        phase.get("phase") != "host"
        for entry in plan.values()
        if isinstance(entry, dict)
        for phase in entry.get("phases", [])
    ):
        plans_dir = Path(args.out_dir) / name / PLANS
        folder = report_history.write_run(plans_dir, now, document, render, args.keep, fleet_report._write)
    return {
        "table": format_text(document) if folder else "",
        "summary": document["summary"],
        "plan_dir": str(folder) if folder else None,
        "written": folder is not None,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Write <out-dir>/<inventory>/plans/<UTC time>/plan.{json,md} from gpu_plan_collect's result and "
        "point <out-dir>/<inventory>/plans/latest at it; print the plan.",
        epilog="Exit codes: 0 plan written (or nothing to plan), 2 bad input or usage error.",
    )
    parser.add_argument("--input", required=True, help="JSON file {host: {phases, changes, failed}}, or - for stdin")
    report_history.add_location_arguments(parser)
    return parser


main = fleet_report.entry_point("fleet_plan", build_parser, run)


if __name__ == "__main__":
    sys.exit(main())
