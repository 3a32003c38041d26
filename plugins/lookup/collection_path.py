# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Lookup plugin: absolute paths of files shipped in this collection, and the documented
defaults of its roles' inputs."""

from __future__ import annotations

DOCUMENTATION = r"""
name: collection_path
author: gpu-fleet maintainers (!UNKNOWN)
version_added: "0.9.0"
short_description: Paths of data shipped in the gpu_fleet.tf_hosts collection
description:
  - Returns the absolute path of each term, a path relative to the collection's root
    (C(data/version_matrix.yml), C(files/verify)). The same lookup works from a clone of the
    repository and from an installed copy, so roles never reach outside themselves with
    C(role_path/../..).
  - With O(default_of=true), each term is instead a role input (C(cuda_toolkit_tmpdir)) and the
    result is its default as documented in that role's C(meta/argument_specs.yml). A role that
    must know another role's setting reads it as
    C(cuda_toolkit_tmpdir | default(lookup(..., 'cuda_toolkit_tmpdir', default_of=true))), so
    the value is written once, in the owning role.
options:
  _terms:
    description: Paths relative to the collection root, or role input names with O(default_of).
    type: list
    elements: str
    required: true
  default_of:
    description: Look up the documented default of a role input instead of a path.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Load the version matrix
  ansible.builtin.include_vars:
    file: "{{ lookup('gpu_fleet.tf_hosts.collection_path', 'data/version_matrix.yml') }}"
    name: matrix

- name: The CUDA installer's scratch folder, as cuda_toolkit sees it
  ansible.builtin.debug:
    msg: "{{ cuda_toolkit_tmpdir | default(lookup('gpu_fleet.tf_hosts.collection_path', 'cuda_toolkit_tmpdir', default_of=true)) }}"
"""

RETURN = r"""
_raw:
  description: One absolute path (or one default value) per term.
  type: list
  elements: raw
"""

import copy  # noqa: E402  (imports follow the documentation blocks, as ansible-test validate-modules requires)
import functools  # noqa: E402
import os  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.module_utils.common.yaml import yaml_load  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

# plugins/lookup/collection_path.py -> the collection root.
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collection_file(relative: str, root: str = COLLECTION_ROOT) -> str:
    """Absolute path of ``relative`` inside the collection; it must exist and stay inside."""
    path = os.path.normpath(os.path.join(root, relative))
    if os.path.commonpath([path, root]) != root or not os.path.exists(path):
        raise AnsibleLookupError(f"{relative!r} is not a file of the gpu_fleet.tf_hosts collection ({root})")
    return path


def role_of(variable: str, root: str = COLLECTION_ROOT) -> str:
    """The role that owns ``variable``: the longest role name that prefixes it."""
    roles = sorted(role_names(root), key=len, reverse=True)
    owner = next((role for role in roles if variable.startswith(role + "_")), None)
    if owner is None:
        raise AnsibleLookupError(f"{variable!r} does not start with the name of a role of gpu_fleet.tf_hosts")
    return owner


@functools.lru_cache(maxsize=32)
def _argument_specs(path: str, mtime_ns: int) -> dict:
    """The entry points of one ``argument_specs.yml``, parsed once per version of the file: a task templates a
    variable each time it is read, so one task may ask many times."""
    del mtime_ns  # part of the cache key only
    with open(path, encoding="utf-8") as handle:
        return yaml_load(handle)["argument_specs"]


def _main_options(path: str, mtime_ns: int) -> dict:
    """The options of entry point main in one ``argument_specs.yml``."""
    return _argument_specs(path, mtime_ns)["main"]["options"]


def role_names(root: str = COLLECTION_ROOT) -> list[str]:
    """The collection's roles, by name."""
    return sorted(os.listdir(os.path.join(root, "roles")))


def option_names(role: str, root: str = COLLECTION_ROOT) -> frozenset[str]:
    """Every option of every entry point of ``role`` in its ``meta/argument_specs.yml``."""
    path = os.path.join(root, "roles", role, "meta", "argument_specs.yml")
    entry_points = _argument_specs(path, os.stat(path).st_mtime_ns).values()
    return frozenset(name for entry in entry_points for name in entry.get("options") or {})


def documented_options(role: str, root: str = COLLECTION_ROOT) -> dict:
    """The options of ``role``'s entry point main in its ``meta/argument_specs.yml`` (a copy)."""
    path = os.path.join(root, "roles", role, "meta", "argument_specs.yml")
    return copy.deepcopy(_main_options(path, os.stat(path).st_mtime_ns))


def documented_default(variable: str, root: str = COLLECTION_ROOT) -> object:
    """Default of ``variable`` in its role's ``meta/argument_specs.yml`` (entry point main)."""
    role = role_of(variable, root)
    path = os.path.join(root, "roles", role, "meta", "argument_specs.yml")
    options = _main_options(path, os.stat(path).st_mtime_ns)
    if variable not in options or "default" not in options[variable]:
        raise AnsibleLookupError(f"role {role} documents no default for {variable}")
    return copy.deepcopy(options[variable]["default"])


class LookupModule(LookupBase):
    """``lookup('gpu_fleet.tf_hosts.collection_path', term, ..., default_of=false)``."""

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if self.get_option("default_of"):
            return [documented_default(str(term)) for term in terms]
        return [collection_file(str(term)) for term in terms]
