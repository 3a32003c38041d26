"""gpu_artifact_problem: a folder, a short download or a file of the wrong kind is named before any push."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_artifact import (
    gpu_artifact_problem,
    stack_artifact_problems,
)

ROOT = Path(__file__).resolve().parents[4]
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


# gpu_artifacts' verification: what is needed once, and each cause of a stop word for word.
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_artifact import (
    gpu_artifacts_host_problems,
    gpu_artifacts_needed,
    gpu_artifacts_problems,
)

PIN = "ab" * 32
OTHER = "cd" * 32


def _record(name=RUN, url="https://developer.download.nvidia.com/x/" + RUN):
    return {"file": name, "sha256": PIN, "url": url, "manifest": "/m/artifacts.yml"}


def _stack(name, runfile, archive):
    return {"name": name, "cuda_toolkit": {"runfile": {"file": runfile}}, "cudnn": {"archive": {"file": archive}}}


def test_needed_names_each_file_once_and_driver_runfiles_last():
    one = {"cuda_toolkit": {"runfile": {"file": RUN}}, "cudnn": {"archive": {"file": XZ}}}
    drivers = [None, {"runfile": None}, {"runfile": {"file": "d.run"}}]
    assert [r["file"] for r in gpu_artifacts_needed([[one], [one]], drivers)] == [RUN, XZ, "d.run"]


def _problem(tmp_path, stat, outcome, manifest="/m/artifacts.yml", **settings):
    checked = [{"item": dict(_record(), manifest=manifest), "stat": stat}]
    settings = {"controller_dir": str(tmp_path), "mirror_url": "", "proxy": {}, **settings}
    return gpu_artifacts_problems(checked, [outcome], settings).get(RUN, "")


def test_an_intact_or_fetched_file_is_no_problem(tmp_path):
    assert _problem(tmp_path, {"exists": True, "checksum": PIN}, {"skipped": True}) == ""
    assert _problem(tmp_path, {"exists": False}, {"failed": False}) == ""


def test_a_missing_file_names_where_to_put_it(tmp_path):
    assert _problem(tmp_path, {"exists": False}, {"skipped": True}) == (
        f"{RUN} is not in {tmp_path} on the controller. Put NVIDIA's file there under this exact name (origin: "
        f"https://developer.download.nvidia.com/x/{RUN}), set gpu_artifacts_mirror_url to a mirror that has it, or "
        "set gpu_artifacts_controller_dir to the folder that has it. Nothing was installed."
    )


def test_a_wrong_file_names_both_hashes(tmp_path):
    assert _problem(tmp_path, {"exists": True, "checksum": OTHER}, {"skipped": True}) == (
        f"{RUN} has sha256 {OTHER}, but /m/artifacts.yml pins {PIN}. The file is corrupt or not the one pinned: "
        "download it again and compare, or correct the pin in /m/artifacts.yml if you verified the new file. "
        "Nothing was installed."
    )


def test_a_wrong_file_pinned_by_the_collections_own_manifest_is_pinned_in_an_overlay_not_there(tmp_path):
    """data/artifacts.yml is replaced on upgrade: a verified new file is pinned in the user's overlay."""
    builtin = str(ROOT / "data" / "artifacts.yml")
    assert _problem(tmp_path, {"exists": True, "checksum": OTHER}, {"skipped": True}, manifest=builtin) == (
        f"{RUN} has sha256 {OTHER}, but {builtin} pins {PIN}. The file is corrupt or not the one pinned: download it "
        f"again and compare. If you verified the new file, pin it in an overlay manifest of your own (an entry for "
        f"{RUN} with its sha256, in a file listed in gpu_preflight_manifest_overlays): {builtin} is the collection's "
        "own, and an upgrade replaces it. Nothing was installed."
    )


def test_a_failed_fetch_masks_the_password_and_names_the_proxy(tmp_path):
    said = {"failed": True, "msg": "Request failed for https://u:secret@mirror/x.run: refused.\n"}
    text = _problem(
        tmp_path, {"exists": False}, said, mirror_url="https://u:pw@mirror/", proxy={"url": "http://p:3128"}
    )
    assert text == (
        f"Could not fetch {RUN} from https://mirror/{RUN} through the proxy http://p:3128: Request failed for "
        "https://u:****@mirror/x.run: refused. Check the mirror (gpu_artifacts_mirror_url) and its copy of the file, "
        f"the proxy (gpu_artifacts_proxy), or put NVIDIA's file in {tmp_path}. Nothing was installed."
    )


def test_a_mirror_with_another_file_after_a_wrong_copy(tmp_path):
    said = {"failed": True, "msg": f"The checksum for x did not match {PIN}; it was {OTHER}."}
    text = _problem(tmp_path, {"exists": True, "checksum": OTHER}, said, mirror_url="https://mirror")
    assert text == (
        f"The copy in {tmp_path} has sha256 {OTHER}, not the pinned {PIN}, and no good copy could be fetched. "
        f"The mirror's https://mirror/{RUN} has sha256 {OTHER}, but /m/artifacts.yml pins {PIN}: the mirror holds "
        f"another file. Check the mirror (gpu_artifacts_mirror_url) and its copy of the file, or put NVIDIA's file "
        f"in {tmp_path}. Nothing was installed."
    )


def test_a_file_of_the_wrong_kind_is_named_first(tmp_path):
    _write(tmp_path, RUN, b"<html>")
    text = _problem(tmp_path, {"exists": True, "checksum": OTHER}, {"skipped": True})
    assert text.startswith(f"{RUN} is not a self-extracting runfile (a shell script): it starts with '<html>'. ")
    assert text.endswith(
        f"Put NVIDIA's file in {tmp_path} again (or remove what is there, so that the mirror's "
        "copy is fetched), and check its pin in /m/artifacts.yml. Nothing was installed."
    )


def test_a_host_holds_back_its_bad_stacks_and_stops_on_its_files():
    stacks = [_stack("new", RUN, XZ), _stack("old", "old.run", TGZ)]
    found = gpu_artifacts_host_problems(stacks, {"runfile": {"file": "d.run"}}, {XZ: "bad xz.", "d.run": "bad d."})
    assert found == {"bad_stacks": {"new": "bad xz."}, "driver_bad": True, "message": "bad xz. bad d."}
    assert gpu_artifacts_host_problems(stacks, None, {})["message"] == ""


def test_a_wheels_stack_needs_no_artifact_and_is_never_held_back_for_one():
    wheels = {"name": "w", "cuda_toolkit": {"source": "wheels", "runfile": None}, "cudnn": {"archive": None}}
    assert [r["file"] for r in gpu_artifacts_needed([[wheels, _stack("r", RUN, XZ)]], [None])] == [RUN, XZ]
    found = gpu_artifacts_host_problems([wheels, _stack("r", RUN, XZ)], None, {RUN: "bad run."})
    assert found == {"bad_stacks": {"r": "bad run."}, "driver_bad": False, "message": "bad run."}
