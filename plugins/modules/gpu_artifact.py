#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Documentation of the action plugin gpu_artifact (plugins/action/gpu_artifact.py); it runs on the
controller and has no module code of its own."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_artifact
short_description: Make one pinned NVIDIA file present in the host's artifact cache, or remove it
description:
  - The installers (roles nvidia_driver, cuda_toolkit, cudnn) ask for their runfile or archive by name; the
    file lands in C(<host_cache_dir>/<subdir>/<file>) on the host and RV(path) says where.
  - O(state=present) looks at the cache folder and the file on the host in one round trip, the file hashed
    with sha256 there. Only where the host's copy is not the pinned file (O(artifact.sha256)) is the
    controller's copy (C(<controller_dir>/<file>)) pushed, with C(ansible.builtin.copy), and hashed on the
    host again; a pushed copy that differs from its pin is removed and the task fails, naming the file,
    both checksums, the cause and the fix. The folder is made root's C(0700), the file root's C(0600), each
    only where it differs.
  - A host copy that matches the pin needs nothing from the controller. Before a push the controller's copy is
    checked against the same pin (hashed once while unchanged, with the cache of the lookup
    P(gpu_fleet.tf_hosts.artifact_sha256#lookup)); a missing or wrong copy stops the task before the host is
    touched, naming the controller's file and the fix, since a run of one phase or tag has not had gpu_artifacts
    check it.
  - O(state=absent) removes the file after a verified install, unless O(keep_cache) is true. It removes only a
    file that can be there - one that this run pushed (O(pushed)) or that gpu_preflight found in the cache
    (O(cache_files)) - or, where what the cache holds is unknown, always; a converged host whose cache is
    empty costs no round trip.
  - Check mode and diff mode work as in C(ansible.builtin.file) and C(ansible.builtin.copy); in check mode
    nothing is pushed, so nothing is hashed after the push.
version_added: "0.19.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  artifact:
    description:
      - The artifact's record from the manifest, as the stack model resolved it (for example
        C(gpu_preflight_resolved_driver.runfile), a stack's C(cuda_toolkit.runfile) or C(cudnn.archive)).
    type: dict
    required: true
    suboptions:
      file:
        description: The file's name, on the controller and in the host cache.
        type: str
        required: true
      sha256:
        description: The pinned sha256 of the file, 64 hex digits. Required for O(state=present).
        type: str
  subdir:
    description: The folder inside the host cache, C(<component>/<version>) (for example C(cuda_toolkit/11.8.0)).
    type: str
    required: true
  state:
    description: V(present) makes the pinned file present in the host cache; V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  controller_dir:
    description:
      - The controller's folder holding NVIDIA's files under their real names. Used only when a push is needed.
      - Left out, gpu_artifacts' input C(gpu_artifacts_controller_dir) of the host.
    type: path
  host_cache_dir:
    description:
      - The host's artifact cache.
      - Left out, gpu_artifacts' input C(gpu_artifacts_host_cache_dir) of the host, else its documented default
        (C(/var/cache/gpu-artifacts)).
    type: path
  keep_cache:
    description:
      - With O(state=absent), keep the file.
      - Left out, gpu_artifacts' input C(gpu_artifacts_keep_cache) of the host, else its documented default
        (V(false)).
    type: bool
  cache_files:
    description:
      - With O(state=absent), the files found in the host cache before this run's changes
        (C(gpu_preflight_host_cache_files)). Left out, what the cache holds is unknown and the file is removed.
    type: list
    elements: str
  pushed:
    description:
      - With O(state=absent), the RV(path) a O(state=present) task of this run returned; the file is removed
        when it is that one, even when O(cache_files) did not list it.
    type: str
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
    support: full
  platform:
    platforms: posix
notes:
  - The options left out take the values gpu_artifacts itself reads, so a role run on its own under its tag
    finds the same cache as a full run.
seealso:
  - module: ansible.builtin.copy
  - module: gpu_fleet.tf_hosts.gpu_host_probe
"""

EXAMPLES = r"""
- name: Push the CUDA runfile
  gpu_fleet.tf_hosts.gpu_artifact:
    artifact: "{{ stack.cuda_toolkit.runfile }}"
    subdir: "cuda_toolkit/{{ stack.cuda_toolkit.version }}"
  register: runfile

- name: Run it
  ansible.builtin.command:
    argv: [sh, "{{ runfile.path }}", --silent, --toolkit]
  changed_when: true

- name: Remove the runfile from the host cache
  gpu_fleet.tf_hosts.gpu_artifact:
    artifact: "{{ stack.cuda_toolkit.runfile }}"
    subdir: "cuda_toolkit/{{ stack.cuda_toolkit.version }}"
    state: absent
    cache_files: "{{ gpu_preflight_host_cache_files | default(omit) }}"
    pushed: "{{ runfile.path | default('') }}"
"""

RETURN = r"""
path:
  description: Where the file is (or was) in the host cache, C(<host_cache_dir>/<subdir>/<file>).
  returned: always
  type: str
  sample: /var/cache/gpu-artifacts/cuda_toolkit/11.8.0/cuda_11.8.0_520.61.05_linux.run
"""
