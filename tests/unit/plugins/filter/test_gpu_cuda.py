"""gpu_cuda: cuda_toolkit's look, its decision per toolkit, its plan and its stops, word for word."""

from __future__ import annotations

import json

import pytest
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_cuda

ROOT = "/usr/local/cuda-11.8"
TOOLKIT = {
    "version": "11.8.0",
    "root": ROOT,
    "nvcc_version": "11.8.89",
    "cudart_soname": "libcudart.so.11.0",
    "runfile": {"file": "cuda_11.8.0_520.61.05_linux.run"},
}
DONE = ".done"
INPUTS = {"done": DONE, "cache_files": [], "link": "/usr/local/cuda", "default_root": ROOT}


def _look(nvcc="11.8.89", record="11.8.89\n", runtime=True, link=ROOT):
    stat = {path: {"target_exists": runtime} for path in gpu_cuda.gpu_cuda_look_paths([TOOLKIT], "rel", DONE)["stat"]}
    stat["/usr/local/cuda"] = {"exists": True, "islnk": True, "lnk_target": link}
    version = json.dumps({"cuda_nvcc": {"version": nvcc}}) if nvcc else None
    return {"stat": stat, "read": {f"{ROOT}/version.json": version, f"{ROOT}/{DONE}": record}}


def test_the_look_reads_the_link_then_each_toolkit():
    assert gpu_cuda.gpu_cuda_look_paths([TOOLKIT], "/usr/local/cuda", DONE) == {
        "stat": [
            "/usr/local/cuda",
            f"{ROOT}/bin/nvcc",
            f"{ROOT}/lib64/libcudart.so",
            f"{ROOT}/lib64/libcudart.so.11.0",
        ],
        "read": [f"{ROOT}/version.json", f"{ROOT}/{DONE}"],
    }


def test_a_converged_toolkit_takes_no_task_and_trusts_the_link():
    decided = gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(), INPUTS)
    assert decided == {
        "work": [],
        "plan": {ROOT: {"change": False, "text": "CUDA 11.8.0 installed"}},
        "link_ok": True,
    }


def test_a_runfile_left_in_the_cache_brings_the_toolkit_to_the_loop():
    cached = dict(INPUTS, cache_files=[f"/var/cache/gpu-artifacts/cuda_toolkit/11.8.0/{TOOLKIT['runfile']['file']}"])
    (work,) = gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(), cached)["work"]
    assert work["installed"] is True
    assert gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(), dict(INPUTS, cache_files=None))["work"]
    assert not gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(), dict(cached, keep_cache=True))["work"]


def test_an_interrupted_install_is_reinstalled_and_the_link_looked_at_again():
    decided = gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(record=None), INPUTS)
    assert decided["plan"][ROOT]["text"] == f"CUDA 11.8.0 would be reinstalled ({ROOT} is incomplete or another build)"
    assert decided["work"][0]["installed"] is False and decided["link_ok"] is False
    assert not gpu_cuda.toolkit_installed(TOOLKIT, _look(runtime=False), DONE)
    fresh = gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(nvcc=None), INPUTS)
    assert fresh["plan"][ROOT]["text"] == f"CUDA 11.8.0 would be installed in {ROOT}"


def test_the_link_is_trusted_only_pointing_at_the_default_with_nothing_changed():
    assert gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(), INPUTS)["link_ok"]
    assert not gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(link="/usr/local/cuda-12.2"), INPUTS)["link_ok"]
    earlier = {"x": {"change": True, "text": "x"}}
    assert not gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(), dict(INPUTS, plan=earlier))["link_ok"]


def test_the_plan_joins_toolkits_link_and_removals():
    parts = {
        "toolkits": {ROOT: {"change": False, "text": "CUDA 11.8.0 installed"}},
        "link": "/usr/local/cuda",
        "link_changed": False,
        "default_root": ROOT,
        "removed": [{"name": "old", "cuda_root": "/usr/local/cuda-11.2"}],
    }
    assert gpu_cuda.gpu_cuda_plan({"a": {"change": False, "text": "a"}}, parts) == {
        "a": {"change": False, "text": "a"},
        ROOT: {"change": False, "text": "CUDA 11.8.0 installed"},
        "/usr/local/cuda": {"change": False, "text": f"/usr/local/cuda -> {ROOT}"},
        "/usr/local/cuda-11.2": {"change": True, "text": "/usr/local/cuda-11.2 would be removed (stack old is absent)"},
    }
    changed = gpu_cuda.gpu_cuda_plan(None, dict(parts, link_changed=True, removed=[]))
    assert changed["/usr/local/cuda"]["text"] == f"/usr/local/cuda would point at {ROOT}"


# A default stack whose CUDA comes from NVIDIA's wheels has no toolkit: default_root None ("" under ansible-core
# 2.16, which renders a null as an empty string).
@pytest.mark.parametrize("none", [None, ""])
def test_a_wheels_default_trusts_only_a_path_without_a_link(none):
    wheels = dict(INPUTS, default_root=none)
    assert not gpu_cuda.gpu_cuda_toolkits([TOOLKIT], _look(), wheels)["link_ok"]  # our link: it goes
    for stat in ({"exists": False, "islnk": False}, {"exists": True, "isdir": True, "islnk": False}):
        look = _look()
        look["stat"]["/usr/local/cuda"] = stat
        assert gpu_cuda.gpu_cuda_toolkits([TOOLKIT], look, wheels)["link_ok"], stat
        # NVIDIA's installer points the link at what it installed: a toolkit installed in this run.
        look["read"][f"{ROOT}/{DONE}"] = None
        assert not gpu_cuda.gpu_cuda_toolkits([TOOLKIT], look, wheels)["link_ok"], stat


@pytest.mark.parametrize("none", [None, ""])
def test_the_plan_of_a_wheels_default_says_the_link_goes(none):
    parts = {"toolkits": {}, "link": "/usr/local/cuda", "link_changed": True, "default_root": none, "removed": []}
    assert gpu_cuda.gpu_cuda_plan(None, parts)["/usr/local/cuda"] == {
        "change": True,
        "text": "/usr/local/cuda would be removed (the default stack's CUDA comes from NVIDIA's wheels in its venv)",
    }
    same = gpu_cuda.gpu_cuda_plan(None, dict(parts, link_changed=False))["/usr/local/cuda"]
    assert same["text"] == "/usr/local/cuda: none (the default stack's CUDA comes from NVIDIA's wheels in its venv)"


def test_the_check_names_a_folder_a_relative_link_and_a_short_time_limit():
    assert gpu_cuda.gpu_cuda_check_problems("/usr/local/cuda", {"exists": True, "islnk": True}) == []
    assert gpu_cuda.gpu_cuda_check_problems("/usr/local/cuda", {}, "3600") == []
    (folder,) = gpu_cuda.gpu_cuda_check_problems("/usr/lib", {"exists": True, "isdir": True})
    assert folder == (
        "cuda_toolkit_default_symlink /usr/lib exists and is not a symbolic link (a folder); the run would replace "
        "it with a link to the default toolkit. Move it aside on the host when it is a CUDA installed by hand "
        "(mv /usr/lib /usr/lib.manual), or set cuda_toolkit_default_symlink to /usr/local/cuda (the default) or "
        "another absolute path that is free or already a symbolic link."
    )
    (relative, short) = gpu_cuda.gpu_cuda_check_problems("cuda", None, 30)
    assert relative.startswith("cuda_toolkit_default_symlink cuda is not an absolute path. Set it to")
    assert short == (
        "cuda_toolkit_install_timeout is 30; it is the seconds NVIDIA's CUDA installer may run before the run "
        "stops it, at least 60. Set it to 3600 (the default) or more on slow disks."
    )
    assert gpu_cuda.gpu_cuda_check_problems("/usr/local/cuda", {}, "1h")[0].startswith("cuda_toolkit_install_timeout")


def test_the_option_rule_takes_whole_seconds_of_at_least_60():
    assert gpu_cuda.gpu_cuda_option_problems({"cuda_toolkit_install_timeout": 60}) == []
    for bad in (59, "1h", None, -1):
        (problem,) = gpu_cuda.gpu_cuda_option_problems({"cuda_toolkit_install_timeout": bad})
        assert problem.startswith(f"cuda_toolkit_install_timeout is {bad}; ")


def test_the_installed_nvcc_is_compared_with_the_pin():
    assert gpu_cuda.gpu_cuda_nvcc_problem(json.dumps({"cuda_nvcc": {"version": "11.8.89"}}), TOOLKIT) == ""
    assert gpu_cuda.gpu_cuda_nvcc_problem("{}", TOOLKIT) == (
        f"{ROOT}/version.json names nvcc none, expected 11.8.89 from cuda_11.8.0_520.61.05_linux.run. See "
        "/var/log/cuda-installer.log on the host; the runfile may not be the one the manifest describes."
    )
