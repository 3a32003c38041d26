"""Filters for the TensorFlow venvs of roles/tf_venv: what a run does to a venv and why it stops.

``gpu_venv_plan_text``: a stack and what the venvs' look found -> the line of the ``--check`` plan.
``gpu_venv_look_commands``: the stacks -> the ``run`` commands of the venvs' one ``gpu_host_state`` look.
``gpu_venv_pip_files``: a stack's venv -> the ``gpu_fleet.tf_hosts.gpu_files`` items written before pip.
``gpu_venv_pip_problem``, ``gpu_venv_wheel_problem``, ``gpu_venv_index_problem``: a registered result
-> the stop's text (cause, then fix) from the catalog ``MESSAGES``.

Each is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message

# The --check plan's line for a venv, by what would happen to it.
PLAN_TEXTS = {
    "create": "venv {name} would be created in {venv} ({tf})",
    "lock": "venv {name} would be brought to its lock ({what})",
    "unlocked": "{tf} would be installed into venv {name} (unlocked)",
    "current": "venv {name} current ({tf}, {how})",
}
# Every stop of the venvs' install, by id.
MESSAGES: dict[str, Message] = {
    "pip_wheelhouse": Message(
        "pip could not install {what} into {venv}: {said}.",
        "pip installed from the wheelhouse {wheelhouse} (tf_venv_wheelhouse) only: put every wheel of the lock for "
        "the Python and platform of the host there (make the bundle again: playbooks/airgap_bundle.yml).",
    ),
    "pip_controller": Message(
        "pip could not install {what} into {venv}: {said}.",
        "pip installed from the wheels the controller fetched into {wheel_dir} only (tf_venv_wheels_from: "
        "controller): remove that folder so that the next run fetches it again, or set tf_venv_wheels_from: index.",
    ),
    "pip_index": Message(
        "pip could not install {what} into {venv}: {said}.",
        "Rerun (downloads are retried), check the index ({index}) and the CA bundle, or install from a wheelhouse "
        "(tf_venv_wheelhouse).",
    ),
    "wheels_not_fetched": Message(
        "The controller could not fetch the wheels of the lock {name} for CPython {python} on {arch} into {dir} "
        "({said}).",
        "Check the controller's pip index, proxy and CA bundle (its own pip.conf or PIP_INDEX_URL; pip runs as "
        "{controller_python} -m pip), then rerun; or set tf_venv_wheels_from: index to let each host download from "
        "its index.",
    ),
    "index_unreachable": Message(
        "The pip index {index} cannot be reached from the host{through} ({said}).",
        "Fix tf_venv_pip_index_url, the proxy ({proxy_source}) or the firewall, let the controller fetch the wheels "
        "(tf_venv_wheels_from: controller), or install from a wheelhouse (tf_venv_wheelhouse).",
    ),
}
# The user:password@ of a URL (pip documentation, "Authentication").
CREDENTIALS = re.compile(r"(?<=://)[^/@]*@")
# How many of a list a message names before "and N more".
NAMED = {"drift": 2, "wheel_gaps": 3}


def _flag(value: Any) -> bool:
    """A setting read as Ansible's ``bool`` filter reads it."""
    return boolean(value, strict=False)


def _some(items: list[str], shown: int) -> list[str]:
    """The first ``shown`` of ``items``, then "and N more" for the rest."""
    return list(items[:shown]) + ([f"and {len(items) - shown} more"] if len(items) > shown else [])


def _last_line(text: Any) -> str:
    """The last non-empty line of a tool's output: where pip and socket errors say what went wrong."""
    lines = [line for line in str(text or "").strip().splitlines() if line]
    return lines[-1] if lines else ""


def gpu_venv_plan_text(stack: dict, state: dict) -> str:
    """The plan's line for ``stack``'s venv; ``state``: ``has_python``, ``change``, ``locked`` and ``drift``
    (the lines of ``gpu_lock_drift``, read only for a locked venv)."""
    tf = f"TensorFlow {(stack.get('tensorflow') or {}).get('version')}"
    fields = {"name": stack.get("name"), "venv": stack.get("venv"), "tf": tf}
    locked = _flag(state.get("locked"))
    if not _flag(state.get("has_python")):
        return PLAN_TEXTS["create"].format(**fields)
    if _flag(state.get("change")):
        if not locked:
            return PLAN_TEXTS["unlocked"].format(**fields)
        what = "; ".join(_some(state.get("drift") or [], NAMED["drift"])) or "a new lock or an interrupted install"
        return PLAN_TEXTS["lock"].format(what=what, **fields)
    return PLAN_TEXTS["current"].format(how="locked" if locked else "unlocked", **fields)


def gpu_venv_look_commands(stacks: list[dict], inputs: dict) -> dict[str, list[str]]:
    """The venvs' look: for each venv (keyed by its path) its interpreter runs ``distributions_script`` on its
    ``lock_record``; with ``try_index``, the host's ``python`` runs ``index_script`` against ``target`` (the
    index or the proxy pip would use, split as ``urlsplit`` does), keyed ``index_key``."""
    commands = {
        stack["venv"]: [
            f"{stack['venv']}/bin/python",
            "-c",
            inputs["distributions_script"],
            f"{stack['venv']}/{inputs['lock_record']}",
        ]
        for stack in stacks
    }
    if _flag(inputs.get("try_index")):
        target = inputs.get("target") or {}
        port = target.get("port") or (443 if target.get("scheme") == "https" else 80)
        commands[inputs["index_key"]] = [
            inputs["python"],
            "-c",
            inputs["index_script"],
            target.get("hostname"),
            str(port),
        ]
    return commands


def gpu_venv_pip_files(venv: str, inputs: dict) -> list[dict[str, str]]:
    """What tasks/install.yml writes into ``venv`` before pip: the CA bundle pip must trust (``ca_bundle``,
    a controller file, when set), ``pip.conf`` (``pip_conf``, its text) and, for a locked stack
    (``locked``), the lock (``lock_path`` on the controller) as ``lock_file``."""
    files = (
        [{"dest": f"{venv}/pip-ca-bundle.pem", "src": inputs["ca_bundle"], "mode": "0644"}]
        if inputs.get("ca_bundle")
        else []
    )
    files.append({"dest": f"{venv}/pip.conf", "content": inputs["pip_conf"], "mode": "0600"})
    if _flag(inputs.get("locked")):
        files.append({"dest": f"{venv}/{inputs['lock_file']}", "src": inputs["lock_path"], "mode": "0644"})
    return files


def gpu_venv_pip_problem(result: dict, inputs: dict) -> str:
    """Why pip failed, from its registered result, in one line: ``inputs`` ``what`` (the lock or the
    requirement), ``venv``, ``wheelhouse``, ``from_controller``, ``locked``, ``wheel_dir`` and ``index_url``.
    From a wheelhouse or the controller's wheels no index is contacted: what is missing there is the cause."""
    fields = dict(inputs, said=_last_line((result or {}).get("msg")))
    if inputs.get("wheelhouse"):
        return MESSAGES["pip_wheelhouse"].text(**fields)
    if _flag(inputs.get("from_controller")) and _flag(inputs.get("locked")):
        return MESSAGES["pip_controller"].text(**fields)
    masked = CREDENTIALS.sub("", str(inputs.get("index_url") or ""))
    return MESSAGES["pip_index"].text(**dict(fields, index=masked or "PyPI"))


def gpu_venv_wheel_problem(need: dict, result: dict | None, gaps: list[str], controller_python: str) -> str:
    """Why the controller could not fetch the wheels of a lock (``need``: ``name``, ``python``, ``arch``,
    ``dir``): pip's last line (``result``, the download's loop result) and the first wheels missing."""
    result = result or {}
    said = _last_line(result.get("stderr") or result.get("msg"))
    named = "; ".join(gaps[: NAMED["wheel_gaps"]])
    more = f" and {len(gaps) - NAMED['wheel_gaps']} more" if len(gaps) > NAMED["wheel_gaps"] else ""
    fields = {key: need.get(key) for key in ("name", "python", "arch", "dir")}
    said = f"{said}; {named}{more}" if said else f"{named}{more}"
    return MESSAGES["wheels_not_fetched"].text(said=said, controller_python=controller_python, **fields)


def gpu_venv_index_problem(result: dict | None, inputs: dict) -> str:
    """Why the pip index cannot be reached from the host, or ``''`` when it answered (or was not tried):
    ``inputs`` ``index`` (the index URL split as ``urlsplit`` does), ``proxy`` (the proxy pip would use,
    masked; empty for none) and ``proxy_from_role`` (it is tf_venv_proxy, not the host's)."""
    if not result or result.get("rc") == 0:
        return ""
    split = inputs.get("index") or {}
    port = f":{split['port']}" if split.get("port") else ""
    index = f"{split.get('scheme')}://{split.get('hostname')}{port}{split.get('path') or ''}"
    proxy = inputs.get("proxy") or ""
    return MESSAGES["index_unreachable"].text(
        index=index,
        through=f" through the proxy {proxy}" if proxy else "",
        said=str(result.get("stderr") or "no answer").strip(),
        proxy_source="tf_venv_proxy, by default gpu_preflight_proxy"
        if inputs.get("proxy_from_role")
        else "https_proxy on the host",
    )


class FilterModule:
    """TensorFlow venv filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_venv_plan_text": gpu_venv_plan_text,
            "gpu_venv_look_commands": gpu_venv_look_commands,
            "gpu_venv_pip_files": gpu_venv_pip_files,
            "gpu_venv_pip_problem": gpu_venv_pip_problem,
            "gpu_venv_wheel_problem": gpu_venv_wheel_problem,
            "gpu_venv_index_problem": gpu_venv_index_problem,
        }
