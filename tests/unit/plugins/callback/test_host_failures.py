"""The callback plugin host_failures: each host's unreachable or failure message, kept for the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "callback"))

import host_failures

# ansible-core 2.19's message for a podman container that does not exist (seen with ansible -m ping).
PODMAN_GONE = (
    "Task failed: Failed to create temporary directory. In some cases, you may have been able to authenticate "
    'and did not have permissions on the target directory. Consider changing the remote tmp path in ansible.cfg to a path rooted in "/tmp", for more error information use -vvv. '
    'Failed command was: ( umask 77 && mkdir -p "` echo ~/.ansible/tmp `" ), exited with result 125'
)


class FakeHost:
    def __init__(self) -> None:
        self.vars: dict = {}

    def set_variable(self, name: str, value: object) -> None:
        self.vars[name] = value


def _result(data: dict, task: str = "Gathering Facts") -> SimpleNamespace:
    return SimpleNamespace(host=FakeHost(), result=data, task_name=task)


def test_message_drops_the_prefix_and_the_quoted_command() -> None:
    assert host_failures.result_message({"msg": PODMAN_GONE}) == (
        "Failed to create temporary directory. In some cases, you may have been able to authenticate and did not "
        'have permissions on the target directory. Consider changing the remote tmp path in ansible.cfg to a path rooted in "/tmp", for more error information use -vvv.'
    )


def test_message_of_a_loop_is_its_first_failed_item() -> None:
    data = {"msg": "", "results": [{"msg": "fine"}, {"failed": True, "msg": "No package matching 'xz'"}]}
    assert host_failures.result_message(data) == "No package matching 'xz'"


def test_message_of_a_loop_names_each_failed_item_not_the_loops_summary() -> None:
    # What a looped assert (gpu_verify's "Fail this host when a check failed") returns.
    data = {
        "msg": "One or more items failed",
        "results": [
            {"failed": True, "msg": "Task failed: Stack tf212 on gpu-a failed verification: lock drift. Rerun."},
            {"failed": False, "msg": "All assertions passed"},
            {"failed": True, "msg": "Stack tf218 on gpu-a failed verification: no result"},
        ],
    }
    assert host_failures.result_message(data) == (
        "Stack tf212 on gpu-a failed verification: lock drift. Rerun. | Stack tf218 on gpu-a failed verification: no result"
    )


def test_message_without_msg_is_the_last_stderr_line_or_the_rc() -> None:
    assert host_failures.result_message({"stderr": "warning\nmake: *** [all] Error 2\n", "rc": 2}) == (
        "make: *** [all] Error 2"
    )
    assert host_failures.result_message({"rc": 3}) == "rc=3"
    assert host_failures.result_message({}) == "no message"


def test_a_list_of_messages_reads_as_sentences() -> None:
    data = {"msg": ["4 GPUs expected, 2 seen. Reseat them.", "Tasks run as deploy, not root. Become root."]}
    assert host_failures.result_message(data) == (
        "4 GPUs expected, 2 seen. Reseat them. Tasks run as deploy, not root. Become root."
    )


def test_message_is_bounded() -> None:
    text = host_failures.result_message({"msg": "x" * 2000})
    assert len(text) == host_failures.MAX_CHARS and text.endswith("…")


def test_unreachable_keeps_the_message_and_clears_an_earlier_failure() -> None:
    result = _result({"msg": "Failed to connect to the host via ssh: Connection refused", "unreachable": True})
    result.host.vars["gpu_verify_failed_reason"] = "task 'x': boom"
    host_failures.CallbackModule().v2_runner_on_unreachable(result)
    assert result.host.vars == {
        "gpu_verify_unreachable_reason": "Failed to connect to the host via ssh: Connection refused",
        "gpu_verify_failed_reason": None,
        "gpu_verify_failed_check": None,
    }


def test_failure_keeps_the_task_and_message_unless_errors_are_ignored() -> None:
    callback = host_failures.CallbackModule()
    ignored = _result({"msg": "probe failed"}, "Probe")
    callback.v2_runner_on_failed(ignored, ignore_errors=True)
    assert ignored.host.vars == {}
    failed = _result({"msg": "Task failed: Action failed: CUDA 12.2 needs driver >= 535.54.03"}, "Check the driver")
    callback.v2_runner_on_failed(failed)
    assert failed.host.vars["gpu_verify_failed_reason"] == (
        "task 'Check the driver': Action failed: CUDA 12.2 needs driver >= 535.54.03"
    )
    assert failed.host.vars["gpu_verify_unreachable_reason"] is None


class FakeRole:
    def get_name(self, include_role_fqcn: bool = True) -> str:
        return "gpu_fleet.tf_hosts.nvidia_driver" if include_role_fqcn else "nvidia_driver"


class FakeTask:
    def __init__(self, task_vars: dict, role: FakeRole | None = None) -> None:
        self._vars, self._role = task_vars, role

    def get_vars(self) -> dict:
        return self._vars


def test_a_failure_keeps_its_check_the_imports_name_else_its_role() -> None:
    """A preflight stop is kept as failed in check preflight (the variable its import sets), whatever role
    the task is of; another task's failure as failed in its role; a task of no role and no check: None."""
    callback = host_failures.CallbackModule()
    cases = [
        (FakeTask({"__gpu_check": "preflight"}, FakeRole()), "preflight"),
        (FakeTask({}, FakeRole()), "nvidia_driver"),
        (FakeTask({}), None),
        (None, None),
    ]
    for task, check in cases:
        failed = _result({"msg": "4 GPUs expected, nvidia-smi sees 2"}, "Stop this host")
        failed.task = task
        callback.v2_runner_on_failed(failed)
        assert failed.host.vars["gpu_verify_failed_check"] == check
    # An unreachable host later in the run: its check goes, it was not stopped by one.
    callback.v2_runner_on_unreachable(failed)
    assert failed.host.vars["gpu_verify_failed_check"] is None


PLAYBOOK = """
- name: Reach every host; one fails a task
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
    - name: The checks, as playbooks/preflight.yml imports them
      vars:
        __gpu_check: preflight
      block:
        - name: Fail on one host
          ansible.builtin.fail:
            msg: the disk is full
          when: inventory_hostname == 'failer'
- name: Read what the callback kept
  hosts: reader
  gather_facts: false
  tasks:
    - name: Write it down
      ansible.builtin.copy:
        content: "{{ dict(['dead', 'failer'] | zip(['dead', 'failer'] | map('extract', hostvars)
          | map('dict2items') | map('selectattr', 'key', 'match', 'gpu_verify_') | map('items2dict'))) | to_json }}"
        dest: kept.json
        mode: "0644"
"""


def test_a_real_run_keeps_the_messages_for_a_later_play(tmp_path: Path) -> None:
    # Port 1 on the loopback refuses at once: an unreachable host without leaving this machine.
    python = sys.executable
    inventory = {
        "all": {
            "hosts": {
                "dead": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1},
                "failer": {"ansible_connection": "local", "ansible_python_interpreter": python},
                "reader": {"ansible_connection": "local", "ansible_python_interpreter": python},
            }
        }
    }
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [
            str(Path(python).with_name("ansible-playbook")),
            "-i",
            str(tmp_path / "hosts.json"),
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert (tmp_path / "kept.json").exists(), done.stdout[-3000:]
    kept = json.loads((tmp_path / "kept.json").read_text())
    assert kept["dead"]["gpu_verify_unreachable_reason"].startswith("Failed to connect to the host via ssh: ")
    assert "port 1: Connection refused" in kept["dead"]["gpu_verify_unreachable_reason"]
    assert kept["failer"] == {
        "gpu_verify_failed_reason": "task 'Fail on one host': the disk is full",
        "gpu_verify_unreachable_reason": None,
        "gpu_verify_failed_check": "preflight",
    }
    assert kept["dead"]["gpu_verify_failed_check"] is None


def test_a_result_of_ansible_core_before_2_19_is_read_from_its_private_attributes() -> None:
    # ansible-core 2.16-2.18's TaskResult has `_host` and `_result` only (2.19 made them public).
    host = FakeHost()
    old_style = SimpleNamespace(_host=host, _result={"msg": "No package matching 'xz'"}, task_name="Install xz")
    host_failures.CallbackModule().v2_runner_on_failed(old_style)
    assert host.vars[host_failures.FAILED_VAR] == "task 'Install xz': No package matching 'xz'"
    assert host.vars[host_failures.UNREACHABLE_VAR] is None
