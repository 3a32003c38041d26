# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""The base of this collection's action plugins that hand part of their task to Ansible's own actions."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionRunner(ActionBase):
    """An action plugin that runs another action (``ansible.legacy.copy``) for one step of its task."""

    def _run_action(self, name: str, args: dict, task_vars: dict) -> dict:
        """Ansible's action ``name`` with ``args``, under this task's check and diff modes, connection and
        become: it transfers and compares files as a task of its own would."""
        task = self._task.copy()
        task.args = args
        action = self._shared_loader_obj.action_loader.get(
            name,
            task=task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
        return action.run(task_vars=task_vars)
