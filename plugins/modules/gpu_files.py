#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Ansible module gpu_files: documentation of the action plugin plugins/action/gpu_files.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_files
short_description: Write several small files, with one round trip when they are current
description:
  - Writes each file of O(files) from its O(files[].content) or O(files[].src) with its mode and owner, like
    C(ansible.builtin.copy), which it runs for each file that differs.
  - A C(copy) or C(template) task costs two round trips to the host even when nothing changes. This action
    hashes each file's content on the controller and looks at every file on the host in one run of
    M(gpu_fleet.tf_hosts.gpu_host_state); a host where every file is current costs that one round trip.
  - A missing destination folder is made, root's C(0755), before the first file that goes into it.
  - Check mode and diff mode work as in C(ansible.builtin.copy).
version_added: "0.13.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  files:
    description:
      - The files to write.
    type: list
    elements: dict
    required: true
    suboptions:
      dest:
        description: Absolute path of the file on the host.
        type: path
        required: true
      content:
        description: The file's text. Give this or O(files[].src).
        type: str
      src:
        description: A file on the controller, searched as C(ansible.builtin.copy) searches it (the role's
          C(files) folder first). Give this or O(files[].content).
        type: path
      mode:
        description: The file's mode, a quoted octal string such as C("0644").
        type: str
        required: true
      owner:
        description: The file's owner.
        type: str
        default: root
      group:
        description: The file's group.
        type: str
        default: root
      validate:
        description: A command that checks the new file before it replaces the old one, C(%s) for its path,
          as in C(ansible.builtin.copy).
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
seealso:
  - module: ansible.builtin.copy
  - module: gpu_fleet.tf_hosts.gpu_host_state
"""

EXAMPLES = r"""
- name: Put the toolkit on PATH for login shells and on sudo's secure_path
  gpu_fleet.tf_hosts.gpu_files:
    files:
      - dest: /etc/profile.d/gpu-env.sh
        content: "{{ lookup('ansible.builtin.template', 'profile.sh.j2') }}"
        mode: "0644"
      - dest: /etc/sudoers.d/gpu-env
        content: "{{ lookup('ansible.builtin.template', 'sudoers.j2') }}"
        mode: "0440"
        validate: visudo -cf %s
"""

RETURN = r"""
files:
  description: One entry per file, keyed by its path, C({changed}).
  returned: always
  type: dict
  sample: {"/etc/profile.d/gpu-env.sh": {"changed": false}}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402  (after the documentation, as validate-modules requires)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True}}, supports_check_mode=True
    )
    module.fail_json(msg="gpu_files runs as an action plugin on the controller (plugins/action/gpu_files.py).")


if __name__ == "__main__":
    main()
