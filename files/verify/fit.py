#!/usr/bin/env python3
"""MirroredStrategy smoke fit: a tiny conv net on random but learnable images.

Proves, on one host, that TensorFlow can place a replica on every GPU, run a convolution (so cuDNN
is used on GPUs), all-reduce gradients between replicas and make the loss fall.

* ``--cpu-replicas 0`` (default): one replica per visible GPU; memory growth is switched on for
  every GPU before any op so the fit does not grab all GPU memory.
* ``--cpu-replicas N``: the CPU is split into N logical devices with
  ``tf.config.set_logical_device_configuration`` before any op (reference
  ``nvidia-tensorflow-facts.md`` section 8.2: changing it later raises ``RuntimeError: Virtual
  devices cannot be modified after being initialized``), and the devices are passed explicitly
  (``/cpu:0`` ...), because MirroredStrategy prefers GPUs when any exist (section 8.2, item 2).

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
import sys
import time
from collections.abc import Sequence
from typing import Any

from verify_common import EXIT_CHECK_FAILED, EXIT_OK, Problem, dumps, non_negative_int, positive_int, problem

NCCL_HANG_FIX = (
    "check the GPU interconnect with `nvidia-smi topo -m` and `nvidia-smi topo -p2p r`; on PCIe "
    "hosts disable IOMMU/ACS (BIOS or `iommu=pt`), or rerun with NCCL_P2P_DISABLE=1 to confirm a "
    "P2P problem; check `dmesg | grep -i xid`"
)


# --- pure logic ---------------------------------------------------------------------------


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


def check_fit(result: dict[str, Any], expected_replicas: int) -> list[Problem]:
    """Checks on a finished fit: replica count, finite losses, falling loss."""
    problems: list[Problem] = []
    replicas = result.get("num_replicas_in_sync")
    if replicas != expected_replicas:
        if result.get("mode") == "gpu":
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
                f"per epoch {result.get('loss_history')}).",
                "the device computes garbage: check `dmesg | grep -i xid` for GPU memory errors and "
                "run `nvidia-smi -q -d ECC`; a cuDNN/driver mismatch can also do this",
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


def classify_exception(type_name: str, message: str) -> tuple[str, str]:
    """Likely (cause, fix) for an exception raised by the fit, from TensorFlow's error texts."""
    text = message.lower()
    first = message.strip().splitlines()[0][:300] if message.strip() else type_name
    if type_name == "ResourceExhaustedError" or "out of memory" in text or "oom when allocating" in text:
        return (
            f"Out of GPU memory during the fit ({type_name}: {first}).",
            ("free the GPUs (`nvidia-smi` lists other processes) or lower --per-replica-batch / --image-size"),
        )
    if "loaded runtime cudnn library" in text:
        return (
            f"TensorFlow refused the loaded cuDNN ({first}).",
            (
                "put the cuDNN version TensorFlow was built with first on the loader path "
                "(same major, equal or higher minor), then run `ldconfig`"
            ),
        )
    if "dnn library is not found" in text or "cudnn" in text:
        return (
            f"cuDNN failed during the convolution ({type_name}: {first}).",
            (
                "check the libcudnn result above: the cuDNN TensorFlow needs is missing, "
                "the wrong version, or out of GPU memory at init"
            ),
        )
    if "driver version is insufficient" in text or "cuda_error_insufficient_driver" in text:
        return (
            f"The NVIDIA driver is too old for TensorFlow's CUDA runtime ({first}).",
            "upgrade the driver (nvidia_driver role) to the branch the stack's CUDA needs",
        )
    if "no kernel image is available" in text or "no_binary_for_gpu" in text:
        return (
            f"This TensorFlow wheel has no kernels for the GPU's compute capability ({first}).",
            "pick a TensorFlow version whose wheel supports this GPU (see the version matrix)",
        )
    if "nccl" in text:
        return (
            f"NCCL failed during the all-reduce ({type_name}: {first}).",
            NCCL_HANG_FIX,
        )
    if "virtual devices cannot be modified" in text:
        return (
            f"TensorFlow was initialised before the logical CPU devices were set ({first}).",
            "this is a bug in fit.py: logical devices must be configured before any op",
        )
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
    document (``problems`` filled).  Exceptions from TensorFlow are caught and classified."""
    mode = "cpu-replicas" if args.cpu_replicas > 0 else "gpu"
    result: dict[str, Any] = {
        "ok": False,
        "mode": mode,
        "num_replicas_in_sync": None,
        "expected_replicas": None,
        "devices": [],
        "global_batch_size": None,
        "per_replica_batch_size": args.per_replica_batch,
        "epochs": args.epochs,
        "steps_per_epoch": args.steps,
        "image_size": args.image_size,
        "seed": args.seed,
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
    expected = args.expected_replicas
    if expected is None:
        expected = args.cpu_replicas if args.cpu_replicas > 0 else None
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
                "run fit.py with the venv's python and reinstall the pinned TensorFlow (tf_venv role)",
            )
        )
        return result
    import libraries

    result["tensorflow_version"] = tf.__version__
    result["keras_version"] = getattr(tf.keras, "__version__", None)
    try:
        tf_info = libraries.tensorflow_build_info()
        result["tensorflow"] = tf_info
        result["physical_gpus"] = tf_info["gpus"]
        progress.write("tensorflow", tensorflow=tf_info)
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if mode == "cpu-replicas":
            cpus = tf.config.list_physical_devices("CPU")
            tf.config.set_logical_device_configuration(
                cpus[0],
                [tf.config.LogicalDeviceConfiguration() for _ in range(args.cpu_replicas)],
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
        if expected is None:
            expected = len(gpus)
        if args.use_replicas:
            expected = min(expected, args.use_replicas)
        result["expected_replicas"] = expected
        replicas = int(strategy.num_replicas_in_sync)
        result["num_replicas_in_sync"] = replicas
        result["devices"] = [str(d) for d in strategy.extended.worker_devices]
        global_batch = plan_batches(args.per_replica_batch, replicas)
        result["global_batch_size"] = global_batch
        progress.write("strategy", replicas=replicas, devices=result["devices"])

        if args.mixed_precision:
            # TensorFlow's mixed-precision guide: float16 compute, float32 variables; the output
            # layer stays float32 for a numerically stable loss.
            tf.keras.mixed_precision.set_global_policy("mixed_float16")
        result["mixed_precision"] = bool(args.mixed_precision)
        tf.keras.utils.set_random_seed(args.seed)
        samples = global_batch * args.steps
        dataset, _ = make_dataset(tf, np, samples, args.image_size, global_batch, args.seed)
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
        result["loaded_libraries"] = libraries.mapped_library_versions()
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


def _scalar_loss(value: Any) -> float:
    """``model.evaluate`` returns a float without metrics, a list with them (Keras 2 and 3)."""
    if isinstance(value, (list, tuple)):
        value = value[0]
    return float(value)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Run a short MirroredStrategy fit (conv net, random learnable data) on all "
        "GPUs or on N logical CPU devices; print the result as JSON.",
        epilog="Exit codes: 0 all checks passed, 1 a check failed or the fit raised, 2 usage error.",
    )
    parser.add_argument(
        "--cpu-replicas",
        type=non_negative_int,
        default=0,
        help="0 = one replica per GPU (default); N = split the CPU into N logical devices",
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
        help="replicas the fit must have (default: --cpu-replicas, or the GPUs TensorFlow sees)",
    )
    parser.add_argument(
        "--per-replica-batch",
        type=positive_int,
        default=16,
        help="samples per replica per step (default 16)",
    )
    parser.add_argument("--steps", type=positive_int, default=8, help="steps per epoch (default 8)")
    parser.add_argument("--epochs", type=positive_int, default=3, help="epochs (default 3)")
    parser.add_argument(
        "--image-size",
        type=positive_int,
        default=32,
        help="image height and width in pixels (default 32)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=0.01,
        help="Adam learning rate (default 0.01)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1234,
        help="random seed for data and weights (default 1234)",
    )
    parser.add_argument("--progress", metavar="PATH", help="append JSON-lines progress records to PATH")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code.  Keeps stdout for the JSON document only."""
    args = build_parser().parse_args(argv)
    if args.image_size < 3:
        build_parser().error("--image-size must be >= 3 (the convolution is 3x3)")
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
