# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Action plugin gpu_stacks: the stack model every role reads, built in one place.

It reads gpu_preflight's inputs as that role would (the host's variables, else the defaults its
``meta/argument_specs.yml`` documents), loads the version matrix and the artifact manifests on the
controller, asks the host in one module run (gpu_host_probe) for each stack's Python version and the stack
its default pointers serve now, resolves every stack (the filter gpu_stacks_resolve) and returns the model:
``gpu_preflight_resolved_stacks``, ``_default``, ``_pending_default``, ``_driver``, ``_absent`` and
``_held_back``, which playbooks/tasks/stacks.yml publishes (a module's ``ansible_facts`` would land in the
fact cache, not beside set_fact's facts). Documentation: plugins/modules/gpu_stacks.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.yaml import yaml_load
from ansible.plugins.action import ActionBase
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_stack import (
    gpu_stacks_resolve,
    serve_default,
    stacks_host,
)
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import documented_options
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.role_input import role_input

PROBE = "gpu_fleet.tf_hosts.gpu_host_probe"
GPU_FACTS = "gpu_fleet.tf_hosts.nvidia_gpu_facts"
ROLE = "gpu_preflight"
# gpu_preflight's inputs the model is built from, without the role's prefix.
INPUTS = (
    "stacks",
    "default_stack",
    "python",
    "matrix_file",
    "manifest_files",
    "manifest_overlays",
    "driver_version",
    "driver_install",
    "driver_method",
    "stack_registry",
)
ARGS = ArgumentSpecValidator(
    {
        "gpu_facts": {"type": "bool", "default": False},
        "python_version": {"type": "str"},
        "hold_back": {"type": "dict"},
    },
    mutually_exclusive=[("python_version", "hold_back")],
)
PYTHON_VERSION = "import platform; print(platform.python_version())"
FIX_PATHS = (
    "Fix the path in gpu_preflight_matrix_file, gpu_preflight_manifest_files or gpu_preflight_manifest_overlays "
    "(the sandbox's stand-in manifest is built by `make standins`)."
)


def read_inputs(variables: dict[str, Any], template: Callable[[Any], Any]) -> tuple[dict[str, Any], list[str]]:
    """gpu_preflight's inputs as that role reads them, ``{name without prefix: value}``, and what is wrong with
    their types (the role's own argument specification, which a play without the role does not check)."""
    names = [f"{ROLE}_{name}" for name in INPUTS]
    values = {name: role_input(name, variables, template) for name in names}
    specs = documented_options(ROLE)
    checked = ArgumentSpecValidator({name: specs[name] for name in names}).validate(values)
    problems = [f"{error} (gpu_preflight's inputs; fix it in the inventory)" for error in checked.error_messages]
    # The validator lets a null through; the model needs every input.
    problems += [
        f"{name} is null; leave it out for its default or set it (gpu_preflight's inputs)"
        for name in names
        if values[name] is None
    ]
    # The values as read: the roles read them so (a stack's keys left out stay left out).
    return {name[len(ROLE) + 1 :]: value for name, value in values.items()}, problems


def missing_files(inputs: dict[str, Any]) -> list[str]:
    """The matrix and manifests that are not files on the controller, read as ansible-playbook's folder sees them."""
    paths = [inputs["matrix_file"], *inputs["manifest_files"], *inputs["manifest_overlays"]]
    return [f"{path} does not exist on the controller. {FIX_PATHS}" for path in paths if not os.path.isfile(path)]


def load_yaml(path: str) -> Any:
    with open(os.path.realpath(path), encoding="utf-8") as handle:
        return yaml_load(handle)


def has_artifacts(path: str) -> bool:
    data = load_yaml(path)
    return isinstance(data, dict) and isinstance(data.get("artifacts"), dict)


def manifest_problems(paths: list[str]) -> list[str]:
    """The manifests without a mapping ``artifacts`` (an empty file, or the key misspelt)."""
    shape = "a manifest is {artifacts: {<file name>: {url, sha256, ...}}}, as data/artifacts.yml"
    return [f"{path} has no mapping 'artifacts': {shape}. {FIX_PATHS}" for path in paths if not has_artifacts(path)]


def merged_manifest(paths: list[str]) -> dict[str, Any]:
    """The manifests' artifacts, a later file's entry replacing an earlier one's; each names its file."""
    merged: dict[str, Any] = {}
    for path in paths:
        real = os.path.realpath(path)
        for name, entry in load_yaml(real)["artifacts"].items():
            merged[name] = dict(entry, manifest=real)
    return merged


def present_pythons(stacks: list[Any], default_python: str) -> list[str]:
    """Each present stack's interpreter, once (an absent stack's may be gone from the host already)."""
    pythons = [s.get("python", default_python) for s in stacks if isinstance(s, dict) and s.get("state") != "absent"]
    return list(dict.fromkeys(pythons))


def probe_args(pythons: list[str], registry: str) -> dict[str, Any]:
    """gpu_host_probe's arguments: the Pythons' versions and the registry's ``default`` link."""
    return {
        "stat": [f"{registry}/default"],
        "run": {f"python {python}": [python, "-c", PYTHON_VERSION] for python in pythons},
    }


def probed(probe: dict[str, Any], pythons: list[str], registry: str) -> tuple[dict[str, str], str]:
    """From a probe's result: each Python's version, and the stack the host serves (``default`` -> ``<stack>.env``)."""
    versions = {python: probe["run"][f"python {python}"]["stdout"].strip() for python in pythons}
    link = probe["stat"][f"{registry}/default"]
    current = os.path.basename(link["lnk_target"]).removesuffix(".env") if link.get("islnk") else ""
    return versions, current


def model(resolved: dict[str, Any], current: str) -> dict[str, Any]:
    """The published facts of a resolution, the host's current default served until the declared one verifies."""
    served = serve_default(resolved["stacks"], current)
    return {
        "gpu_preflight_resolved_stacks": served["stacks"],
        "gpu_preflight_resolved_default": served["default"],
        "gpu_preflight_pending_default": served["pending"],
        "gpu_preflight_held_back": [],
        "gpu_preflight_resolved_driver": resolved["driver"],
        "gpu_preflight_resolved_absent": resolved["absent"],
    }


def held_back(variables: dict[str, Any], hold_back: dict[str, str]) -> dict[str, Any]:
    """The published model less the stacks held back, the default pointers serving the same stack as before."""
    default = variables["gpu_preflight_resolved_default"]["name"]
    kept = [s for s in variables["gpu_preflight_resolved_stacks"] if s["name"] not in hold_back]
    served = serve_default(kept, default)
    before = list(variables.get("gpu_preflight_held_back") or [])
    return {
        "gpu_preflight_resolved_stacks": served["stacks"],
        "gpu_preflight_resolved_default": served["default"],
        "gpu_preflight_pending_default": served["pending"],
        "gpu_preflight_held_back": before + [{"name": name, "cause": cause} for name, cause in hold_back.items()],
        "gpu_preflight_resolved_driver": variables.get("gpu_preflight_resolved_driver"),
        "gpu_preflight_resolved_absent": variables.get("gpu_preflight_resolved_absent") or [],
    }


class ActionModule(ActionBase):
    """Resolves the pinned stacks and returns the stack model (``model``); changes nothing."""

    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        task_vars = dict(task_vars or {})
        args = ARGS.validate(self._task.args)
        if args.error_messages:
            return dict(result, failed=True, msg="gpu_stacks: " + " ".join(args.error_messages))
        options = args.validated_parameters
        if options["gpu_facts"] and options["python_version"] is not None:
            return dict(
                result,
                failed=True,
                msg="gpu_stacks: gpu_facts asks the host, python_version leaves it untouched; give one",
            )
        if options["hold_back"] is not None:
            return self._hold_back(result, task_vars, options["hold_back"])
        inputs, problems = read_inputs(task_vars, self._templar.template)
        problems = problems or missing_files(inputs)
        problems = problems or manifest_problems([*inputs["manifest_files"], *inputs["manifest_overlays"]])
        if problems:
            return dict(result, failed=True, msg=" ".join(problems))
        result["module_runs"] = 0
        if options["gpu_facts"]:
            gathered = self._gpu_facts(task_vars)
            result["module_runs"] += 1
            if gathered.get("failed"):
                return dict(result, **gathered)
            result["ansible_facts"] = gathered["ansible_facts"]
            task_vars["ansible_facts"] = dict(task_vars.get("ansible_facts") or {}, **gathered["ansible_facts"])
        pythons = present_pythons(inputs["stacks"], inputs["python"])
        if options["python_version"] is not None:
            versions, current = dict.fromkeys(pythons, options["python_version"]), ""
        else:
            args = probe_args(pythons, inputs["stack_registry"])
            probe = self._execute_module(module_name=PROBE, module_args=args, task_vars=task_vars)
            result["module_runs"] += 1
            if probe.get("failed"):
                return dict(result, **probe)
            versions, current = probed(probe, pythons, inputs["stack_registry"])
        return self._resolve(result, task_vars, inputs, versions, current)

    def _gpu_facts(self, task_vars: dict) -> dict:
        """nvidia_gpu_facts on the host, from the PCI bus gpu_preflight reads: the compute capabilities the
        stacks are checked against."""
        path = role_input(f"{ROLE}_pci_devices_path", task_vars, self._templar.template)
        return self._execute_module(module_name=GPU_FACTS, module_args={"pci_devices_path": path}, task_vars=task_vars)

    def _resolve(self, result: dict, task_vars: dict, inputs: dict, versions: dict, current: str) -> dict:
        pins = {
            "python_versions": versions,
            "default_python": inputs["python"],
            "driver_version": inputs["driver_version"],
            "driver_install": inputs["driver_install"],
            "driver_method": inputs["driver_method"],
            "current_default": current,
        }
        resolved = gpu_stacks_resolve(
            inputs["stacks"],
            load_yaml(inputs["matrix_file"]),
            merged_manifest([*inputs["manifest_files"], *inputs["manifest_overlays"]]),
            stacks_host(task_vars.get("ansible_facts") or {}, pins),
            inputs["default_stack"],
        )
        warnings = [w["cause"] for w in resolved["warnings"]]
        result.update(changed=False, resolution=resolved, warnings=warnings)
        if not resolved["ok"]:
            # Only the causes and fixes: a failed task's whole result is printed, and the GPU facts and the
            # resolution would bury them. The message reads as sentences; ``problems`` keeps one item per problem.
            kept = {key: value for key, value in result.items() if key not in ("ansible_facts", "resolution")}
            return dict(kept, failed=True, problems=resolved["messages"], msg=" ".join(resolved["messages"]))
        facts = model(resolved, current)
        said = f"{len(resolved['stacks'])} stacks resolved; the default pointers serve {facts['gpu_preflight_resolved_default']['name']}"
        return dict(result, model=facts, msg=said)

    def _hold_back(self, result: dict, task_vars: dict, hold_back: dict[str, str]) -> dict:
        if "gpu_preflight_resolved_stacks" not in task_vars:
            return dict(
                result,
                failed=True,
                msg="gpu_stacks: hold_back holds back stacks resolved earlier in the run; none were",
            )
        published = (
            "gpu_preflight_" + name
            for name in ("resolved_stacks", "resolved_default", "held_back", "resolved_driver", "resolved_absent")
        )
        facts = held_back({name: self._templar.template(task_vars.get(name)) for name in published}, hold_back)
        host = task_vars.get("inventory_hostname", "the host")
        said = (
            f"Held back on {host}, nothing of them is touched in this run, and the host fails at the end: "
            f"{', '.join(hold_back)}. The other stacks go on; the default stays "
            f"{facts['gpu_preflight_resolved_default']['name']}."
        )
        return dict(result, changed=False, module_runs=0, model=facts, msg=said, warnings=[said] if hold_back else [])
