#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Ansible module gpu_files: documentation of the action plugin plugins/action/gpu_files.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_files
short_description: Write several small files and symbolic links, with one round trip when they are current
description:
  - Writes each file of O(files) from its O(files[].content) or O(files[].src) with its mode and owner, like
    C(ansible.builtin.copy), which it runs for each file that differs.
  - A C(copy) or C(template) task costs two round trips to the host even when nothing changes. This action
    hashes each file's content on the controller and looks at every file on the host in one run of
    M(gpu_fleet.tf_hosts.gpu_host_state); a host where every file is current costs that one round trip.
  - A O(files[].link) item makes a symbolic link instead, like C(ansible.builtin.file) with C(state=link) and
    C(force=true), which it runs when the path is not a link with that target as written.
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
      link:
        description: Make O(files[].dest) a symbolic link to this target, written as given (a relative
          target is relative to the link's folder). Give this instead of O(files[].content) and O(files[].src);
          O(files[].mode), O(files[].owner), O(files[].group) and O(files[].validate) do not apply.
        type: str
        version_added: "0.15.0"
      mode:
        description: The file's mode, a quoted octal string such as C("0644"). Required for a file.
        type: str
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

- name: List the stack for tf-stack, in one round trip with its environment file
  gpu_fleet.tf_hosts.gpu_files:
    files:
      - dest: /opt/tensorflow/2.12/tf-stack.env
        content: "CUDA_HOME=/usr/local/cuda-11.8\n"
        mode: "0644"
      - dest: /etc/tf-stacks/tf2.12.env
        link: /opt/tensorflow/2.12/tf-stack.env
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
