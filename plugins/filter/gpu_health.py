"""Filters of the gpu_health role: what it says about a host's health report, the verification's results
as Prometheus metrics, and the baseline it records from a passing verification.

``gpu_health_summary``: a health report (gpu_health.py ``--format json``) -> one line for the run's output.
``gpu_health_verification_metrics``: ``gpu_verify_results`` -> the textfile of the verification's metrics,
named and described in files/monitoring/verification-metrics.yml.
``gpu_health_baseline_args``: ``gpu_verify_results`` and the resolved stacks -> the options of
``gpu_health.py --record-baseline``, or none when a stack did not pass.
``gpu_health_outcome``: that command's output -> its outcome, with ``changed`` and ``error``.
``gpu_health_timespan_seconds``: a systemd time span (``5min``, ``1h 30min``) -> seconds, or none.

Each is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_metrics import Family, render

FIX_COMMAND = "Run it by hand on the host (gpu-health --record-baseline --help) and rerun playbooks/verify.yml."
METRICS_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "files", "monitoring", "verification-metrics.yml")


def gpu_health_summary(report: dict[str, Any], host: str) -> str:
    """``{{ gpu_health_report | gpu_fleet.tf_hosts.gpu_health_summary(inventory_hostname) }}``."""
    if not report.get("up"):
        error = report.get("error") or {}
        return f"GPU health of {host} could not be checked: {error.get('cause')} {error.get('fix')}".strip()
    findings = report.get("findings") or []
    if not findings:
        return f"GPU health of {host}: healthy."
    parts = [
        f"[{item.get('check')}{' ' + item['bus_id'] if item.get('bus_id') else ''}] {item.get('cause')} "
        f"Fix: {item.get('fix')}"
        for item in findings
    ]
    return f"GPU health of {host}: {len(findings)} finding(s): " + " | ".join(parts)


def gpu_health_outcome(stdout: str, stderr: str = "") -> dict[str, Any]:
    """``{{ result.stdout | gpu_fleet.tf_hosts.gpu_health_outcome(result.stderr) }}``: the JSON outcome of
    ``gpu_health.py --record-baseline --format json`` with ``changed`` and ``error`` (None, or ``{cause, fix}``);
    output that is no outcome (the command itself broke) is an error naming its stderr."""
    try:
        outcome = json.loads(stdout)
    except ValueError:
        outcome = None
    if not isinstance(outcome, dict) or "recorded" not in outcome:
        cause = f"the command gave no outcome ({(stderr or stdout or 'no output').strip()[-300:]})."
        return {"recorded": False, "changed": False, "error": {"cause": cause, "fix": FIX_COMMAND}}
    return {**outcome, "changed": bool(outcome.get("changed")), "error": outcome.get("error")}


# systemd.time(5), "Parsing Time Spans": the units and their length in seconds.
TIMESPAN_UNITS = {
    "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hour": 3600.0,
    "hours": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0, "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}  # fmt: skip
TIMESPAN_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)")


def gpu_health_timespan_seconds(text: Any) -> float | None:
    """``{{ '1h 30min' | gpu_fleet.tf_hosts.gpu_health_timespan_seconds }}`` -> 5400.0: a systemd time span
    in seconds (a number without a unit is seconds), None when it is not one."""
    rest, total = str(text).strip(), 0.0
    if not rest:
        return None
    while rest:
        match = TIMESPAN_PART.match(rest)
        if not match or match.group(2) not in TIMESPAN_UNITS:
            return None
        total += float(match.group(1)) * TIMESPAN_UNITS[match.group(2)]
        rest = rest[match.end() :].lstrip()
    return total


def _metric_specs() -> dict[str, dict[str, Any]]:
    with open(METRICS_FILE, encoding="utf-8") as handle:
        return {spec["name"]: spec for spec in yaml.safe_load(handle)["metrics"]}


def _documents(results: Any) -> list[dict[str, Any]]:
    return [doc for doc in (results or {}).values() if isinstance(doc, dict)] if isinstance(results, dict) else []


def _checks(doc: dict[str, Any]) -> dict[str, bool]:
    """Each section of a stack's document that says ``ok`` (the libraries one by one), then each check a
    problem names as failed."""
    checks = {}
    for key, section in doc.items():
        if key == "libraries" and isinstance(section, dict):
            checks.update(
                {lib: part["ok"] for lib, part in section.items() if isinstance((part or {}).get("ok"), bool)}
            )
        elif isinstance(section, dict) and isinstance(section.get("ok"), bool):
            checks[key] = section["ok"]
    for problem in doc.get("problems") or []:
        checks[str(problem.get("check") or "verification")] = False
    return checks


def _samples(docs: list[dict[str, Any]], now: float) -> dict[str, list[tuple[dict[str, Any], float]]]:
    gpus = [doc.get("gpus") or {} for doc in docs]
    return {
        "gpu_fleet_verification_last_run_timestamp_seconds": [({}, now)],
        "gpu_fleet_verification_passed": [({}, int(bool(docs) and all(doc.get("ok") is True for doc in docs)))],
        "gpu_fleet_verification_check_passed": [
            ({"stack": doc.get("stack"), "check": check}, int(ok)) for doc in docs for check, ok in _checks(doc).items()
        ],
        "gpu_fleet_verification_fit_samples_per_second": [
            ({"stack": doc.get("stack")}, doc["fit"]["steady_samples_per_second"])
            for doc in docs
            if isinstance((doc.get("fit") or {}).get("steady_samples_per_second"), (int, float))
        ],
        "gpu_fleet_verification_gpus_expected": [
            ({}, g["expected"]) for g in gpus[:1] if isinstance(g.get("expected"), int)
        ],
        "gpu_fleet_verification_gpus_seen": [({}, g["seen"]) for g in gpus[:1] if isinstance(g.get("seen"), int)],
        "gpu_fleet_verification_info": [({**_versions(doc), "stack": doc.get("stack")}, 1) for doc in docs],
    }


def _versions(doc: dict[str, Any]) -> dict[str, str]:
    expected = doc.get("expected") or {}
    return {
        "tensorflow_version": str((doc.get("tensorflow") or {}).get("version") or expected.get("tensorflow") or ""),
        "cuda_version": str(expected.get("cuda") or ""),
        "cudnn_version": str(expected.get("cudnn") or ""),
        "driver_version": str(doc.get("driver_version") or expected.get("driver") or ""),
    }


def gpu_health_verification_metrics(results: Any, now: float | None = None) -> str:
    """``{{ gpu_verify_results | gpu_fleet.tf_hosts.gpu_health_verification_metrics }}``: a missing or empty
    result is a verification that did not pass (``gpu_fleet_verification_passed 0``)."""
    samples = _samples(_documents(results), time.time() if now is None else float(now))
    families: list[Family] = [
        (
            name,
            spec["type"],
            spec["help"],
            [({key: labels[key] for key in spec["labels"]}, value) for labels, value in samples.get(name, [])],
        )
        for name, spec in _metric_specs().items()
    ]
    return render(families)


def gpu_health_baseline_args(results: Any, stacks: list[dict[str, Any]]) -> list[str]:
    """``{{ gpu_verify_results | gpu_fleet.tf_hosts.gpu_health_baseline_args(gpu_preflight_resolved_stacks) }}``:
    ``--expected-gpus``, ``--driver-version``, ``--fabric-manager-expected`` and one ``--stack NAME=VENV,LOCK``
    per verified stack; ``[]`` when there is no result or a stack did not pass (no baseline from that)."""
    docs = _documents(results)
    if not docs or not all(doc.get("ok") is True for doc in docs):
        return []
    first = docs[0]
    args = [
        "--expected-gpus",
        str((first.get("gpus") or {}).get("expected") or (first.get("expected") or {}).get("gpus")),
    ]
    driver = (first.get("expected") or {}).get("driver") or first.get("driver_version")
    args += ["--driver-version", str(driver)] if driver else []
    args += (
        ["--fabric-manager-expected"] if any((doc.get("fabricmanager") or {}).get("required") for doc in docs) else []
    )
    venvs = {stack.get("name"): stack.get("venv") for stack in stacks or []}
    for doc in docs:
        lock = (doc.get("lock") or {}).get("path")
        if venvs.get(doc.get("stack")) and lock:
            args += ["--stack", f"{doc['stack']}={venvs[doc['stack']]},{lock}"]
    return args


class FilterModule:
    """gpu_health filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_health_summary": gpu_health_summary,
            "gpu_health_verification_metrics": gpu_health_verification_metrics,
            "gpu_health_baseline_args": gpu_health_baseline_args,
            "gpu_health_outcome": gpu_health_outcome,
            "gpu_health_timespan_seconds": gpu_health_timespan_seconds,
        }
