"""History of fleet reports on the controller: one folder per run, ``latest``, merging partial runs.

Layout under the report folder (``gpu_verify_report_dir``)::

    <inventory name>/<UTC time, 20261201T170400Z>/fleet-report.{json,md,html,junit.xml}
    <inventory name>/latest -> <UTC time>      (relative symlink, switched atomically)

Reports of one run (the same ``run_id``: a rolling reprovisioning's batches) replace each other: a
batch's report holds the hosts of the batches before it, so only the last is kept.

``latest`` is the last *completed* verification: a run that stops before the report creates no
run folder and leaves ``latest`` alone, so dashboards should read the time of the folder it
points to.  The last ``keep`` run folders are kept; older ones are deleted.

A run that did not cover every host of the last full picture (``--limit``, a batch, a job slice)
merges: the hosts it verified carry this run's results; every other host of the previous
``latest`` report that is still in the inventory is carried over with its last status, marked
``not in this run (last seen <time>: <status>)``, and counts neither as passed nor as failed.

Hosts a run did not verify on purpose (``not_verified``: a rolling reprovisioning's host skipped
because its GPUs run jobs, or one the rollout never reached) are carried over the same way, with
their own status and reason instead: ``skipped: <reason> (last seen <time>: <status>)``.

Pure functions (:func:`inventory_name`, :func:`merge`, :func:`carried_host`) are kept apart from
the file system (:func:`load_previous`, :func:`write_run`, :func:`prune`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

LATEST = "latest"
RUN_FOLDER = re.compile(r"^\d{8}T\d{6}Z(?:-\d+)?$")
NOT_IN_RUN = "not in this run"
CARRIED_CHECK = "verification"
DEFAULT_KEEP = 30
DEFAULT_NAME = "default"


def add_location_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say where a run's files go and what the run covered (fleet_report.py, fleet_plan.py)."""
    parser.add_argument("--out-dir", required=True, help="report folder; each inventory gets its own folder in it")
    parser.add_argument("--inventory-name", help="inventory folder name (default: from --inventory-source)")
    parser.add_argument(
        "--inventory-source", action="append", default=[], help="an -i source of the run (repeat for each)"
    )
    parser.add_argument("--keep", type=int, default=DEFAULT_KEEP, help="run folders to keep (>= 1)")
    parser.add_argument("--limit", help="the run's --limit, recorded in the output")
    parser.add_argument(
        "--emit", choices=("text", "json"), default="text", help="stdout: the table, or JSON {table, summary, ...}"
    )


def run_folder_name(now: datetime.datetime) -> str:
    """``20261201T170400Z``: the run's UTC time, sortable and safe in a path."""
    return now.astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")  # noqa: UP017 (Python < 3.11)


def _safe(name: str) -> str:
    """A folder name made of ``[A-Za-z0-9._+-]`` (anything else becomes ``_``) with at least one
    letter or digit (so never ``.`` or ``..``), else :data:`DEFAULT_NAME`."""
    cleaned = re.sub(r"[^A-Za-z0-9._+-]", "_", name.strip()).strip(".")
    return cleaned if re.search(r"[A-Za-z0-9]", cleaned) else DEFAULT_NAME


def _source_name(source: str) -> str:
    """An inventory source's name: a folder's own name, a file's folder's name (as Ansible's
    ``inventory_dir``), ``adhoc`` for a host list (``-i host1,host2,``)."""
    if "," in source and not os.path.exists(source):
        return "adhoc"
    path = Path(source.rstrip("/") or "/")
    return path.name if path.is_dir() else path.parent.name


def inventory_name(sources: Iterable[str], override: str | None = None) -> str:
    """The report's inventory folder name: ``override`` when given (``gpu_verify_inventory_name``,
    AWX's ``awx_inventory_name``), else the name of each ``-i`` source, in order, joined by ``+``
    (``-i inventories/sandbox`` -> ``sandbox``; ``-i a/hosts.yml -i b`` -> ``a+b``)."""
    if override and override.strip():
        return _safe(override)
    names: list[str] = []
    for source in sources:
        name = _source_name(str(source))
        if name and name not in names:
            names.append(name)
    return _safe("+".join(names)) if names else DEFAULT_NAME


def marker(last_seen: str | None, last_status: str | None, label: str = NOT_IN_RUN) -> str:
    """``not in this run (last seen 2026-12-01T17:04:00Z: PASS)``; ``label`` replaces the first words
    (``skipped: <reason>``)."""
    return f"{label} (last seen {last_seen or 'never'}: {last_status or 'unknown'})"


def carried_host(
    previous_host: dict[str, Any], previous_generated_at: str | None, not_verified: dict[str, str] | None = None
) -> dict[str, Any]:
    """A host of the previous report that this run did not verify.

    Its last status and time are kept (from the host itself when it was already carried over,
    so the time is when it was last *verified*); its rows keep the last versions for reference,
    but their status reads ``not in this run (...)`` and their one check is not run: a stale PASS
    is never shown or counted as a current pass.  Its GPU ``health`` is kept as it was when it was
    checked (its report says when).  ``not_verified`` (``{"status", "reason"}``, see
    :func:`merge`) words a host this run left out on purpose: ``<status>: <reason> (...)``, host
    status ``<STATUS>``, and ``reason`` kept in the host's entry."""
    if previous_host.get("carried_over"):
        last_seen, last_status = previous_host.get("last_seen"), previous_host.get("last_status")
        last_problems = previous_host.get("last_problems") or []
    else:
        last_seen, last_status = previous_generated_at, previous_host.get("status")
        last_problems = previous_host.get("problems") or []
    status = (not_verified or {}).get("status") or NOT_IN_RUN
    label = f"{status}: {not_verified['reason']}" if (not_verified or {}).get("reason") else status
    text = marker(last_seen, last_status, label)
    outcome = {"status": "not run", "passed": None, "reason": text, "carried": True}
    rows = [
        dict(row, status=text, problems="-", not_run="all", checks={CARRIED_CHECK: dict(outcome)}, carried=True)
        for row in previous_host.get("rows") or [{"host": "?"}]
        if isinstance(row, dict)
    ]
    return {
        "status": status.upper(),
        "reason": (not_verified or {}).get("reason"),
        "unreachable": False,
        "carried_over": True,
        "last_seen": last_seen,
        "last_status": last_status,
        "last_problems": last_problems,
        "rows": rows,
        "problems": [],
        "mode_notes": [],
        "health": previous_host.get("health"),
        "results": [],
    }


def not_verified(value: str | None) -> dict[str, dict[str, str]]:
    """The ``--not-verified`` JSON, ``{host: {"status": str, "reason": str}}`` ({} for None).

    Raises:
        ValueError: not JSON, or not an object of objects with a non-empty ``status`` and a ``reason``;
            the message says what to pass.
    """
    if value is None:
        return {}
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"--not-verified is not JSON ({exc}); pass an object {{host: {{status, reason}}}}") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"--not-verified must be a JSON object {{host: {{status, reason}}}}, got {type(data).__name__}"
        )
    for host, why in data.items():
        if not (isinstance(why, dict) and str(why.get("status") or "").strip() and isinstance(why.get("reason"), str)):
            raise ValueError(f'--not-verified: {host} needs {{"status": "<word>", "reason": "<text>"}}, got {why!r}')
    return {str(host): {"status": str(why["status"]), "reason": why["reason"]} for host, why in data.items()}


def merge(
    previous: dict[str, Any] | None,
    current: dict[str, Any],
    inventory_hosts: Iterable[str] | None = None,
    not_verified: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The report of this run (``current``, from ``fleet_report.build_report``) merged into the
    last full picture (``previous``, the previous ``latest`` report's JSON, or None).

    Hosts this run verified keep this run's results.  A host of ``previous`` that this run did
    not verify is carried over (:func:`carried_host`) when it is still in ``inventory_hosts``
    (None: no filter); a host no longer in the inventory is dropped.  A host of ``not_verified``
    (``{host: {"status", "reason"}}``, hosts this run left out on purpose; not in ``current``) is
    carried over with that status and reason, with its last result when ``previous`` has one.
    The summary gains ``rechecked`` (hosts verified in this run) and ``not_in_run`` (hosts carried
    over); ``hosts`` counts both, ``passed``/``failed``/``unreachable`` count only this run's hosts."""
    merged = dict(current, hosts=dict(current["hosts"]), summary=dict(current["summary"]))
    rechecked = len(current["hosts"])
    keep = None if inventory_hosts is None else set(inventory_hosts)
    carried = {}
    old = previous.get("hosts") if isinstance(previous, dict) and isinstance(previous.get("hosts"), dict) else {}
    for name, host in old.items():
        if name in current["hosts"] or not isinstance(host, dict) or (keep is not None and name not in keep):
            continue
        carried[name] = carried_host(host, previous.get("generated_at"), (not_verified or {}).get(name))
    for name, why in (not_verified or {}).items():
        if name not in current["hosts"] and name not in carried:
            carried[name] = carried_host({"rows": [{"host": name}]}, None, why)
    merged["hosts"] = {
        name: (merged["hosts"].get(name) or carried[name]) for name in sorted({**carried, **merged["hosts"]})
    }
    merged["summary"].update(hosts=rechecked + len(carried), rechecked=rechecked, not_in_run=len(carried))
    merged["merged_from"] = previous.get("run_folder") if carried and isinstance(previous, dict) else None
    return merged


def load_previous(inventory_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON of the report ``<inventory_dir>/latest`` points to, and a warning when there is
    one that cannot be read (the run then starts a new full picture instead of merging)."""
    path = inventory_dir / LATEST / "fleet-report.json"
    if not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"previous report {path} unreadable ({exc}); this run does not merge it. Remove it or fix it."
    if not isinstance(data, dict):
        return None, f"previous report {path} is not a JSON object; this run does not merge it. Remove it."
    return data, None


def point_latest(inventory_dir: Path, run_folder: str) -> None:
    """Point ``latest`` at ``run_folder`` atomically: a new relative link under a temporary name,
    renamed over the old one (rename(2) replaces a link in one step, POSIX ``rename``)."""
    tmp = inventory_dir / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(run_folder, tmp)
    os.replace(tmp, inventory_dir / LATEST)


def prune(inventory_dir: Path, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` run folders (never the one ``latest`` points to);
    returns the names deleted."""
    runs = sorted(
        p.name for p in inventory_dir.iterdir() if RUN_FOLDER.match(p.name) and p.is_dir() and not p.is_symlink()
    )
    latest = os.readlink(inventory_dir / LATEST) if (inventory_dir / LATEST).is_symlink() else None
    doomed = [name for name in runs[: max(len(runs) - max(keep, 1), 0)] if name != latest]
    for name in doomed:
        shutil.rmtree(inventory_dir / name)
    return doomed


def new_run_folder(inventory_dir: Path, now: datetime.datetime) -> Path:
    """Create ``<inventory_dir>/<UTC time>`` (``-1``, ``-2``... when a run in the same second
    already has it); creation is exclusive, so two runs never share a folder."""
    inventory_dir.mkdir(parents=True, exist_ok=True)
    base = run_folder_name(now)
    for attempt in range(1000):
        path = inventory_dir / (base if attempt == 0 else f"{base}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{inventory_dir}/{base}: 1000 run folders in one second")


def same_run(inventory_dir: Path, run_id: str | None) -> list[str]:
    """The run folders whose report carries ``run_id`` (the earlier reports of one run, such as a
    rolling reprovisioning's batches); none without a run id."""
    if not run_id or not inventory_dir.is_dir():
        return []
    found = []
    for path in sorted(inventory_dir.iterdir()):
        if not (RUN_FOLDER.match(path.name) and path.is_dir() and not path.is_symlink()):
            continue
        try:
            data = json.loads((path / "fleet-report.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("run_id") == run_id:
            found.append(path.name)
    return found


def write_run(
    inventory_dir: Path,
    now: datetime.datetime,
    report: dict[str, Any],
    render: Callable[[dict[str, Any]], dict[str, str]],
    keep: int,
    write: Callable[[str, str], None],
) -> Path:
    """Create a new run folder, record its name in ``report["run_folder"]``, write the files
    ``render(report)`` returns ({file name: text}) with ``write(path, text)`` (atomic per file),
    then point ``latest`` at the folder and prune older runs; returns the run folder. The reports of
    the same run (``report["run_id"]``) written before are replaced: listed under ``supersedes``,
    deleted once ``latest`` points at this one, which holds their hosts (merged)."""
    earlier = same_run(inventory_dir, report.get("run_id"))
    folder = new_run_folder(inventory_dir, now)
    report.update(run_folder=folder.name, supersedes=earlier)
    for name, text in render(report).items():
        write(str(folder / name), text)
    point_latest(inventory_dir, folder.name)
    for name in earlier:
        shutil.rmtree(inventory_dir / name)
    prune(inventory_dir, keep)
    return folder
