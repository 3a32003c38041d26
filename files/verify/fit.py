"""MirroredStrategy smoke fit: a tiny conv net on random but learnable images.

Proves, on one host, that TensorFlow can place a replica on every GPU, run a convolution (so cuDNN
is used on GPUs), all-reduce gradients between replicas and make the loss fall.

* ``--cpu-replicas 0`` (default): one replica per visible GPU; memory growth is switched on for
  every GPU before any op so the fit does not grab all GPU memory.
* ``--cpu-replicas N``: the CPU is split into N logical devices with
  ``tf.config.set_logical_device_configuration`` before any op (its API docs,
  https://www.tensorflow.org/api_docs/python/tf/config/set_logical_device_configuration: after the
  runtime is initialised it raises ``RuntimeError: Virtual devices cannot be modified after being
  initialized``), and the devices are passed explicitly (``/cpu:0`` ...), because
  MirroredStrategy without ``devices`` takes every GPU and falls back to the CPU only when there is
  none (``tf.distribute.MirroredStrategy`` API docs,
  https://www.tensorflow.org/api_docs/python/tf/distribute/MirroredStrategy; TensorFlow guide
  "Distributed training with TensorFlow", https://www.tensorflow.org/guide/distributed_training).

* ``--multiworker``: ``tf.distribute.MultiWorkerMirroredStrategy()`` over the cluster in the
  ``TF_CONFIG`` environment variable (TensorFlow's format: ``{"cluster": {"worker": ["host:port",
  ...]}, "task": {"type": "worker", "index": i}}``; worker 0 is the chief).  TF_CONFIG is checked
  before TensorFlow is imported; the strategy is created before any other TensorFlow op
  (TensorFlow's multi-worker guide requires it), after memory growth is set.  Each worker
  contributes its local GPUs, or one CPU replica when it has no GPU or ``--cpu-replicas`` is > 0
  (which then only means "fit on the CPU": no logical CPU devices are made).  The creation of the
  strategy waits until every worker has joined, so every worker must run the same command at the
  same time.  Every worker builds the same seeded data; ``AutoShardPolicy.DATA`` gives each worker
  its share of every global batch.  ``num_replicas_in_sync`` counts the replicas of the whole
  cluster, and throughput is the cluster's.

Data: images whose pixels are noise plus a per-image colour; the label is the dominant colour
channel, so the model can learn it and the loss really falls.  ``loss_start``/``loss_end`` are
``model.evaluate`` on the same data before and after training; ``loss_history`` is the training
loss per epoch.

The JSON result goes to stdout; TensorFlow's own output is sent to stderr (file descriptor 1 is
pointed at 2 while TensorFlow runs).  Units: seconds for times, samples/s for throughput.

Exit codes: 0 all checks passed, 1 a check failed or the fit raised, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from verify_common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    Problem,
    dumps,
    non_negative_int,
    positive_float,
    positive_int,
    problem,
)

DEFAULT_LEARNING_RATE = 0.01
# Start of classify_exception's cause for an out-of-memory fit; gpu_verify.py adds the GPU holders.
OOM_CAUSE = "Out of GPU memory"
NCCL_HANG_FIX = (
    "check the GPU interconnect with `nvidia-smi topo -m` and `nvidia-smi topo -p2p r`; on PCIe "
    "hosts disable IOMMU/ACS (BIOS or `iommu=pt`), or rerun with NCCL_P2P_DISABLE=1 to confirm a "
    "P2P problem; check `dmesg | grep -i xid`"
)
MULTIWORKER_FIX = (
    "start the same check on every worker at the same time (each waits for all the others), open "
    "the port gpu_verify_multiworker_port between the hosts (firewall), and check the worker "
    "addresses in TF_CONFIG (the same `host:port` list, in the same order, on every worker); a "
    "worker that failed or was killed stops the others, so read every worker's result"
)
TF_CONFIG_EXAMPLE = '{"cluster": {"worker": ["gpu01:12345", "gpu02:12345"]}, "task": {"type": "worker", "index": 0}}'
TF_CONFIG_FIX = (
    "set TF_CONFIG on every worker to the same worker list and that worker's own index, e.g. "
    f"TF_CONFIG='{TF_CONFIG_EXAMPLE}' on the first worker (index 0, the chief)"
)


# --- pure logic ---------------------------------------------------------------------------


class TFConfigError(ValueError):
    """TF_CONFIG cannot drive a multi-worker fit; ``cause`` and ``fix`` are one sentence each."""

    def __init__(self, cause: str, fix: str = TF_CONFIG_FIX) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


def _check_address(address: Any, position: int) -> str:
    """One ``host:port`` entry of the worker list; raises TFConfigError when it is not one."""
    if not isinstance(address, str) or ":" not in address or not address.rsplit(":", 1)[0]:
        raise TFConfigError(f"TF_CONFIG worker {position} is {address!r}, not a 'host:port' address.")
    port = address.rsplit(":", 1)[1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise TFConfigError(f"TF_CONFIG worker {position} is {address!r}: the port must be a number from 1 to 65535.")
    return address


def parse_tf_config(text: str | None) -> dict[str, Any]:
    """Validate the TF_CONFIG environment variable for a multi-worker fit (no TensorFlow needed).

    Args:
        text: the variable's value (None when it is not set).

    Returns:
        ``{"workers": int, "task_index": int, "is_chief": bool, "cluster": [str, ...]}``; the chief
        is worker 0 (TensorFlow's rule when the cluster has no ``chief`` job).

    Raises:
        TFConfigError: not set, not JSON, not an object, no ``cluster.worker`` list of distinct
            ``host:port`` addresses, another job type than ``worker``, or a task that is not
            ``{"type": "worker", "index": i}`` with ``0 <= i < workers``.
    """
    if text is None or not text.strip():
        raise TFConfigError("--multiworker needs the TF_CONFIG environment variable, and it is not set.")
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise TFConfigError(f"TF_CONFIG is not valid JSON ({exc}).") from None
    if not isinstance(config, dict):
        raise TFConfigError(f"TF_CONFIG is a JSON {type(config).__name__}, not an object.")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster.get("worker"):
        raise TFConfigError("TF_CONFIG has no cluster.worker list of 'host:port' addresses.")
    others = sorted(str(job) for job in cluster if job != "worker")
    if others:
        raise TFConfigError(
            f"TF_CONFIG's cluster has job types {', '.join(others)}; this check uses only 'worker'.",
            "list every host under cluster.worker (worker 0 acts as the chief) and drop the other jobs",
        )
    workers = cluster["worker"]
    if not isinstance(workers, list):
        raise TFConfigError(
            f"TF_CONFIG cluster.worker is a {type(workers).__name__}, not a list of 'host:port' addresses."
        )
    addresses = [_check_address(address, position) for position, address in enumerate(workers)]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise TFConfigError(f"TF_CONFIG lists {', '.join(repeated)} more than once in cluster.worker.")
    task = config.get("task")
    if not isinstance(task, dict):
        raise TFConfigError("TF_CONFIG has no task object naming this worker.")
    if task.get("type") != "worker":
        raise TFConfigError(f"TF_CONFIG task type is {task.get('type')!r}; this check needs 'worker'.")
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        raise TFConfigError(f"TF_CONFIG task index is {index!r}, not an integer.")
    if not 0 <= index < len(addresses):
        raise TFConfigError(
            f"TF_CONFIG task index {index} is out of range: cluster.worker has {len(addresses)} "
            f"addresses (valid indexes 0 to {len(addresses) - 1})."
        )
    return {"workers": len(addresses), "task_index": index, "is_chief": index == 0, "cluster": addresses}


def plan_batches(per_replica: int, replicas: int) -> int:
    """Global batch size (samples per step) = per-replica batch x replicas.

    Raises:
        ValueError: a non-positive size, or a global batch not divisible by the replicas.
    """
    if per_replica < 1:
        raise ValueError(f"per-replica batch must be >= 1, got {per_replica}")
    if replicas < 1:
        raise ValueError(f"MirroredStrategy has {replicas} replicas; it needs at least 1 device")
    global_batch = per_replica * replicas
    if global_batch % replicas:
        raise ValueError(f"global batch {global_batch} is not divisible by {replicas} replicas")
    return global_batch


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def nonfinite_fix(learning_rate: Any, mixed_precision: bool) -> str:
    """Fix for a non-finite loss: the fit's own settings first when they explain it (a learning
    rate above the default, float16), else the hardware."""
    hardware = (
        "check `dmesg | grep -i xid` for GPU memory errors and run `nvidia-smi -q -d ECC`; a "
        "cuDNN/driver mismatch can also do this"
    )
    if isinstance(learning_rate, (int, float)) and learning_rate > DEFAULT_LEARNING_RATE:
        return (
            f"the learning rate {learning_rate:g} is above the default {DEFAULT_LEARNING_RATE} "
            "(gpu_verify_fit_learning_rate), so the weights overflowed: rerun with the default; if the "
            "loss is still not finite, " + hardware
        )
    if mixed_precision:
        return (
            "float16 overflowed under mixed_float16: rerun without gpu_verify_mixed_precision; if it persists, "
            + hardware
        )
    return "the device computes garbage: " + hardware


def check_fit(result: dict[str, Any], expected_replicas: int) -> list[Problem]:
    """Checks on a finished fit: replica count, finite losses, falling loss.

    Args:
        result: the fit document (``num_replicas_in_sync``, ``loss_*``, ``mode``, ``multiworker``).
        expected_replicas: replicas the fit must have (in multi-worker mode: of the whole cluster).

    Returns:
        Problems with check ``fit``; empty when the fit passed.
    """
    problems: list[Problem] = []
    replicas = result.get("num_replicas_in_sync")
    if replicas != expected_replicas:
        if result.get("multiworker"):
            fix = (
                "every worker must fit on the same devices: check that each worker sees all its GPUs "
                "(CUDA_VISIBLE_DEVICES, the library problems above), and pass workers x GPUs per "
                "worker (workers x 1 on the CPU) to --expected-replicas"
            )
        elif result.get("mode") == "gpu":
            fix = (
                "TensorFlow sees fewer GPUs than expected: check CUDA_VISIBLE_DEVICES, that the "
                "venv holds a CUDA build of TensorFlow, and the library problems above (a missing "
                "libcudnn/libcudart hides every GPU)"
            )
        else:
            fix = "pass the same number to --cpu-replicas and --expected-replicas"
        problems.append(
            problem(
                "fit",
                f"MirroredStrategy ran {replicas} replicas, expected {expected_replicas} "
                f"(devices: {', '.join(result.get('devices') or []) or 'none'}).",
                fix,
            )
        )
    losses = [result.get("loss_start"), result.get("loss_end")] + list(result.get("loss_history") or [])
    if not all(_finite(v) for v in losses):
        problems.append(
            problem(
                "fit",
                f"Loss is not finite (start {result.get('loss_start')}, end {result.get('loss_end')}, "
                f"per epoch {result.get('loss_history')}; learning rate {result.get('learning_rate')}"
                f"{', mixed_float16' if result.get('mixed_precision') else ''}).",
                nonfinite_fix(result.get("learning_rate"), bool(result.get("mixed_precision"))),
            )
        )
    elif not result["loss_end"] < result["loss_start"]:
        problems.append(
            problem(
                "fit",
                f"Loss did not fall: {result['loss_start']:.4f} before training, "
                f"{result['loss_end']:.4f} after {result.get('epochs')} epochs.",
                "gradients are not reaching the weights (a broken all-reduce between replicas) or "
                "the device computes wrong results: rerun, then check " + NCCL_HANG_FIX,
            )
        )
    return problems


# Lower-case texts of gRPC and collective failures between workers (TensorFlow 2.x messages).
MULTIWORKER_MARKERS = (
    "failed to connect to all addresses",
    "socket closed",
    "connection refused",
    "connection reset",
    "deadline exceeded",
    "collective ops is aborted",
    "collective has timed out",
    "timed out waiting for",
    "coordination service",
    "heartbeat",
)


REMOTE_TASK_RE = re.compile(r"remote target (/job:\w+/replica:\d+/task:(\d+))")


def multiworker_detail(message: str, first: str) -> str:
    """The informative part of a gRPC/collective error for the cause (300 characters at most):
    the line that says what was aborted (e.g. "Collective ops is aborted by: failed to connect to
    all addresses", deep inside Keras' "Graph execution error" text), and the remote task it came
    from when TensorFlow names one ("from worker task 1")."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    telling = [line for line in lines if any(marker in line.lower() for marker in MULTIWORKER_MARKERS)]
    # TensorFlow prefixes the op's name ("{{function_node __wrapped__CollectiveReduceV2...}}").
    detail = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", telling[0] if telling else (lines[0] if lines else ""))
    remote = REMOTE_TASK_RE.search(message)
    if remote:
        detail += f"; gRPC error from worker task {remote.group(2)} ({remote.group(1)})"
    return detail[:300] or first


class ErrorRule(NamedTuple):
    """One row of :data:`ERROR_RULES`: an exception matches when its class name is one of
    ``type_names``, its lower-cased message contains one of ``markers``, or its message contains one
    of ``exact`` as written (gRPC status codes).  ``cause`` is a :meth:`str.format` template over
    ``type_name``, ``first`` (the message's first line) and ``detail`` (:func:`multiworker_detail`)."""

    markers: tuple[str, ...]
    cause: str
    fix: str
    type_names: tuple[str, ...] = ()
    exact: tuple[str, ...] = ()


# classify_exception's table, first match wins: out of memory before the cuDNN texts (an OOM at
# cuDNN init names cuDNN), the multi-worker texts before NCCL.
ERROR_RULES = (
    ErrorRule(
        ("out of memory", "oom when allocating"),
        OOM_CAUSE + " during the fit ({type_name}: {first}).",
        "free the GPUs (`nvidia-smi` lists other processes) or lower --per-replica-batch / --image-size",
        type_names=("ResourceExhaustedError",),
    ),
    ErrorRule(
        ("loaded runtime cudnn library",),
        "TensorFlow refused the loaded cuDNN ({first}).",
        "put the cuDNN version TensorFlow was built with first on the loader path "
        "(same major, equal or higher minor), then run `ldconfig`",
    ),
    ErrorRule(
        ("dnn library is not found", "cudnn"),
        "cuDNN failed during the convolution ({type_name}: {first}).",
        "check the libcudnn result above: the cuDNN TensorFlow needs is missing, "
        "the wrong version, or out of GPU memory at init",
    ),
    ErrorRule(
        ("driver version is insufficient", "cuda_error_insufficient_driver"),
        "The NVIDIA driver is too old for TensorFlow's CUDA runtime ({first}).",
        "upgrade the driver (nvidia_driver role) to the branch the stack's CUDA needs",
    ),
    ErrorRule(
        ("no kernel image is available", "no_binary_for_gpu"),
        "This TensorFlow wheel has no kernels for the GPU's compute capability ({first}).",
        "pick a TensorFlow version whose wheel supports this GPU (see the version matrix)",
    ),
    ErrorRule(
        ("could not start grpc server",),
        "This worker could not listen on its own TF_CONFIG address ({type_name}: {first}): the port is "
        "in use or the address is not one of this host's.",
        "free the port (`ss -ltnp` shows who holds it) or choose another "
        "gpu_verify_multiworker_port, and check that this worker's task index points at this "
        "host's address in TF_CONFIG",
    ),
    ErrorRule(
        MULTIWORKER_MARKERS,
        "A worker of the multi-worker cluster could not be reached or stopped answering ({type_name}: {detail}).",
        MULTIWORKER_FIX,
        type_names=("UnavailableError", "DeadlineExceededError"),
        exact=("UNAVAILABLE", "DEADLINE_EXCEEDED"),
    ),
    ErrorRule(("nccl",), "NCCL failed during the all-reduce ({type_name}: {first}).", NCCL_HANG_FIX),
    ErrorRule(
        ("virtual devices cannot be modified",),
        "TensorFlow was initialised before the logical CPU devices were set ({first}).",
        "this is a bug in fit.py: logical devices must be configured before any op",
    ),
)


def classify_exception(type_name: str, message: str) -> tuple[str, str]:
    """Likely (cause, fix) for an exception raised by the fit: the first row of
    :data:`ERROR_RULES` that matches TensorFlow's error text.

    Args:
        type_name: the exception's class name, e.g. ``ResourceExhaustedError``.
        message: ``str(exception)``; only its first line is quoted in the cause (300 characters).

    Returns:
        ``(cause, fix)``, one sentence each; a generic pair pointing at the traceback when no
        known text matches.
    """
    text = message.lower()
    first = message.strip().splitlines()[0][:300] if message.strip() else type_name
    for rule in ERROR_RULES:
        if (
            type_name in rule.type_names
            or any(marker in text for marker in rule.markers)
            or any(code in message for code in rule.exact)
        ):
            detail = multiworker_detail(message, first) if "{detail}" in rule.cause else first
            return rule.cause.format(type_name=type_name, first=first, detail=detail), rule.fix
    return (
        f"The fit raised {type_name}: {first}",
        "read the traceback in the fit's stderr",
    )


# --- I/O ------------------------------------------------------------------------------------


class Progress:
    """Appends JSON lines to a progress file so a parent that kills a hung fit still learns how
    far it got (and TensorFlow's build info)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.start = time.monotonic()

    def write(self, stage: str, **extra: Any) -> None:
        """Record that ``stage`` was reached (elapsed seconds in ``t``)."""
        if not self.path:
            return
        record = {"stage": stage, "t": round(time.monotonic() - self.start, 3)}
        record.update(extra)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")


def make_dataset(tf: Any, np: Any, samples: int, image_size: int, global_batch: int, seed: int) -> tuple[Any, Any]:
    """Random images with learnable labels: noise plus a per-image colour; label = brightest
    channel.  Returns (dataset batched by the global batch with drop_remainder, None)."""
    rng = np.random.default_rng(seed)
    colours = rng.uniform(0.0, 1.0, size=(samples, 1, 1, 3)).astype("float32")
    noise = rng.uniform(0.0, 1.0, size=(samples, image_size, image_size, 3)).astype("float32")
    images = 0.5 * noise + colours
    labels = np.argmax(colours[:, 0, 0, :], axis=1).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    return dataset.batch(global_batch, drop_remainder=True), labels


def run_fit(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Configure devices, build the strategy and model, evaluate/fit/evaluate; returns the result
    document (``problems`` filled).  Exceptions from TensorFlow are caught and classified; a bad
    TF_CONFIG in ``--multiworker`` mode is a ``multiworker`` problem, reported before TensorFlow is
    imported.  ``multiworker`` in the document is None in single-host mode, else
    ``{"workers", "task_index", "is_chief", "cluster"}``."""
    result = _new_result(args)
    multiworker: dict[str, Any] | None = None
    if args.multiworker:
        try:
            multiworker = parse_tf_config(os.environ.get("TF_CONFIG"))
        except TFConfigError as exc:
            result["error"] = exc.cause
            result["problems"].append(problem("multiworker", exc.cause, exc.fix))
            progress.write("error", error=exc.cause)
            return result
        result["multiworker"] = multiworker
    modules = _import_tensorflow(result, progress)
    if modules is None:
        return result
    try:
        expected = _fit_steps(*modules, args, multiworker, result, progress)
    except Exception as exc:
        name = type(exc).__name__
        result["error"] = f"{name}: {exc}"
        cause, fix = classify_exception(name, str(exc))
        result["problems"].append(problem("fit", cause, fix))
        progress.write("error", error=result["error"])
        return result
    result["problems"] += check_fit(result, expected)
    result["ok"] = not result["problems"]
    progress.write("done", ok=result["ok"])
    return result


def _new_result(args: argparse.Namespace) -> dict[str, Any]:
    """The result document before anything ran: the settings, None for every measurement."""
    return {
        "ok": False,
        "mode": "cpu-replicas" if args.cpu_replicas > 0 else "gpu",
        "multiworker": None,
        "num_replicas_in_sync": None,
        "expected_replicas": None,
        "devices": [],
        "global_batch_size": None,
        "per_replica_batch_size": args.per_replica_batch,
        "epochs": args.epochs,
        "steps_per_epoch": args.steps,
        "image_size": args.image_size,
        "seed": args.seed,
        "learning_rate": args.learning_rate,
        "loss_start": None,
        "loss_end": None,
        "loss_history": [],
        "epoch_seconds": [],
        "fit_seconds": None,
        "samples_per_second": None,
        "steady_samples_per_second": None,
        "tensorflow_version": None,
        "keras_version": None,
        "tensorflow": None,
        "physical_gpus": None,
        "loaded_libraries": None,
        "error": None,
        "problems": [],
    }


def _import_tensorflow(result: dict[str, Any], progress: Progress) -> tuple[Any, Any, Any] | None:
    """Import TensorFlow, numpy and ``libraries``; returns ``(tf, np, libraries)``, or None after
    recording a ``tensorflow`` problem in ``result`` when the import fails."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    progress.write("import")
    try:
        import numpy as np
        import tensorflow as tf
    except Exception as exc:
        result["error"] = f"import tensorflow failed: {type(exc).__name__}: {exc}"
        result["problems"].append(
            problem(
                "tensorflow",
                f"{result['error']} (interpreter {sys.executable}).",
                "run fit.py with the venv's python; if it is that venv's, its files are damaged (pip still counts"
                f" it as holding its lock): remove {sys.prefix} and run playbooks/tensorflow.yml, which rebuilds it",
            )
        )
        return None
    import libraries

    result["tensorflow_version"] = tf.__version__
    result["keras_version"] = getattr(tf.keras, "__version__", None)
    return tf, np, libraries


def _fit_steps(
    tf: Any,
    np: Any,
    libraries: Any,
    args: argparse.Namespace,
    multiworker: dict[str, Any] | None,
    result: dict[str, Any],
    progress: Progress,
) -> int:
    """Strategy, data, model, fit, in that order, filling ``result``; returns the replicas the fit
    must have.  TensorFlow's exceptions propagate to :func:`run_fit`."""
    tf_info = libraries.tensorflow_build_info()
    result["tensorflow"] = tf_info
    result["physical_gpus"] = tf_info["gpus"]
    progress.write("tensorflow", tensorflow=tf_info)
    strategy, expected = _setup_strategy(tf, args, tf_info, multiworker, result, progress)
    replicas = int(strategy.num_replicas_in_sync)
    result["num_replicas_in_sync"] = replicas
    result["devices"] = [str(d) for d in strategy.extended.worker_devices]
    global_batch = plan_batches(args.per_replica_batch, replicas)
    result["global_batch_size"] = global_batch
    progress.write("strategy", replicas=replicas, devices=result["devices"])

    if args.mixed_precision:
        # TensorFlow's mixed-precision guide (https://www.tensorflow.org/guide/mixed_precision):
        # float16 compute, float32 variables; the output layer stays float32 for a numerically
        # stable loss.
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    result["mixed_precision"] = bool(args.mixed_precision)
    tf.keras.utils.set_random_seed(args.seed)
    samples = global_batch * args.steps
    dataset = _fit_dataset(tf, np, args, samples, global_batch, multiworker is not None)
    model = _build_model(tf, args, strategy)
    _fit_and_time(tf, model, dataset, samples, args, result, progress)
    result["loaded_libraries"] = libraries.mapped_library_versions()
    return expected


def _setup_strategy(
    tf: Any,
    args: argparse.Namespace,
    tf_info: dict[str, Any],
    multiworker: dict[str, Any] | None,
    result: dict[str, Any],
    progress: Progress,
) -> tuple[Any, int]:
    """Set memory growth on every GPU, then create the strategy before any other op; records the
    mode and the expected replicas in ``result``.  Returns ``(strategy, expected replicas)``.

    Raises:
        RuntimeError: single-host GPU mode and TensorFlow sees no GPU.
    """
    mode = result["mode"]
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if multiworker is not None:
        strategy, mode = _multiworker_strategy(tf, gpus, mode, multiworker, progress)
        result["mode"] = mode
    elif mode == "cpu-replicas":
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0],
            [tf.config.LogicalDeviceConfiguration() for _replica in range(args.cpu_replicas)],
        )
        used = min(args.use_replicas or args.cpu_replicas, args.cpu_replicas)
        strategy = tf.distribute.MirroredStrategy(devices=[f"/cpu:{i}" for i in range(used)])
    else:
        if not gpus:
            raise RuntimeError(
                "TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty); "
                f"build is_cuda_build={tf_info.get('is_cuda_build')}"
            )
        used = min(args.use_replicas or len(gpus), len(gpus))
        strategy = tf.distribute.MirroredStrategy(devices=[f"/gpu:{i}" for i in range(used)])
    expected = expected_replicas(args, multiworker, mode, len(gpus))
    result["expected_replicas"] = expected
    return strategy, expected


def expected_replicas(args: argparse.Namespace, multiworker: dict[str, Any] | None, mode: str, gpus: int) -> int:
    """Replicas the fit must have: ``--expected-replicas``, else ``--cpu-replicas`` on one host,
    workers x GPUs per worker (x 1 on the CPU) with ``--multiworker``, else every GPU; never more
    than ``--use-replicas``.  ``mode`` is the mode the strategy really runs in."""
    expected = args.expected_replicas
    if expected is None:
        if multiworker is not None:
            expected = multiworker["workers"] * (gpus if mode == "gpu" else 1)
        elif args.cpu_replicas > 0:
            expected = args.cpu_replicas
        else:
            expected = gpus
    if args.use_replicas:
        expected = min(expected, args.use_replicas)
    return expected


def _fit_dataset(tf: Any, np: Any, args: argparse.Namespace, samples: int, global_batch: int, sharded: bool) -> Any:
    """The seeded dataset of ``samples`` images in global batches; ``sharded`` (multi-worker) sets
    the DATA auto-shard policy."""
    dataset, _labels = make_dataset(tf, np, samples, args.image_size, global_batch, args.seed)
    if sharded:
        # Every worker builds the same in-memory data, so there are no files to shard by: DATA
        # gives each worker its share of every global batch (and no FILE-sharding warning).
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        dataset = dataset.with_options(options)
    return dataset


def _build_model(tf: Any, args: argparse.Namespace, strategy: Any) -> Any:
    """The conv net, built and compiled in the strategy's scope (its variables are mirrored)."""
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(args.image_size, args.image_size, 3)),
                tf.keras.layers.Conv2D(16, 3, activation="relu"),
                tf.keras.layers.GlobalAveragePooling2D(),
                tf.keras.layers.Dense(10, dtype="float32"),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(learning_rate=args.learning_rate),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _fit_and_time(
    tf: Any,
    model: Any,
    dataset: Any,
    samples: int,
    args: argparse.Namespace,
    result: dict[str, Any],
    progress: Progress,
) -> None:
    """Evaluate, fit and evaluate again; records the losses, times and throughputs in ``result``."""
    epoch_seconds: list[float] = []

    class EpochTimer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._t = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            epoch_seconds.append(time.perf_counter() - self._t)
            progress.write("epoch", epoch=epoch + 1, loss=(logs or {}).get("loss"))

    progress.write("evaluate-before")
    result["loss_start"] = _scalar_loss(model.evaluate(dataset, verbose=0))
    progress.write("fit")
    started = time.perf_counter()
    history = model.fit(dataset, epochs=args.epochs, verbose=0, callbacks=[EpochTimer()])
    fit_seconds = time.perf_counter() - started
    progress.write("evaluate-after")
    result["loss_end"] = _scalar_loss(model.evaluate(dataset, verbose=0))
    result["loss_history"] = [float(v) for v in history.history.get("loss", [])]
    result["epoch_seconds"] = [round(s, 4) for s in epoch_seconds]
    result["fit_seconds"] = round(fit_seconds, 4)
    result["samples_per_second"] = round(samples * args.epochs / fit_seconds, 1)
    if len(epoch_seconds) > 1:
        # The first epoch includes tracing/compilation; later ones show steady throughput.
        result["steady_samples_per_second"] = round(samples * (len(epoch_seconds) - 1) / sum(epoch_seconds[1:]), 1)


def _multiworker_strategy(
    tf: Any, gpus: list[Any], mode: str, multiworker: dict[str, Any], progress: Progress
) -> tuple[Any, str]:
    """Create ``MultiWorkerMirroredStrategy`` from TF_CONFIG; must run before any other op.

    Returns ``(strategy, mode)``: mode ``gpu`` when the worker fits on its local GPUs,
    ``cpu-replicas`` when it fits on its CPU (one replica) because it has no GPU or ``mode`` asked
    for the CPU.  Blocks until every worker in TF_CONFIG has joined (the caller's time limit
    ends a wait for a worker that never comes).

    Raises:
        tf.errors.OpError: the cluster could not be formed (e.g. an address that cannot be bound).
    """
    if mode == "cpu-replicas" and gpus:
        # MultiWorkerMirroredStrategy takes every visible GPU; hidden GPUs leave the CPU.
        tf.config.set_visible_devices([], "GPU")
    if not gpus:
        mode = "cpu-replicas"
    progress.write(
        "multiworker-join",
        workers=multiworker["workers"],
        task_index=multiworker["task_index"],
        cluster=multiworker["cluster"],
    )
    return tf.distribute.MultiWorkerMirroredStrategy(), mode


def _scalar_loss(value: Any) -> float:
    """``model.evaluate`` returns a float without metrics, a list with them (Keras 2 and 3)."""
    if isinstance(value, (list, tuple)):
        value = value[0]
    return float(value)


def add_fit_arguments(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    """Add the fit's size and training options, ``--per-replica-batch``, ``--steps``, ``--epochs``,
    ``--learning-rate`` and ``--seed``, with their defaults (shared with gpu_verify.py, which
    passes them on to fit.py and puts ``help_prefix`` "fit: " before each help text)."""
    for option, default, text in (
        ("--per-replica-batch", 16, "samples per replica per step"),
        ("--steps", 8, "steps per epoch"),
        ("--epochs", 3, "epochs"),
    ):
        parser.add_argument(option, type=positive_int, default=default, help=f"{help_prefix}{text} (default {default})")
    parser.add_argument(
        "--learning-rate",
        type=positive_float,
        default=DEFAULT_LEARNING_RATE,
        help=f"{help_prefix}Adam learning rate, a finite number > 0 (default {DEFAULT_LEARNING_RATE}; a huge "
        "value such as 1e30 makes the loss non-finite)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1234,
        help=f"{help_prefix}random seed for data and weights (default 1234)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Run a short MirroredStrategy fit (conv net, random learnable data) on all "
        "GPUs or on N logical CPU devices, or a MultiWorkerMirroredStrategy fit over the workers "
        "in TF_CONFIG (--multiworker); print the result as JSON.",
        epilog="Exit codes: 0 all checks passed, 1 a check failed or the fit raised, 2 usage error.",
    )
    parser.add_argument(
        "--cpu-replicas",
        type=non_negative_int,
        default=0,
        help="0 = one replica per GPU (default); N = split the CPU into N logical devices; with "
        "--multiworker any N > 0 means fit on the CPU, one replica per worker",
    )
    parser.add_argument(
        "--multiworker",
        action="store_true",
        help="fit with MultiWorkerMirroredStrategy over the workers in the TF_CONFIG environment "
        "variable; run the same command on every worker at the same time",
    )
    parser.add_argument(
        "--use-replicas",
        type=positive_int,
        default=None,
        help="use only the first N devices (the 1-replica baseline of the scaling check); default all",
    )
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="train with the mixed_float16 policy (float16 compute, float32 variables)",
    )
    parser.add_argument(
        "--expected-replicas",
        type=positive_int,
        default=None,
        help="replicas the fit must have (default: --cpu-replicas, or the GPUs TensorFlow sees; "
        "with --multiworker: workers x GPUs per worker, or workers on the CPU)",
    )
    add_fit_arguments(parser)
    parser.add_argument(
        "--image-size", type=positive_int, default=32, help="image height and width in pixels (default 32)"
    )
    parser.add_argument("--progress", metavar="PATH", help="append JSON-lines progress records to PATH")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code.  Keeps stdout for the JSON document only."""
    args = build_parser().parse_args(argv)
    if args.image_size < 3:
        build_parser().error("--image-size must be >= 3 (the convolution is 3x3)")
    if args.multiworker and args.use_replicas:
        build_parser().error("--use-replicas does not apply with --multiworker (every worker uses all its devices)")
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run_fit(args, Progress(args.progress))
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
    print(dumps(result))
    sys.stdout.flush()
    return EXIT_OK if result["ok"] else EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
