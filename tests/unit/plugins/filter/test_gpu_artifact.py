"""gpu_artifact_problem: a folder, a short download or a file of the wrong kind is named before any push."""

from __future__ import annotations

import lzma

import pytest
import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_artifact import (
    gpu_artifact_problem,
    stack_artifact_problems,
)

XZ = "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"
TGZ = "cudnn-11.2-linux-x64-v8.1.1.33.tgz"
RUN = "cuda_11.8.0_520.61.05_linux.run"


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        (XZ, lzma.compress(b"tar bytes")),
        (TGZ, b"\x1f\x8b\x08\x00rest"),
        (RUN, b"#!/bin/sh\n# This script was generated using Makeself 2.4.5\n"),
        ("NVIDIA-Linux-x86_64-520.61.05.run", b"#!/bin/sh\nskip=1\n"),
        ("notes.txt", b"anything"),  # a kind the table does not know: only size and folder checks
    ],
)
def test_files_of_their_kind_pass(tmp_path, name, data):
    assert gpu_artifact_problem(_write(tmp_path, name, data), {"file": name, "size_bytes": len(data)}) == ""


def test_an_error_page_saved_as_the_archive_is_named_with_its_first_bytes(tmp_path):
    path = _write(tmp_path, XZ, b"<!DOCTYPE html><html><body>403 Forbidden</body></html>")
    assert gpu_artifact_problem(path, {"file": XZ}) == (
        f"{XZ} is not an xz-compressed tar archive: it starts with '<!DOCTYPE html><'. "
        "The download saved something else (an error page?)"
    )


def test_a_binary_runfile_that_is_no_script_is_refused(tmp_path):
    path = _write(tmp_path, RUN, b"\x7fELF\x02\x01\x01")
    assert gpu_artifact_problem(path, {"file": RUN}).startswith(f"{RUN} is not a self-extracting runfile")


def test_a_download_cut_short_names_both_sizes(tmp_path):
    path = _write(tmp_path, RUN, b"#!/bin/sh\n" + b"x" * 90)
    assert gpu_artifact_problem(path, {"file": RUN, "size_bytes": 4096}) == (
        f"{RUN} has 100 bytes; the manifest says 4096. The download was cut short"
    )


def test_a_folder_under_the_file_name_is_named(tmp_path):
    folder = tmp_path / XZ
    folder.mkdir()
    assert gpu_artifact_problem(str(folder), {"file": XZ}) == f"{folder} is a folder, not the file {XZ}"


def test_a_missing_file_is_left_to_the_caller(tmp_path):
    assert gpu_artifact_problem(str(tmp_path / XZ), {"file": XZ, "size_bytes": 10}) == ""


def test_the_stand_in_artifacts_pass(standins_dir):
    """The sandbox's stand-ins are real runfiles and archives in NVIDIA's formats."""
    artifacts = yaml.safe_load((standins_dir / "artifacts.yml").read_text())["artifacts"]
    assert artifacts
    for name, record in artifacts.items():
        assert gpu_artifact_problem(str(standins_dir / name), {"file": name, **record}) == "", name


def test_a_stack_gets_the_problems_of_its_own_runfile_and_archive_only():
    stack = {"cuda_toolkit": {"runfile": {"file": "cuda.run"}}, "cudnn": {"archive": {"file": "cudnn.tar.xz"}}}
    problems = {"cudnn.tar.xz": "cudnn.tar.xz has sha256 aa.", "other.run": "other.run is missing."}
    assert stack_artifact_problems(stack, problems) == "cudnn.tar.xz has sha256 aa."
    assert stack_artifact_problems(stack, {"cuda.run": "x.", "cudnn.tar.xz": "y."}) == "x. y."
    assert stack_artifact_problems(stack, {"other.run": "z."}) == ""
