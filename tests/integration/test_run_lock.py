"""The run lock on a converged host (issue 26, item 1): two site.yml runs started together, and a run
killed while it holds the lock, then run again.

1. Two runs of site.yml started in the same second: one takes the lock; the other says it waits for
   it, naming the holder, and goes on once the first gave it back. Both pass, the host is verified
   and no lock is left.
2. A run killed (SIGKILL of its process group, as test_interrupted.py kills) once it holds the lock
   leaves the lock with its record; the next run names it as stale (its process is gone), replaces it,
   passes and gives it back.

About two minutes on an idle 2-core machine (three no-op runs, one of them waiting for another).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ansible_run import ANSIBLE_PLAYBOOK, latest_report
from sandbox_hosts import ROOT, sandbox_inventory, start_converged, stop_container

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


def test_two_runs_started_together_take_turns_and_the_host_ends_verified(host, tmp_path):
    name, inventory = host
    runs = [_start(inventory, tmp_path / "reports"), _start(inventory, tmp_path / "reports")]
    outputs = [run.communicate(timeout=900)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n---\n".join(out[-3000:] for out in outputs)
    waited = [
        out for out in outputs if f"{name}: waiting up to 300 s for the run lock {LOCK}, held by the run of" in out
    ]
    assert len(waited) == 1, "exactly one run waits for the other"
    assert "ansible-playbook process" in waited[0] and "site.yml" in waited[0]
    assert _lock(name) is None, "the lock was not given back"
    report = json.loads(latest_report(tmp_path / "reports", "inventory").read_text())
    assert report["hosts"][name]["status"] == "PASS"


def test_a_run_killed_with_the_lock_is_named_stale_by_the_next_run(host, tmp_path):
    name, inventory = host
    killed = _start(inventory, tmp_path / "reports")
    deadline = time.monotonic() + 300
    while (held := _lock(name)) is None:
        assert killed.poll() is None and time.monotonic() < deadline, "the run never took the lock"
        time.sleep(0.5)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert _lock(name) == held, "a killed run cannot give its lock back"
    rerun = _start(inventory, tmp_path / "reports")
    output = rerun.communicate(timeout=900)[0]
    assert rerun.returncode == 0, output[-4000:]
    assert f"replaced the stale run lock {LOCK} of the run of {held['user']} on {held['controller']}" in output
    assert f"its ansible-playbook process {held['pid']} on {held['controller']} is gone" in output
    assert _lock(name) is None
