"""The run lock on a converged host: two site.yml runs started together, a run killed while it holds
the lock, then run again, and failed runs, which give it back.

A run killed (SIGKILL of its process group, as test_interrupted.py kills) once it holds the lock
leaves the lock with its record. Then two runs of site.yml start in the same second: one names the
killed run's lock as stale (its process is gone) and replaces it; the other says it waits for that
one, naming it, and goes on once it gave the lock back. Both pass, the host is verified and no lock
is left.

A preflight.yml that a check after the artifacts stops (tf_venv's: an index URL without a scheme) and a
site.yml whose verification fails (an absurd learning rate: the fit's loss is not finite) leave no lock.

Then site.yml, verify.yml and reprovision.yml (waiting for another run's lock) under the stdout callback
json: stdout is one JSON document, and the exit code agrees with the report, also when the run's last step
fails the host.

About 260 s on a 2-core machine (two no-op runs, one waiting for the other; two failed runs; four runs
under json).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.gpu_fleet.tf_hosts.plugins.action import gpu_run_lock
from ansible_run import ANSIBLE_PLAYBOOK, failures, latest_report
from sandbox_hosts import ROOT, sandbox_inventory, site, start_converged, stop_container

pytestmark = pytest.mark.integration

LOCK = "/run/gpu-fleet/run.lock"  # gpu_preflight_run_lock_path's default, inside the container


def _start(inventory: Path, reports: Path) -> subprocess.Popen:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [ANSIBLE_PLAYBOOK, str(ROOT / "site.yml"), "-i", str(inventory), "-e", f"gpu_verify_report_dir={reports}"]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _lock(host: str) -> dict | None:
    done = subprocess.run(["podman", "exec", host, "cat", LOCK], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else None


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    name = start_converged("gpu-runlock")
    yield name, sandbox_inventory(tmp_path_factory.mktemp("runlock") / "inventory", name)
    stop_container(name)


def _killed_with_the_lock(host: str, inventory: Path, reports: Path) -> dict:
    """A run SIGKILLed (its process group, as test_interrupted.py kills) once it holds the lock; its record."""
    killed = _start(inventory, reports)
    deadline = time.monotonic() + 300
    while (held := _lock(host)) is None:
        assert killed.poll() is None and time.monotonic() < deadline, "the run never took the lock"
        time.sleep(0.5)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert _lock(host) == held, "a killed run cannot give its lock back"
    return held


def test_a_killed_runs_lock_is_replaced_and_two_runs_started_together_take_turns(host, tmp_path):
    """After a run killed with the lock, two runs start in the same second: one replaces the stale lock,
    naming it; the other waits for that one, naming it, and goes on once it gave the lock back. Both
    pass, the host is verified and no lock is left."""
    name, inventory = host
    held = _killed_with_the_lock(name, inventory, tmp_path / "reports")
    runs = [_start(inventory, tmp_path / "reports"), _start(inventory, tmp_path / "reports")]
    outputs = [run.communicate(timeout=900)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n---\n".join(out[-3000:] for out in outputs)
    stale = f"replaced the stale run lock {LOCK} of the run of {held['user']} on {held['controller']}"
    replaced = [out for out in outputs if stale in out]
    assert len(replaced) == 1, "exactly one run replaces the killed run's lock"
    assert f"its ansible-playbook process {held['pid']} on {held['controller']} is gone" in replaced[0]
    waited = [
        out for out in outputs if f"{name}: waiting up to 300 s for the run lock {LOCK}, held by the run of" in out
    ]
    assert len(waited) == 1 and waited[0] is not replaced[0], "the other run waits for the one that took the lock"
    assert "ansible-playbook process" in waited[0] and "site.yml" in waited[0]
    assert _lock(name) is None, "the lock was not given back"
    report = json.loads(latest_report(tmp_path / "reports", "inventory").read_text())
    assert report["hosts"][name]["status"] == "PASS"


def test_a_failed_preflight_leaves_no_lock(host):
    """The tf_venv check (after the artifacts' check) stops the host: the lock, taken after the last check,
    was never taken; no lock is left for the next run to call stale."""
    name, inventory = host
    out = site(inventory, "-e", "tf_venv_pip_index_url=pypi.example.org/simple", playbook="playbooks/preflight.yml")
    assert out.returncode != 0 and "has no http:// or https:// scheme" in out.stdout, failures(out.stdout)
    assert _lock(name) is None, "a run stopped by a check left its run lock"


def test_a_failed_site_yml_gives_the_lock_back(host, tmp_path):
    """The host fails in the verification play, the run's last, after taking the lock: Ansible runs no
    later play (its only host failed), and the lock goes back in that play's `always`. The next run
    replaces no stale lock."""
    name, inventory = host
    reports = tmp_path / "reports"
    out = site(inventory, "-e", f"gpu_verify_report_dir={reports}", "-e", "gpu_verify_fit_learning_rate=1e200")
    assert out.returncode != 0, out.stdout[-3000:]
    took = out.stdout.split("TASK [Take the host's run lock]", 1)[-1].split("TASK [", 1)[0]
    assert f"ok: [{name}]" in took, "the run never took the lock"
    report = json.loads(latest_report(reports, "inventory").read_text())
    assert report["hosts"][name]["status"] == "FAIL", failures(out.stdout)
    assert _lock(name) is None, "the failed run left its run lock"
    again = site(inventory, "--tags", "preflight", "-e", f"gpu_verify_report_dir={reports}")
    assert again.returncode == 0, failures(again.stdout)
    assert "replaced the stale run lock" not in again.stdout + again.stderr


# --- machine-readable output: stdout is the JSON callback's alone, and the exit code agrees with the report ----


def _start_json(
    playbook: str, inventory: Path, reports: Path, label: str, *extra: str
) -> tuple[subprocess.Popen, Path]:
    """``playbook`` under the stdout callback ``json``, started: stdout (the document) to ``<label>.json`` beside
    the reports, stderr (the lines for people) a pipe read as it comes."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json")
    argv = [ANSIBLE_PLAYBOOK, str(ROOT / playbook), "-i", str(inventory), "-e", f"gpu_verify_report_dir={reports}"]
    out = reports.parent / f"{label}.json"
    with out.open("w") as handle:
        run = subprocess.Popen([*argv, *extra], cwd=ROOT, env=env, stdout=handle, stderr=subprocess.PIPE, text=True)
    return run, out


def _json_result(run: subprocess.Popen, out: Path, stderr_so_far: str = "") -> tuple[int, dict, str]:
    """The exit code, stdout parsed as one JSON document (it fails when stdout holds anything else) and stderr."""
    stderr = stderr_so_far + run.communicate(timeout=900)[1]
    return run.returncode, json.loads(out.read_text()), stderr


def _agreeing_report(name: str, rc: int, document: dict, reports: Path) -> dict:
    """The host's entry in the report just written, once the exit code, the document's stats and it agree."""
    host = json.loads(latest_report(reports, "inventory").read_text())["hosts"][name]
    stats = document["stats"][name]
    assert (rc == 0) == (host["status"] == "PASS") == (stats["failures"] == 0), (rc, host["status"], stats)
    return host


def _results(document: dict, name: str) -> list[tuple[str, dict]]:
    """Each task's result for the host, with the task's own name (without the role's), in the run's order."""
    return [
        (task["task"]["name"].split(" : ")[-1], task["hosts"][name])
        for play in document["plays"]
        for task in play["tasks"]
        if name in task["hosts"]
    ]


def _hold_live_lock(host: str) -> subprocess.Popen:
    """Another run's lock on ``host``, held by a live process of this controller (a sleep)."""
    holder = subprocess.Popen(["sleep", "900"])
    boot_id = subprocess.run(
        ["podman", "exec", host, "cat", "/proc/sys/kernel/random/boot_id"], capture_output=True, text=True, check=True
    ).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
    record = dict(gpu_run_lock.run_record(holder.pid, now), host_boot_id=boot_id)
    subprocess.run(
        ["podman", "exec", "-i", host, "sh", "-c", f"mkdir -p {Path(LOCK).parent} && cat > {LOCK}"],
        input=json.dumps(record),
        text=True,
        check=True,
    )
    return holder


def _reprovision_after_a_wait(name: str, inventory: Path, reports: Path) -> tuple[int, dict, str]:
    """playbooks/reprovision.yml while another run holds the lock, which goes away once the run says it waits."""
    holder = _hold_live_lock(name)
    try:
        run, out = _start_json("playbooks/reprovision.yml", inventory, reports, "reprovision")
        seen = ""
        for line in run.stderr:
            seen += line
            if f"{name}: waiting up to" in line:
                subprocess.run(["podman", "exec", name, "rm", "-f", LOCK], check=True)
                break
    finally:
        holder.kill()
        holder.wait()
    return _json_result(run, out, seen)


def test_under_the_json_callback_stdout_is_one_document_and_the_exit_code_agrees_with_the_report(host, tmp_path):
    """site.yml, verify.yml and reprovision.yml (waiting for another run's lock) under ANSIBLE_STDOUT_CALLBACK=json:
    stdout parses as one JSON document, the lines for people (the report's table, the wait) are on stderr, and the
    exit code, the document's stats and the report agree. Then a failure in the run's last step (the health
    baseline's record, after the verification passed) gives a report that says FAIL and names that step."""
    name, inventory = host
    reports = tmp_path / "reports"
    for playbook in ("site.yml", "playbooks/verify.yml"):
        rc, document, stderr = _json_result(*_start_json(playbook, inventory, reports, Path(playbook).stem))
        assert rc == 0, stderr[-3000:]
        assert _agreeing_report(name, rc, document, reports)["status"] == "PASS"
        (table,) = [result["table"] for _task, result in _results(document, name) if "table" in result]
        assert any(line.startswith(name) and " PASS " in line for line in table), table
        assert table[-1].startswith("Written to ") and table[-1] in stderr

    rc, document, stderr = _reprovision_after_a_wait(name, inventory, reports)
    assert f"{name}: waiting up to 300 s for the run lock {LOCK}, held by the run of" in stderr
    assert rc == 0, stderr[-3000:]
    assert _agreeing_report(name, rc, document, reports)["status"] == "PASS"
    waited = [result["waited_for"] for _task, result in _results(document, name) if result.get("waited_for")]
    assert len(waited) == 1 and "ansible-playbook process" in waited[0], waited
    assert _lock(name) is None, "the lock was not given back"

    # The last step fails: the health check's nvidia-smi is /bin/false (it could not check), which fails the host in
    # the record of the baseline after the verification passed.
    forced = ("-e", "gpu_health_nvidia_smi=/bin/false", "-e", "gpu_health_fail_on_findings=true")
    rc, document, stderr = _json_result(*_start_json("playbooks/verify.yml", inventory, reports, "failing", *forced))
    assert rc == 2, stderr[-3000:]
    report = _agreeing_report(name, rc, document, reports)
    failed = [task for task, result in _results(document, name) if result.get("failed")]
    assert failed and failed[-1].startswith("Stop when the baseline could not be written"), failed
    (problem,) = report["problems"]
    assert problem["check"] == "after_verification" and f"task '{failed[-1]}'" in problem["cause"], problem
    assert report["rows"][0]["checks"]["after_verification"]["passed"] is False
