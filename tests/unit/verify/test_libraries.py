"""libraries.py: version decoding, sonames, comparisons, and real loading of the stand-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
    expected = {
        "libcuda": ("libcuda.so.1", 11080, "11.8"),
        "libcudart": ("libcudart.so.11.0", 11080, "11.8"),
        "libcudnn": ("libcudnn.so.8", 8600, "8.6.0"),
    }
    root = os.path.realpath(standin_libs)
    for key, (soname, raw, version) in expected.items():
        assert (libs[key]["soname"], libs[key]["raw"], libs[key]["version"]) == (
            soname,
            raw,
            version,
        )
        assert libs[key]["path"].startswith(root + os.sep), libs[key]
        assert os.path.basename(libs[key]["path"]).startswith(key + ".so")


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
