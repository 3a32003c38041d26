"""A stack whose CUDA comes from NVIDIA's wheels (``tensorflow[and-cuda]``), verified with NVIDIA's real files
on a machine without a GPU.

The venv is laid out as pip lays out ``nvidia-cuda-runtime-cu12`` 12.5.82, the CUDA runtime of the lock of
``tensorflow[and-cuda]==2.18.1``: NVIDIA's wheel unpacked as it is into
``<venv>/lib/python3.11/site-packages`` (``nvidia/cuda_runtime/lib/libcudart.so.12`` and the wheel's
``.dist-info`` with its RECORD). The driver is Debian 12's real libcuda 535.261.03 (CUDA 12.2: a driver of
the CUDA 12 major, which serves the 12.5 runtime under NVIDIA's minor-version compatibility). cuDNN is the
stand-in built from tests/fixtures/nvidia/src/lib/libcudnn.c as cuDNN 9.3.0 (NVIDIA's cuDNN 9 wheel is
about 600 MB), in the wheel's folder ``nvidia/cudnn/lib``. The files are pinned in
tests/fixtures/nvidia/nvidia_files.toml and fetched once per machine. Nothing is loaded into the test
process: libraries.py's probe process does it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import NVIDIA_FIXTURES

ROOT = Path(__file__).resolve().parents[3]
VERIFY_DIR = ROOT / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))
sys.path.insert(0, str(NVIDIA_FIXTURES))

import gpu_verify
import libraries
import nvidia_files

RUNTIME_WHEEL = "nvidia_cuda_runtime_cu12-12.5.82-py3-none-manylinux2014_x86_64.whl"
# CUDA 11.8's runtime, whose version call needs a device (tests/unit/verify/test_real_libraries.py).
RUNTIME_WHEEL_11 = "nvidia_cuda_runtime_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl"
LIBCUDA_DEB = "libcuda1_535.261.03-1_amd64.deb"
LIBCUDA_DIR = "usr/lib/x86_64-linux-gnu/nvidia/current"
SITE = "lib/python3.11/site-packages"
# The stack record's library_dirs (cuda_toolkit.library_dirs), as many of them as the test venv fills.
WHEEL_FOLDERS = ("cuda_runtime", "cublas", "cudnn")
PINS = ["--expect-cuda", "12.5", "--expect-cudnn", "9.3"]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``{"site": site-packages, "library_dirs": [...], "cudart": the venv's libcudart.so.12, "libcuda": the
    folder of Debian's libcuda.so.1, "top": the module's folder}``."""
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the cuDNN stand-in (apt-get install gcc)")
    entries = [nvidia_files.by_name(name) for name in (RUNTIME_WHEEL, LIBCUDA_DEB)]
    cached = nvidia_files.fetch(entries)  # FetchError names the file, its origin and why
    top = tmp_path_factory.mktemp("nvidia-wheels")
    site = top / "venv" / SITE
    nvidia_files.unpack_wheel(cached[RUNTIME_WHEEL], site)
    cudnn = site / "nvidia" / "cudnn" / "lib"
    cudnn.mkdir(parents=True)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-std=c99", "-Wl,-soname,libcudnn.so.9"]
        + ["-o", str(cudnn / "libcudnn.so.9"), str(NVIDIA_FIXTURES / "src" / "lib" / "libcudnn.c")]
        + ["-DSTANDIN_CUDNN_VERSION=90300", "-DSTANDIN_CUDART_VERSION=12050"],
        check=True,
    )
    nvidia_files.unpack_deb(cached[LIBCUDA_DEB], top / "libcuda1")
    yield {
        "top": top,
        "site": site,
        "library_dirs": [str(site / "nvidia" / name / "lib") for name in WHEEL_FOLDERS],
        "cudart": site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12",
        "libcuda": top / "libcuda1" / LIBCUDA_DIR,
    }
    shutil.rmtree(top, ignore_errors=True)


def system_cuda(venv: dict[str, Any], name: str) -> Path:
    """A system CUDA's lib64 in the module's folder ``name``: the same real libcudart under the name NVIDIA's
    runfile gives it (``libcudart.so.12.5.82``) with its soname link, as /usr/local/cuda-12.5/lib64 holds it."""
    lib64 = venv["top"] / name / "lib64"
    if not lib64.exists():
        lib64.mkdir(parents=True)
        shutil.copyfile(venv["cudart"], lib64 / "libcudart.so.12.5.82")
        (lib64 / "libcudart.so.12").symlink_to("libcudart.so.12.5.82")
    return lib64


def run_libraries(venv: dict[str, Any], ld_library_path: list[Path]) -> dict[str, Any]:
    """libraries.py for the wheels stack ``tf218``, with ``ld_library_path`` alone on the loader path."""
    args = ["--no-tensorflow", *PINS, "--cuda-source", "wheels", "--stack", "tf218"]
    args += [arg for folder in venv["library_dirs"] for arg in ("--library-dir", folder)]
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(str(p) for p in ld_library_path))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, str(VERIFY_DIR / "libraries.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    assert done.returncode == (0 if doc["ok"] else 1)
    return doc


def test_wheels_stack_passes_with_the_venvs_own_libraries(venv: dict[str, Any]) -> None:
    # No library folder of the venv on LD_LIBRARY_PATH: the probe finds them as TensorFlow's RUNPATH does.
    doc = run_libraries(venv, [venv["libcuda"]])
    assert (doc["ok"], doc["problems"]) == (True, [])
    cudart, cudnn = doc["libraries"]["libcudart"], doc["libraries"]["libcudnn"]
    assert cudart["path"] == os.path.realpath(venv["cudart"]) and cudart["soname"] == "libcudart.so.12"
    # CUDA 12.5's runtime answers its version call without a GPU; the wheel that installed the file is named.
    assert (cudart["raw"], cudart["version"], cudart["version_source"], cudart["release"], cudart["ok"]) == (
        12050,
        "12.5",
        "cudaRuntimeGetVersion",
        None,
        True,
    )
    assert cudart["wheel"] == "nvidia-cuda-runtime-cu12 12.5.82"
    assert cudnn["path"] == os.path.realpath(Path(venv["library_dirs"][2]) / "libcudnn.so.9")
    assert (cudnn["version"], cudnn["version_source"]) == ("9.3.0", "cudnnGetVersion")
    # The 535 driver (CUDA 12.2) serves the 12.5 runtime of the same major.
    assert doc["libraries"]["libcuda"]["version"] == "12.2"


def test_a_system_cudart_ahead_on_ld_library_path_fails_naming_both_files(venv: dict[str, Any]) -> None:
    lib64 = system_cuda(venv, "cuda-12.5")
    doc = run_libraries(venv, [lib64, venv["libcuda"]])
    (found,) = doc["problems"]
    stray = f"{os.path.realpath(lib64)}/libcudart.so.12.5.82"
    assert doc["libraries"]["libcudart"]["path"] == stray
    assert found == {
        "check": "libcudart",
        "cause": f"The probe mapped CUDA runtime {stray} (its folder {os.path.realpath(lib64)} is on the loader path "
        f"through LD_LIBRARY_PATH) instead of the venv's own {venv['cudart']}: a library of another CUDA shadows "
        "the stack's NVIDIA wheels, so TensorFlow loads a mix of the two.",
        "fix": f"Remove {os.path.realpath(lib64)} from LD_LIBRARY_PATH where it is set (a login file, the unit's "
        "Environment=, the user's shell), or run the program through `tf-stack run tf218`, which puts the venv's "
        "library folders first",
    }


def test_the_venvs_folders_first_on_ld_library_path_win_over_a_system_cuda(venv: dict[str, Any]) -> None:
    # As `tf-stack run` and the stack's environment file put them: the venv's folders, then the user's.
    doc = run_libraries(venv, [*map(Path, venv["library_dirs"]), system_cuda(venv, "cuda-12.5"), venv["libcuda"]])
    assert (doc["ok"], doc["problems"]) == (True, [])
    assert doc["libraries"]["libcudart"]["path"] == os.path.realpath(venv["cudart"])


def test_a_venv_without_its_runtime_wheel_is_named_with_the_fix(venv: dict[str, Any], tmp_path: Path) -> None:
    # The same venv, its nvidia/cuda_runtime/lib emptied (a wheel removed by hand).
    empty = tmp_path / "site-packages" / "nvidia" / "cuda_runtime" / "lib"
    empty.mkdir(parents=True)
    stack = dict(venv, library_dirs=[str(empty), *venv["library_dirs"][1:]])
    doc = run_libraries(stack, [venv["libcuda"]])
    (found,) = doc["problems"]
    assert found["check"] == "libcudart" and f"the venv's own {empty}/libcudart.so.12" in found["cause"]
    # Whether or not the loader's cache holds another CUDA 12 runtime, the venv is installed again.
    assert found["fix"].startswith("Rerun playbooks/tensorflow.yml (or site.yml): tf_venv installs the venv again")


def maps_line(index: int, path: str) -> str:
    """One ``/proc/<pid>/maps`` line of an executable mapping of ``path``."""
    return f"7f{index:02x}0000-7f{index:02x}1000 r-xp 00000000 08:01 {index} {path}\n"


def verify_args(venv: dict[str, Any], source: str) -> argparse.Namespace:
    where = ["--cuda-source", "wheels"] + [a for d in venv["library_dirs"] for a in ("--library-dir", d)]
    if source == "runfile":
        where = ["--cuda-root", str(venv["top"] / "cuda-12.5")]
    return gpu_verify.build_parser().parse_args(
        ["--expected-gpus", "0", "--cpu-replicas", "2", "--stack", "tf218", *PINS, *where]
    )


def tensorflow_mapped(venv: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What fit.py reports after TensorFlow ran with the venv's libcudart and a system one mapped."""
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{system_cuda(venv, 'cuda-12.5')}:{venv['libcuda']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    stray = os.path.realpath(system_cuda(venv, "cuda-12.5") / "libcudart.so.12")
    maps = maps_line(1, os.path.realpath(venv["cudart"])) + maps_line(2, stray)
    return libraries.mapped_library_versions(maps)


def test_tensorflow_mapping_a_system_cudart_fails_only_a_wheels_stack_naming_both_files(
    venv: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = tensorflow_mapped(venv, monkeypatch)
    own, stray = loaded["libcudart"]
    assert (own["version"], own["wheel"]) == ("12.5", "nvidia-cuda-runtime-cu12 12.5.82")
    assert (stray["version"], stray["release"]) == ("12.5", "12.5.82")  # the runfile's name carries it
    tf_info = {"version": "2.18.1", "is_cuda_build": True, "build_info": {}, "gpus": 0, "error": None}
    fit = {"ok": True, "problems": [], "loaded_libraries": loaded}
    args = verify_args(venv, "wheels")
    (found,) = gpu_verify.fit_problems(args, fit, tf_info, {}, {"seen": 0, "devices": []})
    assert found["check"] == "libcudart"
    assert found["cause"].startswith(f"TensorFlow mapped CUDA runtime {stray['path']} (its folder ")
    assert f"instead of the venv's own {venv['cudart']}: a library of another CUDA" in found["cause"]
    assert "`tf-stack run tf218`" in found["fix"]
    # A runfile stack is not held to the wheels' folders.
    assert gpu_verify.fit_problems(verify_args(venv, "runfile"), fit, tf_info, {}, {"seen": 0, "devices": []}) == []


def test_a_wheels_runtime_whose_version_call_needs_a_gpu_takes_the_wheels_version(
    venv: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # CUDA 11.8's runtime answers 100 (no device) and its wheel names the file by its soname only.
    site = venv["top"] / "venv-cu11" / SITE
    nvidia_files.unpack_wheel(nvidia_files.fetch([nvidia_files.by_name(RUNTIME_WHEEL_11)])[RUNTIME_WHEEL_11], site)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(venv["libcuda"]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = os.path.realpath(site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.11.0")
    (cudart,) = libraries.mapped_library_versions(maps_line(1, path))["libcudart"]
    assert cudart["call_error"].startswith("cudaRuntimeGetVersion returned 100 (cudaErrorNoDevice")
    assert (cudart["version"], cudart["version_source"], cudart["wheel"]) == (
        "11.8",
        "wheel metadata",
        "nvidia-cuda-runtime-cu11 11.8.89",
    )
    assert cudart["note"].endswith(
        "version 11.8 read from the wheel nvidia-cuda-runtime-cu11 11.8.89 that installed libcudart.so.11.0"
    )
