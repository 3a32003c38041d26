# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""A role's input as a task of that role reads it, for the action plugins whose options left out stand for
another role's inputs (gpu_artifact, gpu_run_lock) or that check a role's options (gpu_option_checks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import documented_default

try:  # ansible-core 2.19 and later template only what is marked as coming from a trusted template
    from ansible.template import trust_as_template
except ImportError:  # earlier releases template any string

    def trust_as_template(value: Any) -> Any:
        return value


def trusted(value: Any) -> Any:
    """``value`` with every string in it marked as a trusted template, as the role's own file would be."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trusted(item) for item in value]
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    return value


def role_input(variable: str, variables: dict[str, Any], template: Callable[[Any], Any]) -> Any:
    """``variable`` as the host has it, else the default its role documents (which may refer to another
    role's input), templated with ``template`` (the task's templar). Raises AnsibleLookupError where the
    host has no value and the role documents no default."""
    if variable in variables:
        return template(variables[variable])
    default = documented_default(variable)
    return template(trusted(default))
