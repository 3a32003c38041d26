"""libraries.py: version decoding, sonames, comparisons, and real loading of the stand-ins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import load_builder

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))

import libraries


def rec(soname: str, raw: int, version: str, path: str = "/usr/local/cuda-11.8/lib64/x") -> dict[str, Any]:
    return {
        "soname": soname,
        "path": path,
        "raw": raw,
        "version": version,
        "ok": True,
        "error": None,
    }


@pytest.mark.parametrize(
    "raw, text",
    [
        (11080, "11.8"),
        (11020, "11.2"),
        (12020, "12.2"),
        (12050, "12.5"),
        (13000, "13.0"),
    ],
)
def test_decode_cuda_version(raw: int, text: str) -> None:
    assert libraries.decode_cuda_version(raw) == text


@pytest.mark.parametrize(
    "raw, text",
    [
        (8600, "8.6.0"),
        (8907, "8.9.7"),
        (8100, "8.1.0"),
        (90300, "9.3.0"),
        (90100, "9.1.0"),
        (91001, "9.10.1"),
    ],
)
def test_decode_cudnn_version(raw: int, text: str) -> None:
    assert libraries.decode_cudnn_version(raw) == text


@pytest.mark.parametrize(
    "cuda, soname",
    [
        ("11.8", "libcudart.so.11.0"),
        ("11.2", "libcudart.so.11.0"),
        ("12.5", "libcudart.so.12"),
        ("13.0", "libcudart.so.13"),
        ("10.2", "libcudart.so.10.2"),
    ],
)
def test_cudart_soname(cuda: str, soname: str) -> None:
    assert libraries.cudart_soname(cuda) == soname


def test_cudnn_soname_and_bad_versions() -> None:
    assert libraries.cudnn_soname("8.6.0") == "libcudnn.so.8"
    assert libraries.cudnn_soname("9.3.0.75") == "libcudnn.so.9"
    with pytest.raises(ValueError):
        libraries.cudart_soname("11")
    with pytest.raises(ValueError):
        libraries.cudnn_soname("eight")


def test_paths_from_maps_matches_the_library_not_its_siblings() -> None:
    maps = (
        "7f1 r--p 00000000 08:01 11 /usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0\n"
        "7f2 r-xp 00001000 08:01 11 /usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0\n"
        "7f3 r--p 00000000 08:01 12 /usr/local/cuda-11.8/lib64/libcudnn_ops_infer.so.8.6.0\n"
        "7f4 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05\n"
        "7f5 r--p 00000000 08:01 14 /usr/local/cuda-11.8/lib64/libcudart.so.11.8.89\n"
        "7f6 rw-p 00000000 00:00 0 \n"
    )
    assert libraries.paths_from_maps(maps, "libcudnn.so") == ["/usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0"]
    assert libraries.paths_from_maps(maps, "libcuda.so") == ["/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05"]
    assert libraries.paths_from_maps(maps, "libcudart.so") == ["/usr/local/cuda-11.8/lib64/libcudart.so.11.8.89"]


def test_compare_cudart() -> None:
    assert libraries.compare_cudart(rec("libcudart.so.11.0", 11080, "11.8"), "11.8") == []
    (found,) = libraries.compare_cudart(
        rec("libcudart.so.11.0", 11020, "11.2", "/usr/lib/libcudart.so.11.2.152"),
        "11.8",
    )
    assert found["check"] == "libcudart"
    assert "is 11.2, the stack pins 11.8" in found["cause"] and "/usr/lib/libcudart.so.11.2.152" in found["cause"]
    assert "ldconfig" in found["fix"]


def test_compare_cudnn_ignores_build_number_and_flags_mismatch() -> None:
    assert libraries.compare_cudnn(rec("libcudnn.so.8", 8600, "8.6.0"), "8.6.0.163") == []
    (found,) = libraries.compare_cudnn(rec("libcudnn.so.8", 8101, "8.1.1"), "8.6.0")
    assert "is 8.1.1, the stack pins 8.6.0" in found["cause"]


STALE = "/usr/lib/x86_64-linux-gnu/libcudnn.so.8.5.0"
PINNED = "/usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0"
DEBIAN_CONF = {
    "gpu-env.conf": ["/usr/local/cuda-11.8/lib64"],
    "x86_64-linux-gnu.conf": ["/usr/local/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"],
}


def test_stale_cudnn_ahead_of_the_pinned_copy_names_both_and_why() -> None:
    stale = dict(rec("libcudnn.so.8", 8500, "8.5.0", STALE), found_as="/usr/lib/x86_64-linux-gnu/libcudnn.so.8")
    order = libraries.loader_search_order(None, DEBIAN_CONF)
    (found,) = libraries.compare_cudnn(stale, "8.6.0", (PINNED, "8.6.0"), order)
    assert found["check"] == "libcudnn"
    assert found["cause"].startswith(
        f"cuDNN libcudnn.so.8: the loader loaded {STALE} (cuDNN 8.5.0) ahead of the pinned {PINNED} (8.6.0); "
        "the stack pins 8.6.0. TensorFlow built with cuDNN 8.6.0 refuses it (minor 5 < 6;"
    )
    assert found["fix"].startswith(
        "Remove or move /usr/lib/x86_64-linux-gnu/libcudnn.so.8 (and the file it points to) out of "
        "/usr/lib/x86_64-linux-gnu, then run `ldconfig`; `ldconfig -p | grep libcudnn.so` must then list "
        "/usr/local/cuda-11.8/lib64/libcudnn.so.8 first. /usr/lib/x86_64-linux-gnu is on the loader path through "
        "/etc/ld.so.conf.d/x86_64-linux-gnu.conf ("
    )


def test_stale_cudnn_fix_names_the_folder_as_ldconfig_lists_it(tmp_path) -> None:
    # CUDA's runfile makes lib64 a link to targets/x86_64-linux/lib: the pinned copy resolves into
    # the target folder, but `ldconfig -p` prints the configured lib64 path.
    target = tmp_path / "cuda-11.8" / "targets" / "x86_64-linux" / "lib"
    target.mkdir(parents=True)
    (tmp_path / "cuda-11.8" / "lib64").symlink_to("targets/x86_64-linux/lib")
    lib64 = str(tmp_path / "cuda-11.8" / "lib64")
    stale = dict(rec("libcudnn.so.8", 8500, "8.5.0", STALE), found_as="/usr/lib/x86_64-linux-gnu/libcudnn.so.8")
    order = libraries.loader_search_order(None, {**DEBIAN_CONF, "gpu-env.conf": [lib64]})
    (found,) = libraries.compare_cudnn(stale, "8.6.0", (str(target / "libcudnn.so.8.6.0"), "8.6.0"), order)
    assert f"must then list {lib64}/libcudnn.so.8 first" in found["fix"]
    assert "targets" not in found["fix"]


def test_stale_cudnn_found_through_ld_library_path_says_so() -> None:
    stale = rec("libcudnn.so.8", 8500, "8.5.0", "/opt/old/libcudnn.so.8.5.0")
    order = libraries.loader_search_order("/opt/old", DEBIAN_CONF)
    (found,) = libraries.compare_cudnn(stale, "8.6.0", (PINNED, "8.6.0"), order)
    assert "/opt/old is on the loader path through LD_LIBRARY_PATH (" in found["fix"]


def test_wrong_cudnn_that_is_the_pinned_copy_itself_keeps_the_short_message() -> None:
    # The stack's own folder holds the wrong release: there is no other copy to name.
    wrong = rec("libcudnn.so.8", 8500, "8.5.0", "/usr/local/cuda-11.8/lib64/libcudnn.so.8.5.0")
    pinned = ("/usr/local/cuda-11.8/lib64/libcudnn.so.8.5.0", "8.5.0")
    (found,) = libraries.compare_cudnn(wrong, "8.6.0", pinned, libraries.loader_search_order(None, DEBIAN_CONF))
    assert "is 8.5.0, the stack pins 8.6.0" in found["cause"] and "ahead of" not in found["cause"]


def test_pinned_copy_follows_the_soname_link_and_reads_the_version(tmp_path: Path) -> None:
    lib64 = tmp_path / "lib64"
    lib64.mkdir()
    (lib64 / "libcudnn.so.8.6.0").write_bytes(b"")
    (lib64 / "libcudnn.so.8").symlink_to("libcudnn.so.8.6.0")
    missing = str(tmp_path / "missing")
    assert libraries.pinned_copy("libcudnn.so.8", [missing, str(lib64)]) == (str(lib64 / "libcudnn.so.8.6.0"), "8.6.0")
    assert libraries.pinned_copy("libcudnn.so.9", [str(lib64)]) is None


def test_driver_too_old_for_runtime() -> None:
    libcuda = rec("libcuda.so.1", 11040, "11.4", "/usr/lib/x86_64-linux-gnu/libcuda.so.470.82.01")
    (found,) = libraries.compare_driver_runtime(libcuda, rec("libcudart.so.11.0", 11080, "11.8"))
    assert found["check"] == "driver"
    assert "Driver too old for the runtime" in found["cause"]
    assert "CUDA 11.4" in found["cause"] and "CUDA 11.8" in found["cause"]
    assert "Upgrade the driver" in found["fix"]
    newer = rec("libcuda.so.1", 12020, "12.2")
    assert libraries.compare_driver_runtime(newer, rec("libcudart.so.11.0", 11080, "11.8")) == []


@pytest.mark.parametrize(
    "built, loaded, accepted",
    [
        ("8", "8.6.0", True),  # pip builds report only the major
        ("8.6", "8.6.0", True),
        ("8.6", "8.9.7", True),  # equal or higher minor is fine
        ("8.9", "8.8.0", False),  # TF 2.15 vs cuDNN 8.8 (tensorflow#62626)
        ("8.6", "9.3.0", False),  # major must match
        ("9.3", "9.3.0", True),
    ],
)
def test_cudnn_tf_rule(built: str, loaded: str, accepted: bool) -> None:
    assert (libraries.cudnn_tf_rule(built, loaded) is None) is accepted


def test_compare_with_build_cpu_build_is_silent() -> None:
    libs = {
        "libcudart": rec("libcudart.so.11.0", 11020, "11.2"),
        "libcudnn": rec("libcudnn.so.8", 8101, "8.1.1"),
    }
    assert libraries.compare_with_build({"is_cuda_build": False, "build_info": {}}, libs) == []


def test_compare_with_build_flags_cuda_and_cudnn() -> None:
    tf_info = {
        "version": "2.15.0",
        "is_cuda_build": True,
        "build_info": {"cuda_version": "12.2", "cudnn_version": "8.9"},
    }
    libs = {
        "libcudart": rec("libcudart.so.12", 12020, "12.2"),
        "libcudnn": rec("libcudnn.so.8", 8800, "8.8.0"),
    }
    (found,) = libraries.compare_with_build(tf_info, libs)
    assert found["check"] == "tensorflow"
    assert "built with cuDNN 8.9" in found["cause"] and "8.8.0" in found["cause"]
    assert "same major and an equal or higher minor" in found["cause"]
    libs["libcudart"] = rec("libcudart.so.11.0", 11080, "11.8")
    libs["libcudnn"] = rec("libcudnn.so.8", 8907, "8.9.7")
    (found,) = libraries.compare_with_build(tf_info, libs)
    assert "built for CUDA 12.2 but the loaded runtime is 11.8" in found["cause"]


def test_load_failure_names_soname_error_and_search_places(tmp_path: Path) -> None:
    conf = tmp_path / "conf.d"
    conf.mkdir()
    (conf / "cuda-11-8.conf").write_text("# managed\n/usr/local/cuda-11.8/lib64\n")
    dirs = libraries.ld_so_conf_dirs(str(conf))
    assert dirs == {"cuda-11-8.conf": ["/usr/local/cuda-11.8/lib64"]}
    found = libraries.load_failure_problem(
        "libcudnn",
        "libcudnn.so.8",
        "libcudnn.so.8: cannot open shared object file: No such file or directory",
        "/opt/x/lib",
        dirs,
    )
    assert found["check"] == "libcudnn"
    assert found["cause"].startswith("Cannot load libcudnn.so.8: libcudnn.so.8: cannot open shared object file")
    assert "LD_LIBRARY_PATH=/opt/x/lib" in found["cause"]
    assert "cuda-11-8.conf: /usr/local/cuda-11.8/lib64" in found["cause"]
    assert "ldconfig" in found["fix"] and "/etc/ld.so.conf.d" in found["fix"]
    driver = libraries.load_failure_problem("libcuda", "libcuda.so.1", "nope", None, {})
    assert "LD_LIBRARY_PATH=(unset)" in driver["cause"] and "NVIDIA driver" in driver["fix"]


def test_tensorflow_problems() -> None:
    (found,) = libraries.tensorflow_problems({"error": "import tensorflow failed: ModuleNotFoundError"}, {})
    assert "import tensorflow failed" in found["cause"]
    # A venv whose files were damaged still holds its lock for pip: the fix is to remove it and rebuild.
    assert f"remove {sys.prefix} and run playbooks/tensorflow.yml" in found["fix"]
    info = {
        "version": "2.12.0",
        "is_cuda_build": False,
        "build_info": {},
        "error": None,
    }
    (found,) = libraries.tensorflow_problems(info, {}, "2.12.1")
    assert found["cause"] == "TensorFlow 2.12.0 is installed, the stack pins 2.12.1."


def test_json_safe_build_info() -> None:
    safe = libraries.json_safe({"cuda_compute_capabilities": ("sm_35", "compute_80"), "x": object, "b": True})
    json.dumps(safe)
    assert safe["cuda_compute_capabilities"] == ["sm_35", "compute_80"] and safe["b"] is True


def run_libraries(args: list, ld_library_path: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_LIBRARY_PATH=ld_library_path)
    return subprocess.run(
        [sys.executable, str(VERIFY_DIR / "libraries.py"), "--no-tensorflow", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_missing_library_reports_soname_and_ld_library_path(tmp_path: Path) -> None:
    # CUDA 10.2's soname carries the minor, so no stand-in or real toolkit here provides it.
    done = run_libraries(["--expect-cuda", "10.2"], str(tmp_path))
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["libraries"]["libcudart"]["ok"] is False
    assert doc["libraries"]["libcudart"]["soname"] == "libcudart.so.10.2"
    causes = [p["cause"] for p in doc["problems"] if p["check"] == "libcudart"]
    assert causes and "libcudart.so.10.2" in causes[0] and f"LD_LIBRARY_PATH={tmp_path}" in causes[0]


def test_usage_error_exits_2() -> None:
    done = run_libraries(["--expect-cuda", "eleven"], "")
    assert done.returncode == 2 and "CUDA version" in done.stderr


@pytest.fixture
def standin_libs(request: pytest.FixtureRequest) -> Path:
    """``<standins_dir>/libs`` from tests/conftest.py (gcc-built libcuda/libcudart/libcudnn)."""
    try:
        root = request.getfixturevalue("standins_dir")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py fixture 'standins_dir' (gcc-built stand-in libraries) is not available")
    return Path(root) / "libs"


def test_loads_standins_and_reports_their_real_paths(standin_libs: Path) -> None:
    done = run_libraries(["--expect-cuda", "11.8", "--expect-cudnn", "8.6.0"], str(standin_libs))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["problems"] == []
    libs = doc["libraries"]
    # The stand-in runtime starts the stand-in driver first, which has no GPU: like NVIDIA's runtime it
    # then answers cudaErrorNoDevice, and the version comes from the file name.
    expected = {
        "libcuda": ("libcuda.so.1", 11080, "11.8", "cuDriverGetVersion", "520.61.05"),
        "libcudart": ("libcudart.so.11.0", None, "11.8", "file name", "11.8.89"),
        "libcudnn": ("libcudnn.so.8", 8600, "8.6.0", "cudnnGetVersion", "8.6.0"),
    }
    root = os.path.realpath(standin_libs)
    for key, want in expected.items():
        record = libs[key]
        assert (record["soname"], record["raw"], record["version"], record["version_source"], record["release"]) == want
        assert record["ok"] is True and record["error"] is None
        assert record["path"].startswith(root + os.sep), record
        assert os.path.basename(record["path"]).startswith(key + ".so")
    assert libs["libcudart"]["call_error"] == NO_DEVICE
    assert libs["libcudart"]["note"].startswith(NO_DEVICE + ": no usable GPU or driver")


def test_standin_cudnn_against_other_pin_fails(standin_libs: Path) -> None:
    done = run_libraries(["--expect-cuda", "11.8", "--expect-cudnn", "8.9.7"], str(standin_libs))
    assert done.returncode == 1
    (found,) = json.loads(done.stdout)["problems"]
    assert found["check"] == "libcudnn" and "is 8.6.0, the stack pins 8.9.7" in found["cause"]


def test_standin_cudnn_loaded_ahead_of_the_stacks_copy_names_both(standin_libs: Path, tmp_path: Path) -> None:
    # The stack's tree holds "8.9.7" (only its name matters here); the loader finds the 8.6.0 stand-in first.
    lib64 = tmp_path / "cuda-11.8" / "lib64"
    lib64.mkdir(parents=True)
    (lib64 / "libcudnn.so.8.9.7").write_bytes(b"")
    (lib64 / "libcudnn.so.8").symlink_to("libcudnn.so.8.9.7")
    code = (
        "import json, libraries; "
        f"print(json.dumps(libraries.check_libraries('11.8', '8.9.7', {str(tmp_path / 'cuda-11.8')!r})))"
    )
    env = dict(os.environ, LD_LIBRARY_PATH=str(standin_libs))  # PYTHONPATH: conftest.py
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    (found,) = json.loads(done.stdout)["problems"]
    loaded = os.path.realpath(standin_libs / "libcudnn.so.8")
    assert found["cause"].startswith(
        f"cuDNN libcudnn.so.8: the loader loaded {loaded} (cuDNN 8.6.0) ahead of the pinned "
        f"{lib64 / 'libcudnn.so.8.9.7'} (8.9.7); the stack pins 8.9.7."
    )
    assert f"{standin_libs} is on the loader path through LD_LIBRARY_PATH" in found["fix"]


# --- a version call that fails without a GPU --------------------------------------------------

NO_DEVICE = "cudaRuntimeGetVersion returned 100 (cudaErrorNoDevice: no CUDA-capable device is detected)"
NO_DRIVER = (
    "cudaRuntimeGetVersion returned 35 (cudaErrorInsufficientDriver: CUDA driver version is insufficient for "
    "CUDA runtime version)"
)
TOOLKIT_CUDART = "/usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudart.so.11.8.89"


def probed(path: str, status: int, error: str, soname: str = "libcudart.so.11.0") -> dict[str, Any]:
    """A libcudart record as the probe process reports it when cudaRuntimeGetVersion failed."""
    return dict(libraries.new_record(soname), loaded=True, path=path, call_status=status, call_error=error)


@pytest.mark.parametrize(
    "path, release",
    [
        ("/usr/local/cuda-11.8/lib64/libcudart.so.11.8.89", "11.8.89"),
        ("libcudnn.so.8.6.0", "8.6.0"),
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03", "535.261.03"),
        ("/venv/nvidia/cuda_runtime/lib/libcudart.so.11.0", None),  # CUDA 11's soname, not a version
        ("libcudart.so.12", None),
        ("libcudnn.so.8", None),
        (None, None),
    ],
)
def test_release_from_name(path: str | None, release: str | None) -> None:
    assert libraries.release_from_name(path) == release


def test_call_error_text_uses_the_runtimes_own_words() -> None:
    said = ("cudaErrorNoDevice", "no CUDA-capable device is detected")
    assert libraries.call_error_text("cudaRuntimeGetVersion", 100, *said) == NO_DEVICE
    # A runtime without cudaGetErrorName/cudaGetErrorString: NVIDIA's words from the table.
    assert libraries.call_error_text("cudaRuntimeGetVersion", 35) == NO_DRIVER
    assert (
        libraries.call_error_text("cudaRuntimeGetVersion", 4242, "unrecognized error code", "unrecognized error code")
        == "cudaRuntimeGetVersion returned 4242 (unrecognized error code)"
    )
    assert (
        libraries.call_error_text("cuDriverGetVersion", 34)
        == "cuDriverGetVersion returned 34 (CUDA_ERROR_STUB_LIBRARY)"
    )


def test_no_device_takes_the_version_from_the_file_name_and_fails_nothing() -> None:
    record = libraries.settle_record("libcudart", probed(TOOLKIT_CUDART, 100, NO_DEVICE))
    assert (record["version"], record["release"], record["version_source"], record["raw"], record["ok"]) == (
        "11.8",
        "11.8.89",
        "file name",
        None,
        True,
    )
    assert record["error"] is None
    assert record["note"] == (
        f"{NO_DEVICE}: no usable GPU or driver (the driver sees no CUDA device: kernel module not loaded, GPU not "
        "passed into the container, or no GPU); version 11.8 read from the file name libcudart.so.11.8.89"
    )
    libcuda = rec("libcuda.so.1", 12020, "12.2", "/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03")
    assert libraries.runtime_call_problems(libcuda, record, []) == []
    assert libraries.record_problems("libcudart", record) == []
    # The comparisons work from the file name's version.
    assert libraries.compare_cudart(record, "11.8") == []
    (found,) = libraries.compare_cudart(record, "12.2")
    assert f"{TOOLKIT_CUDART} is 11.8, the stack pins 12.2" in found["cause"]
    assert libraries.compare_driver_runtime(libcuda, record) == []
    (found,) = libraries.compare_driver_runtime(rec("libcuda.so.1", 11040, "11.4"), record)
    assert "the driver supports CUDA 11.4" in found["cause"] and "the runtime is CUDA 11.8" in found["cause"]


def test_no_device_note_names_cuda_visible_devices() -> None:
    record = libraries.settle_record("libcudart", probed(TOOLKIT_CUDART, 100, NO_DEVICE), cuda_visible_devices="")
    assert "; CUDA_VISIBLE_DEVICES='' is set and may hide every GPU;" in record["note"]


def test_a_runtime_whose_name_carries_no_version_is_not_judged() -> None:
    path = "/opt/tf/lib/python3.10/site-packages/nvidia/cuda_runtime/lib/libcudart.so.11.0"
    record = libraries.settle_record("libcudart", probed(path, 100, NO_DEVICE))
    assert (record["version"], record["release"], record["ok"]) == (None, None, None)
    assert record["note"].endswith("; its version is unknown: the file name libcudart.so.11.0 carries none")
    assert libraries.compare_cudart(record, "11.8") == [] and libraries.record_problems("libcudart", record) == []


def test_insufficient_driver_fails_only_where_nothing_else_names_it() -> None:
    record = libraries.settle_record("libcudart", probed(TOOLKIT_CUDART, 35, NO_DRIVER))
    assert record["ok"] is True and record["note"].startswith(
        f"{NO_DRIVER}: no NVIDIA driver (libcuda.so.1 could not be loaded) or one too old for this runtime;"
    )
    # No libcuda at all: the libcuda check says so.
    missing = dict(libraries.new_record("libcuda.so.1"), error="libcuda.so.1: cannot open shared object file")
    assert libraries.runtime_call_problems(missing, record, []) == []
    # A driver of an older CUDA major: the driver check says so.
    old = rec("libcuda.so.1", 10020, "10.2", "/usr/lib/x86_64-linux-gnu/libcuda.so.440.33.01")
    (driver,) = libraries.compare_driver_runtime(old, record)
    assert driver["check"] == "driver" and libraries.runtime_call_problems(old, record, [driver]) == []
    # Nothing explains it: a failure of its own.
    new = rec("libcuda.so.1", 12020, "12.2", "/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03")
    (found,) = libraries.runtime_call_problems(new, record, [])
    assert found["check"] == "libcudart"
    assert found["cause"] == (
        f"CUDA runtime libcudart.so.11.0 at {TOOLKIT_CUDART}: {NO_DRIVER}, though libcuda.so.1 at "
        "/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03 supports CUDA 12.2."
    )


def test_stub_and_other_runtime_errors_are_failures() -> None:
    new = rec("libcuda.so.1", 12020, "12.2", "/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03")
    stub = libraries.call_error_text("cudaRuntimeGetVersion", 34)
    (found,) = libraries.runtime_call_problems(
        new, libraries.settle_record("libcudart", probed(TOOLKIT_CUDART, 34, stub))
    )
    assert found["check"] == "libcuda" and "stub" in found["cause"] and "lib64/stubs" in found["fix"]
    mismatch = libraries.call_error_text(
        "cudaRuntimeGetVersion",
        803,
        "cudaErrorSystemDriverMismatch",
        "system has unsupported display driver / cuda driver combination",
    )
    record = libraries.settle_record("libcudart", probed(TOOLKIT_CUDART, 803, mismatch))
    assert record["version"] == "11.8"
    (found,) = libraries.runtime_call_problems(new, record, [])
    assert found == {
        "check": "libcudart",
        "cause": f"CUDA runtime libcudart.so.11.0 at {TOOLKIT_CUDART}: {mismatch}: the CUDA runtime could not start "
        "the driver.",
        "fix": "Check that `nvidia-smi` answers, that the loaded kernel module is the driver's version (`cat "
        "/proc/driver/nvidia/version`; reboot after a driver upgrade) and `dmesg | grep -i -e xid -e nvrm`",
    }
    assert "reinstall" not in found["fix"]


def test_a_failed_driver_call_is_the_libcuda_failure_it_was() -> None:
    stub = dict(
        libraries.new_record("libcuda.so.1"),
        loaded=True,
        path="/usr/local/cuda-11.8/lib64/stubs/libcuda.so",
        call_status=34,
        call_error=libraries.call_error_text("cuDriverGetVersion", 34),
    )
    record = libraries.settle_record("libcuda", stub)
    assert record["ok"] is False and record["error"] == "cuDriverGetVersion returned 34 (CUDA_ERROR_STUB_LIBRARY)"
    (found,) = libraries.record_problems("libcuda", record)
    assert found["check"] == "libcuda" and "lib64/stubs" in found["fix"]


# --- a library that kills or hangs the probe process -----------------------------------------

NVRTC_ABORT = (
    "Could not load library libcudnn_ops_infer.so.8. Error: libnvrtc.so: cannot open shared object file: "
    "No such file or directory\n"
)
CUDNN = "/usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudnn.so.8.6.0"


def loaded_cudnn(path: str = CUDNN) -> dict[str, Any]:
    return dict(libraries.new_record("libcudnn.so.8"), loaded=True, path=path)


def test_could_not_load_reads_cudnns_message() -> None:
    assert libraries.could_not_load("other output\n" + NVRTC_ABORT) == (
        "libcudnn_ops_infer.so.8",
        "libnvrtc.so",
        "libnvrtc.so: cannot open shared object file: No such file or directory",
    )
    odd = "Could not load library libcudnn_cnn_infer.so.8. Error: /x/libcudnn_cnn_infer.so.8: undefined symbol: f"
    assert libraries.could_not_load(odd) == (
        "libcudnn_cnn_infer.so.8",
        None,
        "/x/libcudnn_cnn_infer.so.8: undefined symbol: f",
    )
    assert libraries.could_not_load("") is None


@pytest.mark.parametrize(
    "returncode, timed_out, text",
    [
        (-6, False, "aborted the process (SIGABRT)"),
        (-11, False, "killed the process (SIGSEGV)"),
        (3, False, "ended the process (exit status 3) without an answer"),
        (-9, True, "did not answer within 2 s (the probe process was killed)"),
        (None, False, "could not be probed (the probe process did not start)"),
    ],
)
def test_probe_death(returncode: int | None, timed_out: bool, text: str) -> None:
    assert libraries.probe_death(returncode, timed_out, 2) == text


def test_cudnn_abort_names_the_library_it_could_not_load_and_where_that_comes_from(tmp_path: Path) -> None:
    root = tmp_path / "cuda-11.8"
    found = libraries.crash_problem("libcudnn", loaded_cudnn(), "aborted the process (SIGABRT)", NVRTC_ABORT, str(root))
    assert found == {
        "check": "libcudnn",
        "cause": f"cuDNN libcudnn.so.8 ({CUDNN}) aborted the process (SIGABRT) when asked for its version: it could "
        "not load libnvrtc.so (needed by libcudnn_ops_infer.so.8).",
        "fix": f"Install the stack's CUDA toolkit in full (cuda_toolkit role; libnvrtc.so comes with the stack's CUDA "
        f"toolkit, in {root}/lib64) and keep {root}/lib64 on the loader path through the gpu_env role (rerun "
        "playbooks/cuda.yml or site.yml), then run `ldconfig`; `ldconfig -p | grep libnvrtc.so` must then list it",
    }
    # Installed in the stack's toolkit, which is not on the loader path.
    (root / "lib64").mkdir(parents=True)
    (root / "lib64" / "libnvrtc.so.11.2").write_bytes(b"")
    (root / "lib64" / "libnvrtc.so").symlink_to("libnvrtc.so.11.2")
    found = libraries.crash_problem("libcudnn", loaded_cudnn(), "aborted the process (SIGABRT)", NVRTC_ABORT, str(root))
    assert found["cause"].endswith(
        f"(needed by libcudnn_ops_infer.so.8); it is installed at {root}/lib64/libnvrtc.so, but {root}/lib64 is "
        "not on the loader path."
    )
    assert found["fix"].startswith(f"Put {root}/lib64 on the loader path through the gpu_env role (rerun")


def test_cudnn_abort_for_its_own_part_says_the_install_is_incomplete() -> None:
    said = "Could not load library libcudnn_ops_infer.so.8. Error: libcudnn_ops_infer.so.8: cannot open shared object file: No such file or directory"
    found = libraries.crash_problem("libcudnn", loaded_cudnn(), "aborted the process (SIGABRT)", said, None)
    assert found["cause"].endswith("when asked for its version: it could not load libcudnn_ops_infer.so.8.")
    assert found["fix"] == (
        "The cuDNN install is incomplete (libcudnn_ops_infer.so.8 is part of cuDNN): rerun the cudnn role "
        "(playbooks/cuda.yml or site.yml), then run `ldconfig`; `ldconfig -p | grep libcudnn_ops_infer.so` must "
        "then list it"
    )
    cublas = "Could not load library libcudnn_ops_infer.so.8. Error: libcublas.so.11: cannot open shared object file"
    found = libraries.crash_problem("libcudnn", loaded_cudnn(), "aborted the process (SIGABRT)", cublas, None)
    assert "it could not load libcublas.so.11 (needed by libcudnn_ops_infer.so.8)." in found["cause"]
    assert "in the stack's <cuda_root>/lib64" in found["fix"] and "`ldconfig -p | grep libcublas.so`" in found["fix"]


def run_result(events: list[dict[str, Any]], returncode: int | None, stderr: str = "", timed_out: bool = False) -> dict:
    return {"events": events, "stderr": stderr, "returncode": returncode, "timed_out": timed_out}


def test_probe_records_keep_what_came_before_the_abort() -> None:
    plan = libraries.library_plan("11.8", "8.6.0")
    libcuda = rec("libcuda.so.1", 12020, "12.2")
    cudart = probed(TOOLKIT_CUDART, 100, NO_DEVICE)
    events = [
        {"event": "record", "index": 0, "record": libcuda},
        {"event": "record", "index": 1, "record": cudart},
        {"event": "start", "index": 2, "soname": "libcudnn.so.8"},
        {"event": "loaded", "index": 2, "soname": "libcudnn.so.8", "path": CUDNN, "found_as": "/x/libcudnn.so.8"},
    ]
    records, crashed, mapped = libraries.probe_records(plan, run_result(events, -6, NVRTC_ABORT), 120)
    assert records[:2] == [libcuda, cudart] and mapped == []
    assert list(crashed) == [2]
    (found,) = crashed[2]
    assert found["cause"].startswith(f"cuDNN libcudnn.so.8 ({CUDNN}) aborted the process (SIGABRT) when asked")
    assert records[2]["error"] == found["cause"] and records[2]["ok"] is False
    assert (records[2]["path"], records[2]["found_as"], records[2]["loaded"]) == (CUDNN, "/x/libcudnn.so.8", True)


def test_probe_records_after_the_one_that_died_are_not_probed() -> None:
    plan = libraries.library_plan("11.8", "8.6.0")
    events = [
        {"event": "record", "index": 0, "record": rec("libcuda.so.1", 12020, "12.2")},
        {"event": "start", "index": 1, "soname": "libcudart.so.11.0"},
    ]
    records, crashed, _mapped = libraries.probe_records(plan, run_result(events, -11, "Segmentation fault"), 120)
    (found,) = crashed[1]
    assert (
        found["cause"]
        == "CUDA runtime libcudart.so.11.0 killed the process (SIGSEGV) while being loaded: Segmentation fault."
    )
    assert found["fix"] == (
        "The record's stderr_tail holds the library's own words and `dmesg` the crash; a damaged libcudart is "
        "reinstalled by the cuda_toolkit role, then run `ldconfig`"
    )
    assert records[1]["stderr_tail"] == "Segmentation fault" and records[1]["error"] == found["cause"]
    assert records[2]["ok"] is None and records[2]["error"] is None
    assert records[2]["note"] == "not probed: the probe process ended while probing libcudart"
    assert 2 not in crashed


def _gcc_library(folder: Path, soname: str, source: str) -> Path:
    """A small shared library built with gcc as the stand-ins are (build_standins.gcc_shared_library)."""
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the test libraries (apt-get install gcc)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lib.c").write_text(source)
    return load_builder().gcc_shared_library(folder / "lib.c", folder / soname, soname)


ABORTING_CUDNN = r"""
#include <stdio.h>
#include <stdlib.h>
size_t cudnnGetVersion(void)
{
    fputs("Could not load library libcudnn_ops_infer.so.8. Error: libnvrtc.so: cannot open shared object file: "
          "No such file or directory\n", stderr);
    abort();
}
"""
HANGING_CUDNN = r"""
#include <stddef.h>
#include <unistd.h>
size_t cudnnGetVersion(void)
{
    for (;;)
        pause();
    return 0;
}
"""


def test_a_library_that_aborts_leaves_the_document_whole(tmp_path: Path) -> None:
    library = _gcc_library(tmp_path / "lib", "libcudnn.so.8", ABORTING_CUDNN)
    done = run_libraries(["--expect-cudnn", "8.6.0", "--cuda-root", str(tmp_path / "cuda")], str(library.parent))
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    (found,) = [p for p in doc["problems"] if p["check"] == "libcudnn"]
    assert found["cause"] == (
        f"cuDNN libcudnn.so.8 ({library}) aborted the process (SIGABRT) when asked for its version: it could not "
        "load libnvrtc.so (needed by libcudnn_ops_infer.so.8)."
    )
    assert f"in {tmp_path}/cuda/lib64" in found["fix"]
    assert doc["libraries"]["libcudnn"]["ok"] is False and doc["libraries"]["libcudnn"]["path"] == str(library)
    # The libraries probed before cuDNN keep their own records.
    assert doc["libraries"]["libcuda"]["error"] and doc["libraries"]["libcuda"]["loaded"] is False


def test_a_library_that_hangs_is_killed_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    library = _gcc_library(tmp_path / "lib", "libcudnn.so.8", HANGING_CUDNN)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(library.parent))  # the probe process's loader path
    started = time.monotonic()
    doc = libraries.check_libraries(None, "8.6.0", probe_timeout=3)
    assert time.monotonic() - started < 60
    (found,) = [p for p in doc["problems"] if p["check"] == "libcudnn"]
    assert found["cause"] == (
        f"cuDNN libcudnn.so.8 ({library}) did not answer within 3 s (the probe process was killed) when asked for "
        "its version."
    )
    assert "nvidia-smi" in found["fix"] and doc["ok"] is False
