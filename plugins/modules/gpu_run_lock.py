#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Module gpu_run_lock: the host's side of the run lock (the action plugin of the same name decides)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_run_lock
short_description: Take or give back the host's run lock, so that one provisioning run changes a host at a time
description:
  - The host keeps one lock file (O(path)) holding the record of the run that holds it, as JSON. Taking
    it, replacing a stale holder and giving it back each happen under an exclusive C(flock) of
    C(<path>.guard) on the host, so two runs that arrive together cannot both take it.
  - The action plugin of the same name runs this module, decides whether a holder is stale (its
    controller process is gone, or the host rebooted since it took the lock) and waits for a live
    one. Called as a task, it is that action.
  - The lock is the run's bookkeeping, not the host's configuration; the task never reports a change.
version_added: "0.19.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  path:
    description:
      - The lock file on the host. Its folder is made (root's C(0755)) where missing.
      - Left out, the action takes gpu_preflight's input C(gpu_preflight_run_lock_path) (its value for the host,
        else its documented default), so a playbook takes the run lock that gpu_preflight documents.
    type: path
  state:
    description: V(present) takes the lock (and waits for a live holder); V(absent) gives it back.
    type: str
    choices: [present, absent]
    default: present
  wait:
    description:
      - How long, in seconds, a run waits for a live holder before it stops. V(0) stops at once.
      - Left out, C(gpu_preflight_run_lock_wait) (300 unless set).
      - Action plugin only.
    type: int
  max_age:
    description:
      - Seconds (at least 1) after which any holder is stale, whatever its controller (a holder on another
        controller cannot be looked at otherwise). Each install step of the roles stops after its own time limit.
      - Left out, C(gpu_preflight_run_lock_max_age) (43200 unless set).
      - Action plugin only.
    type: int
  token:
    description:
      - With O(state=absent), the token of the holding run (the C(token) in RV(owner) when it took the
        lock); the file is removed only while it holds that token. Without it nothing is given back.
      - Left out, the token in C(gpu_preflight_run_lock), the take's registered result (register it under
        that name, as C(playbooks/tasks/checks.yml) does).
    type: str
  record:
    description: Set by the action plugin - the record of this run that O(state=present) writes.
    type: dict
  replace:
    description: Set by the action plugin - the token of a stale holder that O(state=present) may replace.
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
    details: Under check mode nothing is taken or given back (C(--check) changes nothing).
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - A stale holder is recognised only where that is certain - the host rebooted since the lock was taken,
    or the holding run's C(ansible-playbook) process on this same controller is gone, or the lock is older
    than O(max_age). A holder on another controller is otherwise waited for (O(wait)); the message then names
    it, and how to clear it when that run is gone.
"""

EXAMPLES = r"""
- name: Take the run lock before any change (gpu_preflight's lock file, wait and max age)
  gpu_fleet.tf_hosts.gpu_run_lock:
    state: present
  register: gpu_preflight_run_lock

- name: Give it back at the end
  gpu_fleet.tf_hosts.gpu_run_lock:
    state: absent

- name: Another lock file, waiting at most a minute
  gpu_fleet.tf_hosts.gpu_run_lock:
    path: /run/my-maintenance.lock
    wait: 60
"""

RETURN = r"""
owner:
  description: The record of this run, written in the lock (action plugin, O(state=present)).
  returned: when the lock was taken
  type: dict
  sample: {"token": "5f0c...", "controller": "ops1", "pid": 4242, "user": "ops", "started": "2026-12-04T10:00:00Z",
           "playbooks": ["site.yml"], "host_boot_id": "0d6b..."}
replaced:
  description: The stale holder this run replaced, with C(stale) saying why; null when there was none.
  returned: when the lock was taken
  type: dict
waited_for:
  description: The live run this run waited for before it took the lock (as the waiting line names it), null when
    it waited for none. While waiting, the line goes to standard output under a stdout callback that prints for
    people and to standard error under a machine-readable one (such as C(ansible.posix.json)).
  returned: when the lock was taken
  type: str
  sample: "the run of ops on ops1 (ansible-playbook process 4242: site.yml), started 2026-12-04T10:00:00Z"
held:
  description: Module only; whether this call holds the lock now (V(state=present)).
  returned: always
  type: bool
holder:
  description: Module only; the record of the run that holds the lock, when it is another run's. With
    RV(held), RV(replaced) says whether this call replaced the stale holder it was given.
  returned: when another run holds the lock
  type: dict
boot_id:
  description: Module only; the host's boot id (C(/proc/sys/kernel/random/boot_id)).
  returned: always
  type: str
"""

import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402  (after the documentation, as validate-modules requires)

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read_holder(path: str) -> dict | None:
    """The record in the lock file; an unreadable one counts as a holder with no token (never taken over
    by a token, only reported)."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        return {"token": None, "unreadable": str(error)}
    return record if isinstance(record, dict) else {"token": None, "unreadable": "not a JSON object"}


def write_record(path: str, record: dict) -> None:
    """The record through a temporary file and a rename: the lock file is always whole."""
    temporary = f"{path}.new"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def locked(path: str, record: dict | None, replace: str | None, state: str, token: str | None, boot_id: str) -> dict:
    """Take, replace or give back the lock; the caller holds the guard's flock. The record written
    carries the host's boot id: after a reboot the lock is stale whatever else it says."""
    holder = read_holder(path)
    if state == "absent":
        mine = holder is not None and token is not None and holder.get("token") == token
        if mine:
            os.unlink(path)
        return {"held": False, "released": mine}
    replaced = holder is not None and replace is not None and holder.get("token") == replace
    if holder is None or replaced or holder.get("token") == record["token"]:
        write_record(path, dict(record, host_boot_id=boot_id))
        return {"held": True, "replaced": replaced}
    return {"held": False, "holder": holder}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path"},  # the action plugin fills it in
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "wait": {"type": "int"},
            "max_age": {"type": "int"},
            "record": {"type": "dict"},
            "replace": {"type": "str"},
            "token": {"type": "str", "no_log": False},
        },
        required_if=[("state", "present", ["record"])],
        supports_check_mode=True,
    )
    path, state = module.params["path"], module.params["state"]
    if not path:
        module.fail_json(msg="gpu_run_lock: the module needs path; its action plugin fills it in when left out")
    with open(BOOT_ID, encoding="ascii") as handle:
        boot_id = handle.read().strip()
    if module.check_mode:
        module.exit_json(changed=False, held=False, boot_id=boot_id)
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(f"{path}.guard", "a", encoding="utf-8") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            done = locked(
                path, module.params["record"], module.params["replace"], state, module.params["token"], boot_id
            )
    except OSError as error:
        module.fail_json(
            msg=f"The run lock {path} cannot be used on this host ({error.strerror}: {error.filename}). "
            "Set gpu_preflight_run_lock_path to a file in a folder root can write (default /run/gpu-fleet/run.lock)."
        )
    module.exit_json(changed=False, boot_id=boot_id, **done)


if __name__ == "__main__":
    main()
