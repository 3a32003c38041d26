#!/usr/bin/env python3
"""Write the fleet report from the per-host ``gpu_verify.py`` documents (runs on the controller).

Input (``--input FILE`` or ``--input -`` for stdin): a JSON object keyed by inventory hostname.
Each value is one of

* a ``gpu_verify.py`` document (schema 1),
* a list of such documents (one per TensorFlow stack/venv on that host), shown one row each,
* ``{"unreachable": true, "error": "..."}`` for a host Ansible could not reach,
* ``{"ok": false, "problems": [{"check", "cause", "fix"}]}`` for a host whose verification could
  not run.

Output:

* ``<out-dir>/fleet-report.json``: ``{"generated_at": ISO 8601 UTC, "run_id", "hosts": {host:
  {"status": "PASS"|"FAIL", "rows": [row, ...], "problems": [...], "results": [doc, ...]}},
  "multiworker": null or {"status", "workers", "chief", ...} (see :func:`multiworker_summary`),
  "summary": {"hosts", "passed", "failed", "unreachable"}}``; a host passes only if every stack on
  it passed.
* ``<out-dir>/fleet-report.md``: the same table in Markdown, with every cause and fix below it.
* ``<out-dir>/fleet-report.html``: a self-contained page (inline CSS, no scripts) with the table,
  each row coloured by pass/fail, then the notes and every cause and fix.
* ``<out-dir>/fleet-report.junit.xml``: JUnit XML, one test case per host (row) and check
  (``gpu_count``, ``driver``, ``libcuda``, ``libcudart``, ``libcudnn``, ``tensorflow``, ``fit``,
  and any other check a problem names), for CI dashboards.
* stdout: the table as plain text, causes and fixes below it.

Versions shown are the ones really loaded (libraries' decoded versions, nvidia-smi's driver),
not the pins.  Times are seconds; throughput is samples/s.

Exit codes: 0 the report was written (whatever the hosts' results; the playbook decides), 2 bad
input or usage error.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any, TextIO

EXIT_OK = 0
EXIT_USAGE = 2

COLUMNS = (
    ("host", "host"),
    ("status", "status"),
    ("driver", "driver"),
    ("cuda", "CUDA"),
    ("cudnn", "cuDNN"),
    ("tensorflow", "TensorFlow"),
    ("gpus", "GPUs (exp/seen)"),
    ("replicas", "replicas"),
    ("workers", "workers"),
    ("loss", "loss start→end"),
    ("fit_seconds", "fit s"),
    ("samples_per_second", "samples/s"),
    ("efficiency", "scaling eff."),
    ("disk_gib", "disk GiB"),
    ("mode", "mode"),
    ("problems", "problems"),
)
PROBLEMS_CELL_WIDTH = 40


class BadInput(ValueError):
    """The input is not a JSON object of host results."""


def _get(doc: Any, *keys: str) -> Any:
    """Nested ``dict.get`` that tolerates missing levels and non-dict values."""
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _num(value: Any, digits: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:.{digits}f}"


def host_problems(doc: Any) -> list[dict[str, str]]:
    """The problems of one host result, synthesising one where the result does not explain
    itself (unreachable, not an object, failed without a list)."""
    if not isinstance(doc, dict):
        return [
            {
                "check": "report",
                "cause": f"Result is not a JSON object: {str(doc)[:200]}",
                "fix": "check the gpu_verify role's fetch step for this host",
            }
        ]
    if doc.get("unreachable"):
        return [
            {
                "check": "unreachable",
                "cause": f"Host unreachable: {doc.get('error') or 'no detail'}",
                "fix": "check SSH access and that the host is up (`ansible -m ping <host>`), then rerun",
            }
        ]
    problems = [p for p in doc.get("problems") or [] if isinstance(p, dict)]
    if not problems and doc.get("ok") is not True:
        problems = [
            {
                "check": "report",
                "cause": f"Verification did not report success: {doc.get('error') or 'no problems listed'}",
                "fix": "run gpu_verify.py by hand on the host with --format table",
            }
        ]
    return problems


def _utilisation_note(samples: Any) -> str | None:
    """'peak per GPU during the fit: GPU 0 97% 30512 MiB, ...' from gpu_verify's ``utilisation``."""
    if not isinstance(samples, dict) or not samples:
        return None
    parts = [
        f"GPU {index} {peak.get('utilization_gpu_peak_pct')}% {peak.get('memory_used_peak_mib')} MiB"
        for index, peak in sorted(samples.items(), key=lambda item: int(item[0]) if str(item[0]).isdigit() else 0)
        if isinstance(peak, dict)
    ]
    return "peak per GPU during the fit: " + ", ".join(parts)


def row_facts(doc: Any) -> list[str]:
    """Notes people need next to a row: the library files really loaded, a PCI cross-check that
    did not run, a scaling figure that was not judged."""
    notes = []
    loaded = [
        f"{key} {_get(doc, 'libraries', key, 'version')} {_get(doc, 'libraries', key, 'path')}"
        for key in ("libcuda", "libcudart", "libcudnn")
        if _get(doc, "libraries", key, "path")
    ]
    if loaded:
        notes.append("loaded " + ", ".join(loaded))
    gpus = _get(doc, "gpus")
    if isinstance(gpus, dict) and "pci_bus_ids" in gpus and gpus["pci_bus_ids"] is None:
        notes.append("PCI cross-check skipped: lspci not found or failed (install pciutils)")
    if _get(doc, "scaling", "note"):
        notes.append(f"scaling efficiency {_num(_get(doc, 'scaling', 'efficiency'), 2)} {_get(doc, 'scaling', 'note')}")
    return notes


def _hosts(count: int) -> str:
    return f"{count} host" + ("" if count == 1 else "s")


def _disk_gib(used: Any) -> str:
    """Sum of ``disk_used_bytes`` ({path: bytes}: toolkits, venv, artifact cache) in GiB, or '-'."""
    if not isinstance(used, dict) or not used:
        return "-"
    return f"{sum(int(v) for v in used.values()) / 1024**3:.2f}"


def build_row(host: str, doc: Any) -> dict[str, Any]:
    """One table row (strings) plus ``status`` for a host's result document."""
    problems = host_problems(doc)
    passed = isinstance(doc, dict) and doc.get("ok") is True and not problems
    stack = _get(doc, "stack")
    gpus = _get(doc, "gpus") or {}
    expected = gpus.get("expected", _get(doc, "expected", "gpus")) if isinstance(gpus, dict) else None
    seen = gpus.get("seen") if isinstance(gpus, dict) else None
    loss_start, loss_end = _get(doc, "fit", "loss_start"), _get(doc, "fit", "loss_end")
    checks = sorted({str(p.get("check")) for p in problems})
    problems_cell = ", ".join(checks) if checks else ""
    if len(problems_cell) > PROBLEMS_CELL_WIDTH:
        problems_cell = problems_cell[: PROBLEMS_CELL_WIDTH - 1] + "…"
    loss = "-"
    if loss_start is not None or loss_end is not None:
        loss = f"{_num(loss_start, 3)}→{_num(loss_end, 3)}"
    replicas = _get(doc, "fit", "num_replicas_in_sync")
    return {
        "host": f"{host} ({stack})" if stack else host,
        "status": "PASS" if passed else "FAIL",
        "driver": _get(doc, "driver_version") or _get(doc, "gpus", "driver_version") or "-",
        "cuda": _get(doc, "libraries", "libcudart", "version") or "-",
        "cudnn": _get(doc, "libraries", "libcudnn", "version") or "-",
        "tensorflow": _get(doc, "tensorflow", "version") or "-",
        "gpus": f"{'-' if expected is None else expected}/{'-' if seen is None else seen}",
        "replicas": "-" if replicas is None else str(replicas),
        "workers": _workers_cell(_get(doc, "multiworker")),
        "loss": loss,
        "fit_seconds": _num(_get(doc, "fit", "fit_seconds"), 2),
        "samples_per_second": _num(_get(doc, "fit", "samples_per_second"), 1),
        "efficiency": _num(_get(doc, "scaling", "efficiency"), 2),
        "disk_gib": _disk_gib(_get(doc, "disk_used_bytes")),
        "mode": (_get(doc, "mode") or "-") + (" fp16" if _get(doc, "fit", "mixed_precision") else ""),
        "problems": ("TIMED OUT " if _get(doc, "fit", "timed_out") else "") + problems_cell,
        "_problems": problems,
        "_mode_note": _get(doc, "mode_note"),
        "_utilisation": None if _get(doc, "mode") == "cpu-replicas" else _utilisation_note(_get(doc, "utilisation")),
        "_facts": row_facts(doc),
        "_overridden": [
            f"preflight check {p.get('check')} overridden: {p.get('cause')}"
            for p in (_get(doc, "preflight_overridden") or [])
            if isinstance(p, dict)
        ],
        "_unreachable": bool(_get(doc, "unreachable")),
    }


def _workers_cell(multiworker: Any) -> str:
    """'2 (chief)' / '2' for a multi-worker result, '-' otherwise."""
    if not isinstance(multiworker, dict) or not multiworker.get("workers"):
        return "-"
    return f"{multiworker['workers']}" + (" (chief)" if multiworker.get("is_chief") else "")


def multiworker_summary(hosts: dict[str, Any]) -> dict[str, Any] | None:
    """The multi-worker fit across the hosts, from the chief's result (None when no host ran one).

    Returns ``{"status", "workers", "chief", "cluster", "reported", "num_replicas_in_sync",
    "samples_per_second", "loss_start", "loss_end", "fit_seconds", "problems"}``: ``workers`` is
    the cluster size in TF_CONFIG, ``reported`` the hosts that returned a result.  It passes when
    the chief's fit passed and every worker reported a passing fit.
    """
    workers = []
    for name, host in hosts.items():
        for doc in host["results"]:
            info = _get(doc, "multiworker")
            if isinstance(info, dict):
                workers.append((name, doc, info))
    if not workers:
        return None
    chiefs = [(name, doc, info) for name, doc, info in workers if info.get("is_chief")]
    chief_name, chief_doc, chief_info = chiefs[0] if chiefs else (None, {}, {})
    size = chief_info.get("workers") or max(int(info.get("workers") or 0) for _name, _doc, info in workers)
    problems = [
        dict(p, host=name)
        for name, doc, _info in workers
        for p in (_get(doc, "fit", "problems") or [])
        if isinstance(p, dict)
    ]
    if chief_name is None:
        problems.append(
            {"check": "multiworker", "cause": "The chief (worker 0) returned no result.", "fix": "see its host's row"}
        )
    if len(workers) < size:
        problems.append(
            {
                "check": "multiworker",
                "cause": f"Only {len(workers)} of {size} workers returned a result.",
                "fix": "every worker must run the check at the same time; see the failed hosts' rows",
            }
        )
    passed = not problems and all(_get(doc, "fit", "ok") is True for _name, doc, _info in workers)
    return {
        "status": "PASS" if passed else "FAIL",
        "workers": size,
        "chief": chief_name,
        "cluster": chief_info.get("cluster") or [],
        "reported": sorted(name for name, _doc, _info in workers),
        "num_replicas_in_sync": _get(chief_doc, "fit", "num_replicas_in_sync"),
        "samples_per_second": _get(chief_doc, "fit", "samples_per_second"),
        "loss_start": _get(chief_doc, "fit", "loss_start"),
        "loss_end": _get(chief_doc, "fit", "loss_end"),
        "fit_seconds": _get(chief_doc, "fit", "fit_seconds"),
        "problems": problems,
    }


def multiworker_line(summary: dict[str, Any] | None) -> str | None:
    """One sentence on the multi-worker fit for the text, Markdown and HTML reports."""
    if not summary:
        return None
    return (
        f"Multi-worker fit (MultiWorkerMirroredStrategy): {summary['status']}, {summary['workers']} workers "
        f"(chief {summary['chief'] or 'none'}), {summary['num_replicas_in_sync'] or '-'} replicas in sync, "
        f"loss {_num(summary['loss_start'], 3)}→{_num(summary['loss_end'], 3)}, "
        f"{_num(summary['samples_per_second'], 1)} samples/s."
    )


def build_report(results: dict[str, Any], run_id: str | None, now: datetime.datetime | None = None) -> dict[str, Any]:
    """The fleet-report.json document (rows included) from the input object."""
    # datetime.UTC is Python 3.11+; keep this runnable by older controllers.
    now = now or datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
    hosts: dict[str, Any] = {}
    for host in sorted(results):
        value = results[host]
        docs = value if isinstance(value, list) and value else [value]
        rows = [build_row(host, doc) for doc in docs]
        status = "PASS" if all(r["status"] == "PASS" for r in rows) else "FAIL"
        hosts[host] = {
            "status": status,
            "unreachable": any(r["_unreachable"] for r in rows),
            "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
            "problems": [dict(p, stack=r["host"]) for r in rows for p in r["_problems"]],
            "mode_notes": sorted({r["_mode_note"] for r in rows if r["_mode_note"]})
            + sorted({note for r in rows for note in r["_overridden"]})
            + [r["_utilisation"] for r in rows if r["_utilisation"]]
            + [f"{r['host']}: {fact}" if len(rows) > 1 else fact for r in rows for fact in r["_facts"]],
            "results": docs,
        }
    passed = sum(1 for h in hosts.values() if h["status"] == "PASS")
    return {
        "generated_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_id": run_id,
        "hosts": hosts,
        "multiworker": multiworker_summary(hosts),
        "summary": {
            "hosts": len(hosts),
            "passed": passed,
            "failed": len(hosts) - passed,
            "unreachable": sum(1 for h in hosts.values() if h["unreachable"]),
        },
    }


def _rows(report: dict[str, Any]) -> list[dict[str, str]]:
    return [row for host in report["hosts"].values() for row in host["rows"]]


def _details(
    report: dict[str, Any],
) -> tuple[list[str], list[tuple[str, dict[str, str]]]]:
    notes = [f"{name}: {note}" for name, host in report["hosts"].items() for note in host["mode_notes"]]
    problems = [(p.get("stack", name), p) for name, host in report["hosts"].items() for p in host["problems"]]
    return notes, problems


def format_text(report: dict[str, Any]) -> str:
    """Plain-text table (columns padded) with notes, causes and fixes below it."""
    headers = [title for _key, title in COLUMNS]
    rows = [[row[key] for key, _title in COLUMNS] for row in _rows(report)]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    summary = report["summary"]
    lines.append("")
    lines.append(
        f"{_hosts(summary['hosts'])}: {summary['passed']} passed, {summary['failed']} failed "
        f"({summary['unreachable']} unreachable); generated {report['generated_at']}"
        + (f", run {report['run_id']}" if report.get("run_id") else "")
    )
    if report.get("multiworker"):
        lines.append(multiworker_line(report["multiworker"]))
    notes, problems = _details(report)
    if notes:
        lines += ["", "Notes:"] + [f"  {n}" for n in notes]
    if problems:
        lines += ["", "Problems:"]
        for where, p in problems:
            lines.append(f"  {where} [{p.get('check')}]: {p.get('cause')}")
            lines.append(f"      fix: {p.get('fix')}")
    return "\n".join(lines) + "\n"


def _md(cell: Any) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def format_markdown(report: dict[str, Any]) -> str:
    """Markdown version of the report."""
    summary = report["summary"]
    title = "# GPU fleet report" + (f" — run {report['run_id']}" if report.get("run_id") else "")
    lines = [
        title,
        "",
        (
            f"Generated {report['generated_at']}: {_hosts(summary['hosts'])}, "
            f"{summary['passed']} passed, {summary['failed']} failed "
            f"({summary['unreachable']} unreachable)."
        ),
        "",
        *([_md(multiworker_line(report["multiworker"])), ""] if report.get("multiworker") else []),
        "| " + " | ".join(_md(t) for _key, t in COLUMNS) + " |",
        "|" + "|".join("---" for _column in COLUMNS) + "|",
    ]
    for row in _rows(report):
        lines.append("| " + " | ".join(_md(row[k]) for k, _title in COLUMNS) + " |")
    notes, problems = _details(report)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {_md(n)}" for n in notes]
    if problems:
        lines += ["", "## Problems", ""]
        for where, p in problems:
            lines.append(f"- **{_md(where)}** `{_md(p.get('check'))}`: {_md(p.get('cause'))}  ")
            lines.append(f"  Fix: {_md(p.get('fix'))}")
    return "\n".join(lines) + "\n"


# One JUnit test case per host and check; a check absent from a host's problems passed.
JUNIT_CHECKS = ("gpu_count", "driver", "libcuda", "libcudart", "libcudnn", "tensorflow", "fit")
HTML_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "th,td{border:1px solid #bbb;padding:.3em .6em;text-align:left}th{background:#eee}"
    "tr.pass td.status{background:#c8f0c8}tr.fail td.status{background:#f6c4c4}"
    "tr.fail{background:#fff4f4}li{margin:.3em 0}"
    "p#multiworker{padding:.3em .6em;display:inline-block}p#multiworker.pass{background:#c8f0c8}"
    "p#multiworker.fail{background:#f6c4c4}"
)


def format_html(report: dict[str, Any]) -> str:
    """Self-contained HTML page (inline CSS, no scripts): the table with a pass/fail colour per
    row, then the notes and every problem with its fix."""
    esc = html.escape
    summary = report["summary"]
    head = "".join(f"<th>{esc(t)}</th>" for _key, t in COLUMNS)
    rows = []
    for row in _rows(report):
        cells = "".join(f'<td class="{key}">{esc(str(row[key]))}</td>' for key, _title in COLUMNS)
        rows.append(f'<tr class="{row["status"].lower()}">{cells}</tr>')
    notes, problems = _details(report)
    items = "".join(
        f"<li><b>{esc(where)}</b> <code>{esc(str(p.get('check')))}</code>: {esc(str(p.get('cause')))}"
        f"<br>Fix: {esc(str(p.get('fix')))}</li>"
        for where, p in problems
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>GPU fleet report</title>'
        f"<style>{HTML_STYLE}</style></head><body>\n<h1>GPU fleet report</h1>\n"
        f"<p>Generated {esc(report['generated_at'])}: {_hosts(summary['hosts'])}, {summary['passed']} passed, "
        f"{summary['failed']} failed ({summary['unreachable']} unreachable).</p>\n"
        + (
            f'<p id="multiworker" class="{report["multiworker"]["status"].lower()}">'
            f"{esc(multiworker_line(report['multiworker']))}</p>\n"
            if report.get("multiworker")
            else ""
        )
        + f'<table id="fleet"><thead><tr>{head}</tr></thead><tbody>\n'
        + "\n".join(rows)
        + "\n</tbody></table>\n"
        + (("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>\n") if notes else "")
        + (f"<h2>Problems</h2><ul>{items}</ul>\n" if problems else "")
        + "</body></html>\n"
    )


def format_junit(report: dict[str, Any]) -> str:
    """JUnit XML for CI dashboards: one test suite, one test case per host (row) and check."""
    suite = ET.Element("testsuite", name="gpu-fleet", timestamp=report["generated_at"])
    cases = failures = 0
    for host in report["hosts"].values():
        for row, doc in zip(host["rows"], host["results"]):
            found = host_problems(doc)
            checks = list(JUNIT_CHECKS) + (["multiworker"] if _get(doc, "multiworker") else [])
            checks += sorted({str(p.get("check")) for p in found} - set(checks))
            for check in checks:
                case = ET.SubElement(suite, "testcase", classname=row["host"], name=check)
                cases += 1
                failing = [p for p in found if p.get("check") == check]
                if failing:
                    failures += 1
                    failure = ET.SubElement(case, "failure", message=str(failing[0].get("cause")))
                    failure.text = "\n".join(f"{p.get('cause')}\nFix: {p.get('fix')}" for p in failing)
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    return ET.tostring(suite, encoding="unicode") + "\n"


def _write(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def load_input(source: str, stdin: TextIO) -> dict[str, Any]:
    """Read and validate the input object.

    Raises:
        BadInput: unreadable file, invalid JSON, or not an object.
    """
    try:
        if source == "-":
            text = stdin.read()
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read {source}: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{source} must hold a JSON object {{hostname: result}}, got {type(data).__name__}")
    return data


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Write fleet-report.{json,md,html,junit.xml} from per-host gpu_verify results and print the table.",
        epilog="Exit codes: 0 report written (whatever the hosts' results), 2 bad input or usage error.",
    )
    parser.add_argument("--input", required=True, help="JSON file {hostname: result}, or - for stdin")
    parser.add_argument(
        "--out-dir",
        required=True,
        help="folder for fleet-report.json, .md, .html and .junit.xml",
    )
    parser.add_argument("--run-id", help="label for this run, shown in the report")
    return parser


def main(
    argv: Sequence[str] | None = None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
) -> int:
    """CLI entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        results = load_input(args.input, stdin)
    except BadInput as exc:
        print(f"fleet_report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = build_report(results, args.run_id)
    try:
        os.makedirs(args.out_dir, exist_ok=True)
        _write(
            os.path.join(args.out_dir, "fleet-report.json"),
            json.dumps(report, indent=2, sort_keys=True, default=str) + "\n",
        )
        _write(os.path.join(args.out_dir, "fleet-report.md"), format_markdown(report))
        _write(os.path.join(args.out_dir, "fleet-report.html"), format_html(report))
        _write(os.path.join(args.out_dir, "fleet-report.junit.xml"), format_junit(report))
    except OSError as exc:
        print(f"fleet_report: cannot write to {args.out_dir}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stdout.write(format_text(report))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
