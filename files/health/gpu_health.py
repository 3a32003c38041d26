"""GPU health check that each host runs between provisioning runs: ``python3 gpu_health.py``.

One run reads, each command under ``--timeout`` seconds (killed, with its children, when it hangs):

- ``nvidia-smi --query-gpu=<gpu_parsers.HEALTH_FIELDS> --format=csv,noheader,nounits`` (drivers that
  refuse the ``clocks_event_reasons.*`` names are asked again with ``clocks_throttle_reasons.*``);
- ``nvidia-smi nvlink -s``;
- the kernel log since the last check: ``journalctl -k --since @<epoch> -o short-monotonic
  --no-pager`` (``-b`` instead of ``--since`` on the first run), or ``dmesg`` when journalctl is
  missing or fails (then only lines after the last check's uptime count), or ``--kernel-log FILE``;
- ``/proc/driver/nvidia/version`` (the loaded kernel module);
- the baseline (``--baseline``) and the Xid catalog (``data/xid.yml``, ``--xid-catalog``).

It judges them with one pure function per check, each returning findings ``{"check", "bus_id",
"cause", "fix"}`` (bus_id None for the host): ``gpus`` (count, and each bus id of the baseline),
``pcie`` (link width below its maximum or the baseline; link generation maximum below the
baseline), ``nvlink`` (active links below the baseline), ``ecc`` (uncorrectable volatile or
aggregate errors, pages pending retirement, rows pending remapping, a remapping failure), ``xid``
(each Xid, grouped by GPU and number, with the catalog's meaning and action), ``clocks`` (hardware
slowdown, thermal slowdown or power brake active), ``persistence`` (off) and ``driver`` (user space
against the loaded kernel module, and against the baseline's pinned version). A field the GPU does
not report (``[N/A]``) is never a finding. The current PCIe *generation* is not judged: the driver
lowers it while the GPU idles (``nvidia-smi --help-query-gpu``, ``pcie.link.gen.current``).

Then it writes Prometheus metrics for node_exporter's textfile collector (``--textfile``, written to
a temporary file in the same folder, then renamed over the old one, so the collector never reads
half a file), prints a short report (or JSON with ``--format json``) and records the time of this
check (``--state``), so the next run reads the kernel log only from then on. The state is written
only when the check ran; after a run that could not check, the next one reads the same window again.

Baseline (``--baseline``, JSON, written at the last passing verification; the ``#`` notes are not
part of the file)::

    {
      "schema": 1,
      "expected_gpus": 8,                    # GPUs nvidia-smi must list
      "driver_version": "550.54.15",        # the pinned driver; null: not judged
      "gpus": {                              # by PCI bus id, in any form lspci or nvidia-smi prints
        "0000:18:00.0": {
          "pcie_link_gen_max": 5,            # all counts optional: null or absent is not judged
          "pcie_link_width_max": 16,
          "pcie_link_gen_current": 5,        # recorded, not judged (see above)
          "pcie_link_width_current": 16,
          "nvlink_active_links": 18,         # 0 or absent: no NVLink expected
          "fabric_manager_expected": true    # NVSwitch system: its links need nvidia-fabricmanager
        }
      }
    }

State (``--state``): ``{"last_check_epoch": 1717171717.0, "last_check": "2024-05-31T16:08:37Z"}``.

Metrics (names ``gpu_fleet_health_*``, base units, ``_total`` only on counters; per-GPU series carry a
``bus_id`` label): ``up`` (1 when the check ran, 0 when it could not check),
``last_run_timestamp_seconds``, ``check_ok{check}``, ``finding{check,bus_id}`` (the number of
findings, 1 each; ``bus_id=""`` for the host), ``gpu_present``, ``pcie_link_generation[_max]``,
``pcie_link_width[_max]``, ``nvlink_active_links``, ``nvlink_expected_links``,
``ecc_uncorrected_volatile_errors_total``, ``ecc_uncorrected_aggregate_errors_total``,
``retired_pages_pending``, ``remapped_rows_pending``, ``remapped_rows_failure``,
``clocks_event_active{reason}``, ``persistence_mode``, ``xid_events{xid}`` (since the last check) and
``driver_info{user_space,kernel_module,baseline}``. Format: "Exposition formats", text format
(https://prometheus.io/docs/instrumenting/exposition_formats/); names after "Metric and label
naming" (https://prometheus.io/docs/practices/naming/).

Exit codes: 0 healthy, 1 unhealthy (at least one finding), 2 could not check (nvidia-smi missing,
failing or hanging, the baseline, the Xid catalog or the kernel log unreadable) or a usage error.

Sources: nvidia-smi(1) (https://docs.nvidia.com/deploy/nvidia-smi/index.html) and ``nvidia-smi
--help-query-gpu`` for the fields; NVIDIA "XID Errors" (https://docs.nvidia.com/deploy/xid-errors/)
for the Xids; NVIDIA "GPU Memory Error Management"
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/, "Error Recovery and Response Flags") and
"Dynamic Page Retirement" (https://docs.nvidia.com/deploy/dynamic-page-retirement/) for pending
row remaps (a GPU reset applies them) and page retirements (a driver reload or reboot). Standard
library only, Python 3.9+.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

try:
    import gpu_parsers
except ImportError:  # a clone of the collection: the shared parsers are in plugins/module_utils
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins", "module_utils"))
    import gpu_parsers

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_COULD_NOT_CHECK = 2

CHECKS = ("gpus", "pcie", "nvlink", "ecc", "xid", "clocks", "persistence", "driver")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BASELINE = "/var/lib/gpu-health/baseline.json"
DEFAULT_STATE = "/var/lib/gpu-health/state.json"
DEFAULT_PROC_VERSION = "/proc/driver/nvidia/version"
DEFAULT_TIMEOUT = 20.0
XID_DOC_URL = "https://docs.nvidia.com/deploy/xid-errors/"
BASELINE_SCHEMA = 1
BASELINE_GPU_COUNTS = (
    "pcie_link_gen_max",
    "pcie_link_width_max",
    "pcie_link_gen_current",
    "pcie_link_width_current",
    "nvlink_active_links",
)
# parse_health_query key -> words for the report and the metric's reason label.
CLOCK_REASONS = (
    ("clocks_event_reasons_hw_slowdown", "hardware slowdown", "hw_slowdown"),
    ("clocks_event_reasons_hw_thermal_slowdown", "hardware thermal slowdown", "hw_thermal_slowdown"),
    ("clocks_event_reasons_sw_thermal_slowdown", "software thermal slowdown", "sw_thermal_slowdown"),
    ("clocks_event_reasons_hw_power_brake_slowdown", "hardware power brake", "hw_power_brake_slowdown"),
)
# nvidia-smi's answers: NVML's "Driver/library version mismatch" (newer drivers add "NVML library
# version: <v>"), an unknown --query-gpu field, and exit status 6 "No devices were found".
MISMATCH = "driver/library version mismatch"
NVML_LIBRARY_VERSION = re.compile(r"NVML library version:\s*(\d+(?:\.\d+)+)")
INVALID_FIELD = "is not a valid field to query"
NO_DEVICES = "no devices were found"

FIX_NVIDIA_SMI_MISSING = (
    "Install the NVIDIA driver's utilities (the nvidia_driver role) or pass --nvidia-smi with the path."
)
FIX_HANG = (
    "A hanging nvidia-smi usually means a GPU in a bad state: look for Xid 79, 119 or 120 in "
    "`journalctl -k`, then drain the host and reset the GPU (`nvidia-smi -r`) or reboot."
)
FIX_NVIDIA_SMI_FAILED = "Run the command by hand and read its message; exit status 9 means the driver is not loaded (reboot after an install)."
FIX_BASELINE = (
    "Run the GPU verification (the gpu_verify role), which writes the baseline when it passes, "
    "or pass --baseline with the path."
)
FIX_GPU_MISSING = (
    "Look for Xid 79 in `journalctl -k` and for the GPU in `lspci -d 10de:`; drain the host and "
    "reboot, and reseat or RMA a GPU that stays missing."
)
FIX_GPU_EXTRA = "If GPUs were added on purpose, re-run the verification so it writes a new baseline; otherwise check the host's hardware."
FIX_PCIE = (
    "Drain the host, reseat the GPU (and its riser or cable) and check the slot's link settings in "
    "the BIOS; a link that stays degraded needs the board or the GPU replaced."
)
FIX_NVLINK = (
    "Check that the NVLink bridge is seated and `nvidia-smi nvlink -e` for errors; drain the host "
    "and reset the GPU or reboot, and replace the bridge or GPU if links stay down."
)
FIX_NVLINK_FABRIC = (
    "Check `systemctl status nvidia-fabricmanager` (NVSwitch systems train their links through it) "
    "and `nvidia-smi nvlink -e`; drain the host and reboot, and have the baseboard serviced if "
    "links stay down."
)
FIX_CLOCKS = (
    "Check cooling (fans, airflow, inlet temperature) for a thermal slowdown and the power supplies "
    "for a power brake; `nvidia-smi -q -d PERFORMANCE,TEMPERATURE` shows the active reasons."
)
FIX_PERSISTENCE = (
    "Start the persistence daemon, `systemctl enable --now nvidia-persistenced` (or `nvidia-smi -pm 1` "
    "until the next reboot), and re-run provisioning, which enables it."
)
FIX_DRIVER_MISMATCH = (
    "Drain the host and reboot it, so the kernel module of the installed driver loads (an upgrade "
    "leaves the old module loaded until then)."
)
FIX_DRIVER_PIN = (
    "Re-run provisioning to bring back the pinned driver; if the change was meant, re-run the "
    "verification so it writes a new baseline."
)

Finding = dict[str, Any]


def finding(check: str, bus_id: str | None, cause: str, fix: str) -> Finding:
    """One finding: which check, which GPU (None: the host), what is wrong and what to do."""
    return {"check": check, "bus_id": bus_id, "cause": cause, "fix": fix[:1].upper() + fix[1:]}


class CouldNotCheck(Exception):
    """The check could not run (exit status 2): ``cause`` and ``fix`` are one sentence each."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


class CommandTimeout(Exception):
    """A command was still running after its timeout and was killed."""


class CommandResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str


def run_command(argv: Sequence[str], timeout: float) -> CommandResult:
    """Run ``argv``; kill it and its children when it runs longer than ``timeout`` seconds.

    The command gets its own process group, so a wrapper script's children die with it. A process
    stuck in the kernel (nvidia-smi on a GPU that fell off the bus) does not die even of SIGKILL,
    so after one more second this gives up on it instead of waiting.

    Raises:
        OSError: the command could not be started (not found, not executable).
        CommandTimeout: it did not finish in time.
    """
    process = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            process.communicate(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        raise CommandTimeout(" ".join(argv)) from None
    return CommandResult(process.returncode, stdout, stderr)


def tail(text: str, limit: int = 300) -> str:
    """The last ``limit`` characters of ``text`` on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else "..." + flat[-limit:]


def run_nvidia_smi(argv: Sequence[str], timeout: float) -> CommandResult:
    """:func:`run_command` for nvidia-smi, whose failure to start or to finish ends the check."""
    try:
        return run_command(argv, timeout)
    except OSError as exc:
        raise CouldNotCheck(f"Could not run nvidia-smi ({exc.strerror}): {argv[0]}.", FIX_NVIDIA_SMI_MISSING) from None
    except CommandTimeout:
        raise CouldNotCheck(
            f"`{' '.join(argv)}` did not answer within {timeout:g} s and was killed.", FIX_HANG
        ) from None


def query_command(nvidia_smi: str, fields: Sequence[str]) -> list[str]:
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def query_gpus(nvidia_smi: str, timeout: float) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    """The GPUs as ``gpu_parsers.parse_health_query`` gives them, and None; or None and
    ``{"library_version", "output"}`` when NVML reports a driver/library version mismatch.

    Raises:
        CouldNotCheck: nvidia-smi is missing, hangs, fails otherwise or answers in an unknown form.
    """
    fields = gpu_parsers.HEALTH_FIELDS
    result = run_nvidia_smi(query_command(nvidia_smi, fields), timeout)
    if result.rc != 0 and INVALID_FIELD in result.stdout + result.stderr:
        fields = gpu_parsers.HEALTH_FIELDS_THROTTLE_NAMES  # a driver that predates clocks_event_reasons
        result = run_nvidia_smi(query_command(nvidia_smi, fields), timeout)
    output = result.stdout + result.stderr
    if MISMATCH in output.lower():
        version = NVML_LIBRARY_VERSION.search(output)
        return None, {"library_version": version.group(1) if version else None, "output": tail(output, 200)}
    if result.rc != 0 and NO_DEVICES not in output.lower():
        command = " ".join(query_command(nvidia_smi, fields))
        raise CouldNotCheck(f"`{command}` failed with exit status {result.rc}: {tail(output)}", FIX_NVIDIA_SMI_FAILED)
    try:
        return gpu_parsers.parse_health_query(result.stdout, fields), None
    except ValueError as exc:
        raise CouldNotCheck(
            f"The answer of nvidia-smi is in a form this check does not know: {exc}.",
            "Run the query by hand; a driver update may have changed the output, which gpu_parsers.py must then follow.",
        ) from None


def read_nvlink(nvidia_smi: str, timeout: float) -> tuple[dict[int, dict[str, Any]] | None, str | None]:
    """``nvidia-smi nvlink -s`` parsed, and None; or None and why it could not be read."""
    argv = [nvidia_smi, "nvlink", "-s"]
    result = run_nvidia_smi(argv, timeout)
    if result.rc != 0:
        return None, f"`{' '.join(argv)}` failed with exit status {result.rc}: {tail(result.stdout + result.stderr)}"
    try:
        return gpu_parsers.parse_nvlink_status(result.stdout), None
    except ValueError as exc:
        return None, str(exc)


def kernel_log_commands(since_epoch: float | None) -> list[list[str]]:
    """journalctl for the kernel log since the last check (this boot on a first run), then dmesg."""
    window = ["--since", f"@{int(since_epoch)}"] if since_epoch else ["-b"]
    return [["journalctl", "-k", *window, "-o", "short-monotonic", "--no-pager"], ["dmesg"]]


def events_after(events: list[dict[str, Any]], uptime: float | None) -> list[dict[str, Any]]:
    """The events logged after ``uptime`` seconds since boot (all of them when it is None or < 0)."""
    if uptime is None or uptime < 0:
        return events
    return [event for event in events if event["uptime_seconds"] is None or event["uptime_seconds"] > uptime]


def boot_epoch(proc_uptime: str = "/proc/uptime") -> float | None:
    """When this host booted, in seconds since the epoch, or None when /proc/uptime is unreadable."""
    try:
        with open(proc_uptime, encoding="ascii") as handle:
            return time.time() - float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_kernel_log(path: str | None, since_epoch: float | None, timeout: float) -> list[dict[str, Any]]:
    """The Xid events of the kernel log since the last check (all of ``path`` when given).

    Raises:
        CouldNotCheck: the file is unreadable, or neither journalctl nor dmesg answers.
    """
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return gpu_parsers.parse_xid_events(handle.read())
        except OSError as exc:
            raise CouldNotCheck(
                f"The kernel log {path} could not be read ({exc.strerror}).", "Pass a readable --kernel-log."
            ) from None
    for argv in kernel_log_commands(since_epoch):
        try:
            result = run_command(argv, timeout)
        except OSError:
            continue
        except CommandTimeout:
            raise CouldNotCheck(
                f"`{' '.join(argv)}` did not answer within {timeout:g} s and was killed.",
                "Check that journald is running (`systemctl status systemd-journald`), or pass --kernel-log.",
            ) from None
        if result.rc == 0:
            events = gpu_parsers.parse_xid_events(result.stdout)
            if argv[0] == "dmesg" and since_epoch:
                booted = boot_epoch()
                events = events_after(events, since_epoch - booted if booted else None)
            return events
    raise CouldNotCheck(
        "The kernel log could not be read: neither `journalctl -k` nor `dmesg` answered.",
        "Run the check as root (dmesg needs it where kernel.dmesg_restrict is 1) or pass --kernel-log.",
    )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _baseline_gpu(bus_id: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ValueError(f"gpus[{bus_id!r}] is not an object")
    for key in BASELINE_GPU_COUNTS:
        if entry.get(key) is not None and not _is_count(entry[key]):
            raise ValueError(f"gpus[{bus_id!r}].{key} is {entry[key]!r}, not a whole number >= 0")
    fabric = entry.get("fabric_manager_expected", False)
    if not isinstance(fabric, bool):
        raise ValueError(f"gpus[{bus_id!r}].fabric_manager_expected is {fabric!r}, not true or false")
    return {**{key: entry.get(key) for key in BASELINE_GPU_COUNTS}, "fabric_manager_expected": fabric}


def validate_baseline(document: Any) -> dict[str, Any]:
    """The baseline (schema in the module docstring) with its bus ids normalised.

    Raises:
        ValueError: it does not follow the schema; the message names the key.
    """
    if not isinstance(document, dict):
        raise ValueError("it is not a JSON object")
    if document.get("schema") != BASELINE_SCHEMA:
        raise ValueError(f"schema is {document.get('schema')!r}; this check reads schema {BASELINE_SCHEMA}")
    expected = document.get("expected_gpus")
    if not _is_count(expected):
        raise ValueError(f"expected_gpus is {expected!r}, not a whole number >= 0")
    driver = document.get("driver_version")
    if driver is not None and not isinstance(driver, str):
        raise ValueError(f"driver_version is {driver!r}, not a string or null")
    gpus = document.get("gpus")
    gpus = {} if gpus is None else gpus
    if not isinstance(gpus, dict):
        raise ValueError("gpus is not an object keyed by PCI bus id")
    return {
        "expected_gpus": expected,
        "driver_version": driver,
        "gpus": {gpu_parsers.normalize_bus_id(bus): _baseline_gpu(bus, entry) for bus, entry in gpus.items()},
    }


def load_baseline(path: str) -> dict[str, Any]:
    """:func:`validate_baseline` of the JSON file at ``path``.

    Raises:
        CouldNotCheck: the file is missing, unreadable, not JSON or not a baseline.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            return validate_baseline(json.load(handle))
    except OSError as exc:
        raise CouldNotCheck(f"The baseline {path} could not be read ({exc.strerror}).", FIX_BASELINE) from None
    except ValueError as exc:
        raise CouldNotCheck(f"The baseline {path} is not usable: {exc}.", FIX_BASELINE) from None


_CATALOG_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?: (?P<value>.*\S))?\s*$")


def _catalog_scalar(value: str | None, number: int) -> str:
    """A value of the catalog subset: a JSON-escaped double-quoted string, or plain text."""
    if value is None:
        raise ValueError(f"line {number}: a key without a value")
    if value.startswith('"'):
        try:
            return str(json.loads(value))
        except ValueError:
            raise ValueError(f"line {number}: {value!r} is not a double-quoted string with JSON escapes") from None
    if value[0] in "'[{&*!|>%@`" or " #" in value or ": " in value:
        raise ValueError(f"line {number}: {value!r} needs double quotes")
    return value


def parse_xid_catalog(text: str) -> dict[str, Any]:
    """Read data/xid.yml without PyYAML: ``{"catalog_url": ..., "xids": {13: {"meaning": ...}}}``.

    Only the subset the file's header describes: top-level ``key: value`` lines, and under
    ``xids:`` two-space ``<number>:`` keys with four-space ``key: value`` lines; comments, blank
    lines and ``---`` are skipped.

    Raises:
        ValueError: a line outside that subset (the message names the line number).
    """
    document: dict[str, Any] = {"xids": {}}
    in_xids, entry = False, None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#") or line.strip() == "---":
            continue
        match = _CATALOG_LINE.match(line)
        indent = len(match.group("indent")) if match else -1
        if match and indent == 0:
            in_xids, entry = match.group("key") == "xids" and match.group("value") is None, None
            if not in_xids:
                document[match.group("key")] = _catalog_scalar(match.group("value"), number)
        elif match and indent == 2 and in_xids and match.group("key").isdigit() and match.group("value") is None:
            entry = document["xids"][int(match.group("key"))] = {}
        elif match and indent == 4 and entry is not None:
            entry[match.group("key")] = _catalog_scalar(match.group("value"), number)
        else:
            raise ValueError(f"line {number}: not in the YAML subset this reader knows: {line!r}")
    return document


def default_xid_catalog() -> str:
    """xid.yml beside this script (as the role installs it), else data/xid.yml of a clone."""
    beside = os.path.join(HERE, "xid.yml")
    return beside if os.path.exists(beside) else os.path.normpath(os.path.join(HERE, "..", "..", "data", "xid.yml"))


def load_xid_catalog(path: str) -> dict[str, Any]:
    """:func:`parse_xid_catalog` of ``path``.

    Raises:
        CouldNotCheck: the file is missing, unreadable or outside the subset.
    """
    fix = "Install data/xid.yml of the collection beside gpu_health.py as xid.yml, or pass --xid-catalog."
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_xid_catalog(handle.read())
    except OSError as exc:
        raise CouldNotCheck(f"The Xid catalog {path} could not be read ({exc.strerror}).", fix) from None
    except ValueError as exc:
        raise CouldNotCheck(f"The Xid catalog {path} could not be parsed: {exc}.", fix) from None


def read_state(path: str | None) -> float | None:
    """The epoch of the last check from the state file; None when there is none or it is garbled
    (then the whole boot's kernel log is read: an Xid is better reported twice than missed)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)["last_check_epoch"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to a temporary file in the folder of ``path``, then rename it over ``path``.

    Raises:
        OSError: the folder cannot be created or written.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".gpu_health-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def iso_time(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def read_module_version(path: str) -> str | None:
    """The loaded kernel module's version (``gpu_parsers.parse_proc_driver_version``), or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return gpu_parsers.parse_proc_driver_version(handle.read())
    except OSError:
        return None


def judge_gpus(gpus: list[dict[str, Any]], baseline: dict[str, Any]) -> list[Finding]:
    """Each GPU of the baseline that nvidia-smi does not list, and a count against expected_gpus."""
    expected, seen = baseline["expected_gpus"], {gpu["pci_bus_id"] for gpu in gpus}
    missing = sorted(set(baseline["gpus"]) - seen)
    findings = [
        finding(
            "gpus",
            bus_id,
            f"GPU {bus_id} of the baseline is missing: nvidia-smi lists {len(gpus)} of {expected} GPUs.",
            FIX_GPU_MISSING,
        )
        for bus_id in missing
    ]
    count = f"nvidia-smi lists {len(gpus)} GPUs; the baseline expects {expected}."
    if len(gpus) < expected and not missing:
        findings.append(finding("gpus", None, count[:1].upper() + count[1:], FIX_GPU_MISSING))
    elif len(gpus) > expected:
        findings.append(finding("gpus", None, count[:1].upper() + count[1:], FIX_GPU_EXTRA))
    return findings


def _width_references(width_max: int | None, baseline_width: int | None) -> str:
    references = [f"link maximum x{width_max}"] if width_max is not None else []
    references += [f"x{baseline_width} at the last verification"] if baseline_width is not None else []
    return ", ".join(references)


def judge_pcie(gpus: list[dict[str, Any]], baseline: dict[str, Any]) -> list[Finding]:
    """Link width below the link's maximum or the baseline; generation maximum below the baseline."""
    findings = []
    for gpu in gpus:
        bus_id, base = gpu["pci_bus_id"], baseline["gpus"].get(gpu["pci_bus_id"], {})
        width, width_max = gpu["pcie_link_width_current"], gpu["pcie_link_width_max"]
        references = [width_max, base.get("pcie_link_width_current"), base.get("pcie_link_width_max")]
        wanted = max((value for value in references if value is not None), default=None)
        if width is not None and wanted is not None and width < wanted:
            known = _width_references(width_max, base.get("pcie_link_width_current"))
            cause = f"The PCIe link of GPU {bus_id} runs at x{width}, expected x{wanted} ({known})."
            findings.append(finding("pcie", bus_id, cause, FIX_PCIE))
        gen_max, base_gen = gpu["pcie_link_gen_max"], base.get("pcie_link_gen_max")
        if gen_max is not None and base_gen is not None and gen_max < base_gen:
            cause = f"The PCIe link of GPU {bus_id} trains to Gen {gen_max} at most; it reached Gen {base_gen} at the last verification."
            findings.append(finding("pcie", bus_id, cause, FIX_PCIE))
    return findings


def active_links(status: dict[str, Any] | None) -> int:
    """Links with a speed above zero in one GPU's ``parse_nvlink_status`` entry."""
    return sum(1 for speed in ((status or {}).get("links") or {}).values() if speed)


def _nvlink_cause(bus_id: str, status: dict[str, Any] | None, expected: int) -> str:
    links = (status or {}).get("links") or {}
    down = sorted(number for number, speed in links.items() if not speed)
    detail = f"; inactive: {', '.join(f'link {n}' for n in down)}" if down else ""
    note = (status or {}).get("note")
    detail += f"; nvidia-smi says: {note}" if note else ""
    return f"GPU {bus_id} has {active_links(status)} of {expected} NVLinks active{detail}."


def judge_nvlink(
    gpus: list[dict[str, Any]],
    nvlink: dict[int, dict[str, Any]] | None,
    nvlink_error: str | None,
    baseline: dict[str, Any],
) -> list[Finding]:
    """Active NVLinks of each GPU below the baseline's count (GPUs in MIG mode report none: skipped)."""
    findings = []
    for gpu in gpus:
        bus_id, base = gpu["pci_bus_id"], baseline["gpus"].get(gpu["pci_bus_id"], {})
        expected = base.get("nvlink_active_links") or 0
        if not expected:
            continue
        fix = FIX_NVLINK_FABRIC if base.get("fabric_manager_expected") else FIX_NVLINK
        if nvlink is None:
            cause = f"The NVLink status of GPU {bus_id} could not be read ({nvlink_error}); {expected} active links are expected."
            findings.append(finding("nvlink", bus_id, cause, fix))
            continue
        status = nvlink.get(gpu["index"])
        if status and "MIG mode" in (status.get("note") or ""):
            continue
        if active_links(status) < expected:
            findings.append(finding("nvlink", bus_id, _nvlink_cause(bus_id, status, expected), fix))
    return findings


def judge_ecc(gpus: list[dict[str, Any]]) -> list[Finding]:
    """Uncorrectable errors, pages pending retirement, rows pending remapping, a remapping failure."""
    findings = []
    for gpu in gpus:
        bus_id = gpu["pci_bus_id"]
        volatile, aggregate = (
            gpu["ecc_errors_uncorrected_volatile_total"],
            gpu["ecc_errors_uncorrected_aggregate_total"],
        )
        reset = f"`nvidia-smi -r -i {bus_id}`"
        checks = [
            (
                volatile,
                f"GPU {bus_id} has had {volatile} uncorrectable ECC errors since the driver loaded.",
                f"Drain the GPU and reset it ({reset}) or reboot; if uncorrectable errors come back, RMA it.",
            ),
            (
                aggregate,
                f"GPU {bus_id} has had {aggregate} uncorrectable ECC errors over its life (aggregate count).",
                f"Read `nvidia-smi -q -d ECC,ROW_REMAPPER -i {bus_id}`: if remapping failed or the count keeps rising, drain the GPU and RMA it.",
            ),
            (
                gpu["retired_pages_pending"],
                f"GPU {bus_id} has memory pages pending retirement.",
                "Drain the GPU, then reload the driver or reboot, so the retirement takes effect.",
            ),
            (
                gpu["remapped_rows_pending"],
                f"GPU {bus_id} has memory rows pending remapping.",
                f"Drain the GPU and reset it ({reset}), which applies the remapping.",
            ),
            (
                gpu["remapped_rows_failure"],
                f"A memory row remapping failed on GPU {bus_id}.",
                "Drain the GPU and RMA it: its memory cannot be repaired in place.",
            ),
        ]
        findings += [finding("ecc", bus_id, cause, fix) for value, cause, fix in checks if value]
    return findings


def _xid_finding(bus_id: str, xid: int, events: list[dict[str, Any]], catalog: dict[str, Any]) -> Finding:
    first, times = events[0], "once" if len(events) == 1 else f"{len(events)} times"
    who = f", process {first['process'] or '?'} (pid {first['pid'] or '?'})" if first["process"] or first["pid"] else ""
    said = f": {first['message']}" if first["message"] else "."
    entry = catalog["xids"].get(xid)
    if entry is None:
        url = catalog.get("catalog_url") or XID_DOC_URL
        cause = f"Xid {xid} on GPU {bus_id}, {times}{who}{said}"
        return finding(
            "xid", bus_id, cause, f"Xid {xid} is not in data/xid.yml: look it up in NVIDIA's Xid catalog, {url}."
        )
    cause = f"Xid {xid} ({entry.get('meaning', '?')}) on GPU {bus_id}, {times}{who}{said}"
    action, detail = entry.get("action") or "contact support", entry.get("detail")
    return finding("xid", bus_id, cause, f"{action}: {detail}" if detail else f"{action}.")


def judge_xid(events: list[dict[str, Any]], catalog: dict[str, Any]) -> list[Finding]:
    """One finding per GPU and Xid number since the last check, with the catalog's meaning and action."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for event in events:
        groups.setdefault((event["bus_id"], event["xid"]), []).append(event)
    return [_xid_finding(bus_id, xid, group, catalog) for (bus_id, xid), group in groups.items()]


def judge_clocks(gpus: list[dict[str, Any]]) -> list[Finding]:
    """Hardware slowdown, thermal slowdown (hardware or software) or power brake holding clocks down."""
    findings = []
    for gpu in gpus:
        active = [words for key, words, _reason in CLOCK_REASONS if gpu.get(key)]
        if active:
            cause = f"The clocks of GPU {gpu['pci_bus_id']} are held down by {', '.join(active)}."
            findings.append(finding("clocks", gpu["pci_bus_id"], cause, FIX_CLOCKS))
    return findings


def judge_persistence(gpus: list[dict[str, Any]]) -> list[Finding]:
    """Persistence mode off (None, not reported, is not judged)."""
    return [
        finding(
            "persistence",
            gpu["pci_bus_id"],
            f"Persistence mode is off on GPU {gpu['pci_bus_id']}: the driver tears the GPU down whenever no process uses it.",
            FIX_PERSISTENCE,
        )
        for gpu in gpus
        if gpu["persistence_mode"] is False
    ]


def user_space_version(gpus: list[dict[str, Any]] | None, mismatch: dict[str, Any] | None) -> str | None:
    """The user-space driver's version: NVML's own on a mismatch, else what nvidia-smi reports."""
    if mismatch is not None:
        return mismatch.get("library_version")
    return next((gpu["driver_version"] for gpu in gpus or [] if gpu.get("driver_version")), None)


def judge_driver(
    gpus: list[dict[str, Any]] | None,
    module_version: str | None,
    baseline: dict[str, Any],
    mismatch: dict[str, Any] | None,
) -> list[Finding]:
    """User space against the loaded kernel module (a mismatch needs a reboot), and against the pin."""
    findings = []
    user_space = user_space_version(gpus, mismatch)
    if mismatch is not None or (module_version and user_space and module_version != user_space):
        said = f' (nvidia-smi: "{mismatch["output"]}")' if mismatch else ""
        cause = (
            f"The user-space driver ({user_space or 'unknown version'}) and the loaded kernel module "
            f"({module_version or 'unknown version'}) differ{said}."
        )
        findings.append(finding("driver", None, cause, FIX_DRIVER_MISMATCH))
    pinned, running = baseline.get("driver_version"), module_version or user_space
    if pinned and running and running != pinned:
        cause = f"Driver {running} is loaded; the baseline (the last passing verification) pins {pinned}."
        findings.append(finding("driver", None, cause, FIX_DRIVER_PIN))
    return findings


def judge(observed: dict[str, Any], baseline: dict[str, Any], catalog: dict[str, Any]) -> dict[str, list[Finding]]:
    """Every check that the observations allow, in :data:`CHECKS` order: {check: findings}."""
    gpus = observed["gpus"]
    results = {
        "xid": judge_xid(observed["xid_events"], catalog),
        "driver": judge_driver(gpus, observed["module_version"], baseline, observed["mismatch"]),
    }
    if gpus is not None:  # None: nvidia-smi could not talk to the driver, only the driver check applies
        results.update(
            gpus=judge_gpus(gpus, baseline),
            pcie=judge_pcie(gpus, baseline),
            nvlink=judge_nvlink(gpus, observed["nvlink"], observed["nvlink_error"], baseline),
            ecc=judge_ecc(gpus),
            clocks=judge_clocks(gpus),
            persistence=judge_persistence(gpus),
        )
    return {check: results[check] for check in CHECKS if check in results}


def observe(args: argparse.Namespace, since_epoch: float | None) -> dict[str, Any]:
    """Everything the checks read from this host (see the module docstring)."""
    gpus, mismatch = query_gpus(args.nvidia_smi, args.timeout)
    nvlink, nvlink_error = read_nvlink(args.nvidia_smi, args.timeout) if gpus else (None, None)
    return {
        "gpus": gpus,
        "mismatch": mismatch,
        "nvlink": nvlink,
        "nvlink_error": nvlink_error,
        "xid_events": read_kernel_log(args.kernel_log, since_epoch, args.timeout),
        "module_version": read_module_version(args.proc_version),
    }


def gpu_rows(observed: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs for the report and the metrics: those nvidia-smi lists, then the baseline's missing ones."""
    rows = []
    for gpu in observed["gpus"] or []:
        base = baseline["gpus"].get(gpu["pci_bus_id"], {})
        status = (observed["nvlink"] or {}).get(gpu["index"])
        active = active_links(status) if observed["nvlink"] is not None else None
        rows.append(
            {
                **gpu,
                "present": True,
                "nvlink_active_links": active,
                "nvlink_expected_links": base.get("nvlink_active_links"),
            }
        )
    if observed["gpus"] is not None:
        seen = {row["pci_bus_id"] for row in rows}
        rows += [
            {"pci_bus_id": bus_id, "present": False, "nvlink_expected_links": base.get("nvlink_active_links")}
            for bus_id, base in sorted(baseline["gpus"].items())
            if bus_id not in seen
        ]
    return rows


def build_report(
    now: float, observed: dict[str, Any], baseline: dict[str, Any], results: dict[str, list[Finding]]
) -> dict[str, Any]:
    """The outcome of a check that ran: exit status 1 with any finding, else 0."""
    findings = [item for check in results.values() for item in check]
    return {
        "up": True,
        "healthy": not findings,
        "exit_code": EXIT_UNHEALTHY if findings else EXIT_HEALTHY,
        "checked_at": iso_time(now),
        "checked_at_epoch": now,
        "error": None,
        "checks": {check: not items for check, items in results.items()},
        "findings": findings,
        "gpus": gpu_rows(observed, baseline),
        "driver": {
            "user_space": user_space_version(observed["gpus"], observed["mismatch"]),
            "kernel_module": observed["module_version"],
            "baseline": baseline["driver_version"],
        },
        "xid_events": observed["xid_events"],
    }


def failed_report(now: float, error: CouldNotCheck) -> dict[str, Any]:
    """The outcome of a check that could not run: exit status 2, ``gpu_fleet_health_up 0``."""
    return {
        "up": False,
        "healthy": None,
        "exit_code": EXIT_COULD_NOT_CHECK,
        "checked_at": iso_time(now),
        "checked_at_epoch": now,
        "error": {"cause": error.cause, "fix": error.fix},
        "checks": {},
        "findings": [],
        "gpus": [],
        "driver": {},
        "xid_events": [],
    }


# (metric, key of a gpu_rows() row, type, help): one series per GPU, labelled with its bus id.
GPU_METRICS = (
    (
        "gpu_fleet_health_gpu_present",
        "present",
        "gauge",
        "1 when nvidia-smi lists the GPU, 0 when the baseline expects it and it is missing.",
    ),
    (
        "gpu_fleet_health_pcie_link_generation",
        "pcie_link_gen_current",
        "gauge",
        "Current PCIe link generation (lower while the GPU idles).",
    ),
    (
        "gpu_fleet_health_pcie_link_generation_max",
        "pcie_link_gen_max",
        "gauge",
        "Highest PCIe link generation the GPU and slot allow.",
    ),
    ("gpu_fleet_health_pcie_link_width", "pcie_link_width_current", "gauge", "Current PCIe link width, in lanes."),
    (
        "gpu_fleet_health_pcie_link_width_max",
        "pcie_link_width_max",
        "gauge",
        "Widest PCIe link the GPU and slot allow, in lanes.",
    ),
    ("gpu_fleet_health_nvlink_active_links", "nvlink_active_links", "gauge", "NVLinks of the GPU that are up."),
    (
        "gpu_fleet_health_nvlink_expected_links",
        "nvlink_expected_links",
        "gauge",
        "NVLinks that were up at the last passing verification.",
    ),
    (
        "gpu_fleet_health_ecc_uncorrected_volatile_errors_total",
        "ecc_errors_uncorrected_volatile_total",
        "counter",
        "Uncorrectable ECC errors since the driver loaded.",
    ),
    (
        "gpu_fleet_health_ecc_uncorrected_aggregate_errors_total",
        "ecc_errors_uncorrected_aggregate_total",
        "counter",
        "Uncorrectable ECC errors over the life of the GPU.",
    ),
    (
        "gpu_fleet_health_retired_pages_pending",
        "retired_pages_pending",
        "gauge",
        "1 when memory pages wait for retirement (a reset applies it).",
    ),
    (
        "gpu_fleet_health_remapped_rows_pending",
        "remapped_rows_pending",
        "gauge",
        "1 when memory rows wait for remapping (a reset applies it).",
    ),
    (
        "gpu_fleet_health_remapped_rows_failure",
        "remapped_rows_failure",
        "gauge",
        "1 when a memory row remapping has failed.",
    ),
    ("gpu_fleet_health_persistence_mode", "persistence_mode", "gauge", "1 when persistence mode is on."),
)

Sample = tuple[dict[str, str], float]
Family = tuple[str, str, str, list[Sample]]


def _run_families(report: dict[str, Any]) -> list[Family]:
    """The series about the run itself: up, time, each check, each finding, the driver versions."""
    counts: dict[tuple[str, str], int] = {}
    for item in report["findings"]:
        key = (item["check"], item["bus_id"] or "")
        counts[key] = counts.get(key, 0) + 1
    driver = report["driver"]
    return [
        (
            "gpu_fleet_health_up",
            "gauge",
            "1 when the health check could run, 0 when it could not check.",
            [({}, int(report["up"]))],
        ),
        (
            "gpu_fleet_health_last_run_timestamp_seconds",
            "gauge",
            "When the health check last ran.",
            [({}, report["checked_at_epoch"])],
        ),
        (
            "gpu_fleet_health_check_ok",
            "gauge",
            "1 when the check found nothing, 0 when it has findings.",
            [({"check": check}, int(ok)) for check, ok in report["checks"].items()],
        ),
        (
            "gpu_fleet_health_finding",
            "gauge",
            "Findings of a check on a GPU (bus_id empty: the host), 1 per finding.",
            [({"check": check, "bus_id": bus_id}, count) for (check, bus_id), count in counts.items()],
        ),
        (
            "gpu_fleet_health_driver_info",
            "gauge",
            "Driver versions: user space, loaded kernel module, pinned in the baseline.",
            [({key: driver.get(key) or "" for key in ("user_space", "kernel_module", "baseline")}, 1)]
            if report["up"]
            else [],
        ),
    ]


def _gpu_families(report: dict[str, Any]) -> list[Family]:
    """The per-GPU series; a value the GPU does not report gives no sample."""
    rows, families = report["gpus"], []
    for name, key, kind, help_text in GPU_METRICS:
        samples = [({"bus_id": row["pci_bus_id"]}, float(row[key])) for row in rows if row.get(key) is not None]
        families.append((name, kind, help_text, samples))
    clocks = [
        ({"bus_id": row["pci_bus_id"], "reason": reason}, float(row[key]))
        for row in rows
        for key, _words, reason in CLOCK_REASONS
        if row.get(key) is not None
    ]
    families.append(
        (
            "gpu_fleet_health_clocks_event_active",
            "gauge",
            "1 while the clock event reason holds the GPU's clocks down.",
            clocks,
        )
    )
    xids: dict[tuple[str, int], int] = {}
    for event in report["xid_events"]:
        xids[(event["bus_id"], event["xid"])] = xids.get((event["bus_id"], event["xid"]), 0) + 1
    samples = [({"bus_id": bus_id, "xid": str(xid)}, count) for (bus_id, xid), count in sorted(xids.items())]
    families.append(
        ("gpu_fleet_health_xid_events", "gauge", "Xid events in the kernel log since the previous check.", samples)
    )
    return families


def _escape(value: str, quote: bool) -> str:
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
    return escaped.replace('"', '\\"') if quote else escaped


def _sample_line(name: str, labels: dict[str, str], value: float) -> str:
    body = ",".join(f'{key}="{_escape(str(text), True)}"' for key, text in labels.items())
    number = str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))
    return f"{name}{{{body}}} {number}" if body else f"{name} {number}"


def render_metrics(report: dict[str, Any]) -> str:
    """The report in the Prometheus text exposition format: HELP and TYPE, then the samples of each
    family; families without samples are left out, except up and the run's timestamp."""
    lines = []
    for name, kind, help_text, samples in _run_families(report) + _gpu_families(report):
        if not samples:
            continue
        lines += [f"# HELP {name} {_escape(help_text, False)}", f"# TYPE {name} {kind}"]
        lines += [_sample_line(name, labels, value) for labels, value in samples]
    return "\n".join(lines) + "\n"


def render_text(report: dict[str, Any]) -> str:
    """The short report for people."""
    if not report["up"]:
        return f"gpu_health: COULD NOT CHECK: {report['error']['cause']}\n  Fix: {report['error']['fix']}\n"
    present = sum(1 for row in report["gpus"] if row.get("present"))
    listed = f"{present} GPU(s)" if "gpus" in report["checks"] else "GPUs not listed (nvidia-smi failed)"
    driver = report["driver"]["kernel_module"] or report["driver"]["user_space"] or "unknown"
    verdict = "healthy" if report["healthy"] else f"UNHEALTHY, {len(report['findings'])} finding(s)"
    lines = [
        f"gpu_health: {verdict}: {listed}, driver {driver}, "
        f"{len(report['xid_events'])} Xid event(s) since the last check; checked {report['checked_at']}"
    ]
    for item in report["findings"]:
        lines += [f"  [{item['check']}] {item['bus_id'] or 'host'}: {item['cause']}", f"      Fix: {item['fix']}"]
    return "\n".join(lines) + "\n"


DESCRIPTION = """\
DESCRIPTION
  Checks this host's NVIDIA GPUs between provisioning runs against the baseline that the last
  passing verification wrote: GPU count and bus ids, PCIe link width and generation, NVLinks,
  uncorrectable ECC errors with pending page retirements and row remaps, Xid errors in the kernel
  log since the last check, clock slowdowns, persistence mode, and the driver (user space against
  the loaded kernel module, and against the pinned version). Prints a short report (or JSON),
  writes Prometheus metrics for node_exporter's textfile collector and records the time of the
  check for the next run.
"""

EPILOG = f"""\
EXIT STATUS
  0  healthy: every check passed
  1  unhealthy: at least one finding; each names its cause and its fix
  2  could not check: nvidia-smi missing, failing or hanging past --timeout, or the baseline,
     the Xid catalog or the kernel log unreadable (the metrics say gpu_fleet_health_up 0);
     also a usage error

FILES
  {DEFAULT_BASELINE:<36}the baseline (--baseline); its schema is in this file's docstring
  {DEFAULT_STATE:<36}the time of the last check (--state)
  {DEFAULT_PROC_VERSION:<36}the loaded kernel module's version (--proc-version)
  {"xid.yml beside this script":<36}the Xid catalog (--xid-catalog); data/xid.yml in a clone

SEE ALSO
  nvidia-smi(1), journalctl(1), dmesg(1); NVIDIA "XID Errors", {XID_DOC_URL}
"""


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 0 and 3600 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu_health.py",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=26, width=100),
        add_help=False,
    )
    options = parser.add_argument_group("OPTIONS")
    add = options.add_argument
    add("-h", "--help", action="help", help="show this help and exit")
    add("--baseline", metavar="FILE", default=DEFAULT_BASELINE, help="baseline JSON (default: %(default)s)")
    add(
        "--state",
        metavar="FILE",
        default=DEFAULT_STATE,
        help="time of the last check (default: %(default)s)",
    )
    add("--textfile", metavar="FILE", help="write Prometheus metrics here, e.g. into node_exporter's textfile folder")
    add(
        "--format",
        choices=("text", "json"),
        default="text",
        help="report for people or JSON for machines (default: %(default)s)",
    )
    add(
        "--timeout",
        metavar="SECONDS",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT,
        help="limit for each command (default: %(default)g)",
    )
    add("--nvidia-smi", metavar="PATH", default="nvidia-smi", help="the nvidia-smi to run (default: %(default)s)")
    add("--kernel-log", metavar="FILE", help="read Xid lines from this file instead of journalctl or dmesg")
    add(
        "--proc-version",
        metavar="FILE",
        default=DEFAULT_PROC_VERSION,
        help="the kernel module's version file (default: %(default)s)",
    )
    add(
        "--xid-catalog",
        metavar="FILE",
        help="Xid catalog (default: xid.yml beside this script, else data/xid.yml of the collection)",
    )
    return parser


def run_check(args: argparse.Namespace, now: float) -> dict[str, Any]:
    """Read, judge and report (see the module docstring).

    Raises:
        CouldNotCheck: an input could not be read; the caller reports exit status 2.
    """
    catalog = load_xid_catalog(args.xid_catalog or default_xid_catalog())
    baseline = load_baseline(args.baseline)
    observed = observe(args, read_state(args.state))
    return build_report(now, observed, baseline, judge(observed, baseline, catalog))


def publish(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Metrics to the textfile, the time of a check that ran to the state file, the report to stdout.
    A file that cannot be written is named on stderr; the exit status stays the check's."""
    writes = [(args.textfile, render_metrics(report))] if args.textfile else []
    if report["up"] and args.state:
        state = {"last_check_epoch": report["checked_at_epoch"], "last_check": report["checked_at"]}
        writes.append((args.state, json.dumps(state, sort_keys=True) + "\n"))
    for path, text in writes:
        try:
            write_atomic(path, text)
        except OSError as exc:
            print(
                f"gpu_health: could not write {path} ({exc.strerror}); check the folder exists and is writable.",
                file=sys.stderr,
            )
    sys.stdout.write(
        json.dumps(report, indent=2, sort_keys=True) + "\n" if args.format == "json" else render_text(report)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    now = time.time()
    try:
        report = run_check(args, now)
    except CouldNotCheck as exc:
        report = failed_report(now, exc)
    publish(report, args)
    return int(report["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
