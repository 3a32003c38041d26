"""kernel.py (files/verify): a stack's Jupyter kernel judged from its cell's output, the import error
named, the user's environment. The real start through jupyter_client is Molecule multi_stack's
(both stacks' venvs hold ipykernel there); this interpreter holds none."""

from __future__ import annotations

import json
import sys

import kernel

ROOT = "/usr/local/cuda-11.8"
SONAMES = {"libcudart": "libcudart.so.11.0", "libcudnn": "libcudnn.so.8"}
VENV = "/opt/tensorflow/2.12"


def maps(*paths: str) -> str:
    return "".join(f"7f00-7f10 r-xp 00000000 08:01 42 {path}\n" for path in paths)


def cell(**change: object) -> dict:
    doc = {
        "prefix": VENV,
        "ld_library_path": f"{ROOT}/lib64:{kernel.USER_LIBRARY_DIR}",
        "maps": maps(f"{ROOT}/lib64/libcudart.so.11.8.89", f"{ROOT}/lib64/libcudnn.so.8.6.0"),
        "errors": {},
    }
    return {**doc, **change}


def test_a_kernel_with_its_stacks_libraries_and_the_users_folder_kept_passes():
    judged = kernel.judge(cell(), ROOT, VENV, SONAMES)
    assert judged["causes"] == []
    assert judged["loaded"] == {
        "libcudart": f"{ROOT}/lib64/libcudart.so.11.8.89",
        "libcudnn": f"{ROOT}/lib64/libcudnn.so.8.6.0",
    }
    assert judged["ld_library_path"] == [f"{ROOT}/lib64", kernel.USER_LIBRARY_DIR]


def test_a_spec_that_replaced_the_users_library_path_fails_naming_what_it_holds():
    judged = kernel.judge(cell(ld_library_path=f"{ROOT}/lib64"), ROOT, VENV, SONAMES)
    assert judged["causes"] == [
        f"the kernel's LD_LIBRARY_PATH lost the user's {kernel.USER_LIBRARY_DIR} ({ROOT}/lib64)"
    ]


def test_another_stacks_libraries_and_venv_fail_each_with_the_file_found():
    other = "/usr/local/cuda-12.5/lib64"
    doc = cell(
        prefix="/opt/tensorflow/2.18",
        ld_library_path=f"{other}:{kernel.USER_LIBRARY_DIR}",
        maps=maps(f"{other}/libcudart.so.12.5.82", f"{ROOT}/lib64/libcudnn.so.8.6.0"),
    )
    causes = kernel.judge(doc, ROOT, VENV, SONAMES)["causes"]
    assert causes == [
        f"the kernel runs in /opt/tensorflow/2.18, not in the stack's venv {VENV}",
        f"the kernel's LD_LIBRARY_PATH starts with ['{other}'], not the stack's {ROOT}",
        f"the kernel loaded {other}/libcudart.so.12.5.82, not the stack's libcudart.so.11.0 under {ROOT}",
    ]


def test_a_library_the_kernel_could_not_load_is_named_with_the_loaders_error():
    error = "libcudnn.so.8: cannot open shared object file: No such file or directory"
    doc = cell(maps=maps(f"{ROOT}/lib64/libcudart.so.11.8.89"), errors={"libcudnn": error})
    assert kernel.judge(doc, ROOT, VENV, SONAMES)["causes"] == [f"the kernel could not load libcudnn.so.8: {error}"]


def test_the_kernel_starts_from_a_users_environment_without_the_binding():
    env = kernel.user_environment(
        {"PATH": "/usr/bin", "TF_STACK_REEXEC": "x", "TF_STACK_BIND": "0", "LD_LIBRARY_PATH": "/a"}
    )
    assert env == {"PATH": "/usr/bin", "LD_LIBRARY_PATH": kernel.USER_LIBRARY_DIR}


def test_a_venv_without_ipykernel_expects_no_kernel(monkeypatch):
    monkeypatch.setattr(kernel, "ipykernel_installed", lambda: False)
    assert kernel.check("tf2.12", "/nonexistent", ROOT, "11.8", "8.6") is None
    assert kernel.main(["--stack", "tf2.12", "--cuda-root", ROOT, "--cuda", "11.8", "--cudnn", "8.6"]) == 0


def test_the_import_error_is_read_from_a_real_interpreter():
    # This interpreter has no ipykernel: the error is Python's own last line.
    assert kernel.import_error(sys.executable) == "ModuleNotFoundError: No module named 'ipykernel'"


def test_ipykernel_that_does_not_import_fails_naming_the_error_and_the_lock_fix(monkeypatch, tmp_path, capsys):
    error = "ImportError: cannot import name 'TypeAliasType' from 'typing_extensions'"
    monkeypatch.setattr(kernel, "ipykernel_installed", lambda: True)
    monkeypatch.setattr(kernel, "import_error", lambda: error)
    argv = ["--stack", "tf2.12", "--cuda-root", ROOT, "--cuda", "11.8", "--cudnn", "8.6", "--kernel-dir", str(tmp_path)]
    assert kernel.main(argv) == 1
    (found,) = json.loads(capsys.readouterr().out)["problems"]
    assert found["check"] == "kernel" and error in found["cause"] and "tf-stack-tf2.12 cannot start" in found["cause"]
    assert "tools/locks.py" in found["fix"]


def test_a_missing_spec_where_ipykernel_imports_names_the_spec_and_the_rerun(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel, "ipykernel_installed", lambda: True)
    monkeypatch.setattr(kernel, "import_error", lambda: None)
    section = kernel.check("tf2.12", str(tmp_path), ROOT, "11.8", "8.6")
    assert section["ok"] is False and section["started"] is False
    assert section["problems"][0]["cause"].startswith(f"{tmp_path}/tf-stack-tf2.12/kernel.json is missing")
    assert "--tags tf_venv" in section["problems"][0]["fix"]


def test_a_kernel_that_does_not_start_fails_with_what_it_said(monkeypatch, tmp_path):
    (tmp_path / "tf-stack-tf2.12").mkdir()
    (tmp_path / "tf-stack-tf2.12" / "kernel.json").write_text("{}")
    monkeypatch.setattr(kernel, "ipykernel_installed", lambda: True)
    monkeypatch.setattr(kernel, "import_error", lambda: None)

    def fail(*_args, **_kwargs):
        raise RuntimeError("Kernel died before replying to kernel_info; the kernel said: X")

    monkeypatch.setattr(kernel, "run_cell", fail)
    section = kernel.check("tf2.12", str(tmp_path), ROOT, "11.8", "8.6")
    assert section["ok"] is False
    assert section["problems"][0]["cause"].endswith(
        "did not run a cell: Kernel died before replying to kernel_info; the kernel said: X"
    )


def test_a_spec_left_where_the_venv_holds_no_ipykernel_fails_naming_the_spec(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel, "ipykernel_installed", lambda: False)
    (tmp_path / "tf-stack-tf2.12").mkdir()
    (tmp_path / "tf-stack-tf2.12" / "kernel.json").write_text("{}")
    section = kernel.check("tf2.12", str(tmp_path), ROOT, "11.8", "8.6")
    assert section["ok"] is False and section["started"] is False
    (found,) = section["problems"]
    assert found["cause"].startswith(
        f"{tmp_path}/tf-stack-tf2.12/kernel.json lists kernel tf-stack-tf2.12, but the venv"
    )
    assert "no longer names ipykernel" in found["fix"]
