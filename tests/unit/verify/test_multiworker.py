"""Multi-worker mode of fit.py and gpu_verify.py: TF_CONFIG validation, error classification and
the document plumbing without TensorFlow; a real 2-worker MultiWorkerMirroredStrategy fit on
127.0.0.1 when GPU_VERIFY_TF_PYTHON names an interpreter that can import tensorflow."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))

import fit
import gpu_verify
from helpers import tf_python


def tf_config(workers: list[Any], index: Any = 0, **extra: Any) -> str:
    config: dict[str, Any] = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    config.update(extra)
    return json.dumps(config)


TWO_WORKERS = tf_config(["gpu01:12345", "gpu02:12345"], 1)


# --- TF_CONFIG validation ----------------------------------------------------------------


def test_parse_tf_config_two_workers() -> None:
    assert fit.parse_tf_config(TWO_WORKERS) == {
        "workers": 2,
        "task_index": 1,
        "is_chief": False,
        "cluster": ["gpu01:12345", "gpu02:12345"],
    }
    assert fit.parse_tf_config(tf_config(["10.0.0.1:2222"], 0))["is_chief"] is True


@pytest.mark.parametrize(
    "text, cause",
    [
        (None, "--multiworker needs the TF_CONFIG environment variable, and it is not set."),
        ("  ", "--multiworker needs the TF_CONFIG environment variable, and it is not set."),
        ("{'cluster': 1}", "TF_CONFIG is not valid JSON (Expecting property name enclosed in double quotes"),
        ('["gpu01:1"]', "TF_CONFIG is a JSON list, not an object."),
        ('{"task": {"type": "worker", "index": 0}}', "TF_CONFIG has no cluster.worker list"),
        (tf_config([]), "TF_CONFIG has no cluster.worker list"),
        (tf_config("gpu01:1,gpu02:1"), "TF_CONFIG cluster.worker is a str, not a list"),
        (tf_config(["gpu01"]), "TF_CONFIG worker 0 is 'gpu01', not a 'host:port' address."),
        (tf_config(["gpu01:1", 7]), "TF_CONFIG worker 1 is 7, not a 'host:port' address."),
        (tf_config(["gpu01:http"]), "TF_CONFIG worker 0 is 'gpu01:http': the port must be a number from 1 to 65535."),
        (tf_config(["gpu01:70000"]), "TF_CONFIG worker 0 is 'gpu01:70000': the port must be a number"),
        (tf_config([":2222"]), "TF_CONFIG worker 0 is ':2222', not a 'host:port' address."),
        (tf_config(["gpu01:1", "gpu01:1"]), "TF_CONFIG lists gpu01:1 more than once in cluster.worker."),
        (json.dumps({"cluster": {"worker": ["gpu01:1"]}}), "TF_CONFIG has no task object naming this worker."),
        (
            json.dumps({"cluster": {"worker": ["gpu01:1"]}, "task": {"type": "chief", "index": 0}}),
            "TF_CONFIG task type is 'chief'; this check needs 'worker'.",
        ),
        (tf_config(["gpu01:1"], "0"), "TF_CONFIG task index is '0', not an integer."),
        (tf_config(["gpu01:1"], True), "TF_CONFIG task index is True, not an integer."),
        (
            tf_config(["gpu01:1", "gpu02:1"], 2),
            "TF_CONFIG task index 2 is out of range: cluster.worker has 2 addresses (valid indexes 0 to 1).",
        ),
        (tf_config(["gpu01:1", "gpu02:1"], -1), "TF_CONFIG task index -1 is out of range"),
    ],
)
def test_parse_tf_config_names_the_cause(text: str | None, cause: str) -> None:
    with pytest.raises(fit.TFConfigError) as exc:
        fit.parse_tf_config(text)
    assert exc.value.cause.startswith(cause)
    assert "TF_CONFIG=" in exc.value.fix and "own index" in exc.value.fix


def test_parse_tf_config_rejects_other_jobs() -> None:
    text = json.dumps(
        {"cluster": {"worker": ["gpu02:1"], "chief": ["gpu01:1"]}, "task": {"type": "worker", "index": 0}}
    )
    with pytest.raises(fit.TFConfigError) as exc:
        fit.parse_tf_config(text)
    assert exc.value.cause == "TF_CONFIG's cluster has job types chief; this check uses only 'worker'."
    assert "worker 0 acts as the chief" in exc.value.fix


def run_fit_script(argv: list[str], tf_config_text: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    if tf_config_text is not None:
        env["TF_CONFIG"] = tf_config_text
    return subprocess.run(
        [sys.executable, str(VERIFY_DIR / "fit.py"), *argv, "--progress", str(tmp_path / "p.jsonl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("tf_config_text", [None, "{not json", tf_config(["gpu01:1"], 3)])
def test_bad_tf_config_is_a_problem_before_tensorflow(tf_config_text: str | None, tmp_path: Path) -> None:
    done = run_fit_script(["--multiworker"], tf_config_text, tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    (found,) = result["problems"]
    assert found["check"] == "multiworker" and found["cause"].startswith(("--multiworker", "TF_CONFIG"))
    assert found["fix"].startswith("Set TF_CONFIG on every worker")
    assert result["ok"] is False and result["error"] == found["cause"] and result["multiworker"] is None
    # TensorFlow was never imported: the only progress record is the error.
    stages = [json.loads(line)["stage"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert stages == ["error"]


def test_use_replicas_with_multiworker_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        fit.main(["--multiworker", "--use-replicas", "1"])
    assert exc.value.code == 2


def test_help_names_multiworker() -> None:
    assert "--multiworker" in fit.build_parser().format_help()
    assert "--multiworker" in gpu_verify.build_parser().format_help()


# --- classification and checks -------------------------------------------------------------

# Raised on worker 0 by TensorFlow 2.12.1 when worker 1 was killed during model.fit.
HEARTBEAT = (
    "{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/replica:0/task:0/"
    "device:CPU:0}} Collective ops is aborted by: Error reported from /job:worker/task:1: Task "
    "/job:worker/replica:0/task:1 heartbeat timeout. This indicates that the remote task has failed, got "
    "preempted, or crashed unexpectedly.\nThe error could be from a previous operation. Restart your program "
    "to reset. [Op:CollectiveReduceV2]"
)


@pytest.mark.parametrize(
    "type_name, message",
    [
        ("UnavailableError", HEARTBEAT),
        ("UnavailableError", "failed to connect to all addresses"),
        ("InternalError", "Failed to connect: UNAVAILABLE: failed to connect to all addresses"),
        ("UnknownError", "Socket closed"),
        ("DeadlineExceededError", "Collective has timed out waiting for other workers."),
        ("InternalError", "status: DEADLINE_EXCEEDED: Deadline Exceeded"),
        ("AbortedError", "Collective ops is aborted by: another worker failed"),
    ],
)
def test_classify_multiworker_failures(type_name: str, message: str) -> None:
    cause, fix = fit.classify_exception(type_name, message)
    assert cause.startswith("A worker of the multi-worker cluster could not be reached or stopped answering")
    assert "{{function_node" not in cause and type_name in cause
    for words in ("same check on every worker at the same time", "gpu_verify_multiworker_port", "TF_CONFIG"):
        assert words in fix


def test_classify_heartbeat_names_the_lost_worker() -> None:
    cause, _ = fit.classify_exception("UnavailableError", HEARTBEAT)
    assert "(UnavailableError: Collective ops is aborted by: Error reported from /job:worker/task:1" in cause


def test_classify_port_in_use() -> None:
    cause, fix = fit.classify_exception("UnknownError", "Could not start gRPC server")
    assert cause.startswith("This worker could not listen on its own TF_CONFIG address")
    assert "ss -ltnp" in fix and "gpu_verify_multiworker_port" in fix


def test_classify_single_host_failures_unchanged() -> None:
    cause, fix = fit.classify_exception("UnknownError", "NCCL operation ncclAllReduce failed: unhandled system error")
    assert cause.startswith("NCCL failed") and "IOMMU" in fix
    cause, _ = fit.classify_exception("ResourceExhaustedError", "OOM when allocating tensor")
    assert cause.startswith("Out of GPU memory")
    cause, fix = fit.classify_exception("ValueError", "")
    assert cause == "The fit raised ValueError: ValueError" and "traceback" in fix


def test_check_fit_multiworker_replica_mismatch() -> None:
    result = {
        "mode": "gpu",
        "multiworker": {"workers": 2, "task_index": 0, "is_chief": True, "cluster": ["a:1", "b:1"]},
        "num_replicas_in_sync": 3,
        "devices": ["/job:worker/replica:0/task:0/device:GPU:0"],
        "loss_start": 2.4,
        "loss_end": 0.6,
        "loss_history": [1.7, 0.9],
        "epochs": 2,
    }
    (found,) = fit.check_fit(result, 4)
    assert "ran 3 replicas, expected 4" in found["cause"]
    assert "workers x GPUs per worker" in found["fix"] and "--expected-replicas" in found["fix"]
    assert fit.check_fit(result, 3) == []


# --- gpu_verify plumbing --------------------------------------------------------------------


def test_multiworker_replicas() -> None:
    assert gpu_verify.multiworker_replicas(TWO_WORKERS, 4, 0) == 8
    assert gpu_verify.multiworker_replicas(TWO_WORKERS, 4, 2) == 2
    assert gpu_verify.multiworker_replicas(TWO_WORKERS, 0, 0) == 2
    assert gpu_verify.multiworker_replicas("{", 4, 0) is None
    assert gpu_verify.multiworker_replicas(None, 4, 0) is None


def test_multiworker_summary() -> None:
    reported = {"workers": 2, "task_index": 0, "is_chief": True, "cluster": ["a:1", "b:1"]}
    fit_doc = {"multiworker": reported, "num_replicas_in_sync": 2, "samples_per_second": 870.5}
    assert gpu_verify.multiworker_summary(fit_doc, None) == dict(
        reported, num_replicas_in_sync=2, samples_per_second=870.5
    )
    # A fit killed before it reported: the cluster comes from TF_CONFIG.
    assert gpu_verify.multiworker_summary({"ok": False}, TWO_WORKERS) == {
        "workers": 2,
        "task_index": 1,
        "is_chief": False,
        "cluster": ["gpu01:12345", "gpu02:12345"],
        "num_replicas_in_sync": None,
        "samples_per_second": None,
    }
    assert gpu_verify.multiworker_summary({}, "nonsense")["workers"] is None


def test_mode_note_multiworker() -> None:
    summary = {"workers": 2, "task_index": 1}
    assert gpu_verify.mode_note(0, summary) == (
        "fit ran as worker 1 of 2 (MultiWorkerMirroredStrategy, --multiworker) on each worker's GPUs"
    )
    assert gpu_verify.mode_note(1, summary).endswith("on the CPU, one replica per worker")
    assert gpu_verify.mode_note(0) is None


def test_timeout_problem_multiworker() -> None:
    joining = [{"stage": "tensorflow", "t": 2.0}, {"stage": "multiworker-join", "t": 2.1}]
    found = gpu_verify.timeout_problem(60, joining, multiworker=True)
    assert found["cause"] == (
        "The multi-worker fit did not finish within 60 s and was killed (last stage reached: "
        "'multiworker-join' at 2.1 s): the workers did not all join the cluster."
    )
    assert "gpu_verify_multiworker_port" in found["fix"] and "firewall" in found["fix"]
    hung = gpu_verify.timeout_problem(60, [*joining, {"stage": "fit", "t": 3.0}], multiworker=True)
    assert hung["cause"].endswith("a collective between the workers hung.")
    assert "did not all join" in gpu_verify.timeout_problem(5, [], multiworker=True)["cause"]


FAKE_FIT_JOIN_HANGS = """
import json, sys, time
argv = sys.argv[1:]
progress = argv[argv.index("--progress") + 1]
open(progress, "a").write(json.dumps({"stage": "multiworker-join", "t": 0.1}) + "\\n")
time.sleep(300)
"""

FAKE_FIT_MULTIWORKER = """
import json, os, sys
argv = sys.argv[1:]
assert "--multiworker" in argv, argv
config = json.loads(os.environ["TF_CONFIG"])
workers, index = config["cluster"]["worker"], config["task"]["index"]
expected = int(argv[argv.index("--expected-replicas") + 1])
tf = {"version": "2.12.1", "is_cuda_build": False, "build_info": {"is_cuda_build": False}, "gpus": 0, "error": None}
print(json.dumps({"ok": True, "mode": "cpu-replicas", "num_replicas_in_sync": len(workers),
                  "expected_replicas": expected, "argv": argv,
                  "multiworker": {"workers": len(workers), "task_index": index, "is_chief": index == 0,
                                  "cluster": workers},
                  "devices": ["/job:worker/replica:0/task:%d/device:CPU:0" % index], "global_batch_size": 32,
                  "loss_start": 2.4, "loss_end": 0.6, "loss_history": [1.7, 0.9, 0.7], "fit_seconds": 0.9,
                  "samples_per_second": 870.0, "tensorflow": tf, "loaded_libraries": None,
                  "error": None, "problems": []}))
"""


def test_fit_subprocess_timeout_multiworker(tmp_path: Path) -> None:
    script = tmp_path / "join_hangs.py"
    script.write_text(FAKE_FIT_JOIN_HANGS)
    started = time.monotonic()
    result = gpu_verify.run_fit_subprocess(["--multiworker"], 2, str(script), multiworker=True)
    assert time.monotonic() - started < 30
    (found,) = result["problems"]
    assert result["timed_out"] is True and "the workers did not all join the cluster" in found["cause"]


def _fake_nvidia_smi(tmp_path: Path) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\nexit 9\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def run_verify_multiworker(tmp_path: Path, extra: list[str], tf_config_text: str) -> subprocess.CompletedProcess:
    script = tmp_path / "fit_multiworker.py"
    script.write_text(FAKE_FIT_MULTIWORKER)
    command = [
        sys.executable,
        str(VERIFY_DIR / "gpu_verify.py"),
        "--expected-gpus",
        "0",
        "--cpu-replicas",
        "1",
        "--multiworker",
        "--scaling",
        "--no-lspci",
        "--nvidia-smi",
        _fake_nvidia_smi(tmp_path),
        "--fit-script",
        str(script),
        *extra,
    ]
    env = dict(os.environ, TF_CONFIG=tf_config_text)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_document_multiworker_key(tmp_path: Path) -> None:
    done = run_verify_multiworker(tmp_path, [], TWO_WORKERS)
    doc = json.loads(done.stdout)
    assert doc["multiworker"] == {
        "workers": 2,
        "task_index": 1,
        "is_chief": False,
        "cluster": ["gpu01:12345", "gpu02:12345"],
        "num_replicas_in_sync": 2,
        "samples_per_second": 870.0,
    }
    fit_argv = doc["fit"]["argv"]
    assert "--multiworker" in fit_argv and fit_argv[fit_argv.index("--expected-replicas") + 1] == "2"
    assert doc["scaling"] == {
        "ok": None,
        "note": "not measured with --multiworker: the scaling check compares the GPUs of one host",
    }
    assert doc["mode"] == "cpu-replicas"
    assert (
        doc["mode_note"]
        == "fit ran as worker 1 of 2 (MultiWorkerMirroredStrategy, --multiworker) on the CPU, one replica per worker"
    )
    assert not [p for p in doc["problems"] if p["check"] in ("fit", "multiworker")]


def test_table_shows_the_workers(tmp_path: Path) -> None:
    done = run_verify_multiworker(tmp_path, ["--format", "table"], tf_config(["gpu01:1", "gpu02:1"], 0))
    assert "  workers     2, this is worker 0 (chief): gpu01:1, gpu02:1" in done.stdout


def test_single_host_document_has_null_multiworker(tmp_path: Path) -> None:
    script = tmp_path / "fit_single.py"
    script.write_text(FAKE_FIT_MULTIWORKER.replace('assert "--multiworker" in argv, argv', ""))
    done = subprocess.run(
        [
            sys.executable,
            str(VERIFY_DIR / "gpu_verify.py"),
            "--expected-gpus",
            "0",
            "--cpu-replicas",
            "2",
            "--no-lspci",
            "--nvidia-smi",
            _fake_nvidia_smi(tmp_path),
            "--fit-script",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CONFIG=TWO_WORKERS),
        timeout=120,
        check=False,
    )
    doc = json.loads(done.stdout)
    assert doc["multiworker"] is None and "--multiworker" not in doc["fit"]["argv"]
    assert doc["mode_note"] == "fit ran on 2 logical CPU devices (--cpu-replicas 2), not on GPUs"


# --- the real thing ---------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out now on 127.0.0.1 (free again once the sockets close)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run_two_workers(python: str, timeout: float) -> list[tuple[int, dict[str, Any], str]]:
    """Start fit.py --multiworker as workers 0 and 1 of a 127.0.0.1 cluster; returns
    ``[(returncode, result, stderr)]`` per worker.  When one worker fails, or at the timeout, the
    others (which would wait for it for ever) are killed as process groups."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    procs = []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=tf_config(addresses, index), TF_CPP_MIN_LOG_LEVEL="2")
        procs.append(
            subprocess.Popen(
                [python, str(VERIFY_DIR / "fit.py"), "--multiworker", "--cpu-replicas", "1"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            codes = [proc.poll() for proc in procs]
            if None not in codes or any(code for code in codes if code is not None):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    outcomes = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        outcomes.append((proc.returncode, json.loads(stdout) if stdout.strip() else {}, stderr))
    return outcomes


def test_real_two_worker_fit_on_localhost() -> None:
    python = tf_python()
    started = time.monotonic()
    outcomes = run_two_workers(python, 300)
    if any("could not listen" in json.dumps(result.get("problems")) for _, result, _ in outcomes):
        # Another process took a port between free_ports() and the bind: once more with new ones.
        outcomes = run_two_workers(python, 300)
    assert time.monotonic() - started < 300, "the workers did not finish; see their stderr"
    for index, (returncode, result, stderr) in enumerate(outcomes):
        assert returncode == 0, json.dumps(result.get("problems")) + stderr[-3000:]
        assert result["ok"] is True and result["problems"] == [] and result["error"] is None
        assert result["num_replicas_in_sync"] == 2 and result["expected_replicas"] == 2
        assert result["mode"] == "cpu-replicas" and len(result["devices"]) == 1
        assert f"/task:{index}/" in result["devices"][0]
        assert result["multiworker"] == {
            "workers": 2,
            "task_index": index,
            "is_chief": index == 0,
            "cluster": outcomes[0][1]["multiworker"]["cluster"],
        }
        assert result["global_batch_size"] == 2 * result["per_replica_batch_size"]
        losses = [result["loss_start"], result["loss_end"], *result["loss_history"]]
        assert all(isinstance(v, float) and math.isfinite(v) for v in losses), losses
        assert result["loss_end"] < result["loss_start"]
        assert result["samples_per_second"] > 0
    # The all-reduce keeps the replicas in step: both workers end with the same loss.
    assert outcomes[0][1]["loss_end"] == pytest.approx(outcomes[1][1]["loss_end"], rel=1e-5)
