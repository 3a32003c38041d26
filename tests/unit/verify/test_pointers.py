"""pointers.py (files/verify): /usr/local/cuda and a login shell's CUDA_HOME and nvcc against the default
stack's toolkit, in a temporary tree; the login shell's view read from a real ``sh -l``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))

import pointers


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, str]:
    """Two toolkits with an nvcc each, and the default symlink pointing at the first."""
    roots = {}
    for series in ("11.8", "12.2"):
        root = tmp_path / f"cuda-{series}"
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
        roots[series] = str(root)
    (tmp_path / "cuda").symlink_to(roots["11.8"])
    return {"root": roots["11.8"], "other": roots["12.2"], "symlink": str(tmp_path / "cuda")}


def test_pointers_that_serve_the_default_stack_pass(tree):
    view = (tree["symlink"], os.path.join(tree["symlink"], "bin", "nvcc"))  # through the link, as profile.d has it
    section = pointers.check(tree["root"], tree["symlink"], view)
    assert section["ok"] is True and section["problems"] == []
    assert section["points_at"] == os.path.realpath(tree["root"])


def test_a_removed_symlink_fails_naming_the_default_stacks_toolkit(tree):
    os.unlink(tree["symlink"])
    section = pointers.check(tree["root"], tree["symlink"], (tree["root"], tree["root"] + "/bin/nvcc"))
    assert [p["cause"] for p in section["problems"]] == [
        f"{tree['symlink']} is missing; the default stack's toolkit is {tree['root']}."
    ]
    assert section["problems"][0]["check"] == "default" and "Rerun the playbook" in section["problems"][0]["fix"]


def test_a_symlink_and_login_shell_on_another_toolkit_fail_each_with_what_was_found(tree):
    os.unlink(tree["symlink"])
    os.symlink(tree["other"], tree["symlink"])
    section = pointers.check(tree["root"], tree["symlink"], (None, tree["other"] + "/bin/nvcc"))
    assert [p["cause"] for p in section["problems"]] == [
        f"{tree['symlink']} points at {os.path.realpath(tree['other'])}, not at the default stack's toolkit "
        f"{tree['root']}.",
        f"A login shell's CUDA_HOME is unset, not the default stack's toolkit {tree['root']}.",
        f"A login shell finds nvcc at {tree['other']}/bin/nvcc, not the default stack's {tree['root']}/bin/nvcc.",
    ]


def test_the_login_shell_view_reads_profile_scripts_from_a_bare_environment(tmp_path, monkeypatch):
    """A real login shell: its profile (here $HOME/.profile under a shell that reads it) sets CUDA_HOME
    and PATH; the probe reports both."""
    root = tmp_path / "cuda-11.8"
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    (tmp_path / ".profile").write_text(f'CUDA_HOME={root}; export CUDA_HOME; PATH="$CUDA_HOME/bin:$PATH"\n')
    monkeypatch.setenv("HOME", str(tmp_path))
    assert pointers.login_shell_view("/bin/bash") == (str(root), str(nvcc))
