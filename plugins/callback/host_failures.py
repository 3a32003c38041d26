# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Callback plugin: keep Ansible's own message of each host that was unreachable or failed, so the
fleet report can say why a host has no verification result."""

from __future__ import annotations

DOCUMENTATION = r"""
name: host_failures
author: gpu-fleet maintainers (!UNKNOWN)
version_added: "0.10.0"
type: aggregate
short_description: Keep each host's unreachable or failure message for the fleet report
description:
  - Ansible keeps no record of why a host left the play (unreachable, or a failed task) where a
    later play can read it. This callback keeps the last such message of each host as the host
    variables C(gpu_verify_unreachable_reason) (the connection's own message, such as
    C(Failed to connect to the host via ssh) and the reason ssh gave) and C(gpu_verify_failed_reason)
    (the failed task and its message), and with a failure C(gpu_verify_failed_check), where the task
    failed - C(preflight) for the checks before any change (the tasks imported with the variable
    C(__gpu_check) set to C(preflight), as C(playbooks/preflight.yml) and C(playbooks/reprovision.yml)
    import C(playbooks/tasks/checks.yml)), else the short name of the task's role, else null. The
    gpu_verify role's fleet report (JSON, Markdown, JUnit, HTML) shows them for every host that has no
    verification result, a host stopped by a failed task as failed in that check, never as unreachable.
  - Failures under C(ignore_errors) are not kept; a later message replaces an earlier one, and a
    host's unreachable message replaces its failure message and the other way round.
  - Only for the run it is enabled in; it writes no files and changes no output.
requirements:
  - Enabled in C(ansible.cfg) (C(callbacks_enabled = gpu_fleet.tf_hosts.host_failures) under
    C([defaults])) or with C(ANSIBLE_CALLBACKS_ENABLED=gpu_fleet.tf_hosts.host_failures). The
    project's own C(ansible.cfg) enables it. Without it, the report says only that the host was
    unreachable or failed earlier and points at the run's output.
"""

import re  # noqa: E402  (imports follow the documentation block, as ansible-test validate-modules requires)
from typing import Any  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.task_result import (  # noqa: E402
    task_result_data,
    task_result_host,
    task_result_task,
)

UNREACHABLE_VAR = "gpu_verify_unreachable_reason"
FAILED_VAR = "gpu_verify_failed_reason"
CHECK_VAR = "gpu_verify_failed_check"
# The task variable that names the check a task belongs to: playbooks/preflight.yml and playbooks/reprovision.yml
# set it to "preflight" on their import of playbooks/tasks/checks.yml (the checks before any change).
CHECK_TASK_VAR = "__gpu_check"
MAX_CHARS = 500
# ansible-core 2.19 prefixes results' messages with "Task failed: "; a failed remote command is
# quoted in full after "Failed command was:", which the report does not need.
PREFIX = re.compile(r"^(Task failed:\s*)+")
COMMAND_TAIL = re.compile(r"\s*Failed command was:.*$", re.DOTALL)


def result_message(result: dict[str, Any]) -> str:
    """Ansible's message of one result: those of its failed loop items (a loop's own ``msg`` is only
    "One or more items failed"), else ``msg`` (a list of them joined), else the end of ``stderr``; without the 2.19
    ``Task failed:`` prefix and the quoted failed command, on one line, at most :data:`MAX_CHARS`
    characters."""
    items = result.get("results") if isinstance(result.get("results"), list) else []
    failed = [str(item["msg"]) for item in items if isinstance(item, dict) and item.get("failed") and item.get("msg")]
    text = " | ".join(PREFIX.sub("", message) for message in failed) or result.get("msg")
    if isinstance(text, list):  # a task's list of messages reads as its sentences, not as a Python list
        text = " ".join(str(item) for item in text)
    if not text:
        stderr = str(result.get("stderr") or "").strip().splitlines()
        text = stderr[-1] if stderr else f"rc={result.get('rc')}" if "rc" in result else "no message"
    text = " ".join(COMMAND_TAIL.sub("", PREFIX.sub("", str(text))).split())
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"


def failed_check(task: Any) -> str | None:
    """Where a failed task belongs: the check its imports name (:data:`CHECK_TASK_VAR`, such as
    ``preflight``), else the short name of its role (``nvidia_driver``), else None. Task.get_vars() holds
    the variables of the task and of the blocks and imports around it (ansible-core playbook/task.py)."""
    try:
        named = task.get_vars().get(CHECK_TASK_VAR)
    except AttributeError:
        named = None
    if isinstance(named, str) and named:
        return named
    role = getattr(task, "_role", None)
    return role.get_name(include_role_fqcn=False) if role is not None else None


class CallbackModule(CallbackBase):
    """Sets :data:`UNREACHABLE_VAR` / :data:`FAILED_VAR` and :data:`CHECK_VAR` on the inventory host of each result."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpu_fleet.tf_hosts.host_failures"
    CALLBACK_NEEDS_ENABLED = True

    def _keep(self, result: Any, name: str, message: str, check: str | None = None) -> None:
        # Results reach callbacks in the controller's main process with the inventory's own Host,
        # whose variables every later task's hostvars read.
        other = FAILED_VAR if name == UNREACHABLE_VAR else UNREACHABLE_VAR
        host = task_result_host(result)
        host.set_variable(name, message)
        host.set_variable(other, None)
        host.set_variable(CHECK_VAR, check)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        """Keep the connection's message."""
        self._keep(result, UNREACHABLE_VAR, result_message(task_result_data(result)))

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        """Keep the failed task's name, message and check, unless the task ignores errors."""
        if not ignore_errors:
            message = f"task '{result.task_name}': {result_message(task_result_data(result))}"
            self._keep(result, FAILED_VAR, message, failed_check(task_result_task(result)))
