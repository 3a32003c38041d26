"""Filters for the CUDA toolkits of roles/cuda_toolkit: what its one look reads, what each toolkit needs,
the --check plan and why the role stops.

``gpu_cuda_look_paths``: the toolkits and the default symlink -> the paths of the one ``gpu_host_probe`` look.
``gpu_cuda_toolkits``: the toolkits and that look -> the toolkits the install loop takes, the plan's lines
and whether the default symlink can be trusted as looked at.
``gpu_cuda_plan``: the plan's lines of a run of main, joined into ``cuda_toolkit_plan``.
``gpu_cuda_check_problems``, ``gpu_cuda_nvcc_problem``: the stops' texts (cause, then fix) from ``MESSAGES``.

A toolkit counts as installed by content: version.json names the pinned nvcc, nvcc and the CUDA runtime
exist through every link of their chains, and the record of the last completed install names the pinned
nvcc (version.json alone could come from an installer that stopped half-way). Each filter is documented
in plugins/filter/<name>.yml.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.host_cache import may_hold
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message

# What a complete toolkit has ({root}, {cudart_soname}), and what is read of it ({done} the record's name).
PROBE_PATHS = ("{root}/bin/nvcc", "{root}/lib64/libcudart.so", "{root}/lib64/{cudart_soname}")
READ_PATHS = ("{root}/version.json", "{root}/{done}")
PLAN_TEXTS = {
    "installed": "CUDA {version} installed",
    "reinstall": "CUDA {version} would be reinstalled ({root} is incomplete or another build)",
    "install": "CUDA {version} would be installed in {root}",
    "link_change": "{link} would point at {root}",
    "link_same": "{link} -> {root}",
    # The default stack's CUDA comes from NVIDIA's wheels: no default toolkit (default_root None).
    "link_remove": "{link} would be removed (the default stack's CUDA comes from NVIDIA's wheels in its venv)",
    "link_none": "{link}: none (the default stack's CUDA comes from NVIDIA's wheels in its venv)",
    "remove": "{root} would be removed (stack {name} is absent)",
}
MESSAGES: dict[str, Message] = {
    "link_relative": Message(
        "cuda_toolkit_default_symlink {link} is not an absolute path.",
        "Set it to /usr/local/cuda (the default) or another absolute path that is free or already a symbolic link.",
    ),
    "link_taken": Message(
        "cuda_toolkit_default_symlink {link} exists and is not a symbolic link (a {kind}); the run would replace "
        "it with a link to the default toolkit.",
        "Move it aside on the host when it is a CUDA installed by hand (mv {link} {link}.manual), or set "
        "cuda_toolkit_default_symlink to /usr/local/cuda (the default) or another absolute path that is free or "
        "already a symbolic link.",
    ),
    "timeout": Message(
        "cuda_toolkit_install_timeout is {timeout}; it is the seconds NVIDIA's CUDA installer may run before the "
        "run stops it, at least 60.",
        "Set it to 3600 (the default) or more on slow disks.",
    ),
    "nvcc": Message(
        "{root}/version.json names nvcc {found}, expected {nvcc} from {runfile}.",
        "See /var/log/cuda-installer.log on the host; the runfile may not be the one the manifest describes.",
    ),
}


def _paths(templates: tuple[str, ...], toolkit: dict, done: str) -> list[str]:
    fields = {"root": toolkit["root"], "cudart_soname": toolkit.get("cudart_soname", ""), "done": done}
    return [template.format(**fields) for template in templates]


def gpu_cuda_look_paths(toolkits: list[dict], link: str, done: str) -> dict[str, list[str]]:
    """The look's ``stat`` (the default symlink ``link`` when absolute, then each toolkit's nvcc and
    runtime) and ``read`` (each toolkit's version.json and completion record ``done``)."""
    stat = [link] if os.path.isabs(str(link)) else []
    read: list[str] = []
    for toolkit in toolkits:
        stat += _paths(PROBE_PATHS, toolkit, done)
        read += _paths(READ_PATHS, toolkit, done)
    return {"stat": stat, "read": read}


def _nvcc_version(text: Any) -> str:
    """The nvcc version version.json names, or '' when it names none or is no JSON."""
    try:
        return str(((json.loads(text) or {}).get("cuda_nvcc") or {}).get("version") or "")
    except (TypeError, ValueError, AttributeError):
        return ""


def toolkit_installed(toolkit: dict, look: dict, done: str) -> bool:
    """Whether ``toolkit`` is installed in full as ``look`` (gpu_host_probe's result) found it."""
    reads, stats = look.get("read") or {}, look.get("stat") or {}
    version_json, record = (reads.get(path) for path in _paths(READ_PATHS, toolkit, done))
    nvcc = toolkit["nvcc_version"]
    return (
        isinstance(version_json, str)
        and _nvcc_version(version_json) == nvcc
        and all((stats.get(path) or {}).get("target_exists") for path in _paths(PROBE_PATHS, toolkit, done))
        and (record or "").strip() == nvcc
    )


def _cached(toolkit: dict, inputs: dict) -> bool:
    """Whether the toolkit's runfile may be in the host cache (so its removal is to be tried): never when
    the cache is kept; else when gpu_preflight found it there or what the cache holds is unknown."""
    return may_hold(f"/cuda_toolkit/{toolkit['version']}/{toolkit['runfile']['file']}", inputs)


def gpu_cuda_toolkits(toolkits: list[dict], look: dict, inputs: dict) -> dict[str, Any]:
    """What main does with each toolkit: ``work`` (the toolkits the install loop takes, each with
    ``installed``: missing or incomplete ones, and installed ones whose runfile may still be in the host
    cache), ``plan`` ({root: {change, text}}) and ``link_ok`` (the default symlink needs no round trip).
    ``inputs``: ``done`` (the completion record's name), ``cache_files`` (gpu_preflight's look at the host
    cache, None when unknown), ``keep_cache``, ``link`` (the default symlink, whose stat the look holds),
    ``default_root`` (the default stack's toolkit, None where its CUDA comes from NVIDIA's wheels) and ``plan``
    (cuda_toolkit_plan so far)."""
    work, plan = [], {}
    for toolkit in toolkits:
        installed = toolkit_installed(toolkit, look, inputs["done"])
        version_json = (look.get("read") or {}).get(_paths(READ_PATHS, toolkit, inputs["done"])[0])
        key = "installed" if installed else "reinstall" if isinstance(version_json, str) else "install"
        plan[toolkit["root"]] = {"change": not installed, "text": PLAN_TEXTS[key].format(**toolkit)}
        if not installed or _cached(toolkit, inputs):
            work.append(dict(toolkit, installed=installed))
    link = (look.get("stat") or {}).get(inputs.get("link")) or {}
    earlier = [entry for entry in (inputs.get("plan") or {}).values() if (entry or {}).get("change")]
    link_ok = (
        _link_serves(link, inputs.get("default_root"))
        and not earlier
        and not any(entry["change"] for entry in plan.values())
    )
    return {"work": work, "plan": plan, "link_ok": link_ok}


def _link_serves(link: dict, default_root: str | None) -> bool:
    """Whether the default symlink's path as looked at (``link``, a stat) serves the default stack: a link to its
    toolkit ``default_root``, or, where it has none (its CUDA comes from NVIDIA's wheels), no link of ours there
    (nothing, or what gpu_preflight refuses before any change: a folder or a file)."""
    if not default_root:
        return not link.get("islnk")
    return link.get("lnk_target", "") == default_root


def gpu_cuda_plan(plan: dict | None, parts: dict) -> dict[str, dict]:
    """``cuda_toolkit_plan`` after a run of main: ``plan`` (so far) with ``parts``: ``toolkits`` (the
    install's lines), ``link`` (the default symlink's path), ``link_changed``, ``default_root`` (None where the
    default stack's CUDA comes from NVIDIA's wheels: the link goes) and ``removed`` (the absent stacks whose
    toolkit goes: name, cuda_root)."""
    joined = dict(plan or {})
    joined.update(parts.get("toolkits") or {})
    changed = boolean(parts.get("link_changed", False), strict=False)
    fields = {"link": parts["link"], "root": parts["default_root"]}
    texts = ("link_change", "link_same") if parts["default_root"] else ("link_remove", "link_none")
    joined[parts["link"]] = {"change": changed, "text": PLAN_TEXTS[texts[0] if changed else texts[1]].format(**fields)}
    for stack in parts.get("removed") or []:
        text = PLAN_TEXTS["remove"].format(root=stack["cuda_root"], name=stack["name"])
        joined[stack["cuda_root"]] = {"change": True, "text": text}
    return joined


# The options cuda_toolkit's own rule reads (plugins/action/gpu_option_checks.py checks them in preflight).
OPTIONS = ("cuda_toolkit_install_timeout",)


def gpu_cuda_option_problems(values: dict[str, Any]) -> list[str]:
    """cuda_toolkit's option rule, ``values`` by option name: the installer's time limit is a whole number of
    seconds of at least 60."""
    timeout = values.get("cuda_toolkit_install_timeout")
    if re.match(r"^[0-9]+$", str(timeout)) and int(str(timeout)) >= 60:
        return []
    return [MESSAGES["timeout"].text(timeout=timeout)]


def gpu_cuda_check_problems(link: str, link_stat: dict | None, timeout: Any = None) -> list[str]:
    """The stops before any change: the default symlink ``link`` (``link_stat``: gpu_host_probe's stat of it)
    would replace a real folder or file, or is relative; with ``timeout``, also the installer's time limit
    (:func:`gpu_cuda_option_problems`)."""
    problems = []
    found = link_stat or {}
    if not os.path.isabs(str(link)):
        problems.append(MESSAGES["link_relative"].text(link=link))
    elif found.get("exists") and not found.get("islnk"):
        kind = "folder" if found.get("isdir") else "file"
        problems.append(MESSAGES["link_taken"].text(link=link, kind=kind))
    if timeout is not None:
        problems += gpu_cuda_option_problems({"cuda_toolkit_install_timeout": timeout})
    return problems


def gpu_cuda_nvcc_problem(version_json: str, toolkit: dict) -> str:
    """'' when the installed version.json (its text) names the toolkit's pinned nvcc, else the stop."""
    found = _nvcc_version(version_json)
    if found == toolkit["nvcc_version"]:
        return ""
    return MESSAGES["nvcc"].text(
        root=toolkit["root"], found=found or "none", nvcc=toolkit["nvcc_version"], runfile=toolkit["runfile"]["file"]
    )


class FilterModule:
    """CUDA toolkit filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_cuda_look_paths": gpu_cuda_look_paths,
            "gpu_cuda_toolkits": gpu_cuda_toolkits,
            "gpu_cuda_plan": gpu_cuda_plan,
            "gpu_cuda_check_problems": gpu_cuda_check_problems,
            "gpu_cuda_nvcc_problem": gpu_cuda_nvcc_problem,
        }
