#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""The documentation of the action plugin plugins/action/gpu_option_checks.py, which runs on the controller only."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_option_checks
short_description: Check the options of the later phases' roles before the first change
description:
  - Checks the options of each role in O(roles) with the values the role would read - the host's variables, else
    the defaults its C(meta/argument_specs.yml) documents, templated - against that argument specification (types,
    choices, required), as Ansible checks a role's inputs when the role starts, with the same validator.
  - The options a rule of the role reads are checked against that rule instead, each named once - C(gpu_verify)'s
    and C(gpu_health)'s and C(gpu_slurm)'s (the filters C(gpu_verify_option_problems), C(gpu_health_option_problems) and C(gpu_slurm_option_problems)) and
    C(cuda_toolkit)'s installer time limit (C(cuda_toolkit_install_timeout), at least 60 seconds).
  - C(gpu_slurm)'s rule also reads C(gpu_slurm_enabled), C(gpu_slurm_autodetect) and C(gpu_mig)'s inputs
    C(gpu_mig_enabled) and C(gpu_mig_layout) (their types are checked by their own specifications) - a layout that
    puts GPUs in MIG mode on a Slurm node needs C(gpu_slurm_autodetect).
  - The files C(gpu_env) writes on the host (C(gpu_env_profile_path), C(gpu_env_ld_conf_path),
    C(gpu_env_sudoers_path)) must be absolute paths; a path type alone takes any word.
  - Every variable of the host that starts with the name of one of the collection's roles, then C(_), and is no
    option of any entry point of that role is named too, with the closest option's name (C(nvidia_driver_versoin) -
    did you mean C(nvidia_driver_version)?), as Ansible itself ignores a variable no task reads. Internal names (C(__<role>_...)) and the names the run itself
    sets (the facts the roles publish, the fleet report's failure notes, site.yml's play variables, the custom stat
    C(gpu_verify_report_summary) an earlier job of an AWX workflow passes on) are left alone. This is done for
    every role, whichever O(roles) names.
  - Fails naming every option that breaks its specification or rule, and every misspelt variable, with the fix,
    all at once.
  - Preflight (C(playbooks/tasks/checks.yml)) runs it for every phase after it, so that a bad option of a later
    phase stops C(site.yml) before the driver is touched; the installers' C(check) entry points there skip their
    own validation of the same options. A required option left out (C(gpu_verify_expected_gpu_count)) is named
    as not set.
  - Runs on the controller only; changes nothing.
version_added: "0.19.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  roles:
    description:
      - The roles whose options to check.
    type: list
    elements: str
    choices: [nvidia_driver, cuda_toolkit, cudnn, gpu_env, tf_venv, gpu_health, gpu_verify, gpu_mig, gpu_containers, gpu_slurm]
    required: true
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
- name: Check the options of the driver, CUDA, cuDNN, environment, venv, health check and verification roles
  gpu_fleet.tf_hosts.gpu_option_checks:
    roles: [nvidia_driver, cuda_toolkit, cudnn, gpu_env, tf_venv, gpu_health, gpu_verify]

- name: Check the verification options only
  gpu_fleet.tf_hosts.gpu_option_checks:
    roles: [gpu_verify]
"""

RETURN = r"""
problems:
  description:
    - One message per option that breaks its specification or rule, naming the option, what is wrong and the fix,
      and one per variable that starts with a role's name and is no option of it.
  returned: always
  type: list
  elements: str
  sample: ["gpu_verify_timeout is 0; it must be a number of seconds above 0. Fix it in the inventory or on the -e command line."]
"""
