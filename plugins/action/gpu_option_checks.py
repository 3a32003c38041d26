# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Action plugin gpu_option_checks: the option rules of the roles of a run's last phase, checked before its
first change.

Each role named in ``roles`` has its options checked against their rules (the filter
``<role>_option_problems`` that the role itself applies) with the values the host has for them: its
variables, else the defaults the role's ``meta/argument_specs.yml`` documents. Every problem of every role
is named at once. It runs on the controller only. Documentation: plugins/modules/gpu_option_checks.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.action import ActionBase
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_health, gpu_verify
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.role_input import role_input

# Each role's checked options and its rule filter.
RULES: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], list[str]]]] = {
    "gpu_verify": (gpu_verify.OPTIONS, gpu_verify.gpu_verify_option_problems),
    "gpu_health": (gpu_health.OPTIONS, gpu_health.gpu_health_option_problems),
}


def argument_problems(args: dict[str, Any]) -> list[str]:
    """What is wrong with the task's arguments: ``roles`` is a list of roles this action knows."""
    roles = args.get("roles")
    if set(args) - {"roles"} or not isinstance(roles, list) or not roles:
        return [f"gpu_option_checks takes one option, roles: a list of some of {', '.join(RULES)}"]
    return [
        f"gpu_option_checks has no option rules for the role {role!r} (it has: {', '.join(RULES)})"
        for role in roles
        if role not in RULES
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


class ActionModule(ActionBase):
    """Fails naming every option that breaks its rule; changes nothing."""

    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        problems = argument_problems(self._task.args)
        if problems:
            return dict(result, failed=True, msg=" ".join(problems))
        for role in self._task.args["roles"]:
            names, rule = RULES[role]
            problems += rule(option_values(names, task_vars, self._templar.template))
        if problems:
            return dict(result, failed=True, changed=False, problems=problems, msg=" ".join(problems))
        roles = " and ".join(self._task.args["roles"])
        return dict(result, changed=False, problems=[], msg=f"The options of {roles} keep their rules")
