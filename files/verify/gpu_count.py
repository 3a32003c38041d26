"""Count the GPUs that ``nvidia-smi`` sees and compare with the inventory's expected count.

Runs::

    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,driver_version \\
               --format=csv,noheader,nounits

and reads it with ``gpu_parsers.parse_query_gpu`` (the parser the ``nvidia_gpu_facts`` module uses,
given this script's shorter field list).  Field meanings and the ``", "``-separated, unit-less
format: ``nvidia-smi --help-query-gpu``; ``memory.total`` is MiB.  Exit statuses of nvidia-smi (6 = "A query to find an object was unsuccessful", 9 = "NVIDIA
driver is not loaded", 15 = "The GPU has fallen off the bus", ...) come from the nvidia-smi(1) man
page, section RETURN VALUE; exit 9 is named and fixed in gpu_parsers (``MODULE_NOT_LOADED``,
``module_not_loaded_fix``), as in the preflight module and the health check, with the container's
steps first in a container (``gpu_parsers.in_container``).

When ``lspci`` is available, NVIDIA display/3D controllers on the PCI bus (``lspci -D -n -d
10de:``, classes 0300 and 0302) are compared with nvidia-smi's bus IDs, so a GPU that is on the
bus but invisible to the driver is named by its bus ID.  Every bus ID is in the ``lspci -D`` form,
lower-case ``0000:17:00.0`` (``gpu_parsers.normalize_bus_id``), though nvidia-smi prints
``00000000:17:00.0``.

Result (JSON on stdout)::

    {"expected": 2, "seen": 2, "missing": 0, "extra": 0, "driver_version": "520.61.05",
     "devices": [{"index": 0, "name": "...", "uuid": "GPU-...", "pci_bus_id": "0000:17:00.0",
                  "memory_total_mib": 81920}],
     "pci_bus_ids": ["0000:17:00.0", ...] or null, "missing_bus_ids": [...],
     "module_version": "520.61.05" or null (loaded kernel module, /proc/driver/nvidia/version),
     "ok": true, "error": null, "problems": []}

Exit codes: 0 the count matches, 1 it does not (or nvidia-smi failed), 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpu_parsers import (
    COMPUTE_APPS_FIELDS,
    MODULE_NOT_LOADED,
    NVIDIA_SMI_MODULE_NOT_LOADED_RC,
    in_container,
    module_not_loaded_fix,
    parse_compute_apps,
    parse_lspci,
    parse_proc_driver_version,
    parse_query_gpu,
)
from verify_common import EXIT_CHECK_FAILED, EXIT_OK, Problem, dumps, non_negative_int, problem, tail

# A subset of gpu_parsers.QUERY_FIELDS (the module's list): these work with any driver, also one
# older than R510 (no compute_cap).
QUERY_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version")

# nvidia-smi(1), RETURN VALUE.
NVIDIA_SMI_EXIT_MEANINGS = {
    2: "a supplied argument or flag is invalid",
    3: "the requested operation is not available on target device",
    4: "the current user does not have permission to access this device",
    6: "a query to find an object was unsuccessful (no GPU found)",
    8: "a device's external power cables are not properly attached",
    NVIDIA_SMI_MODULE_NOT_LOADED_RC: MODULE_NOT_LOADED,
    10: "NVIDIA kernel detected an interrupt issue with a GPU",
    12: "NVML shared library couldn't be found or loaded",
    13: "local version of NVML doesn't implement this function",
    14: "infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
    # Not in the man page's list; what nvidia-smi returns with "Failed to initialize NVML:
    # Driver/library version mismatch" (NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, nvml.h).
    18: "the loaded kernel module and the user-space driver libraries have different versions",
    255: "other error or internal driver error",
}

# The PCI listing the fixes suggest, and what follows it where the host has none (pciutils ships lspci: lspci(8)).
LSPCI = "`lspci -d 10de:`"
LSPCI_MISSING = " (install pciutils first: this host has no lspci)"
FIX_MISSING = (
    "check `nvidia-smi -L` and `lspci -d 10de:`; a GPU on the bus but missing from nvidia-smi has "
    "fallen off the bus (see `dmesg | grep -i xid`): reseat/reset it or lower "
    "gpu_verify_expected_gpu_count in the inventory"
)
FIX_EXTRA = (
    "the inventory is probably stale (GPUs were added or the host was replaced): raise "
    "gpu_verify_expected_gpu_count for this host, or check CUDA_VISIBLE_DEVICES/MIG if fewer "
    "were meant to be visible"
)


PROC_DRIVER_VERSION = "/proc/driver/nvidia/version"
NVML_LIBRARY_VERSION_RE = re.compile(r"NVML library version:\s*(\d+\.\d+(?:\.\d+)?)")
FIX_MISMATCH = (
    "reboot, so the kernel module of the installed driver loads (after a driver install or upgrade "
    "the old module stays loaded); without a reboot, stop every GPU process and reload the modules: "
    "`rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && modprobe nvidia`"
)


def loaded_module_version(path: str = PROC_DRIVER_VERSION) -> str | None:
    """The loaded kernel module's version (``gpu_parsers.parse_proc_driver_version`` of ``path``),
    or None when no module is loaded or the file is not readable (containers)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse_proc_driver_version(handle.read())
    except OSError:
        return None


def mismatch_problem(module_version: str | None, user_space: str | None, output: str = "") -> Problem:
    """Driver/library version mismatch: the loaded kernel module differs from user space."""
    module = module_version or f"unknown (see {PROC_DRIVER_VERSION})"
    user = user_space or "unknown"
    quoted = f' (nvidia-smi: "{tail(output, 200).strip()}")' if output.strip() else ""
    return problem(
        "driver",
        f"Driver/library version mismatch: the loaded kernel module is {module}, the user-space driver "
        f"(NVML, libcuda) is {user}{quoted}.",
        FIX_MISMATCH,
    )


class CommandResult(NamedTuple):
    """Outcome of running a command: ``rc`` is None when it could not be run or timed out."""

    rc: int | None
    stdout: str
    stderr: str
    error: str | None


def build_command(nvidia_smi: str) -> list[str]:
    """The nvidia-smi command line whose output ``parse_query_gpu(stdout, QUERY_FIELDS)`` reads."""
    return [
        nvidia_smi,
        "--query-gpu=" + ",".join(QUERY_FIELDS),
        "--format=csv,noheader,nounits",
    ]


def count_problem(expected: int, seen: int, missing_bus_ids: Sequence[str] = ()) -> Problem | None:
    """The problem for a count mismatch in either direction, or None when ``seen == expected``."""
    if seen == expected:
        return None
    if seen < expected:
        missing = expected - seen
        cause = f"Expected {expected} GPUs, nvidia-smi sees {seen} ({missing} missing)."
        if missing_bus_ids:
            cause = cause[:-1] + (f"; on the PCI bus but not in nvidia-smi: {', '.join(missing_bus_ids)}.")
        return problem("gpu_count", cause, FIX_MISSING)
    extra = seen - expected
    return problem(
        "gpu_count",
        f"Expected {expected} GPUs, nvidia-smi sees {seen} ({extra} more than the inventory says).",
        FIX_EXTRA,
    )


def failure_problem(
    nvidia_smi: str,
    result: CommandResult,
    expected: int,
    module_version: str | None = None,
    container: bool = False,
) -> Problem:
    """Describe why nvidia-smi gave no usable answer (not found, timeout, non-zero exit).
    ``module_version`` is the loaded kernel module's version when known (for the mismatch case);
    ``container`` puts the container's steps first in exit 9's fix."""
    if result.error == "not-found":
        where = (
            f"{nvidia_smi} does not exist or is not executable"
            if "/" in nvidia_smi
            else f"{nvidia_smi} is not installed (not on PATH ({os.environ.get('PATH', '')}))"
        )
        return problem(
            "gpu_count",
            f"{where}; no NVIDIA driver user space on this host.",
            "install the driver (nvidia_driver role) or pass --nvidia-smi with the right path",
        )
    if result.error == "timeout":
        return problem(
            "gpu_count",
            f"{nvidia_smi} did not answer in time; a GPU or the driver is hung.",
            "check `dmesg | grep -i -e xid -e nvrm`, then reset the GPU (`nvidia-smi -r`) or reboot",
        )
    output = (result.stdout + result.stderr).strip()
    meaning = NVIDIA_SMI_EXIT_MEANINGS.get(result.rc or 0, "unknown failure")
    if result.rc == 18 or "driver/library version mismatch" in output.lower():
        match = NVML_LIBRARY_VERSION_RE.search(output)
        return mismatch_problem(module_version, match.group(1) if match else None, output)
    if result.rc == 6 or "no devices were found" in output.lower():
        return problem(
            "gpu_count",
            f"Expected {expected} GPUs, nvidia-smi sees 0 ({expected} missing): "
            f'"No devices were found" (exit {result.rc}).',
            "the driver is installed but found no GPU: check `lspci -d 10de:` and "
            "`dmesg | grep -i nvrm` (a GPU the driver does not support, or one that fell off the "
            "bus), reseat/reset it or fix gpu_verify_expected_gpu_count",
        )
    if result.rc == NVIDIA_SMI_MODULE_NOT_LOADED_RC:
        fix = module_not_loaded_fix(container)
    elif result.rc == 15:
        fix = "a GPU fell off the bus: check `dmesg | grep -i xid`, reset or reseat it, then reboot"
    else:
        fix = "run the same nvidia-smi command by hand and check `dmesg | grep -i nvrm`"
    return problem(
        "gpu_count",
        f"nvidia-smi failed with exit {result.rc} ({meaning}): {tail(output, 300) or 'no output'}",
        fix,
    )


def _new_doc(expected: int, pci_bus_ids: Sequence[str] | None, module_version: str | None) -> dict[str, Any]:
    """The result document before nvidia-smi's answer is read: nothing seen, not ok."""
    return {
        "expected": expected,
        "seen": 0,
        "missing": expected,
        "extra": 0,
        "driver_version": None,
        "devices": [],
        "pci_bus_ids": list(pci_bus_ids) if pci_bus_ids is not None else None,
        "missing_bus_ids": [],
        "module_version": module_version,
        "ok": False,
        "error": None,
        "problems": [],
    }


def _count_devices(
    doc: dict[str, Any], devices: list[dict[str, Any]], pci_bus_ids: Sequence[str] | None, module_version: str | None
) -> None:
    """Fill ``doc`` from the parsed devices: counts, driver version, bus IDs missing from nvidia-smi, problems."""
    expected, seen = doc["expected"], len(devices)
    doc.update(
        seen=seen,
        missing=max(0, expected - seen),
        extra=max(0, seen - expected),
        devices=[{k: v for k, v in d.items() if k != "driver_version"} for d in devices],
    )
    drivers = sorted({d["driver_version"] for d in devices if d["driver_version"]})
    doc["driver_version"] = drivers[0] if len(drivers) == 1 else (", ".join(drivers) or None)
    if pci_bus_ids is not None:
        smi_ids = {d["pci_bus_id"] for d in devices}
        doc["missing_bus_ids"] = sorted(set(pci_bus_ids) - smi_ids)
    found = count_problem(expected, seen, doc["missing_bus_ids"])
    if found:
        doc["error"] = found["cause"]
        doc["problems"].append(found)
    if module_version and drivers and drivers != [module_version]:
        doc["problems"].append(mismatch_problem(module_version, doc["driver_version"]))


def evaluate(
    expected: int,
    result: CommandResult,
    nvidia_smi: str = "nvidia-smi",
    pci_bus_ids: Sequence[str] | None = None,
    module_version: str | None = None,
    container: bool = False,
    lspci_missing: bool = False,
) -> dict[str, Any]:
    """Turn nvidia-smi's answer into the result document (pure: no I/O).

    Args:
        expected: GPUs the inventory expects.
        result: what running nvidia-smi gave.
        nvidia_smi: the path used, for messages.
        pci_bus_ids: NVIDIA GPU bus IDs seen by lspci (``0000:17:00.0`` form), or None when lspci
            was not run.
        module_version: the loaded kernel module's version (``/proc/driver/nvidia/version``), or
            None when unknown; a value that differs from nvidia-smi's driver version is a problem.
        container: whether this runs in a container (``gpu_parsers.in_container``): the
            container's steps come first in the fix for exit 9.
        lspci_missing: the host has no lspci; a fix that suggests it says to install pciutils.
    """
    doc = _evaluate(expected, result, nvidia_smi, pci_bus_ids, module_version, container)
    if lspci_missing:
        for found in doc["problems"]:
            found["fix"] = found["fix"].replace(LSPCI, LSPCI + LSPCI_MISSING)
    return doc


def _evaluate(
    expected: int,
    result: CommandResult,
    nvidia_smi: str,
    pci_bus_ids: Sequence[str] | None,
    module_version: str | None,
    container: bool,
) -> dict[str, Any]:
    """:func:`evaluate` before its fixes are fitted to a host without lspci."""
    doc = _new_doc(expected, pci_bus_ids, module_version)
    no_devices = "no devices were found" in (result.stdout + result.stderr).lower()
    if expected == 0 and (no_devices or result.rc == 6):
        doc["ok"] = True
        return doc
    if result.rc != 0 or no_devices:
        found = failure_problem(nvidia_smi, result, expected, module_version, container)
        doc["error"] = found["cause"]
        doc["problems"].append(found)
        if pci_bus_ids:
            doc["missing_bus_ids"] = sorted(pci_bus_ids)
        return doc
    try:
        devices = parse_query_gpu(result.stdout, QUERY_FIELDS)
    except ValueError as exc:
        doc["error"] = str(exc)
        doc["problems"].append(
            problem(
                "gpu_count",
                f"Could not read nvidia-smi's output: {exc}",
                "run the query by hand; a driver too old for these query fields prints an error "
                "instead of CSV; upgrade the driver",
            )
        )
        return doc
    _count_devices(doc, devices, pci_bus_ids, module_version)
    doc["ok"] = not doc["problems"]
    return doc


def run_command(argv: Sequence[str], timeout: float) -> CommandResult:
    """Run ``argv`` with a ``timeout`` in seconds, capturing text output; never raises for the
    usual failures (missing binary, permission, timeout), which come back in ``error``."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return CommandResult(None, "", "", "not-found")
    except subprocess.TimeoutExpired:
        return CommandResult(None, "", "", "timeout")
    return CommandResult(done.returncode, done.stdout, done.stderr, None)


def lspci_bus_ids(lspci: str | None, timeout: float = 30.0) -> list[str] | None:
    """NVIDIA GPU bus IDs from lspci, or None when lspci is disabled, missing or fails."""
    if not lspci:
        return None
    result = run_command([lspci, "-D", "-n", "-d", "10de:"], timeout)
    if result.rc != 0:
        return None
    return [gpu["pci_bus_id"] for gpu in parse_lspci(result.stdout)]


def check_gpus(
    expected: int,
    nvidia_smi: str = "nvidia-smi",
    timeout: float = 60.0,
    lspci: str | None = "lspci",
) -> dict[str, Any]:
    """Run nvidia-smi (and lspci) and return the :func:`evaluate` document.

    Args:
        expected: GPUs the inventory expects.
        nvidia_smi: nvidia-smi path or name on PATH.
        timeout: seconds allowed for each command.
        lspci: lspci path or name, or None to skip the PCI cross-check.
    """
    result = run_command(build_command(nvidia_smi), timeout)
    pci_bus_ids = lspci_bus_ids(lspci, timeout)
    missing = lspci is not None and pci_bus_ids is None and shutil.which(lspci) is None
    return evaluate(expected, result, nvidia_smi, pci_bus_ids, loaded_module_version(), in_container(), missing)


def busy_gpus_text(text: str, devices: Sequence[dict[str, Any]]) -> str | None:
    """Processes holding GPU memory, from ``nvidia-smi --query-compute-apps=pid,process_name,
    gpu_uuid,used_memory --format=csv,noheader,nounits`` output (read by
    ``gpu_parsers.parse_compute_apps``), as one phrase: "GPU 0: PID 4242 python3 (30512 MiB);
    GPU 1: ...".  ``devices`` (this module's device records) map UUIDs to indexes.  None when no
    process holds a GPU."""
    index_of = {d.get("uuid"): d.get("index") for d in devices}
    parts = []
    for app in parse_compute_apps(text):
        uuid, used = app["gpu_uuid"], app["used_memory_mib"]
        where = f"GPU {index_of[uuid]}" if uuid in index_of else uuid
        memory = "memory unknown" if used is None else f"{used} MiB"
        parts.append(f"{where}: PID {app['pid']} {app['process_name']} ({memory})")
    return "; ".join(parts) or None


def busy_gpus(nvidia_smi: str, devices: Sequence[dict[str, Any]], timeout: float = 30.0) -> str | None:
    """Run the compute-apps query (see :func:`busy_gpus_text`); None when nothing runs or
    nvidia-smi fails."""
    result = run_command(
        [nvidia_smi, "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS), "--format=csv,noheader,nounits"],
        timeout,
    )
    return busy_gpus_text(result.stdout, devices) if result.rc == 0 else None


def add_tool_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--nvidia-smi PATH``, ``--lspci PATH`` and ``--no-lspci`` (shared with gpu_verify.py)."""
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi path (default: from PATH)")
    parser.add_argument("--lspci", default="lspci", help="lspci path for the PCI cross-check (default: from PATH)")
    parser.add_argument("--no-lspci", action="store_true", help="skip the PCI bus cross-check")


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Compare the GPUs nvidia-smi sees with the expected count; print JSON.",
        epilog="Exit codes: 0 count matches, 1 mismatch or nvidia-smi failed, 2 usage error.",
    )
    parser.add_argument(
        "--expected",
        type=non_negative_int,
        required=True,
        help="GPUs the inventory expects",
    )
    add_tool_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds allowed per command (default 60)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    doc = check_gpus(
        args.expected,
        args.nvidia_smi,
        args.timeout,
        None if args.no_lspci else args.lspci,
    )
    print(dumps(doc))
    return EXIT_OK if doc["ok"] else EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
