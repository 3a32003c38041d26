#!/usr/bin/env python3
"""Benchmark fleet (re)provisioning on sandbox hosts and print one table against the fleet targets.

Each host count (``--hosts 1,4``) gets fresh containers from the sandbox image and an inventory
like the integration tests' (the sandbox group_vars), then, timed from the controller:

1. ``site.yml`` on the bare hosts (first provisioning);
2. ``site.yml`` again (the no-op; its changed count, module round trips, task headers, controller CPU
   seconds per host (ansible-playbook and every process it started) and host writes);
3. ``site.yml --skip-tags verify`` (the no-op provisioning plays);
4. a play that only gathers facts (the floor: median of 3 runs);
5. on the first converged host, ``gpu-health`` as its timer runs it (median CPU and wall seconds of 3).

Definitions:

* Module round trips per host: task results (one per loop item) that ran a module on the host:
  not skipped, not delegated to another host, not a controller-only action (``set_fact``,
  ``debug``, ``assert``, includes, ...), not a loop whose items were all skipped (``no_log`` hides
  each item's own flag). A task counts as delegated when its result says so or, for a loop, whose
  results ansible.posix.json keeps without it, when its source says ``delegate_to: localhost``.
  Fact gathering counts. A ``copy`` or ``template`` counts
  once although it may stat and then copy; an action of this collection that reports ``module_runs``
  (gpu_stacks, gpu_files) counts those: none where gpu_files took the role's own look and wrote nothing.
* Bytes pushed on the second run: the sizes of regular files on the host whose modification time
  is newer than a stamp taken just before the run, outside ``/proc``, ``/sys``, ``/dev``, ``/run``,
  ``/tmp``, Ansible's remote temp folders and the health check's own output of each run (its state
  file and the textfile metrics): what the run left on the host, whoever wrote it.
* Fit seconds: ``fit.fit_seconds`` of each verification result in the run's fleet-report.json.
* Index downloads of a lock: lock installs whose wheels came from a pip index in the first provisioning:
  each host's changed ``Install TensorFlow`` pip run without ``--no-index`` (``tf_venv_wheels_from:
  index``), plus each lock the controller downloaded (``controller``). ``--wheels-from`` picks the mode
  (default: the role's); each host count starts with an empty controller cache, so its first
  provisioning includes the controller's download.

The run takes many minutes (first provisioning installs TensorFlow in every container): it is run
by hand (``make bench``), never by ``make test``. Results are read from Ansible's
``ansible.posix.json`` stdout callback (the ``ansible`` bundle pinned in requirements.txt).

Exit codes: 0 the table was printed (targets met or not); 1 a playbook run failed; 2 usage or a
missing prerequisite (podman, the sandbox image, the stand-ins).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("GPU_SANDBOX_IMAGE", "localhost/gpu-sandbox-debian:12")
PREFIX = "gpu-bench"
BIN = Path(sys.executable).parent

# Actions that run on the controller only: they cost no round trip to the host.
CONTROLLER_ACTIONS = frozenset(
    {
        "add_host",
        "assert",
        "debug",
        "fail",
        "group_by",
        "gpu_fleet_report",
        "gpu_option_checks",
        "import_playbook",
        "import_role",
        "import_tasks",
        "include",
        "include_role",
        "include_tasks",
        "include_vars",
        "meta",
        "pause",
        "set_fact",
        "set_stats",
        "validate_argument_spec",
    }
)
PUSH_ACTIONS = frozenset({"copy", "template", "get_url", "unarchive", "pip", "synchronize"})
# tf_venv's tasks that take a lock's wheels from an index: a host's pip, the controller's download.
PIP_INSTALL_TASK = "Install TensorFlow"
CONTROLLER_DOWNLOAD_TASK = "Download each lock's wheels once for all hosts that need them"

FACTS_PLAY = """---
- name: Gather facts only
  hosts: gpu_hosts
  gather_facts: true
  tasks: []
"""

# Paths never counted as written by the run: kernel views, scratch, Ansible's own temp folders, and the
# health check's output of each run (the time of its last check, the metrics for node_exporter).
FIND_EXCLUDES = (
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/tmp",
    "/root/.ansible",
    "/var/tmp",
    "/var/lib/gpu-health/state.json",
    "/var/lib/prometheus/node-exporter",
)
# One run of the installed health check on a host, as its timer runs it: its CPU seconds (user + system,
# with its nvidia-smi children) and wall seconds, one JSON line.
HEALTH_RUN = (
    "import json, resource, subprocess, time; t = time.monotonic(); "
    "subprocess.run(['gpu-health', '--format', 'json'], stdout=subprocess.DEVNULL, check=False, timeout=120); "
    "r = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(json.dumps({'cpu_s': r.ru_utime + r.ru_stime, 'wall_s': time.monotonic() - t}))"
)


# --- pure parts (unit-tested on captured output) -------------------------------------------------


def short_action(action: str) -> str:
    """``ansible.builtin.set_fact`` -> ``set_fact``; collection modules keep their last part."""
    return action.rsplit(".", 1)[-1]


def load_callback_json(stdout: str) -> dict[str, Any]:
    """The ansible.posix.json document from a run's stdout (warnings may come before it)."""
    start = stdout.find("{")
    if start < 0:
        raise ValueError("no JSON document in the playbook output")
    return json.loads(stdout[start:])


def _ran_on_host(result: dict[str, Any], host: str) -> bool:
    if result.get("skipped"):
        return False
    # A delegated result names the host it really ran on (localhost for controller-side work).
    target = (result.get("_ansible_delegated_vars") or {}).get("ansible_host")
    return not target or target == host


def delegated_in_source(where: str) -> bool:
    """Whether the task at ``file:line`` says ``delegate_to: localhost``. ansible.posix.json keeps a
    delegated loop's results without ``_ansible_delegated_vars``; the task's own text still says it."""
    name, _, line = where.rpartition(":")
    try:
        lines = Path(name).read_text().splitlines()
        start = int(line) - 1
        first = lines[start]
    except (OSError, ValueError, IndexError):
        return False
    indent = len(first) - len(first.lstrip(" -"))
    for text in lines[start + 1 :]:
        if text.strip() and len(text) - len(text.lstrip()) < indent:
            break
        keyword = len(text) - len(text.lstrip()) == indent
        if keyword and text.strip() in ("delegate_to: localhost", "delegate_to: 127.0.0.1"):
            return True
    return False


def _trips(task: dict[str, Any], result: dict[str, Any], host: str) -> int:
    # A loop's results whose items were all skipped (no_log hides the items' own skipped flag).
    if result.get("skipped") or short_action(str(result.get("action", ""))) in CONTROLLER_ACTIONS:
        return 0
    if delegated_in_source(str(task.get("task", {}).get("path", ""))):
        return 0
    # An action of this collection says how many modules it ran on the host (gpu_stacks, gpu_files).
    if isinstance(result.get("module_runs"), int):
        return result["module_runs"]
    items = result.get("results") if isinstance(result.get("results"), list) else [result]
    top = {"_ansible_delegated_vars": result["_ansible_delegated_vars"]} if "_ansible_delegated_vars" in result else {}
    return sum(1 for item in items if isinstance(item, dict) and _ran_on_host(top | item, host))


def round_trips_by_task(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Module round trips per host and task name (tasks that cost none left out)."""
    counts: dict[str, dict[str, int]] = {host: {} for host in doc.get("stats", {})}
    for play in doc.get("plays", []):
        for task in play.get("tasks", []):
            for host, result in task.get("hosts", {}).items():
                trips = _trips(task, result, host)
                if trips:
                    name = str(task.get("task", {}).get("name", "?"))
                    per_host = counts.setdefault(host, {})
                    per_host[name] = per_host.get(name, 0) + trips
    return counts


def round_trips(doc: dict[str, Any]) -> dict[str, int]:
    """Module round trips per host in an ansible.posix.json document (see the module docstring)."""
    return {host: sum(tasks.values()) for host, tasks in round_trips_by_task(doc).items()}


def pushes_changed(doc: dict[str, Any]) -> int:
    """Changed results of modules that move content to a host (copy, template, get_url, ...)."""
    count = 0
    for play in doc.get("plays", []):
        for task in play.get("tasks", []):
            for result in task.get("hosts", {}).values():
                if short_action(str(result.get("action", ""))) in PUSH_ACTIONS and result.get("changed"):
                    count += 1
    return count


def _pip_command(result: dict[str, Any]) -> str:
    args = (result.get("invocation") or {}).get("module_args") or {}
    return f"{result.get('cmd', '')} {args.get('extra_args') or ''}"


def index_downloads(doc: dict[str, Any]) -> int:
    """Lock installs that took their wheels from an index (see the module docstring): each host's
    changed pip install of a lock without ``--no-index``, and each lock the controller downloaded."""
    count = 0
    for play in doc.get("plays", []):
        for task in play.get("tasks", []):
            # A role's task is named "<role> : <name>".
            name = str(task.get("task", {}).get("name", "")).rpartition(" : ")[2]
            for result in task.get("hosts", {}).values():
                if name.startswith(CONTROLLER_DOWNLOAD_TASK):
                    items = result.get("results") if isinstance(result.get("results"), list) else [result]
                    count += sum(1 for item in items if isinstance(item, dict) and item.get("changed"))
                elif name.startswith(PIP_INSTALL_TASK) and short_action(str(result.get("action", ""))) == "pip":
                    if result.get("changed") and "--no-index" not in _pip_command(result):
                        count += 1
    return count


def recap(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per-host PLAY RECAP counters (ok, changed, failures, unreachable, skipped, ...)."""
    return {host: dict(stats) for host, stats in doc.get("stats", {}).items()}


def run_failed(doc: dict[str, Any]) -> list[str]:
    """Hosts that failed a task or were unreachable."""
    return sorted(h for h, s in recap(doc).items() if s.get("failures") or s.get("unreachable"))


def parse_find_sizes(text: str) -> tuple[int, int, list[str]]:
    """``find -printf '%s %p\\n'`` output -> (files, bytes, paths)."""
    files, total, paths = 0, 0, []
    for line in text.splitlines():
        size, _, path = line.strip().partition(" ")
        if size.isdigit() and path:
            files += 1
            total += int(size)
            paths.append(path)
    return files, total, paths


def fit_seconds(report: dict[str, Any]) -> list[float]:
    """Each verification result's fit time from a fleet-report.json document."""
    found = []
    for host in report.get("hosts", {}).values():
        for doc in host.get("results", []) or []:
            value = (doc.get("fit") or {}).get("fit_seconds") if isinstance(doc, dict) else None
            if isinstance(value, (int, float)):
                found.append(float(value))
    return found


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value <= limit + 1e-9 else "not met"


def _scaled(scale: str, value: float | None) -> str:
    return f"{scale} {_fmt(value, 2)}" if value is not None else "-"


def _scale_rows(small: dict[str, Any], large: dict[str, Any] | None, n: tuple[int, int | None]) -> list[list[str]]:
    """Timed runs: seconds on the small and the large host count, and the large-against-small ratio."""
    big = large or {}
    facts_scale = ratio(big.get("facts_s"), small.get("facts_s"))
    first_scale = ratio(big.get("first_s"), small.get("first_s"))
    noop_scale = ratio(big.get("noop_s"), small.get("noop_s"))
    relative = ratio(noop_scale, facts_scale)
    prov_scale = ratio(big.get("noop_prov_s"), small.get("noop_prov_s"))
    prov_relative = ratio(prov_scale, facts_scale)
    scale = f"{n[1]}v{n[0]}" if n[1] else "-"
    return [
        [
            "first provisioning, s",
            _fmt(small.get("first_s")),
            _fmt(big.get("first_s")),
            _scaled(scale, first_scale),
            "<= 1.8",
            _verdict(first_scale, 1.8),
        ],
        # Each lock's wheels fetched from an index once per fleet, whatever its size.
        [
            "index downloads of a lock, first provisioning",
            _fmt(small.get("index_downloads")),
            _fmt(big.get("index_downloads")),
            f"wheels from {small.get('wheels_from') or '-'}",
            "no more than 1 host's",
            _verdict(ratio(big.get("index_downloads"), small.get("index_downloads")), 1.0),
        ],
        [
            "no-op site.yml, s",
            _fmt(small.get("noop_s")),
            _fmt(big.get("noop_s")),
            _scaled(scale, noop_scale) + (f" = {_fmt(relative, 2)} x facts'" if relative else ""),
            "<= 1.2 x facts'",
            _verdict(relative, 1.2),
        ],
        # Not a target of its own: the same ratio without the verification, whose fits share the
        # controller's cores when the hosts are containers on it (on real hosts each has its own).
        [
            "no-op --skip-tags verify, s",
            _fmt(small.get("noop_prov_s")),
            _fmt(big.get("noop_prov_s")),
            _scaled(scale, prov_scale) + (f" = {_fmt(prov_relative, 2)} x facts'" if prov_relative else ""),
            "",
            "",
        ],
        [
            "fact-gathering play, s",
            _fmt(small.get("facts_s")),
            _fmt(big.get("facts_s")),
            _scaled(scale, facts_scale),
            "(floor)",
            "",
        ],
    ]


def _host_rows(small: dict[str, Any], large: dict[str, Any] | None, counts: tuple[int, int | None]) -> list[list[str]]:
    """Per-host figures of the no-op run and the ratios against the fact-gathering play."""
    big = large or {}
    prov = ratio(small.get("noop_prov_s"), small.get("facts_s"))
    site = ratio(small.get("noop_s"), small.get("facts_s"))
    trips = [r.get("round_trips") for r in (small, big) if r.get("round_trips") is not None]
    changed = [r.get("noop_changed") for r in (small, big) if r.get("noop_changed") is not None]
    written = [r.get("written_bytes") for r in (small, big) if r.get("written_bytes") is not None]
    pushes = [r.get("pushes") for r in (small, big) if r.get("pushes") is not None]
    fits = [f for r in (small, big) for f in r.get("fit_s", [])]
    worst = max(trips) if trips else None
    zero = None if not changed else max(changed) + max(pushes or [0]) + max(written or [0])
    return [
        ["no-op provisioning / facts", f"{_fmt(prov)}x", "", "", "<= 5x", _verdict(prov, 5.0)],
        ["no-op site.yml / facts", f"{_fmt(site)}x", "", "", "<= 8x", _verdict(site, 8.0)],
        [
            "module round trips per host, no-op",
            _fmt(small.get("round_trips")),
            _fmt(big.get("round_trips")),
            "",
            "<= 20",
            _verdict(None if worst is None else float(worst), 20.0),
        ],
        *_cost_rows(small, big, counts),
        ["second run: changed", _fmt(small.get("noop_changed")), _fmt(big.get("noop_changed")), "", "0", ""],
        ["second run: content pushes changed", _fmt(small.get("pushes")), _fmt(big.get("pushes")), "", "0", ""],
        [
            "second run: bytes written on host",
            _fmt(small.get("written_bytes")),
            _fmt(big.get("written_bytes")),
            "",
            "0 (with the 2 rows above)",
            _verdict(None if zero is None else float(zero), 0.0),
        ],
        [
            "gpu-health per run: CPU s (wall s)",
            _fmt(_health(small), 2),
            _fmt(_health(big), 2),
            "",
            "<= 1 s CPU",
            _verdict((small.get("health") or {}).get("cpu_s"), 1.0),
        ],
        [
            "fit seconds (min-max)",
            _fmt(_span(small.get("fit_s", []))),
            _fmt(_span(big.get("fit_s", []))),
            f"{len(fits)} fits",
            "",
            "",
        ],
    ]


def added_host_cpu(small: dict[str, Any], big: dict[str, Any], counts: tuple[int, int | None]) -> float | None:
    """Controller CPU seconds each host beyond the smaller count adds to a no-op run: the run's fixed cost
    (parsing the playbooks, building each module's payload once) left out, what a large fleet's nightly
    re-check costs per host."""
    small_n, big_n = counts
    if big_n is None or big_n <= small_n or small.get("noop_cpu_s") is None or big.get("noop_cpu_s") is None:
        return None
    return (big["noop_cpu_s"] * big_n - small["noop_cpu_s"] * small_n) / (big_n - small_n)


def _cost_rows(small: dict[str, Any], big: dict[str, Any], counts: tuple[int, int | None]) -> list[list[str]]:
    """The no-op's controller CPU seconds per host and its task headers (what a nightly re-check of a
    large fleet from one controller costs)."""
    return [
        [
            "controller CPU s per host, no-op",
            _fmt(small.get("noop_cpu_s")),
            _fmt(big.get("noop_cpu_s")),
            "",
            "<= 5",
            _verdict(small.get("noop_cpu_s"), 5.0),
        ],
        ["controller CPU s per added host, no-op", "", _fmt(added_host_cpu(small, big, counts)), "", "", ""],
        [
            "task headers, no-op",
            _fmt(small.get("noop_headers")),
            _fmt(big.get("noop_headers")),
            "",
            "<= 90",
            _verdict(None if small.get("noop_headers") is None else float(small["noop_headers"]), 90.0),
        ],
    ]


def _health(run: dict[str, Any]) -> str | None:
    cost = run.get("health")
    return f"{cost['cpu_s']:.2f} ({cost['wall_s']:.2f})" if cost else None


def _span(values: list[float]) -> str | None:
    if not values:
        return None
    return f"{min(values):.1f}" if len(values) == 1 else f"{min(values):.1f}-{max(values):.1f}"


def table_rows(runs: dict[int, dict[str, Any]]) -> list[list[str]]:
    """The table's rows (header first) from the measurements per host count."""
    counts = sorted(runs)
    small_n, large_n = counts[0], counts[-1] if len(counts) > 1 else None
    header = ["measure", f"{small_n} host(s)", f"{large_n} hosts" if large_n else "-", "ratio", "target", "verdict"]
    large = runs[large_n] if large_n else None
    rows = _scale_rows(runs[small_n], large, (small_n, large_n))
    return [header, *rows, *_host_rows(runs[small_n], large, (small_n, large_n))]


def render(rows: list[list[str]]) -> str:
    """A plain-text table with aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --- running the sandbox -----------------------------------------------------------------------


def start_hosts(count: int) -> list[str]:
    """Start ``count`` fresh sandbox containers (the integration tests' podman options)."""
    names = []
    for _ in range(count):
        name = f"{PREFIX}-{uuid.uuid4().hex[:8]}"
        # The sandbox's own podman options (tools/sandbox.sh), one container per name.
        env = dict(os.environ, GPU_SANDBOX_NAME=name, GPU_SANDBOX_IMAGE=IMAGE)
        subprocess.run([str(ROOT / "tools" / "sandbox.sh"), "up"], check=True, capture_output=True, env=env)
        names.append(name)
    return names


def stop_hosts(names: list[str]) -> None:
    for name in names:
        subprocess.run(["podman", "rm", "-f", "-t", "1", name], capture_output=True, check=False)


def write_inventory(folder: Path, names: list[str]) -> Path:
    """An inventory for ``names`` that reuses the sandbox's group_vars; returns its folder."""
    inventory = folder / "inventory"
    inventory.mkdir(parents=True)
    hosts = "".join(f"    {n}:\n      ansible_connection: podman_pipelined\n" for n in names)
    (inventory / "hosts.yml").write_text(f"---\ngpu_hosts:\n  hosts:\n{hosts}")
    (inventory / "group_vars").symlink_to(ROOT / "inventories/sandbox/group_vars")
    return inventory


def play(playbook: Path, inventory: Path, reports: Path, *extra: str) -> tuple[float, dict[str, Any]]:
    """Run a playbook with the project's ansible.cfg; returns (wall seconds, callback document)."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_HOME=str(ROOT / ".ansible"),
    )
    argv = [
        str(BIN / "ansible-playbook"),
        str(playbook),
        "-i",
        str(inventory),
        "-e",
        f"gpu_verify_report_dir={reports}",
        *extra,
    ]
    started, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600, check=False)
    seconds = time.perf_counter() - started
    try:
        doc = load_callback_json(done.stdout)
    except ValueError as error:
        raise RuntimeError(f"{playbook.name} printed no result ({error}): {done.stderr[-2000:]}") from error
    if failed := run_failed(doc):
        raise RuntimeError(
            f"{playbook.name} {' '.join(extra)} failed on {', '.join(failed)}; rerun with --keep "
            f"and `ansible-playbook {playbook} -i {inventory}` to see why"
        )
    doc["controller_cpu_s"] = _children_cpu() - cpu
    return seconds, doc


def _children_cpu() -> float:
    """User and system CPU seconds of this process's finished children (ansible-playbook, its workers
    and the connection processes they started)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def task_headers(doc: dict[str, Any]) -> int:
    """The tasks a run printed a header for (included files' and skipped tasks too; ``Gathering Facts``
    counts): the tasks of every play in an ansible.posix.json document."""
    return sum(len(play_doc.get("tasks", [])) for play_doc in doc.get("plays", []))


def latest_report(reports: Path) -> dict[str, Any]:
    """The newest fleet-report.json under the report folder (flat, or one folder per run)."""
    found = sorted(reports.rglob("fleet-report.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise RuntimeError(f"the run wrote no fleet-report.json under {reports}")
    return json.loads(found[-1].read_text())


def stamp(names: list[str]) -> None:
    for name in names:
        subprocess.run(["podman", "exec", name, "touch", "/root/.bench-stamp"], check=True, capture_output=True)
    time.sleep(1.1)  # mtimes newer than the stamp, also on file systems with 1 s resolution


def written_since_stamp(names: list[str]) -> tuple[int, int, list[str]]:
    """Files (count, bytes, paths) modified on the hosts since :func:`stamp`."""
    prune = [arg for path in FIND_EXCLUDES for arg in ("-path", path, "-prune", "-o")]
    files, total, paths = 0, 0, []
    for name in names:
        argv = [
            "podman",
            "exec",
            name,
            "find",
            "/",
            "-xdev",
            *prune,
            "-type",
            "f",
            "-newer",
            "/root/.bench-stamp",
            "-printf",
            "%s %p\\n",
        ]
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        f, b, p = parse_find_sizes(out)
        files, total, paths = files + f, total + b, paths + [f"{name}:{x}" for x in p]
    return files, total, paths


def health_check_cost(name: str, runs: int = 3) -> dict[str, float]:
    """The median CPU and wall seconds of ``runs`` runs of gpu-health on a converged host."""
    samples = []
    for _ in range(runs):
        done = subprocess.run(["podman", "exec", name, "python3", "-c", HEALTH_RUN], capture_output=True, text=True)
        samples.append(json.loads(done.stdout))
    return {key: statistics.median(sample[key] for sample in samples) for key in ("cpu_s", "wall_s")}


def wheel_args(work: Path, wheels_from: str | None) -> list[str]:
    """The extra arguments of every run: the mode (none: the role's default) and an empty controller
    cache of this host count's own."""
    mode = ["-e", f"tf_venv_wheels_from={wheels_from}"] if wheels_from else []
    return [*mode, "-e", f"tf_venv_wheel_cache_dir={work / 'wheel-cache'}"]


def measure(count: int, work: Path, out: dict[str, Any], *, keep: bool, wheels_from: str | None = None) -> None:
    """All timed runs on ``count`` fresh hosts, recorded in ``out`` as they finish (a failed run
    leaves the figures before it); the hosts are removed afterwards unless ``keep``."""
    names = start_hosts(count)
    out["hosts"] = names
    out["wheels_from"] = wheels_from or "role default"
    try:
        inventory = write_inventory(work / f"n{count}", names)
        reports = work / f"n{count}" / "reports"
        site = ROOT / "site.yml"
        extra = wheel_args(work / f"n{count}", wheels_from)
        progress(f"{count} host(s): first provisioning")
        out["first_s"], doc = play(site, inventory, reports, *extra)
        out["index_downloads"] = index_downloads(doc)
        stamp(names)
        progress(f"{count} host(s): no-op site.yml")
        out["noop_s"], doc = play(site, inventory, reports, *extra)
        out["written_files"], out["written_bytes"], out["written_paths"] = written_since_stamp(names)
        out["noop_changed"] = sum(s.get("changed", 0) for s in recap(doc).values())
        trips = round_trips_by_task(doc)
        busiest = max(trips, key=lambda host: sum(trips[host].values()))
        out["round_trips"] = sum(trips[busiest].values())
        out["round_trip_tasks"] = {"host": busiest, "tasks": trips[busiest]}  # for --json: where they go
        out["pushes"] = pushes_changed(doc)
        out["noop_cpu_s"], out["noop_headers"] = doc["controller_cpu_s"] / count, task_headers(doc)
        out["fit_s"] = fit_seconds(latest_report(reports))
        progress(f"{count} host(s): the health check, 3 runs")
        out["health"] = health_check_cost(names[0])
        progress(f"{count} host(s): no-op --skip-tags verify")
        out["noop_prov_s"], _ = play(site, inventory, reports, "--skip-tags", "verify", *extra)
        progress(f"{count} host(s): fact-gathering play x3")
        facts = work / "facts.yml"
        facts.write_text(FACTS_PLAY)
        out["facts_s"] = statistics.median(play(facts, inventory, reports)[0] for _ in range(3))
    finally:
        if keep:
            progress(f"kept: {' '.join(names)} (remove with `podman rm -f <name>`)")
        else:
            stop_hosts(names)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,4", help="host counts, comma-separated (default 1,4)")
    parser.add_argument("--quick", action="store_true", help="1 host only (same as --hosts 1)")
    parser.add_argument("--keep", action="store_true", help="leave the containers running afterwards")
    parser.add_argument("--json", type=Path, help="also write the measurements to this file")
    parser.add_argument(
        "--wheels-from",
        choices=["index", "controller"],
        help="tf_venv_wheels_from for every run (default: the role's default)",
    )
    args = parser.parse_args(argv)
    try:
        args.counts = [1] if args.quick else sorted({int(x) for x in args.hosts.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--hosts takes counts like 1,4, not {args.hosts!r}")
    if not args.counts or min(args.counts) < 1:
        parser.error("--hosts needs counts of 1 or more")
    return args


def prerequisites() -> str | None:
    """Why the bench cannot run here, or None."""
    if shutil.which("podman") is None:
        return "podman is missing: run `make deps`"
    if subprocess.run(["podman", "image", "exists", IMAGE], check=False).returncode != 0:
        return f"the sandbox image {IMAGE} is missing: run `make image`"
    if not (ROOT / "build/standins/artifacts.yml").exists():
        return "the NVIDIA stand-ins are missing: run `make standins`"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if problem := prerequisites():
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    load = os.getloadavg()
    runs: dict[int, dict[str, Any]] = {}
    status = 0
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        try:
            for count in args.counts:
                runs[count] = {}
                measure(count, Path(tmp), runs[count], keep=args.keep, wheels_from=args.wheels_from)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as error:
            print(f"bench: {error} (the table shows what was measured before)", file=sys.stderr)
            status = 1
    print(render(table_rows(runs)))
    after = os.getloadavg()
    print(f"load average (1 min) {load[0]:.1f} before, {after[0]:.1f} after; {os.cpu_count()} CPUs")
    for count, run in runs.items():
        for path in run.get("written_paths", [])[:10]:
            print(f"written on the second run ({count} host(s)): {path}")
    if args.json:
        args.json.write_text(json.dumps({str(k): v for k, v in runs.items()}, indent=2, sort_keys=True) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
