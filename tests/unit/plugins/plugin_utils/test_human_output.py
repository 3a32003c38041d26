"""plugin_utils.human_output: the collection's lines for people go to stdout only under a stdout callback that
prints for people, to stderr under a machine-readable one (JSON, AWX's event stream) or one it does not know."""

from __future__ import annotations

import pytest
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils import human_output


@pytest.mark.parametrize(
    "callback",
    ["default", "ansible.builtin.default", "minimal", "yaml", "community.general.yaml", "ansible.posix.debug"],
)
def test_a_stdout_callback_for_people_keeps_the_lines_on_stdout(callback) -> None:
    assert human_output.to_stderr(callback) is False


@pytest.mark.parametrize(
    "callback",
    ["json", "ansible.posix.json", "ansible.posix.jsonl", "jsonl", "awx_display", "community.general.null", "mine"],
)
def test_any_other_stdout_callback_sends_the_lines_to_stderr(callback) -> None:
    assert human_output.to_stderr(callback) is True


def test_without_a_name_the_runs_own_stdout_callback_decides(monkeypatch) -> None:
    monkeypatch.setattr(human_output.C, "DEFAULT_STDOUT_CALLBACK", "ansible.posix.json")
    assert human_output.to_stderr() is True
    monkeypatch.setattr(human_output.C, "DEFAULT_STDOUT_CALLBACK", "default")
    assert human_output.to_stderr() is False
