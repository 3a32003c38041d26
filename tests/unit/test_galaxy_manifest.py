"""The collection tarball's allow-list (galaxy.yml's ``manifest``): built from a copy of the clone
with stray files of a working clone in it (a playbook of one's own beside site.yml, another
inventory, reports, editor backups, bytecode), the tarball holds none of them and every tracked file
that the collection needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STRAY = [
    "facts_only.yml",
    "inventories/lab/hosts.yml",
    "inventories/gpu_hosts/host_vars/node1.yml~",
    "reports/inventory/latest/fleet-report.json",
    "roles/gpu_env/tasks/.main.yml.swp",
    "plugins/filter/__pycache__/gpu_stack.cpython-311.pyc",
    "build/wheelhouse/six-1.17.0-py2.py3-none-any.whl",
    "notes.txt",
]
# Tracked files the collection does not need: the clone's tools, tests and configuration.
CLONE_ONLY = ("tests/", "molecule/", "tools/", ".", "Makefile", "ansible.cfg", "inventories/sandbox/", "collections")
CLONE_ONLY_FILES = {
    "galaxy.yml",
    "execution-environment.yml",
    "pyproject.toml",
    "requirements.txt",
    "requirements-docs.txt",
}


def tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.splitlines() if (ROOT / name).exists()]


def test_the_tarball_holds_what_the_collection_needs_and_no_stray_file(tmp_path):
    clone = tmp_path / "tf_hosts"
    for name in tracked():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, clone / name, follow_symlinks=False)
    for name in STRAY:
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text("stray\n")
    built = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(clone)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [tarball] = tmp_path.glob("gpu_fleet-tf_hosts-*.tar.gz")
    with tarfile.open(tarball) as archive:
        packed = {member.name for member in archive.getmembers() if member.isfile()}
    assert not packed & set(STRAY)
    needed = {
        name
        for name in tracked()
        if not name.startswith(CLONE_ONLY) and name not in CLONE_ONLY_FILES and not (ROOT / name).is_symlink()
    }
    assert needed - packed == set(), "tracked files the collection needs are missing from the tarball"
    assert packed - needed == {"MANIFEST.json", "FILES.json"}
