"""tests/snapshots.py: the key that decides whether a converged-host snapshot may be reused.

The key is computed on a copy of the project's real inputs; each change that decides a converged
host (a role default, a task file, the stand-ins' manifest, the state's variables, the base image)
must give a new key, and what does not decide it (bytecode, other folders) must not.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import snapshots
from helpers import ROOT

BASE = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of every input of the ``converged`` state (the stand-ins' manifest written here)."""
    root = tmp_path_factory.mktemp("project")
    for name in snapshots.STATES["converged"].inputs():
        src, dst = ROOT / name, root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("artifacts.yml"):
            dst.write_text("artifacts: []\n")
        elif src.is_dir():
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    return root


def converged_key(root: Path, base: str = BASE, state: snapshots.State | None = None) -> str:
    return snapshots.key(state or snapshots.STATES["converged"], root, base_id=base)


def edited(path: Path, old: str, new: str):
    """Replace ``old`` with ``new`` in ``path`` for the block, then put the file back."""

    class Edit:
        def __enter__(self):
            self.text = path.read_text()
            assert old in self.text, f"{old!r} not in {path}"
            path.write_text(self.text.replace(old, new, 1))

        def __exit__(self, *exc):
            path.write_text(self.text)

    return Edit()


def test_the_same_inputs_give_the_same_key(tree):
    assert converged_key(tree) == converged_key(tree)
    assert len(converged_key(tree)) == 64


def test_a_changed_role_default_gives_a_new_key(tree):
    before = converged_key(tree)
    with edited(tree / "roles/tf_venv/defaults/main.yml", "tf_venv_pip_timeout:", "tf_venv_pip_timeout_x:"):
        changed = converged_key(tree)
    assert changed != before
    assert converged_key(tree) == before  # and back again once the file is as it was


@pytest.mark.parametrize(
    "path",
    [
        "roles/cuda_toolkit/tasks/main.yml",
        "plugins/filter/gpu_stack.py",
        "files/verify/fit.py",
        "data/version_matrix.yml",
        "playbooks/verify.yml",
        "inventories/sandbox/group_vars/gpu_hosts.yml",
        "build/standins/artifacts.yml",
        "requirements.txt",
    ],
)
def test_each_input_decides_the_key(tree, path):
    before = converged_key(tree)
    target = tree / path
    text = target.read_text()
    target.write_text(text + "\n# changed\n")
    try:
        assert converged_key(tree) != before, f"a change to {path} kept the key"
    finally:
        target.write_text(text)


def test_a_new_file_in_a_role_gives_a_new_key(tree):
    before = converged_key(tree)
    extra = tree / "roles/cudnn/tasks/extra.yml"
    extra.write_text("---\n")
    try:
        assert converged_key(tree) != before
    finally:
        extra.unlink()


def test_bytecode_and_other_folders_do_not_change_the_key(tree):
    before = converged_key(tree)
    cache = tree / "plugins/filter/__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "gpu_stack.cpython-311.pyc").write_bytes(b"\0")
    (tree / "README.md").write_text("other\n")
    (tree / "molecule").mkdir(exist_ok=True)
    assert converged_key(tree) == before


def test_the_base_image_and_the_states_variables_decide_the_key(tree):
    before = converged_key(tree)
    assert converged_key(tree, base="sha256:" + "1" * 64) != before
    other = snapshots.State("converged", "standins", host_vars={"gpu_verify_cpu_replicas": 4})
    assert converged_key(tree, state=other) != before


def test_the_image_name_carries_the_state_and_the_key():
    state = snapshots.STATES["converged"]
    name = snapshots.image_name(state, "ab" * 32)
    assert name == f"{snapshots.REPOSITORY}:converged-{'ab' * 8}"


# A process of another clone (a copy of the snapshot code in another folder) that takes the builder's
# lock of ``converged`` without waiting: prints "free" if it got it, "held" if someone holds it.
TRY_LOCK = """
import fcntl, sys
sys.path.insert(0, sys.argv[1])
import snapshots
snapshots.LOCKS.mkdir(parents=True, exist_ok=True)
with open(snapshots.LOCKS / "converged.lock", "w") as lock:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("free")
    except BlockingIOError:
        print("held")
"""


def test_builders_in_two_clones_on_one_machine_share_one_lock(tmp_path, monkeypatch):
    """The lock lives in the machine's test cache, not in the clone: a build of ``converged`` in this
    clone holds off one in another clone (the issue saw three clones build the same snapshot at once)."""
    other = tmp_path / "other-clone" / "tests"
    for name in ("snapshots.py", "ansible_run.py", "wheelhouse.py", "retry.py", "fixtures/nvidia/nvidia_files.py"):
        (other / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / "tests" / name, other / name)
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPU_TEST_CACHE", str(cache))
    monkeypatch.setattr(snapshots, "LOCKS", cache / "snapshots")

    def other_clone() -> str:
        done = subprocess.run([sys.executable, "-c", TRY_LOCK, str(other)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert other_clone() == "free"
    with snapshots._locked("converged"):
        assert other_clone() == "held"
