"""The connection plugin podman_pipelined: ``podman exec -i`` when Ansible pipes a module, podman's
own errors (exit 125) as an unreachable host."""

from __future__ import annotations

import sys

import pytest
from ansible.errors import AnsibleConnectionFailure
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader, init_plugin_loader
from helpers import ROOT

NAME = "gpu_fleet.tf_hosts.podman_pipelined"


@pytest.fixture(scope="module", autouse=True)
def _collections() -> None:
    """Ansible's own loader, finding this clone's collection and the installed containers.podman.
    Other tests import plugins as plain packages (conftest puts collections/ on sys.path); those
    ``ansible_collections`` modules would hide the collection from Ansible's finder."""
    for name in [name for name in sys.modules if name.split(".")[0] == "ansible_collections"]:
        del sys.modules[name]
    init_plugin_loader([str(ROOT / "collections")])


@pytest.fixture
def connection(monkeypatch):
    context = PlayContext()
    context.remote_addr = "gpu-c1"
    conn = connection_loader.get(NAME, context, None)
    assert conn is not None, f"{NAME} not found on the collections path"
    calls: list[tuple[list[str], list[str], bytes | None]] = []
    replies = {"rc": 0, "stderr": b""}

    def fake_podman(cmd, cmd_args=None, in_data=None, use_container_id=True):
        calls.append((list(cmd) if not isinstance(cmd, str) else [cmd], list(cmd_args or []), in_data))
        return replies["rc"], b"out", replies["stderr"]

    monkeypatch.setattr(conn, "_podman", fake_podman)
    conn._connected = True  # skip `podman mount`
    conn.set_options(var_options={"ansible_pipelining": True})
    return conn, calls, replies


def test_the_plugin_pipelines_when_pipelining_is_on(connection) -> None:
    conn, _, _ = connection
    assert conn.has_pipelining and conn.is_pipelining_enabled()


def test_input_goes_to_an_interactive_exec(connection) -> None:
    conn, calls, _ = connection
    assert conn.exec_command("/usr/bin/python3", in_data=b"module") == (0, b"out", b"")
    assert calls == [(["exec", "-i"], ["/usr/bin/python3"], b"module")]


def test_a_command_without_input_is_a_plain_exec(connection) -> None:
    conn, calls, _ = connection
    conn.exec_command("/bin/sh -c 'echo ~'")
    assert calls == [(["exec"], ["/bin/sh", "-c", "echo ~"], None)]


def test_remote_user_is_passed(connection) -> None:
    conn, calls, _ = connection
    conn.user = "deploy"
    conn.exec_command("id", in_data=b"")
    assert calls[0][0] == ["exec", "-i", "--user", "deploy"]


def test_a_missing_container_is_a_connection_failure(connection) -> None:
    conn, _, replies = connection
    replies.update(rc=125, stderr=b'Error: no container with name or ID "gpu-c1" found: no such container\n')
    with pytest.raises(AnsibleConnectionFailure, match=r"container gpu-c1: Error: no container .* no such container$"):
        conn.exec_command("/usr/bin/python3", in_data=b"module")


def test_the_commands_own_exit_status_is_returned(connection) -> None:
    conn, _, replies = connection
    replies.update(rc=127, stderr=b"sh: 1: nvidia-smi: not found")
    assert conn.exec_command("nvidia-smi")[0] == 127
