"""Check mode as a plan: what a run would change, per host and phase.

Each provisioning role publishes what it found against its pins, whether or not the run is in check
mode, as ``<role>_plan``: ``{subject: {"change": bool, "text": str}}``, keyed so that running the
role again in the same play replaces its own items. ``gpu_plan_driver`` builds the driver's item;
the other roles build theirs in their own tasks. ``gpu_plan_collect`` turns every host's items into
one line per phase, which gpu_verify prints at the end of a ``--check`` run and writes as
``plan.{json,md}`` (``fleet_plan.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (phase, fact): in the order site.yml runs the roles. A role a run did not reach (tags, an
# entry point of its own) publishes nothing, and its phase is left out of that host's plan.
PHASES = (
    ("driver", "nvidia_driver_plan"),
    ("CUDA", "cuda_toolkit_plan"),
    ("cuDNN", "cudnn_plan"),
    ("environment", "gpu_env_plan"),
    ("TensorFlow", "tf_venv_plan"),
)
NOTHING = "nothing to do"
NO_PLAN = (
    "no plan: the host failed or was unreachable before the provisioning roles looked at it "
    "(the run's output and the fleet report say why)"
)


def gpu_plan_driver(
    pinned: str,
    decided: Mapping[str, Any],
    installed: Any,
    found: Any,
    loaded: Any,
    manage_kernel: Any,
    reboot_allowed: Any,
) -> dict[str, dict[str, Any]]:
    """nvidia_driver's plan item, ``{"driver": {"change", "text"}}``.

    Args:
        pinned: ``nvidia_driver_version``.
        decided: the ``gpu_driver_method`` filter's result (``method``, ``switch_from``).
        installed: whether the pinned version is installed and complete.
        found: the user-space version on the host now (its record, else libcuda's file name), or None.
        loaded: the loaded kernel module's version, or None (no module, or a container).
        manage_kernel: whether this host gets kernel modules (a reboot loads a new one).
        reboot_allowed: ``nvidia_driver_reboot_allowed``: the run reboots the host itself.
    """
    method = decided.get("method")
    reboot = bool(manage_kernel) and (not installed or (loaded not in (None, "") and loaded != pinned))
    after = "the run reboots the host" if reboot_allowed else "reboot required"
    if installed:
        if reboot:
            text = f"driver {pinned} installed, loaded kernel module {loaded} ({after})"
            return {"driver": {"change": bool(reboot_allowed), "text": text}}
        return {"driver": {"change": False, "text": f"driver {pinned} installed ({method})"}}
    how = f"{decided.get('switch_from')} -> {method}" if decided.get("switch_from") else method
    notes = ", ".join([how] + ([after] if reboot else []))
    if found and found != pinned:
        return {"driver": {"change": True, "text": f"driver {found} -> {pinned} ({notes})"}}
    if found:
        return {"driver": {"change": True, "text": f"driver {pinned} would be reinstalled, incomplete ({notes})"}}
    return {"driver": {"change": True, "text": f"driver {pinned} would be installed ({notes})"}}


def _items(plan: Any) -> list[dict[str, Any]]:
    if not isinstance(plan, Mapping):
        return []
    return [item for item in plan.values() if isinstance(item, Mapping) and "text" in item]


def phase_line(items: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One phase's line: the changes, or ``nothing to do (<what is there>)``."""
    changes = [str(item["text"]) for item in items if item.get("change")]
    if changes:
        return {"change": True, "line": "; ".join(changes)}
    found = ", ".join(str(item["text"]) for item in items)
    return {"change": False, "line": f"{NOTHING} ({found})" if found else NOTHING}


def host_plan(facts: Any) -> list[dict[str, Any]]:
    """``[{phase, change, line}]`` for one host's facts, in the order the roles run."""
    phases = []
    for phase, fact in PHASES:
        try:
            plan = facts[fact]
        except (KeyError, TypeError):
            continue
        phases.append({"phase": phase, **phase_line(_items(plan))})
    return phases


def gpu_plan_collect(all_hosts: list[str], hostvars: Any, alive_hosts: list[str]) -> dict[str, Any]:
    """Every host of the play -> ``{"phases": [{phase, change, line}], "changes": n, "failed": bool}``;
    a host that failed or was unreachable before any role published a plan gets :data:`NO_PLAN`."""
    hosts = {}
    for host in all_hosts:
        try:
            facts = hostvars[host]
        except KeyError:
            facts = {}
        phases = host_plan(facts)
        failed = host not in alive_hosts
        if not phases:
            phases = [{"phase": "host", "change": False, "line": NO_PLAN}] if failed else []
        hosts[host] = {"phases": phases, "changes": sum(1 for p in phases if p["change"]), "failed": failed}
    return hosts


class FilterModule:
    """The plan of a --check run."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_plan_driver": gpu_plan_driver, "gpu_plan_collect": gpu_plan_collect}
