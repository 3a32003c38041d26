"""Filters for the TensorFlow venvs of roles/tf_venv: what a run does to a venv and why it stops.

``gpu_venv_plan_text``: a stack and what the venvs' look found -> the line of the ``--check`` plan.
``gpu_venv_look_commands``: the stacks -> the ``run`` commands of the venvs' one ``gpu_host_probe`` look.
``gpu_venv_pip_files``: a stack's venv -> the ``gpu_fleet.tf_hosts.gpu_files`` items written before pip.
``gpu_venv_pip_problem``, ``gpu_venv_wheel_problem``, ``gpu_venv_index_problem``: a registered result
-> the stop's text (cause, then fix) from the catalog ``MESSAGES``.
``gpu_venv_check_problems``: the role's settings -> what stops the host in preflight, before any change.
``gpu_venv_lock_problems``: the stacks -> each stack's lock problem, else each wheelhouse mismatch.
``gpu_venv_plan``: the stacks and what this run did to each -> ``tf_venv_plan``.
``gpu_venv_download_argv``: a lock's wheel need -> the controller's ``pip download`` command.
``gpu_venv_message``: a message id and its fields -> the text (cause, then fix).

Each is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_lock import (
    gpu_lock_wheelhouse,
    gpu_tf_lock_name,
    tf_lock_plan,
)
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_lock import python_series
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
    "ca_bundle_missing": Message(
        "tf_venv_pip_ca_bundle {ca_bundle} does not exist on the controller; each venv's pip is given a copy of it.",
        "Point tf_venv_pip_ca_bundle at the CA bundle that signs your index or proxy (often "
        "/etc/ssl/certs/ca-certificates.crt), or leave it empty for pip's own.",
    ),
    "index_without_scheme": Message(
        "The pip index URL {url} (tf_venv_pip_index_url or tf_venv_pip_extra_index_urls) has no http:// or https:// "
        "scheme and host.",
        "Write it in full, for example https://pypi.org/simple or https://mirror.example.com/pypi/simple, or leave "
        "tf_venv_pip_index_url empty for pip's own.",
    ),
    "install_timeout": Message(
        "tf_venv_pip_install_timeout is {timeout}; it is the seconds a venv's pip install may run before the run "
        "stops it, at least 60.",
        "Set it to 3600 (the default) or more behind a slow mirror.",
    ),
    # pip refuses a timeout of 0 or less at its first network call ("the timeout cannot be set to a value less
    # than or equal to 0"), long after the value was written into the venv's pip.conf.
    "network_timeout": Message(
        "tf_venv_pip_timeout is {timeout}; it is pip's network timeout in seconds, a whole number above 0.",
        "Set it to 120 (the default) or more behind a slow mirror.",
    ),
    "kernel_dir_relative": Message(
        "tf_venv_jupyter_kernel_dir is {kernel_dir}; it is the folder on the host where a stack whose lock names "
        "ipykernel gets its kernel spec, an absolute path.",
        "Set it to one of Jupyter's kernel folders, /usr/local/share/jupyter/kernels (the default) or "
        "/usr/share/jupyter/kernels.",
    ),
    # pip download keeps a file of the folder whose hash the lock lists and fetches again one whose hash it does
    # not ("Previously-downloaded file ... has bad hash. Re-downloading.", pip's operations/prepare.py): the
    # one command mends both an altered and a missing wheel.
    "wheelhouse_not_locked": Message(
        "The wheelhouse {wheelhouse} (tf_venv_wheelhouse) does not hold the wheels of the lock {lock} for CPython "
        "{python} on {arch}: {problems}.",
        "Download the lock's wheels into it from a machine that reaches your index: `{download}` (pip keeps each "
        "locked file there and fetches the others again), or build the bundle again (playbooks/airgap_bundle.yml "
        "with gpu_bundle_python_version={python}) and set tf_venv_wheelhouse to its wheels/ folder. Nothing was "
        "pushed to the host.",
    ),
    "absent_env_unreadable": Message(
        "{venv}/{env_file} cannot be read ({said}), so whether {venv} is stack {name}'s venv is not known; nothing "
        "of it was removed.",
        "Make the file readable by root (or remove the venv by hand), then rerun.",
    ),
    "absent_venv_stays": Message(
        "{venv} stays: its {env_file} is missing or does not name stack {name} (a venv installed before tf_venv "
        "wrote that file, or another folder).",
        "Remove it by hand if it is that stack's venv.",
    ),
}
# What a failed pip left on the host (tasks/pip.yml), said after its stop's text.
PIP_AFTERMATH = {
    "created": "The venv {venv} that this run made was removed, so no half-built venv stands where the stack's is "
    "expected.",
    "emptied": "{venv} was an empty folder before this run: the venv this run made in it was removed and the folder "
    "stays, empty, so no half-built venv stands where the stack's is expected.",
    "kept": "{venv} was there before this run and keeps what it held; its lock record is unchanged, so the next run "
    "brings it to its lock again.",
    "wheels": " The wheels pushed to {wheels} for it were removed.",
}
# An index URL pip can use: a scheme and a host ("pip install", option --index-url).
INDEX_URL = re.compile(r"^https?://[^/\s]+")
# A pip time limit: whole seconds, at least this many.
TIMEOUT = re.compile(r"^[0-9]+$")
MIN_TIMEOUT = 60
# The platform tags the locks are made for (tools/locks.py: manylinux_2_17), for the controller's pip download.
PLATFORMS = ("manylinux2014_", "manylinux_2_17_", "linux_")
# The user:password@ of a URL (pip documentation, "Authentication").
CREDENTIALS = re.compile(r"(?<=://)[^/@]*@")
# How many of a list a message names before "and N more".
NAMED = {"drift": 2, "wheel_gaps": 3, "wheelhouse_gaps": 5}


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
    requirement), ``venv``, ``wheelhouse``, ``from_controller``, ``locked``, ``wheel_dir``, ``index_url``,
    ``created`` (the run made the venv) and ``wheels_removed``; what was removed after it follows
    (:func:`_pip_aftermath`). From a wheelhouse or the controller's wheels no index is contacted: what is
    missing there is the cause."""
    fields = dict(inputs, said=_last_line((result or {}).get("msg")))
    if inputs.get("wheelhouse"):
        text = MESSAGES["pip_wheelhouse"].text(**fields)
    elif _flag(inputs.get("from_controller")) and _flag(inputs.get("locked")):
        text = MESSAGES["pip_controller"].text(**fields)
    else:
        masked = CREDENTIALS.sub("", str(inputs.get("index_url") or ""))
        text = MESSAGES["pip_index"].text(**dict(fields, index=masked or "PyPI"))
    return f"{text} {_pip_aftermath(inputs)}"


def _pip_aftermath(inputs: dict) -> str:
    """What tasks/pip.yml did after pip failed: the venv the run made removed, or the one there before kept;
    the wheels pushed for it removed (``wheels_removed``: their folder on the host, '' when they stay)."""
    made = "emptied" if _flag(inputs.get("emptied", False)) else "created"
    venv = PIP_AFTERMATH[made if _flag(inputs.get("created", False)) else "kept"].format(venv=inputs.get("venv"))
    wheels = inputs.get("wheels_removed")
    return venv + (PIP_AFTERMATH["wheels"].format(wheels=wheels) if wheels else "")


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


def gpu_venv_message(message_id: str, **fields: Any) -> str:
    """The text (cause, then fix) of the catalog message ``message_id`` with ``fields``."""
    if message_id not in MESSAGES:
        raise AnsibleFilterError(f"gpu_venv_message: no message {message_id!r}; known: {', '.join(sorted(MESSAGES))}")
    return MESSAGES[message_id].text(**fields)


def gpu_venv_check_problems(inputs: dict) -> list[str]:
    """What stops the host before any change, in the order the settings are checked: ``ca_bundle`` (a
    controller file, or empty), ``index_urls`` (already without credentials), ``install_timeout``,
    ``network_timeout`` (tf_venv_pip_timeout), ``kernel_dir`` and ``proxy_problem`` (the text of ``gpu_proxy_problem``, empty when usable)."""
    found = []
    ca_bundle = str(inputs.get("ca_bundle") or "")
    if ca_bundle and not os.path.isfile(ca_bundle):
        found.append(MESSAGES["ca_bundle_missing"].text(ca_bundle=ca_bundle))
    found += [
        MESSAGES["index_without_scheme"].text(url=url)
        for url in inputs.get("index_urls") or []
        if not INDEX_URL.match(str(url))
    ]
    timeout = inputs.get("install_timeout")
    if not TIMEOUT.match(str(timeout)) or int(str(timeout)) < MIN_TIMEOUT:
        found.append(MESSAGES["install_timeout"].text(timeout=timeout))
    network = inputs.get("network_timeout", 120)
    if not TIMEOUT.match(str(network)) or int(str(network)) < 1:
        found.append(MESSAGES["network_timeout"].text(timeout=network))
    if not os.path.isabs(str(inputs.get("kernel_dir") or "")):
        found.append(MESSAGES["kernel_dir_relative"].text(kernel_dir=inputs.get("kernel_dir")))
    if inputs.get("proxy_problem"):
        found.append(str(inputs["proxy_problem"]))
    return found


def _lock_text(path: str) -> str | None:
    """A lock's text on the controller, or None where there is no such file."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def gpu_venv_lock_problems(stacks: list[dict], inputs: dict) -> list[str]:
    """Each stack's lock problem (``gpu_tf_lock_plan``); where there is none, each locked stack whose lock the
    wheelhouse contradicts or does not hold in full. ``inputs``: ``lock_dir``, ``package``, ``extras``,
    ``require_lock``, ``wheelhouse``, ``wheel_files`` (its wheels hashed, the ``artifact_sha256`` lookup's
    entries) and ``arch`` (the host's machine architecture, ``ansible_facts['architecture']``)."""
    locks = []
    found = []
    for stack in stacks:
        path = f"{inputs['lock_dir']}/{gpu_tf_lock_name(stack, inputs.get('package') or 'tensorflow')}"
        text = _lock_text(path)
        plan = tf_lock_plan(
            text,
            stack,
            path,
            inputs.get("package") or "tensorflow",
            inputs.get("extras"),
            _flag(inputs["require_lock"]),
        )
        found += [plan["problem"]] if plan["problem"] else []
        locks += [(path, text, stack)] if plan["locked"] else []
    if found or not inputs.get("wheelhouse"):
        return found
    return [problem for path, text, stack in locks for problem in _wheelhouse_problem(path, text, stack, inputs)]


def _wheelhouse_problem(path: str, text: str | None, stack: dict, inputs: dict) -> list[str]:
    """The wheelhouse's problem with one stack's lock: its altered wheels and the pins it has no wheel of for the
    stack's Python and the host's architecture (``inputs['arch']``), one text; none when it holds the whole lock."""
    python = python_series(str((stack.get("python") or {}).get("version") or ""))
    arch = str(inputs.get("arch") or "")
    gaps = gpu_lock_wheelhouse(text or "", inputs.get("wheel_files"), complete=True, python=python, arch=arch)
    if not gaps:
        return []
    altered = [gap for gap in gaps if not gap.startswith("no locked wheel of ")]
    missing = [gap[len("no locked wheel of ") :] for gap in gaps if gap not in altered]
    named = altered + ([f"no locked wheel of {', '.join(_some(missing, NAMED['wheelhouse_gaps']))}"] if missing else [])
    wheelhouse = str(inputs["wheelhouse"]).rstrip("/") or "/"
    need = {"lock": path, "dir": wheelhouse, "python": python or "<X.Y>", "arch": arch or "<arch>"}
    return [
        MESSAGES["wheelhouse_not_locked"].text(
            problems="; ".join(named),
            wheelhouse=wheelhouse,
            lock=os.path.basename(path),
            python=need["python"],
            arch=need["arch"],
            download=shlex.join(gpu_venv_download_argv(need, "python3")),
        )
    ]


def gpu_venv_plan(stacks: list[dict], state: dict) -> dict[str, dict[str, Any]]:
    """``tf_venv_plan``: for each stack, ``updated``'s entry (``{change, text}``, what the run did to a venv that
    was not current), or, where the run wrote a current venv's files (``bound``, that loop's registered
    results, each naming its stack), that it is current; then ``absent``'s entries (the stacks removed)."""
    updated = state.get("updated") or {}
    current = {
        result[result.get("ansible_loop_var") or "item"]["name"]
        for result in state.get("bound") or []
        if not result.get("skipped")
    }
    current_state = {"has_python": True, "change": False, "locked": True}
    plan = {}
    for stack in stacks:
        if stack["name"] in updated:
            plan[stack["name"]] = updated[stack["name"]]
        elif stack["name"] in current:
            plan[stack["name"]] = {"change": False, "text": gpu_venv_plan_text(stack, current_state)}
    plan.update(state.get("absent") or {})
    return plan


def gpu_venv_download_argv(need: dict, python: str) -> list[str]:
    """The controller's ``pip download`` of a lock's wheels (``need``: ``lock``, ``dir``, ``python``, ``arch``),
    every file checked against the lock's hashes, for the host's CPython and platform."""
    return [
        python,
        "-m",
        "pip",
        "download",
        "--dest",
        need["dir"],
        "--require-hashes",
        "--no-deps",
        "-r",
        need["lock"],
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        need["python"],
        "--progress-bar",
        "off",
    ] + [f"--platform={prefix}{need['arch']}" for prefix in PLATFORMS]


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
            "gpu_venv_check_problems": gpu_venv_check_problems,
            "gpu_venv_lock_problems": gpu_venv_lock_problems,
            "gpu_venv_plan": gpu_venv_plan,
            "gpu_venv_download_argv": gpu_venv_download_argv,
            "gpu_venv_message": gpu_venv_message,
        }
