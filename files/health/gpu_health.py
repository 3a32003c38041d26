"""GPU health check that each host runs between provisioning runs: ``python3 gpu_health.py``.

One run reads, each command under ``--timeout`` seconds (killed, with its children, when it hangs):

- ``nvidia-smi --query-gpu=<gpu_parsers.HEALTH_FIELDS> --format=csv,noheader,nounits`` (drivers that
  refuse the ``clocks_event_reasons.*`` names are asked again with ``clocks_throttle_reasons.*``; a field
  the driver names as not valid - 535.261.03's ``--help-query-gpu`` lacks ``remapped_rows.*`` - is left
  out and its check runs without it, named in ``skipped`` as ``partly: ...``; only a rejected identity
  field, index, pci.bus_id, uuid, name or driver_version, means could not check);
- ``nvidia-smi nvlink -s``;
- only when the baseline has ``mig_devices``: ``nvidia-smi -L``, whose MIG lines it counts;
- only when the ecc check has a finding, for each GPU it names: ``nvidia-smi -q -d
  ECC,PAGE_RETIREMENT,ROW_REMAPPER -i <bus id>``, whose remapped rows, retired pages and uncorrectable
  ECC counts end each of that GPU's ecc findings (gpu_health_checks.py). It never changes the verdict: when
  it fails or hangs (then the GPUs after it are not asked) the findings keep their cause as it was;
- the kernel log since the last check: ``journalctl -k --since @<epoch> -o short-monotonic
  --no-pager`` (``-b`` instead of ``--since`` on the first run), or ``dmesg`` when journalctl is
  missing or fails (then only lines after the last check's uptime count), or ``--kernel-log FILE``;
- ``/proc/driver/nvidia/version`` (the loaded kernel module);
- the PCI bus from sysfs: ``<--pci-devices>/<bus id>/{vendor,device,class}`` (default
  ``/sys/bus/pci/devices``), readable whether or not a driver is loaded;
- ``systemctl is-active nvidia-fabricmanager``, only where the baseline expects the fabric manager;
- each stack's venv (``lib/python3.*/site-packages/*.dist-info/METADATA``, read without running its
  Python) and its lock;
- the baseline (``--baseline``) and the Xid catalog (``data/xid.yml``, ``--xid-catalog``);
- only with ``--dcgm-diag LEVEL`` (1-4; off by default): NVIDIA DCGM's active diagnostic, ``dcgmi diag
  -r LEVEL -j`` (``--dcgmi``), under its own ``--dcgm-timeout`` (default 900 s: levels 3 and 4 take
  many minutes); past it the process group gets SIGTERM, on which dcgmi stops the diagnostic, and
  SIGKILL 30 s later. It runs last, and not when nvidia-smi could not list the GPUs.

It judges them with one pure function per check, each returning findings ``{"check", "bus_id",
"cause", "fix"}`` (bus_id None for the host): ``gpus`` (count, each bus id of the baseline, and the MIG
devices of ``nvidia-smi -L`` where the baseline has ``mig_devices``),
``pci`` (a GPU of the baseline gone from the PCI bus, a GPU on the bus that nvidia-smi does not
list, the count on the bus below expected_gpus), ``pcie`` (link width below its maximum or the
baseline; link generation maximum below the baseline), ``nvlink`` (active links below the
baseline), ``fabric_manager`` (not active where the baseline expects it), ``ecc`` (uncorrectable
volatile or aggregate errors, pages pending retirement, rows pending remapping, a remapping
failure), ``xid`` (each Xid, grouped by GPU and number, with the catalog's meaning and action),
``clocks`` (hardware slowdown, thermal slowdown or power brake active), ``persistence`` (off),
``driver`` (user space against the loaded kernel module, and against the baseline's pinned
version), ``venv`` (each stack's venv against its lock, or the venv or lock gone) and ``dcgm``
(with ``--dcgm-diag``: each failed result of DCGM's diagnostic, naming the test, the GPU and DCGM's
message; a diagnostic that hung past ``--dcgm-timeout`` or that DCGM could not complete). A field
the GPU does not report (``[N/A]``) is never a finding. The current PCIe *generation* is not
judged: the driver lowers it while the GPU idles (``nvidia-smi --help-query-gpu``,
``pcie.link.gen.current``). The pci, fabric manager, venv and dcgm checks are in
gpu_health_checks.py beside this file.

A check whose input cannot be read is *skipped*: neither a finding nor "could not check"; the report
names it with why (``skipped``). That is the pci check when the PCI folder cannot be read or lacks
a GPU that nvidia-smi lists (NVML lists only GPUs on the bus: a container sees another machine's
``/sys``), and the fabric_manager check when systemctl is missing, hangs or prints no unit state
(no systemd), and the dcgm check when dcgmi is not installed (``dcgmi not installed (NVIDIA
DCGM)``) or reaches no DCGM host engine (the note says how to start one). Checks that need
nvidia-smi's GPU list (gpus, pci, pcie, nvlink, ecc, clocks, persistence, dcgm) do not run when NVML
reports a driver/library version mismatch. A check the baseline asks nothing of (fabric_manager
without ``fabric_manager_expected``, venv without ``stacks``) does not run either, nor dcgm without
``--dcgm-diag``.

The JSON report (``--format json``) has ``dcgm``: None when the diagnostic did not run, else
``{"level": LEVEL, "tests": [{"category", "test", "result", "gpu", "info", "warnings"}, ...]}``, DCGM's
results as gpu_parsers.parse_dcgmi_diag reads them (``result`` ``Pass``, ``Fail``, ``Warn``, ``Skip``
or ``Not Run``; ``gpu`` DCGM's GPU id, nvidia-smi's index, or None; ``tests`` empty when the check was
skipped or the diagnostic hung). ``Warn`` results are listed in the text report, not findings.

Then it writes Prometheus metrics for node_exporter's textfile collector (``--textfile``, written to
a temporary file in the same folder, then renamed over the old one, so the collector never reads
half a file), prints a short report (or JSON with ``--format json``) and records the time of this
check (``--state``), so the next run reads the kernel log only from then on. Where no node_exporter on
the host reads the textfile's folder (gpu_health_checks.textfile_note), the report's ``notes`` (``[{"cause",
"fix"}]``, else []) say so; never a finding. The state is written
only when the check ran; after a run that could not check, the next one reads the same window again.
``--no-record`` only looks: neither the metrics nor the state are written, so the next recorded check
still reports every Xid since the last one (the ``gpu-health`` command the role installs passes it,
its timer ``--record`` after it; the last of the two wins).

``--intended JSON`` (``{"driver_version", "stacks", "removed_stacks"}``, what a provisioning run pins;
the role passes it, the timer never does): a driver the baseline pins otherwise and the host runs is
judged against the run's pin, a stack the run removes is not judged, and both, with the run's stacks
that the baseline lacks, are listed in the report's ``moved`` (``[{"what", "from", "to", "text"}]``,
[] otherwise) instead of as findings; the baseline follows once the verification passed.

Baseline (``--baseline``, JSON, written at the last passing verification; the ``#`` notes are not
part of the file)::

    {
      "schema": 1,
      "expected_gpus": 8,                    # GPUs nvidia-smi must list
      "driver_version": "550.54.15",        # the pinned driver; null: not judged
      "recorded_at": "2024-05-31T16:08:37Z", # written by --record-baseline; not read
      "gpus": {                              # by PCI bus id, in any form lspci or nvidia-smi prints
        "0000:18:00.0": {
          "pcie_link_gen_max": 5,            # all counts optional: null or absent is not judged
          "pcie_link_width_max": 16,
          "pcie_link_gen_current": 5,        # recorded, not judged (see above)
          "pcie_link_width_current": 16,
          "nvlink_active_links": 18,         # 0 or absent: no NVLink expected
          "fabric_manager_expected": true    # NVSwitch system: its links need nvidia-fabricmanager,
        }                                    # which must be active (on any GPU: checked for the host)
      },
      "mig_devices": 4,                      # optional; absent or null: not judged. The MIG devices
                                             # nvidia-smi -L lists (its "  MIG ..." lines), check gpus
      "stacks": {                            # optional; absent or {}: no venv is judged
        "tf-2.12": {                         # a TensorFlow stack's name
          "venv": "/opt/tensorflow/2.12",    # absolute paths
          "lock": "/opt/tensorflow/2.12/tf-lock.txt"   # optional, default <venv>/tf-lock.txt
        }
      }
    }

``--record-baseline`` writes that file (atomically: a temporary file renamed over it) from what the
host shows now: nvidia-smi's GPUs with their PCIe link and active NVLinks (``nvidia-smi nvlink
-s``), plus ``--expected-gpus N`` (required), ``--driver-version V`` (else null),
``--fabric-manager-expected`` (on every GPU), ``--mig-devices N`` (the MIG devices of the host's MIG layout,
which gpu_verify counted) and each ``--stack NAME=VENV[,LOCK]``. It records only
from a healthy host: when nvidia-smi lists other than N GPUs, or any check but xid (which reads the
kernel log since a last check) finds anything against the baseline it would write (a degraded PCIe
link, ECC errors pending, persistence off, a GPU off the PCI bus, the fabric manager down, a venv
off its lock, another driver than ``--driver-version``), it writes nothing, prints the findings and
exits 2. On success it prints the baseline (text, or JSON ``{"recorded", "path", "baseline",
"findings", "skipped"}``) and exits 0. ``--state``, ``--textfile``, ``--kernel-log`` and
``--dcgm-diag`` are not used in this mode.

State (``--state``): ``{"last_check_epoch": 1717171717.0, "last_check": "2024-05-31T16:08:37Z"}``.

Metrics (names ``gpu_fleet_health_*``, base units, ``_total`` only on counters; per-GPU series carry a
``bus_id`` label): each with its type, labels and meaning in the table "The health metrics" of
docs/monitoring.md, whose meanings are the HELP texts written here (tests/unit/monitoring/test_rules.py
keeps the table and :func:`render_metrics` equal). Format: "Exposition formats", text format
(https://prometheus.io/docs/instrumenting/exposition_formats/); names after "Metric and label
naming" (https://prometheus.io/docs/practices/naming/).

Exit codes: 0 healthy, 1 unhealthy (at least one finding; nvidia-smi hanging past ``--timeout`` is the
finding ``nvidia_smi``), 2 could not check (nvidia-smi missing or failing, the baseline, the Xid catalog
or the kernel log unreadable) or a usage error. nvidia-smi's exit status 9 is reported as "NVIDIA kernel
module not loaded" with the fix that gpu_parsers gives the preflight module and the verification too, the
container's steps first in a container (``/run/.containerenv`` or ``/.dockerenv``).
``--record-baseline``: 0 written, 2 refused, could not observe or not written, or a usage error.

Sources: nvidia-smi(1) (https://docs.nvidia.com/deploy/nvidia-smi/index.html) and ``nvidia-smi
--help-query-gpu`` for the fields; NVIDIA "XID Errors" (https://docs.nvidia.com/deploy/xid-errors/)
for the Xids; NVIDIA "GPU Memory Error Management"
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/, "Error Recovery and Response Flags") and
"Dynamic Page Retirement" (https://docs.nvidia.com/deploy/dynamic-page-retirement/) for pending
row remaps (a GPU reset applies them) and page retirements (a driver reload or reboot); the
sources of the pci, fabric manager, venv and dcgm checks are in gpu_health_checks.py. Standard
library only, Python 3.8+.

On a host, these files sit in one folder: gpu_health.py, gpu_health_checks.py, gpu_parsers.py and
gpu_lock.py (from plugins/module_utils) and xid.yml (data/xid.yml). In a clone, the modules of
plugins/module_utils are found through this file's place in the collection.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Dict, NamedTuple

try:
    import gpu_parsers
except ImportError:  # a clone of the collection: the shared parsers are in plugins/module_utils
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins", "module_utils"))
    import gpu_parsers
import gpu_health_checks as checks  # beside this file, in a clone and on a host
import gpu_metrics  # the Prometheus text format, shared with the controller's filters

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_COULD_NOT_CHECK = 2

CHECKS = (
    "nvidia_smi",
    "gpus",
    "pci",
    "pcie",
    "nvlink",
    "fabric_manager",
    "ecc",
    "xid",
    "clocks",
    "persistence",
    "driver",
    "venv",
    "dcgm",
)
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BASELINE = "/var/lib/gpu-health/baseline.json"
DEFAULT_STATE = "/var/lib/gpu-health/state.json"
DEFAULT_PROC_VERSION = "/proc/driver/nvidia/version"
DEFAULT_TIMEOUT = 20.0
DEFAULT_DCGM_TIMEOUT = 900.0
# dcgmi stops a running diagnostic when it gets SIGTERM and waits up to 25 s for it (dcgmi/Diag.cpp,
# ExecuteDiagOnServer, in https://github.com/NVIDIA/DCGM): the grace before SIGKILL.
DCGM_STOP_GRACE = 30.0
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
# The kernel log as the fixes name it; :func:`name_kernel_log` puts the file in its place where the check was told
# to read one (--kernel-log), as a host whose kernel log is a file may have no journal at all.
JOURNAL = "`journalctl -k`"
FIX_HANG = (
    f"A hanging nvidia-smi usually means a GPU in a bad state: look for Xid 79, 119 or 120 in {JOURNAL}, "
    "then drain the host and reset the GPU (`nvidia-smi -r`) or reboot."
)
FIX_KERNEL_LOG_FILE = (
    "Set gpu_health_kernel_log to the file this host's syslog writes kernel lines to (rsyslog: /var/log/kern.log), "
    "or leave it empty for the journal (journalctl -k, else dmesg), and rerun playbooks/verify.yml; by hand, pass a "
    "readable --kernel-log."
)
FIX_NVIDIA_SMI_FAILED = f"Run the command by hand and read its message, and look for NVRM lines in {JOURNAL}."
NO_BASELINE = (
    "no baseline at {path} yet: the host has not passed a verification (playbooks/verify.yml records one "
    "when it passes), so the GPU count and the PCI bus are not judged"
)
FIX_BASELINE = (
    "Run the GPU verification (the gpu_verify role), which writes the baseline when it passes, "
    "or pass --baseline with the path."
)
FIX_MIG = (
    "Someone changed the MIG instances by hand, or a GPU was reset: run playbooks/driver.yml with the host's "
    "gpu_mig_layout on idle GPUs (the gpu_mig role lays it out again)."
)
MIG_LINE = re.compile(r"^\s+MIG \S+\s+Device\s+\d+: \(UUID: MIG-")
FIX_GPU_MISSING = (
    f"Look for Xid 79 in {JOURNAL} and for the GPU in `lspci -d 10de:`; drain the host and "
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

Finding = Dict[str, Any]  # typing's generics: dict[...] outside annotations needs Python 3.9
finding = checks.finding


class CouldNotCheck(Exception):
    """The check could not run (exit status 2): ``cause`` and ``fix`` are one sentence each."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


class NvidiaSmiHung(CouldNotCheck):
    """nvidia-smi did not answer in time: a finding of the check ``nvidia_smi`` (exit status 1), as a GPU
    in a bad state keeps NVML waiting; the checks that need its answer do not run."""


class CommandTimeout(Exception):
    """A command was still running after its timeout and was killed."""


class CommandResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str


def stop_group(process: subprocess.Popen[str], grace: float) -> None:
    """SIGTERM the process group and wait ``grace`` seconds (none when 0), then SIGKILL it and wait one
    more second; a process stuck in the kernel outlives even SIGKILL, and is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 1.0)):
        if not wait:
            continue
        try:
            os.killpg(process.pid, sig)
        except OSError:
            pass
        try:
            process.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # it has exited: whatever is left of its group goes too
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
        return


def run_command(argv: Sequence[str], timeout: float, grace: float = 0.0) -> CommandResult:
    """Run ``argv``; kill it and its children when it runs longer than ``timeout`` seconds.

    The command gets its own process group, so a wrapper script's children die with it. With
    ``grace``, the group gets SIGTERM first and ``grace`` seconds to stop (dcgmi stops its diagnostic
    then), else SIGKILL at once. A process stuck in the kernel (nvidia-smi on a GPU that fell off the
    bus) does not die even of SIGKILL, so after one more second this gives up on it instead of waiting.

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
        stop_group(process, grace)
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
        raise NvidiaSmiHung(
            f"`{shown_command(argv)}` did not answer within {timeout:g} s and was killed.", FIX_HANG
        ) from None


def query_command(nvidia_smi: str, fields: Sequence[str]) -> list[str]:
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def shown_command(argv: Sequence[str]) -> str:
    """``argv`` as a cause quotes it: a ``--query-gpu`` list of many fields as its count, not the ~600
    characters of the names (the field that matters is named on its own)."""
    words = []
    for word in argv:
        head, equals, names = word.partition("=")
        count = len(names.split(",")) if equals and head == "--query-gpu" else 0
        words.append(f"--query-gpu=<{count} health fields>" if count > 3 else word)
    return " ".join(words)


def smi_failed(
    command: str, rc: int, output: str, markers: Sequence[str] = gpu_parsers.CONTAINER_MARKERS
) -> CouldNotCheck:
    """Why nvidia-smi failed and what to do: exit 9 is named and fixed in gpu_parsers (MODULE_NOT_LOADED,
    module_not_loaded_fix), the container's steps first where one of ``markers`` exists (a container)."""
    if rc == gpu_parsers.NVIDIA_SMI_MODULE_NOT_LOADED_RC:
        fix = gpu_parsers.module_not_loaded_fix(gpu_parsers.in_container(markers))
        return CouldNotCheck(
            f"`{command}` failed with exit status {rc} ({gpu_parsers.MODULE_NOT_LOADED}): {tail(output)}", fix
        )
    return CouldNotCheck(f"`{command}` failed with exit status {rc}: {tail(output)}", FIX_NVIDIA_SMI_FAILED)


# A field that nvidia-smi rejects ('Field "remapped_rows.pending" is not a valid field to query.': 535.261.03's
# --help-query-gpu lacks the remapped_rows fields) is left out of the query and its check runs without it, named
# in the report (``skipped``); only these fields are needed to list the GPUs at all.
INVALID_FIELD_NAMED = re.compile(r'Field "([^"]+)" is not a valid field to query')
IDENTITY_FIELDS = frozenset({"index", "pci.bus_id", "uuid", "name", "driver_version"})
# The check each other field serves, and what goes unjudged without it.
FIELD_CHECKS = {
    "persistence_mode": ("persistence", "persistence mode"),
    "pcie.": ("pcie", "the PCIe link"),
    "ecc.errors.": ("ecc", "uncorrectable ECC errors"),
    "retired_pages.pending": ("ecc", "pages pending retirement"),
    "remapped_rows.pending": ("ecc", "rows pending remapping"),
    "remapped_rows.failure": ("ecc", "row remapping failures"),
    "clocks_": ("clocks", "the clock event reasons"),
}


def field_check(field: str) -> tuple[str, str]:
    """(check, what it leaves unjudged) for a field of HEALTH_FIELDS outside IDENTITY_FIELDS."""
    return next(value for prefix, value in FIELD_CHECKS.items() if field.startswith(prefix))


def rejected_field(output: str, fields: Sequence[str]) -> str | None:
    """The field of ``fields`` that nvidia-smi names as not valid, or None."""
    named = INVALID_FIELD_NAMED.search(output)
    return named.group(1) if named and named.group(1) in fields else None


def ask_health_fields(nvidia_smi: str, timeout: float) -> tuple[CommandResult, list[str], list[str]]:
    """The query's result, the fields it asked and those nvidia-smi rejected (left out, at most once each): a
    rejected clocks_event_reasons name is asked again with every clock field under its old name
    (clocks_throttle_reasons), an identity field or an unnamed rejection ends the asking."""
    fields, dropped = list(gpu_parsers.HEALTH_FIELDS), []
    result = run_nvidia_smi(query_command(nvidia_smi, fields), timeout)
    while result.rc != 0 and INVALID_FIELD in result.stdout + result.stderr:
        field = rejected_field(result.stdout + result.stderr, fields)
        renamed = [name.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for name in fields]
        if (field is None or field.startswith("clocks_event_reasons.")) and renamed != fields:
            fields = renamed  # a driver that predates clocks_event_reasons (or names no field)
        elif field is not None and field not in IDENTITY_FIELDS:
            fields.remove(field)
            dropped.append(field)
        else:
            break
        result = run_nvidia_smi(query_command(nvidia_smi, fields), timeout)
    return result, fields, dropped


def unasked_notes(dropped: Sequence[str], version: str | None) -> dict[str, str]:
    """``{check: note}`` for the checks that ran without a field nvidia-smi rejected (``partly: ...``), and for
    those none of whose fields it knows (an older driver, or the previous release's stand-in on a host upgraded
    in place), which do not run at all (:func:`unjudged_checks`)."""
    fields: dict[str, list[str]] = {}
    whats: dict[str, list[str]] = {}
    for field in dropped:
        check, what = field_check(field.replace("clocks_throttle_reasons.", "clocks_event_reasons."))
        fields.setdefault(check, []).append(field)
        whats.setdefault(check, []).extend([] if what in whats.get(check, []) else [what])
    needed: dict[str, int] = {}
    for field in gpu_parsers.HEALTH_FIELDS:
        if field not in IDENTITY_FIELDS:
            needed[field_check(field)[0]] = needed.get(field_check(field)[0], 0) + 1
    driver = f" of driver {version}" if version else ""
    notes = {}
    for check, names in fields.items():
        known = f"nvidia-smi{driver} does not know the field{'s' if len(names) > 1 else ''} {', '.join(names)}"
        what = ", ".join(whats[check])
        if len(names) >= needed[check]:
            notes[check] = f"{known} ({what}): the check did not run"
        else:
            notes[check] = f"partly: {known}, so {what} {'is' if len(whats[check]) == 1 else 'are'} not judged; "
            notes[check] += "the rest of the check ran"
    return notes


def unjudged_checks(observed: dict[str, Any]) -> set[str]:
    """The checks none of whose fields nvidia-smi knows (:func:`unasked_notes`): skipped, never passed."""
    return {check for check, note in (observed.get("unasked") or {}).items() if not note.startswith("partly:")}


def query_gpus(
    nvidia_smi: str, timeout: float, markers: Sequence[str] = gpu_parsers.CONTAINER_MARKERS
) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None, dict[str, str]]:
    """The GPUs as ``gpu_parsers.parse_health_query`` gives them (a field nvidia-smi rejected is None, as one
    not reported), None and the notes of the checks that ran without a rejected field (:func:`unasked_notes`);
    or None, ``{"library_version", "output"}`` when NVML reports a driver/library version mismatch, and {}.
    ``markers``: the files that tell a container (gpu_parsers.CONTAINER_MARKERS), for exit 9's fix.

    Raises:
        CouldNotCheck: nvidia-smi is missing, hangs, fails otherwise (an identity field rejected: named) or
            answers in an unknown form.
    """
    result, fields, dropped = ask_health_fields(nvidia_smi, timeout)
    output = result.stdout + result.stderr
    if MISMATCH in output.lower():
        version = NVML_LIBRARY_VERSION.search(output)
        return None, {"library_version": version.group(1) if version else None, "output": tail(output, 200)}, {}
    if result.rc != 0 and NO_DEVICES not in output.lower():
        field = rejected_field(output, fields)
        if field is not None:
            cause = (
                f"nvidia-smi does not know the field {field}, which the check needs to list the GPUs: {tail(output)}"
            )
            raise CouldNotCheck(cause, FIX_NVIDIA_SMI_FAILED)
        raise smi_failed(shown_command(query_command(nvidia_smi, fields)), result.rc, output, markers)
    try:
        gpus = gpu_parsers.parse_health_query(result.stdout, fields)
    except ValueError as exc:
        raise CouldNotCheck(
            f"The answer of nvidia-smi is in a form this check does not know: {exc}.",
            "Run the query by hand; a driver update may have changed the output, which gpu_parsers.py must then follow.",
        ) from None
    keys = [field.replace("clocks_throttle_reasons.", "clocks_event_reasons.").replace(".", "_") for field in dropped]
    for gpu in gpus:
        gpu.update(dict.fromkeys(keys))
    version = next((gpu["driver_version"] for gpu in gpus if gpu.get("driver_version")), None)
    return gpus, None, unasked_notes(dropped, version)


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


def since_last_check(events: list[dict[str, Any]], since_epoch: float | None) -> list[dict[str, Any]]:
    """The events of a whole kernel log (dmesg, a file) stamped after the last check: their seconds
    since boot against the last check's (all of them on a first run or without /proc/uptime)."""
    booted = boot_epoch() if since_epoch else None
    return events_after(events, since_epoch - booted if since_epoch and booted else None)


def read_kernel_log(path: str | None, since_epoch: float | None, timeout: float) -> list[dict[str, Any]]:
    """The Xid events of the kernel log since the last check (all of ``path`` when given).

    Raises:
        CouldNotCheck: the file is unreadable, or neither journalctl nor dmesg answers.
    """
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return since_last_check(gpu_parsers.parse_xid_events(handle.read()), since_epoch)
        except OSError as exc:
            raise CouldNotCheck(
                f"The kernel log {path} (--kernel-log; the role's gpu_health_kernel_log) could not be read "
                f"({exc.strerror}).",
                FIX_KERNEL_LOG_FILE,
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
            return since_last_check(events, since_epoch) if argv[0] == "dmesg" else events
    raise CouldNotCheck(
        "The kernel log could not be read: neither `journalctl -k` nor `dmesg` answered.",
        "Run the check as root (dmesg needs it where kernel.dmesg_restrict is 1) or pass --kernel-log.",
    )


def name_kernel_log(outcome: dict[str, Any], path: str | None) -> dict[str, Any]:
    """The outcome (a report, or --record-baseline's) with each fix that says where to look for kernel lines naming
    ``path``, the kernel log file this check was told to read (--kernel-log), instead of :data:`JOURNAL`."""
    if not path:
        return outcome
    where = f"the kernel log {path}"
    named = [{**item, "fix": item["fix"].replace(JOURNAL, where)} for item in outcome.get("findings") or []]
    error = outcome.get("error")
    error = {**error, "fix": error["fix"].replace(JOURNAL, where)} if isinstance(error, dict) else error
    return {**outcome, "findings": named, **({"error": error} if "error" in outcome else {})}


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
    mig = document.get("mig_devices")
    if mig is not None and not _is_count(mig):
        raise ValueError(f"mig_devices is {mig!r}, not a whole number >= 0 or null")
    gpus = document.get("gpus")
    gpus = {} if gpus is None else gpus
    if not isinstance(gpus, dict):
        raise ValueError("gpus is not an object keyed by PCI bus id")
    return {
        "expected_gpus": expected,
        "driver_version": driver,
        "mig_devices": mig,
        "gpus": {gpu_parsers.normalize_bus_id(bus): _baseline_gpu(bus, entry) for bus, entry in gpus.items()},
        "stacks": checks.validate_stacks(document.get("stacks")),
    }


def load_baseline(path: str) -> dict[str, Any] | None:
    """:func:`validate_baseline` of the JSON file at ``path``; None when there is none yet (a host not
    verified yet: the checks that need one are skipped).

    Raises:
        CouldNotCheck: the file is unreadable, not JSON or not a baseline.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            return validate_baseline(json.load(handle))
    except FileNotFoundError:
        return None
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


def count_mig_devices(nvidia_smi: str, timeout: float) -> int:
    """The MIG devices of ``nvidia-smi -L``: one ``  MIG <profile> Device <n>: (UUID: MIG-...)`` line each, under
    its GPU (NVIDIA Multi-Instance GPU User Guide, https://docs.nvidia.com/datacenter/tesla/mig-user-guide/,
    "Getting Started with MIG")."""
    result = run_nvidia_smi([nvidia_smi, "-L"], timeout)
    if result.rc != 0:
        raise smi_failed(f"{nvidia_smi} -L", result.rc, result.stdout + result.stderr)
    return sum(1 for line in result.stdout.splitlines() if MIG_LINE.match(line))


def judge_mig(observed: int | None, baseline: dict[str, Any]) -> list[Finding]:
    """The MIG devices against the baseline's ``mig_devices`` (check gpus); none judged without one."""
    expected = baseline.get("mig_devices")
    if expected is None or observed is None or observed == expected:
        return []
    cause = f"nvidia-smi -L lists {observed} MIG devices; the baseline (the host's MIG layout) expects {expected}."
    return [finding("gpus", None, cause, FIX_MIG)]


def _width_references(width_max: int | None, baseline_width: int | None) -> str:
    references = [f"link maximum x{width_max}"] if width_max is not None else []
    references += [f"x{baseline_width} at the last verification"] if baseline_width is not None else []
    return ", ".join(references)


def judge_pcie(
    gpus: list[dict[str, Any]], baseline: dict[str, Any], verified: dict[str, Any] | None = None
) -> list[Finding]:
    """Link width below the link's maximum or the baseline; generation maximum below the baseline. ``verified``:
    the widths the last verification recorded, by bus id, where ``baseline`` is not that (--record-baseline
    judges against the baseline it would write, whose width is the one now)."""
    findings = []
    for gpu in gpus:
        bus_id, base = gpu["pci_bus_id"], baseline["gpus"].get(gpu["pci_bus_id"], {})
        width, width_max = gpu["pcie_link_width_current"], gpu["pcie_link_width_max"]
        references = [width_max, base.get("pcie_link_width_current"), base.get("pcie_link_width_max")]
        wanted = max((value for value in references if value is not None), default=None)
        last = base.get("pcie_link_width_current") if verified is None else verified.get(bus_id)
        if width is not None and wanted is not None and width < wanted:
            known = _width_references(width_max, last)
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


def same_version(version: str | None, pinned: str | None) -> bool:
    """Whether ``version`` is the pinned driver; NVML names only ``major.minor`` on a mismatch."""
    return bool(version and pinned and (version == pinned or pinned.startswith(version + ".")))


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
    if findings and same_version(user_space, pinned):
        return findings  # the pinned driver is installed: the reboot of the fix above loads it
    if pinned and running and not same_version(running, pinned):
        cause = f"Driver {running} is loaded; the baseline (the last passing verification) pins {pinned}."
        findings.append(finding("driver", None, cause, FIX_DRIVER_PIN))
    return findings


def judge_host(observed: dict[str, Any], baseline: dict[str, Any]) -> dict[str, list[Finding]]:
    """The checks of gpu_health_checks that the baseline asks for and the observations allow: pci
    (with the GPUs nvidia-smi lists), fabric_manager (where expected), venv (with stacks) and dcgm
    (with --dcgm-diag)."""
    results = {"venv": checks.judge_venv(observed.get("stacks") or {})} if baseline["stacks"] else {}
    if observed["gpus"] is not None and observed.get("pci") is not None and baseline["expected_gpus"] is not None:
        results["pci"] = checks.judge_pci(observed["gpus"], observed["pci"], baseline)
    fabric = observed.get("fabric_manager") or {}
    if checks.fabric_manager_expected(baseline) and fabric.get("state"):
        driver = observed["module_version"] or user_space_version(observed["gpus"], observed["mismatch"])
        results["fabric_manager"] = checks.judge_fabric_manager(fabric["state"], driver)
    if observed.get("dcgm") and not observed["dcgm"]["note"]:  # run (--dcgm-diag) and not skipped
        results["dcgm"] = checks.judge_dcgm(observed["dcgm"], observed["gpus"])
    return results


def skipped_checks(observed: dict[str, Any]) -> dict[str, str]:
    """The checks whose input could not be read (wholly, or a field nvidia-smi does not know), and why:
    {check: note}."""
    notes = {
        **(observed.get("unasked") or {}),
        "pci": observed.get("pci_note"),
        "fabric_manager": (observed.get("fabric_manager") or {}).get("note"),
        "dcgm": (observed.get("dcgm") or {}).get("note"),
    }
    return {check: note for check, note in notes.items() if note}


def judge(
    observed: dict[str, Any],
    baseline: dict[str, Any],
    catalog: dict[str, Any],
    verified: dict[str, Any] | None = None,
) -> dict[str, list[Finding]]:
    """Every check that the observations allow, in :data:`CHECKS` order: {check: findings} (``verified``:
    :func:`judge_pcie`'s)."""
    gpus = observed["gpus"]
    results = {
        "xid": judge_xid(observed["xid_events"], catalog),
        "driver": judge_driver(gpus, observed["module_version"], baseline, observed["mismatch"]),
        **judge_host(observed, baseline),
    }
    if gpus is not None:  # None: nvidia-smi could not talk to the driver, only the checks above apply
        results.update(
            nvidia_smi=[],  # it answered (a hang ends the check before: hung_report)
            **(
                {"gpus": judge_gpus(gpus, baseline) + judge_mig(observed.get("mig_devices"), baseline)}
                if baseline["expected_gpus"] is not None
                else {}
            ),
            pcie=judge_pcie(gpus, baseline, verified),
            nvlink=judge_nvlink(gpus, observed["nvlink"], observed["nvlink_error"], baseline),
            ecc=judge_ecc(gpus),
            clocks=judge_clocks(gpus),
            persistence=judge_persistence(gpus),
        )
    unjudged = unjudged_checks(observed)
    return {check: results[check] for check in CHECKS if check in results and check not in unjudged}


def read_fabric_manager(systemctl: str, timeout: float) -> dict[str, str | None]:
    """``{"state", "note"}`` of nvidia-fabricmanager (:func:`gpu_health_checks.fabric_manager_answer`);
    a missing or hanging systemctl gives no state and a note."""
    argv = [systemctl, "is-active", checks.FABRIC_MANAGER_UNIT]
    try:
        result = run_command(argv, timeout)
    except OSError as exc:
        return {"state": None, "note": f"`{argv[0]}` could not be run ({exc.strerror})"}
    except CommandTimeout:
        return {"state": None, "note": f"`{' '.join(argv)}` did not answer within {timeout:g} s"}
    return checks.fabric_manager_answer(" ".join(argv), result.stdout, result.stderr)


def observe_devices(
    args: argparse.Namespace, fabric_expected: bool, stacks: dict[str, Any], mig: bool = False
) -> dict[str, Any]:
    """nvidia-smi, the loaded module, the PCI bus, the fabric manager (asked only when expected), the MIG devices
    (counted only with ``mig``) and the stacks' venvs (``{name: {"venv", "lock"}}``): what both the check and
    --record-baseline read."""
    gpus, mismatch, unasked = query_gpus(args.nvidia_smi, args.timeout)
    nvlink, nvlink_error = read_nvlink(args.nvidia_smi, args.timeout) if gpus else (None, None)
    listed = [gpu["pci_bus_id"] for gpu in gpus or []]
    pci, pci_note = checks.pci_gpus(args.pci_devices, listed) if gpus is not None else (None, None)
    fabric = read_fabric_manager(args.systemctl, args.timeout) if fabric_expected else None
    return {
        "gpus": gpus,
        "mismatch": mismatch,
        "nvlink": nvlink,
        "nvlink_error": nvlink_error,
        "module_version": read_module_version(args.proc_version),
        "pci": pci,
        "pci_note": pci_note,
        "fabric_manager": fabric,
        "unasked": unasked,
        "mig_devices": count_mig_devices(args.nvidia_smi, args.timeout) if mig and gpus else None,
        "stacks": {name: checks.read_stack(stack["venv"], stack["lock"]) for name, stack in stacks.items()},
    }


def observe(args: argparse.Namespace, since_epoch: float | None, baseline: dict[str, Any]) -> dict[str, Any]:
    """Everything the checks read from this host (see the module docstring)."""
    mig = baseline.get("mig_devices") is not None
    observed = observe_devices(args, checks.fabric_manager_expected(baseline), baseline["stacks"], mig)
    observed["xid_events"] = read_kernel_log(args.kernel_log, since_epoch, args.timeout)
    level = getattr(args, "dcgm_diag", None)
    observed["dcgm"] = (
        read_dcgm(args.dcgmi, level, args.dcgm_timeout) if level and observed["gpus"] is not None else None
    )
    return observed


def read_ecc_details(nvidia_smi: str, bus_ids: Sequence[str], timeout: float) -> dict[str, str]:
    """``{bus_id: words}``: each GPU's memory error state from ``nvidia-smi -q -d ... -i <bus id>``
    (:func:`gpu_health_checks.ecc_detail_answer`). A GPU whose command fails has none; after one that does
    not answer in time the rest are not asked, as one GPU in a bad state keeps all of NVML waiting."""
    details = {}
    for bus_id in bus_ids:
        try:
            result = run_command(checks.ecc_detail_command(nvidia_smi, bus_id), timeout)
        except OSError:
            continue
        except CommandTimeout:
            break
        words = checks.ecc_detail_answer(bus_id, result.rc, result.stdout)
        if words:
            details[bus_id] = words
    return details


def explain_ecc(results: dict[str, list[Finding]], nvidia_smi: str, timeout: float) -> dict[str, list[Finding]]:
    """The results with each ecc finding's cause followed by its GPU's memory details; nvidia-smi -q runs
    only for the GPUs that have ecc findings, so a host without any runs nothing more."""
    findings = results.get("ecc") or []
    bus_ids = list(dict.fromkeys(item["bus_id"] for item in findings if item["bus_id"]))
    if not bus_ids:
        return results
    return {**results, "ecc": checks.with_ecc_details(findings, read_ecc_details(nvidia_smi, bus_ids, timeout))}


def read_dcgm(dcgmi: str, level: int, timeout: float) -> dict[str, Any]:
    """Run DCGM's diagnostic, ``dcgmi diag -r LEVEL -j``, and read its answer
    (:func:`gpu_health_checks.dcgm_answer`); stopped past ``timeout``, SIGTERM first."""
    argv = checks.dcgm_command(dcgmi, level)
    try:
        result = run_command(argv, timeout, grace=DCGM_STOP_GRACE)
    except OSError as exc:
        return checks.dcgm_unstarted(
            level, " ".join(argv), isinstance(exc, FileNotFoundError), exc.strerror or str(exc)
        )
    except CommandTimeout:
        return checks.dcgm_hung(level, " ".join(argv), timeout)
    return checks.dcgm_answer(level, " ".join(argv), result.rc, result.stdout, result.stderr)


def _unlisted_rows(listed: set[str], on_bus: set[str] | None, baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the GPUs nvidia-smi does not list: the baseline's, then those only on the PCI bus."""
    rows = [
        {"pci_bus_id": bus_id, "present": False, "nvlink_expected_links": base.get("nvlink_active_links")}
        for bus_id, base in sorted(baseline["gpus"].items())
        if bus_id not in listed
    ]
    rows += [
        {"pci_bus_id": bus_id, "present": False}
        for bus_id in sorted((on_bus or set()) - listed - set(baseline["gpus"]))
    ]
    return rows


def gpu_rows(observed: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs for the report and the metrics: those nvidia-smi lists, then the baseline's missing
    ones and those on the PCI bus that it does not list; ``on_pci_bus`` None when the bus was not read."""
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
    on_bus = set(observed["pci"]) if observed.get("pci") is not None else None
    if observed["gpus"] is not None:
        rows += _unlisted_rows({row["pci_bus_id"] for row in rows}, on_bus, baseline)
    for row in rows:
        row["on_pci_bus"] = None if on_bus is None else row["pci_bus_id"] in on_bus
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
        "skipped": skipped_checks(observed),
        "findings": findings,
        "gpus": gpu_rows(observed, baseline),
        "driver": {
            "user_space": user_space_version(observed["gpus"], observed["mismatch"]),
            "kernel_module": observed["module_version"],
            "baseline": baseline["driver_version"],
        },
        "xid_events": observed["xid_events"],
        "dcgm": checks.dcgm_report(observed.get("dcgm")),
    }


def hung_report(now: float, error: NvidiaSmiHung) -> dict[str, Any]:
    """The outcome of a check whose nvidia-smi hung: the finding ``nvidia_smi``, exit status 1."""
    found = finding("nvidia_smi", None, error.cause, error.fix)
    return {
        **failed_report(now, error),
        **{"up": True, "healthy": False, "exit_code": EXIT_UNHEALTHY, "error": None},
        **{"checks": {"nvidia_smi": False}, "findings": [found]},
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
        "skipped": {},
        "findings": [],
        "gpus": [],
        "driver": {},
        "xid_events": [],
        "dcgm": None,
        "moved": [],
    }


# (metric, key of a gpu_rows() row, type, help): one series per GPU, labelled with its bus id.
GPU_METRICS = (
    (
        "gpu_fleet_health_gpu_present",
        "present",
        "gauge",
        "1 when nvidia-smi lists the GPU, 0 when the baseline expects it or the PCI bus has it and it is not listed.",
    ),
    (
        "gpu_fleet_health_gpu_on_pci_bus",
        "on_pci_bus",
        "gauge",
        "1 when the GPU is on the PCI bus (sysfs), 0 when the baseline expects it there and it is gone.",
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
        "1 when memory pages wait for retirement (a driver reload or reboot applies it).",
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

Sample = gpu_metrics.Sample
Family = gpu_metrics.Family


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
            "gpu_fleet_health_check_skipped",
            "gauge",
            "1 when the check was skipped, wholly or partly, because its input could not be read; the report says why.",
            [({"check": check}, 1) for check in report.get("skipped") or {}],
        ),
        (
            "gpu_fleet_health_driver_info",
            "gauge",
            "Driver versions: user space, loaded kernel module, pinned in the baseline.",
            [({key: driver.get(key) or "" for key in ("user_space", "kernel_module", "baseline")}, 1)]
            if report["driver"]
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
        (
            "gpu_fleet_health_xid_events",
            "gauge",
            "Xid events in the kernel log since the previous recorded check.",
            samples,
        )
    )
    help_text = "1 when the DCGM diagnostic's test passed on the GPU, 0 when it failed (gpu empty: the test overall)."
    families.append(("gpu_fleet_health_dcgm_test_passed", "gauge", help_text, checks.dcgm_samples(report.get("dcgm"))))
    return families


def render_metrics(report: dict[str, Any]) -> str:
    """The report in the Prometheus text exposition format (``gpu_metrics.render``): HELP and TYPE, then
    the samples of each family; families without samples are left out (up and the run's time never are)."""
    return gpu_metrics.render(_run_families(report) + _gpu_families(report))


def render_text(report: dict[str, Any]) -> str:
    """The short report for people."""
    notes = "".join(f"  [note] {item['cause']}\n      Fix: {item['fix']}\n" for item in report.get("notes") or [])
    if not report["up"]:
        return f"gpu_health: COULD NOT CHECK: {report['error']['cause']}\n  Fix: {report['error']['fix']}\n" + notes
    present = sum(1 for row in report["gpus"] if row.get("present"))
    listed = f"{present} GPU(s)" if "nvidia_smi" in report["checks"] else "GPUs not listed (nvidia-smi failed)"
    driver = report["driver"].get("kernel_module") or report["driver"].get("user_space") or "unknown"
    verdict = "healthy" if report["healthy"] else f"UNHEALTHY, {len(report['findings'])} finding(s)"
    lines = [
        f"gpu_health: {verdict}: {listed}, driver {driver}, "
        f"{len(report['xid_events'])} Xid event(s) since the last check; checked {report['checked_at']}"
    ]
    lines += outcome_lines(report["findings"], report.get("skipped") or {}) + checks.dcgm_lines(report.get("dcgm"))
    return "\n".join(lines + moved_lines(report.get("moved") or [])) + "\n" + notes


LOOKED_ONLY = (
    "  (looked only, --no-record: the metrics and the time of this check were not written, so the next recorded "
    "check - the timer's - still reports the Xids since the last one; `gpu-health --record` writes them)"
)
MOVED_HEAD = "moved on purpose by this run, judged against its pins (the baseline follows once the verification passes)"


def moved_lines(moved: list[dict[str, Any]]) -> list[str]:
    """What the provisioning run moved on purpose (--intended), one line."""
    return [f"  [moved] {MOVED_HEAD}: {'; '.join(item['text'] for item in moved)}"] if moved else []


def outcome_lines(findings: list[Finding], skipped: dict[str, str]) -> list[str]:
    """Each finding with its fix, then each skipped check with why."""
    lines = []
    for item in findings:
        lines += [f"  [{item['check']}] {item['bus_id'] or 'host'}: {item['cause']}", f"      Fix: {item['fix']}"]
    return lines + [f"  [{check}] skipped: {note}" for check, note in skipped.items()]


NAME = """\
NAME
  gpu-health - check this host's NVIDIA GPUs, and its TensorFlow venvs, against a baseline
  (gpu_health.py; the gpu_health role installs it as the command gpu-health, which passes this
  host's --baseline, --state, --textfile, --timeout, --nvidia-smi, --pci-devices, --kernel-log and
  --no-record: by hand it only looks, its timer passes --record)

"""
SYNOPSIS = """\
%(prog)s [--baseline FILE] [--state FILE] [--textfile FILE] [--format text|json] [OPTION]...
  %(prog)s --record-baseline --expected-gpus N [--driver-version V] [--fabric-manager-expected]
      [--stack NAME=VENV[,LOCK]]... [--baseline FILE] [--format text|json] [OPTION]..."""

DESCRIPTION = """\
DESCRIPTION
  Checks this host's NVIDIA GPUs between provisioning runs against the baseline that the last
  passing verification wrote: GPU count and bus ids, the GPUs on the PCI bus against those
  nvidia-smi lists, PCIe link width and generation, NVLinks, nvidia-fabricmanager on NVSwitch
  systems, uncorrectable ECC errors with pending page retirements and row remaps, Xid errors in
  the kernel log since the last check, clock slowdowns, persistence mode, the driver (user space
  against the loaded kernel module, and against the pinned version), and each TensorFlow stack's
  venv against its lock. Prints a short report (or JSON), writes Prometheus metrics for
  node_exporter's textfile collector and records the time of the check for the next run
  (--no-record: neither, it only looks; the gpu-health command by hand only looks, its timer
  records). A check whose input cannot be read (the PCI folder, systemd) is skipped, and the
  report says why.

  --dcgm-diag LEVEL also runs NVIDIA DCGM's active diagnostic, `dcgmi diag -r LEVEL -j`, and
  reports each test's result per GPU: a failed test is a finding (test, GPU, DCGM's message), a
  warning is listed, a diagnostic still running after --dcgm-timeout is stopped and is a finding.
  Without dcgmi, or without a DCGM host engine (nv-hostengine), the check is skipped. Level 1 takes
  seconds, 2 about two minutes, 3 about 15 minutes, 4 longer, and they load the GPUs: run levels
  3-4 on a drained host.

  --record-baseline writes the baseline instead (atomically, to --baseline) from what the host
  shows now: each GPU's bus id, PCIe link and active NVLinks, with --expected-gpus, the pinned
  --driver-version, --fabric-manager-expected and each --stack. A baseline is only recorded from
  a healthy host: it refuses (exit 2, nothing written) when nvidia-smi lists a number of GPUs other
  than --expected-gpus, or when any check but the kernel log's Xids finds anything against the
  baseline it would write. It prints the baseline it wrote.
"""

EPILOG = f"""\
EXIT STATUS
  0  healthy: every check passed (--record-baseline: the baseline was written)
  1  unhealthy: at least one finding; each names its cause and its fix (nvidia-smi hanging
     past --timeout is the finding nvidia_smi: killed, the GPUs could not be read)
  2  could not check: nvidia-smi missing or failing, or the baseline, the Xid catalog or the
     kernel log unreadable (the metrics say gpu_fleet_health_up 0);
     --record-baseline: refused (the host is not healthy) or the baseline not written;
     also a usage error

FILES
  {DEFAULT_BASELINE:<36}the baseline (--baseline); its schema is in this file's docstring
  {DEFAULT_STATE:<36}the time of the last check (--state)
  {DEFAULT_PROC_VERSION:<36}the loaded kernel module's version (--proc-version)
  {checks.DEFAULT_PCI_DEVICES:<36}the PCI bus (--pci-devices)
  {"xid.yml beside this script":<36}the Xid catalog (--xid-catalog); data/xid.yml in a clone

SEE ALSO
  nvidia-smi(1), journalctl(1), dmesg(1), systemctl(1); NVIDIA "XID Errors", {XID_DOC_URL};
  NVIDIA Fabric Manager User Guide, https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/;
  NVIDIA DCGM, "dcgmi diag",
  https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html,
  and DCGM User Guide, Diagnostics, https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html
"""


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0 and below 3600 seconds")
    return value


def gpu_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not at least 1")
    return value


def mig_count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def driver_version(text: str) -> str:
    if not re.match(r"^\d+(?:\.\d+)+$", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a driver version such as 550.54.15")
    return text


def dcgm_level(text: str) -> int:
    """A DCGM diagnostic level: 1 quick, 2 medium, 3 long, 4 extended (``dcgmi diag --help``)."""
    if text not in ("1", "2", "3", "4"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a DCGM diagnostic level, 1 to 4")
    return int(text)


def dcgm_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0 and below 86400 seconds (a day)")
    return value


def intended_option(text: str) -> dict[str, Any]:
    """``--intended``'s JSON -> ``{"driver_version": str or None, "stacks": [names], "removed_stacks": [names]}``."""
    try:
        document = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON") from None
    if not isinstance(document, dict) or set(document) - {"driver_version", "stacks", "removed_stacks"}:
        raise argparse.ArgumentTypeError(f"{text!r} is not an object of driver_version, stacks and removed_stacks")
    driver = document.get("driver_version")
    if driver is not None and not re.match(r"^\d+(?:\.\d+)+$", str(driver)):
        raise argparse.ArgumentTypeError(f"driver_version {driver!r} is not a driver version such as 550.54.15")
    lists = {key: document.get(key) or [] for key in ("stacks", "removed_stacks")}
    for key, names in lists.items():
        if not isinstance(names, list) or not all(isinstance(name, str) and name for name in names):
            raise argparse.ArgumentTypeError(f"{key} is {names!r}, not a list of stack names")
    return {"driver_version": str(driver) if driver is not None else None, **lists}


def stack_option(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=VENV[,LOCK]`` -> (name, {"venv", "lock"}); the lock defaults to VENV/tf-lock.txt."""
    name, equals, paths = text.partition("=")
    venv, _comma, lock = paths.partition(",")
    if not (name and equals and venv):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VENV[,LOCK]")
    try:
        return name, checks.validate_stacks({name: {"venv": venv, "lock": lock} if lock else {"venv": venv}})[name]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


class ManPageParser(argparse.ArgumentParser):
    """The help as a man page: NAME, SYNOPSIS (argparse's usage), DESCRIPTION, OPTIONS, ..."""

    def format_help(self) -> str:
        return NAME + super().format_help().replace("usage: ", "SYNOPSIS\n  ", 1)


def _add_record_options(add: Any) -> None:
    add("--record-baseline", action="store_true", help="write the baseline from this host's state now (see above)")
    add(
        "--expected-gpus",
        metavar="N",
        type=gpu_count,
        help="with --record-baseline (required): GPUs nvidia-smi must list",
    )
    add("--driver-version", metavar="V", type=driver_version, help="with --record-baseline: the driver version to pin")
    add(
        "--mig-devices",
        metavar="N",
        type=mig_count,
        help="with --record-baseline: MIG devices nvidia-smi -L must list (the host's MIG layout)",
    )
    add(
        "--fabric-manager-expected",
        action="store_true",
        help="with --record-baseline: an NVSwitch system, whose nvidia-fabricmanager must be active",
    )
    add(
        "--stack",
        metavar="NAME=VENV[,LOCK]",
        type=stack_option,
        action="append",
        help="with --record-baseline, repeatable: a TensorFlow stack's venv and lock (default: VENV/tf-lock.txt)",
    )


def _add_look_options(add: Any) -> None:
    add(
        "--no-record",
        dest="record",
        action="store_false",
        default=True,
        help="look only: write neither --textfile nor --state, so the next recorded check still reports the Xids "
        "logged since the last one (the gpu-health command's default; its timer passes --record)",
    )
    add(
        "--record",
        dest="record",
        action="store_true",
        default=True,
        help="write the metrics and the time of this check (the default of gpu_health.py; the last of the two wins)",
    )
    add(
        "--intended",
        metavar="JSON",
        type=intended_option,
        help='what the running provisioning run pins, {"driver_version": V, "stacks": [NAME...], "removed_stacks": '
        "[NAME...]}: a driver or stack it moved on purpose is reported as moved, not as drift (the role passes it)",
    )


def _add_dcgm_options(add: Any) -> None:
    add(
        "--dcgm-diag",
        metavar="LEVEL",
        type=dcgm_level,
        help="also run NVIDIA DCGM's diagnostic at LEVEL, 1-4: `dcgmi diag -r LEVEL -j` (default: not run)",
    )
    add(
        "--dcgm-timeout",
        metavar="SECONDS",
        type=dcgm_seconds,
        default=DEFAULT_DCGM_TIMEOUT,
        help="limit for the DCGM diagnostic; levels 3-4 take many minutes (default: %(default)g)",
    )
    add("--dcgmi", metavar="PATH", default="dcgmi", help="the dcgmi to run (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = ManPageParser(
        prog="gpu-health",
        usage=SYNOPSIS,
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
    add(
        "--pci-devices",
        metavar="DIR",
        default=checks.DEFAULT_PCI_DEVICES,
        help="the PCI bus in the sysfs layout, <DIR>/<bus id>/{vendor,device,class} (default: %(default)s)",
    )
    add("--systemctl", metavar="PATH", default="systemctl", help="the systemctl to ask (default: %(default)s)")
    _add_look_options(add)
    _add_dcgm_options(add)
    _add_record_options(add)
    return parser


def check_mode_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors (exit 2) that argparse cannot see: the options of --record-baseline."""
    if args.record_baseline and args.expected_gpus is None:
        parser.error("--record-baseline needs --expected-gpus N, the number of GPUs this host must have")
    record_only = (args.expected_gpus, args.driver_version, args.fabric_manager_expected, args.stack)
    if not args.record_baseline and (any(value for value in record_only) or args.mig_devices is not None):
        parser.error(
            "--expected-gpus, --driver-version, --fabric-manager-expected, --mig-devices and --stack go with "
            "--record-baseline"
        )
    if args.record_baseline and args.intended is not None:
        parser.error("--intended goes with the check, not with --record-baseline")
    names = [name for name, _stack in args.stack or []]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        parser.error(f"--stack {twice[0]} is given more than once")


def intended_stacks(baseline: dict[str, Any], intended: dict[str, Any] | None) -> tuple[dict[str, Any], list[dict]]:
    """The baseline less the stacks the run removes on purpose (not judged), and what moved: those stacks, and the
    run's stacks that the baseline does not have yet (judged once the verification recorded them)."""
    if not intended:
        return baseline, []
    removed = [name for name in baseline["stacks"] if name in intended["removed_stacks"]]
    added = [name for name in intended["stacks"] if name not in baseline["stacks"]]
    moved = [moved_item("stack", name, None, f"stack {name} removed") for name in removed]
    moved += [moved_item("stack", name, None, f"stack {name} added") for name in added]
    stacks = {name: stack for name, stack in baseline["stacks"].items() if name not in removed}
    return {**baseline, "stacks": stacks}, moved


def moved_item(what: str, before: str | None, after: str | None, text: str) -> dict[str, Any]:
    return {"what": what, "from": before, "to": after, "text": text}


def intended_driver(
    baseline: dict[str, Any], observed: dict[str, Any], intended: dict[str, Any] | None
) -> tuple[dict[str, Any], list[dict]]:
    """The baseline with the run's driver pin where the host runs that pin and the baseline pins another (moved on
    purpose: not drift), and what moved; else the baseline as it is (another driver is judged against its pin)."""
    pinned, wanted = baseline["driver_version"], (intended or {}).get("driver_version")
    running = observed["module_version"] or user_space_version(observed["gpus"], observed["mismatch"])
    if not (pinned and wanted) or same_version(pinned, wanted) or not same_version(running, wanted):
        return baseline, []
    return {**baseline, "driver_version": wanted}, [
        moved_item("driver", pinned, wanted, f"driver {pinned} -> {wanted}")
    ]


def run_check(args: argparse.Namespace, now: float) -> dict[str, Any]:
    """Read, judge and report (see the module docstring); with ``--intended``, what the run moved on purpose is
    judged against the run's pins and listed as ``moved``, not as findings.

    Raises:
        CouldNotCheck: an input could not be read; the caller reports exit status 2.
    """
    catalog = load_xid_catalog(args.xid_catalog or default_xid_catalog())
    baseline = load_baseline(args.baseline)
    intended = args.intended if baseline is not None else None  # nothing moves from a baseline not recorded yet
    if baseline is None:  # not verified yet: the checks against the inventory's count wait for it
        baseline = {"expected_gpus": None, "driver_version": None, "gpus": {}, "stacks": {}}
    baseline, moved = intended_stacks(baseline, intended)
    observed = observe(args, read_state(args.state), baseline)
    baseline, driver_moved = intended_driver(baseline, observed, intended)
    results = explain_ecc(judge(observed, baseline, catalog), args.nvidia_smi, args.timeout)
    report = {**build_report(now, observed, baseline, results), "moved": driver_moved + moved}
    if baseline["expected_gpus"] is None:
        report["skipped"].update(dict.fromkeys(("gpus", "pci"), NO_BASELINE.format(path=args.baseline)))
    return report


def publish(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Metrics to the textfile, the time of a check that ran to the state file (neither with --no-record: the
    next recorded check reads the same kernel log window), the report to stdout. A file that cannot be written
    is named on stderr; the exit status stays the check's."""
    writes = [(args.textfile, render_metrics(report))] if args.textfile and args.record else []
    if "xid" in report["checks"] and args.state and args.record:  # the kernel log was read up to now
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
    looked = [] if args.record else [LOOKED_ONLY]
    sys.stdout.write(
        json.dumps(report, indent=2, sort_keys=True) + "\n"
        if args.format == "json"
        else render_text(report) + "".join(line + "\n" for line in looked)
    )


def recorded_gpu(gpu: dict[str, Any], nvlink: dict[int, dict[str, Any]] | None, fabric: bool) -> dict[str, Any]:
    """A GPU's baseline entry from what nvidia-smi reports now (links: None when not read)."""
    links = active_links(nvlink.get(gpu["index"])) if nvlink is not None else None
    counts = {key: gpu[key] for key in BASELINE_GPU_COUNTS if key != "nvlink_active_links"}
    return {**counts, "nvlink_active_links": links, "fabric_manager_expected": fabric}


def baseline_document(args: argparse.Namespace, observed: dict[str, Any], now: float) -> dict[str, Any]:
    """The baseline --record-baseline writes (schema in the module docstring)."""
    gpus, fabric = observed["gpus"] or [], args.fabric_manager_expected
    return {
        "schema": BASELINE_SCHEMA,
        "recorded_at": iso_time(now),
        "expected_gpus": args.expected_gpus,
        "driver_version": args.driver_version,
        "gpus": {gpu["pci_bus_id"]: recorded_gpu(gpu, observed["nvlink"], fabric) for gpu in gpus},
        "stacks": dict(args.stack or []),
        **({"mig_devices": args.mig_devices} if args.mig_devices is not None else {}),
    }


def record_count(listed: int, expected: int) -> list[Finding]:
    """--record-baseline's GPU count: nvidia-smi must list exactly --expected-gpus."""
    if listed == expected:
        return []
    cause = f"nvidia-smi lists {listed} GPUs; --expected-gpus is {expected}."
    fix = FIX_GPU_MISSING if listed < expected else "Pass --expected-gpus with the number of GPUs this host has."
    return [finding("gpus", None, cause, fix)]


def same_baseline(path: str, document: dict[str, Any]) -> bool:
    """Whether the baseline at ``path`` already says what ``document`` says (its time aside): then it is
    left as it is, and a converged host's verification changes nothing."""
    try:
        with open(path, encoding="utf-8") as handle:
            present = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(present, dict) and {**present, "recorded_at": None} == {**document, "recorded_at": None}


def verified_widths(path: str) -> dict[str, Any]:
    """The PCIe link width of each GPU in the baseline at ``path`` (the last verification's), by bus id; {} when
    there is none or it cannot be read (a --record-baseline that replaces it then names no earlier width)."""
    try:
        previous = load_baseline(path)
    except CouldNotCheck:
        previous = None
    return {bus_id: gpu.get("pcie_link_width_current") for bus_id, gpu in ((previous or {}).get("gpus") or {}).items()}


def record_baseline(args: argparse.Namespace, now: float) -> dict[str, Any]:
    """Observe, judge the host against the baseline it would write (every check but xid, which needs
    the kernel log since a last check), and write it when nothing is found: ``{"recorded", "path",
    "baseline", "findings", "skipped"}``.

    Raises:
        CouldNotCheck: nvidia-smi is missing, hangs or fails; the baseline cannot be written.
    """
    mig = args.mig_devices is not None
    observed = {**observe_devices(args, args.fabric_manager_expected, dict(args.stack or []), mig), "xid_events": []}
    document = baseline_document(args, observed, now)
    baseline = validate_baseline(document)
    results = {
        **explain_ecc(
            judge(observed, baseline, {"xids": {}}, verified_widths(args.baseline)), args.nvidia_smi, args.timeout
        ),
        "gpus": record_count(len(observed["gpus"] or []), args.expected_gpus)
        + judge_mig(observed["mig_devices"], baseline),
    }
    findings = [item for check in CHECKS for item in results.get(check, [])]
    changed = not findings and not same_baseline(args.baseline, document)
    if changed:
        try:
            write_atomic(args.baseline, json.dumps(document, indent=2) + "\n")
        except OSError as exc:
            fix = "Check that its folder exists and is writable (run as root), or pass --baseline."
            raise CouldNotCheck(f"The baseline {args.baseline} could not be written ({exc.strerror}).", fix) from None
    outcome = {"recorded": not findings, "changed": changed, "path": args.baseline, "baseline": document}
    outcome["findings"] = findings
    return {**outcome, "skipped": skipped_checks(observed)}


def render_recorded(outcome: dict[str, Any]) -> str:
    """--record-baseline's outcome for people: the baseline written, or why it was refused."""
    if outcome.get("error"):
        error = outcome["error"]
        return f"gpu_health: COULD NOT RECORD a baseline: {error['cause']}\n  Fix: {error['fix']}\n"
    lines = outcome_lines(outcome["findings"], outcome["skipped"])
    if not outcome["recorded"]:
        head = (
            f"gpu_health: REFUSED to record a baseline in {outcome['path']}: a baseline is only recorded "
            "from a healthy host, and this one is not (nothing was written; fix these, then run again):"
        )
        return "\n".join([head, *lines]) + "\n"
    document = outcome["baseline"]
    pinned = f"driver {document['driver_version']} pinned" if document["driver_version"] else "driver not pinned"
    fabric = ", fabric manager expected" if checks.fabric_manager_expected(document) else ""
    verb = "recorded in" if outcome["changed"] else "unchanged in"
    head = (
        f"gpu_health: baseline {verb} {outcome['path']}: {len(document['gpus'])} GPU(s) of "
        f"{document['expected_gpus']} expected, {pinned}{fabric}, {len(document['stacks'])} stack(s)"
    )
    return "\n".join([head, *lines, json.dumps(document, indent=2)]) + "\n"


def main_record(args: argparse.Namespace, now: float) -> int:
    """--record-baseline: exit 0 when the baseline was written, 2 when refused or not written."""
    try:
        outcome = record_baseline(args, now)
    except CouldNotCheck as exc:
        outcome = {"recorded": False, "changed": False, "path": args.baseline}
        outcome["error"] = {"cause": exc.cause, "fix": exc.fix}
    outcome = name_kernel_log(outcome, args.kernel_log)
    text = json.dumps(outcome, indent=2, sort_keys=True) + "\n" if args.format == "json" else render_recorded(outcome)
    sys.stdout.write(text)
    return EXIT_HEALTHY if outcome["recorded"] else EXIT_COULD_NOT_CHECK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_mode_options(parser, args)
    now = time.time()
    if args.record_baseline:
        return main_record(args, now)
    try:
        report = run_check(args, now)
    except NvidiaSmiHung as exc:
        report = hung_report(now, exc)
    except CouldNotCheck as exc:
        report = failed_report(now, exc)
    note = checks.textfile_note(args.textfile)  # metrics that no node_exporter serves: said, never a finding
    publish({**name_kernel_log(report, args.kernel_log), "notes": [note] if note else []}, args)
    return int(report["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
