"""Filters of the gpu_verify role's wiring: the command lines of the fleet report and the plan, a host's
results as the report reads them, and the failure a stack that did not verify gives its host.

``gpu_verify_option_problems``: the verification's options -> what is wrong with them, each with its fix.
``gpu_verify_location_args``: where the report and the plan go and what the run covered -> options of
fleet_report.py and fleet_plan.py.
``gpu_verify_report_args``: the report's inputs -> fleet_report.py's options.
``gpu_verify_results``: the host's verification runs, its disk use and the stacks held back ->
``gpu_verify_results`` (one document per stack).
``gpu_verify_failure``: one stack's failed document -> the message its host fails with (catalog ``MESSAGES``).

The parsing of one run (``gpu_verify_result``) and the collection of every host for the report
(``gpu_verify_collect``) are in gpu_report.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_report import (
    gpu_du_bytes,
    gpu_verify_held_back,
    gpu_verify_result,
    gpu_verify_stack_name,
)
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message, option_problems

# What the role says, by id: str.format templates.
MESSAGES = {
    "failed": "{stays}Stack {stack} on {host} failed verification: {problems}",
    # A declared default that did not verify stays declared; the host keeps its previous default.
    "stays": "The default stays {old}; {new} becomes the default once it verifies. ",
    "switched": "Default stack switched: {old} -> {new}",
    # playbooks/verify.yml only reads: a pending default is named, and switched to by site.yml.
    "waits": (
        "The default stays {old}: the declared default {new} waits for a run of site.yml (or"
        " playbooks/reprovision.yml), which switches to it once it verifies; playbooks/verify.yml only reads."
    ),
    "not_switched": (
        "The default stays {old}: the declared default {new} did not pass verification on this host (see its"
        " problems below); it becomes the default once it does."
    ),
}
NO_RESULT = [{"cause": "no result", "fix": ""}]
OPTION = Message("{name} is {value}; it must be {rule}.", "Fix it in the inventory or on the -e command line.")


def _number(value: Any) -> float:
    """A number as Jinja's ``float`` filter reads it: 0.0 for what is none."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _whole(value: Any, least: int = 1) -> bool:
    return bool(re.match(r"^[0-9]+$", str(value))) and int(str(value)) >= least


# (option, rule, whether the value keeps to it), in the order they are named.
OPTION_RULES: list[tuple[str, str, Callable[[Any], bool]]] = [
    ("gpu_verify_timeout", "a number of seconds above 0", lambda v: 0 < _number(v) < 1e9),
    ("gpu_verify_fit_learning_rate", "a finite number above 0 (default 0.01)", lambda v: 0 < _number(v) < 1e300),
    ("gpu_verify_scaling_threshold", "a fraction above 0 and at most 1 (default 0.75)", lambda v: 0 < _number(v) <= 1),
    ("gpu_verify_expected_gpu_count", "a whole number of GPUs of at least 1", _whole),
    (
        "gpu_verify_cpu_replicas",
        "a whole number: 0 fits on the GPUs, N above 0 on N logical CPU devices",
        lambda v: _whole(v, least=0),
    ),
    ("gpu_verify_report_keep", "a whole number of run folders of at least 1 (default 30)", _whole),
    (
        "gpu_verify_jupyter_kernel_dir",
        "an absolute folder on the host, tf_venv_jupyter_kernel_dir's (default /usr/local/share/jupyter/kernels)",
        lambda v: os.path.isabs(str(v)),
    ),
]
# The options the rules read, in their order (plugins/action/gpu_option_checks.py checks them in preflight).
OPTIONS = tuple(rule[0] for rule in OPTION_RULES)


def gpu_verify_option_problems(options: dict[str, Any]) -> list[str]:
    """``{{ {'gpu_verify_timeout': gpu_verify_timeout, ...} | gpu_fleet.tf_hosts.gpu_verify_option_problems }}``:
    one message per option that breaks its rule, naming its value and the fix; ``[]`` when none does. An option
    that is none (left out of the inventory, or null there) is named as not set."""
    return option_problems(options, OPTION_RULES, OPTION)


def gpu_verify_location_args(location: dict[str, Any]) -> list[str]:
    """``location``: ``out_dir`` (gpu_verify_report_dir), ``keep`` (gpu_verify_report_keep), ``inventory_sources``
    (ansible_inventory_sources), ``inventory_name`` (gpu_verify_inventory_name, may be empty) and ``limit``
    (ansible_limit, none without ``--limit``) -> ``--out-dir``, ``--keep``, one ``--inventory-source=`` each,
    ``--inventory-name=`` and ``--limit=`` where given."""
    args = ["--out-dir", str(location.get("out_dir")), "--keep", str(location.get("keep"))]
    args += [f"--inventory-source={source}" for source in location.get("inventory_sources") or []]
    if location.get("inventory_name"):
        args.append(f"--inventory-name={location['inventory_name']}")
    if location.get("limit") is not None:
        args.append(f"--limit={location['limit']}")
    return args


def gpu_verify_report_args(settings: dict[str, Any]) -> list[str]:
    """fleet_report.py's options after its path: the input on stdin and JSON out, ``inventory_hosts``
    (``groups['all']``), ``location_args`` (:func:`gpu_verify_location_args`), ``not_verified`` and ``run_id``
    where given, ``--dry-run`` under ``check_mode``."""
    args = [
        "--input",
        "-",
        "--emit",
        "json",
        "--inventory-hosts",
        json.dumps(list(settings.get("inventory_hosts") or [])),
    ]
    args += list(settings.get("location_args") or [])
    if settings.get("not_verified"):
        args += ["--not-verified", json.dumps(settings["not_verified"])]
    if settings.get("run_id"):
        args.append(f"--run-id={settings['run_id']}")
    if boolean(settings.get("check_mode"), strict=False):
        args.append("--dry-run")
    return args


def gpu_verify_results(
    runs: list[dict[str, Any]], install_dir: str, du_lines: list[str], held_back: Any = None
) -> dict[str, dict[str, Any]]:
    """``{stack: document}`` from the host's runs (command or ``async_status`` loop results; the last run of a
    stack counts), each with the host's ``disk_used_bytes`` (``du --summarize --bytes`` lines), and the stacks
    gpu_preflight held back (``gpu_preflight_held_back``), each as a failed document."""
    disk = gpu_du_bytes(du_lines or [])
    results = {
        gpu_verify_stack_name(run): {**gpu_verify_result(run, install_dir), "disk_used_bytes": disk} for run in runs
    }
    return {**results, **gpu_verify_held_back(held_back or [])}


def gpu_verify_failure(result: dict[str, Any], stack: str, host: str, switch: Any = None) -> str:
    """The message a host fails with for a stack whose document (``result``) is not ``ok``: each problem's cause
    and fix, ``|`` between problems; for a newly declared default that did not verify (``switch``,
    gpu_env_default_switch, not ``switched``) first that the previous default stays."""
    switch = switch if isinstance(switch, dict) else {}
    stays = ""
    if stack == (switch.get("to") or "") and not switch.get("switched"):
        stays = MESSAGES["stays"].format(old=switch.get("from"), new=switch.get("to"))
    problems = result.get("problems") if "problems" in result else NO_RESULT
    joined = " | ".join(f"{item.get('cause', '')} {item.get('fix', '')}" for item in problems or [])
    return MESSAGES["failed"].format(stays=stays, stack=stack, host=host, problems=joined)


def gpu_verify_switch_note(switch: dict[str, Any]) -> str:
    """``gpu_env_default_switch`` (``{from, to, switched, waits}``) -> the line that says which stack is the
    default: switched, waiting for a run that switches (``waits``), or staying after a failed verification."""
    key = "switched" if switch.get("switched") else "waits" if switch.get("waits") else "not_switched"
    return MESSAGES[key].format(old=switch.get("from"), new=switch.get("to"))


def gpu_verify_mig(results: dict[str, dict[str, Any]], mig: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The host's results (``{stack: document}``), each stack failed with check ``mig`` where the MIG devices of
    ``nvidia-smi -L`` differ from gpu_mig_layout (``mig``: the result of gpu_mig, state verified), else each with
    ``mig_devices``, their count; as they are without a MIG result (``{}``)."""
    found = [f"GPU {index}: {text}" for index, text in sorted((mig.get("differences") or {}).items())]
    found += list(mig.get("problems") or [])
    if not found:  # the count the health check's baseline keeps (filter gpu_health_baseline_args)
        return (
            {stack: dict(doc, mig_devices=mig["devices"]) for stack, doc in results.items()}
            if "devices" in mig
            else results
        )
    problem = {
        "check": "mig",
        "cause": f"The MIG devices differ from gpu_mig_layout ({mig.get('devices', 0)} asked for): {'; '.join(found)}.",
        "fix": "Run playbooks/driver.yml with gpu_mig_enabled (it lays them out on idle GPUs), or fix gpu_mig_layout.",
    }
    return {
        stack: dict(doc, ok=False, problems=[*(doc.get("problems") or []), problem]) for stack, doc in results.items()
    }


class FilterModule:
    """gpu_verify's wiring filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_verify_option_problems": gpu_verify_option_problems,
            "gpu_verify_location_args": gpu_verify_location_args,
            "gpu_verify_report_args": gpu_verify_report_args,
            "gpu_verify_results": gpu_verify_results,
            "gpu_verify_failure": gpu_verify_failure,
            "gpu_verify_switch_note": gpu_verify_switch_note,
            "gpu_verify_mig": gpu_verify_mig,
        }
