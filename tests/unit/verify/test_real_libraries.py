"""libraries.py and gpu_verify.py against NVIDIA's real libraries, on a machine without a GPU, and the
stand-in driver and runtime side by side with NVIDIA's own.

The files are NVIDIA's (tests/fixtures/nvidia/nvidia_files.toml, fetched once per machine into the
test cache): the CUDA 11.8.89 runtime, NVRTC 11.8.89 and cuBLAS 11.11.3.6 from NVIDIA's wheels, laid
out as NVIDIA's runfile lays out the toolkit (``<root>/lib64 -> targets/x86_64-linux/lib``, each library
under its full version with its soname link; NVRTC's unversioned ``libnvrtc.so`` link beside them),
cuDNN 8.6.0.163 placed there as its archive's lib folder is, and the driver's libcuda 535.261.03 from
Debian 12's libcuda1 package.  A file that cannot be had fails the test with the reason
(nvidia_files.FetchError).  The stand-ins are built from tests/fixtures/nvidia/src/lib with gcc and the
flags build_standins.py uses.  Nothing here loads a library into the test process: libraries.py's
probe process, or a child Python, does (cuDNN calls abort() when it cannot load a sub-library).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import NVIDIA_FIXTURES, load_builder

ROOT = Path(__file__).resolve().parents[3]
VERIFY_DIR = ROOT / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))
sys.path.insert(0, str(NVIDIA_FIXTURES))

import libraries
import nvidia_files

# Wheel -> the libraries taken from it (the wheel's names are the sonames; the manifest's install
# table gives the name NVIDIA's runfile uses).
WHEELS = {
    "nvidia_cuda_runtime_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl": ["libcudart.so.11.0"],
    "nvidia_cuda_nvrtc_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl": ["libnvrtc.so.11.2"],
    "nvidia_cublas_cu11-11.11.3.6-py3-none-manylinux2014_x86_64.whl": ["libcublas.so.11", "libcublasLt.so.11"],
    "nvidia_cudnn_cu11-8.6.0.163-py3-none-manylinux1_x86_64.whl": ["libcudnn.so.8", "libcudnn_ops_infer.so.8"],
}
LIBCUDA_DEB = "libcuda1_535.261.03-1_amd64.deb"
LIBCUDA_DIR = "usr/lib/x86_64-linux-gnu/nvidia/current"
NO_DEVICE = "cudaRuntimeGetVersion returned 100 (cudaErrorNoDevice: no CUDA-capable device is detected)"
NO_DRIVER = (
    "cudaRuntimeGetVersion returned 35 (cudaErrorInsufficientDriver: CUDA driver version is insufficient for "
    "CUDA runtime version)"
)
PINS = ["--expect-cuda", "11.8", "--expect-cudnn", "8.6.0"]


def _place(wheel: Path, sonames: list[str], install: dict[str, str], lib: Path) -> None:
    """Extract ``sonames`` from ``wheel`` into ``lib`` under the runfile's names, with soname links."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            soname = os.path.basename(member)
            if soname not in sonames:
                continue
            name = os.path.basename(install[member])
            with archive.open(member) as source, open(lib / name, "wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
            (lib / name).chmod(0o755)
            if name != soname:
                (lib / soname).symlink_to(name)


@pytest.fixture(scope="module")
def nvidia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """``{"root": the toolkit (cuda-11.8), "lib64", "libcuda": the folder of Debian's libcuda.so.1}``.
    About 800 MB, removed after the module's tests."""
    entries = [nvidia_files.by_name(name) for name in [*WHEELS, LIBCUDA_DEB]]
    cached = nvidia_files.fetch(entries)  # FetchError names the file, its origin and why
    top = tmp_path_factory.mktemp("nvidia-real")
    root = top / "cuda-11.8"
    lib = root / "targets" / "x86_64-linux" / "lib"
    lib.mkdir(parents=True)
    (root / "lib64").symlink_to("targets/x86_64-linux/lib")
    for entry in entries[:-1]:
        _place(cached[entry.file], WHEELS[entry.file], entry.install, lib)
    (lib / "libnvrtc.so").symlink_to("libnvrtc.so.11.2")
    nvidia_files.unpack_deb(cached[LIBCUDA_DEB], top / "libcuda1")
    yield {"root": root, "lib64": root / "lib64", "libcuda": top / "libcuda1" / LIBCUDA_DIR}
    shutil.rmtree(top, ignore_errors=True)


def _run(script: str, args: list[str], ld_library_path: list[Path]) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(str(p) for p in ld_library_path))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(
        [sys.executable, str(VERIFY_DIR / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def run_libraries(nvidia: dict[str, Path], ld_library_path: list[Path], root: Path | None = None) -> dict[str, Any]:
    done = _run("libraries.py", ["--no-tensorflow", *PINS, "--cuda-root", str(root or nvidia["root"])], ld_library_path)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    assert done.returncode == (0 if doc["ok"] else 1)
    return doc


def system_libcuda() -> str | None:
    """A libcuda.so.1 the loader finds without LD_LIBRARY_PATH (a machine with a driver), or None."""
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    if "libcuda.so.1 " in listed:
        return "ldconfig's cache"
    folders = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
    return next((f for f in folders if os.path.exists(os.path.join(f, "libcuda.so.1"))), None)


def test_real_runtime_without_a_gpu_reads_its_version_from_its_file_name(nvidia: dict[str, Path]) -> None:
    doc = run_libraries(nvidia, [nvidia["lib64"], nvidia["libcuda"]])
    assert doc["problems"] == [] and doc["ok"] is True
    libcuda, cudart, cudnn = (doc["libraries"][key] for key in ("libcuda", "libcudart", "libcudnn"))
    assert (libcuda["raw"], libcuda["version"], libcuda["release"]) == (12020, "12.2", "535.261.03")
    lib = os.path.realpath(nvidia["lib64"])
    assert cudart["path"] == f"{lib}/libcudart.so.11.8.89"
    assert cudart["found_as"] == f"{nvidia['lib64']}/libcudart.so.11.0"
    assert (cudart["version"], cudart["release"], cudart["version_source"], cudart["raw"], cudart["ok"]) == (
        "11.8",
        "11.8.89",
        "file name",
        None,
        True,
    )
    assert (cudart["call_status"], cudart["call_error"], cudart["error"]) == (100, NO_DEVICE, None)
    assert cudart["note"] == (
        f"{NO_DEVICE}: no usable GPU or driver (the driver sees no CUDA device: kernel module not loaded, GPU not "
        "passed into the container, or no GPU); version 11.8 read from the file name libcudart.so.11.8.89"
    )
    # cuDNN answers without a GPU once libnvrtc.so and cuBLAS load.
    assert (cudnn["raw"], cudnn["version"], cudnn["release"], cudnn["ok"]) == (8600, "8.6.0", "8.6.0", True)
    assert "reinstall" not in json.dumps(doc)


def test_real_runtime_without_a_driver_names_error_35(nvidia: dict[str, Path]) -> None:
    found = system_libcuda()
    if found:
        pytest.skip(f"this machine has its own libcuda.so.1 ({found}): a host without a driver cannot be set up")
    doc = run_libraries(nvidia, [nvidia["lib64"]])
    cudart = doc["libraries"]["libcudart"]
    assert (cudart["call_status"], cudart["call_error"], cudart["version"], cudart["ok"]) == (
        35,
        NO_DRIVER,
        "11.8",
        True,
    )
    assert cudart["note"].startswith(f"{NO_DRIVER}: no NVIDIA driver (libcuda.so.1 could not be loaded)")
    # The missing driver is the libcuda check's failure; no second one for the runtime.
    assert [p["check"] for p in doc["problems"]] == ["libcuda"]
    assert doc["problems"][0]["cause"].startswith("Cannot load libcuda.so.1: libcuda.so.1: cannot open shared object")


def _loader_folder(folder: Path, lib64: Path, leave_out: str) -> Path:
    """``folder`` with a link to each file of ``lib64`` but ``leave_out``: a loader path without it."""
    folder.mkdir(parents=True)
    for entry in sorted(lib64.iterdir()):
        if entry.name != leave_out:
            (folder / entry.name).symlink_to(entry)
    return folder


def test_real_cudnn_without_libnvrtc_so_is_named_and_the_document_printed(
    nvidia: dict[str, Path], tmp_path: Path
) -> None:
    # A toolkit whose lib64 lacks NVRTC's unversioned link, on the loader path.
    partial = tmp_path / "cuda-11.8"
    lib64 = _loader_folder(partial / "lib64", nvidia["lib64"], "libnvrtc.so")
    doc = run_libraries(nvidia, [lib64, nvidia["libcuda"]], partial)
    (found,) = doc["problems"]
    cudnn = doc["libraries"]["libcudnn"]
    assert found == {
        "check": "libcudnn",
        "cause": f"cuDNN libcudnn.so.8 ({cudnn['path']}) aborted the process (SIGABRT) when asked for its version: it "
        "could not load libnvrtc.so (needed by libcudnn_ops_infer.so.8).",
        "fix": f"Install the stack's CUDA toolkit in full (cuda_toolkit role; libnvrtc.so comes with the stack's CUDA "
        f"toolkit, in {partial}/lib64) and keep {partial}/lib64 on the loader path through the gpu_env role (rerun "
        "playbooks/cuda.yml or site.yml), then run `ldconfig`; `ldconfig -p | grep libnvrtc.so` must then list it",
    }
    assert cudnn["path"] == f"{os.path.realpath(nvidia['lib64'])}/libcudnn.so.8.6.0"
    assert (cudnn["ok"], cudnn["release"], cudnn["version"]) == (False, "8.6.0", None)
    # cuDNN's own words are kept with its record.
    assert "Could not load library libcudnn_ops_infer.so.8. Error: libnvrtc.so: cannot open" in cudnn["stderr_tail"]
    # What was probed before cuDNN aborted is kept.
    assert doc["libraries"]["libcuda"]["version"] == "12.2" and doc["libraries"]["libcudart"]["version"] == "11.8"


def test_real_cudnn_whose_libnvrtc_so_is_off_the_loader_path(nvidia: dict[str, Path], tmp_path: Path) -> None:
    # The stack's toolkit has libnvrtc.so, but the loader path holds another folder without it.
    folder = _loader_folder(tmp_path / "elsewhere", nvidia["lib64"], "libnvrtc.so")
    doc = run_libraries(nvidia, [folder, nvidia["libcuda"]])
    (found,) = doc["problems"]
    lib64 = nvidia["lib64"]
    assert found["cause"].endswith(
        f"it could not load libnvrtc.so (needed by libcudnn_ops_infer.so.8); it is installed at {lib64}/libnvrtc.so, "
        f"but {lib64} is not on the loader path."
    )
    assert found["fix"] == (
        f"Put {lib64} on the loader path through the gpu_env role (rerun playbooks/cuda.yml or site.yml) and run "
        f"`ldconfig`: libnvrtc.so comes with the stack's CUDA toolkit, in {lib64}; `ldconfig -p | grep libnvrtc.so` "
        "must then list it"
    )


def test_mapped_real_libraries_are_read_in_the_probe_process(
    nvidia: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What fit.py reports after TensorFlow ran: the files of its maps, probed by path.
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{nvidia['lib64']}:{nvidia['libcuda']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lib = os.path.realpath(nvidia["lib64"])
    maps = "".join(
        f"7f{i:02x}0000-7f{i:02x}1000 r-xp 00000000 08:01 {i} {lib}/{name}\n"
        for i, name in enumerate(["libcudart.so.11.8.89", "libcudnn.so.8.6.0", "libcublas.so.11.11.3.6"])
    )
    found = libraries.mapped_library_versions(maps)
    (cudart,) = found["libcudart"]
    assert (cudart["path"], cudart["version"], cudart["release"], cudart["version_source"]) == (
        f"{lib}/libcudart.so.11.8.89",
        "11.8",
        "11.8.89",
        "file name",
    )
    assert cudart["call_error"] == NO_DEVICE and cudart["error"] is None
    (cudnn,) = found["libcudnn"]
    assert (cudnn["raw"], cudnn["version"], cudnn["error"]) == (8600, "8.6.0", None)
    assert found["libcublas"][0]["version"] == "11.11.3.6" and found["libcuda"] == []


# --- the whole verification -------------------------------------------------------------------

FAKE_FIT = """
import json, sys
argv = sys.argv[1:]
replicas = int(argv[argv.index("--cpu-replicas") + 1])
tf = {"version": "2.12.1", "is_cuda_build": False, "build_info": {"is_cuda_build": False}, "gpus": 0, "error": None}
print(json.dumps({"ok": True, "num_replicas_in_sync": replicas, "loss_start": 2.4, "loss_end": 0.6,
                  "tensorflow": tf, "loaded_libraries": None, "error": None, "problems": []}))
"""
A100_X2 = (
    "0, NVIDIA A100 80GB PCIe, GPU-3f1c2a7e, 00000000:17:00.0, 81920, 535.261.03\n"
    "1, NVIDIA A100 80GB PCIe, GPU-a84e0d3b, 00000000:65:00.0, 81920, 535.261.03\n"
)


def run_verify(tmp_path: Path, nvidia: dict[str, Path], ld_library_path: list[Path], extra: list[str]) -> tuple:
    """gpu_verify.py with a fake fit and ``extra`` options; returns (exit code, document, table)."""
    fit = tmp_path / "fit.py"
    fit.write_text(FAKE_FIT)
    args = ["--expected-gpus", "2", *PINS, "--cuda-root", str(nvidia["root"]), "--no-lspci"]
    args += ["--fit-script", str(fit), "--output", str(tmp_path / "v.json"), "--timeout", "60", *extra]
    done = _run("gpu_verify.py", args, ld_library_path)
    doc = json.loads((tmp_path / "v.json").read_text())
    table = _run("gpu_verify.py", [*args, "--format", "table"], ld_library_path).stdout
    return done.returncode, doc, table


def _nvidia_smi(tmp_path: Path, text: str | None) -> str:
    """A fake nvidia-smi: prints ``text``, or fails as it does without a driver when ``text`` is None."""
    script = tmp_path / "nvidia-smi"
    if text is None:
        body = "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"
    else:
        (tmp_path / "gpus.csv").write_text(text)
        body = f"cat '{tmp_path / 'gpus.csv'}'"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_cpu_replicas_host_passes_and_shows_the_note(nvidia: dict[str, Path], tmp_path: Path) -> None:
    smi = _nvidia_smi(tmp_path, A100_X2)
    code, doc, table = run_verify(
        tmp_path, nvidia, [nvidia["lib64"], nvidia["libcuda"]], ["--cpu-replicas", "2", "--nvidia-smi", smi]
    )
    assert (code, doc["ok"], doc["problems"]) == (0, True, [])
    assert doc["libraries"]["libcudart"]["call_status"] == 100
    assert f"note: {NO_DEVICE}: no usable GPU or driver" in table


def test_gpu_host_without_a_usable_gpu_fails_once_on_the_gpu_count(nvidia: dict[str, Path], tmp_path: Path) -> None:
    smi = _nvidia_smi(tmp_path, None)
    code, doc, table = run_verify(tmp_path, nvidia, [nvidia["lib64"], nvidia["libcuda"]], ["--nvidia-smi", smi])
    checks = {p["check"] for p in doc["problems"]}
    assert code == 1 and "gpu_count" in checks
    assert not checks & {"libcuda", "libcudart", "libcudnn", "driver"}, doc["problems"]
    assert doc["libraries"]["libcudart"]["note"].startswith(NO_DEVICE)
    assert f"note: {NO_DEVICE}" in table


def test_cudnn_abort_keeps_the_verification_document(nvidia: dict[str, Path], tmp_path: Path) -> None:
    folder = _loader_folder(tmp_path / "elsewhere", nvidia["lib64"], "libnvrtc.so")
    smi = _nvidia_smi(tmp_path, A100_X2)
    code, doc, _table = run_verify(
        tmp_path, nvidia, [folder, nvidia["libcuda"]], ["--cpu-replicas", "2", "--nvidia-smi", smi]
    )
    assert code == 1 and doc["schema"] == 1 and doc["fit"]["ok"] is True
    (found,) = doc["problems"]
    assert found["check"] == "libcudnn" and "aborted the process (SIGABRT)" in found["cause"]
    assert "libnvrtc.so (needed by libcudnn_ops_infer.so.8)" in found["cause"]


# --- the stand-ins answer like NVIDIA's files ---------------------------------------------------

DRIVER_ANSWERS = """
import ctypes, json
lib = ctypes.CDLL("libcuda.so.1")
version = ctypes.c_int(-1)
status = lib.cuDriverGetVersion(ctypes.byref(version))
print(json.dumps({"cuDriverGetVersion": [status, version.value], "cuInit": lib.cuInit(0)}))
"""
RUNTIME_ANSWERS = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
for symbol in ("cudaGetErrorName", "cudaGetErrorString"):
    getattr(lib, symbol).restype = ctypes.c_char_p
    getattr(lib, symbol).argtypes = [ctypes.c_int]
runtime, driver = ctypes.c_int(-1), ctypes.c_int(-1)
status = lib.cudaRuntimeGetVersion(ctypes.byref(runtime))
print(json.dumps({
    "cudaRuntimeGetVersion": [status, runtime.value],
    "cudaGetErrorName": lib.cudaGetErrorName(status).decode(),
    "cudaGetErrorString": lib.cudaGetErrorString(status).decode(),
    "cudaDriverGetVersion": [lib.cudaDriverGetVersion(ctypes.byref(driver)), driver.value],
}))
"""


def answers(code: str, ld_library_path: Path, *args: str) -> dict[str, Any]:
    """What ``code`` prints, run in a child process whose loader path is ``ld_library_path`` alone."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(ld_library_path))
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _compile(source: str, dest: Path, soname: str, define: str) -> Path:
    """gcc as build_standins.py's Builder.compile_lib runs it."""
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the stand-ins (apt-get install gcc)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-std=c99", f"-Wl,-soname,{soname}"]
        + ["-Wl,--hash-style=both", "-o", str(dest), str(NVIDIA_FIXTURES / "src" / "lib" / source), f"-D{define}"],
        check=True,
    )
    return dest


@pytest.fixture(scope="module")
def drivers(nvidia: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folders each holding one libcuda.so.1: ``real`` (Debian's 535.261.03), ``standin`` (the stand-in of
    the same branch), ``old`` (a stand-in of the CUDA 10.2 branch), ``none`` (empty); and
    ``standin_cudart``, the stand-in runtime as libcudart.so.11.8.89 with its soname link."""
    top = tmp_path_factory.mktemp("standins")
    found = {"real": nvidia["libcuda"], "none": top / "none"}
    found["none"].mkdir()
    # The 535 branch's CUDA version from the builder's table; 10020: the 440 branch's CUDA 10.2, older
    # than the table (NVIDIA's "CUDA Toolkit and Corresponding Driver Versions").
    for name, api in (("standin", load_builder().driver_cuda_version("535.261.03", None)), ("old", 10020)):
        _compile("libcuda.c", top / name / "libcuda.so.1", "libcuda.so.1", f"STANDIN_CUDA_DRIVER_VERSION={api}")
        found[name] = top / name
    cudart = _compile(
        "libcudart.c", top / "cudart" / "libcudart.so.11.8.89", "libcudart.so.11.0", "STANDIN_CUDART_VERSION=11080"
    )
    (cudart.parent / "libcudart.so.11.0").symlink_to(cudart.name)
    found["standin_cudart"] = cudart.parent / "libcudart.so.11.0"
    return found


def test_standin_libcuda_answers_like_debians_libcuda_535(nvidia: dict[str, Path], drivers: dict[str, Path]) -> None:
    real = answers(DRIVER_ANSWERS, drivers["real"])
    # cuDriverGetVersion needs no device: branch 535 supports CUDA 12.2; cuInit finds none.
    assert real == {"cuDriverGetVersion": [0, 12020], "cuInit": 100}
    assert answers(DRIVER_ANSWERS, drivers["standin"]) == real
    # NVIDIA's runtime over either driver: CUDA_ERROR_NO_DEVICE becomes cudaErrorNoDevice.
    cudart = str(nvidia["lib64"] / "libcudart.so.11.0")
    over_real = answers(RUNTIME_ANSWERS, drivers["real"], cudart)
    assert over_real["cudaRuntimeGetVersion"] == [100, -1]
    assert answers(RUNTIME_ANSWERS, drivers["standin"], cudart) == over_real


@pytest.mark.parametrize(
    "driver, status, name, driver_version",
    [
        ("real", 100, "cudaErrorNoDevice", 12020),  # Debian's libcuda 535, no GPU
        ("standin", 100, "cudaErrorNoDevice", 12020),
        ("old", 35, "cudaErrorInsufficientDriver", 10020),  # a CUDA 10.2 driver under CUDA 11.8
        ("none", 35, "cudaErrorInsufficientDriver", 0),  # no libcuda.so.1 at all
    ],
)
def test_standin_libcudart_answers_like_nvidias(
    nvidia: dict[str, Path], drivers: dict[str, Path], driver: str, status: int, name: str, driver_version: int
) -> None:
    found = system_libcuda() if driver == "none" else None
    if found:
        pytest.skip(f"this machine has its own libcuda.so.1 ({found}): a host without a driver cannot be set up")
    real = answers(RUNTIME_ANSWERS, drivers[driver], str(nvidia["lib64"] / "libcudart.so.11.0"))
    assert real["cudaRuntimeGetVersion"] == [status, -1]  # the version is left as it was
    assert real["cudaGetErrorName"] == name and real["cudaDriverGetVersion"] == [0, driver_version]
    assert answers(RUNTIME_ANSWERS, drivers[driver], str(drivers["standin_cudart"])) == real


def test_real_runtime_under_a_driver_too_old_names_error_35_once(
    nvidia: dict[str, Path], drivers: dict[str, Path]
) -> None:
    doc = run_libraries(nvidia, [nvidia["lib64"], drivers["old"]])
    cudart = doc["libraries"]["libcudart"]
    assert (cudart["call_status"], cudart["call_error"], cudart["version"]) == (35, NO_DRIVER, "11.8")
    # The driver check names it from the file name's version; no second failure for the runtime.
    (found,) = doc["problems"]
    assert found["check"] == "driver"
    assert "the driver supports CUDA 10.2" in found["cause"] and "the runtime is CUDA 11.8" in found["cause"]
