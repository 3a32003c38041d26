# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""The host, the task and the result dictionary of the TaskResult a callback receives, on every supported ansible-core.

ansible-core 2.19 made them public (``TaskResult.host``, ``TaskResult.task``, ``TaskResult.result``; "Porting Guide for
ansible-core 2.19", section "Plugin API"); 2.16-2.18 have only the attributes ``_host``, ``_task`` and ``_result``.
"""

from __future__ import annotations

from typing import Any


def task_result_host(task_result: Any) -> Any:
    """The inventory host of a callback's TaskResult."""
    return task_result.host if hasattr(task_result, "host") else task_result._host  # pylint: disable=protected-access


def task_result_task(task_result: Any) -> Any:
    """The task of a callback's TaskResult (None where it carries none)."""
    return task_result.task if hasattr(task_result, "task") else getattr(task_result, "_task", None)


def task_result_data(task_result: Any) -> dict:
    """The result dictionary of a callback's TaskResult."""
    return task_result.result if hasattr(task_result, "result") else task_result._result  # pylint: disable=protected-access
