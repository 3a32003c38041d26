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


# --- a default stack whose CUDA comes from NVIDIA's wheels: the host has no system CUDA ---------------


@pytest.fixture
def wheels_host(tmp_path: Path) -> dict[str, str]:
    """No /usr/local/cuda, and gpu_env's library path file as it writes it for a wheels default: comments only."""
    conf = tmp_path / "gpu-env.conf"
    conf.write_text("# Ansible managed\n# CUDA runtime and cuDNN of the default stack (tf2.18), for every process\n")
    (tmp_path / "cuda-12.5" / "bin").mkdir(parents=True)
    return {"symlink": str(tmp_path / "cuda"), "conf": str(conf), "toolkit": str(tmp_path / "cuda-12.5")}


def test_a_wheels_default_without_any_system_cuda_passes(wheels_host):
    section = pointers.check(None, wheels_host["symlink"], (None, "/usr/bin/nvcc"), ld_conf=wheels_host["conf"])
    assert section["ok"] is True and section["problems"] == [] and section["points_at"] is None


def test_a_wheels_default_names_each_system_cuda_left_behind(wheels_host):
    """What a runfile default leaves when the switch to the wheels stack did not take: our link, the toolkit's
    lib64 in the library path file, CUDA_HOME and the toolkit's nvcc in a login shell."""
    toolkit, symlink = wheels_host["toolkit"], wheels_host["symlink"]
    os.symlink(toolkit, symlink)
    Path(wheels_host["conf"]).write_text(f"# Ansible managed\n{toolkit}/lib64\n")
    section = pointers.check(None, symlink, (toolkit, f"{symlink}/bin/nvcc"), ld_conf=wheels_host["conf"])
    wheels = "the default stack takes CUDA from NVIDIA's wheels in its venv"
    assert [p["cause"] for p in section["problems"]] == [
        f"{symlink} is a link to {os.path.realpath(toolkit)}; {wheels}, so the host has no default toolkit.",
        f"{wheels_host['conf']} puts {toolkit}/lib64 on the system library path; {wheels}.",
        f"A login shell's CUDA_HOME is {toolkit}; {wheels}.",
        f"A login shell finds a CUDA toolkit's nvcc at {symlink}/bin/nvcc; {wheels}.",
    ]
    assert all(p["check"] == "default" and "cuda_toolkit removes the link" in p["fix"] for p in section["problems"])


def test_a_folder_at_the_symlinks_path_is_no_pointer_of_a_wheels_default(wheels_host):
    """Only a link is ours (gpu_preflight refuses a folder there before any change)."""
    os.mkdir(wheels_host["symlink"])
    section = pointers.check(None, wheels_host["symlink"], (None, None), ld_conf=wheels_host["conf"])
    assert section["ok"] is True


def test_a_runfile_default_is_not_judged_by_the_library_path_file(tree, tmp_path):
    conf = tmp_path / "gpu-env.conf"
    conf.write_text(f"{tree['root']}/lib64\n")
    view = (tree["symlink"], os.path.join(tree["symlink"], "bin", "nvcc"))
    assert pointers.check(tree["root"], tree["symlink"], view, ld_conf=str(conf))["ok"] is True


def test_the_command_line_takes_wheels_or_a_toolkit_but_not_both(wheels_host, capsys):
    with pytest.raises(SystemExit) as stopped:
        pointers.main(["--wheels", "--cuda-root", wheels_host["toolkit"]])
    assert stopped.value.code == 2 and "not allowed with" in capsys.readouterr().err
    os.symlink(wheels_host["toolkit"], wheels_host["symlink"])
    argv = ["--wheels", "--symlink", wheels_host["symlink"], "--ld-conf", wheels_host["conf"]]
    assert pointers.main(argv) == 1
    assert "is a link to" in capsys.readouterr().out
