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
    temporary file beside it that already has its owner, group, mode and SELinux context, then renamed
    over the old one, so a reader sees the old file or the new one, never a part. A file
    with O(files[].validate), and every file in check mode or diff mode, is written by C(ansible.builtin.copy)
    itself.
  - A C(copy) or C(template) task costs two round trips to the host even when nothing changes. This action
    hashes each file's content on the controller and looks at every file on the host in one run of
    M(gpu_fleet.tf_hosts.gpu_host_probe); a host where every file is current costs that one round trip.
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
  new_every_run:
    description:
      - Every file's content is new on every run (a record of the run, such as a metrics textfile with its time), so
        the action writes them without a look first, in one round trip. Where a file needs Ansible's copy (a
        validate command, check or diff mode, bytes that are not text) it looks as usual.
    type: bool
    default: false
    version_added: "0.19.0"
  looked:
    description:
      - The registered result of the role's own M(gpu_fleet.tf_hosts.gpu_host_probe) look, taken right before in the
        same play, with the paths P(gpu_fleet.tf_hosts.gpu_files_look#filter) names for O(files) among its C(stat) and
        C(checksum). The action then takes the files' state from it instead of looking itself, and a host whose files
        are current costs no round trip. A look that lacks a path, failed or was skipped is not used.
      - The action's; the module on the host never gets it.
    type: dict
    version_added: "0.19.0"
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
  - module: gpu_fleet.tf_hosts.gpu_host_probe
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
module_runs:
  description: The action's module runs on the host (its look, each batch, folder, link or copy), each a round trip.
  returned: always
  type: int
  sample: 0
"""

import grp  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402  (after the documentation, as validate-modules requires)
from ansible.module_utils.common.text.converters import to_bytes  # noqa: E402

TEMP_PREFIX = ".gpu_files."


def ownership(item: dict) -> tuple:
    """The item's uid, gid and mode as numbers, before anything is written: a name that does not
    resolve or a mode that is not octal stops the write with nothing changed."""
    owner, group = item.get("owner", "root"), item.get("group", "root")
    try:
        uid = pwd.getpwnam(owner).pw_uid
        gid = grp.getgrnam(group).gr_gid
    except KeyError as error:
        raise ValueError(f"no user {owner!r} or group {group!r} on the host") from error
    try:
        mode = int(item["mode"], 8)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"mode {item.get('mode')!r} is not an octal mode such as '0644'") from error
    return uid, gid, mode


def make_folders(folder: str) -> None:
    """Each missing folder up to O(folder), root's 0755, as the action's C(file) task made it."""
    missing = []
    while folder and not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
        os.chown(path, 0, 0)
        os.chmod(path, 0o755)


def replace(module: AnsibleModule, temporary: str, dest: str) -> None:
    """The prepared temporary file renamed over the path in one step (a reader sees the old file or the
    new one, never a part), with the old file's SELinux context, or the policy's for a new one."""
    if module.selinux_enabled():
        exists = os.path.lexists(dest)
        context = module.selinux_context(dest) if exists else module.selinux_default_context(dest)
        module.set_context_if_different(temporary, context, False)
    os.rename(temporary, dest)


def write_file(module: AnsibleModule, item: dict) -> None:
    """The file's content into a temporary file beside it that already has its owner, group and mode,
    then renamed over the old one (so the file never shows with other attributes)."""
    dest = item["dest"]
    uid, gid, mode = ownership(item)
    handle, temporary = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=os.path.dirname(dest))
    try:
        os.fchown(handle, uid, gid)
        os.fchmod(handle, mode)
        with os.fdopen(handle, "wb") as stream:
            stream.write(to_bytes(item["content"], errors="surrogate_or_strict"))
        replace(module, temporary, dest)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def write_link(module: AnsibleModule, item: dict) -> None:
    """A symbolic link made beside the path and renamed over it: a file or link there is replaced in
    one step, a folder is not (ansible.builtin.file refuses a folder that is not empty too)."""
    dest = item["dest"]
    if os.path.isdir(dest) and not os.path.islink(dest):
        raise ValueError("it is a folder; a symbolic link cannot replace it. Move the folder away")
    temporary = os.path.join(os.path.dirname(dest), f"{TEMP_PREFIX}{os.path.basename(dest)}.{os.getpid()}")
    if os.path.lexists(temporary):
        os.unlink(temporary)
    try:
        os.symlink(item["link"], temporary)
        os.rename(temporary, dest)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def main() -> None:
    # no_log: the host's log gets no copy of the files' contents (pip.conf may hold an index's credentials).
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True},
            "looked": {"type": "dict"},
            "new_every_run": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
        no_log=True,
    )
    # The action sends only the files that differ, each with its content (a controller file's too)
    # or its link, in order; items with validate go through ansible.builtin.copy instead.
    files = module.params["files"]
    written = {}
    for item in [] if module.check_mode else files:
        try:
            make_folders(os.path.dirname(item["dest"]))
            (write_link if "link" in item else write_file)(module, item)
        except Exception as error:
            # Every failure (a rename's, a lookup's, a bad mode's) names the file and what was written before it.
            message = error.strerror if isinstance(error, OSError) and error.strerror else error
            module.fail_json(msg=f"{item['dest']}: {message}", changed=bool(written), files=written)
        written[item["dest"]] = {"changed": True}
    module.exit_json(changed=bool(files), files={item["dest"]: {"changed": True} for item in files})


if __name__ == "__main__":
    main()
