"""Write the fleet report from the per-host ``gpu_verify.py`` documents (runs on the controller).

Input (``--input FILE`` or ``--input -`` for stdin): a JSON object keyed by inventory hostname.
Each value is one of

* a ``gpu_verify.py`` document (schema 1),
* a list of such documents (one per TensorFlow stack/venv on that host), shown one row each,
* ``{"unreachable": bool, "error": "...", "failed": "...", "failed_check": "...", "connection": "..."}``
  for a host that left the play before verification: ``error`` is Ansible's message when it was
  unreachable, ``failed`` the failed task and its message when a task failed and ``failed_check`` where
  (``preflight``, or the task's role; any null when the run kept none: the callback plugin
  gpu_fleet.tf_hosts.host_failures keeps them), ``connection`` its ``ansible_connection`` (default
  ssh), which picks the fix (:data:`UNREACHABLE_FIXES`). A host with ``failed`` and ``unreachable``
  false was stopped by a check or a step: it is failed in that check (``failed (check preflight)``),
  never counted unreachable (:func:`left_problem`),
* ``{"ok": false, "problems": [{"check", "cause", "fix"}]}`` for a host whose verification could
  not run.

Each may carry ``health``, the host's GPU health at the time of the run (gpu_health's report, made
compact by the filter gpu_verify_collect): ``{"status": "healthy"|"unhealthy"|"could not check",
"checked_at", "findings": [{"check", "bus_id", "cause", "fix"}], "error": {"cause", "fix"} or null}``,
or null (``not checked``: gpu_health did not run on the host, or ran under --check).  It is shown
beside the verification and never changes a host's status.

Checks.  Every row (one per host and stack) answers the checks ``gpu_count``, ``driver``,
``libcuda``, ``libcudart``, ``libcudnn``, ``tensorflow``, ``fit``, then ``multiworker``,
``scaling`` and ``lock`` when the document has those sections, then any other check a problem
names.  Each is ``pass``, ``fail`` or ``not run``: a check a problem names failed; otherwise it ran
only if its section of the document holds a result (``gpus`` with a count; a driver version and a
pin or the kernel module's version to compare it with; ``libraries.<name>``; a TensorFlow version;
``fit`` with ``ok`` true or false; ``scaling`` with ``ok`` true or false; ``multiworker`` follows
the fit; ``lock`` with ``ok`` true or false, not run for a venv installed without a lock).  A check
that did not run is never reported as passed.  A result without a verification document (no
``schema``, ``gpus``, ``libraries``, ``tensorflow`` or ``fit``: unreachable, failed before
verification, not an object) has the check ``verification`` failed with the reason, and each of
the checks above up to ``fit`` not run (``null`` in JSON, skipped in JUnit, with the reason "the host
was not verified: ..."); the tables' not-run cell reads ``all`` and the not-run lists leave them out
(the host's one problem says why).  A row's status stays
gpu_verify's verdict (``ok`` and no problems): a PASS row may list checks that
did not run (the scaling figure on logical CPU devices, a driver without a pin), never as passed.

``--not-verified`` (a JSON object ``{host: {"status", "reason"}}``) names hosts this run left out on
purpose, e.g. a rolling reprovisioning's host skipped because its GPUs run jobs (``skipped``) or not
reached (``not reached``): their input results are ignored, and each is listed like a host carried
over, ``<status>: <reason> (last seen <time>: <status>)``, neither passed nor failed (see
report_history.py).

Output, in a new run folder ``<out-dir>/<inventory name>/<UTC time>/`` that ``<out-dir>/<inventory
name>/latest`` then points to, merged with the previous ``latest`` report's hosts that this run did
not verify (see report_history.py; ``--dry-run`` writes nothing):

* ``<run folder>/fleet-report.json``: ``{"generated_at": ISO 8601 UTC, "run_id", "hosts": {host:
  {"status": "PASS"|"FAIL", "unreachable": bool, "rows": [row, ...], "problems": [...],
  "mode_notes": [...], "health": {...} or null, "results": [doc, ...]}}, "multiworker": null or
  {"status", "workers", "chief", ...} (see :func:`multiworker_summary`), "summary": {"hosts",
  "passed", "failed", "unreachable", "rechecked", "not_in_run", "health": {"healthy", "unhealthy",
  "could_not_check", "not_checked"}}, "inventory", "run_folder", "limit", "merged_from",
  "supersedes": [earlier run folders of the same run id, deleted]}``; a
  host passes only if every stack on it passed; a host carried over from the previous report has
  ``"status": "NOT IN THIS RUN"``, ``carried_over``, ``last_seen``, ``last_status`` and
  ``last_problems`` (:func:`report_history.carried_host`) and keeps the ``health`` it had when it
  was checked; the summary's ``health`` counts every host listed.  A row holds the table's
  cells (strings; ``not_run`` lists the checks that did not run) and ``checks``: ``{check:
  {"status": "pass"|"fail"|"not run", "passed": true|false|null, "reason": str|null}}``, where
  ``passed`` is null and ``reason`` says why for a check that did not run, and ``reason`` is the
  first cause for a failed one.  Every row of a host of this run has the same checks (those any such
  row has): one that a row lacks is null, not run, with the reason (an unreachable host's ``lock``
  and ``default`` among them), and ``verification`` passed on a row whose verification ran
  (:func:`alike_checks`).
* ``<run folder>/fleet-report.md``: the health counts, the same table in Markdown (column ``GPU
  health``: ``healthy``, ``unhealthy (N findings)``, ``could not check``, ``not checked``), then the
  notes, every check that did not run with its reason (``not run: ...``), every cause and fix, and
  under ``GPU health`` each host unhealthy (each finding's check, bus id, cause and fix) or that
  could not be checked (why, and the fix).
* ``<run folder>/fleet-report.html``: a self-contained page (inline CSS, no scripts) with the table,
  each row coloured by pass/fail and each health cell by its status, text wrapped only at spaces
  (a status, version or figure never on two lines; each problem's cause beside it takes the width
  left); then under ``Hosts`` a ``<details>`` per host with something to say (its problems with
  their fixes, the checks that did not run, its GPU health findings), open when it failed or its
  health needs a look; then the notes, each distinct one once with the hosts it applies to.
* ``<run folder>/fleet-report.junit.xml``: JUnit XML for CI dashboards, one test suite with one test
  case per row and check (classname the row, name the check): passed, ``<failure>`` or
  ``<skipped message="not run: <reason>"/>``; a row without a verification document is the one
  failed case ``verification``; the libcudart and libcudnn cases of a document that says where the
  stack's CUDA comes from (its ``cuda`` section: the runfile tree, or the venv's NVIDIA wheels) carry it
  in ``<system-out>`` with the file and version loaded.  Then one case per host (classname the host), ``health``: passed
  when healthy, ``<failure>`` with every finding when unhealthy, skipped when not checked, when it
  could not be checked and for a host carried over.  The suite counts ``tests``, ``failures``,
  ``errors`` (0) and ``skipped``.
* stdout: the table as plain text, then the notes, the checks that did not run, every cause
  and fix, and the GPU health as in Markdown.

Versions shown are the ones really loaded (libraries' decoded versions, nvidia-smi's driver),
not the pins.  Each row's notes say where its CUDA comes from (``CUDA from the runfile tree ...`` or
``CUDA from the venv's NVIDIA wheels ...``) and, for a file of NVIDIA's wheels, where its version came
from and which wheel installed it.  Times are seconds; throughput is samples/s.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

# report_history.py sits beside this script, which runs as a script (sys.path[0] is its folder).
import report_history

EXIT_OK = 0
EXIT_USAGE = 2

COLUMNS = (
    ("host", "host"),
    ("status", "status"),
    ("health", "GPU health"),
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
    ("lock", "lock sha256"),
    ("mode", "mode"),
    ("problems", "problems"),
    ("not_run", "not run"),
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


# What to check when Ansible could not reach a host, by its ``ansible_connection``.
CONTAINER_FIX = (
    "check the container is running (`{tool} ps -a --filter name={{host}}`; "
    "`{tool} start {{host}}` if it stopped), then rerun"
)
UNREACHABLE_FIXES = {
    "ssh": "check SSH reachability and keys (`ssh {host}` as the inventory's ansible_user, then "
    "`ansible -m ping {host}`) and that the host is up, then rerun",
    "paramiko": "check SSH reachability and keys (`ansible -m ping {host}`) and that the host is up, then rerun",
    **dict.fromkeys(
        ("containers.podman.podman", "podman", "podman_pipelined"),
        CONTAINER_FIX.format(tool="podman"),
    ),
    **dict.fromkeys(("community.docker.docker", "docker"), CONTAINER_FIX.format(tool="docker")),
    "local": "the host is the controller itself (connection local): fix the first task that failed on it, then rerun",
}
UNREACHABLE_FIX_OTHER = (
    "check that Ansible can connect to {host} over its {connection} connection (`ansible -m ping {host}`), then rerun"
)
UNREACHABLE_NO_MESSAGE = "unreachable or failed earlier in this run (see the run's output above)"


# The check of a host stopped by a failed task before verification when the run kept no ``failed_check``.
FAILED_CHECK = "failed"
# gpu_verify_failed_check of the checks before any change (playbooks/tasks/checks.yml).
PREFLIGHT = "preflight"


def left_the_play(doc: Any) -> bool:
    """Whether a host result is that of a host that left the play before verification: unreachable, or
    stopped by a failed task (the filter gpu_verify_collect's document for it, no verification document)."""
    if not isinstance(doc, dict):
        return False
    return bool(doc.get("unreachable")) or (bool(doc.get("failed")) and not any(key in doc for key in DOCUMENT_KEYS))


def failed_problem(doc: dict[str, Any]) -> dict[str, str]:
    """The one problem of a host stopped by a failed task before verification: failed in its check
    (``failed_check``: ``preflight``, the checks before any change, or the step's role), never unreachable."""
    check = str(doc.get("failed_check") or FAILED_CHECK)
    if check == PREFLIGHT:
        where = f"Host failed (check {PREFLIGHT}) before any change"
    elif doc.get("failed_check"):
        where = f"Host failed (step {check}) before verification"
    else:
        where = "Host failed before verification"
    return {
        "check": check,
        "cause": f"{where}, at {doc['failed']}",
        "fix": "fix what that task's message names (the run's output above has the task in full), then rerun",
    }


def left_problem(doc: dict[str, Any], host: str) -> dict[str, str]:
    """The one problem of a host that left the play before verification: Ansible's unreachable
    message (``error``) with the fix for its ``connection`` (default ssh), or the task that failed
    (``failed``, :func:`failed_problem`), or, when the run kept neither, a pointer to the run's output."""
    connection = str(doc.get("connection") or "ssh")
    fix = UNREACHABLE_FIXES.get(connection, UNREACHABLE_FIX_OTHER).format(host=host, connection=connection)
    if doc.get("error"):
        return {"check": "unreachable", "cause": f"Host unreachable: {doc['error']}", "fix": fix}
    if doc.get("failed"):
        return failed_problem(doc)
    return {
        "check": "unreachable",
        "cause": f"Host {UNREACHABLE_NO_MESSAGE}.",
        "fix": f"find this host's first failed or unreachable task in the run's output; if it was unreachable, {fix}",
    }


def host_problems(doc: Any, host: str = "<host>") -> list[dict[str, str]]:
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
    if left_the_play(doc):
        return [left_problem(doc, host)]
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


def _loaded_text(doc: Any, key: str) -> str:
    """``libcudart 11.8.89 <path>``: the release in the real file's name where it has one (NVIDIA's
    names carry it), else the version its call gave; libcuda's name carries the driver's version.  A file
    of NVIDIA's wheels (named by its soname) says where its version came from and which wheel installed it:
    ``libcudart 12.5 (cudaRuntimeGetVersion; wheel nvidia-cuda-runtime-cu12 12.5.82) <path>``."""
    version, release = _get(doc, "libraries", key, "version"), _get(doc, "libraries", key, "release")
    path, wheel = _get(doc, "libraries", key, "path"), _get(doc, "libraries", key, "wheel")
    if key == "libcuda":
        shown = f"CUDA {version}" + (f" (driver {release})" if release else "")
    elif wheel:
        source = _get(doc, "libraries", key, "version_source")
        shown = f"{version or 'unknown'} ({'; '.join(filter(None, [source, f'wheel {wheel}']))})"
    else:
        shown = release or version
    return f"{key} {shown} {path}"


def cuda_source_text(doc: Any) -> str | None:
    """Where the stack's CUDA comes from (gpu_verify.py's ``cuda`` section): ``CUDA from the runfile tree
    /usr/local/cuda-11.8``, or ``CUDA from the venv's NVIDIA wheels (tensorflow[and-cuda]) under
    <site-packages>/nvidia``; None for a document without the section."""
    cuda = _get(doc, "cuda")
    if not isinstance(cuda, dict) or not cuda.get("source"):
        return None
    if cuda["source"] == "wheels":
        folders = [str(folder) for folder in cuda.get("library_dirs") or []]
        under = f" under {os.path.commonpath(folders) if len(folders) > 1 else folders[0]}" if folders else ""
        return f"CUDA from the venv's NVIDIA wheels (tensorflow[and-cuda]){under}"
    return f"CUDA from the {cuda['source']} tree {cuda.get('root') or '-'}"


def _tensorflow_build(doc: Any) -> str | None:
    """Which TensorFlow build the venv holds, as tf.sysconfig.get_build_info() says it, and the GPUs it sees."""
    info = _get(doc, "tensorflow")
    if not isinstance(info, dict) or not info.get("version") or info.get("is_cuda_build") is None:
        return None
    if not info.get("is_cuda_build"):
        return f"TensorFlow {info['version']}: CPU-only build (tensorflow-cpu)"
    build = info.get("build_info") or {}
    built_for = " and ".join(
        f"{name} {build[key]}" for name, key in (("CUDA", "cuda_version"), ("cuDNN", "cudnn_version")) if build.get(key)
    )
    return (
        f"TensorFlow {info['version']}: GPU build"
        + (f" for {built_for}" if built_for else "")
        + f"; it sees {info.get('gpus')} GPUs"
    )


def row_facts(doc: Any) -> list[str]:
    """Notes people need next to a row: where the stack's CUDA comes from, the library files really loaded
    and what a library's
    ``note`` says (a version call that failed without failing the run), a PCI cross-check that did
    not run, a scaling figure that was not judged."""
    notes = [text for text in [cuda_source_text(doc)] if text]
    loaded = [
        _loaded_text(doc, key) for key in ("libcuda", "libcudart", "libcudnn") if _get(doc, "libraries", key, "path")
    ]
    if loaded:
        notes.append("loaded " + ", ".join(loaded))
    build = _tensorflow_build(doc)
    if build:
        notes.append(build)
    # A library call that failed without failing the run (libraries.py: no usable GPU, not probed).
    notes += [
        f"{key}: {_get(doc, 'libraries', key, 'note')}"
        for key in ("libcuda", "libcudart", "libcudnn")
        if _get(doc, "libraries", key, "note")
    ]
    gpus = _get(doc, "gpus")
    if isinstance(gpus, dict) and "pci_bus_ids" in gpus and gpus["pci_bus_ids"] is None:
        notes.append("PCI cross-check skipped: lspci not found or failed (install pciutils)")
    if _get(doc, "scaling", "note"):
        notes.append(f"scaling efficiency {_num(_get(doc, 'scaling', 'efficiency'), 2)} {_get(doc, 'scaling', 'note')}")
    return notes


PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
# The checks every verification document answers, in report order; ``multiworker`` and ``scaling``
# follow when the document has their section, then any other check a problem names.
CHECKS = ("gpu_count", "driver", "libcuda", "libcudart", "libcudnn", "tensorflow", "fit")
OPTIONAL_CHECKS = ("multiworker", "scaling", "lock", "default", "kernel")
# A result with none of these keys is no verification document (unreachable, failed early).
DOCUMENT_KEYS = ("schema", "gpus", "libraries", "tensorflow", "fit")
NO_DOCUMENT_CHECK = "verification"


def has_document(doc: Any) -> bool:
    """Whether a host result is a gpu_verify.py document (its checks ran or were tried)."""
    return isinstance(doc, dict) and not left_the_play(doc) and any(key in doc for key in DOCUMENT_KEYS)


def _gpu_count_outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
    gpus = _get(doc, "gpus")
    if not isinstance(gpus, dict):
        return NOT_RUN, "no gpus section in the result"
    if gpus.get("error"):
        return NOT_RUN, f"nvidia-smi gave no GPU list: {gpus['error']}"
    if isinstance(gpus.get("seen"), bool) or not isinstance(gpus.get("seen"), int):
        return NOT_RUN, "the gpus section holds no count"
    return PASS, None


def _driver_outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
    if not (_get(doc, "driver_version") or _get(doc, "gpus", "driver_version")):
        return NOT_RUN, "nvidia-smi reported no driver version"
    expected = _get(doc, "expected")
    if isinstance(expected, dict) and not expected.get("driver") and not _get(doc, "gpus", "module_version"):
        return NOT_RUN, "no driver version pinned and the loaded kernel module's version unknown: nothing to compare"
    return PASS, None


def _library_outcome(key: str) -> Any:
    def outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
        record = _get(doc, "libraries", key)
        if not isinstance(record, dict):
            return NOT_RUN, f"no libraries.{key} in the result"
        if record.get("ok") is False:
            return FAIL, record.get("error") or f"{key} did not load"
        if record.get("ok") is True or record.get("version"):
            return PASS, None
        return NOT_RUN, record.get("note") or f"libraries.{key} holds no result"

    return outcome


def _tensorflow_outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
    info = _get(doc, "tensorflow")
    if isinstance(info, dict) and info.get("version"):
        return PASS, None
    return NOT_RUN, _get(doc, "tensorflow", "error") or "no TensorFlow version in the result"


def _fit_outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
    fit = _get(doc, "fit")
    if not isinstance(fit, dict):
        return NOT_RUN, "no fit section in the result"
    if fit.get("skipped") or not isinstance(fit.get("ok"), bool):
        return NOT_RUN, fit.get("reason") or fit.get("note") or fit.get("error") or "the fit section holds no result"
    return (PASS, None) if fit["ok"] else (FAIL, fit.get("error") or "the fit reported a failure")


def _multiworker_outcome(_doc: Any, outcomes: dict[str, Any]) -> tuple[str, str | None]:
    """The multi-worker check is this worker's fit under MultiWorkerMirroredStrategy."""
    fit = outcomes["fit"]
    if fit["status"] == FAIL:
        return FAIL, f"the multi-worker fit failed: {fit['reason']}"
    return fit["status"], fit["reason"]


def _scaling_outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
    ok = _get(doc, "scaling", "ok")
    if ok is True:
        return PASS, None
    if ok is False:
        return FAIL, _get(doc, "scaling", "error") or "the scaling check reported a failure"
    return NOT_RUN, _get(doc, "scaling", "note") or "the scaling section holds no result"


def _lock_outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
    """The venv against its dependency lock (gpu_verify.py's ``lock`` section, venv_lock.py)."""
    ok = _get(doc, "lock", "ok")
    if ok is True:
        return PASS, None
    if ok is False:
        return FAIL, "; ".join(_get(doc, "lock", "drift", "lines") or []) or "the venv differs from its lock"
    return NOT_RUN, _get(doc, "lock", "note") or "the lock section holds no result"


def _section_outcome(key: str, failed: str) -> Any:
    """The outcome of a check whose section of the document says ``ok``: ``default`` (the default
    stack's pointers, pointers.py) and ``kernel`` (the stack's Jupyter kernel, kernel.py)."""

    def outcome(doc: Any, _outcomes: dict[str, Any]) -> tuple[str, str | None]:
        ok = _get(doc, key, "ok")
        if ok is True:
            return PASS, None
        if ok is False:
            return FAIL, failed
        return NOT_RUN, f"the {key} section holds no result"

    return outcome


def _lock_cell(doc: Any) -> str:
    """The first 12 hex digits of the venv's lock (its sha256 in full is in the result), ``none``
    for a venv installed without one, ``-`` when the result has no lock section."""
    lock = _get(doc, "lock")
    if not isinstance(lock, dict):
        return "-"
    return str(lock["sha256"])[:12] if lock.get("sha256") else "none"


# check -> (doc, outcomes so far) -> (status, reason) when no problem names the check.
OUTCOMES = {
    "gpu_count": _gpu_count_outcome,
    "driver": _driver_outcome,
    "libcuda": _library_outcome("libcuda"),
    "libcudart": _library_outcome("libcudart"),
    "libcudnn": _library_outcome("libcudnn"),
    "tensorflow": _tensorflow_outcome,
    "fit": _fit_outcome,
    "multiworker": _multiworker_outcome,
    "scaling": _scaling_outcome,
    "lock": _lock_outcome,
    "default": _section_outcome("default", "a default pointer does not serve this stack"),
    "kernel": _section_outcome("kernel", "the stack's Jupyter kernel did not run its cell with the stack's libraries"),
}


def _outcome(status: str, reason: str | None) -> dict[str, Any]:
    return {"status": status, "passed": {PASS: True, FAIL: False}.get(status), "reason": reason}


def check_outcomes(doc: Any, problems: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """``{check: {"status": "pass"|"fail"|"not run", "passed": true|false|null, "reason"}}`` for one
    result: a check a problem names failed (reason: its cause); otherwise its section of the
    document decides (:data:`OUTCOMES`), and a check whose section is missing or holds no result
    did not run.  A result without a verification document has the failed check ``verification``
    (reason: the first problem's cause), then every check of :data:`CHECKS` not run."""
    if not has_document(doc):
        cause = str(problems[0].get("cause")) if problems else None
        not_run = _outcome(NOT_RUN, f"the host was not verified: {cause or 'no verification result'}")
        return {NO_DOCUMENT_CHECK: _outcome(FAIL, cause), **{name: dict(not_run) for name in CHECKS}}
    names = list(CHECKS) + [name for name in OPTIONAL_CHECKS if isinstance(doc.get(name), dict)]
    names += sorted({str(p.get("check")) for p in problems} - set(names))
    outcomes: dict[str, dict[str, Any]] = {}
    for name in names:
        failing = [p for p in problems if str(p.get("check")) == name]
        if failing:
            outcomes[name] = _outcome(FAIL, str(failing[0].get("cause")))
        else:
            # every name without a problem is in OUTCOMES: the others come from the problems
            outcomes[name] = _outcome(*OUTCOMES[name](doc, outcomes))
    return outcomes


def _hosts(count: int) -> str:
    return f"{count} host" + ("" if count == 1 else "s")


def summary_line(summary: dict[str, Any]) -> str:
    """``3 hosts: 1 passed, 0 failed (0 unreachable), 2 not in this run``: the counts of a report,
    where passed and failed count only the hosts verified in this run."""
    line = (
        f"{_hosts(summary['hosts'])}: {summary['passed']} passed, {summary['failed']} failed "
        f"({summary['unreachable']} unreachable)"
    )
    if summary.get("not_in_run"):
        line += f", {summary['not_in_run']} not in this run (last results carried over, not re-checked)"
    return line


def _disk_gib(used: Any) -> str:
    """Sum of ``disk_used_bytes`` ({path: bytes}: toolkits, venv, artifact cache) in GiB, or '-'."""
    if not isinstance(used, dict) or not used:
        return "-"
    return f"{sum(int(v) for v in used.values()) / 1024**3:.2f}"


def _cell(names: list[str]) -> str:
    """Check names for the problems / not-run columns, cut to :data:`PROBLEMS_CELL_WIDTH`."""
    cell = ", ".join(names)
    return cell[: PROBLEMS_CELL_WIDTH - 1] + "…" if len(cell) > PROBLEMS_CELL_WIDTH else cell


def build_row(host: str, doc: Any) -> dict[str, Any]:
    """One table row (strings), ``status`` and ``checks`` (:func:`check_outcomes`) for a host's
    result document."""
    problems = host_problems(doc, host)
    passed = isinstance(doc, dict) and doc.get("ok") is True and not problems
    stack = _get(doc, "stack")
    gpus = _get(doc, "gpus") or {}
    expected = gpus.get("expected", _get(doc, "expected", "gpus")) if isinstance(gpus, dict) else None
    seen = gpus.get("seen") if isinstance(gpus, dict) else None
    loss_start, loss_end = _get(doc, "fit", "loss_start"), _get(doc, "fit", "loss_end")
    loss = "-"
    if loss_start is not None or loss_end is not None:
        loss = f"{_num(loss_start, 3)}→{_num(loss_end, 3)}"
    replicas = _get(doc, "fit", "num_replicas_in_sync")
    checks = check_outcomes(doc, problems)
    not_run = [name for name, outcome in checks.items() if outcome["status"] == NOT_RUN]
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
        "lock": _lock_cell(doc),
        "mode": (_get(doc, "mode") or "-") + (" fp16" if _get(doc, "fit", "mixed_precision") else ""),
        "problems": ("TIMED OUT " if _get(doc, "fit", "timed_out") else "")
        + _cell(sorted({str(p.get("check")) for p in problems})),
        "not_run": _cell(not_run) if has_document(doc) else "all",
        "default_stack": isinstance(_get(doc, "default"), dict),  # gpu_verify.py checked its pointers
        "checks": checks,
        "_problems": problems,
        **_row_notes(doc),
    }


def _row_notes(doc: Any) -> dict[str, Any]:
    """The private (not in the JSON rows) note fields of a row."""
    return {
        "_mode_note": _get(doc, "mode_note"),
        "_utilisation": None if _get(doc, "mode") == "cpu-replicas" else _utilisation_note(_get(doc, "utilisation")),
        "_facts": row_facts(doc),
        "_overridden": [
            f"preflight check {p.get('check')} overridden: {p.get('cause')}"
            for p in (_get(doc, "preflight_overridden") or [])
            if isinstance(p, dict)
        ],
        "_unreachable": bool(_get(doc, "unreachable")),
        "_reboot": _reboot_note(doc),
        "_default": _default_note(doc),
    }


def _default_note(doc: Any) -> list[str]:
    """What became of a switch to a newly declared default stack (gpu_env's default_switch)."""
    switch = _get(doc, "default_switch")
    if not isinstance(switch, dict) or not switch.get("to"):
        return []
    if switch.get("switched"):
        return [f"default stack switched: {switch.get('from')} -> {switch.get('to')} (verified first)"]
    if switch.get("waits"):
        return [
            f"default stays {switch.get('from')}: the declared default {switch.get('to')} is pending; site.yml "
            "switches to it once it verifies (playbooks/verify.yml only reads)"
        ]
    return [
        f"default stays {switch.get('from')}: the declared default {switch.get('to')} did not pass "
        "verification; it becomes the default once it does"
    ]


def _reboot_note(doc: Any) -> list[str]:
    """'reboot required: ...' when nvidia_driver found the loaded module older or newer than the install."""
    if not _get(doc, "driver_reboot_required"):
        return []
    loaded = _get(doc, "driver_loaded_version") or "another version"
    return [
        f"reboot required: the loaded NVIDIA kernel module is {loaded}, the installed driver "
        f"{_get(doc, 'expected', 'driver') or 'differs'}; reboot the host (or rerun with "
        "nvidia_driver_reboot_allowed: true)"
    ]


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


# The host's GPU health at the time of the run: gpu_health's report, made compact by the filter
# gpu_verify_collect (``health`` in each of the host's documents).  It is shown beside the
# verification and never changes whether the host passed it.
HEALTHY, UNHEALTHY, COULD_NOT_CHECK, NOT_CHECKED = "healthy", "unhealthy", "could not check", "not checked"
HEALTH_STATUSES = (HEALTHY, UNHEALTHY, COULD_NOT_CHECK, NOT_CHECKED)
HEALTH_CHECK = "health"
NOT_CHECKED_REASON = "no GPU health report: gpu_health did not run on this host in this run, or ran under --check"


def host_health(docs: list[Any]) -> dict[str, Any] | None:
    """The ``health`` of a host's documents (the same in each), or None when none has one."""
    for doc in docs:
        health = _get(doc, "health")
        if isinstance(health, dict) and health.get("status") in (HEALTHY, UNHEALTHY, COULD_NOT_CHECK):
            return health
    return None


def health_status(health: Any) -> str:
    """``healthy``, ``unhealthy``, ``could not check`` or, without a health report, ``not checked``."""
    status = _get(health, "status")
    return status if status in (HEALTHY, UNHEALTHY, COULD_NOT_CHECK) else NOT_CHECKED


def _findings(health: Any) -> list[dict[str, Any]]:
    findings = _get(health, "findings")
    return [item for item in findings if isinstance(item, dict)] if isinstance(findings, list) else []


def _count(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def health_cell(health: Any) -> str:
    """The table's ``health`` cell: ``healthy``, ``unhealthy (2 findings)``, ``could not check``, ``not checked``."""
    status = health_status(health)
    return f"{status} ({_count(len(_findings(health)), 'finding')})" if status == UNHEALTHY else status


def health_headline(health: Any) -> str:
    """``unhealthy, 2 findings (checked 2026-12-01T17:03:12Z)``; ``not checked: <why>`` without a report."""
    status = health_status(health)
    if status == NOT_CHECKED:
        return f"{NOT_CHECKED}: {NOT_CHECKED_REASON}"
    count = f", {_count(len(_findings(health)), 'finding')}" if status == UNHEALTHY else ""
    checked = f"(checked {_get(health, 'checked_at') or 'at an unknown time'})"
    return f"{status}{count}{dcgm_summary(health)} {checked}{moved_summary(health)}"


def moved_summary(health: Any) -> str:
    """``; moved on purpose by this run: driver 520.61.05 -> 555.42.06``: what the run changed on purpose, which
    the health check judged against the run's pins, not the baseline's (gpu_health.py's ``moved``)."""
    moved = _get(health, "moved")
    texts = [str(text) for text in moved if text] if isinstance(moved, list) else []
    return f"; moved on purpose by this run: {'; '.join(texts)}" if texts else ""


def dcgm_summary(health: Any) -> str:
    """``, DCGM diag level 2: 9 Pass, 1 Fail`` when the health check ran NVIDIA DCGM's diagnostic."""
    dcgm = _get(health, "dcgm")
    if not isinstance(dcgm, dict):
        return ""
    results = [str(item.get("result")) for item in dcgm.get("tests") or [] if isinstance(item, dict)]
    counts = ", ".join(f"{results.count(result)} {result}" for result in sorted(set(results)))
    return f", DCGM diag level {dcgm.get('level')}: {counts or 'no test ran'}"


def health_items(health: Any) -> list[tuple[str, str, str]]:
    """``(what, cause, fix)`` of each finding (``what``: its check and the GPU's bus id, none for the host)
    of an unhealthy host, or of the error of one that could not be checked."""
    status = health_status(health)
    if status == COULD_NOT_CHECK:
        error = _get(health, "error") if isinstance(_get(health, "error"), dict) else {}
        return [(HEALTH_CHECK, str(error.get("cause") or "no cause given"), str(error.get("fix") or "-"))]
    if status != UNHEALTHY:
        return []
    return [
        (
            " ".join(str(part) for part in (item.get("check"), item.get("bus_id")) if part),
            str(item.get("cause")),
            str(item.get("fix")),
        )
        for item in _findings(health)
    ]


def health_counts(hosts: dict[str, Any]) -> dict[str, int]:
    """The summary's ``health``: ``{healthy, unhealthy, could_not_check, not_checked}`` over every host
    listed (a host carried over counts with the health it had when it was checked)."""
    statuses = [health_status(host.get("health")) for host in hosts.values()]
    return {status.replace(" ", "_"): statuses.count(status) for status in HEALTH_STATUSES}


def health_line(summary: dict[str, Any]) -> str | None:
    """``GPU health: 1 healthy, 1 unhealthy, 0 could not check, 2 not checked`` (None without counts)."""
    counts = summary.get("health")
    if not isinstance(counts, dict):
        return None
    return "GPU health: " + ", ".join(f"{counts.get(s.replace(' ', '_'), 0)} {s}" for s in HEALTH_STATUSES)


def health_details(report: dict[str, Any]) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """``(host, headline, items)`` of each host whose health needs a look: unhealthy (each finding) or
    could not check (why, and the fix), or where the run moved something on purpose (the headline says what) or
    the check left a note (each with its fix); the table's ``health`` column has the others."""
    details = []
    for name, host in report["hosts"].items():
        health = host.get("health")
        items = health_items(health) + note_items(health)
        if health_status(health) in (UNHEALTHY, COULD_NOT_CHECK) or items or moved_summary(health):
            details.append((name, health_headline(health), items))
    return details


def note_items(health: Any) -> list[tuple[str, str, str]]:
    """``("note", cause, fix)`` of each of the health report's notes: said, never a finding (metrics that no
    node_exporter on the host serves)."""
    notes = _get(health, "notes")
    items = [item for item in notes if isinstance(item, dict)] if isinstance(notes, list) else []
    return [("note", str(item.get("cause")), str(item.get("fix") or "-")) for item in items]


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
            "reboot_required": any(r["_reboot"] for r in rows),
            "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
            "problems": [dict(p, stack=r["host"]) for r in rows for p in r["_problems"]],
            "mode_notes": sorted({r["_mode_note"] for r in rows if r["_mode_note"]})
            + sorted({note for r in rows for note in r["_overridden"] + r["_reboot"] + r["_default"]})
            + [r["_utilisation"] for r in rows if r["_utilisation"]]
            + [f"{r['host']}: {fact}" if len(rows) > 1 else fact for r in rows for fact in r["_facts"]],
            "health": host_health(docs),
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
            "rechecked": len(hosts),
            "not_in_run": 0,
            "health": health_counts(hosts),
        },
    }


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row, with ``-`` in any cell a row lacks (a host carried over from an older report)."""
    blank = dict.fromkeys((key for key, _title in COLUMNS), "-")
    return [
        {**blank, "checks": {}, **row, "health": health_cell(host.get("health"))}
        for host in report["hosts"].values()
        for row in host["rows"]
    ]


def _note_line(name: str, host: dict[str, Any], note: str) -> str:
    """A host's note for the text, Markdown and HTML reports, led by the host name once: a note of
    one stack on a host with several already starts with that row's label (``gpu-f3 (tf2.12): ``)."""
    labels = {row["host"] for row in host["rows"]} if len(host["rows"]) > 1 else set()
    if note.partition(": ")[0] in labels:
        return note
    return f"{name}: {note}"


def _details(
    report: dict[str, Any],
) -> tuple[list[str], list[tuple[str, dict[str, str]]], list[tuple[str, str, str]]]:
    """The notes, the problems as ``(row label, problem)`` and the checks that did not run as
    ``(row label, check, reason)`` (not those of a row without a verification: its one problem says
    why, and its ``not run`` cell says ``all``)."""
    notes = [_note_line(name, host, note) for name, host in report["hosts"].items() for note in host["mode_notes"]]
    problems = [(p.get("stack", name), p) for name, host in report["hosts"].items() for p in host["problems"]]
    not_run = [
        (row["host"], check, outcome["reason"] or "no reason given")
        for row in _rows(report)
        if row["not_run"] != "all"
        for check, outcome in row["checks"].items()
        if outcome["status"] == NOT_RUN
    ]
    return notes, problems, not_run


# A --check run's printed report says at its top and in its summary that it is not a real run's.
CHECK_MODE_TOP = (
    "CHECK MODE (--check): the checks ran read-only on the hosts as they are now; nothing was changed "
    "and this report was not written."
)
CHECK_MODE_SUMMARY = " (check mode: not written)"


def format_text(report: dict[str, Any], check_mode: bool = False) -> str:
    """Plain-text table (columns padded) with notes, causes and fixes below it; a --check run's says so
    at its top and in its summary line."""
    headers = [title for _key, title in COLUMNS]
    rows = [[row[key] for key, _title in COLUMNS] for row in _rows(report)]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = [CHECK_MODE_TOP, ""] if check_mode else []
    lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    summary = report["summary"]
    lines.append("")
    lines.append(
        f"{summary_line(summary)}; generated {report['generated_at']}"
        + (f", run {report['run_id']}" if report.get("run_id") else "")
        + (CHECK_MODE_SUMMARY if check_mode else "")
    )
    if report.get("multiworker"):
        lines.append(multiworker_line(report["multiworker"]))
    lines += [line for line in [health_line(summary)] if line]
    notes, problems, not_run = _details(report)
    if notes:
        lines += ["", "Notes:"] + [f"  {n}" for n in notes]
    if not_run:
        lines += ["", "Not run:"] + [f"  {where} [{check}]: not run: {reason}" for where, check, reason in not_run]
    if problems:
        lines += ["", "Problems:"]
        for where, p in problems:
            lines.append(f"  {where} [{p.get('check')}]: {p.get('cause')}")
            lines.append(f"      fix: {p.get('fix')}")
    return "\n".join(lines + _health_text(report)) + "\n"


def _health_text(report: dict[str, Any]) -> list[str]:
    """The plain-text report's ``GPU health`` section: each host unhealthy or not checkable, with causes and fixes."""
    details = health_details(report)
    lines = ["", "GPU health:"] if details else []
    for name, headline, items in details:
        lines.append(f"  {name}: {headline}")
        for what, cause, fix in items:
            lines += [f"    [{what}] {cause}", f"        fix: {fix}"]
    return lines


def _md(cell: Any) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def format_markdown(report: dict[str, Any]) -> str:
    """Markdown version of the report."""
    summary = report["summary"]
    title = "# GPU fleet report" + (f" — run {report['run_id']}" if report.get("run_id") else "")
    lines = [
        title,
        "",
        f"Generated {report['generated_at']}: {summary_line(summary)}.",
        "",
        *([_md(multiworker_line(report["multiworker"])), ""] if report.get("multiworker") else []),
        *([f"{health_line(summary)}.", ""] if health_line(summary) else []),
        "| " + " | ".join(_md(t) for _key, t in COLUMNS) + " |",
        "|" + "|".join("---" for _column in COLUMNS) + "|",
    ]
    for row in _rows(report):
        lines.append("| " + " | ".join(_md(row[k]) for k, _title in COLUMNS) + " |")
    notes, problems, not_run = _details(report)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {_md(n)}" for n in notes]
    if not_run:
        lines += ["", "## Not run", ""]
        lines += [f"- **{_md(where)}** `{_md(check)}`: not run: {_md(reason)}" for where, check, reason in not_run]
    if problems:
        lines += ["", "## Problems", ""]
        for where, p in problems:
            lines.append(f"- **{_md(where)}** `{_md(p.get('check'))}`: {_md(p.get('cause'))}  ")
            lines.append(f"  Fix: {_md(p.get('fix'))}")
    return "\n".join(lines + _health_markdown(report)) + "\n"


def _health_markdown(report: dict[str, Any]) -> list[str]:
    """The Markdown report's ``GPU health`` section: a host that is unhealthy, with each finding (check,
    bus id, cause, fix), or could not be checked, with why and the fix."""
    details = health_details(report)
    lines = ["", "## GPU health", ""] if details else []
    for name, headline, items in details:
        lines.append(f"- **{_md(name)}**: {_md(headline)}")
        for what, cause, fix in items:
            lines += [f"  - `{_md(what)}`: {_md(cause)}  ", f"    Fix: {_md(fix)}"]
    return lines


# A 1400 px window shows every column: the status and the GPU health, then each problem's cause,
# then the figures.
HTML_FIRST = ("host", "status", "health", "problems", "not_run")
_HTML_TITLES = dict(COLUMNS, problems="problems (check: cause)")
HTML_COLUMNS = tuple((key, _HTML_TITLES[key]) for key in HTML_FIRST) + tuple(
    c for c in COLUMNS if c[0] not in HTML_FIRST
)
# Cells that hold one value each (a status, a version, a figure): never wrapped.
HTML_NOWRAP = ("status", "driver", "cuda", "cudnn", "tensorflow", "gpus", "replicas", "workers", "loss")
HTML_NOWRAP += ("fit_seconds", "samples_per_second", "efficiency", "disk_gib", "lock")
# Text wraps only at spaces, never inside a word or version (no ``overflow-wrap:anywhere``, whose break
# opportunities also shrink a column's min-content width: CSS Text Module Level 3, section 5.5 "Overflow
# Wrapping", https://www.w3.org/TR/css-text-3/#overflow-wrap-property).  Every column but the problems is as
# narrow as its longest word, or its whole value where it is never wrapped (``width:1%``, the auto table
# layout of CSS 2.1 section 17.5.2.2, https://www.w3.org/TR/CSS21/tables.html#auto-table-layout); the
# problems take the rest of the width.
HTML_STYLE = (
    "body{font-family:sans-serif;font-size:13px;margin:.5em}table{border-collapse:collapse;width:100%}"
    "table#fleet{font-size:11.5px}"
    "th,td{border:1px solid #bbb;padding:.2em .25em;text-align:left;vertical-align:top;"
    "overflow-wrap:normal;word-break:normal;hyphens:manual;width:1%}"
    "th{background:#eee;font-size:10.5px}th.problems,td.problems{width:auto;min-width:16em}"
    + ",".join(f"td.{key}" for key in HTML_NOWRAP)
    + "{white-space:nowrap}td.lock{font-family:monospace;font-size:11px}"
    "tr.carried td.status{min-width:5em;white-space:normal}span.w{white-space:nowrap}"
    "span.default{background:#dde8ff;border-radius:3px;padding:0 .3em;margin-left:.3em;font-size:.9em;"
    "white-space:nowrap}"
    "tr.pass td.status{background:#c8f0c8}tr.fail td.status{background:#f6c4c4}"
    "tr.fail{background:#fff4f4}li{margin:.3em 0}"
    "p#multiworker{padding:.3em .6em;display:inline-block}p#multiworker.pass{background:#c8f0c8}"
    "p#multiworker.fail{background:#f6c4c4}td.not_run{color:#7a5c00}tr.carried{color:#666;font-style:italic}"
    "span.health{display:inline-block;border-radius:3px;padding:0 .3em}"
    "span.healthy{background:#c8f0c8}span.unhealthy{background:#f6c4c4}span.could-not-check{background:#ffe8b0}"
    "span.not-checked{color:#666}"
    "details.host{margin:.3em 0;padding:.2em .5em;border-left:4px solid #c8f0c8}"
    "details.host.fail{border-left-color:#f6c4c4}details.host summary{cursor:pointer}"
    "details.host h3{font-size:1em;margin:.5em 0 .2em}span.hosts{color:#555}"
)


def _words(text: Any) -> str:
    """``text`` escaped for a cell that wraps, each word that holds a character a line may break after
    (``-``, ``/``, ``?``...: Unicode Standard Annex #14, "Unicode Line Breaking Algorithm",
    https://www.unicode.org/reports/tr14/) kept on one line; the cell wraps only at spaces."""
    return " ".join(
        html.escape(word)
        if not word or word.strip("(),.:;").isalnum()
        else f'<span class="w">{html.escape(word)}</span>'
        for word in str(text).split(" ")
    )


def _html_cell(row: dict[str, Any], key: str, problems: list[tuple[str, dict[str, str]]]) -> str:
    """One cell of the HTML table: the host with a ``default`` mark on its default stack's row, each
    problem's check with its cause beside the status (the fixes are in the host's details)."""
    if key == "host":
        return _words(row["host"]) + ('<span class="default">default</span>' if row.get("default_stack") else "")
    if key == "health":
        status = str(row["health"]).partition(" (")[0].replace(" ", "-")
        return f'<span class="health {html.escape(status)}">{_words(row["health"])}</span>'
    if key == "problems":
        mine = [p for where, p in problems if where == row["host"]]
        if mine:
            return "<br>".join(f"<b>{_words(p.get('check'))}</b>: {_words(p.get('cause'))}" for p in mine)
    return html.escape(str(row[key])) if key in HTML_NOWRAP else _words(row[key])


def format_html(report: dict[str, Any]) -> str:
    """Self-contained HTML page (inline CSS, no scripts): the table with a pass/fail colour per row,
    then each host's details folded (:func:`_hosts_html`), then each distinct note once with the
    hosts it applies to (:func:`_notes_html`)."""
    esc = html.escape
    summary = report["summary"]
    head = "".join(f'<th class="{key}">{esc(t)}</th>' for key, t in HTML_COLUMNS)
    _notes, problems, not_run = _details(report)
    rows = []
    for row in _html_rows(report):
        cells = "".join(f'<td class="{key}">{_html_cell(row, key, problems)}</td>' for key, _title in HTML_COLUMNS)
        rows.append(f'<tr class="{"carried" if row.get("carried") else row["status"].lower()}">{cells}</tr>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>GPU fleet report</title>'
        f"<style>{HTML_STYLE}</style></head><body>\n<h1>GPU fleet report</h1>\n"
        f"<p>Generated {esc(report['generated_at'])}: {esc(summary_line(summary))}.</p>\n"
        + (
            f'<p id="multiworker" class="{report["multiworker"]["status"].lower()}">'
            f"{esc(multiworker_line(report['multiworker']))}</p>\n"
            if report.get("multiworker")
            else ""
        )
        + (f'<p id="health-summary">{esc(health_line(summary))}.</p>\n' if health_line(summary) else "")
        + f'<table id="fleet"><thead><tr>{head}</tr></thead><tbody>\n'
        + "\n".join(rows)
        + "\n</tbody></table>\n"
        + _hosts_html(report, problems, not_run)
        + _notes_html(report)
        + "</body></html>\n"
    )


def _html_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of :func:`_rows`, a host's carried over from an earlier report with its status in
    short (``NOT IN THIS RUN``, ``SKIPPED``) and the whole of it (why, when last seen and how) in the
    problems column."""
    short = {
        row["host"]: str(host["status"])
        for host in report["hosts"].values()
        if host.get("carried_over")
        for row in host["rows"]
    }
    return [
        dict(row, status=short.get(row["host"], row["status"]), problems=row["status"]) if row.get("carried") else row
        for row in _rows(report)
    ]


def shared_notes(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Each distinct note of the report once, with whom it applies to, in the order first seen:
    ``(note, [host or row label, ...])``; a note every stack of a host has names the host."""
    grouped: dict[str, list[str]] = {}
    for name, host in report["hosts"].items():
        labels = [row["host"] for row in host["rows"]] if len(host["rows"]) > 1 else []
        for note in host["mode_notes"]:
            label, sep, text = note.partition(": ")  # a note of one stack starts with its row's label
            who, text = (label, text) if sep and label in labels else (name, note)
            grouped.setdefault(text, []).append(who)
    return [(text, _whole_hosts(report, whom)) for text, whom in grouped.items()]


def _whole_hosts(report: dict[str, Any], whom: list[str]) -> list[str]:
    """``whom`` (hosts and row labels) in report order, a host whose every stack is in it named once."""
    named = []
    for name, host in report["hosts"].items():
        labels = [row["host"] for row in host["rows"]]
        mine = [who for who in whom if who == name or who in labels]
        named += [name] if len(labels) > 1 and set(labels) <= set(mine) else mine
    return named


def _notes_html(report: dict[str, Any]) -> str:
    """The HTML report's ``Notes``: a note of one host or stack as ``<host>: <note>``, a note several
    share once, followed by them (``all N hosts`` when it is every host's)."""
    esc = html.escape
    items = []
    for text, whom in shared_notes(report):
        if len(whom) == 1:
            items.append(f"<li>{esc(whom[0])}: {esc(text)}</li>")
            continue
        kind = "hosts" if set(whom) <= set(report["hosts"]) else "hosts and stacks"
        every = set(whom) == set(report["hosts"])
        hosts = f"all {len(whom)} hosts" if every else f"{len(whom)} {kind}: " + ", ".join(whom)
        items.append(f'<li>{esc(text)} <span class="hosts">({_words(hosts)})</span></li>')
    return f'<h2>Notes</h2><ul id="notes">{"".join(items)}</ul>\n' if items else ""


def _hosts_html(
    report: dict[str, Any], problems: list[tuple[str, dict[str, str]]], not_run: list[tuple[str, str, str]]
) -> str:
    """The HTML report's ``Hosts``: a ``<details>`` per host with something to say (its problems with
    their fixes, the checks that did not run, its GPU health findings), open when the host failed or
    its GPU health needs a look, folded otherwise (HTML Living Standard, 4.11.1 "The details element",
    https://html.spec.whatwg.org/multipage/interactive-elements.html#the-details-element)."""
    esc = html.escape
    health = {name: (headline, items) for name, headline, items in health_details(report)}
    parts = []
    for name, host in report["hosts"].items():
        labels = {name} | {row["host"] for row in host["rows"]}
        mine = [(where, p) for where, p in problems if where in labels]
        skipped = [(where, check, reason) for where, check, reason in not_run if where in labels]
        if not (mine or skipped or name in health):
            continue
        said = [_count(len(mine), "problem")] if mine else []
        said += [_count(len(skipped), "check") + " not run"] if skipped else []
        said += [f"GPU health {health_cell(host.get('health'))}"] if name in health else []
        failed = host["status"] == "FAIL"
        parts.append(
            f'<details class="host {"fail" if failed or name in health else "pass"}" id="host-{esc(name)}"'
            + (" open" if failed or name in health else "")
            + f"><summary><b>{esc(name)}</b> {esc(str(host['status']))}: {esc(', '.join(said))}</summary>\n"
            + _host_parts_html(mine, skipped, health.get(name))
            + "</details>\n"
        )
    return "<h2>Hosts</h2>\n" + "".join(parts) if parts else ""


def _host_parts_html(
    problems: list[tuple[str, dict[str, str]]],
    not_run: list[tuple[str, str, str]],
    health: tuple[str, list[tuple[str, str, str]]] | None,
) -> str:
    """The inside of a host's ``<details>``: its problems (cause and fix), the checks that did not
    run (why) and its GPU health (the headline, then each finding's cause and fix)."""
    esc = html.escape
    out = ""
    if problems:
        out += '<h3>Problems</h3><ul class="problems">' + "".join(
            f"<li><b>{esc(where)}</b> <code>{esc(str(p.get('check')))}</code>: {esc(str(p.get('cause')))}"
            f"<br>Fix: {esc(str(p.get('fix')))}</li>"
            for where, p in problems
        )
        out += "</ul>\n"
    if not_run:
        out += '<h3>Not run</h3><ul class="not-run">' + "".join(
            f"<li><b>{esc(where)}</b> <code>{esc(check)}</code>: not run: {esc(reason)}</li>"
            for where, check, reason in not_run
        )
        out += "</ul>\n"
    if health:
        headline, items = health
        out += f'<h3>GPU health</h3><p class="health">{esc(headline)}</p><ul class="health">' + "".join(
            f"<li><code>{esc(what)}</code>: {esc(cause)}<br>Fix: {esc(fix)}</li>" for what, cause, fix in items
        )
        out += "</ul>\n"
    return out


def library_output(doc: Any, check: str) -> str | None:
    """The ``system-out`` of a row's libcudart and libcudnn cases: where the stack's CUDA comes from and the
    file and version the probe read (:func:`cuda_source_text`, :func:`_loaded_text`); None for other checks,
    a library the probe did not map, and a document without the ``cuda`` section."""
    source = cuda_source_text(doc)
    if check not in ("libcudart", "libcudnn") or not source or not _get(doc, "libraries", check, "path"):
        return None
    return f"{source}: {_loaded_text(doc, check)}"


def _junit_case(
    suite: ET.Element, row: dict[str, Any], check: str, found: list[dict[str, str]], doc: Any = None
) -> str:
    """Add the test case of one row's check; returns its status.  ``found``: the row's problems; ``doc``: its
    document, whose libcudart and libcudnn cases say the file and version loaded (:func:`library_output`).

    A check that did not run is ``<skipped message="not run: ..."/>``, a failed one ``<failure
    message=... type=...>`` (elements and attributes as in the JUnit XML format documented at
    https://github.com/testmoapp/junitxml and Jenkins' JUnit schema,
    https://github.com/jenkinsci/xunit-plugin/blob/master/src/main/resources/org/jenkinsci/plugins/xunit/types/model/xsd/junit-10.xsd)."""
    outcome = row["checks"][check]
    case = ET.SubElement(suite, "testcase", classname=row["host"], name=check)
    if outcome.get("carried"):
        # A host this run did not verify: skipped with its last result, never a pass.
        ET.SubElement(case, "skipped", message=str(outcome["reason"]))
    elif outcome["status"] == NOT_RUN:
        ET.SubElement(case, "skipped", message=f"not run: {outcome['reason'] or 'no reason given'}")
    elif outcome["status"] == FAIL:
        failing = found if check == NO_DOCUMENT_CHECK else [p for p in found if str(p.get("check")) == check]
        kind = ", ".join(sorted({str(p.get("check")) for p in failing})) or check
        failure = ET.SubElement(case, "failure", message=str(outcome["reason"]), type=kind)
        failure.text = "\n".join(f"{p.get('cause')}\nFix: {p.get('fix')}" for p in failing) or str(outcome["reason"])
    said = library_output(doc, check)
    if said:  # after the outcome: JUnit's schema puts system-out after skipped and failure
        ET.SubElement(case, "system-out").text = said
    return outcome["status"]


def _carried_health(host: dict[str, Any]) -> str:
    """``not in this run: GPU health as last checked, unhealthy, 2 findings (checked ...)`` for a host
    carried over (``skipped: ...`` for one left out on purpose)."""
    label = str(host.get("status") or "not in this run").lower()
    if health_status(host.get("health")) == NOT_CHECKED:
        return f"{label}: no GPU health report from an earlier run"
    return f"{label}: GPU health as last checked, {health_headline(host.get('health'))}"


def _junit_health_case(suite: ET.Element, name: str, host: dict[str, Any]) -> str:
    """Add the host's test case ``health`` (classname the host); returns its status.  gpu_health's
    findings fail it; it is skipped, never passed, when the host was not checked or could not be, and
    for a host carried over (its health is that of an earlier run)."""
    health = host.get("health")
    status = health_status(health)
    case = ET.SubElement(suite, "testcase", classname=name, name=HEALTH_CHECK)
    if host.get("carried_over"):
        ET.SubElement(case, "skipped", message=_carried_health(host))
        return NOT_RUN
    if status == HEALTHY:
        return PASS
    if status == UNHEALTHY:
        kind = ", ".join(sorted({str(item.get("check")) for item in _findings(health)})) or HEALTH_CHECK
        failure = ET.SubElement(case, "failure", message=health_headline(health), type=kind)
        failure.text = "\n".join(f"[{what}] {cause}\nFix: {fix}" for what, cause, fix in health_items(health))
        return FAIL
    message = health_headline(health) + "".join(f": {cause} Fix: {fix}" for _what, cause, fix in health_items(health))
    ET.SubElement(case, "skipped", message=message)
    return NOT_RUN


def format_junit(report: dict[str, Any]) -> str:
    """JUnit XML for CI dashboards: one test suite, one test case per row (host or host and stack)
    and check in the row's ``checks``: passed, failed or skipped (did not run); a row without a
    verification document has the failed case ``verification`` and its checks skipped (not run).
    Then each host's case ``health`` (:func:`_junit_health_case`)."""
    suite = ET.Element("testsuite", name="gpu-fleet", timestamp=report["generated_at"])
    counts = {PASS: 0, FAIL: 0, NOT_RUN: 0}
    for name, host in report["hosts"].items():
        docs = [{}] * len(host["rows"]) if host.get("carried_over") else host["results"]
        for row, doc in zip(host["rows"], docs):
            found = host_problems(doc, name)
            for check in row["checks"]:
                counts[_junit_case(suite, row, check, found, doc)] += 1
        counts[_junit_health_case(suite, name, host)] += 1
    suite.set("tests", str(sum(counts.values())))
    suite.set("failures", str(counts[FAIL]))
    suite.set("errors", "0")
    suite.set("skipped", str(counts[NOT_RUN]))
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
        description="Write <out-dir>/<inventory>/<UTC time>/fleet-report.{json,md,html,junit.xml} from per-host "
        "gpu_verify results, merged with the previous run's hosts that this run did not verify; point "
        "<out-dir>/<inventory>/latest at it, keep the last --keep runs; print the table.",
        epilog="Exit codes: 0 report written (whatever the hosts' results), 2 bad input or usage error.",
    )
    parser.add_argument("--input", required=True, help="JSON file {hostname: result}, or - for stdin")
    report_history.add_location_arguments(parser)
    parser.add_argument(
        "--inventory-hosts",
        help="JSON list of every host in the inventory: previous hosts not in it are dropped, not carried over",
    )
    parser.add_argument(
        "--not-verified",
        help='JSON object {host: {"status": "skipped", "reason": "..."}}: hosts this run left out on purpose',
    )
    parser.add_argument("--dry-run", action="store_true", help="write and delete nothing (--check): print only")
    parser.add_argument(
        "--run-id",
        help="label for this run, shown in the report; a later report with the same label replaces the earlier "
        "(a rolling reprovisioning's batches)",
    )
    return parser


def _missing_check(row: dict[str, Any], name: str) -> dict[str, Any]:
    """The outcome of a check that ``row`` lacks and another row of the run has: not run (null), for the reason
    its other checks give on a row without a verification document; ``verification`` passed on a row whose
    verification ran (it has a document); not run on a stack whose result holds nothing for that check (no section
    for it, such as ``default`` on a stack that is not the default, or no problem naming it)."""
    if row.get("not_run") == "all":
        reason = row["checks"].get(CHECKS[0], {}).get("reason")
        return _outcome(NOT_RUN, reason or "the host was not verified")
    if name == NO_DOCUMENT_CHECK:
        return _outcome(PASS, None)
    return _outcome(NOT_RUN, f"no {name} result for this stack (another row of this run has one)")


def alike_checks(report: dict[str, Any]) -> dict[str, Any]:
    """The report as fleet-report.json holds it: every row of a host of this run has the same checks, those any
    such row has, a check that a row lacks null (not run) with the reason (:func:`_missing_check`), so that a
    script reads the same keys for every host. The rows of a host carried over keep their one check ``carried``;
    the text, Markdown, HTML and JUnit reports list each row's own checks."""
    current = {name: host for name, host in report["hosts"].items() if not host.get("carried_over")}
    names = list(dict.fromkeys(check for host in current.values() for row in host["rows"] for check in row["checks"]))
    alike = {
        name: dict(
            host,
            rows=[
                dict(row, checks={check: row["checks"].get(check) or _missing_check(row, check) for check in names})
                for row in host["rows"]
            ],
        )
        for name, host in current.items()
    }
    return dict(report, hosts={name: alike.get(name, host) for name, host in report["hosts"].items()})


def render(report: dict[str, Any]) -> dict[str, str]:
    """The report's files: {file name: text}."""
    return {
        "fleet-report.json": json.dumps(alike_checks(report), indent=2, sort_keys=True, default=str) + "\n",
        "fleet-report.md": format_markdown(report),
        "fleet-report.html": format_html(report),
        "fleet-report.junit.xml": format_junit(report),
    }


def _inventory_hosts(value: str | None) -> list[str] | None:
    if value is None:
        return None
    hosts = json.loads(value)
    if not isinstance(hosts, list):
        raise BadInput(f"--inventory-hosts must be a JSON list of host names, got {type(hosts).__name__}")
    return [str(h) for h in hosts]


def run(args: argparse.Namespace, results: dict[str, Any], now: datetime.datetime) -> dict[str, Any]:
    """Build, merge and (unless --dry-run) write the report; returns what --emit json prints."""
    name = report_history.inventory_name(args.inventory_source, args.inventory_name)
    inventory_dir = Path(args.out_dir) / name
    previous, warning = report_history.load_previous(inventory_dir)
    left_out = report_history.not_verified(args.not_verified)
    current = build_report({h: v for h, v in results.items() if h not in left_out}, args.run_id, now)
    report = report_history.merge(previous, current, _inventory_hosts(args.inventory_hosts), left_out)
    # The hosts carried over keep the health they had when they were checked: count every host listed.
    report["summary"]["health"] = health_counts(report["hosts"])
    report.update(inventory=name, limit=args.limit or None, run_folder=None, supersedes=[])
    folder = None
    if not args.dry_run:
        folder = report_history.write_run(inventory_dir, now, report, render, args.keep, _write)
    return {
        "table": format_text(report, check_mode=args.dry_run) + (f"\nWarning: {warning}\n" if warning else ""),
        "summary": report["summary"],
        "inventory": name,
        "run_dir": str(folder) if folder else None,
        "latest": str(inventory_dir / report_history.LATEST) if folder else None,
        "written": folder is not None,
    }


def entry_point(name: str, make_parser: Callable[[], argparse.ArgumentParser], build: Callable[..., dict]) -> Callable:
    """The ``main`` of this script and of fleet_plan.py: parse, check --keep, read the input, call
    ``build(args, input, now)`` and print its table (or its JSON); ``main`` returns the exit code."""

    def main(
        argv: Sequence[str] | None = None,
        stdin: TextIO = sys.stdin,
        stdout: TextIO = sys.stdout,
        now: datetime.datetime | None = None,
    ) -> int:
        args = make_parser().parse_args(argv)
        if args.keep < 1:
            print(f"{name}: --keep is {args.keep}; keep at least 1 run (gpu_verify_report_keep).", file=sys.stderr)
            return EXIT_USAGE
        try:
            done = build(args, load_input(args.input, stdin), now or datetime.datetime.now(datetime.timezone.utc))  # noqa: UP017
        except (BadInput, ValueError) as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except OSError as exc:
            print(
                f"{name}: cannot write under {args.out_dir}: {exc}. "
                "Make the folder writable or set gpu_verify_report_dir to one that is.",
                file=sys.stderr,
            )
            return EXIT_USAGE
        stdout.write(json.dumps(done) + "\n" if args.emit == "json" else done["table"])
        return EXIT_OK

    return main


main = entry_point("fleet_report", build_parser, run)


if __name__ == "__main__":
    sys.exit(main())
