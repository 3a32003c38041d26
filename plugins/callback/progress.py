# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Callback plugin: say that a long step is alive and for how long, at each poll of an async task."""

from __future__ import annotations

DOCUMENTATION = r"""
name: progress
author: gpu-fleet maintainers (!UNKNOWN)
version_added: "0.14.0"
type: aggregate
short_description: Say how long each long step (CUDA installer, pip install, fit) has been running
description:
  - The roles run their long steps asynchronously and poll them (NVIDIA's CUDA installer, the venv's pip
    install, the verification fit; Ansible documentation "Asynchronous actions and polling"). At each
    poll this callback prints one line per host, the host, the task and C(still running after 2 min 30 s),
    so a person watching a 20-minute install sees it move.
  - Ansible's own output prints only C(ASYNC POLL on <host>) with the job's id at each poll; this line adds
    the task and the time since the task started on that host.
  - The lines go to standard output only under a stdout callback that prints for people (C(default),
    C(minimal), C(community.general.yaml) and the like). Under any other (such as C(ansible.posix.json), whose
    standard output scripts and CI parse as one document, or AWX's event stream) they go to standard error,
    where a person still sees them.
requirements:
  - Enabled in C(ansible.cfg) (C(callbacks_enabled = gpu_fleet.tf_hosts.progress) under C([defaults])) or
    with C(ANSIBLE_CALLBACKS_ENABLED=gpu_fleet.tf_hosts.progress). The project's own C(ansible.cfg)
    enables it.
"""

import time  # noqa: E402  (imports follow the documentation block, as ansible-test validate-modules requires)
from typing import Any  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.human_output import to_stderr  # noqa: E402
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.task_result import task_result_host  # noqa: E402


def elapsed(seconds: float) -> str:
    """``45 s``, ``2 min 30 s``, ``1 h 05 min``."""
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class CallbackModule(CallbackBase):
    """Prints ``<host>: <task>: still running after <time>`` at each async poll."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpu_fleet.tf_hosts.progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(
        self, *args: Any, clock: Any = time.monotonic, stdout_callback: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock
        # Under a machine-readable stdout callback (json, AWX's events) the lines go to stderr (see human_output.to_stderr).
        self._to_stderr = to_stderr(stdout_callback)
        # host -> (task name, start): a poll's own result is that of Ansible's internal async_status task.
        self._running: dict[str, tuple[str, float]] = {}

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        """Note which task started on the host, and when."""
        self._running[host.get_name()] = (task.get_name(), self._clock())

    def v2_runner_on_async_poll(self, result: Any) -> None:
        """One line: the host, the task and how long it has run."""
        host = task_result_host(result).get_name()
        name, began = self._running.get(host, (result.task_name, None))
        since = f"still running after {elapsed(self._clock() - began)}" if began is not None else "still running"
        self._display.display(f"{host}: {name}: {since}", stderr=self._to_stderr)
