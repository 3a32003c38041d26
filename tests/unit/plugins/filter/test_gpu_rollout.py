"""Rolling reprovisioning: the gpu_rollout filters, the report's hosts left out on purpose, and
playbooks/reprovision.yml against the phase playbooks it must follow."""

from __future__ import annotations

import datetime
import io
import json
import os
import re
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.executor.playbook_executor import PlaybookExecutor

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))
sys.path.insert(0, str(ROOT / "roles" / "gpu_verify" / "files"))

import fleet_report
import gpu_rollout
import report_history

JOB = {"pid": 4242, "process_name": "python3", "gpu_uuid": "GPU-5c1e3b8a", "used_memory_mib": 1024}
NOW = datetime.datetime(2026, 12, 8, 9, 0, 0, tzinfo=datetime.timezone.utc)  # noqa: UP017


# --- serial and max_fail_percentage ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [(1, [1]), ("3", [3]), ("25%", ["25%"]), (" 25 % ", ["25%"]), ([1, "10%", "100%"], [1, "10%", "100%"])],
)
def test_serial_is_returned_as_the_play_keyword_takes_it(value, expected):
    assert gpu_rollout.gpu_rollout_serial(value) == expected


@pytest.mark.parametrize("value", [0, -1, "0", "abc", "0%", "101%", "12.5%", "", [], [1, "x"], True, None, 2.5])
def test_a_bad_serial_is_named_with_the_fix(value):
    with pytest.raises(AnsibleFilterError) as error:
        gpu_rollout.gpu_rollout_serial(value)
    message = str(error.value)
    assert message.startswith(f"gpu_rollout_serial is {value!r}; it must be 1 or more hosts per batch.")
    assert "-e gpu_rollout_serial=10%" in message and "do not see inventory variables" in message


@pytest.mark.parametrize("value, expected", [(0, 0), ("0", 0), ("10%", 10), (12.5, 12.5), (100, 100)])
def test_max_fail_percentage_is_a_number_from_0_to_100(value, expected):
    assert gpu_rollout.gpu_rollout_max_fail_percentage(value) == expected


@pytest.mark.parametrize("value", [-1, 101, "abc", "nan", "inf", True, None, ""])
def test_a_bad_max_fail_percentage_is_named_with_the_fix(value):
    with pytest.raises(AnsibleFilterError, match=r"it must be a number from 0 to 100 .*-e gpu_rollout_max_fail"):
        gpu_rollout.gpu_rollout_max_fail_percentage(value)


HOSTS = [f"gpu{n:02d}" for n in range(1, 11)]


def ansible_batches(hosts: list[str], serial: list[Any]) -> list[list[str]]:
    """Ansible's own batches: PlaybookExecutor._get_serialized_batches on a stand-in inventory."""
    inventory = types.SimpleNamespace(get_hosts=lambda pattern, order=None: list(hosts))
    executor = types.SimpleNamespace(_inventory=inventory)
    play = types.SimpleNamespace(hosts="gpu_hosts", order=None, serial=serial)
    return PlaybookExecutor._get_serialized_batches(executor, play)


@pytest.mark.parametrize(
    "count, serial",
    [(10, 1), (10, "25%"), (3, "25%"), (3, 1), (7, 3), (10, [1, "20%", "50%"]), (5, [2, 1]), (1, "10%"), (4, "100%")],
)
def test_batches_are_the_ones_ansible_forms(count, serial):
    hosts = HOSTS[:count]
    normalized = gpu_rollout.gpu_rollout_serial(serial)
    assert gpu_rollout.gpu_rollout_batches(hosts, serial) == ansible_batches(hosts, normalized)


def test_batches_of_a_percentage_round_down_with_at_least_one_host():
    assert gpu_rollout.gpu_rollout_batches(HOSTS[:5], "40%") == [["gpu01", "gpu02"], ["gpu03", "gpu04"], ["gpu05"]]
    assert gpu_rollout.gpu_rollout_batches(HOSTS[:3], "25%") == [["gpu01"], ["gpu02"], ["gpu03"]]


@pytest.mark.parametrize(
    "failed, size, percentage, stops",
    [
        (1, 1, 0, True),
        (1, 4, 0, True),
        (1, 4, 25, False),  # 25 % is not more than 25 %: the share must be exceeded
        (2, 4, 25, True),
        (0, 4, 0, False),
        (4, 4, 100, True),  # a whole batch failed stops the play whatever the percentage
        (3, 4, 100, False),
    ],
)
def test_the_rollout_stops_as_ansible_decides(failed, size, percentage, stops):
    assert gpu_rollout.stops_after(failed, size, percentage) is stops


def test_processes_are_named_in_one_line():
    no_memory = dict(JOB, pid=7, process_name="train.py", used_memory_mib=None)
    assert gpu_rollout.gpu_rollout_processes([JOB, no_memory]) == (
        "python3 pid 4242 (1024 MiB on GPU-5c1e3b8a), train.py pid 7 (on GPU-5c1e3b8a)"
    )
    assert gpu_rollout.gpu_rollout_processes([]) == "none"


# --- hosts a report cannot show verified -----------------------------------------------------------


def facts(**hosts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: dict(value) for name, value in hosts.items()}


BUSY = {"gpu_rollout_skipped": True, "gpu_rollout_busy_processes": [JOB]}
VERIFIED = {"gpu_verify_results": {"tf2.12": {"ok": True}}}
ORDER = ["busy", "healthy", "failing", "later"]


def test_the_batch_before_a_failure_says_which_hosts_are_still_to_come():
    hostvars = facts(busy=BUSY, healthy=VERIFIED, failing={}, later={})
    found = gpu_rollout.gpu_rollout_not_verified(ORDER, hostvars, ORDER, "healthy", 1, 0)
    assert found == {
        "busy": {"status": "skipped", "reason": gpu_rollout.skipped_reason([JOB])},
        "failing": {"status": "not reached yet", "reason": "in batch 3 of 4"},
        "later": {"status": "not reached yet", "reason": "in batch 4 of 4"},
    }
    assert found["busy"]["reason"].startswith("its GPUs run compute processes: python3 pid 4242 (1024 MiB on ")


def test_a_host_given_back_after_its_drain_says_so_not_that_it_was_never_drained():
    given_back = BUSY | {"gpu_rollout_given_back": True}
    found = gpu_rollout.gpu_rollout_not_verified(["a", "b"], facts(a=given_back, b=VERIFIED), ["a", "b"], "b", 1, 0)
    reason = found["a"]["reason"]
    assert found["a"]["status"] == "skipped" and reason == gpu_rollout.skipped_reason([JOB], given_back=True)
    assert reason.startswith("its GPUs still ran compute processes when the wait after the drain ran out: python3 pid")
    assert "given back to the scheduler unchanged" in reason and "gpu_rollout_drain_timeout" in reason
    assert "not drained" not in reason


def test_a_failed_batch_that_stops_the_rollout_names_the_host_that_stopped_it():
    hostvars = facts(busy=BUSY, healthy=VERIFIED, failing={}, later={})
    alive = ["busy", "healthy", "later"]
    found = gpu_rollout.gpu_rollout_not_verified(ORDER, hostvars, alive, "failing", 1, 0)
    assert sorted(found) == ["busy", "later"]  # healthy has results, failing is reported as failed
    assert found["later"] == {"status": "not reached", "reason": "the rollout stopped after failing failed"}


def test_a_failure_within_max_fail_percentage_leaves_the_rollout_going():
    hosts = ["a", "b", "c", "d", "e"]
    hostvars = facts(a={}, b=VERIFIED, c={}, d={}, e={})
    found = gpu_rollout.gpu_rollout_not_verified(hosts, hostvars, ["b", "c", "d", "e"], "b", 2, 50)
    assert found == {
        "c": {"status": "not reached yet", "reason": "in batch 2 of 3"},
        "d": {"status": "not reached yet", "reason": "in batch 2 of 3"},
        "e": {"status": "not reached yet", "reason": "in batch 3 of 3"},
    }
    stopped = gpu_rollout.gpu_rollout_not_verified(hosts, hostvars, ["b", "c", "d", "e"], "b", 2, 49)
    assert stopped["e"] == {"status": "not reached", "reason": "the rollout stopped after a failed"}


def test_a_busy_host_that_was_forced_or_verified_is_not_left_out():
    forced = {"gpu_rollout_skipped": False, "gpu_rollout_busy_processes": [JOB]}
    hostvars = facts(a=forced | VERIFIED, b=BUSY | VERIFIED)
    assert gpu_rollout.gpu_rollout_not_verified(["a", "b"], hostvars, ["a", "b"], "b", "100%", 0) == {}


def test_a_host_outside_the_play_is_an_error():
    with pytest.raises(AnsibleFilterError, match="gpu09 is not a host of this play"):
        gpu_rollout.gpu_rollout_not_verified(["a"], facts(a={}), ["a"], "gpu09", 1, 0)


# --- the report -----------------------------------------------------------------------------------


def verified_doc() -> dict[str, Any]:
    return {
        "schema": 1,
        "ok": True,
        "stack": "tf2.12",
        "problems": [],
        "gpus": {"expected": 2, "seen": 2},
        "fit": {"ok": True, "loss_start": 1.0, "loss_end": 0.5},
    }


def cli(out_dir: Path, results: dict[str, Any], *extra: str, now: datetime.datetime = NOW) -> tuple[int, dict]:
    out = io.StringIO()
    argv = ["--input", "-", "--out-dir", str(out_dir), "--inventory-name", "lab", "--emit", "json", *extra]
    code = fleet_report.main(argv, stdin=io.StringIO(json.dumps(results)), stdout=out, now=now)
    return code, json.loads(out.getvalue()) if code == 0 else {}


def test_hosts_left_out_are_listed_with_why_and_never_as_passed_or_failed(tmp_path: Path):
    left_out = {
        "busy": {"status": "skipped", "reason": "its GPUs run compute processes: python3 pid 4242"},
        "later": {"status": "not reached", "reason": "the rollout stopped after failing failed"},
    }
    results = {
        "healthy": verified_doc(),
        # gpu_verify_collect gives every host a document; a host left out has no verification.
        "busy": {"ok": False, "problems": [{"check": "run", "cause": "did not run", "fix": ""}]},
        "failing": {
            "ok": False,
            "unreachable": False,
            "failed": "task 'preflight': 4 GPUs expected",
            "failed_check": "preflight",
            "error": None,
        },
        "later": {"ok": False, "problems": [{"check": "run", "cause": "did not run", "fix": ""}]},
    }
    code, done = cli(tmp_path, results, "--not-verified", json.dumps(left_out))
    assert code == 0
    assert done["summary"] == {
        "hosts": 4,
        "passed": 1,
        "failed": 1,
        "unreachable": 0,
        "rechecked": 2,
        "not_in_run": 2,
        "health": {"healthy": 0, "unhealthy": 0, "could_not_check": 0, "not_checked": 4},
    }
    report = json.loads((tmp_path / "lab" / "latest" / "fleet-report.json").read_text())
    busy, later = report["hosts"]["busy"], report["hosts"]["later"]
    assert (busy["status"], later["status"]) == ("SKIPPED", "NOT REACHED")
    assert busy["rows"][0]["status"] == (
        "skipped: its GPUs run compute processes: python3 pid 4242 (last seen never: unknown)"
    )
    assert busy["reason"] == left_out["busy"]["reason"]
    assert [o["passed"] for o in busy["rows"][0]["checks"].values()] == [None]
    assert busy["problems"] == [] and later["problems"] == []
    assert (
        "Host failed (check preflight) before any change, at task 'preflight': 4 GPUs expected"
        in (report["hosts"]["failing"]["problems"][0]["cause"])
    )
    junit = ET.parse(tmp_path / "lab" / "latest" / "fleet-report.junit.xml").getroot()
    skipped = {
        c.get("classname"): c.find("skipped").get("message")
        for c in junit.iter("testcase")
        if c.find("skipped") is not None and c.get("name") == "verification"
    }
    assert skipped["later"] == "not reached: the rollout stopped after failing failed (last seen never: unknown)"
    assert "python3 pid 4242" in skipped["busy"]
    assert "not reached: the rollout stopped after failing failed" in done["table"]


def test_a_host_left_out_keeps_its_last_result_from_the_previous_report(tmp_path: Path):
    cli(tmp_path, {"a": verified_doc(), "b": verified_doc()})
    later = NOW + datetime.timedelta(days=7)
    left_out = {"b": {"status": "not reached", "reason": "the rollout stopped after a failed"}}
    _code, done = cli(
        tmp_path, {"a": {"ok": False, "unreachable": True}}, "--not-verified", json.dumps(left_out), now=later
    )
    report = json.loads((tmp_path / "lab" / "latest" / "fleet-report.json").read_text())
    entry = report["hosts"]["b"]
    assert (entry["status"], entry["last_status"], entry["last_seen"]) == (
        "NOT REACHED",
        "PASS",
        "2026-12-08T09:00:00Z",
    )
    assert (
        entry["rows"][0]["status"]
        == "not reached: the rollout stopped after a failed (last seen 2026-12-08T09:00:00Z: PASS)"
    )
    assert entry["rows"][0]["gpus"] == "2/2"  # the last row kept for reference
    assert done["summary"]["passed"] == 0 and done["summary"]["not_in_run"] == 1
    # A third report carries the time b was last verified, not the time it was last left out.
    cli(tmp_path, {"a": verified_doc()}, "--not-verified", json.dumps(left_out), now=later + datetime.timedelta(days=1))
    third = json.loads((tmp_path / "lab" / "latest" / "fleet-report.json").read_text())
    assert third["hosts"]["b"]["last_seen"] == "2026-12-08T09:00:00Z"


@pytest.mark.parametrize(
    "value, message",
    [
        ("{", "--not-verified is not JSON"),
        ('["a"]', "--not-verified must be a JSON object"),
        ('{"a": "skipped"}', "--not-verified: a needs"),
        ('{"a": {"status": "", "reason": "x"}}', "--not-verified: a needs"),
        ('{"a": {"status": "skipped"}}', "--not-verified: a needs"),
    ],
)
def test_bad_not_verified_input_exits_2_with_what_to_pass(tmp_path: Path, capsys, value: str, message: str):
    code, _done = cli(tmp_path, {"a": verified_doc()}, "--not-verified", value)
    assert code == fleet_report.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "lab").exists()


def test_merge_without_hosts_left_out_is_unchanged():
    previous = fleet_report.build_report({"a": verified_doc(), "b": verified_doc()}, None, NOW)
    merged = report_history.merge(previous, fleet_report.build_report({"a": verified_doc()}, None, NOW), None)
    assert merged["hosts"]["b"]["status"] == "NOT IN THIS RUN"
    assert merged["hosts"]["b"]["rows"][0]["status"] == "not in this run (last seen 2026-12-08T09:00:00Z: PASS)"


# --- playbooks/reprovision.yml --------------------------------------------------------------------


def _load(name: str) -> list[dict[str, Any]]:
    return yaml.safe_load((ROOT / name).read_text())


def _role_step(task: dict[str, Any]) -> tuple[str, str] | None:
    """(role, entry point) of a task that runs one; the run lock's action as (gpu_run_lock, state)."""
    for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
        if key in task:
            return task[key]["name"].split(".")[-1], task[key].get("tasks_from", "main")
    if "gpu_fleet.tf_hosts.gpu_run_lock" in task:
        return "gpu_run_lock", task["gpu_fleet.tf_hosts.gpu_run_lock"]["state"]
    return None


def _expand(tasks: list[dict[str, Any]] | None, folder: str = "playbooks") -> list[dict[str, Any]]:
    """The tasks with each task file they import in its place (found, as Ansible does, next to the
    file that imports it), and each block's tasks (block, rescue, always) in the block's place."""
    expanded = []
    for task in tasks or []:
        imported = task.get("ansible.builtin.import_tasks")
        if imported:
            path = f"{folder}/{imported}"
            expanded += _expand(_load(path), path.rsplit("/", 1)[0])
        elif "block" in task:
            expanded += _expand(task["block"] + task.get("rescue", []) + task.get("always", []), folder)
        else:
            expanded.append(task)
    return expanded


# A phase playbook's first play (playbooks/stacks.yml) resolves the stacks for the hosts no earlier play did: in
# site.yml none, after its preflight (as in the rollout, whose checks resolve them first in each batch).
STACKS_PLAY = "stacks.yml"


def _plays(name: str) -> list[dict[str, Any]]:
    """The plays of playbooks/``name`` in order, each imported playbook's in its place but playbooks/stacks.yml's."""
    plays = []
    for entry in _load("playbooks/" + name):
        imported = entry.get("ansible.builtin.import_playbook")
        if imported != STACKS_PLAY:
            plays += _plays(imported) if imported else [entry]
    return plays


def site_steps() -> list[list[tuple[str, str]]]:
    """site.yml's plays, each as its (role, entry point) steps in order."""
    plays = []
    for play in _plays("site.yml"):
        steps = [_role_step(t) for t in _expand(play.get("pre_tasks"))]
        steps += [(r["role"].split(".")[-1], "main") for r in play.get("roles", [])]
        steps += [_role_step(t) for t in _expand(play.get("tasks")) + _expand(play.get("post_tasks"))]
        plays.append([s for s in steps if s])
    return plays


def rollout_tasks() -> list[dict[str, Any]]:
    (play,) = _load("playbooks/reprovision.yml")
    (block,) = play["tasks"]
    return _expand(block["block"])


UNLOCK = ("gpu_run_lock", "absent")
LOCK = ("gpu_run_lock", "present")


def _changes(play: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A play's steps without the run lock's give-back, which ends each play of site.yml (its `always`)."""
    return [step for step in play if step != UNLOCK]


def test_reprovision_runs_site_yml_roles_and_entry_points_in_order():
    """The same steps as site.yml, but the run lock's give-back: in site.yml the `always` that ends each
    play (a host that fails in it gives the lock back there), and in the rollout the block's `always`."""
    steps = [_role_step(t) for t in rollout_tasks()]
    expected = [step for play in site_steps() for step in _changes(play)]
    assert [s for s in steps if s and s[0] != "gpu_rollout"] == expected
    assert all(play[-1] == UNLOCK for play in site_steps())
    # The take is the checks' last step: no check that stops a host without a change comes after it.
    assert _changes(site_steps()[0])[-1] == LOCK


# Roles whose handlers only tidy (gpu_verify's removes the bytecode earlier releases' verifications left in /tmp):
# no later step depends on them, so they may run at the end of the rollout's play.
TIDY_ONLY_HANDLERS = {"gpu_verify"}


def test_reprovision_flushes_handlers_where_site_yml_ends_a_play_with_a_handler_role():
    tasks = rollout_tasks()
    flushed = 0
    for play in site_steps():
        # The entry points that install (main) notify handlers; the check entry points do not. The roles after the
        # last such one in a play (the GPU services after the driver) have no handlers of their own.
        notifying = [
            (role, entry)
            for role, entry in _changes(play)
            if entry == "main" and (ROOT / "roles" / role / "handlers").is_dir() and role not in TIDY_ONLY_HANDLERS
        ]
        if not notifying:
            continue
        index = next(i for i, t in enumerate(tasks) if _role_step(t) == notifying[-1])
        assert tasks[index + 1].get("ansible.builtin.meta") == "flush_handlers", f"no flush after {notifying[-1]}"
        flushed += 1
    assert flushed == 2  # the driver play (reboot) and the CUDA play (gpu_env's ldconfig)


def test_reprovision_guards_checks_and_drains_in_that_order_and_undrains_last():
    # The guard ends gpu_rollout's main, the play's one role, which runs before the block's first task.
    (play,) = _load("playbooks/reprovision.yml")
    assert [r["role"] for r in play["roles"]] == ["gpu_fleet.tf_hosts.gpu_rollout"]
    main = _load("roles/gpu_rollout/tasks/main.yml")
    assert main[-1].get("ansible.builtin.meta") == "end_host" and main[-1]["when"] == "gpu_rollout_skipped | bool"
    steps = [_role_step(t) for t in rollout_tasks()]
    drain, undrain = (steps.index(("gpu_rollout", name)) for name in ("drain", "undrain"))
    assert undrain == len(steps) - 1
    # Every check of playbooks/preflight.yml runs before the drain; the first change after it.
    preflight = _changes(site_steps()[0])
    assert max(steps.index(s) for s in preflight) < drain < steps.index(("nvidia_driver", "main"))
    # Between the verification and the undrain: the switch of a verified new default, the health baseline of what
    # was verified, and then the report (which names the hosts left out, once per batch), after every step that
    # can fail a host before the undrain.
    verify = steps.index(("gpu_verify", "main"))
    assert steps[verify + 1 : undrain] == [("gpu_env", "switch"), ("gpu_health", "record"), ("gpu_verify", "report")]


def test_a_failed_host_gets_its_batch_report_then_counts_against_max_fail_percentage():
    (play,) = _load("playbooks/reprovision.yml")
    always = play["tasks"][0]["always"]
    assert [_role_step(t) for t in _expand(always)] == [UNLOCK, ("gpu_verify", "report"), None]
    assert "ansible.builtin.fail" in always[-1]
    assert always[0]["vars"] == {"__gpu_run_lock_last": True}  # every host gives its run lock back, passed or failed
    assert all(t["when"] == "inventory_hostname not in ansible_play_hosts" for t in always[1:])


# --- the play's head and gpu_rollout's checks, on stand-in hosts -----------------------------------
# The play of playbooks/reprovision.yml without its tasks: gpu_rollout's checks are assert and debug
# tasks, which run on the controller, so the stand-in hosts are never connected to.


def run_head(tmp_path: Path, inventory_vars: dict[str, Any], *extra: str) -> subprocess.CompletedProcess:
    (play,) = _load("playbooks/reprovision.yml")
    head = {key: value for key, value in play.items() if key != "tasks"} | {"gather_facts": False}
    playbook = tmp_path / "head.yml"
    playbook.write_text(yaml.safe_dump([head], sort_keys=False))
    hosts = {name: {"ansible_connection": "local"} for name in ("gpu01", "gpu02", "gpu03")}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"gpu_hosts": {"hosts": hosts, "vars": inventory_vars}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    env["ANSIBLE_CALLBACK_RESULT_FORMAT"] = "json"
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), str(playbook), "-i", str(inventory), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_the_plan_names_each_batch(tmp_path: Path):
    run = run_head(tmp_path, {}, "-e", "gpu_rollout_serial=1")
    assert run.returncode == 0, run.stdout[-3000:]
    for number, host in enumerate(("gpu01", "gpu02", "gpu03"), 1):
        assert f"Batch {number} of 3 ({host}) of the rolling reprovisioning of 3 hosts" in run.stdout


def test_a_bad_serial_stops_the_play_before_any_host(tmp_path: Path):
    run = run_head(tmp_path, {}, "-e", "gpu_rollout_serial=abc")
    assert run.returncode != 0
    assert "gpu_rollout_serial is 'abc'; it must be 1 or more hosts per batch." in run.stdout + run.stderr
    assert "TASK [" not in run.stdout


def test_a_serial_set_in_the_inventory_stops_the_first_batch_with_the_fix(tmp_path: Path):
    # The play's serial sees the role default (25 % of 3 hosts: 1 host), the tasks the inventory's 2.
    run = run_head(tmp_path, {"gpu_rollout_serial": 2})
    assert run.returncode != 0
    assert "This batch is gpu01, but gpu_rollout_serial 2 makes it gpu01, gpu02" in run.stdout
    assert "-e gpu_rollout_serial=10%" in run.stdout
    assert "Batch 2 of" not in run.stdout  # the rollout stopped


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"gpu_rollout_drain_command": ["scontrol", "update"]}, "Only one of the drain and undrain hooks is set"),
        ({"gpu_rollout_undrain_tasks": "/etc/hostname"}, "Only one of the drain and undrain hooks is set"),
        (
            {"gpu_rollout_drain_tasks": "hooks/drain.yml", "gpu_rollout_undrain_command": ["true"]},
            "gpu_rollout_drain_tasks is hooks/drain.yml, which is not an absolute path of a file on the controller",
        ),
        (
            {"gpu_rollout_drain_command": ["true"], "gpu_rollout_undrain_tasks": "/nonexistent/undrain.yml"},
            "gpu_rollout_undrain_tasks is /nonexistent/undrain.yml, which is not an absolute path of a file",
        ),
        ({"gpu_rollout_hook_host": "slurmctl01"}, "gpu_rollout_hook_host is slurmctl01, which is not a host of"),
    ],
)
def test_bad_hook_settings_stop_the_first_batch_with_cause_and_fix(tmp_path: Path, settings, message):
    run = run_head(tmp_path, settings, "-e", "gpu_rollout_serial=1")
    assert run.returncode != 0
    assert message in run.stdout
    assert "Batch 2 of" not in run.stdout


# The settings check, the plan and the busy note as filters (the play above runs them through Ansible).
ROLLOUT = {
    "drain_command": [],
    "drain_tasks": "",
    "drain_tasks_found": False,
    "undrain_command": [],
    "undrain_tasks": "",
    "undrain_tasks_found": False,
    "hook_host": "",
    "inventory_hosts": ["gpu01", "gpu02", "gpu03"],
    "batch": ["gpu02", "gpu01"],
    "play_hosts": ["gpu01", "gpu02", "gpu03"],
    "planned": ["gpu01", "gpu02"],
    "serial": 2,
}


def test_rollout_problems_none_for_matching_batches_and_paired_hooks():
    assert gpu_rollout.gpu_rollout_problems(ROLLOUT) == []
    hooks = dict(ROLLOUT, drain_command=["true"], undrain_tasks="/etc/undrain.yml", undrain_tasks_found=True)
    assert gpu_rollout.gpu_rollout_problems(dict(hooks, hook_host="localhost")) == []


def test_rollout_problems_a_planned_host_that_left_the_play_is_no_difference():
    assert gpu_rollout.gpu_rollout_problems(dict(ROLLOUT, batch=["gpu01"], play_hosts=["gpu01", "gpu03"])) == []


def test_rollout_problems_names_every_problem_at_once():
    settings = dict(
        ROLLOUT, drain_tasks="hooks/drain.yml", drain_tasks_found=True, hook_host="slurmctl01", batch=["gpu01"]
    )
    found = gpu_rollout.gpu_rollout_problems(settings)
    assert [text.split(" ", 1)[0] for text in found] == [
        "Only",
        "gpu_rollout_drain_tasks",
        "gpu_rollout_hook_host",
        "This",
    ]
    assert found[-1].startswith(
        "This batch is gpu01, but gpu_rollout_serial 2 makes it gpu01, gpu02: gpu_rollout_serial is set where the "
        "play's serial cannot see it"
    )


def test_rollout_problems_an_absolute_task_file_that_is_not_there():
    settings = dict(ROLLOUT, drain_command=["true"], undrain_tasks="/nonexistent/undrain.yml")
    assert gpu_rollout.gpu_rollout_problems(settings) == [
        "gpu_rollout_undrain_tasks is /nonexistent/undrain.yml, which is not an absolute path of a file on the "
        "controller. Give the task file's full path, or leave it empty."
    ]


def test_rollout_plan_note():
    note = gpu_rollout.gpu_rollout_plan_note(
        [["gpu01"], ["gpu02", "gpu03"]],
        ["gpu02", "gpu03"],
        {"hosts": 3, "serial": [1, "100%"], "max_fail_percentage": 0},
    )
    assert note == (
        "Batch 2 of 2 (gpu02, gpu03) of the rolling reprovisioning of 3 hosts (gpu_rollout_serial [1, '100%']). Each "
        "batch is verified before the next starts; more than 0 % failed hosts in a batch "
        "(gpu_rollout_max_fail_percentage) stops the rollout."
    )


def test_rollout_busy_note_skipped_or_forced():
    apps = [{"pid": 4242, "process_name": "python3", "gpu_uuid": "GPU-1", "used_memory_mib": 1024}]
    assert gpu_rollout.gpu_rollout_busy_note(apps, "gpu01", True) == (
        "Skipped: gpu01's GPUs run compute processes: python3 pid 4242 (1024 MiB on GPU-1). It is not drained or "
        "changed in this run; rerun playbooks/reprovision.yml when those jobs end, or set gpu_rollout_force_busy: true."
    )
    assert gpu_rollout.gpu_rollout_busy_note(apps, "gpu01", "false") == (
        "Going ahead (gpu_rollout_force_busy): gpu01's GPUs run compute processes: python3 pid 4242 (1024 MiB on "
        "GPU-1). nvidia_driver still stops before changing the driver under them unless nvidia_driver_allow_busy_gpus."
    )


def test_rollout_busy_note_of_a_host_still_busy_after_its_drain():
    apps = [{"pid": 4242, "process_name": "python3", "gpu_uuid": "GPU-1", "used_memory_mib": 1024}]
    assert gpu_rollout.gpu_rollout_busy_note(apps, "gpu01", True, 600) == (
        "Skipped: gpu01's GPUs still run compute processes 600 s after the drain: python3 pid 4242 (1024 MiB on "
        "GPU-1). It is given back to the scheduler unchanged; rerun playbooks/reprovision.yml when those jobs end, "
        "raise gpu_rollout_drain_timeout, or set gpu_rollout_force_busy: true."
    )


def test_the_first_batch_names_the_rollout_and_later_batches_keep_its_name():
    first = gpu_rollout.gpu_rollout_run_id(["a", "b"], facts(a={}, b={}), "20261129T120000Z-42")
    assert first == "rollout-20261129T120000Z-42"
    later = facts(a={"gpu_rollout_run_id": first}, b={})
    assert gpu_rollout.gpu_rollout_run_id(["a", "b"], later, "20261129T130000Z-7") == first
    # A host the run has not reached has no facts at all.
    assert gpu_rollout.gpu_rollout_run_id(["x", "a"], {"a": {"gpu_rollout_run_id": first}}, "later") == first


def run_entries(tmp_path: Path, entries: list[str], settings: dict[str, Any]) -> subprocess.CompletedProcess:
    """gpu_rollout's entry points in the play of playbooks/reprovision.yml, on two local hosts, one per
    batch, then the facts they published."""
    (play,) = _load("playbooks/reprovision.yml")
    tasks = [
        {"name": entry, "ansible.builtin.include_role": {"name": "gpu_fleet.tf_hosts.gpu_rollout", "tasks_from": entry}}
        for entry in entries
    ]
    shown = "{{ [gpu_rollout_run_id | default(''), gpu_rollout_skipped, gpu_rollout_given_back, gpu_rollout_busy_processes] }}"
    tasks.append({"name": "Show", "ansible.builtin.debug": {"msg": shown}})
    head = {key: value for key, value in play.items() if key != "tasks"} | {"gather_facts": False, "tasks": tasks}
    (tmp_path / "play.yml").write_text(yaml.safe_dump([head], sort_keys=False))
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable} for name in ("a", "b")}
    (tmp_path / "hosts.yml").write_text(json.dumps({"gpu_hosts": {"hosts": hosts}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    env["ANSIBLE_CALLBACK_RESULT_FORMAT"] = "json"
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "play.yml", "-i", "hosts.yml"]
    settings = {"gpu_rollout_serial": 1, "ansible_become": False} | settings
    argv += ["-e", json.dumps(settings)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def shown_facts(run: subprocess.CompletedProcess) -> list[list[Any]]:
    return [json.loads(block) for block in re.findall(r'"msg": (\[.*?\n    \])', run.stdout, re.S)]


def test_each_batch_publishes_the_guards_facts_and_one_run_id(tmp_path: Path):
    """The guard and the rollout's label (main, the play's role; on a host without nvidia-smi: no job), batch by
    batch: every batch carries the run id the first one made."""
    run = run_entries(tmp_path, [], {"__gpu_rollout_query": ["false"]})
    assert run.returncode == 0, run.stdout[-3000:]
    shown = shown_facts(run)
    assert len(shown) == 2 and shown[0] == shown[1], run.stdout[-3000:]
    assert shown[0][0].startswith("rollout-") and shown[0][1:] == [False, False, []]


def test_a_job_that_outlives_the_drain_gives_the_host_back_named_as_such(tmp_path: Path):
    """The guard sees no job, the drain's look one (it started in between): the host is given back,
    skipped, and the rollout goes on with the next batch."""
    marker = tmp_path / "looked"
    line = "4242, python3, GPU-1, 1024"
    query = ["sh", "-c", f'test -e {marker}-$0 && echo "{line}"; touch {marker}-$0', "{{ inventory_hostname }}"]
    run = run_entries(tmp_path, ["drain"], {"__gpu_rollout_query": query, "gpu_rollout_drain_timeout": 0})
    assert run.returncode == 0, run.stdout[-3000:]
    for host in ("a", "b"):
        assert f"Skipped: {host}'s GPUs still run compute processes 0 s after the drain: python3 pid 4242" in run.stdout
    assert "TASK [Show]" not in run.stdout  # each host ended after its drain
