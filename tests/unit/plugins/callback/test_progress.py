"""The callback plugin progress: at each poll of an async task, the host, the task and how long it has run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "callback"))

import progress


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59.9, "59 s"), (60, "1 min 00 s"), (150, "2 min 30 s"), (3599, "59 min 59 s"), (3900, "1 h 05 min")],
)
def test_elapsed_reads_as_a_person_would_say_it(seconds, text) -> None:
    assert progress.elapsed(seconds) == text


def _host(name: str) -> SimpleNamespace:
    return SimpleNamespace(get_name=lambda: name)


def test_each_poll_names_the_host_the_task_that_started_there_and_its_time() -> None:
    now = [100.0]
    callback = progress.CallbackModule(clock=lambda: now[0])
    shown: list[str] = []
    callback._display = SimpleNamespace(display=lambda text, stderr: shown.append(text) if not stderr else None)
    callback.v2_runner_on_start(_host("gpu1"), SimpleNamespace(get_name=lambda: "Run NVIDIA's CUDA installer for 12.2"))
    now[0] = 130.0
    callback.v2_runner_on_start(_host("gpu2"), SimpleNamespace(get_name=lambda: "Install TensorFlow 2.18"))
    now[0] = 250.0
    poll = SimpleNamespace(host=_host("gpu1"), task_name="async_status")  # a poll's own task is Ansible's
    callback.v2_runner_on_async_poll(poll)
    callback.v2_runner_on_async_poll(SimpleNamespace(host=_host("gpu2"), task_name="async_status"))
    callback.v2_runner_on_async_poll(SimpleNamespace(host=_host("gpu3"), task_name="async_status"))
    assert shown == [
        "gpu1: Run NVIDIA's CUDA installer for 12.2: still running after 2 min 30 s",
        "gpu2: Install TensorFlow 2.18: still running after 2 min 00 s",
        "gpu3: async_status: still running",
    ]


@pytest.mark.parametrize(
    ("stdout_callback", "to_stderr"),
    [
        (None, False),
        ("default", False),
        ("ansible.builtin.default", False),
        ("json", True),
        ("ansible.builtin.json", True),
    ],
)
def test_the_lines_go_to_stderr_under_any_other_stdout_callback(stdout_callback, to_stderr) -> None:
    callback = progress.CallbackModule(clock=lambda: 0.0, stdout_callback=stdout_callback)
    shown: list[tuple[str, bool]] = []
    callback._display = SimpleNamespace(display=lambda text, stderr: shown.append((text, stderr)))
    callback.v2_runner_on_async_poll(SimpleNamespace(host=_host("gpu1"), task_name="async_status"))
    assert shown == [("gpu1: async_status: still running", to_stderr)]


def _sleep_playbook(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """ansible-playbook with the project's ansible.cfg: a 5 s command polled every second."""
    playbook = tmp_path / "slow.yml"
    playbook.write_text(
        textwrap.dedent(
            """\
            - hosts: localhost
              gather_facts: false
              tasks:
                - name: Sleep a little
                  ansible.builtin.command: sleep 5
                  async: 30
                  poll: 1
                  changed_when: false
            """
        )
    )
    out = localhost_playbook(playbook, env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_a_real_polled_task_prints_its_progress(tmp_path) -> None:
    out = _sleep_playbook(tmp_path)
    lines = [line for line in out.stdout.splitlines() if ": still running after " in line]
    assert lines and all(line.startswith("localhost: Sleep a little: still running after ") for line in lines), (
        out.stdout
    )
    # The last poll comes near the end of the 5 s sleep; on a busy machine a poll or two later.
    seconds = [int(line.rsplit(" ", 2)[1]) for line in lines]
    assert seconds == sorted(seconds) and 3 <= seconds[-1] <= 10, lines


def test_json_output_stays_one_document_with_the_progress_on_stderr(tmp_path) -> None:
    out = _sleep_playbook(tmp_path, ANSIBLE_STDOUT_CALLBACK="json")
    document = json.loads(out.stdout)
    assert document["stats"]["localhost"]["ok"] == 1
    assert "localhost: Sleep a little: still running after " in out.stderr, out.stderr
