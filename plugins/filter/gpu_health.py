"""Filters of the gpu_health role: what it says about a host's health report, the verification's results
as Prometheus metrics, and the baseline it records from a passing verification.

``gpu_health_summary``: a health report (gpu_health.py ``--format json``) -> one line for the run's output.
``gpu_health_verification_metrics``: ``gpu_verify_results`` -> the textfile of the verification's metrics,
named and described in files/monitoring/verification-metrics.yml.
``gpu_health_baseline_args``: ``gpu_verify_results`` and the resolved stacks -> the options of
``gpu_health.py --record-baseline``, or none when a stack did not pass.
``gpu_health_outcome``: that command's output -> its outcome, with ``changed`` and ``error``.
``gpu_health_timespan_seconds``: a systemd time span (``5min``, ``1h 30min``) -> seconds, or none.
``gpu_health_option_problems``: the role's options -> what is wrong with them, each with its fix.
``gpu_health_check``: the check's command result -> why it gave no report, or what is unhealthy.
``gpu_health_record_verdict``: the baseline's recording and the health report -> what stops the host, and
what is said about a baseline that stays the last good one.
``gpu_health_check_args``: whether the timer runs the check, and the run's stack model -> the options of the
role's own run of the check: what the run pins (``--intended``), and ``--record`` where no timer does.
The texts are in the catalog ``MESSAGES``.

Each is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_metrics import Family, render
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message, option_problems

MOVED = "Moved on purpose by this run, judged against its pins (the baseline follows once the verification passes)"
FIX_COMMAND = "Run it by hand on the host (gpu-health --record-baseline --help) and rerun playbooks/verify.yml."
METRICS_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "files", "monitoring", "verification-metrics.yml")


def _moved(report: dict[str, Any]) -> str:
    """`` Moved on purpose by this run: driver 520.61.05 -> 555.42.06.`` (gpu_health.py's ``moved``), or ''."""
    texts = [str(item.get("text")) for item in report.get("moved") or [] if isinstance(item, dict)]
    return f" {MOVED}: {'; '.join(texts)}." if texts else ""


def _notes(report: dict[str, Any]) -> str:
    """`` Note: <cause> Fix: <fix>`` for each of the report's notes (metrics no node_exporter serves), or ''."""
    notes = [item for item in report.get("notes") or [] if isinstance(item, dict)]
    return "".join(f" Note: {item.get('cause')} Fix: {item.get('fix')}" for item in notes)


def gpu_health_summary(report: dict[str, Any], host: str) -> str:
    """``{{ gpu_health_report | gpu_fleet.tf_hosts.gpu_health_summary(inventory_hostname) }}``."""
    if not report.get("up"):
        error = report.get("error") or {}
        said = f"GPU health of {host} could not be checked: {error.get('cause')} {error.get('fix')}".strip()
        return said + _notes(report)
    findings = report.get("findings") or []
    if not findings:
        return f"GPU health of {host}: healthy.{_moved(report)}{_notes(report)}"
    parts = [
        f"[{item.get('check')}{' ' + item['bus_id'] if item.get('bus_id') else ''}] {item.get('cause')} "
        f"Fix: {item.get('fix')}"
        for item in findings
    ]
    return f"GPU health of {host}: {len(findings)} finding(s): " + " | ".join(parts) + _moved(report) + _notes(report)


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
    ``--expected-gpus``, ``--driver-version``, ``--fabric-manager-expected``, ``--mig-devices`` (the MIG devices
    gpu_verify counted, filter gpu_verify_mig) and one ``--stack NAME=VENV,LOCK`` per verified stack; ``[]`` when
    there is no result or a stack did not pass (no baseline from that)."""
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
    args += ["--mig-devices", str(first["mig_devices"])] if first.get("mig_devices") is not None else []
    venvs = {stack.get("name"): stack.get("venv") for stack in stacks or []}
    for doc in docs:
        lock = (doc.get("lock") or {}).get("path")
        if venvs.get(doc.get("stack")) and lock:
            args += ["--stack", f"{doc['stack']}={venvs[doc['stack']]},{lock}"]
    return args


# What the role says, by id: cause and fix, str.format templates.
MESSAGES = {
    "option": Message("{name} is {value}; it must be {rule}.", "Fix it in the inventory or on the -e command line."),
    "path": Message(
        "{name} is {value}; it must be an absolute path on the host ({what}).",
        "Fix it in the inventory or on the -e command line.",
    ),
    "no_report": Message(
        "{command} on {host} ended with exit status {rc} and no report: {error}.",
        "Run `{command} --format json` there and read its error; rerun playbooks/verify.yml to reinstall it.",
    ),
    "baseline": Message("The health baseline of {host} could not be recorded: {cause}", "{fix}"),
    "unhealthy": Message("{summary}", "(It fails because gpu_health_fail_on_findings is true.)"),
}
# Not a stop: the baseline stays the last good one.
BASELINE_KEPT = (
    "The health baseline of {host} was not renewed: though verified, the host is not healthy against what it would "
    "record - {causes}"
)
WHOLE_SECONDS = re.compile(r"[0-9]+$")
# (option, rule, whether the value keeps to it), in the order they are named.
OPTION_RULES: list[tuple[str, str, Any]] = [
    # A check every few seconds would keep nvidia-smi (and NVML) busy for nothing.
    (
        "gpu_health_interval",
        "a systemd time span of at least a minute, such as 5min, 1h or 1h 30min (systemd.time(5))",
        lambda v: (gpu_health_timespan_seconds(v) or 0) >= 60,
    ),
    (
        "gpu_health_timeout",
        "a whole number of seconds above 0 and below 3600 (default 20)",
        lambda v: bool(WHOLE_SECONDS.match(str(v))) and 0 < int(str(v)) < 3600,
    ),
    (
        "gpu_health_dcgm_diag_level",
        "0 (no DCGM diagnostic) or a dcgmi diag level from 1 to 4",
        lambda v: str(v) in ("0", "1", "2", "3", "4"),
    ),
    (
        "gpu_health_dcgm_timeout",
        "a whole number of seconds above 0 and below 86400 (default 900)",
        lambda v: bool(WHOLE_SECONDS.match(str(v))) and 0 < int(str(v)) < 86400,
    ),
    (
        "gpu_health_fail_on_findings",
        "true or false",
        lambda v: str(v).lower() in ("true", "false", "yes", "no", "1", "0"),
    ),
    (
        "gpu_health_kernel_log",
        "empty (journalctl, else dmesg) or the absolute path of a kernel log file",
        lambda v: len(str(v)) == 0 or os.path.isabs(str(v)),
    ),
]
PATHS = {
    "gpu_health_textfile_dir": "node_exporter's --collector.textfile.directory",
    "gpu_health_state_dir": "the folder of the baseline, default /var/lib/gpu-health",
    "gpu_health_install_dir": "the check's folder, default /opt/gpu-health",
    "gpu_health_command": "the command, default /usr/local/sbin/gpu-health",
    "gpu_health_python": "the Python 3 that runs the check, default /usr/bin/python3",
}
# The options the rules read, in their order (plugins/action/gpu_option_checks.py checks them in preflight).
OPTIONS = tuple(dict.fromkeys([rule[0] for rule in OPTION_RULES] + list(PATHS)))


def gpu_health_option_problems(options: dict[str, Any]) -> list[str]:
    """``{{ {'gpu_health_timeout': gpu_health_timeout, ...} | gpu_fleet.tf_hosts.gpu_health_option_problems }}``:
    one message per option that breaks its rule (the paths must be absolute on the host); ``[]`` when none."""
    found = option_problems(options, OPTION_RULES, MESSAGES["option"])
    found += [
        MESSAGES["path"].text(name=name, value=options.get(name), what=what)
        for name, what in PATHS.items()
        if not os.path.isabs(str(options.get(name)))
    ]
    return found


def gpu_health_options_checked(value: Any, options: dict[str, Any]) -> Any:
    """``{{ files | gpu_fleet.tf_hosts.gpu_health_options_checked(options) }}``: ``value`` unchanged when every option
    keeps its rule, else the task that reads it fails with :func:`gpu_health_option_problems`' messages (tasks/install.yml:
    the options are checked before anything is written, without a task of their own)."""
    problems = gpu_health_option_problems(options)
    if problems:
        raise AnsibleFilterError(" ".join(problems))
    return value


def _truncate(text: str, length: int = 400) -> str:
    """Jinja's ``truncate(length)``: whole words and ``...`` past the length (and its leeway of 5)."""
    if len(text) <= length + 5:
        return text
    return text[: length - 3].rsplit(" ", 1)[0] + "..."


def gpu_health_check(run: dict[str, Any], command: str, host: str) -> dict[str, Any]:
    """``{{ result | gpu_fleet.tf_hosts.gpu_health_check(gpu_health_command, inventory_hostname) }}``: the health
    check's command result -> ``problem`` (why it gave no report: exit status 0, 1 and 2 come with the report,
    anything else is the command itself broken; else None) and ``summary`` (the line naming what is unhealthy;
    None for a healthy host)."""
    stdout, rc = str(run.get("stdout") or ""), run.get("rc", -1)
    if rc not in (0, 1, 2) or not re.match(r"\s*\{", stdout):
        error = _truncate(str(run.get("stderr") or run.get("msg") or "").strip())
        return {"problem": MESSAGES["no_report"].text(command=command, host=host, rc=rc, error=error), "summary": None}
    try:
        report = json.loads(stdout)
    except ValueError:
        report = None
    if not isinstance(report, dict):
        return {"problem": MESSAGES["no_report"].text(command=command, host=host, rc=rc, error=""), "summary": None}
    said = report.get("exit_code") != 0 or bool(report.get("moved")) or bool(report.get("notes"))
    return {"problem": None, "summary": gpu_health_summary(report, host) if said else None}


def _names(stacks: Any) -> list[str]:
    return [str(stack["name"]) for stack in stacks or [] if isinstance(stack, dict) and stack.get("name")]


def gpu_health_check_args(timer_runs: Any, driver: Any, stacks: Any, absent: Any) -> list[str]:
    """``{{ timer_runs | gpu_fleet.tf_hosts.gpu_health_check_args(gpu_preflight_resolved_driver,
    gpu_preflight_resolved_stacks, gpu_preflight_resolved_absent) }}``: ``--intended`` with the driver this run
    pins, its stacks and those it removes (a change the run made on purpose is no drift), and ``--record`` where
    no timer runs the check (the run's check then moves the kernel log window; else the timer's runs alone do, and
    the run's check only looks, so the next timer run still reports each Xid)."""
    version = driver.get("version") if isinstance(driver, dict) else None
    intended = {"driver_version": str(version) if version else None, "stacks": _names(stacks)}
    intended["removed_stacks"] = _names(absent)
    return ["--intended", json.dumps(intended, sort_keys=True)] + (
        [] if boolean(timer_runs, strict=False) else ["--record"]
    )


def gpu_health_record_verdict(recorded: Any, report: Any, fail_on_findings: Any, host: str) -> dict[str, Any]:
    """``{{ recorded | gpu_fleet.tf_hosts.gpu_health_record_verdict(gpu_health_report | default(none),
    gpu_health_fail_on_findings, inventory_hostname) }}``: after the verification, ``problem`` (what fails the
    host: the baseline could not be written, or with ``fail_on_findings`` an unhealthy host; else None) and
    ``note`` (why the baseline stays the last good one; else None). ``recorded``: the result of
    ``gpu-health --record-baseline --format json``, skipped where no baseline was recorded."""
    note = problem = None
    if isinstance(recorded, dict) and not recorded.get("skipped"):
        outcome = gpu_health_outcome(str(recorded.get("stdout") or ""), str(recorded.get("stderr") or ""))
        if outcome["error"] is not None:
            error = outcome["error"]
            return {"problem": MESSAGES["baseline"].text(host=host, **error), "note": None}
        if not outcome.get("recorded"):
            causes = " ".join(str(item.get("cause")) for item in outcome.get("findings") or [])
            note = BASELINE_KEPT.format(host=host, causes=causes)
    if boolean(fail_on_findings, strict=False) and isinstance(report, dict) and report.get("exit_code") != 0:
        problem = MESSAGES["unhealthy"].text(summary=gpu_health_summary(report, host))
        # The host fails: the note goes with the failure.
        problem, note = (f"{note} {problem}", None) if note else (problem, None)
    return {"problem": problem, "note": note}


class FilterModule:
    """gpu_health filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_health_summary": gpu_health_summary,
            "gpu_health_verification_metrics": gpu_health_verification_metrics,
            "gpu_health_baseline_args": gpu_health_baseline_args,
            "gpu_health_outcome": gpu_health_outcome,
            "gpu_health_timespan_seconds": gpu_health_timespan_seconds,
            "gpu_health_option_problems": gpu_health_option_problems,
            "gpu_health_options_checked": gpu_health_options_checked,
            "gpu_health_check": gpu_health_check,
            "gpu_health_record_verdict": gpu_health_record_verdict,
            "gpu_health_check_args": gpu_health_check_args,
        }
