"""gpu_verify.py: the pure checks, the fit subprocess (timeout, crash) with stand-in fit scripts,
and the whole document with a fake nvidia-smi."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))

import gpu_verify

A100_X2 = (
    "0, NVIDIA A100 80GB PCIe, GPU-3f1c2a7e, 00000000:17:00.0, 81920, 520.61.05\n"
    "1, NVIDIA A100 80GB PCIe, GPU-a84e0d3b, 00000000:65:00.0, 81920, 520.61.05\n"
)
FAKE_FIT_OK = """
import json, sys
argv = sys.argv[1:]
progress = argv[argv.index("--progress") + 1]
replicas = int(argv[argv.index("--cpu-replicas") + 1])
tf = {"version": "2.12.1", "is_cuda_build": False, "build_info": {"is_cuda_build": False}, "gpus": 0, "error": None}
open(progress, "a").write(json.dumps({"stage": "tensorflow", "t": 0.1, "tensorflow": tf}) + "\\n")
print(json.dumps({"ok": True, "mode": "cpu-replicas", "num_replicas_in_sync": replicas,
                  "devices": ["/cpu:%d" % i for i in range(replicas)], "global_batch_size": 16 * replicas,
                  "loss_start": 2.4, "loss_end": 0.6, "loss_history": [1.7, 0.9, 0.7], "fit_seconds": 0.9,
                  "samples_per_second": 800.0, "tensorflow": tf, "loaded_libraries": None,
                  "error": None, "problems": []}))
"""
FAKE_FIT_HANGS = """
import json, subprocess, sys, time
argv = sys.argv[1:]
progress = argv[argv.index("--progress") + 1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[0] + ".child", "w").write(str(child.pid))
open(progress, "a").write(json.dumps({"stage": "fit", "t": 0.2}) + "\\n")
open(progress, "a").write(json.dumps({"stage": "epoch", "t": 0.3, "epoch": 1}) + "\\n")
time.sleep(300)
"""
FAKE_FIT_CRASHES = """
import sys
sys.stderr.write("Traceback ...\\nImportError: libcudnn.so.8: cannot open shared object file\\n")
sys.exit(3)
"""


def test_driver_problems() -> None:
    assert gpu_verify.driver_problems("520.61.05", "520.61.05") == []
    assert gpu_verify.driver_problems("520.61.05", None) == []
    assert gpu_verify.driver_problems(None, "520.61.05") == []
    (found,) = gpu_verify.driver_problems("515.65.01", "520.61.05")
    assert found["check"] == "driver"
    assert found["cause"] == "nvidia-smi reports driver 515.65.01, the stack pins 520.61.05."
    assert "reboot" in found["fix"]


def test_tensorflow_gpu_problems_cpu_build() -> None:
    info = {"version": "2.12.1", "is_cuda_build": False, "gpus": 0, "error": None}
    (found,) = gpu_verify.tensorflow_gpu_problems(info, 2, 2)
    assert "sees 0 GPUs, nvidia-smi 2, the inventory expects 2" in found["cause"]
    assert "CPU-only" in found["fix"]
    assert gpu_verify.tensorflow_gpu_problems(dict(info, gpus=2, is_cuda_build=True), 2, 2) == []


def test_on_a_mig_host_tensorflow_is_held_to_the_cuda_devices_not_the_gpus() -> None:
    # Two GPUs, both in MIG mode: one CUDA process enumerates one MIG device (MIG User Guide, "CUDA Device
    # Enumeration"), so TensorFlow seeing 1 is right and seeing 2 is not.
    info = {"version": "2.15.1", "is_cuda_build": True, "gpus": 1, "error": None}
    assert gpu_verify.tensorflow_gpu_problems(info, 2, 2, 1) == []
    (physical,) = gpu_verify.tensorflow_gpu_problems(info, 2, 2)
    assert "sees 1 GPUs, nvidia-smi 2, the inventory expects 2." in physical["cause"]
    (found,) = gpu_verify.tensorflow_gpu_problems(dict(info, gpus=2), 2, 2, 1)
    assert "expected to see 1 of the 2 GPUs" in found["cause"] and "CUDA Device Enumeration" in found["cause"]


def test_the_mig_note_says_why_tensorflow_sees_fewer_devices() -> None:
    assert gpu_verify.mig_note(2, 2) is None
    assert gpu_verify.mig_note(4, 3).startswith("TensorFlow is expected to see 3 of the 4 GPUs: the GPUs in MIG mode")


def test_tf_loaded_library_problems() -> None:
    loaded = {
        "libcudnn": [{"path": "/venv/nvidia/cudnn/lib/libcudnn.so.8", "version": "8.1.1"}],
        "libcudart": [
            {
                "path": "/usr/local/cuda-11.8/lib64/libcudart.so.11.8.89",
                "version": "11.8",
            }
        ],
    }
    libs = {
        "libcudnn": {
            "version": "8.6.0",
            "path": "/usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0",
        }
    }
    (found,) = gpu_verify.tf_loaded_library_problems(loaded, libs, "11.8", "8.6.0")
    assert found["check"] == "libcudnn"
    assert (
        "TensorFlow loaded cuDNN 8.1.1 from /venv/nvidia/cudnn/lib/libcudnn.so.8, the stack pins 8.6.0"
        in found["cause"]
    )
    assert gpu_verify.tf_loaded_library_problems(None, libs, "11.8", "8.6.0") == []


def test_mode_note() -> None:
    assert gpu_verify.mode_note(0) is None
    assert gpu_verify.mode_note(2) == "fit ran on 2 logical CPU devices (--cpu-replicas 2), not on GPUs"


def test_timeout_problem_names_the_stage_and_nccl_fix() -> None:
    found = gpu_verify.timeout_problem(600, [{"stage": "fit", "t": 9.0}, {"stage": "epoch", "t": 12.5, "epoch": 1}])
    assert "did not finish within 600 s" in found["cause"] and "'epoch' at 12.5 s, after epoch 1" in found["cause"]
    for words in ("nvidia-smi topo -m", "IOMMU", "ACS", "NCCL"):
        assert words in found["fix"]
    assert "never started" in gpu_verify.timeout_problem(5, [])["cause"]


FIT_OPTIONS = ("per_replica_batch", "steps", "epochs", "learning_rate", "seed")


def test_fit_options_reach_fit_unchanged() -> None:
    import fit

    # Both scripts take the fit's options from fit.add_fit_arguments: same defaults ...
    defaults, fit_defaults = (
        gpu_verify.build_parser().parse_args(["--expected-gpus", "2"]),
        fit.build_parser().parse_args([]),
    )
    assert [getattr(defaults, name) for name in FIT_OPTIONS] == [getattr(fit_defaults, name) for name in FIT_OPTIONS]
    # ... and what gpu_verify.py was given is what fit.py parses.
    argv = ["--expected-gpus", "2", "--cpu-replicas", "2", "--steps", "2", "--epochs", "1", "--per-replica-batch", "4"]
    args = gpu_verify.build_parser().parse_args(argv + ["--learning-rate", "1e30", "--seed", "7", "--mixed-precision"])
    passed = fit.build_parser().parse_args(gpu_verify.fit_arguments(args))
    for name in (*FIT_OPTIONS, "cpu_replicas", "mixed_precision", "multiworker"):
        assert getattr(passed, name) == getattr(args, name), name


@pytest.mark.parametrize("option", ["--per-replica-batch", "--steps", "--epochs"])
def test_fit_sizes_below_one_are_usage_errors(option: str) -> None:
    with pytest.raises(SystemExit) as exc:
        gpu_verify.main(["--expected-gpus", "2", option, "0"])
    assert exc.value.code == 2


def test_scaling_on_logical_cpus_is_noted_not_judged() -> None:
    slow = {"check": "scaling", "cause": "Scaling efficiency 0.50", "fix": "Check the links"}
    scaling = {"ok": False, "efficiency": 0.5, "problems": [slow]}
    assert gpu_verify.judge_scaling(scaling, 2) == []
    assert scaling == {
        "ok": None,
        "efficiency": 0.5,
        "note": "measured on logical CPU devices that share the same cores; not judged",
    }
    scaling = {"ok": False, "efficiency": 0.5, "problems": [slow]}
    assert gpu_verify.judge_scaling(scaling, 0) == [slow] and scaling == {"ok": False, "efficiency": 0.5}
    assert gpu_verify.judge_scaling(None, 0) == []
    assert gpu_verify.judge_scaling({"ok": None, "note": "not measured with --multiworker"}, 0) == []


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_fit_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    script = _write(tmp_path / "hang.py", FAKE_FIT_HANGS)
    started = time.monotonic()
    result = gpu_verify.run_fit_subprocess(["--cpu-replicas", "2"], 2, script)
    assert time.monotonic() - started < 30
    assert result["timed_out"] is True and result["ok"] is False
    (found,) = result["problems"]
    assert found["check"] == "fit" and "did not finish within 2 s" in found["cause"]
    assert "after epoch 1" in found["cause"]
    child = int((tmp_path / "hang.py.child").read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the fit's child process survived the timeout"


def test_fit_crash_without_result(tmp_path: Path) -> None:
    script = _write(tmp_path / "crash.py", FAKE_FIT_CRASHES)
    result = gpu_verify.run_fit_subprocess([], 60, script)
    assert result["ok"] is False and result["timed_out"] is False and result["returncode"] == 3
    assert "exited with 3 without a result" in result["problems"][0]["cause"]
    assert "libcudnn.so.8" in result["stderr_tail"]


def _fake_nvidia_smi(tmp_path: Path, text: str) -> str:
    data = tmp_path / "gpus.csv"
    data.write_text(text)
    path = tmp_path / "nvidia-smi"
    path.write_text(f'#!/bin/sh\ncat "{data}"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def run_verify(tmp_path: Path, extra: list[str], ld_library_path: str = "") -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        str(VERIFY_DIR / "gpu_verify.py"),
        "--expected-gpus",
        "2",
        "--expect-driver",
        "520.61.05",
        "--expect-cuda",
        "11.8",
        "--expect-cudnn",
        "8.6.0",
        "--expect-tensorflow",
        "2.12.1",
        "--cpu-replicas",
        "2",
        "--stack",
        "tf2.12",
        "--no-lspci",
        "--nvidia-smi",
        _fake_nvidia_smi(tmp_path, A100_X2),
        "--fit-script",
        _write(tmp_path / "fit_ok.py", FAKE_FIT_OK),
        "--output",
        str(tmp_path / "out" / "v.json"),
        *extra,
    ]
    env = dict(os.environ, LD_LIBRARY_PATH=ld_library_path)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


def check_schema(doc: dict[str, Any]) -> None:
    assert doc["schema"] == 1 and doc["stack"] == "tf2.12" and doc["mode"] == "cpu-replicas"
    assert set(doc) >= {
        "host",
        "ok",
        "mode_note",
        "driver_version",
        "gpus",
        "libraries",
        "tensorflow",
        "fit",
        "problems",
        "expected",
        "seconds",
    }
    assert doc["mode_note"] == "fit ran on 2 logical CPU devices (--cpu-replicas 2), not on GPUs"
    assert doc["expected"] == {
        "gpus": 2,
        "cuda_devices": 2,
        "driver": "520.61.05",
        "cuda": "11.8",
        "cudnn": "8.6.0",
        "tensorflow": "2.12.1",
    }
    assert doc["driver_version"] == "520.61.05" and doc["gpus"]["seen"] == 2
    assert set(doc["libraries"]) == {"libcuda", "libcudart", "libcudnn"}
    assert doc["tensorflow"]["version"] == "2.12.1"
    assert doc["fit"]["num_replicas_in_sync"] == 2 and doc["fit"]["timed_out"] is False
    assert doc["ok"] is (not doc["problems"])


def test_document_schema_with_fake_fit(tmp_path: Path) -> None:
    done = run_verify(tmp_path, [])
    doc = json.loads(done.stdout)
    check_schema(doc)
    assert done.returncode == (0 if doc["ok"] else 1)
    assert json.loads((tmp_path / "out" / "v.json").read_text()) == doc


def test_table_format(tmp_path: Path) -> None:
    done = run_verify(tmp_path, ["--format", "table"])
    assert "stack tf2.12" in done.stdout and "note: fit ran on 2 logical CPU devices" in done.stdout
    assert "libcudnn" in done.stdout and "loss 2.400 -> 0.600" in done.stdout


def test_usage_error_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(VERIFY_DIR / "gpu_verify.py"), "--expect-cuda", "11.8"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "--expected-gpus" in done.stderr


@pytest.fixture
def standin_libs(request: pytest.FixtureRequest) -> Path:
    """``<standins_dir>/libs`` from tests/conftest.py (gcc-built libcuda/libcudart/libcudnn)."""
    try:
        root = request.getfixturevalue("standins_dir")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py fixture 'standins_dir' (gcc-built stand-in libraries) is not available")
    return Path(root) / "libs"


def test_all_checks_pass_with_standins(tmp_path: Path, standin_libs: Path) -> None:
    done = run_verify(tmp_path, [], str(standin_libs))
    doc = json.loads(done.stdout)
    check_schema(doc)
    assert doc["problems"] == [] and doc["ok"] is True and done.returncode == 0
    assert doc["libraries"]["libcudnn"]["version"] == "8.6.0"


def test_driver_and_cudnn_pins_fail_with_standins(tmp_path: Path, standin_libs: Path) -> None:
    done = run_verify(
        tmp_path,
        ["--expect-driver", "535.104.05", "--expect-cudnn", "8.9.7"],
        str(standin_libs),
    )
    doc = json.loads(done.stdout)
    assert done.returncode == 1 and doc["ok"] is False
    assert sorted(p["check"] for p in doc["problems"]) == ["driver", "libcudnn"]


def test_real_gpu_verify_cpu_replicas(tmp_path: Path) -> None:
    """The whole script with the real fit.py, when GPU_VERIFY_TF_PYTHON has tensorflow."""
    python = os.environ.get("GPU_VERIFY_TF_PYTHON")
    if not python or subprocess.run([python, "-c", "import tensorflow"], capture_output=True, check=False).returncode:
        pytest.skip("set GPU_VERIFY_TF_PYTHON to a python that has tensorflow to run the real fit")
    done = subprocess.run(
        [
            python,
            str(VERIFY_DIR / "gpu_verify.py"),
            "--expected-gpus",
            "2",
            "--cpu-replicas",
            "2",
            "--no-lspci",
            "--nvidia-smi",
            _fake_nvidia_smi(tmp_path, A100_X2),
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=330,
        check=False,
    )
    doc = json.loads(done.stdout)
    fit = doc["fit"]
    assert fit["ok"] is True and fit["num_replicas_in_sync"] == 2 and fit["loss_end"] < fit["loss_start"]
    assert doc["tensorflow"]["version"] and not [p for p in doc["problems"] if p["check"] in ("fit", "tensorflow")]


def test_scaling_efficiency_below_threshold_is_a_problem():
    fit_all = {"ok": True, "num_replicas_in_sync": 2, "steady_samples_per_second": 1100.0}
    result = gpu_verify.scaling_result(fit_all, {"ok": True, "steady_samples_per_second": 1000.0}, 0.75)
    assert (result["speedup"], result["efficiency"], result["ok"]) == (1.1, 0.55, False)
    assert result["problems"][0]["cause"] == (
        "Scaling efficiency 0.55 on 2 replicas (1.10x the 1-replica throughput) is below 0.75."
    )


def test_scaling_efficiency_at_threshold_passes():
    fit_all = {"ok": True, "num_replicas_in_sync": 2, "steady_samples_per_second": 1900.0}
    result = gpu_verify.scaling_result(fit_all, {"ok": True, "steady_samples_per_second": 1000.0}, 0.75)
    assert (result["efficiency"], result["ok"], result["problems"]) == (0.95, True, [])


def test_scaling_baseline_failure_is_named():
    fit_all = {"ok": True, "num_replicas_in_sync": 2, "samples_per_second": 900.0}
    result = gpu_verify.scaling_result(fit_all, {"ok": False, "error": "OOM"}, 0.75)
    assert result["problems"][0]["cause"] == "The 1-replica baseline fit failed: OOM."


def test_parse_samples_keeps_the_peak_per_gpu():
    import gpu_parsers

    # The sampler reads its nvidia-smi output with the shared parser (files/verify/gpu_parsers.py).
    assert gpu_verify.parse_samples is gpu_parsers.parse_samples
    assert gpu_verify.UtilisationSampler("nvidia-smi").command[1] == "--query-gpu=index,utilization.gpu,memory.used"
    text = "0, 10, 1000\n1, 0, 500\n0, 97, 30512\n1, 95, 30000\n0, [N/A], 12\n1, 5"
    assert gpu_parsers.parse_samples(text) == {
        "0": {"utilization_gpu_peak_pct": 97, "memory_used_peak_mib": 30512, "samples": 2},
        "1": {"utilization_gpu_peak_pct": 95, "memory_used_peak_mib": 30000, "samples": 2},
    }


def test_sampler_without_nvidia_smi_reports_nothing():
    sampler = gpu_verify.UtilisationSampler("/nonexistent/nvidia-smi")
    sampler.start()
    assert sampler.stop() is None


def test_the_fit_writes_no_bytecode_and_keeps_the_callers_tensorflow_log_level(monkeypatch) -> None:
    """Autograph's temporary modules would each leave a .pyc in the host's temp folder."""
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    probe = "import os, sys; print(os.environ['TF_CPP_MIN_LOG_LEVEL'], sys.dont_write_bytecode)"
    returncode, stdout, _, timed_out = gpu_verify._communicate([sys.executable, "-c", probe], 30)
    assert (returncode, stdout.split(), timed_out) == (0, ["1", "True"], False)


FAKE_GPU_FIT = """
import json, sys
argv = sys.argv[1:]
progress = argv[argv.index("--progress") + 1]
replicas = int(argv[argv.index("--expected-replicas") + 1])
tf = {"version": "2.12.1", "is_cuda_build": True, "build_info": {"is_cuda_build": True}, "gpus": 1, "error": None}
open(progress, "a").write(json.dumps({"stage": "tensorflow", "t": 0.1, "tensorflow": tf}) + "\\n")
print(json.dumps({"ok": replicas == 1, "mode": "gpu", "num_replicas_in_sync": 1, "devices": ["/gpu:0"],
                  "global_batch_size": 16, "loss_start": 2.4, "loss_end": 0.6, "loss_history": [1.7, 0.9, 0.7],
                  "fit_seconds": 0.9, "samples_per_second": 800.0, "tensorflow": tf, "loaded_libraries": None,
                  "error": None, "problems": [] if replicas == 1 else [{"check": "fit", "cause": "replicas",
                  "fix": "-"}]}))
"""


def test_a_mig_host_fits_on_its_one_cuda_device_and_says_why(tmp_path: Path) -> None:
    fit = ["--fit-script", _write(tmp_path / "fit_gpu.py", FAKE_GPU_FIT), "--cpu-replicas", "0"]
    done = run_verify(tmp_path, [*fit, "--expected-cuda-devices", "1"])
    doc = json.loads(done.stdout)
    assert not [p for p in doc["problems"] if p["check"] in ("tensorflow", "fit")], doc["problems"]
    assert doc["expected"]["cuda_devices"] == 1 and "CUDA Device Enumeration" in doc["mode_note"]
    plain = json.loads(run_verify(tmp_path, fit).stdout)  # without it: the 2 GPUs are expected of TensorFlow
    assert {p["check"] for p in plain["problems"]} >= {"tensorflow", "fit"} and plain["mode_note"] is None
