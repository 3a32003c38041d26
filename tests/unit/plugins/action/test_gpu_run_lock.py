"""gpu_run_lock: when another run's lock is stale, how a holder is named, the host's module taking and
giving back the lock, the whole action in real ansible-playbook runs on this machine, and where the
collection's playbooks take it and give it back (playbooks/tasks/give_back_run_lock.yml, in real runs too)."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.action import gpu_run_lock
from ansible_collections.gpu_fleet.tf_hosts.plugins.modules import gpu_run_lock as module
from helpers import localhost_playbook, localhost_playbook_started

ROOT = Path(__file__).resolve().parents[4]
NOW = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.timezone.utc)  # noqa: UP017
ME = {"controller": "ctl1", "controller_boot_id": "cb1"}
HOLDER = {
    "token": "t1",
    "controller": "ctl1",
    "controller_boot_id": "cb1",
    "pid": 4242,
    "pid_start": "1000",
    "user": "ops",
    "started": "2026-12-04T11:50:00Z",
    "playbooks": ["site.yml"],
    "host_boot_id": "hb1",
}


def stale(holder: dict, started=lambda pid: "1000", host_boot_id: str = "hb1", max_age: int = 43200) -> str | None:
    return gpu_run_lock.stale_reason(holder, host_boot_id, ME, started, NOW, max_age)


def test_a_live_run_of_this_controller_is_not_stale():
    assert stale(HOLDER) is None


@pytest.mark.parametrize(
    ("change", "started", "host_boot_id", "reason"),
    [
        ({}, lambda pid: None, "hb1", "its ansible-playbook process 4242 on ctl1 is gone"),
        ({}, lambda pid: "2000", "hb1", "its ansible-playbook process 4242 on ctl1 is gone"),  # number reused
        ({}, lambda pid: "1000", "hb2", "the host rebooted since that run took the lock"),
        ({"controller_boot_id": "cb0"}, lambda pid: "1000", "hb1", "the controller ctl1 rebooted"),
        ({"controller": "awx-job-7", "started": "2026-12-03T20:00:00Z"}, lambda pid: None, "hb1", "taken 16.0 h ago"),
    ],
    ids=["process-gone", "pid-reused", "host-rebooted", "controller-rebooted", "older-than-max-age"],
)
def test_a_holder_that_cannot_be_running_is_stale_and_says_why(change, started, host_boot_id, reason):
    assert reason in (stale(HOLDER | change, started, host_boot_id) or "")


def test_another_controllers_run_is_not_judged_by_this_controllers_processes():
    assert stale(HOLDER | {"controller": "ctl2"}, started=lambda pid: None) is None


def test_the_playbooks_of_a_command_line_leave_option_values_out():
    argv = ["-i", "inv.yml", "-e", "@secrets.yml", "-e", "x=1.yml", "--limit", "a", "site.yml", "playbooks/verify.yml"]
    assert gpu_run_lock.playbooks(argv) == ["site.yml", "playbooks/verify.yml"]


def test_the_failure_names_the_holder_what_this_run_did_and_each_way_on():
    text = gpu_run_lock.waited_too_long("gpu1", "/run/gpu-fleet/run.lock", HOLDER, 300)
    assert (
        "held by the run of ops on ctl1 (ansible-playbook process 4242: site.yml), started 2026-12-04T11:50:00Z" in text
    )
    assert "waited 300 s (gpu_preflight_run_lock_wait) and changed nothing on gpu1" in text
    assert "remove /run/gpu-fleet/run.lock on gpu1" in text


# --- the host's module (under the guard's flock) ------------------------------------------------------


def test_the_module_takes_a_free_lock_and_refuses_a_held_one(tmp_path):
    path = str(tmp_path / "run.lock")
    assert module.locked(path, {"token": "a"}, None, "present", None, "hb1") == {"held": True, "replaced": False}
    assert json.loads(Path(path).read_text()) == {"token": "a", "host_boot_id": "hb1"}
    refused = module.locked(path, {"token": "b"}, None, "present", None, "hb1")
    assert refused == {"held": False, "holder": {"token": "a", "host_boot_id": "hb1"}}
    assert module.locked(path, {"token": "b"}, "other", "present", None, "hb1")["held"] is False  # not its token
    assert module.locked(path, {"token": "b"}, "a", "present", None, "hb1") == {"held": True, "replaced": True}
    assert json.loads(Path(path).read_text())["token"] == "b"


def test_the_module_gives_back_only_its_own_lock(tmp_path):
    path = str(tmp_path / "run.lock")
    module.locked(path, {"token": "a"}, None, "present", None, "hb1")
    assert module.locked(path, None, None, "absent", "b", "hb1") == {"held": False, "released": False}
    assert Path(path).exists()
    assert module.locked(path, None, None, "absent", "a", "hb1") == {"held": False, "released": True}
    assert not Path(path).exists()


def test_an_unreadable_lock_is_a_holder_without_a_token(tmp_path):
    path = tmp_path / "run.lock"
    path.write_text("{half")
    done = module.locked(str(path), {"token": "a"}, None, "present", None, "hb1")
    assert done["held"] is False and done["holder"]["token"] is None and "unreadable" in done["holder"]


# --- the action in real runs: ansible-playbook on this machine ---------------------------------------

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Take the run lock
      gpu_fleet.tf_hosts.gpu_run_lock: {{path: {path}, wait: {wait}}}
      register: lock
    - name: Show what was taken
      ansible.builtin.debug: {{msg: "TOKEN={{{{ lock.owner.token }}}} PID={{{{ lock.owner.pid }}}}"}}
"""


def _play(tmp_path: Path, lock: Path, wait: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    playbook = tmp_path / "take.yml"
    playbook.write_text(PLAYBOOK.format(path=lock, wait=wait))
    return localhost_playbook(playbook, env)


def _live_holder(lock: Path, pid: int) -> dict:
    """A lock held by the live process ``pid`` of this controller, started now."""
    holder = dict(
        gpu_run_lock.run_record(pid, NOW),
        host_boot_id=Path(gpu_run_lock.BOOT_ID).read_text().strip(),
        started=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),  # noqa: UP017
    )
    lock.parent.mkdir()
    lock.write_text(json.dumps(holder))
    return holder


def test_a_run_killed_with_the_lock_leaves_it_and_the_next_run_replaces_it_saying_so(tmp_path):
    lock = tmp_path / "lock" / "run.lock"
    first = _play(tmp_path, lock)
    assert first.returncode == 0, first.stdout + first.stderr
    held = json.loads(lock.read_text())  # never given back: the run ended as a killed one would
    assert f"PID={held['pid']}" in first.stdout and held["playbooks"] == [str(tmp_path / "take.yml")]
    second = _play(tmp_path, lock)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"replaced the stale run lock {lock} of the run of {held['user']}" in second.stdout + second.stderr
    assert f"its ansible-playbook process {held['pid']}" in second.stdout + second.stderr
    assert json.loads(lock.read_text())["token"] != held["token"]


def test_a_live_holder_is_waited_for_and_then_named(tmp_path):
    lock = tmp_path / "lock" / "run.lock"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        holder = dict(
            gpu_run_lock.run_record(sleeper.pid, NOW),
            host_boot_id=Path(gpu_run_lock.BOOT_ID).read_text().strip(),
            started=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),  # noqa: UP017
        )
        lock.parent.mkdir()
        lock.write_text(json.dumps(holder))
        run = _play(tmp_path, lock, wait=2)
    finally:
        sleeper.kill()
    assert run.returncode != 0
    assert f"waiting up to 2 s for the run lock {lock}, held by the run of {holder['user']}" in run.stdout
    assert f"(ansible-playbook process {sleeper.pid}: no playbook named)" in run.stdout
    assert "This run waited 2 s (gpu_preflight_run_lock_wait)" in run.stdout
    assert json.loads(lock.read_text())["token"] == holder["token"]


def test_under_the_json_callback_the_wait_is_said_on_stderr_and_stdout_is_one_document(tmp_path):
    lock = tmp_path / "lock" / "run.lock"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        holder = _live_holder(lock, sleeper.pid)
        run = _play(tmp_path, lock, wait=3, env={"ANSIBLE_STDOUT_CALLBACK": "json"})
    finally:
        sleeper.kill()
    assert run.returncode != 0
    document = json.loads(run.stdout)
    (result,) = document["plays"][0]["tasks"][0]["hosts"].values()
    assert result["failed"] and result["holder"]["token"] == holder["token"]
    assert f"waiting up to 3 s for the run lock {lock}, held by the run of {holder['user']}" in run.stderr


def test_a_holder_that_ends_while_waited_for_hands_over(tmp_path):
    """The waiting run takes the lock once the holder gives it back, within its wait."""
    lock = tmp_path / "lock" / "run.lock"
    sleeper = subprocess.Popen(["sleep", "60"])
    holder = dict(
        gpu_run_lock.run_record(sleeper.pid, NOW), host_boot_id=Path(gpu_run_lock.BOOT_ID).read_text().strip()
    )
    holder["started"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017
    lock.parent.mkdir()
    lock.write_text(json.dumps(holder))
    playbook = tmp_path / "take.yml"
    playbook.write_text(PLAYBOOK.format(path=lock, wait=60))
    # The holder gives the lock back once the run says it waits (not after a fixed time: a slow start of
    # ansible-playbook would find the lock gone already).
    waiter = localhost_playbook_started(playbook)
    try:
        lines = []
        for line in waiter.stdout:
            lines.append(line)
            if "waiting up to 60 s" in line and lock.exists():
                lock.unlink()
        waiter.wait(timeout=120)
    finally:
        sleeper.kill()
        waiter.kill()
    out = "".join(lines)
    assert waiter.returncode == 0, out
    assert "waiting up to 60 s" in out and "replaced" not in out
    assert json.loads(lock.read_text())["token"] != holder["token"]


def test_a_run_never_waits_for_itself(tmp_path):
    """Inventory names that reach one machine (aliases) share its lock file: the second take by the same
    run holds it at once (one token per run), where waiting would stop the run against itself."""
    lock = tmp_path / "lock" / "run.lock"
    playbook = tmp_path / "twice.yml"
    playbook.write_text(
        PLAYBOOK.format(path=lock, wait=0) + f"    - name: Take it again, as another alias of the host would\n"
        f"      gpu_fleet.tf_hosts.gpu_run_lock: {{path: {lock}, wait: 0}}\n"
        "      register: again\n"
        "    - name: Show the second token\n"
        '      ansible.builtin.debug: {msg: "AGAIN={{ again.owner.token }}"}\n'
    )
    run = localhost_playbook(playbook)
    assert run.returncode == 0, run.stdout + run.stderr
    token = json.loads(lock.read_text())["token"]
    assert f"TOKEN={token}" in run.stdout and f"AGAIN={token}" in run.stdout


def test_a_run_that_lost_the_replace_to_another_does_not_claim_it(tmp_path):
    """Two runs find the same stale lock: one replaces it; the other then waits for that run and, once it
    gave the lock back, takes a free lock, without saying it replaced anything."""
    path = str(tmp_path / "run.lock")
    module.locked(path, {"token": "stale"}, None, "present", None, "hb1")
    assert module.locked(path, {"token": "x"}, "stale", "present", None, "hb1") == {"held": True, "replaced": True}
    assert module.locked(path, {"token": "y"}, "stale", "present", None, "hb1")["held"] is False
    module.locked(path, None, None, "absent", "x", "hb1")
    assert module.locked(path, {"token": "y"}, "stale", "present", None, "hb1") == {"held": True, "replaced": False}


@pytest.mark.parametrize(
    ("wait", "max_age", "named"),
    [
        (-1, 43200, "gpu_preflight_run_lock_wait is -1"),
        (300, 0, "gpu_preflight_run_lock_max_age is 0"),
        (300, -5, "gpu_preflight_run_lock_max_age is -5"),
        ("soon", 43200, "gpu_preflight_run_lock_wait is 'soon'"),
    ],
)
def test_a_limit_that_cannot_be_used_is_named_with_its_rule(wait, max_age, named):
    problems = gpu_run_lock.limit_problems(wait, max_age)
    assert len(problems) == 1 and problems[0].startswith(named)
    assert "leave it out for its default" in problems[0]


def test_usable_limits_have_no_problem():
    assert gpu_run_lock.limit_problems(0, 1) == [] and gpu_run_lock.limit_problems("300", "43200") == []


def test_a_negative_max_age_stops_the_take_before_the_host_is_touched(tmp_path):
    lock = tmp_path / "lock" / "run.lock"
    playbook = tmp_path / "take.yml"
    playbook.write_text(PLAYBOOK.format(path=lock, wait=0).replace("wait: 0}", "wait: 0, max_age: -1}"))
    run = localhost_playbook(playbook)
    assert run.returncode != 0 and "gpu_preflight_run_lock_max_age is -1" in run.stdout
    assert not lock.parent.exists()


def test_options_left_out_are_gpu_preflights_inputs_and_the_give_back_reads_the_published_lock(tmp_path):
    """A playbook takes and gives back gpu_preflight's run lock with the action alone: the path from
    gpu_preflight_run_lock_path, wait and max age from their documented defaults, the token from the
    take's result registered as gpu_preflight_run_lock."""
    lock = tmp_path / "lock" / "run.lock"
    playbook = tmp_path / "bare.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n"
        f"  vars: {{gpu_preflight_run_lock_path: {lock}}}\n  tasks:\n"
        "    - name: Take\n      gpu_fleet.tf_hosts.gpu_run_lock:\n      register: gpu_preflight_run_lock\n"
        "    - name: Show the published token\n"
        '      ansible.builtin.debug: {msg: "FACT={{ gpu_preflight_run_lock.owner.token }}"}\n'
        "    - name: Show the lock\n      ansible.builtin.command: cat " + str(lock) + "\n      register: held\n"
        "    - name: Give back\n      gpu_fleet.tf_hosts.gpu_run_lock: {state: absent}\n"
        '    - name: Show what was held\n      ansible.builtin.debug: {msg: "HELD={{ (held.stdout | from_json).token }}"}\n'
    )
    run = localhost_playbook(playbook)
    assert run.returncode == 0, run.stdout + run.stderr
    token = run.stdout.split("FACT=", 1)[1].split('"', 1)[0].split("\n", 1)[0]
    assert token and f"HELD={token}" in run.stdout
    assert not lock.exists()


def test_the_lock_entry_points_options_have_documented_defaults():
    from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import documented_default

    assert documented_default("gpu_preflight_run_lock_max_age") == 43200
    assert documented_default("gpu_preflight_run_lock_wait") == 300


# --- where the playbooks take and give back the lock ---------------------------------------------------

GIVE_BACK = "tasks/give_back_run_lock.yml"
# Each play of these playbooks may run while this run holds the lock (site.yml imports the phase playbooks).
HOLDING_PLAYBOOKS = ("preflight.yml", "driver.yml", "cuda.yml", "tensorflow.yml", "verify.yml", "reprovision.yml")


def _playbook_plays(name: str) -> list[dict]:
    return [play for play in yaml.safe_load((ROOT / "playbooks" / name).read_text()) if "hosts" in play]


def test_the_lock_is_given_back_in_one_place_and_taken_in_one_place_after_the_last_check():
    """One task file gives the lock back and checks.yml takes it, last; no playbook calls the action itself."""
    calls = {
        str(path.relative_to(ROOT)): path.read_text().count("gpu_fleet.tf_hosts.gpu_run_lock:")
        for path in sorted((ROOT / "playbooks").rglob("*.yml"))
    }
    assert {path: count for path, count in calls.items() if count} == {
        "playbooks/tasks/checks.yml": 1,
        "playbooks/tasks/give_back_run_lock.yml": 1,
    }
    checks = yaml.safe_load((ROOT / "playbooks/tasks/checks.yml").read_text())
    assert checks[-1]["gpu_fleet.tf_hosts.gpu_run_lock"] == {"state": "present"}
    assert checks[-1]["register"] == "gpu_preflight_run_lock"


def test_a_host_the_rollout_skips_after_taking_the_lock_gives_it_back_first():
    """meta: end_host skips the batch block's `always` (the give-back): drain.yml's skip of a host whose GPUs
    still compute after the drain, which comes after the checks took the lock, gives it back itself."""
    drain = yaml.safe_load((ROOT / "roles/gpu_rollout/tasks/drain.yml").read_text())
    (busy,) = [task for task in drain if "block" in task]
    ends = [i for i, task in enumerate(busy["block"]) if task.get("ansible.builtin.meta") == "end_host"]
    assert ends and all(
        busy["block"][i - 1].get("gpu_fleet.tf_hosts.gpu_run_lock") == {"state": "absent"} for i in ends
    )


@pytest.mark.parametrize("name", HOLDING_PLAYBOOKS)
def test_every_play_that_may_hold_the_lock_gives_it_back_in_an_always_around_all_its_tasks(name):
    """A host can fail only in a task or a handler: each play holds its tasks in one block (handlers flushed
    inside it), whose `always` gives the lock back, so a failed host gives it back in the play it fails in,
    also when every host fails and Ansible runs no later play."""
    for play in _playbook_plays(name):
        assert "roles" not in play or name == "reprovision.yml", f"{name}: a role outside the block"
        (block,) = play["tasks"]
        assert block["always"][0]["ansible.builtin.import_tasks"] == GIVE_BACK, name


FAILING_PLAY = """\
- hosts: localhost
  gather_facts: false
  vars: {{gpu_preflight_run_lock_path: {lock}}}
  tasks:
    - name: Take the lock, then {what}
      block:
        - name: Take
          gpu_fleet.tf_hosts.gpu_run_lock:
          register: gpu_preflight_run_lock
        - name: Install
          ansible.builtin.fail: {{msg: the installer failed}}
          when: {fail}
      always:
        - name: Give back
          ansible.builtin.import_tasks: {give_back}
          vars: {{__gpu_run_lock_last: {last}}}
- hosts: localhost
  gather_facts: false
  tasks:
    - name: The next play
      ansible.builtin.debug: {{msg: NEXT PLAY RAN}}
"""


@pytest.mark.parametrize(
    "fail, last, given_back",
    [(True, False, True), (False, False, False), (False, True, True)],
    ids=["a failed host gives it back", "a passing host keeps it", "the last play gives it back"],
)
def test_the_give_back_in_a_real_run(tmp_path, fail, last, given_back):
    """The give-back task file in a play's `always`: a host that failed gives the lock back even though
    its failure (every host of the play) ends the run before the next play; a passing host keeps it until
    the play that ends the run."""
    lock = tmp_path / "lock" / "run.lock"
    playbook = tmp_path / "phase.yml"
    what = "fail" if fail else "pass"
    give_back = ROOT / "playbooks" / GIVE_BACK
    playbook.write_text(FAILING_PLAY.format(lock=lock, what=what, fail=fail, last=last, give_back=give_back))
    run = localhost_playbook(playbook)
    assert (run.returncode != 0) == fail, run.stdout + run.stderr
    assert ("NEXT PLAY RAN" in run.stdout) == (not fail)
    assert lock.exists() != given_back, run.stdout[-3000:]
