# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Action plugin gpu_option_checks: the options of the roles of a run's later phases, checked before its first
change.

Each role named in ``roles`` has its options checked with the values the host has for them (its variables, else
the defaults the role's ``meta/argument_specs.yml`` documents, templated): against that argument specification
(types, choices, required), as Ansible checks a role's inputs when the role starts, and, for the options a rule
of the role reads (gpu_verify's and gpu_health's ``<role>_option_problems``, cuda_toolkit's installer time
limit), against that rule instead. A variable that starts with the name of one of the collection's roles and is no
option of that role (a misspelling, which Ansible would ignore) is named too, with the closest option's name. Every
problem of every role is named at once. It runs on the controller only. Documentation:
plugins/modules/gpu_option_checks.py.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from collections.abc import Callable, Iterable
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.yaml import yaml_load
from ansible.plugins.action import ActionBase
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_cuda, gpu_health, gpu_slurm, gpu_verify
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import (
    collection_file,
    documented_options,
    option_names,
    role_of,
)
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.role_input import role_input

# The roles of site.yml's phases after preflight, in their order: preflight checks their options.
ROLES = (
    "nvidia_driver",
    "cuda_toolkit",
    "cudnn",
    "gpu_env",
    "tf_venv",
    "gpu_health",
    "gpu_verify",
    "gpu_mig",
    "gpu_containers",
    "gpu_slurm",
)
# The roles with rules of their own beyond their argument specification: the options the rules read and the rules.
RULES: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], list[str]]]] = {
    "cuda_toolkit": (gpu_cuda.OPTIONS, gpu_cuda.gpu_cuda_option_problems),
    "gpu_verify": (gpu_verify.OPTIONS, gpu_verify.gpu_verify_option_problems),
    "gpu_health": (gpu_health.OPTIONS, gpu_health.gpu_health_option_problems),
    "gpu_slurm": (gpu_slurm.OPTIONS, gpu_slurm.gpu_slurm_option_problems),
}
# The inputs a role's rule reads besides the options it checks (their own specifications check their types).
READS: dict[str, tuple[str, ...]] = {"gpu_slurm": gpu_slurm.READS}
# Files a role writes on the host, whose paths its tasks take as they are: absolute, or the host is changed before
# the role finds out (gpu_host_probe refuses a relative path, late in the run).
HOST_PATHS = {
    "gpu_env": ("gpu_env_profile_path", "gpu_env_ld_conf_path", "gpu_env_sudoers_path"),
    "gpu_containers": ("gpu_containers_cdi_dir",),
}
# The names that start with a role's name, are no option of it, and may still be among a host's variables (the facts
# the roles publish, the fleet report's notes, ...): never taken for a misspelt option.
RUN_VARIABLES = "data/run_variables.yml"


def argument_problems(args: dict[str, Any]) -> list[str]:
    """What is wrong with the task's arguments: ``roles`` is a list of roles this action knows."""
    roles = args.get("roles")
    if set(args) - {"roles"} or not isinstance(roles, list) or not roles:
        return [f"gpu_option_checks takes one option, roles: a list of some of {', '.join(ROLES)}"]
    return [
        f"gpu_option_checks does not check the options of the role {role!r} (it checks: {', '.join(ROLES)})"
        for role in roles
        if role not in ROLES
    ]


def option_values(names: tuple[str, ...], variables: dict[str, Any], template: Callable[[Any], Any]) -> dict[str, Any]:
    """``{name: value}`` as the role would read it: the host's variable, else the role's documented default
    (which may refer to another role's input), templated; none where neither is there (not set)."""
    values = {}
    for name in names:
        try:
            values[name] = role_input(name, variables, template)
        except AnsibleLookupError:
            values[name] = None
    return values


def spec_problems(role: str, values: dict[str, Any], specs: dict[str, Any]) -> list[str]:
    """What breaks ``role``'s argument specification (``specs``, its entry point main) among ``values``, an
    option left out where it is not set; each message with where to fix it."""
    given = {name: value for name, value in values.items() if name in specs and value is not None}
    checked = ArgumentSpecValidator(specs).validate(given)
    return [
        f"{error} ({role}'s options; fix it in the inventory or on the -e command line)."
        for error in checked.error_messages
    ]


def host_path_problems(role: str, values: dict[str, Any], specs: dict[str, Any]) -> list[str]:
    """The options of ``role`` in HOST_PATHS whose value is not an absolute path, each with its default as the fix."""
    return [
        f"{name} is {values.get(name)}; it must be an absolute path on the host. Set it to "
        f"{specs[name].get('default')} (the default) or another absolute path."
        for name in HOST_PATHS.get(role, ())
        if not (isinstance(values.get(name), str) and values[name].startswith("/"))
    ]


def role_problems(role: str, variables: dict[str, Any], template: Callable[[Any], Any]) -> list[str]:
    """Every problem of ``role``'s options: its rules where it has them, its argument specification for the rest,
    and the host paths it takes as they are."""
    specs = documented_options(role)
    names, rule = RULES.get(role, ((), None))
    reads = tuple(name for name in READS.get(role, ()) if name not in specs)
    values = option_values(tuple(specs) + reads, variables, template)
    problems = spec_problems(role, values, {name: spec for name, spec in specs.items() if name not in names})
    if rule is not None:
        problems += rule({name: values.get(name) for name in names + READS.get(role, ())})
    return problems + host_path_problems(role, values, specs)


def owner(name: str) -> str | None:
    """The role whose name, then ``_``, starts ``name`` (the longest such); none for another name."""
    try:
        return role_of(name)
    except AnsibleLookupError:
        return None


def closest(name: str, role: str) -> str | None:
    """The option of ``role`` whose name after the role's prefix is closest to ``name``'s, when close enough: over
    the whole names, the shared prefix made unrelated names look alike (nvidia_driver_branch, "did you mean
    nvidia_driver_version?"), and another role's option is no likely meaning of a name under this role's."""
    by_rest = {option[len(role) + 1 :]: option for option in option_names(role)}
    found = difflib.get_close_matches(name[len(role) + 1 :], sorted(by_rest), n=1, cutoff=0.75)
    return by_rest[found[0]] if found else None


def unknown_variable(name: str, role: str) -> str:
    """The message for ``name``, which starts with ``role``'s name and is no option of it: the closest option
    (:func:`closest`) as the likely meaning."""
    close = closest(name, role)
    meaning = f" (did you mean {close}?)" if close else f" (its options: roles/{role}/README.md)"
    return (
        f"{name} is no option of the role {role}, so it would change nothing{meaning}. Correct its name, or remove "
        "it from the inventory or the -e command line; if another tool reads it (NVIDIA's nvidia.nvidia_driver role "
        "has nvidia_driver_* names of its own), list it in gpu_preflight_foreign_variables."
    )


@functools.lru_cache(maxsize=1)
def run_variables() -> frozenset[str]:
    """The names in RUN_VARIABLES."""
    with open(collection_file(RUN_VARIABLES), encoding="utf-8") as handle:
        return frozenset(yaml_load(handle)["run_variables"])


def unknown_variables(names: Iterable[str], foreign: Iterable[str] = ()) -> list[str]:
    """A message for each of ``names`` (a host's variables) that starts with a role's name and is neither an option
    of that role, nor a name the run itself sets (RUN_VARIABLES), nor one that ``foreign`` (names or shell patterns:
    gpu_preflight_foreign_variables) gives to another tool; internal names (``__<role>_``) are left alone."""
    known = run_variables()
    patterns = [str(pattern) for pattern in foreign]
    problems = []
    for name in sorted(name for name in names if isinstance(name, str) and name not in known):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            continue
        role = owner(name)
        if role is not None and name not in option_names(role):
            problems.append(unknown_variable(name, role))
    return problems


class ActionModule(ActionBase):
    """Fails naming every option that breaks its specification or rule; changes nothing."""

    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        problems = argument_problems(self._task.args)
        if problems:
            return dict(result, failed=True, msg=" ".join(problems))
        foreign = self._templar.template(task_vars.get("gpu_preflight_foreign_variables") or [])
        problems += unknown_variables(task_vars, foreign if isinstance(foreign, list) else [])
        for role in self._task.args["roles"]:
            problems += role_problems(role, task_vars, self._templar.template)
        if problems:
            return dict(result, failed=True, changed=False, problems=problems, msg=" ".join(problems))
        roles = ", ".join(self._task.args["roles"])
        return dict(
            result, changed=False, problems=[], msg=f"The options of {roles} keep their specifications and rules"
        )
