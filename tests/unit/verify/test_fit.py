"""fit.py: batch planning, fit checks and error classification without TensorFlow; the real
MirroredStrategy fit on 2 logical CPU devices when GPU_VERIFY_TF_PYTHON names an interpreter
that can import tensorflow."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))

import fit
from helpers import tf_python


def good_result(**changes: Any) -> dict[str, Any]:
    result = {
        "mode": "cpu-replicas",
        "num_replicas_in_sync": 2,
        "devices": ["/cpu:0", "/cpu:1"],
        "loss_start": 2.40,
        "loss_end": 0.60,
        "loss_history": [1.75, 0.93, 0.68],
        "epochs": 3,
    }
    result.update(changes)
    return result


def test_plan_batches() -> None:
    assert fit.plan_batches(16, 2) == 32
    assert fit.plan_batches(16, 8) == 128
    with pytest.raises(ValueError, match="per-replica batch"):
        fit.plan_batches(0, 2)
    with pytest.raises(ValueError, match="0 replicas"):
        fit.plan_batches(16, 0)


def test_check_fit_passes_a_good_result() -> None:
    assert fit.check_fit(good_result(), 2) == []


def test_check_fit_replica_mismatch() -> None:
    (found,) = fit.check_fit(good_result(mode="gpu", num_replicas_in_sync=1, devices=["/gpu:0"]), 2)
    assert found["check"] == "fit"
    assert "ran 1 replicas, expected 2" in found["cause"] and "/gpu:0" in found["cause"]
    assert "CUDA_VISIBLE_DEVICES" in found["fix"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("loss_end", math.nan),
        ("loss_start", math.inf),
        ("loss_history", [1.0, math.nan, 0.5]),
    ],
)
def test_check_fit_non_finite_loss(field: str, value: Any) -> None:
    (found,) = fit.check_fit(good_result(**{field: value}), 2)
    assert "not finite" in found["cause"]


def test_check_fit_loss_not_falling() -> None:
    (found,) = fit.check_fit(good_result(loss_start=2.30, loss_end=2.31), 2)
    assert found["cause"] == "Loss did not fall: 2.3000 before training, 2.3100 after 3 epochs."
    assert "nvidia-smi topo -m" in found["fix"]


def test_classify_exception() -> None:
    cause, fix = fit.classify_exception("ResourceExhaustedError", "OOM when allocating tensor with shape[64,16,32,32]")
    assert cause.startswith("Out of GPU memory") and "--per-replica-batch" in fix
    message = (
        "Loaded runtime CuDNN library: 8.8.0 but source was compiled with: 8.9.4. CuDNN library needs "
        "to have matching major version and equal or higher minor version."
    )
    cause, _ = fit.classify_exception("FailedPreconditionError", message)
    assert "refused the loaded cuDNN" in cause and "8.8.0" in cause
    cause, fix = fit.classify_exception("UnknownError", "NCCL operation ncclAllReduce failed: unhandled system error")
    assert "NCCL" in cause and "IOMMU" in fix and "nvidia-smi topo -m" in fix
    cause, _ = fit.classify_exception("InternalError", "CUDA driver version is insufficient for CUDA runtime version")
    assert "driver is too old" in cause
    cause, fix = fit.classify_exception("ValueError", "something odd")
    assert "ValueError" in cause and "traceback" in fix


@pytest.mark.parametrize("rule", fit.ERROR_RULES, ids=lambda rule: rule.markers[0])
def test_every_error_rule_answers_for_its_own_markers(rule: fit.ErrorRule) -> None:
    # No earlier row of the table shadows a later one: each marker, type name and status code
    # leads to its own row (every row has its own fix).
    assert len({r.fix for r in fit.ERROR_RULES}) == len(fit.ERROR_RULES)
    for marker in rule.markers:
        assert fit.classify_exception("SomeError", f"Op failed: {marker.upper()} here")[1] == rule.fix
    for type_name in rule.type_names:
        assert fit.classify_exception(type_name, "no known text")[1] == rule.fix
    for code in rule.exact:
        assert fit.classify_exception("SomeError", f"status: {code}: no known text")[1] == rule.fix
        assert fit.classify_exception("SomeError", f"status: {code.lower()}: no known text")[1] != rule.fix


def test_classify_exception_full_texts() -> None:
    assert fit.classify_exception("ResourceExhaustedError", "OOM when allocating tensor\nmore") == (
        "Out of GPU memory during the fit (ResourceExhaustedError: OOM when allocating tensor).",
        "free the GPUs (`nvidia-smi` lists other processes) or lower --per-replica-batch / --image-size",
    )
    assert fit.classify_exception("InternalError", "CUDA driver version is insufficient for CUDA runtime version") == (
        "The NVIDIA driver is too old for TensorFlow's CUDA runtime (CUDA driver version is insufficient for "
        "CUDA runtime version).",
        "upgrade the driver (nvidia_driver role) to the branch the stack's CUDA needs",
    )
    cause, fix = fit.classify_exception("UnknownError", "Could not start gRPC server")
    assert cause == (
        "This worker could not listen on its own TF_CONFIG address (UnknownError: Could not start gRPC server): "
        "the port is in use or the address is not one of this host's."
    )
    cause, fix = fit.classify_exception("RuntimeError", "Virtual devices cannot be modified after being initialized")
    assert cause == (
        "TensorFlow was initialised before the logical CPU devices were set (Virtual devices cannot be "
        "modified after being initialized)."
    )
    assert fix == "this is a bug in fit.py: logical devices must be configured before any op"
    # The message is quoted as it is, braces included (the causes are format templates).
    cause, _ = fit.classify_exception("UnknownError", "cuDNN {0} {first} {detail}")
    assert cause == "cuDNN failed during the convolution (UnknownError: cuDNN {0} {first} {detail})."


def replica_args(**changes: Any) -> argparse.Namespace:
    values = {"expected_replicas": None, "cpu_replicas": 0, "use_replicas": None}
    values.update(changes)
    return argparse.Namespace(**values)


def test_expected_replicas() -> None:
    two_workers = {"workers": 2, "task_index": 0, "is_chief": True, "cluster": ["a:1", "b:1"]}
    assert fit.expected_replicas(replica_args(), None, "gpu", 4) == 4
    assert fit.expected_replicas(replica_args(use_replicas=1), None, "gpu", 4) == 1
    assert fit.expected_replicas(replica_args(cpu_replicas=3), None, "cpu-replicas", 4) == 3
    assert fit.expected_replicas(replica_args(cpu_replicas=3, use_replicas=1), None, "cpu-replicas", 0) == 1
    assert fit.expected_replicas(replica_args(expected_replicas=5), None, "gpu", 4) == 5
    assert fit.expected_replicas(replica_args(), two_workers, "gpu", 4) == 8
    assert fit.expected_replicas(replica_args(cpu_replicas=1), two_workers, "cpu-replicas", 4) == 2
    assert fit.expected_replicas(replica_args(), two_workers, "cpu-replicas", 0) == 2
    assert fit.expected_replicas(replica_args(expected_replicas=3), two_workers, "gpu", 4) == 3


def test_usage_errors_exit_2_without_tensorflow() -> None:
    for argv in (["--cpu-replicas", "-1"], ["--steps", "0"], ["--image-size", "2"]):
        with pytest.raises(SystemExit) as exc:
            fit.main(argv)
        assert exc.value.code == 2


def test_help_works_without_tensorflow() -> None:
    done = subprocess.run(
        [sys.executable, str(VERIFY_DIR / "fit.py"), "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "--cpu-replicas" in done.stdout


def test_real_fit_on_two_logical_cpus(tmp_path: Path) -> None:
    python = tf_python()
    progress = tmp_path / "progress.jsonl"
    done = subprocess.run(
        [
            python,
            str(VERIFY_DIR / "fit.py"),
            "--cpu-replicas",
            "2",
            "--progress",
            str(progress),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout)  # stdout holds only the JSON document
    assert result["ok"] is True and result["problems"] == [] and result["error"] is None
    assert result["mode"] == "cpu-replicas"
    assert result["num_replicas_in_sync"] == 2 and len(result["devices"]) == 2
    assert all("CPU" in d for d in result["devices"])
    assert result["global_batch_size"] == 2 * result["per_replica_batch_size"] == 32
    assert len(result["loss_history"]) == result["epochs"] == 3
    assert result["loss_end"] < result["loss_start"]
    assert result["fit_seconds"] > 0 and result["samples_per_second"] > 0
    assert result["tensorflow"]["version"] == result["tensorflow_version"]
    stages = [json.loads(line)["stage"] for line in progress.read_text().splitlines()]
    assert stages[0] == "import" and stages[-1] == "done" and "epoch" in stages


def test_real_fit_expected_replicas_mismatch(tmp_path: Path) -> None:
    python = tf_python()
    done = subprocess.run(
        [
            python,
            str(VERIFY_DIR / "fit.py"),
            "--cpu-replicas",
            "2",
            "--expected-replicas",
            "3",
            "--epochs",
            "1",
            "--steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert "ran 2 replicas, expected 3" in result["problems"][0]["cause"]
