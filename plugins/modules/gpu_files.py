#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Ansible module gpu_files: the host side of the action plugin plugins/action/gpu_files.py, which sends
it the files that differ; the documentation of both."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_files
short_description: Write several small files and symbolic links, with one round trip when they are current
description:
  - Writes each file of O(files) from its O(files[].content) or O(files[].src) with its mode and owner, like
    C(ansible.builtin.copy).
  - The files that differ are written on the host in one more round trip, in the given order, each into a
    temporary file beside it and then renamed over the old one, as C(ansible.builtin.copy) does. A file
    with O(files[].validate), and every file in check mode or diff mode, is written by C(ansible.builtin.copy)
    itself.
  - A C(copy) or C(template) task costs two round trips to the host even when nothing changes. This action
    hashes each file's content on the controller and looks at every file on the host in one run of
    M(gpu_fleet.tf_hosts.gpu_host_state); a host where every file is current costs that one round trip.
  - A O(files[].link) item makes a symbolic link instead, like C(ansible.builtin.file) with C(state=link) and
    C(force=true), when the path is not a link with that target as written. A file or link there is replaced
    in one rename, a folder is not.
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

import os  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402  (after the documentation, as validate-modules requires)
from ansible.module_utils.common.text.converters import to_bytes  # noqa: E402

TEMP_PREFIX = ".gpu_files."


def set_attributes(module: AnsibleModule, path: str, item: dict) -> None:
    """Owner (root unless named), group and mode, with AnsibleModule's own setters."""
    module.set_owner_if_different(path, item.get("owner", "root"), False)
    module.set_group_if_different(path, item.get("group", "root"), False)
    module.set_mode_if_different(path, item["mode"], False)


def make_folders(module: AnsibleModule, folder: str) -> None:
    """Each missing folder up to O(folder), root's 0755, as the action's C(file) task made it."""
    missing = []
    while folder and not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
        set_attributes(module, path, {"owner": "root", "group": "root", "mode": "0755"})


def write_file(module: AnsibleModule, item: dict) -> None:
    """The file's content into a temporary file beside it, moved over the old one in one rename (as
    ansible.builtin.copy does, through AnsibleModule.atomic_move), then its owner, group and mode."""
    dest = item["dest"]
    handle, temporary = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=os.path.dirname(dest))
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(to_bytes(item["content"], errors="surrogate_or_strict"))
        module.atomic_move(temporary, dest, keep_dest_attrs=False)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    set_attributes(module, dest, item)


def write_link(module: AnsibleModule, item: dict) -> None:
    """A symbolic link made beside the path and renamed over it: a file or link there is replaced in
    one step, a folder is not (ansible.builtin.file refuses it too)."""
    dest = item["dest"]
    if os.path.isdir(dest) and not os.path.islink(dest):
        module.fail_json(msg=f"{dest} is a folder; a symbolic link cannot replace it. Move the folder away.")
    temporary = os.path.join(os.path.dirname(dest), f"{TEMP_PREFIX}{os.path.basename(dest)}.{os.getpid()}")
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(item["link"], temporary)
    os.rename(temporary, dest)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True}}, supports_check_mode=True
    )
    # The action sends only the files that differ, each with its content (a controller file's too)
    # or its link, in order; items with validate go through ansible.builtin.copy instead.
    files = module.params["files"]
    if not module.check_mode:
        for item in files:
            try:
                make_folders(module, os.path.dirname(item["dest"]))
                (write_link if "link" in item else write_file)(module, item)
            except OSError as error:
                module.fail_json(msg=f"{item['dest']}: {error.strerror or error}", files={})
    module.exit_json(changed=bool(files), files={item["dest"]: {"changed": True} for item in files})


if __name__ == "__main__":
    main()
