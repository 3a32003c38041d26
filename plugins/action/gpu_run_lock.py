# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Action plugin gpu_run_lock: one provisioning run changes a host at a time.

The controller side of the run lock: it writes this run's record (controller, its ``ansible-playbook``
process, user, start, playbooks) through the module of the same name, which takes the lock on the host
under a ``flock``. A holder is stale when the host rebooted since it took the lock, or when it is a run
of this same controller whose process is gone (killed, or ended after a failure): then it is replaced
and the result says so. Any other holder is waited for, up to ``wait`` seconds, and then named in the
failure. Documentation: plugins/modules/gpu_run_lock.py.
"""

from __future__ import annotations

import datetime
import getpass
import hashlib
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.human_output import to_stderr
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.role_input import role_input

MODULE = "gpu_fleet.tf_hosts.gpu_run_lock"
# What a take is registered as (playbooks/tasks/checks.yml), which a give-back without a token reads; and
# the gpu_preflight input that an option left out stands for.
REGISTERED = "gpu_preflight_run_lock"
ROLE_INPUTS = {
    "path": "gpu_preflight_run_lock_path",
    "wait": "gpu_preflight_run_lock_wait",
    "max_age": "gpu_preflight_run_lock_max_age",
}
POLL = 5  # seconds between two looks at a live holder's lock
BOOT_ID = "/proc/sys/kernel/random/boot_id"
VALUE_OPTIONS = {
    "-i",
    "--inventory",
    "-e",
    "--extra-vars",
    "-l",
    "--limit",
    "-t",
    "--tags",
    "--skip-tags",
    "-u",
    "--user",
}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """The process's start time since boot (proc(5), /proc/<pid>/stat field 22), which tells a live
    process from a later one that got the same number; None where the process is gone."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split()[19] if stat else None


def playbooks(argv: list[str]) -> list[str]:
    """The playbook arguments of an ``ansible-playbook`` command line (no option values: an extra
    variable may hold a secret)."""
    return [
        arg
        for before, arg in zip([""] + argv, argv)
        if arg.endswith((".yml", ".yaml")) and before not in VALUE_OPTIONS and not arg.startswith("@")
    ]


def run_record(pid: int, now: datetime.datetime) -> dict[str, Any]:
    """This run's record in the lock: who to name, and what tells whether it is still running."""
    cmdline = (_read(f"/proc/{pid}/cmdline") or "").split("\0")
    controller, controller_boot_id, pid_start = (
        socket.gethostname(),
        (_read(BOOT_ID) or "").strip() or None,
        process_start(pid),
    )
    # One token per run, not per host: inventory names that reach the same machine (aliases) share its
    # lock file, and a run never waits for itself.
    run = f"{controller}|{controller_boot_id}|{pid}|{pid_start}"
    return {
        "token": hashlib.sha256(run.encode()).hexdigest()[:32] if pid_start else uuid.uuid4().hex,
        "controller": controller,
        "controller_boot_id": controller_boot_id,
        "pid": pid,
        "pid_start": pid_start,
        "user": getpass.getuser(),
        "started": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "playbooks": playbooks(cmdline[1:]),
    }


def _age(holder: dict, now: datetime.datetime) -> float | None:
    try:
        started = datetime.datetime.strptime(str(holder.get("started")), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return (now - started.replace(tzinfo=datetime.timezone.utc)).total_seconds()  # noqa: UP017


def stale_reason(
    holder: dict,
    host_boot_id: str,
    me: dict,
    started: Callable[[int], str | None],
    now: datetime.datetime,
    max_age: int,
) -> str | None:
    """Why the holder's run cannot be running any more, or None when it may be. ``started(pid)`` is
    :func:`process_start` on this controller; ``me`` is this run's record."""
    if holder.get("host_boot_id") and holder["host_boot_id"] != host_boot_id:
        return "the host rebooted since that run took the lock"
    age = _age(holder, now)
    if age is not None and age > max_age:
        return (
            f"it was taken {age / 3600:.1f} h ago, longer than any run lasts "
            f"(gpu_preflight_run_lock_max_age: {max_age} s)"
        )
    if holder.get("controller") != me["controller"] or not holder.get("pid"):
        return None  # another controller's process cannot be looked at from here
    if holder.get("controller_boot_id") and holder["controller_boot_id"] != me["controller_boot_id"]:
        return f"the controller {me['controller']} rebooted since that run took the lock"
    if started(int(holder["pid"])) != holder.get("pid_start"):
        return f"its ansible-playbook process {holder['pid']} on {me['controller']} is gone"
    return None


def describe(holder: dict) -> str:
    """``the run of ops on ctl1 (ansible-playbook process 4242: site.yml), started 2026-12-04T10:00:00Z``."""
    if holder.get("unreadable"):
        return f"an unreadable lock ({holder['unreadable']})"
    books = ", ".join(holder.get("playbooks") or []) or "no playbook named"
    return (
        f"the run of {holder.get('user', '?')} on {holder.get('controller', '?')} "
        f"(ansible-playbook process {holder.get('pid', '?')}: {books}), started {holder.get('started', '?')}"
    )


def held_token(published: Any) -> str | None:
    """The token of this run's lock from its take's registered result, or None (no lock taken: under
    --check, or the take was skipped or failed)."""
    owner = published.get("owner") if isinstance(published, dict) else None
    return owner.get("token") if isinstance(owner, dict) else None


def limit_problems(wait: Any, max_age: Any) -> list[str]:
    """What is wrong with the two limits, before anything is read or written on the host. A negative
    max_age would call every holder stale, so two runs would each replace the other's lock."""
    problems = []
    for value, name, least, meaning in (
        (wait, "gpu_preflight_run_lock_wait", 0, "seconds to wait for another run's lock, 0 to stop at once"),
        (max_age, "gpu_preflight_run_lock_max_age", 1, "seconds after which another run's lock counts as stale"),
    ):
        try:
            usable = int(value) >= least and not isinstance(value, bool)
        except (TypeError, ValueError):
            usable = False
        if not usable:
            problems.append(
                f"{name} is {value!r}: it must be a whole number of at least {least} ({meaning}). "
                f"Fix it in the inventory, or leave it out for its default."
            )
    return problems


def waited_too_long(host: str, path: str, holder: dict, wait: int) -> str:
    """The failure after ``wait`` seconds: the holder, what this run did, and each way on."""
    return (
        f"{path} on {host} is held by {describe(holder)}: one run changes a host at a time. This run waited "
        f"{wait} s (gpu_preflight_run_lock_wait) and changed nothing on {host}. Let that run end and run again, or "
        f"wait longer with gpu_preflight_run_lock_wait. If that run is gone (its controller stopped or lost the "
        f"host), remove {path} on {host} and run again."
    )


class ActionModule(ActionBase):
    """Takes (waiting for a live holder) or gives back the host's run lock."""

    _supports_check_mode = True
    _requires_connection = True

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        state = self._task.args.get("state", "present")
        if state not in ("present", "absent"):
            return dict(result, failed=True, msg="gpu_run_lock: state is present or absent")
        path = self._option("path", task_vars)
        if self._task.check_mode:
            return dict(result, changed=False, msg="Under --check no run lock is taken or given back")
        if state == "absent":
            token = self._task.args.get("token") or held_token(task_vars.get(REGISTERED))
            return self._give_back(result, path, token, task_vars)
        wait, max_age = self._option("wait", task_vars), self._option("max_age", task_vars)
        problems = limit_problems(wait, max_age)
        if problems:
            return dict(result, failed=True, msg=" ".join(problems))
        return self._take(result, path, int(wait), int(max_age), task_vars)

    def _option(self, name: str, task_vars: dict) -> Any:
        """The task's option, else gpu_preflight's input it stands for: the host's value, else its default."""
        if self._task.args.get(name) is not None:
            return self._task.args[name]
        return role_input(ROLE_INPUTS[name], task_vars, self._templar.template)

    def _call(self, module_args: dict, task_vars: dict) -> dict:
        return self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)

    def _give_back(self, result: dict, path: str, token: str | None, task_vars: dict) -> dict:
        if not token:
            return dict(result, changed=False, msg="This run holds no run lock on this host")
        done = self._call({"path": path, "state": "absent", "token": token}, task_vars)
        return dict(result, **done)

    def _take(self, result: dict, path: str, wait: int, max_age: int, task_vars: dict) -> dict:
        # Ansible's workers are children of the ansible-playbook process.
        record = run_record(os.getppid(), datetime.datetime.now(datetime.timezone.utc))  # noqa: UP017
        host = task_vars.get("inventory_hostname", "the host")
        deadline, replace, replaced, told = time.monotonic() + wait, None, None, ""
        while True:
            done = self._call({"path": path, "state": "present", "record": record, "replace": replace}, task_vars)
            if done.get("failed"):
                return dict(result, **done)
            if done["held"]:
                # The stale holder may have been replaced by another run meanwhile, which then gave the lock back.
                replaced = replaced if done.get("replaced") else None
                taken = self._taken(result, host, path, dict(record, host_boot_id=done["boot_id"]), replaced)
                return dict(taken, waited_for=told or None)
            holder = done["holder"]
            now = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
            reason = stale_reason(holder, done["boot_id"], record, process_start, now, max_age)
            if reason and holder.get("token"):
                replace, replaced = holder["token"], dict(holder, stale=reason)
                continue
            if time.monotonic() >= deadline:
                return dict(result, failed=True, holder=holder, msg=waited_too_long(host, path, holder, wait))
            if not told:
                # Said while waiting, for the person watching; on stderr under a machine-readable stdout callback
                # (json, AWX's events), whose stdout is that callback's alone. The result names the holder waited for.
                told = describe(holder)
                self._display.display(
                    f"{host}: waiting up to {wait} s for the run lock {path}, held by {told}", stderr=to_stderr()
                )
            time.sleep(max(0.0, min(POLL, deadline - time.monotonic())))

    @staticmethod
    def _taken(result: dict, host: str, path: str, owner: dict, replaced: dict | None) -> dict:
        """The result once the lock is held; a replaced stale holder is named in a warning."""
        said = f"replaced the stale run lock {path} of {describe(replaced)}: {replaced['stale']}" if replaced else ""
        return dict(
            result,
            changed=False,
            owner=owner,
            replaced=replaced,
            msg=f"Took the run lock {path}" + (f"; {said}" if said else ""),
            warnings=[f"{host}: {said}"] if said else [],
        )
