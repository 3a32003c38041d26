"""Interrupted runs: runs killed at ten points, then run again, on one fresh host.

Every kill is a SIGKILL of the run's process group and of every process below it. Podman's
``exec``, unlike an ssh session, leaves the command it started running in the container when its
client dies; a dropped session or a crash of the controller's host ends it, so every kill also
kills what the run had started in the container (all but its init and ``sleep infinity``).
The stand-in runfiles pause half-way through an install when ``/etc/gpu-standins/slow`` holds a
number of seconds (tests/fixtures/nvidia/README.md), so that those kills land mid-install.

1. Fresh host, full ``site.yml`` runs, each killed at the next point and each rerun first completing
   what the previous one interrupted (it must report that step changed, not take it as done): the
   driver installer (half-way), the CUDA runfile (half-way), cuDNN's copy into the toolkit, the
   environment files (``ld.so.conf.d`` written, the loader cache not yet refreshed: the rerun must
   refresh it), pip's install of TensorFlow (some dependencies in, TensorFlow not), and between
   two plays (the TensorFlow play done, the verification play not begun). No report exists.
   "Between two hosts' batches": the playbooks have no ``serial``, so every play runs on all hosts
   at once and the only boundary between batches is the one between two plays. A second host would
   double the slowest steps (pip, the fit) on a 2-core CI machine for no other boundary.
   ``--skip-tags verify`` would save nothing: every one of these runs dies before the verify play.
2. One full run converges and verifies: PASS.
3. ``playbooks/verify.yml`` alone on the converged host, killed at the copy of the verification
   scripts, during the MirroredStrategy fit and as the report write starts. gpu_verify writes one
   report folder per run and switches ``<report dir>/<inventory>/latest`` only once a report is
   whole: after each kill ``latest`` is still the last completed verification (dated before the
   killed run) or, at the report write only, a complete report of the killed run; no run killed
   earlier leaves a report; every report file parses. The stack stays usable.
4. ``site.yml --tags cuda`` on the working stack, killed at the default-symlink task and at the
   environment files: ``/usr/local/cuda``, the loader cache and ``import tensorflow`` still work.
5. A last full run: PASS, dated from this run, and nothing changed.

Takes about ten minutes on an idle 2-core machine (9 min 55 s measured), about sixteen while
other suites install TensorFlow beside it.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from ansible_run import ANSIBLE_PLAYBOOK, latest_report
from sandbox_hosts import ROOT

pytestmark = pytest.mark.integration

# Paths inside the sandbox container, not on the machine that runs the tests.
CUDA = "/usr/local/cuda-11.8"
VENV = "/opt/tensorflow/2.12"
SLOW = "/etc/gpu-standins/slow"
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05"
SITE_PACKAGES = f"{VENV}/lib/python3.11/site-packages"
RUN_LIMIT = 600  # seconds: a run that neither reaches its point nor ends is killed and fails

# A test fixture put first on the container's PATH for one run: a bare ``ldconfig`` (the refresh) waits
# for the kill once /etc/ld.so.conf.d/gpu-env.conf exists, so the kill lands before the cache is
# refreshed however late the test reads the task's header; cuDNN's earlier refresh (no gpu-env.conf yet)
# and ``ldconfig -p`` go to the real ldconfig.
HELD_LDCONFIG = "/usr/local/sbin/ldconfig"
HOLD_LDCONFIG = f"""cat > {HELD_LDCONFIG} <<'END'
#!/bin/sh
if [ "$#" -eq 0 ] && [ -e /etc/ld.so.conf.d/gpu-env.conf ]; then
    while :; do sleep 1; done
fi
exec /usr/sbin/ldconfig "$@"
END
chmod 755 {HELD_LDCONFIG}"""

# Kills every process of the container but its init (PID 1) and the container's command.
KILL_IN_CONTAINER = """
import os
for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:
    if pid in (1, os.getpid()):
        continue
    try:
        if open(f'/proc/{pid}/cmdline', 'rb').read() not in (b'', b'sleep\\0infinity\\0'):
            os.kill(pid, 9)
    except OSError:
        pass
"""


def task(role: str, name: str) -> str:
    return f"TASK [gpu_fleet.tf_hosts.{role} : {name}"


@dataclass
class Point:
    """Where to kill: after ``marker`` starts a line of the output, once ``ready(host)`` holds."""

    marker: str
    ready: Callable[[str], bool] | None = None
    slow_after: str | None = None  # output line start after which the stand-ins are made slow
    hold_ldconfig: bool = False  # a bare ldconfig waits once gpu_env's configuration is written (HOLD_LDCONFIG)


@dataclass
class Run:
    output: str
    returncode: int
    started: float

    def status(self, task_line: str) -> str:
        """First result word (changed, ok, skipping, fatal) after the task's header line; an async
        task's poll lines (ASYNC POLL, the progress callback's) come before it."""
        match = re.search(re.escape(task_line) + r"[^\n]*\n+(?:(?:ASYNC .*|.*: still running.*)\n+)*(\w+)", self.output)
        assert match, f"{task_line!r} did not run:\n{self.output[-3000:]}"
        return match.group(1)


def sh(host: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", host, "sh", "-c", script], capture_output=True, text=True)


def running(host: str, pattern: str) -> bool:
    """Whether a process of the container has ``pattern`` (a regex that does not match itself,
    e.g. ``[n]vidia-installer``) in its command line."""
    return sh(host, f"grep -lqa -- '{pattern}' /proc/[0-9]*/cmdline").returncode == 0


def exists(host: str, path: str) -> bool:
    return sh(host, f"test -e {path}").returncode == 0


def _start(inventory: Path, reports: Path, playbook: str, extra: tuple[str, ...]) -> subprocess.Popen:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_FORCE_COLOR="0",
        PYTHONUNBUFFERED="1",
    )
    argv = [ANSIBLE_PLAYBOOK, str(ROOT / playbook), "-i", str(inventory), "-e", f"gpu_verify_report_dir={reports}"]
    return subprocess.Popen(
        [*argv, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _tree(root: int) -> set[int]:
    """``root`` and every process below it (Ansible's workers start sessions of their own, so
    they and the ``podman exec`` they run are outside the playbook's process group)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree, grew = tree | below, bool(below)
    return tree


def _signal(pids: set[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _kill(proc: subprocess.Popen, host: str) -> None:
    """SIGKILL the run: its process group and every process below it (stopped first, so none
    forks past the kill), then what it had started in the container."""
    stopped: set[int] = set()
    for _ in range(3):
        fresh = _tree(proc.pid) - stopped
        _signal(fresh, signal.SIGSTOP)
        stopped |= fresh
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _signal(stopped, signal.SIGKILL)
    subprocess.run(["podman", "exec", host, "python3", "-c", KILL_IN_CONTAINER], capture_output=True)


def _wait_ready(point: Point, host: str, limit: float) -> None:
    deadline = time.monotonic() + limit
    while point.ready and not point.ready(host):
        assert time.monotonic() < deadline, f"{point.marker}: the host never reached the kill point"
        time.sleep(0.5)


def play(
    host: str, inventory: Path, reports: Path, point: Point | None = None, *extra: str, playbook: str = "site.yml"
) -> Run:
    """Run ``playbook`` (site.yml unless told) with ``extra`` arguments to its end, or until
    ``point`` and kill it there; the slow setting is removed before this returns."""
    if point and point.hold_ldconfig:
        assert sh(host, HOLD_LDCONFIG).returncode == 0, "could not put the held ldconfig in place"
    started = time.time()
    proc = _start(inventory, reports, playbook, extra)
    watchdog = threading.Timer(RUN_LIMIT, _kill, (proc, host))
    watchdog.start()
    lines: list[str] = []
    plays: list[str] = []  # when each play began, for the printout
    killed = False
    try:
        assert proc.stdout
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("PLAY ["):
                plays.append(f"{time.time() - started:.0f}s {line[6:30]}")
            if point and point.slow_after and line.startswith(point.slow_after):
                sh(host, f"mkdir -p {SLOW.rsplit('/', 1)[0]} && echo 300 > {SLOW}")
            if point and line.startswith(point.marker):
                _wait_ready(point, host, 300)
                _kill(proc, host)
                killed = True
                break
        lines.append(proc.stdout.read())
        proc.wait()
    finally:
        watchdog.cancel()
        sh(host, f"rm -f {SLOW} {HELD_LDCONFIG}")
    run = Run("".join(lines), proc.returncode, started)
    what = f"killed at {point.marker}" if point else "run to its end"
    print(f"{time.time() - started:6.1f}s  {playbook} {' '.join(extra)}: {what} ({', '.join(plays)})", flush=True)
    assert killed or point is None, f"the run ended before {point and point.marker!r}:\n{run.output[-3000:]}"
    return run


def latest(reports: Path) -> str | None:
    """The run folder ``latest`` points at: the last completed verification (gpu_verify keeps one
    folder per run and switches ``latest`` once a report is complete)."""
    link = latest_report(reports, "inventory").parent
    return os.readlink(link) if link.is_symlink() else None


def run_reports(reports: Path) -> dict[str, dict]:
    """Every run folder's fleet-report.json (each must parse: written whole or not at all)."""
    found = reports.glob("inventory/*/fleet-report.json")
    return {path.parent.name: json.loads(path.read_text()) for path in found if path.parent.name != "latest"}


def generated(report: dict) -> int:
    return calendar.timegm(time.strptime(report["generated_at"], "%Y-%m-%dT%H:%M:%SZ"))


def snapshot(reports: Path) -> tuple[str | None, set[str]]:
    """Where ``latest`` points and the run folders that hold a report, before a run."""
    return latest(reports), set(run_reports(reports))


def assert_no_stale_pass(reports: Path, run: Run, before: tuple, *, may_report: bool = False) -> None:
    """``latest`` still points at the last completed verification (``before``) or, when the kill
    came at the report write (``may_report``), at a complete report of this run; a run killed
    earlier leaves no report at all."""
    found, now = run_reports(reports), latest(reports)
    new = set(found) - before[1]
    assert may_report or not new, f"reports from a run that was killed before its report: {sorted(new)}"
    assert all(generated(found[folder]) >= int(run.started) for folder in new), "a new folder with an old report"
    if now != before[0]:
        assert may_report and now in new, f"latest moved to {now!r}, not a complete report of this run"
        assert (reports / "inventory" / now / "fleet-report.md").exists(), "latest points at a half-written report"


def assert_stack_works(host: str, *, import_tensorflow: bool = True) -> None:
    """The previous working stack: /usr/local/cuda, the loader cache, the venv's TensorFlow (its
    import takes seconds: ``import_tensorflow=False`` only loads the libraries and finds it)."""
    assert sh(host, "readlink /usr/local/cuda").stdout.strip() == CUDA
    cache = sh(host, "ldconfig -p").stdout
    assert f"{CUDA}/lib64/libcudart.so.11.0" in cache and f"{CUDA}/lib64/libcudnn.so.8" in cache, cache
    probe = "import ctypes; ctypes.CDLL('libcudart.so.11.0'); ctypes.CDLL('libcudnn.so.8'); "
    probe += (
        "import tensorflow as tf; print(tf.__version__)"
        if import_tensorflow
        else ("import importlib.metadata as m; print(m.version('tensorflow-cpu'))")
    )
    loaded = subprocess.run(["podman", "exec", host, f"{VENV}/bin/python", "-c", probe], capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout.startswith("2.12"), loaded.stderr[-2000:]


def driver_half_installed(host: str) -> bool:
    return running(host, "[n]vidia-installer") and exists(host, LIBCUDA)


def cuda_half_installed(host: str) -> bool:
    return running(host, "[c]uda-installer") and exists(host, f"{CUDA}/version.json")


# Prints how many of the lock's distributions the venv holds, and how many the lock names. pip
# installs a lock with --no-deps in the lock's (alphabetical) order, so TensorFlow itself may come
# before some of its dependencies: "half done" is measured against the lock, not by one package.
LOCK_PROGRESS = f"""
import importlib.metadata as m, re
norm = lambda name: re.sub(r'[-_.]+', '-', name).lower()
try:
    lines = open('{VENV}/tf-lock.txt').read().splitlines()
except FileNotFoundError:
    lines = []
pins = {{norm(l.split('==')[0]) for l in lines if '==' in l and not l.startswith((' ', '#'))}}
have = {{norm(d.metadata['Name']) for d in m.distributions(path=['{SITE_PACKAGES}']) if d.metadata['Name']}}
print(len(pins & have), len(pins))
"""


def lock_progress(host: str) -> tuple[int, int]:
    """(distributions of the lock installed, distributions the lock names); (0, 0) without a lock."""
    probe = ["podman", "exec", host, "python3", "-c", LOCK_PROGRESS]
    out = subprocess.run(probe, capture_output=True, text=True).stdout.split()
    return (int(out[0]), int(out[1])) if len(out) == 2 else (0, 0)


def pip_half_done(host: str) -> bool:
    """pip is installing the lock: at least 6 of its distributions are in, and not all of them."""
    if not running(host, "bin/[p]ip"):
        return False
    installed, named = lock_progress(host)
    return 6 <= installed < named


def ldconfig_held(host: str) -> bool:
    return running(host, "[u]sr/local/sbin/ldconfig")


def fit_running(host: str) -> bool:
    return running(host, "[g]pu_verify.py")


CUDA_PLAY = "PLAY [Install the CUDA toolkits"
DRIVER_TASK = task("nvidia_driver", "Run NVIDIA's driver installer")
CUDA_TASK = task("cuda_toolkit", "Run NVIDIA's CUDA installer for 11.8.0")
CUDNN_COPY = task("cudnn", f"Copy headers and libraries into {CUDA}")
# The files are written (one gpu_files task) before the loader cache is refreshed: killed as the refresh
# starts, the configuration names the toolkit and no ldconfig has read it.
ENV_CACHE = task("gpu_env", "Refresh the loader cache when it lacks")
ENV_PROFILE = task("gpu_env", "Put the toolkit on the system library path")
PIP_TASK = task("tf_venv", "Install TensorFlow 2.12")
VERIFY_PLAY = "PLAY [Verify every host and write the fleet report]"
VERIFY_COPY = task("gpu_verify", "Copy the verification scripts")
FIT_TASK = task("gpu_verify", "Run the checks and the MirroredStrategy fit in each venv")
SYMLINK_TASK = task("cuda_toolkit", "Point the default symlink at the default stack's toolkit")
REPORT_TASK = task("gpu_verify", "Write the fleet report")


@pytest.fixture
def chain_host(fresh_host, tmp_path):
    """A fresh sandbox container, an inventory for it and a report folder of its own."""
    name, inventory = fresh_host
    return name, inventory, tmp_path / "reports"


def first_pass(host: str, inventory: Path, reports: Path) -> None:
    """Fresh host, points 1-6 in playbook order; each rerun redoes the interrupted step."""
    play(host, inventory, reports, Point(DRIVER_TASK, driver_half_installed, slow_after="PLAY [Install the NVIDIA"))
    assert not exists(host, "/usr/bin/nvidia-smi") and not exists(host, "/var/lib/gpu_fleet/nvidia_driver.done")

    run = play(host, inventory, reports, Point(CUDA_TASK, cuda_half_installed, slow_after=CUDA_PLAY))
    assert run.status(DRIVER_TASK) == "changed", "the half-installed driver was taken as complete"
    assert exists(host, "/usr/bin/nvidia-smi") and not exists(host, f"{CUDA}/lib64")

    run = play(host, inventory, reports, Point(CUDNN_COPY))
    assert run.status(CUDA_TASK) == "changed", "the half-installed toolkit was taken as complete"
    assert not exists(host, f"{CUDA}/.gpu_fleet_cudnn.done")

    # Killed after /etc/ld.so.conf.d/gpu-env.conf is written and before any ldconfig has read it.
    run = play(host, inventory, reports, Point(ENV_CACHE, ldconfig_held, hold_ldconfig=True))
    assert run.status(CUDNN_COPY) == "changed", "the interrupted cuDNN copy was taken as complete"
    assert exists(host, "/etc/ld.so.conf.d/gpu-env.conf")
    assert f"{CUDA}/lib64/" not in sh(host, "ldconfig -p").stdout, "precondition: the cache lacks the toolkit"

    play(host, inventory, reports, Point(PIP_TASK, pip_half_done))
    assert f"{CUDA}/lib64/libcudart.so.11.0" in sh(host, "ldconfig -p").stdout, "the loader cache stayed stale"
    installed, named = lock_progress(host)
    assert 0 < installed < named, f"precondition: pip killed half-way through the lock ({installed} of {named})"
    assert not exists(host, f"{VENV}/tf-lock.sha256"), "the lock was recorded as installed in full"

    run = play(host, inventory, reports, Point(VERIFY_PLAY))
    assert run.status(PIP_TASK) == "changed", "the interrupted pip install was taken as complete"
    assert run_reports(reports) == {} and latest(reports) is None, "a report from runs that never verified"


def verify_pass(host: str, inventory: Path, reports: Path) -> None:
    """Converged host, points 7-9: playbooks/verify.yml alone, killed at each; the report of the
    last completed verification stays ``latest`` (or a complete new one replaces it)."""
    for point in (Point(VERIFY_COPY), Point(FIT_TASK, fit_running), Point(REPORT_TASK)):
        before = snapshot(reports)
        run = play(host, inventory, reports, point, playbook="playbooks/verify.yml")
        assert_no_stale_pass(reports, run, before, may_report=point.marker == REPORT_TASK)
        assert_stack_works(host, import_tensorflow=False)


def test_runs_killed_at_ten_points_converge_and_never_report_a_stale_pass(chain_host):
    host, inventory, reports = chain_host
    first_pass(host, inventory, reports)

    converged = play(host, inventory, reports)
    assert converged.returncode == 0, converged.output[-4000:]
    assert run_reports(reports)[latest(reports)]["hosts"][host]["status"] == "PASS"
    verify_pass(host, inventory, reports)

    # The phase alone, killed at the default switch and at the environment files of a working
    # stack: the stack keeps working.
    for point in (Point(SYMLINK_TASK), Point(ENV_PROFILE)):
        before = snapshot(reports)
        run = play(host, inventory, reports, point, "--tags", "cuda")
        assert_stack_works(host)
        assert_no_stale_pass(reports, run, before)

    last = play(host, inventory, reports)
    assert last.returncode == 0, last.output[-4000:]
    assert generated(report := run_reports(reports)[latest(reports)]) >= int(last.started)
    assert report["hosts"][host]["status"] == "PASS"
    recap = re.search(rf"^{re.escape(host)}\s+: ok=\d+\s+changed=(\d+)", last.output, re.MULTILINE)
    assert recap and recap.group(1) == "0", last.output[-4000:]
