"""wheels.py and the wheels stack's rules in libraries.py, gpu_verify.py and kernel.py: where a stack of NVIDIA's
wheels (tensorflow[and-cuda]) must load its libraries from, the wheel that installed a file, the driver of the
CUDA major, the command line. NVIDIA's real files: test_real_wheels.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gpu_verify
import kernel
import libraries
import pytest
import wheels

SITE = "/opt/tensorflow/2.18/lib/python3.11/site-packages"
DIRS = [f"{SITE}/nvidia/{name}/lib" for name in ("cuda_runtime", "cublas", "cudnn")]


def lib(folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"\x7fELF")
    return str(folder / name)


def test_resolve_takes_ld_library_path_before_the_wheels_then_the_loader_cache(tmp_path: Path) -> None:
    own = lib(tmp_path / "site" / "nvidia" / "cuda_runtime" / "lib", "libcudart.so.12")
    system = lib(tmp_path / "cuda-12.5" / "lib64", "libcudart.so.12")
    dirs = [os.path.dirname(own)]
    assert wheels.resolve("libcudart.so.12", None, dirs) == own
    assert wheels.resolve("libcudart.so.12", f"{tmp_path}/empty:{os.path.dirname(system)}", dirs) == system
    assert wheels.resolve("libcudnn.so.9", os.path.dirname(system), dirs) == "libcudnn.so.9"


def test_strays_are_the_cuda_libraries_outside_the_wheels_once_each() -> None:
    paths = [
        f"{DIRS[0]}/libcudart.so.12",
        "/usr/local/cuda-12.5/targets/x86_64-linux/lib/libcublasLt.so.12.5.3.2",
        "/usr/local/cuda-12.5/targets/x86_64-linux/lib/libcublasLt.so.12.5.3.2",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03",  # the driver's: never the wheels'
        "/usr/local/cuda-12.5/lib64/libcufft.so.11",  # not one the verification holds to the wheels
    ]
    assert wheels.strays(paths, DIRS) == ["/usr/local/cuda-12.5/targets/x86_64-linux/lib/libcublasLt.so.12.5.3.2"]


def test_a_stray_cublaslt_is_named_with_the_wheels_own_file_and_counts_as_cublas() -> None:
    stray = "/usr/local/cuda-12.5/targets/x86_64-linux/lib/libcublasLt.so.12.5.3.2"
    found = wheels.stray_problem(stray, "/etc/ld.so.conf.d/cuda-12-5.conf", DIRS, "tf218", "TensorFlow")
    assert found["check"] == "libcublas"
    assert found["cause"] == (
        f"TensorFlow mapped cuBLASLt {stray} (its folder /usr/local/cuda-12.5/targets/x86_64-linux/lib is on the "
        f"loader path through /etc/ld.so.conf.d/cuda-12-5.conf) instead of the venv's own {DIRS[1]}/libcublasLt.so.12, "
        "which is missing: a library of another CUDA shadows the stack's NVIDIA wheels, so TensorFlow loads a mix "
        "of the two."
    )
    assert found["fix"].startswith("Rerun playbooks/tensorflow.yml (or site.yml): tf_venv installs the venv again")


def _dist_info(site: Path, name: str, *members: str) -> None:
    info = site / f"{name}.dist-info"
    info.mkdir(parents=True)
    (info / "RECORD").write_text("".join(f"{member},sha256=x,1\n" for member in members))


def test_the_wheel_of_a_file_is_the_dist_info_whose_record_lists_it(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _dist_info(site, "nvidia_cudnn_cu12-9.3.0.75", "nvidia/cudnn/lib/libcudnn.so.9")
    _dist_info(site, "nvidia_cuda_runtime_cu12-12.5.82", "nvidia/cuda_runtime/lib/libcudart.so.12")
    cudart = lib(site / "nvidia" / "cuda_runtime" / "lib", "libcudart.so.12")
    assert wheels.wheel_of(cudart) == ("nvidia-cuda-runtime-cu12", "12.5.82")
    assert wheels.wheel_fields(f"{site}/nvidia/cudnn/lib/libcudnn.so.9") == {"wheel": "nvidia-cudnn-cu12 9.3.0.75"}
    assert wheels.wheel_of(f"{site}/nvidia/cublas/lib/libcublas.so.12") is None  # no wheel lists it
    assert wheels.wheel_of("/usr/local/cuda-12.5/lib64/libcudart.so.12.5.82") is None


def test_a_wheels_driver_of_the_cuda_major_serves_a_newer_minor() -> None:
    def record(soname: str, version: str) -> dict[str, Any]:
        return {"soname": soname, "path": f"/x/{soname}", "version": version, "ok": True}

    driver_12_2, runtime_12_5 = record("libcuda.so.1", "12.2"), record("libcudart.so.12", "12.5")
    assert libraries.compare_driver_runtime(driver_12_2, runtime_12_5, minor_compatible=True) == []
    assert [p["check"] for p in libraries.compare_driver_runtime(driver_12_2, runtime_12_5)] == ["driver"]
    driver_11_8 = record("libcuda.so.1", "11.8")
    (found,) = libraries.compare_driver_runtime(driver_11_8, runtime_12_5, minor_compatible=True)
    assert "the driver supports CUDA 11.8" in found["cause"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cuda-source", "wheels"], "--cuda-source wheels takes each --library-dir"),
        (
            ["--cuda-source", "wheels", "--library-dir", DIRS[0], "--cuda-root", "/usr/local/cuda-12.5"],
            "no --cuda-root",
        ),
        (["--library-dir", DIRS[0]], "--library-dir is for --cuda-source wheels"),
    ],
)
def test_a_cuda_source_without_its_folders_is_a_usage_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        gpu_verify.main(["--expected-gpus", "1", "--expect-cuda", "12.5", *args])
    assert raised.value.code == 2 and message in capsys.readouterr().err


def _args(*extra: str) -> Any:
    base = ["--expected-gpus", "0", "--expect-cuda", "12.5", "--expect-cudnn", "9.3", "--stack", "tf218"]
    return gpu_verify.build_parser().parse_args([*base, *extra])


def test_a_wheels_stack_has_no_tree_and_its_kernel_is_held_to_the_wheels(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    # A wheels default: the pointers are checked for no system CUDA (root None).
    monkeypatch.setattr(gpu_verify.pointers, "check", lambda *a: seen.setdefault("pointers", a) and None)
    monkeypatch.setattr(gpu_verify.kernel, "check", lambda *a: seen.setdefault("kernel", a) and None)
    wheel_args = ["--cuda-source", "wheels", *(a for d in DIRS for a in ("--library-dir", d))]
    args = _args(*wheel_args, "--default-symlink", "/usr/local/cuda", "--kernel-dir", "/k")
    assert gpu_verify.cuda_section(args) == {"source": "wheels", "root": None, "library_dirs": DIRS}
    assert gpu_verify.stack_sections(args) == (None, None)
    assert seen["kernel"] == ("tf218", "/k", None, "12.5", "9.3", DIRS)
    assert seen["pointers"] == (None, "/usr/local/cuda")
    # A runfile stack as before: its tree, /usr/local/cuda-<X.Y> without --cuda-root.
    assert gpu_verify.cuda_section(_args()) == {"source": "runfile", "root": "/usr/local/cuda-12.5", "library_dirs": []}


def test_a_wheels_kernel_loads_from_the_wheels_with_their_folders_first() -> None:
    sonames = {"libcudart": "libcudart.so.12", "libcudnn": "libcudnn.so.9"}
    doc = {
        "prefix": "/opt/tensorflow/2.18",
        "ld_library_path": ":".join([*DIRS, kernel.USER_LIBRARY_DIR]),
        "maps": "".join(
            f"7f00-7f10 r-xp 00000000 08:01 42 {path}\n"
            for path in (f"{DIRS[0]}/libcudart.so.12", f"{DIRS[2]}/libcudnn.so.9")
        ),
    }
    assert kernel.judge(doc, None, "/opt/tensorflow/2.18", sonames, DIRS)["causes"] == []
    shadowed = dict(
        doc,
        ld_library_path=f"/usr/local/cuda-12.5/lib64:{doc['ld_library_path']}",
        maps=doc["maps"].replace(f"{DIRS[0]}/libcudart.so.12", "/usr/local/cuda-12.5/lib64/libcudart.so.12.5.82"),
    )
    assert kernel.judge(shadowed, None, "/opt/tensorflow/2.18", sonames, DIRS)["causes"] == [
        "the kernel's LD_LIBRARY_PATH starts with ['/usr/local/cuda-12.5/lib64'], not the stack's NVIDIA wheels "
        f"in {SITE}/nvidia",
        "the kernel loaded /usr/local/cuda-12.5/lib64/libcudart.so.12.5.82, not the stack's libcudart.so.12 under "
        f"NVIDIA wheels in {SITE}/nvidia",
    ]
