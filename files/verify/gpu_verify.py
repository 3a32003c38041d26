"""Verify one host's GPU stack end to end and print one JSON document (or a short table).

Run with the TensorFlow venv's interpreter, e.g.::

    /opt/tensorflow/2.12/bin/python /opt/gpu-verify/gpu_verify.py --expected-gpus 2 \\
        --expect-driver 520.61.05 --expect-cuda 11.8 --expect-cudnn 8.6.0 \\
        --expect-tensorflow 2.12.1 --stack tf2.12 --output /var/lib/gpu-verify/tf2.12.json

Steps, in order:

1. ``gpu_count``: GPUs seen by nvidia-smi (and lspci) against ``--expected-gpus``; the driver
   version nvidia-smi reports against ``--expect-driver``; with ``--expect-fabricmanager`` (an
   NVSwitch host), the fabric manager runs at the driver's version (``fabricmanager.py``).
2. ``libraries`` (ctypes only, no TensorFlow, in a child process of this interpreter: a library
   that aborts, as cuDNN does when it cannot load a sub-library, is reported, not fatal): libcuda,
   libcudart, libcudnn as really loaded, against the pins; driver CUDA version >= runtime.  Without
   a usable GPU the runtime's version comes from its file name and the record's ``note`` says why
   (``libraries.py``).  A stack of NVIDIA's wheels (``--cuda-source wheels``, one ``--library-dir`` per
   wheel folder) has them from its venv: a libcudart, libcublas(Lt) or libcudnn mapped from elsewhere, by
   the probe or by TensorFlow in the fit, fails naming both files (``wheels.py``); it has no tree for
   ``default`` to check.  ``lock``: the venv's distributions against its dependency lock, ``--lock``
   (``venv_lock.py``).
3. ``fit.py`` as a subprocess of the same interpreter (``sys.executable``) in its own process
   group, killed as a group after ``--timeout`` seconds (a hung NCCL all-reduce never returns).
   It also reports TensorFlow's version and build info, compared here with the loaded libraries
   and ``--expect-tensorflow``, and the library files TensorFlow itself mapped.
4. ``default`` (the default stack only, ``--default-symlink``): ``/usr/local/cuda`` and a login
   shell's ``CUDA_HOME`` and ``nvcc`` point at this stack's toolkit (``pointers.py``).
5. ``kernel`` (``--kernel-dir``, where the venv holds ipykernel): the stack's Jupyter kernel starts
   from its kernel spec and runs one cell with the stack's libraries (``kernel.py``).

``--multiworker``: the fit runs ``fit.py --multiworker`` (MultiWorkerMirroredStrategy over the
workers in the TF_CONFIG environment variable, which the fit inherits); every worker runs this
script at the same time.  The fit must have workers x ``--expected-gpus`` replicas (workers on
the CPU with ``--cpu-replicas``); ``--scaling`` is skipped.  A fit that does not finish within
``--timeout`` is killed like any other: then the workers did not all join or a collective hung.

Output document (schema 1)::

    {"schema": 1, "host", "stack", "ok", "mode": "gpu"|"cpu-replicas", "mode_note",
     "driver_version", "gpus": {gpu_count result}, "fabricmanager": {"required", "running",
     "version"}, "libraries": {"libcuda": {...},
     "libcudart": {...}, "libcudnn": {...}}, "tensorflow": {"version", "is_cuda_build",
     "build_info", "gpus", "error"}, "cuda": {"source": "runfile"|"wheels", "root": path | null,
     "library_dirs": [...]}, "fit": {fit result, "timed_out", "returncode"},
     "lock": {"path", "sha256", "pins", "ok", "drift", "note"} (venv_lock.py),
     "default": null | {"symlink", "points_at", "cuda_home", "nvcc", "ok"} (pointers.py),
     "kernel": null | {"name", "spec", "started", "prefix", "ld_library_path", "loaded", "ok"} (kernel.py),
     "problems": [{"check", "cause", "fix"}], "expected": {"gpus", "cuda_devices", "driver", "cuda", "cudnn",
     "tensorflow"}, "seconds", "multiworker": null | {"workers", "task_index", "is_chief",
     "cluster": ["host:port", ...], "num_replicas_in_sync", "samples_per_second"}}

``ok`` is false exactly when ``problems`` is non-empty.  Times are seconds.

Exit codes: 0 all checks passed, 1 a check failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from typing import Any

import fabricmanager
import gpu_count
import kernel
import libraries
import pointers
import venv_lock
from fit import MULTIWORKER_FIX, NCCL_HANG_FIX, OOM_CAUSE, TFConfigError, add_fit_arguments, parse_tf_config
from gpu_parsers import SAMPLE_FIELDS, parse_samples
from verify_common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    Problem,
    dumps,
    non_negative_int,
    positive_float,
    problem,
    tail,
    write_json_atomic,
)

SCHEMA = 1
HERE = os.path.dirname(os.path.abspath(__file__))
KILL_GRACE_SECONDS = 5.0


# --- pure checks ----------------------------------------------------------------------------


def driver_problems(driver_version: str | None, expect_driver: str | None) -> list[Problem]:
    """nvidia-smi's driver version must equal the pin (skipped when nvidia-smi gave none)."""
    if not expect_driver or not driver_version or driver_version == expect_driver:
        return []
    return [
        problem(
            "driver",
            f"nvidia-smi reports driver {driver_version}, the stack pins {expect_driver}.",
            "rerun the nvidia_driver role; if it already installed the pin, reboot so the new kernel "
            "module loads (`cat /proc/driver/nvidia/version` shows the loaded one), or fix "
            "nvidia_driver_version",
        )
    ]


def cuda_devices(args: argparse.Namespace) -> int:
    """The devices one CUDA process enumerates: ``--expected-cuda-devices``, else every expected GPU."""
    return args.expected_gpus if args.expected_cuda_devices is None else args.expected_cuda_devices


def mig_note(expected_gpus: int, expected_cuda_devices: int) -> str | None:
    """Why TensorFlow is expected to see fewer devices than the host has GPUs (None when it is not)."""
    if expected_cuda_devices == expected_gpus:
        return None
    return (
        f"TensorFlow is expected to see {expected_cuda_devices} of the {expected_gpus} GPUs: the GPUs in MIG mode "
        "count as one, since a CUDA process enumerates one MIG device (NVIDIA Multi-Instance GPU User Guide, "
        '"CUDA Device Enumeration"); run one process per MIG device (CUDA_VISIBLE_DEVICES=MIG-<uuid>)'
    )


def run_note(args: argparse.Namespace, multiworker: dict[str, Any] | None) -> str | None:
    """The document's ``mode_note``: how the fit ran (:func:`mode_note`) and, on GPUs, why TensorFlow sees
    fewer devices than the host has GPUs (:func:`mig_note`); None when neither applies."""
    gpu_note = None if args.cpu_replicas > 0 else mig_note(args.expected_gpus, cuda_devices(args))
    return "; ".join(note for note in (mode_note(args.cpu_replicas, multiworker), gpu_note) if note) or None


def tensorflow_gpu_problems(
    tf_info: dict[str, Any], expected_gpus: int, smi_seen: int, expected_cuda_devices: int | None = None
) -> list[Problem]:
    """In GPU mode TensorFlow must see every expected GPU; on a MIG host, the non-MIG GPUs and one MIG device
    (``expected_cuda_devices``)."""
    gpus = tf_info.get("gpus")
    expected = expected_gpus if expected_cuda_devices is None else expected_cuda_devices
    if tf_info.get("error") or gpus is None or gpus == expected:
        return []
    if not tf_info.get("is_cuda_build"):
        fix = (
            "the venv holds a CPU-only TensorFlow build (e.g. tensorflow-cpu): install the GPU "
            "wheel for this stack (tf_venv role)"
        )
    else:
        fix = (
            "TensorFlow could not open the CUDA libraries or some GPUs: see the libcudart/libcudnn "
            'problems, run with TF_CPP_MIN_LOG_LEVEL=0 to see "Could not load dynamic library", '
            "and check CUDA_VISIBLE_DEVICES"
        )
    return [
        problem(
            "tensorflow",
            f"TensorFlow {tf_info.get('version')} sees {gpus} GPUs, nvidia-smi {smi_seen}, the "
            f"inventory expects {expected_gpus}"
            + (f" ({mig_note(expected_gpus, expected)})." if expected != expected_gpus else "."),
            fix,
        )
    ]


def tf_loaded_library_problems(
    loaded: dict[str, list[dict[str, Any]]] | None,
    libs: dict[str, dict[str, Any]],
    expect_cuda: str | None,
    expect_cudnn: str | None,
    strays: Collection[str] = (),
) -> list[Problem]:
    """Check the libcudart/libcudnn files TensorFlow itself mapped against the pins: its
    DT_RUNPATH (e.g. the venv's nvidia-* wheels) and LD_LIBRARY_PATH come before the system
    loader's cache in the search order, so it may load other copies than ``ldconfig -p`` lists
    (ld.so(8) manual page, DESCRIPTION, https://man7.org/linux/man-pages/man8/ld.so.8.html).
    ``strays``: files a wheels stack's check failed already for where they come from (not compared)."""
    problems: list[Problem] = []
    if not loaded:
        return problems
    for key, expected, parts, label in (
        ("libcudart", expect_cuda, 2, "CUDA runtime"),
        ("libcudnn", expect_cudnn, 3, "cuDNN"),
    ):
        if not expected:
            continue
        want_parts = min(parts, len(str(expected).split(".")))
        want = str(expected).split(".")[:want_parts]
        for entry in loaded.get(key) or []:
            version = entry.get("version")
            if not version or version.split(".")[:want_parts] == want or entry.get("path") in strays:
                continue
            system = libs.get(key) or {}
            problems.append(
                problem(
                    key,
                    f"TensorFlow loaded {label} {version} from {entry['path']}, the stack pins "
                    f"{expected} (the system loader path gives {system.get('version')} at "
                    f"{system.get('path')}).",
                    "remove the stray copy or its folder from LD_LIBRARY_PATH / the venv's "
                    "nvidia-* wheels, so TensorFlow loads the pinned library; run `ldconfig`",
                )
            )
    return problems


def explain_oom(fit_problems: list[Problem], busy: str | None) -> list[Problem]:
    """Add the processes holding GPU memory (``busy``, from :func:`gpu_count.busy_gpus`) and the
    memory-growth fact to an out-of-memory problem of the fit; other problems pass unchanged."""
    explained: list[Problem] = []
    for found in fit_problems:
        if str(found.get("cause", "")).startswith(OOM_CAUSE):
            others = f" Other processes hold GPU memory: {busy}." if busy else " No other process holds GPU memory."
            fix = found.get("fix", "")
            if busy:
                fix = (
                    "Stop those processes or verify when the GPUs are idle; the fit already sets memory growth on "
                    "every GPU before any op (tf.config.experimental.set_memory_growth), so TensorFlow takes only "
                    "what it needs"
                )
            found = problem(found["check"], found["cause"] + others, fix)
        explained.append(found)
    return explained


def mode_note(cpu_replicas: int, multiworker: dict[str, Any] | None = None) -> str | None:
    """Plain statement of how the fit ran when that is not "this host's GPUs" (None then).

    Args:
        cpu_replicas: ``--cpu-replicas`` (0 = GPUs).
        multiworker: the document's ``multiworker`` object in multi-worker mode, else None.
    """
    if multiworker is not None:
        where = "on the CPU, one replica per worker" if cpu_replicas > 0 else "on each worker's GPUs"
        return (
            f"fit ran as worker {_fmt(multiworker.get('task_index'))} of {_fmt(multiworker.get('workers'))} "
            f"(MultiWorkerMirroredStrategy, --multiworker) {where}"
        )
    if cpu_replicas <= 0:
        return None
    return f"fit ran on {cpu_replicas} logical CPU devices (--cpu-replicas {cpu_replicas}), not on GPUs"


def read_progress(path: str) -> list[dict[str, Any]]:
    """Progress records written by fit.py (JSON lines; unreadable lines skipped)."""
    records: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return records


def timeout_problem(timeout: float, progress: list[dict[str, Any]], multiworker: bool = False) -> Problem:
    """Cause and fix for a fit killed after ``timeout`` seconds, naming the last stage reached.

    Args:
        timeout: the limit, seconds.
        progress: fit.py's progress records (:func:`read_progress`).
        multiworker: the fit ran with ``--multiworker``; the cause then says whether the workers
            did not all join (killed at or before the ``multiworker-join`` stage) or a collective
            between them hung, and the fix names the cluster's settings.
    """
    if multiworker:
        return _multiworker_timeout_problem(timeout, progress)
    last = progress[-1] if progress else None
    if last is None:
        where = "it never started"
    else:
        where = f"last stage reached: {last.get('stage')!r} at {last.get('t')} s"
        if last.get("stage") == "epoch":
            where += f", after epoch {last.get('epoch')}"
    if last is None or last.get("stage") in ("import", "tensorflow"):
        fix = (
            "TensorFlow hung while importing or opening the GPUs: check that nvidia-smi answers "
            "quickly and `dmesg | grep -i -e xid -e nvrm`; then " + NCCL_HANG_FIX
        )
    else:
        fix = "a multi-GPU all-reduce that never returns is usually NCCL/P2P: " + NCCL_HANG_FIX
    return problem(
        "fit",
        f"The MirroredStrategy fit did not finish within {timeout:g} s and was killed ({where}).",
        fix,
    )


def _multiworker_timeout_problem(timeout: float, progress: list[dict[str, Any]]) -> Problem:
    last = progress[-1] if progress else None
    stage = last.get("stage") if last else None
    where = "it never started" if last is None else f"last stage reached: {stage!r} at {last.get('t')} s"
    if stage in (None, "import", "tensorflow", "multiworker-join"):
        what = "the workers did not all join the cluster"
    else:
        what = "a collective between the workers hung"
    return problem(
        "fit",
        f"The multi-worker fit did not finish within {timeout:g} s and was killed ({where}): {what}.",
        MULTIWORKER_FIX,
    )


def crash_problem(returncode: int, stderr: str) -> Problem:
    """Cause and fix for a fit that exited without printing its JSON result."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        cause = f"The fit process was killed by {name} without a result."
        if -returncode == signal.SIGKILL:
            fix = "the kernel's OOM killer is likely (`dmesg | grep -i oom`): free host memory or lower --per-replica-batch"
        else:
            fix = "a native crash in TensorFlow or a CUDA library: check library versions above and `dmesg`"
    else:
        cause = f"The fit process exited with {returncode} without a result: {tail(stderr, 300).strip() or 'no output'}"
        fix = "run fit.py by hand with the venv's python to see the full error"
    return problem("fit", cause, fix)


# --- I/O --------------------------------------------------------------------------------------


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the fit's process group, then SIGKILL it after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if wait is None:
            break
        try:
            proc.wait(timeout=wait)
            # The leader is gone; SIGKILL the rest of the group (children it left behind).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        except subprocess.TimeoutExpired:
            continue


def run_fit_subprocess(
    fit_argv: Sequence[str], timeout: float, fit_script: str, multiworker: bool = False
) -> dict[str, Any]:
    """Run ``fit_script`` with this interpreter under ``timeout`` seconds.

    ``multiworker`` (the fit runs with ``--multiworker``) only changes the timeout's cause and fix.

    Returns the fit result document plus ``timed_out``, ``returncode`` and (when not ok)
    ``stderr_tail``; the last ``tensorflow`` progress record is kept in ``tensorflow`` when the fit
    did not finish.
    """
    fd, progress_path = tempfile.mkstemp(prefix="gpu-verify-fit-", suffix=".jsonl")
    os.close(fd)
    command = [sys.executable, fit_script, "--progress", progress_path, *fit_argv]
    try:
        returncode, stdout, stderr, timed_out = _communicate(command, timeout)
        progress = read_progress(progress_path)
    finally:
        os.unlink(progress_path)
    result = _fit_document(stdout, timed_out)
    result["timed_out"] = timed_out
    result["returncode"] = returncode
    if "tensorflow" not in result or result["tensorflow"] is None:
        tf_records = [r["tensorflow"] for r in progress if r.get("stage") == "tensorflow"]
        result["tensorflow"] = tf_records[-1] if tf_records else None
    found: Problem | None = None
    if timed_out:
        found = timeout_problem(timeout, progress, multiworker)
    elif "num_replicas_in_sync" not in result:
        found = crash_problem(returncode, stderr)
    if found is not None:
        result["error"] = found["cause"]
        result["problems"] = [found]
        result["ok"] = False
    if not result["ok"]:
        result["stderr_tail"] = tail(stderr, 4000)
    return result


def _communicate(command: list[str], timeout: float) -> tuple[int, str, str, bool]:
    """Run ``command`` in its own process group (TF_CPP_MIN_LOG_LEVEL 2 unless set); kill the
    group after ``timeout`` seconds.  Returns ``(returncode, stdout, stderr, timed_out)``."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # No bytecode written: autograph compiles the fit's functions into temporary modules in the temp
    # folder, whose .pyc Python would otherwise leave there on every run (PYTHONDONTWRITEBYTECODE,
    # https://docs.python.org/3/using/cmdline.html#envvar-PYTHONDONTWRITEBYTECODE).
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        stdout, stderr = proc.communicate()
    return proc.returncode, stdout, stderr, timed_out


def _fit_document(stdout: str, timed_out: bool) -> dict[str, Any]:
    """The fit's JSON result from its stdout (an empty one when it timed out or printed none),
    with ``ok``, ``problems`` and ``error`` always present."""
    result: dict[str, Any]
    try:
        result = json.loads(stdout) if stdout.strip() and not timed_out else {}
    except ValueError:
        result = {}
    if not isinstance(result, dict):
        result = {}
    result.setdefault("ok", False)
    result.setdefault("problems", [])
    result.setdefault("error", None)
    return result


class UtilisationSampler:
    """Sample utilisation and memory of every GPU with ``nvidia-smi ... -lms interval_ms`` while
    the fit runs (nvidia-smi's own loop; source: nvidia-smi --help, -lms). ``stop()`` returns
    ``gpu_parsers.parse_samples`` of what it printed (peaks per GPU index), or None when nvidia-smi
    could not be started."""

    def __init__(self, nvidia_smi: str, interval_ms: int = 500) -> None:
        self.command = [
            nvidia_smi,
            "--query-gpu=" + ",".join(SAMPLE_FIELDS),
            "--format=csv,noheader,nounits",
            "-lms",
            str(interval_ms),
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
            )
        except OSError:
            self.proc = None

    def stop(self) -> dict[str, dict[str, Any]] | None:
        if self.proc is None:
            return None
        kill_group(self.proc)
        stdout, _stderr = self.proc.communicate()
        return parse_samples(stdout or "")


def scaling_result(fit_all: dict[str, Any], fit_one: dict[str, Any], threshold: float) -> dict[str, Any]:
    """Compare the steady throughput (samples/s without the first epoch) of the fit on all replicas
    with the same fit on one replica: speedup = all / one, efficiency = speedup / replicas.

    Returns ``{replicas, samples_per_second_one, samples_per_second_all, speedup, efficiency,
    threshold, ok, problems}``; an efficiency below ``threshold`` (a fraction, 0.75 by default; 2 GPUs
    with NVLink commonly give 1.8-2.2x) or a failed baseline fit is a problem.
    """
    replicas = int(fit_all.get("num_replicas_in_sync") or 0)

    def rate(fit: dict[str, Any]) -> Any:
        return fit.get("steady_samples_per_second") or fit.get("samples_per_second")

    one, every = rate(fit_one), rate(fit_all)
    doc: dict[str, Any] = {
        "replicas": replicas,
        "samples_per_second_one": one,
        "samples_per_second_all": every,
        "speedup": None,
        "efficiency": None,
        "threshold": threshold,
        "ok": False,
        "problems": [],
    }
    if not fit_one.get("ok") or not one or not every:
        doc["problems"].append(
            problem(
                "scaling",
                f"The 1-replica baseline fit failed: {fit_one.get('error') or 'no throughput reported'}.",
                "Run fit.py --use-replicas 1 by hand with the venv's python to see why.",
            )
        )
        return doc
    doc["speedup"] = round(every / one, 3)
    doc["efficiency"] = round(every / one / replicas, 3)
    doc["ok"] = doc["efficiency"] >= threshold
    if not doc["ok"]:
        doc["problems"].append(
            problem(
                "scaling",
                f"Scaling efficiency {doc['efficiency']:.2f} on {replicas} replicas ({doc['speedup']:.2f}x the "
                f"1-replica throughput) is below {threshold:.2f}.",
                "Check the links between the GPUs (`nvidia-smi topo -m`: NVLink, or PCIe x16 without a host "
                "bridge in between), NCCL's settings and the input pipeline; small models scale poorly, so "
                "compare with a larger per-replica batch.",
            )
        )
    return doc


def multiworker_replicas(tf_config: str | None, expected_gpus: int, cpu_replicas: int) -> int | None:
    """Replicas a multi-worker fit must have: workers x ``expected_gpus`` (workers x 1 on the CPU,
    or when the inventory expects no GPU); None when TF_CONFIG is unusable (fit.py reports why)."""
    try:
        workers = parse_tf_config(tf_config)["workers"]
    except TFConfigError:
        return None
    return workers * (1 if cpu_replicas > 0 or expected_gpus < 1 else expected_gpus)


def multiworker_summary(fit: dict[str, Any], tf_config: str | None) -> dict[str, Any]:
    """The document's ``multiworker`` object: the fit's ``{"workers", "task_index", "is_chief",
    "cluster"}`` (from TF_CONFIG when the fit did not report it, None values when that is
    unusable) plus its ``num_replicas_in_sync`` and ``samples_per_second`` (the cluster's, samples/s)."""
    summary = fit.get("multiworker")
    if not isinstance(summary, dict):
        try:
            summary = parse_tf_config(tf_config)
        except TFConfigError:
            summary = {"workers": None, "task_index": None, "is_chief": None, "cluster": []}
    return dict(
        summary,
        num_replicas_in_sync=fit.get("num_replicas_in_sync"),
        samples_per_second=fit.get("samples_per_second"),
    )


def fit_arguments(args: argparse.Namespace) -> list[str]:
    """fit.py's command line for gpu_verify.py's options (``--expected-replicas`` and
    ``--use-replicas`` are added by :func:`run_fits`)."""
    fit_argv = [
        "--cpu-replicas",
        str(args.cpu_replicas),
        "--per-replica-batch",
        str(args.per_replica_batch),
        "--steps",
        str(args.steps),
        "--epochs",
        str(args.epochs),
        "--seed",
        str(args.seed),
        "--learning-rate",
        repr(args.learning_rate),
    ]
    if args.mixed_precision:
        fit_argv.append("--mixed-precision")
    if args.multiworker:
        fit_argv.append("--multiworker")
    return fit_argv


def run_fits(
    args: argparse.Namespace, tf_config: str | None
) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, dict[str, Any]] | None]:
    """Run the fit while sampling GPU utilisation, then the 1-replica baseline when ``--scaling``
    asks for it and the fit passed on more than one replica.

    Returns ``(fit, scaling, utilisation)``: scaling is None when not measured, a note without
    ``problems`` with ``--multiworker``, else :func:`scaling_result`.
    """
    expected_replicas: int | None = args.cpu_replicas if args.cpu_replicas > 0 else cuda_devices(args)
    if args.multiworker:
        expected_replicas = multiworker_replicas(tf_config, cuda_devices(args), args.cpu_replicas)
    fit_argv = fit_arguments(args)
    sampler = UtilisationSampler(args.nvidia_smi)
    sampler.start()
    try:
        fit = run_fit_subprocess(
            fit_argv + (["--expected-replicas", str(expected_replicas)] if expected_replicas else []),
            args.timeout,
            args.fit_script,
            args.multiworker,
        )
    finally:
        utilisation = sampler.stop()
    scaling = None
    if args.scaling and args.multiworker:
        # A 1-replica baseline would need the other workers to run it too, at the same time.
        scaling = {
            "ok": None,
            "note": "not measured with --multiworker: the scaling check compares the GPUs of one host",
        }
    elif args.scaling and fit.get("ok") and (fit.get("num_replicas_in_sync") or 0) > 1:
        single = run_fit_subprocess(fit_argv + ["--use-replicas", "1"], args.timeout, args.fit_script)
        scaling = scaling_result(fit, single, args.scaling_threshold)
    return fit, scaling, utilisation


def fit_problems(
    args: argparse.Namespace,
    fit: dict[str, Any],
    tf_info: dict[str, Any],
    libs: dict[str, dict[str, Any]],
    gpus: dict[str, Any],
) -> list[Problem]:
    """Problems from the fit's report, in order: TensorFlow against the libraries and the pin (not
    when TensorFlow failed to import), the library files TensorFlow mapped, then the fit's own
    problems (an out-of-memory one names the processes holding GPU memory)."""
    problems: list[Problem] = []
    found = fit.get("problems") or []
    if not any(p.get("check") == "tensorflow" for p in found):
        if not tf_info.get("error"):
            problems += libraries.tensorflow_problems(tf_info, libs, args.expect_tensorflow)
        if args.cpu_replicas == 0:
            problems += tensorflow_gpu_problems(tf_info, args.expected_gpus, gpus["seen"], cuda_devices(args))
    mapped = [entry["path"] for entries in (fit.get("loaded_libraries") or {}).values() for entry in entries]
    dirs = libraries.wheel_dirs(args)
    strays = libraries.stray_wheel_problems(mapped, dirs, args.stack, "TensorFlow") if dirs is not None else []
    problems += [found for _path, found in strays]
    problems += tf_loaded_library_problems(
        fit.get("loaded_libraries"), libs, args.expect_cuda, args.expect_cudnn, {path for path, _found in strays}
    )
    problems += libraries.mixed_cuda_major_problems(mapped)
    if any(str(p.get("cause", "")).startswith(OOM_CAUSE) for p in found):
        found = explain_oom(found, gpu_count.busy_gpus(args.nvidia_smi, gpus.get("devices") or []))
    return problems + found


def judge_scaling(scaling: dict[str, Any] | None, cpu_replicas: int) -> list[Problem]:
    """Take the scaling check's problems out of ``scaling`` and return them; on logical CPU
    devices (``cpu_replicas`` > 0) the result is noted as not judged and nothing is returned."""
    if scaling is None or "problems" not in scaling:
        return []
    found = scaling.pop("problems")
    if cpu_replicas > 0:
        # Logical CPU devices share the same cores: the number says nothing about GPU links.
        scaling["note"] = "measured on logical CPU devices that share the same cores; not judged"
        scaling["ok"] = None
        return []
    return found


def cuda_root(args: argparse.Namespace) -> str | None:
    """The stack's CUDA tree: ``--cuda-root``, else ``/usr/local/cuda-<--expect-cuda>``; None for a stack of
    NVIDIA's wheels, which has none."""
    if args.cuda_source == "wheels":
        return None
    return args.cuda_root or libraries.default_cuda_root(args.expect_cuda)


def cuda_section(args: argparse.Namespace) -> dict[str, Any]:
    """The document's ``cuda``: where the stack's CUDA comes from (``source``: ``runfile`` or ``wheels``), its
    tree (``root``, None for wheels) and the wheels' library folders (``library_dirs``, [] for a runfile)."""
    return {"source": args.cuda_source, "root": cuda_root(args), "library_dirs": list(args.library_dir)}


def stack_sections(args: argparse.Namespace) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The ``default`` section (the default stack's pointers, ``--default-symlink``: for a stack of NVIDIA's wheels,
    root None, that no system CUDA is served) and the ``kernel`` section (the stack's Jupyter kernel,
    ``--kernel-dir``), None where not asked for or not expected; each with its ``problems``."""
    root = cuda_root(args)
    default = pointers.check(root, args.default_symlink) if args.default_symlink else None
    jupyter = None
    if args.kernel_dir and (root or args.library_dir) and args.expect_cuda and args.expect_cudnn:
        jupyter = kernel.check(
            args.stack or "", args.kernel_dir, root, args.expect_cuda, args.expect_cudnn, libraries.wheel_dirs(args)
        )
    return default, jupyter


def expected_section(args: argparse.Namespace) -> dict[str, Any]:
    """The document's ``expected``: what the inventory expects of the host (the GPUs, the devices one CUDA
    process enumerates) and the stack's pins."""
    return {
        "gpus": args.expected_gpus,
        "cuda_devices": cuda_devices(args),
        "driver": args.expect_driver,
        "cuda": args.expect_cuda,
        "cudnn": args.expect_cudnn,
        "tensorflow": args.expect_tensorflow,
    }


def verify(args: argparse.Namespace) -> dict[str, Any]:
    """Run every check and assemble the output document."""
    started = time.monotonic()
    problems: list[Problem] = []
    gpus = gpu_count.check_gpus(args.expected_gpus, args.nvidia_smi, lspci=None if args.no_lspci else args.lspci)
    problems += gpus["problems"]
    problems += driver_problems(gpus["driver_version"], args.expect_driver)
    fabric = fabricmanager.check(args.expect_fabricmanager, gpus["driver_version"])
    problems += fabric["problems"]

    libs_doc = libraries.check_libraries(
        args.expect_cuda, args.expect_cudnn, args.cuda_root, library_dirs=libraries.wheel_dirs(args), stack=args.stack
    )
    libs = libs_doc["libraries"]
    problems += libs_doc["problems"]
    lock = venv_lock.check(args.lock)
    problems += lock.pop("problems")

    tf_config = os.environ.get("TF_CONFIG")
    fit, scaling, utilisation = run_fits(args, tf_config)
    tf_info = fit.pop("tensorflow", None) or {
        "version": None,
        "is_cuda_build": None,
        "build_info": {},
        "gpus": None,
        "error": "TensorFlow information unavailable: the fit stopped before reporting it",
    }
    problems += fit_problems(args, fit, tf_info, libs, gpus)
    problems += judge_scaling(scaling, args.cpu_replicas)
    default, jupyter = stack_sections(args)
    problems += [p for section in (default, jupyter) if section for p in section.pop("problems")]

    multiworker = multiworker_summary(fit, tf_config) if args.multiworker else None
    return {
        "schema": SCHEMA,
        "host": socket.gethostname(),
        "stack": args.stack,
        "ok": not problems,
        "mode": "cpu-replicas" if args.cpu_replicas > 0 else "gpu",
        "mode_note": run_note(args, multiworker),
        "multiworker": multiworker,
        "driver_version": gpus["driver_version"],
        "gpus": gpus,
        "fabricmanager": {key: value for key, value in fabric.items() if key != "problems"},
        "cuda": cuda_section(args),
        "libraries": libs,
        "lock": lock,
        "default": default,
        "kernel": jupyter,
        "tensorflow": tf_info,
        "fit": fit,
        "scaling": scaling,
        "utilisation": utilisation,
        "problems": problems,
        "expected": expected_section(args),
        "seconds": round(time.monotonic() - started, 3),
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_table(doc: dict[str, Any]) -> str:
    """Short human summary of a verification document."""
    libs = doc.get("libraries") or {}
    fit = doc.get("fit") or {}
    gpus = doc.get("gpus") or {}
    tf_info = doc.get("tensorflow") or {}
    lines = [
        (
            f"{doc.get('host')}  stack {doc.get('stack') or '-'}  "
            f"{'PASS' if doc.get('ok') else 'FAIL'}  mode {doc.get('mode')}  "
            f"({_fmt(doc.get('seconds'), 1)} s)"
        ),
    ]
    if doc.get("mode_note"):
        lines.append(f"  note: {doc['mode_note']}")
    multiworker = doc.get("multiworker")
    if multiworker:
        lines.append(
            f"  workers     {_fmt(multiworker.get('workers'))}, this is worker {_fmt(multiworker.get('task_index'))}"
            f"{' (chief)' if multiworker.get('is_chief') else ''}: {', '.join(multiworker.get('cluster') or []) or '-'}"
        )
    lines.append(
        f"  GPUs        {gpus.get('seen')}/{gpus.get('expected')} seen/expected"
        f"   driver {doc.get('driver_version') or '-'}"
    )
    for key in ("libcuda", "libcudart", "libcudnn"):
        rec = libs.get(key) or {}
        where = rec.get("path") or rec.get("error") or "-"
        lines.append(f"  {key:<11} {_fmt(rec.get('version')):<8} {where}")
        if rec.get("note"):
            lines.append(f"  {'':<11} note: {rec['note']}")
    lines.append(
        f"  tensorflow  {_fmt(tf_info.get('version')):<8} cuda build {_fmt(tf_info.get('is_cuda_build'))}"
        f"   sees {_fmt(tf_info.get('gpus'))} GPUs"
    )
    lines.append(
        f"  fit         {_fmt(fit.get('num_replicas_in_sync'))} replicas, global batch "
        f"{_fmt(fit.get('global_batch_size'))}, loss {_fmt(fit.get('loss_start'))} -> "
        f"{_fmt(fit.get('loss_end'))}, {_fmt(fit.get('fit_seconds'), 2)} s, "
        f"{_fmt(fit.get('samples_per_second'), 1)} samples/s" + (", TIMED OUT" if fit.get("timed_out") else "")
    )
    if doc.get("lock"):
        lines.append(f"  {venv_lock.format_line(doc['lock'])}")
    problems = doc.get("problems") or []
    if problems:
        lines.append("Problems:")
        for item in problems:
            lines.append(f"  [{item.get('check')}] {item.get('cause')}")
            lines.append(f"      fix: {item.get('fix')}")
    return "\n".join(lines)


def add_expectation_arguments(parser: argparse.ArgumentParser) -> None:
    """Add what the inventory expects of this host: ``--expected-gpus``, the version pins and where the
    stack's CUDA comes from (``--cuda-source``, ``--cuda-root``, ``--library-dir``)."""
    parser.add_argument(
        "--expected-gpus",
        type=non_negative_int,
        required=True,
        help="GPUs the inventory expects on this host",
    )
    parser.add_argument(
        "--expected-cuda-devices",
        type=non_negative_int,
        metavar="N",
        help="devices one CUDA process (TensorFlow, the fit) enumerates, when not every GPU: on a host with GPUs "
        "in MIG mode the GPUs without MIG plus one MIG device (NVIDIA Multi-Instance GPU User Guide, CUDA Device "
        "Enumeration); default --expected-gpus",
    )
    parser.add_argument("--expect-driver", metavar="VER", help="pinned driver version, e.g. 520.61.05")
    parser.add_argument("--expect-cuda", metavar="X.Y", help="pinned CUDA version, e.g. 11.8")
    parser.add_argument("--expect-cudnn", metavar="X.Y.Z", help="pinned cuDNN version, e.g. 8.6.0")
    parser.add_argument("--expect-tensorflow", metavar="X.Y.Z", help="pinned TensorFlow version")
    parser.add_argument(
        "--expect-fabricmanager",
        action="store_true",
        help="the host has NVSwitches: NVIDIA's fabric manager must run at the driver's version",
    )
    libraries.add_source_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Verify this host's GPUs, driver, CUDA runtime, cuDNN and TensorFlow, and run "
        "a MirroredStrategy smoke fit; print one JSON document (or a table).",
        epilog="Exit codes: 0 all checks passed, 1 a check failed, 2 usage error.",
    )
    add_expectation_arguments(parser)
    parser.add_argument(
        "--cpu-replicas",
        type=non_negative_int,
        default=0,
        help="0 = fit on the GPUs (default); N = fit on N logical CPU devices",
    )
    parser.add_argument(
        "--multiworker",
        action="store_true",
        help="fit with MultiWorkerMirroredStrategy over the workers in the TF_CONFIG environment "
        "variable (run this on every worker at the same time); --scaling is skipped",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        help="seconds the fit may take before its process group is killed (default 600)",
    )
    gpu_count.add_tool_arguments(parser)
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="also fit on 1 replica and report speedup and efficiency (speedup / replicas)",
    )
    parser.add_argument(
        "--scaling-threshold",
        type=positive_float,
        default=0.75,
        help="lowest acceptable scaling efficiency, a fraction (default 0.75)",
    )
    parser.add_argument("--mixed-precision", action="store_true", help="fit with the mixed_float16 policy")
    add_stack_arguments(parser)
    parser.add_argument("--output", metavar="PATH", help="also write the JSON document to PATH")
    parser.add_argument("--format", choices=("json", "table"), default="json", help="stdout format (default json)")
    add_fit_arguments(parser, help_prefix="fit: ")
    parser.add_argument(
        "--fit-script",
        default=os.path.join(HERE, "fit.py"),
        help="fit script to run (default: fit.py next to this file; tests swap it)",
    )
    return parser


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """Add what names this stack and its own checks: ``--stack``, ``--default-symlink``,
    ``--kernel-dir`` and ``--lock``."""
    parser.add_argument("--stack", help="label for this TensorFlow stack, e.g. tf2.12")
    parser.add_argument(
        "--default-symlink",
        metavar="PATH",
        help="this is the host's default stack: check that PATH (/usr/local/cuda) and a login shell's CUDA_HOME "
        "and nvcc point at its toolkit",
    )
    parser.add_argument(
        "--kernel-dir",
        metavar="DIR",
        help="Jupyter's kernel specs folder: where this venv holds ipykernel, start its kernel tf-stack-<--stack> "
        "from there and run one cell with the stack's libraries (kernel.py)",
    )
    parser.add_argument(
        "--lock",
        default=venv_lock.DEFAULT_LOCK,
        help=f"the venv's dependency lock, compared with its distributions (default {venv_lock.DEFAULT_LOCK})",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    libraries.check_pin_arguments(parser, args)
    doc = verify(args)
    if args.output:
        write_json_atomic(args.output, doc)
    print(format_table(doc) if args.format == "table" else dumps(doc))
    return EXIT_OK if doc["ok"] else EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
