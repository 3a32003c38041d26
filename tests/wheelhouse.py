"""One wheelhouse per machine: the wheels of every lock the test hosts install, downloaded once.

``make wheelhouse`` (a step of ``make molecule``, ``make integration`` and ``make test``) downloads
each lock's wheels for the hosts' platform into the machine's test cache (``wheelhouse/`` in
GPU_TEST_CACHE, default ~/.cache/gpu-fleet-tests; tests/fixtures/nvidia/nvidia_files.py), shared by
every clone, with ``pip download --require-hashes``, so every file is the one the lock names; a file
already there is checked, not fetched again. Two clones that download at once wait for each other. Test hosts get the folder read-only at /srv/test-wheelhouse and
``PIP_NO_INDEX=1 PIP_FIND_LINKS=/srv/test-wheelhouse`` in their environment: tf_venv's pip (the
role's own command line, ``--require-hashes`` included) takes every wheel from there instead of
downloading it again. Molecule ``default`` and the air-gap test keep their own paths: ``default``
installs from PyPI as users do, the air-gap bundle brings its own wheelhouse.

Usage: python tests/wheelhouse.py      download what is missing, print the folder
Exit codes: 0 done; 1 pip failed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvidia"))

import retry
from nvidia_files import cache_dir, locked

WHEELHOUSE = Path(os.environ.get("GPU_TEST_WHEELHOUSE", cache_dir() / "wheelhouse"))
HOST_DIR = "/srv/test-wheelhouse"
# The locks the test hosts install: the sandbox's default stack (the GPU build real hosts get), its
# CPU build (the hosts of the tests of the roles' logic) and Molecule multi_stack's second, and
# multi_stack's own locks of both with ipykernel (tests/fixtures/locks-jupyter, made by tools/locks.py
# --extra ipykernel==6.29.5; their header has the command).
LOCKS = tuple(
    ROOT / "data" / "locks" / name
    for name in (
        "tensorflow-2.12.1-py3.11.txt",
        "tensorflow-cpu-2.12.1-py3.11.txt",
        "tensorflow-cpu-2.18.1-py3.11.txt",
        # The Debian 13 host (tests/integration/test_newest_core.py): CPython 3.13.
        "tensorflow-cpu-2.20.0-py3.13.txt",
        # A stack whose CUDA and cuDNN are NVIDIA's wheels (tensorflow[and-cuda]): about 2.4 GB, most of it
        # the nvidia-*-cu12 wheels, fetched once per machine like the rest.
        "tensorflow-and-cuda-2.18.1-py3.11.txt",
    )
)
LOCKS += tuple(sorted((ROOT / "tests" / "fixtures" / "locks-jupyter").glob("*.txt")))
# The sandbox hosts: x86_64 with the CPython X.Y that the lock's name ends with (-pyX.Y.txt), the tags
# the locks' wheels carry.
PLATFORM = [
    "--only-binary=:all:",
    "--implementation=cp",
    "--platform=manylinux2014_x86_64",
    "--platform=manylinux_2_17_x86_64",
    "--platform=linux_x86_64",
]


def python_version(lock: Path) -> str:
    """The hosts' Python X.Y of a lock named <package>-<version>-pyX.Y.txt (tools/locks.py's names)."""
    return lock.stem.rsplit("-py", 1)[1]


def download_command(lock: Path, dest: Path = WHEELHOUSE) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "-r", str(lock),
            *PLATFORM, f"--python-version={python_version(lock)}", "--dest", str(dest)]  # fmt: skip


# The clone's name for the machine's wheelhouse: Molecule's platforms mount it from there.
CLONE_LINK = ROOT / "build" / "wheelhouse"


def build(dest: Path = WHEELHOUSE, link: Path = CLONE_LINK) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with locked(dest, "download"):
        for lock in LOCKS:
            retry.run(download_command(lock, dest), what=f"pip download of {lock.name}'s wheels")
    link_clone(dest, link)
    return dest


def link_clone(dest: Path, link: Path) -> None:
    """Point ``link`` (build/wheelhouse) at ``dest``, replacing a folder an older clone downloaded into."""
    if link.is_symlink() and link.resolve() == dest.resolve():
        return
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.is_symlink() or link.exists():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(dest)


def container_options() -> list[str]:
    """``podman run`` options of a test host that installs from the session's wheelhouse; none when
    it has not been downloaded (the host then downloads from the index)."""
    if not WHEELHOUSE.is_dir():
        return []
    return ["-v", f"{WHEELHOUSE}:{HOST_DIR}:ro", "-e", "PIP_NO_INDEX=1", "-e", f"PIP_FIND_LINKS={HOST_DIR}"]


if __name__ == "__main__":
    try:
        print(build())
    except retry.RetryError as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        sys.exit(1)
