"""Artifacts come from a mirror once per run for all hosts, are verified, and are never fetched twice.

The tests run in order against two fresh sandbox hosts. The controller folder starts empty; the
mirror (loopback, counting requests) serves the stand-ins. TensorFlow and verification are skipped
(--skip-tags): this scenario is about NVIDIA's files.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import testinfra

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests/fixtures/mirror"))
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import run_playbook
from counting_mirror import CountingMirror

STANDINS = ROOT / "build/standins-small"
FILES = [
    "NVIDIA-Linux-x86_64-520.61.05.run",
    "cuda_11.8.0_520.61.05_linux.run",
    "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz",
]
HOSTS = ["molecule-art-1", "molecule-art-2"]


@pytest.fixture(scope="module")
def controller_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("controller-artifacts")


@pytest.fixture(scope="module")
def mirror():
    with CountingMirror(STANDINS) as served:
        yield served


def _site(controller_dir: Path, mirror_url: str) -> subprocess.CompletedProcess:
    return run_playbook(
        "site.yml",
        os.environ["MOLECULE_INVENTORY_FILE"],
        "--skip-tags",
        "tf_venv,gpu_verify",
        "-e",
        f"gpu_artifacts_controller_dir={controller_dir}",
        "-e",
        f"gpu_artifacts_mirror_url={mirror_url}",
    )


def _why(run: subprocess.CompletedProcess) -> str:
    """A failed run's fatal lines (each with the task before it), then the output's tail."""
    blocks = [block for block in re.split(r"\n(?=TASK \[)", run.stdout) if re.search(r"^(fatal|failed): ", block, re.M)]
    return "\n".join(blocks)[-6000:] + "\n...\n" + run.stdout[-3000:]


def _changed(run: subprocess.CompletedProcess) -> dict[str, int]:
    return {h: int(n) for h, n in re.findall(r"^(molecule-art-\d)\s+: ok=\d+\s+changed=(\d+)", run.stdout, re.M)}


def _changed_tasks(run: subprocess.CompletedProcess) -> set[str]:
    """Names of the tasks that reported a change."""
    changed = set()
    for block in re.split(r"\n(?=TASK \[)", run.stdout):
        if re.search(r"^changed: ", block, re.M):
            changed.add(re.match(r"TASK \[(.*?)\]", block).group(1))
    return changed


def test_checksum_mismatch_on_the_mirror_stops_both_hosts(tmp_path):
    controller_dir = tmp_path / "controller"
    controller_dir.mkdir()
    tampered = tmp_path / "tampered"
    shutil.copytree(STANDINS, tampered)
    with (tampered / FILES[1]).open("ab") as handle:
        handle.write(b"\n# tampered\n")
    with CountingMirror(tampered) as bad:
        run = _site(controller_dir, bad.url)
    assert run.returncode != 0
    actual = hashlib.sha256((tampered / FILES[1]).read_bytes()).hexdigest()
    # The pin is named by the manifest file it came from: the sandbox's stand-in overlay.
    assert f"The mirror's {bad.url}/{FILES[1]} has sha256 {actual}, but {STANDINS / 'artifacts.yml'} pins" in run.stdout
    assert "Nothing was installed." in run.stdout
    assert not (controller_dir / FILES[1]).exists(), "a file that failed its checksum was kept"
    for name in HOSTS:
        remote = testinfra.get_host(f"podman://{name}")
        assert remote.run("ls -d /usr/local/cuda-* 2>/dev/null").stdout == ""
        assert not remote.file("/var/cache/gpu-artifacts").exists


def test_first_run_fetches_each_artifact_once_for_both_hosts(controller_dir, mirror):
    run = _site(controller_dir, mirror.url)
    assert run.returncode == 0, _why(run)
    assert dict(mirror.counts) == dict.fromkeys(FILES, 1)
    for name in HOSTS:
        remote = testinfra.get_host(f"podman://{name}")
        assert remote.file("/usr/local/cuda-11.8/bin/nvcc").exists
        assert remote.run("find /var/cache/gpu-artifacts -type f").stdout == ""


def test_second_run_fetches_nothing_and_changes_nothing(controller_dir, mirror):
    run = _site(controller_dir, mirror.url)
    assert run.returncode == 0, _why(run)
    assert dict(mirror.counts) == dict.fromkeys(FILES, 1)
    assert _changed(run) == dict.fromkeys(HOSTS, 0)


def test_damaged_controller_copy_is_fetched_again(controller_dir, mirror):
    with (controller_dir / FILES[2]).open("ab") as handle:
        handle.write(b"bit rot")
    run = _site(controller_dir, mirror.url)
    assert run.returncode == 0, _why(run)
    assert mirror.counts[FILES[2]] == 2
    assert (mirror.counts[FILES[0]], mirror.counts[FILES[1]]) == (1, 1)
    assert (controller_dir / FILES[2]).read_bytes() == (STANDINS / FILES[2]).read_bytes()
    # The only change is the controller's fresh copy; the hosts are untouched.
    assert _changed_tasks(run) == {
        "gpu_fleet.tf_hosts.gpu_artifacts : Fetch what is missing or damaged, once for all hosts"
    }


def test_unreachable_mirror_names_the_url_and_the_fix(controller_dir):
    (controller_dir / FILES[0]).unlink()
    run = _site(controller_dir, "http://127.0.0.1:9")
    assert run.returncode != 0
    assert f"Could not fetch {FILES[0]} from http://127.0.0.1:9/{FILES[0]}:" in run.stdout
    assert "Check the mirror (gpu_artifacts_mirror_url)" in run.stdout
