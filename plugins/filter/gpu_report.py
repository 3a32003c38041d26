"""Filters that turn gpu_verify.py runs into the fleet report's input.

``gpu_verify_result``: one ``ansible.builtin.command`` loop result of ``gpu_verify.py`` -> the JSON
document it printed, or a failed document naming why there is none (the script crashed, the venv
is missing, ...).

``gpu_verify_collect``: every host of the play -> ``{host: [document per stack]}``, with a document
saying why there is none for a host that failed or was unreachable before verification, so that
the report lists every host; each document carries the host's GPU health at the time of the run
(``health``, from gpu_health's ``gpu_health_report``).

``gpu_verify_argv``: one resolved stack and the role's settings -> the command line of
``gpu_verify.py`` for it, shared by the per-host and the multi-worker runs.
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_mig import cuda_devices

# gpu_verify.py's options taken as they are from the settings: (option, settings key).
VERIFY_OPTIONS = (
    ("--cpu-replicas", "cpu_replicas"),
    ("--timeout", "timeout"),
    ("--learning-rate", "learning_rate"),
    ("--nvidia-smi", "nvidia_smi"),
)


def _cuda_place(cuda: dict) -> list[str]:
    """Where gpu_verify.py finds the stack's CUDA: the runfile tree's ``--cuda-root``, or for a stack of NVIDIA's
    wheels (``source: wheels``, ``root: null``) ``--cuda-source wheels`` and one ``--library-dir`` per folder
    of the venv's wheels (``library_dirs``), where libcudart, libcublas and libcudnn must be mapped from."""
    if cuda.get("source") != "wheels":
        return ["--cuda-root", cuda["root"]]
    folders = cuda["library_dirs"]
    if not folders:
        raise KeyError("library_dirs")
    return ["--cuda-source", "wheels", *(arg for folder in folders for arg in ("--library-dir", folder))]


def _expected_versions(stack: dict) -> list[str]:
    """The versions gpu_verify.py checks against: the stack's CUDA, cuDNN and TensorFlow."""
    try:
        cuda, cudnn, tensorflow = stack["cuda_toolkit"], stack["cudnn"], stack["tensorflow"]
        return [
            "--expect-cuda", cuda["series"], *_cuda_place(cuda),
            "--expect-cudnn", cudnn["short"], "--expect-tensorflow", tensorflow["version"],
        ]  # fmt: skip
    except (KeyError, TypeError) as error:
        raise AnsibleFilterError(f"gpu_verify_argv: stack {stack.get('name')!r} is not resolved (no {error})") from None


def gpu_verify_argv(stack: dict, settings: dict) -> list[str]:
    """``gpu_verify.py``'s command line for one resolved stack.

    ``settings``: ``install_dir``, ``expected_gpu_count``, ``driver`` (the resolved driver or None),
    ``cpu_replicas``, ``timeout``, ``learning_rate``, ``nvidia_smi``, ``default_symlink``,
    ``kernel_dir``, ``mixed_precision``, ``fabricmanager`` (the host has NVSwitches), ``scaling``,
    ``scaling_threshold``, ``multiworker`` and ``mig_layout`` (gpu_mig's layout where gpu_mig is on, else none):
    with GPUs in MIG mode TensorFlow and the fit are held to the devices one CUDA process enumerates
    (``--expected-cuda-devices``), the GPU count stays the physical one.
    """
    argv = [f"{stack['venv']}/bin/python", f"{settings['install_dir']}/gpu_verify.py", "--stack", stack["name"]]
    argv += ["--expected-gpus", str(settings["expected_gpu_count"])]
    devices = cuda_devices(settings.get("mig_layout") or [], int(settings["expected_gpu_count"]))
    if devices != int(settings["expected_gpu_count"]):
        argv += ["--expected-cuda-devices", str(devices)]
    argv += ["--expect-driver", (settings.get("driver") or {}).get("version") or ""]
    argv += _expected_versions(stack)
    for option, key in VERIFY_OPTIONS:
        argv += [option, str(settings[key])]
    if stack.get("default"):
        argv += ["--default-symlink", settings["default_symlink"]]
    argv += ["--kernel-dir", settings["kernel_dir"]]
    if boolean(settings.get("mixed_precision"), strict=False):
        argv.append("--mixed-precision")
    if boolean(settings.get("fabricmanager"), strict=False):
        argv.append("--expect-fabricmanager")
    # The scaling check compares the GPUs of one host; a multi-worker fit spans hosts.
    if boolean(settings.get("scaling"), strict=False) and not boolean(settings.get("multiworker"), strict=False):
        argv += ["--scaling", "--scaling-threshold", str(settings["scaling_threshold"])]
    return argv


def _failed(cause: str, fix: str, **extra: Any) -> dict:
    return dict({"ok": False, "problems": [{"check": "run", "cause": cause, "fix": fix}]}, **extra)


def _cuda_of(stack: dict) -> dict:
    """``{"cuda": ...}``, gpu_verify.py's section saying where a stack's CUDA comes from (``source``: ``runfile``
    or ``wheels``, ``root``, ``library_dirs``), from the resolved stack a run was for: the report says it also
    for a stack whose run printed no document. ``{}`` for an item without ``cuda_toolkit``."""
    cuda = stack.get("cuda_toolkit")
    if not isinstance(cuda, dict):
        return {}
    if cuda.get("source") == "wheels":
        return {"cuda": {"source": "wheels", "root": None, "library_dirs": list(cuda.get("library_dirs") or [])}}
    return {"cuda": {"source": "runfile", "root": cuda.get("root"), "library_dirs": []}}


def _stack(run: dict) -> dict:
    """The stack a loop result ran for: its ``item``, or for an ``async_status`` result the
    ``item`` of the job it polled."""
    item = run.get("item") or {}
    if isinstance(item, dict) and "ansible_job_id" in item:
        item = item.get("item") or {}
    return item if isinstance(item, dict) else {}


def gpu_verify_stack_name(run: dict) -> str:
    """Name of the stack a gpu_verify.py loop result (command or async_status) ran for."""
    return str(_stack(run).get("name", "?"))


def gpu_verify_result(run: dict, install_dir: str = "/opt/gpu-verify") -> dict:
    """Parse one loop result of gpu_verify.py: a command result or, for the multi-worker run, an
    ``async_status`` result (both carry ``stdout``, ``stderr``, ``rc``; the stack is the ``item``).

    ``install_dir`` is where the scripts are on the host (for the hint on running them by hand).
    Returns the script's JSON document (a dict with ``ok`` and ``problems``); never raises.  A failed
    document made here carries the stack's ``cuda`` section as the script writes it (:func:`_cuda_of`).
    """
    stack = _stack(run)
    if run.get("skipped"):
        venv = stack.get("venv", "?")
        return _failed(
            f"The venv {venv} of stack {stack.get('name')} does not exist on the host.",
            "Run playbooks/tensorflow.yml (or site.yml) first; then verify by hand with "
            f"{venv}/bin/python {install_dir}/gpu_verify.py --expected-gpus N --format table.",
            stack=stack.get("name"),
            **_cuda_of(stack),
        )
    if "ansible_job_id" in run and not run.get("finished", 1):
        return _failed(
            "gpu_verify.py was still running when Ansible stopped waiting for it "
            "(gpu_verify_timeout + 120 s); the worker hung outside the fit's own time limit.",
            "Check the host's load and `ps -ef | grep gpu_verify` there, kill the leftover process, rerun.",
            stack=stack.get("name"),
            **_cuda_of(stack),
        )
    stdout = (run.get("stdout") or "").strip()
    if stdout:
        try:
            doc = json.loads(stdout)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "ok" in doc:
            return doc
    stderr_tail = " ".join((run.get("stderr") or run.get("msg") or "").strip().splitlines()[-3:])
    return _failed(
        f"gpu_verify.py exited with rc {run.get('rc')} and printed no report: {stderr_tail}",
        f"Run it by hand on the host: {stack.get('venv', '<venv>')}/bin/python {install_dir}/gpu_verify.py "
        "--expected-gpus N --format table.",
        rc=run.get("rc"),
        **_cuda_of(stack),
    )


def gpu_verify_outcome(results: Any, switch: Any = None) -> Any:
    """``gpu_verify_results`` with the documents of the default switch (``gpu_env_default_switch``'s
    ``results``: the declared default's check where gpu_verify ran none, its failed check through the
    system library path) over those of their stack, each with the host's ``disk_used_bytes``.
    ``results`` as given when the switch ran no check of its own."""
    own = (switch or {}).get("results") if isinstance(switch, dict) else None
    if not own:
        return results
    merged = dict(results or {})
    disk = next((doc["disk_used_bytes"] for doc in merged.values() if "disk_used_bytes" in (doc or {})), None)
    for stack, doc in own.items():
        merged[stack] = dict(doc, disk_used_bytes=disk) if disk is not None else dict(doc)
    return merged


def gpu_verify_held_back(held: list[dict]) -> dict[str, dict]:
    """gpu_preflight's ``gpu_preflight_held_back`` (``[{name, cause}]``, stacks left out of the run
    because an artifact could not be used) -> ``{stack: failed document}`` for the host's results."""
    return {
        item["name"]: {
            "ok": False,
            "stack": item["name"],
            "problems": [
                {
                    "check": "artifacts",
                    "cause": f"Held back: nothing of stack {item['name']} was installed or changed in this run. "
                    + str(item.get("cause") or ""),
                    "fix": "Fix the artifact as said and run again; the host's other stacks went on and were verified.",
                }
            ],
        }
        for item in held or []
    }


def gpu_du_bytes(lines: list[str]) -> dict[str, int]:
    """``du --summarize --bytes PATH...`` output lines -> ``{path: bytes}`` (paths du could not
    read are missing from its output and so from the result)."""
    used = {}
    for line in lines:
        size, _tab, path = line.partition("\t")
        if size.isdigit() and path:
            used[path] = int(size)
    return used


# The connection Ansible uses when the inventory names none: ansible.builtin.ssh ("this connection
# plugin ... (which is the default)",
# https://docs.ansible.com/ansible/latest/collections/ansible/builtin/ssh_connection.html).
DEFAULT_CONNECTION = "ssh"


# gpu_health.py's exit status -> the report's health status (0 healthy, 1 unhealthy, 2 could not check).
HEALTH_STATUS = {0: "healthy", 1: "unhealthy", 2: "could not check"}
FINDING_KEYS = ("check", "bus_id", "cause", "fix")


def _health_status(report: dict) -> str:
    """``healthy``, ``unhealthy`` or ``could not check``: by the exit status, else by ``up`` and the findings."""
    code = report.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool) and code in HEALTH_STATUS:
        return HEALTH_STATUS[code]
    if not report.get("up"):
        return HEALTH_STATUS[2]
    return HEALTH_STATUS[1] if report.get("findings") or report.get("healthy") is False else HEALTH_STATUS[0]


def compact_health(report: Any) -> dict | None:
    """gpu_health's published ``gpu_health_report`` (gpu_health.py's JSON report) -> the report's
    compact ``health``: ``{status, checked_at, findings: [{check, bus_id, cause, fix}], error: {cause, fix}
    or None, dcgm: {level, tests: [{test, gpu, result}]} or None, moved: [text], notes: [{cause, fix}]}``, without the GPU rows; None when the
    host has none (the role did not run, or ran under --check)."""
    if not isinstance(report, dict):
        return None
    error = report.get("error")
    return {
        "status": _health_status(report),
        "checked_at": report.get("checked_at"),
        "findings": [
            {key: item.get(key) for key in FINDING_KEYS}
            for item in report.get("findings") or []
            if isinstance(item, dict)
        ],
        "error": {"cause": error.get("cause"), "fix": error.get("fix")} if isinstance(error, dict) else None,
        "dcgm": _compact_dcgm(report.get("dcgm")),
        # What the run moved on purpose (a driver re-pin, a stack added or removed): judged against the run's pins.
        "moved": [str(item.get("text")) for item in report.get("moved") or [] if isinstance(item, dict)],
        # Said, never a finding: metrics that no node_exporter on the host serves.
        "notes": [
            {"cause": item.get("cause"), "fix": item.get("fix")}
            for item in report.get("notes") or []
            if isinstance(item, dict)
        ],
    }


def _compact_dcgm(dcgm: Any) -> dict | None:
    """The DCGM diagnostic's result per test (``{level, tests: [{test, gpu, result}]}``), None when it did not run."""
    if not isinstance(dcgm, dict):
        return None
    tests = [item for item in dcgm.get("tests") or [] if isinstance(item, dict)]
    return {
        "level": dcgm.get("level"),
        "tests": [{key: item.get(key) for key in ("test", "gpu", "result")} for item in tests],
    }


def _no_results(host: str, facts: Any, alive_hosts: list[str]) -> dict:
    """The document of a host without ``gpu_verify_results``.

    A host no longer in the play (``ansible_play_hosts``) was unreachable or failed a task before
    verification: ``{"ok": false, "unreachable", "error", "failed", "failed_check", "connection"}``,
    ``error`` being the host's ``gpu_verify_unreachable_reason`` (Ansible's unreachable message, kept by
    the callback plugin gpu_fleet.tf_hosts.host_failures) or None, ``failed`` its
    ``gpu_verify_failed_reason`` (the failed task and its message, same callback) or None,
    ``failed_check`` its ``gpu_verify_failed_check`` (``preflight``, or the failed task's role) or None,
    ``connection`` its ``ansible_connection``; fleet_report.py words the cause and the fix for that
    connection.  ``unreachable`` is true only for a host whose last message was the connection's, or
    when the run kept neither message (the callback not enabled): a host stopped by a failed task, a
    preflight check among them, is failed, never unreachable.  A host still in the play did not run
    the verification (e.g. under --check before
    the scripts were ever installed).  Either carries ``health`` (:func:`compact_health`): a host
    that gpu_health failed (``gpu_health_fail_on_findings``) left the play with its report.
    """
    health = compact_health(facts.get("gpu_health_report"))
    if host not in alive_hosts:
        error = facts.get("gpu_verify_unreachable_reason") or None
        failed = facts.get("gpu_verify_failed_reason") or None
        return {
            "ok": False,
            "unreachable": bool(error) or not failed,
            "error": error,
            "failed": failed,
            "failed_check": (facts.get("gpu_verify_failed_check") or None) if failed else None,
            "connection": facts.get("ansible_connection") or DEFAULT_CONNECTION,
            "health": health,
        }
    return _failed(
        "The verification did not run on this host in this run (under --check it needs the scripts "
        "installed by an earlier run without --check).",
        "See this host's gpu_verify tasks in the run's output above; run playbooks/verify.yml without --check once.",
        unreachable=False,
        health=health,
    )


AFTER_VERIFICATION = "after_verification"


def _passed(docs: list[Any]) -> bool:
    """Whether every stack's document says its verification passed (``ok`` and no problems)."""
    return bool(docs) and all(
        isinstance(doc, dict) and doc.get("ok") is True and not doc.get("problems") for doc in docs
    )


def failed_after_verification(docs: list[Any], host: str, facts: Any, alive_hosts: list[str]) -> list[Any]:
    """The documents of a host that left the play after its verification passed: a later step (the record of the
    health baseline, the default switch, giving the host back to the scheduler) failed it or lost it. Each
    document then fails with the check :data:`AFTER_VERIFICATION`, whose cause names that step, so that the
    report says FAIL where the run's exit code does. Any other host's documents as they are (a host whose checks
    failed left the play for them: its documents say so)."""
    if host in alive_hosts or not _passed(docs):
        return docs
    failed, lost = facts.get("gpu_verify_failed_reason"), facts.get("gpu_verify_unreachable_reason")
    step = failed or (f"a connection lost: {lost}" if lost else "a later step (see the run's output)")
    problem = {
        "check": AFTER_VERIFICATION,
        "cause": f"The verification passed, then the run failed this host at {step}",
        "fix": "Fix what that step's message names (the run's output has the task in full), then run again: the "
        "host counts as failed until a run passes every step.",
    }
    return [dict(doc, ok=False, problems=[problem]) for doc in docs]


def gpu_verify_collect(all_hosts: list[str], hostvars: Any, alive_hosts: list[str]) -> dict:
    """Gather ``gpu_verify_results`` of every host, with the preflight checks it overrode.

    Args:
        all_hosts: ``ansible_play_hosts_all`` (every host the play started with).
        hostvars: Ansible's ``hostvars``.
        alive_hosts: ``ansible_play_hosts`` (hosts that have not failed).

    Returns:
        ``{host: [document per stack]}``, the input of fleet_report.py; each document carries
        ``preflight_overridden`` (gpu_preflight problems turned off by an override),
        ``driver_reboot_required`` and ``driver_loaded_version`` (nvidia_driver's published facts) and
        ``default_switch`` (gpu_env's ``gpu_env_default_switch``, ``{from, to, switched, waits}``, when a new
        default stack waited; its own checks replace those of their stack, :func:`gpu_verify_outcome`) and
        ``health`` (gpu_health's ``gpu_health_report`` made compact, :func:`compact_health`; None without
        one).  A host without results maps to one document instead of a list (:func:`_no_results`); a host
        that a later step failed after its verification passed has its documents failed with that step
        (:func:`failed_after_verification`).
    """
    report: dict[str, Any] = {}
    for host in all_hosts:
        facts = hostvars[host]
        switch = facts.get("gpu_env_default_switch") or None
        results = gpu_verify_outcome(facts.get("gpu_verify_results"), switch)
        if not results:
            report[host] = _no_results(host, facts, alive_hosts)
            continue
        extra = {
            "preflight_overridden": facts.get("gpu_preflight_overridden") or [],
            # Published by nvidia_driver: the loaded kernel module is not the installed driver.
            "driver_reboot_required": bool(facts.get("nvidia_driver_reboot_required")),
            "driver_loaded_version": facts.get("nvidia_driver_loaded_version") or None,
            # Published by gpu_env (its entry point switch): a newly declared default switched to, or not.
            "default_switch": switch,
            # Published by gpu_health, which runs first: the host's GPU health at the time of the run.
            "health": compact_health(facts.get("gpu_health_report")),
        }
        docs = failed_after_verification(list(results.values()), host, facts, alive_hosts)
        report[host] = [dict(doc, **extra) for doc in docs]
    return report


class FilterModule:
    """gpu_verify filters."""

    def filters(self) -> dict:
        return {
            "gpu_verify_result": gpu_verify_result,
            "gpu_verify_collect": gpu_verify_collect,
            "gpu_verify_stack_name": gpu_verify_stack_name,
            "gpu_verify_held_back": gpu_verify_held_back,
            "gpu_verify_outcome": gpu_verify_outcome,
            "gpu_du_bytes": gpu_du_bytes,
            "gpu_verify_argv": gpu_verify_argv,
        }
