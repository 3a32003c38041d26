"""tf_venv_wheels_from: controller - the controller fetches a lock's wheels once for all the hosts that need
it, keeps them by the lock's digest, and pushes them only to hosts that build that venv; the hosts install
with no index.

Two fresh sandbox hosts without the session's wheelhouse, their pip index a closed loopback port: any index
access from a host fails the run (and preflight does not try it). The controller's pip takes the wheels from
the session's wheelhouse (tests/wheelhouse.py: ``PIP_NO_INDEX`` and ``PIP_FIND_LINKS`` in the controller's
environment), so nothing is downloaded from PyPI again. The stack's lock is a small part of the real one
(four of its pins, with their hashes), so that the test times the mechanism and not TensorFlow's install;
only the TensorFlow play runs (the role resolves the stacks itself).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from ansible_run import run_playbook
from sandbox_hosts import ROOT, start_container, stop_container
from snapshots import SMALL_GROUP_VARS
from wheelhouse import WHEELHOUSE

DEAD_INDEX = "http://127.0.0.1:9/simple"
REAL_LOCK = ROOT / "data" / "locks" / "tensorflow-cpu-2.12.1-py3.11.txt"
PINS = ("absl-py", "astunparse", "six", "wheel")
VENV = "/opt/tensorflow/2.12"
RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", re.MULTILINE)
DOWNLOAD_TASK = "TASK [gpu_fleet.tf_hosts.tf_venv : Download each lock's wheels once for all hosts that need them]"
UNPACK_TASK = "TASK [gpu_fleet.tf_hosts.tf_venv : Unpack on the host the controller's wheels of "


def small_lock(folder: Path) -> Path:
    """The real lock's entries of ``PINS`` (each with its hash lines), under the stack's lock name."""
    blocks, keep = [], False
    for line in REAL_LOCK.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            keep = line.split("==", 1)[0] in PINS
        if keep and (not line[:1].isspace() or line.strip().startswith("--hash")):
            blocks.append(line)
    folder.mkdir(parents=True)
    lock = folder / REAL_LOCK.name
    lock.write_text("# a part of data/locks/" + REAL_LOCK.name + "\n" + "\n".join(blocks) + "\n")
    return lock


def section(stdout: str, task: str) -> str:
    """The lines a task printed (from its header to the next one); '' when it did not run."""
    start = stdout.find(task)
    if start < 0:
        return ""
    end = stdout.find("\nTASK [", start + 1)
    return stdout[start : end if end > 0 else None]


def podman(name: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", name, *argv], capture_output=True, text=True)


def cache_files(cache: Path) -> dict[str, tuple[int, int]]:
    """The cache's wheels with what a rewrite would change (inode, modification time)."""
    return {str(p.relative_to(cache)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.rglob("*.whl")}


@pytest.fixture
def two_hosts(tmp_path):
    """Two fresh sandbox containers without the session's wheelhouse, in one inventory."""
    names = [start_container("gpu-wheels", wheelhouse=False) for _ in range(2)]
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    hosts = {n: {"ansible_connection": "podman_pipelined"} for n in names}
    (inventory / "hosts.yml").write_text(json.dumps({"gpu_hosts": {"hosts": hosts}}))
    (inventory / "group_vars").symlink_to(SMALL_GROUP_VARS)
    yield names, inventory
    for name in names:
        stop_container(name)


def test_the_controller_fetches_a_lock_once_and_pushes_it_only_where_needed(two_hosts, tmp_path, monkeypatch):
    names, inventory = two_hosts
    lock = small_lock(tmp_path / "locks")
    cache = tmp_path / "cache"
    args = ("-e", "tf_venv_wheels_from=controller", "-e", f"tf_venv_wheel_cache_dir={cache}",
            "-e", f"tf_venv_lock_dir={lock.parent}", "-e", f"tf_venv_pip_index_url={DEAD_INDEX}")  # fmt: skip

    def run() -> subprocess.CompletedProcess:
        return run_playbook("playbooks/tensorflow.yml", inventory, *args, timeout=600)

    # The controller's pip finds nothing: both hosts stop before anything is pushed, naming the lock.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "locks"))
    refused = run()
    assert refused.returncode != 0
    stopped = re.findall(
        r"^fatal: \[(\S+)\]: FAILED!.*The controller could not fetch the wheels of the lock", refused.stdout, re.M
    )
    assert sorted(stopped) == sorted(names), refused.stdout[-4000:]
    assert all(podman(n, "test", "-e", VENV).returncode == 1 for n in names), "a host was changed"

    # From the session's wheelhouse when there is one (else the controller's own index).
    if WHEELHOUSE.is_dir():
        monkeypatch.setenv("PIP_FIND_LINKS", str(WHEELHOUSE))
    else:
        monkeypatch.delenv("PIP_NO_INDEX")
        monkeypatch.delenv("PIP_FIND_LINKS")
    first = run()
    assert first.returncode == 0, first.stdout[-4000:]
    download = section(first.stdout, DOWNLOAD_TASK)
    assert download.count("-> localhost] => (item=" + lock.name) == 1, download
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    wheels = cache_files(cache)
    assert sorted(Path(w).parent.as_posix() for w in wheels) == [f"{digest}/cp311-x86_64"] * len(PINS)
    archive = cache / digest / "cp311-x86_64.tar"
    assert archive.is_file(), "the wheels were not packed for the hosts"
    packed = archive.stat().st_mtime_ns
    for name in names:
        assert podman(name, "cat", f"{VENV}/tf-lock.sha256").stdout == f"{digest}  tf-lock.txt\n"
        versions = podman(name, f"{VENV}/bin/python", "-c", "import absl, astunparse, six; print('ok')")
        assert versions.stdout.strip() == "ok", versions.stderr
        assert podman(name, "test", "-e", "/var/cache/tf-wheelhouse").returncode == 1, "the wheels stayed"

    # Converged: nothing fetched, nothing pushed, nothing changed.
    again = run()
    assert again.returncode == 0, again.stdout[-4000:]
    assert sorted(RECAP.findall(again.stdout)) == sorted((n, "0") for n in names)
    assert DOWNLOAD_TASK not in again.stdout
    assert cache_files(cache) == wheels and archive.stat().st_mtime_ns == packed

    # One venv off its lock: the cache serves it without a download, and only that host gets the wheels.
    assert podman(names[1], "rm", f"{VENV}/tf-lock.sha256").returncode == 0
    rebuild = run()
    assert rebuild.returncode == 0, rebuild.stdout[-4000:]
    assert "changed: [" not in section(rebuild.stdout, DOWNLOAD_TASK)
    unpack = section(rebuild.stdout, UNPACK_TASK)
    # The converged host does not reach the unpack at all (its venv is not in the update loop).
    assert f"changed: [{names[1]}]" in unpack and names[0] not in unpack, unpack
    assert dict(RECAP.findall(rebuild.stdout))[names[0]] == "0"
    assert cache_files(cache) == wheels and archive.stat().st_mtime_ns == packed
