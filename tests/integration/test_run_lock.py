"""The run lock on a converged host: two site.yml runs started together, a run killed while it holds
the lock, then run again, and failed runs, which give it back.

A run killed (SIGKILL of its process group, as test_interrupted.py kills) once it holds the lock
leaves the lock with its record. Then two runs of site.yml start in the same second: one names the
killed run's lock as stale (its process is gone) and replaces it; the other says it waits for that
one, naming it, and goes on once it gave the lock back. Both pass, the host is verified and no lock
is left.

A preflight.yml that a check after the artifacts stops (tf_venv's: an index URL without a scheme) and a
site.yml whose verification fails (an absurd learning rate: the fit's loss is not finite) leave no lock.

About 80 s on an idle 2-core machine for the two no-op runs (one waiting for the other), as much again
for the failed runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
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
