#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""The documentation of the action plugin plugins/action/gpu_stacks.py, which builds the stack model."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_stacks
short_description: Resolve the pinned TensorFlow stacks of a host into the stack model every role reads
description:
  - Reads gpu_preflight's inputs as that role would - the host's variables, else the defaults its
    C(meta/argument_specs.yml) documents - (C(gpu_preflight_stacks), C(gpu_preflight_default_stack),
    C(gpu_preflight_python), C(gpu_preflight_matrix_file), C(gpu_preflight_manifest_files),
    C(gpu_preflight_manifest_overlays), C(gpu_preflight_driver_version), C(gpu_preflight_driver_install),
    C(gpu_preflight_driver_method), C(gpu_preflight_stack_registry)) and checks their types.
  - Loads the version matrix and the artifact manifests on the controller, reads each stack's Python version and
    the stack the host's default pointers serve (C(<registry>/default)) in one module run on the host, and resolves
    every stack (TensorFlow, Python, CUDA, cuDNN, driver; the filter P(gpu_fleet.tf_hosts.gpu_stacks_resolve#filter)).
    A stack that cannot be resolved fails the task, naming every problem with its cause and fix. The stacks'
    warnings (a shared toolkit's cuDNN raised, say) are the task's warnings.
  - Returns the model in RV(model); C(playbooks/tasks/stacks.yml) publishes it with C(ansible.builtin.set_fact)
    (a module's own facts would land in the fact cache, which may outlive the run). A newly declared default is
    not served until it verified; see RV(model).
  - Changes nothing.
version_added: "0.19.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  gpu_facts:
    description:
      - Gather the GPU facts first (the module M(gpu_fleet.tf_hosts.nvidia_gpu_facts), from
        C(gpu_preflight_pci_devices_path)), returned as the host's facts, and check each stack's wheel against the
        GPUs' compute capabilities.
    type: bool
    default: false
  python_version:
    description:
      - Take every stack's Python to be this version and do not touch the host (air-gap bundles).
    type: str
  hold_back:
    description:
      - Stack name to the cause. Instead of resolving, leave these stacks out of the model published earlier in
        the run (RV(model) without them, and with them in C(gpu_preflight_held_back)); the default pointers keep
        serving the same stack. A warning names them.
    type: dict
notes:
  - O(python_version) excludes O(hold_back) and a true O(gpu_facts); with O(hold_back), O(gpu_facts) is not used.
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Resolve the pinned stacks
  gpu_fleet.tf_hosts.gpu_stacks:
    gpu_facts: true
  register: stacks

- name: Publish the stack model
  ansible.builtin.set_fact:
    gpu_preflight_resolved_stacks: "{{ stacks.model.gpu_preflight_resolved_stacks }}"
    gpu_preflight_resolved_default: "{{ stacks.model.gpu_preflight_resolved_default }}"
"""

RETURN = r"""
model:
  description:
    - The stack model, by the names the roles read. C(gpu_preflight_resolved_stacks) - the resolved present
      stacks, each with C(default) (the stack the default pointers serve in this run) and C(declared_default);
      C(gpu_preflight_resolved_default) - the served stack (the host's current default until a newly declared one
      verified); C(gpu_preflight_pending_default) - the declared default while its switch waits, else null;
      C(gpu_preflight_resolved_driver) - C({version, runfile}) or null; C(gpu_preflight_resolved_absent) - what
      removing each C(state=absent) stack removes; C(gpu_preflight_held_back) - C([{name, cause}]).
  returned: success
  type: dict
module_runs:
  description: How many module runs on the host it took (the GPU facts, the probe), each a round trip.
  returned: when the stacks were resolved or could not be
  type: int
resolution:
  description: What the filter P(gpu_fleet.tf_hosts.gpu_stacks_resolve#filter) returned.
  returned: when the stacks were resolved
  type: dict
problems:
  description:
    - One message per problem - the stack's name, then the cause and the fix (no name for a problem of the whole
      host); the failure's C(msg) is these messages as one text.
  returned: when the stacks could not be resolved
  type: list
  elements: str
  sample:
    - 'tf2.12: TensorFlow 2.12.9 is not in the version matrix: the newest 2.12 release it knows is 2.12.1. ...'
"""
