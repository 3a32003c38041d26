"""One parser per output format of ``nvidia-smi``, ``lspci``, sysfs PCI devices, ``/proc/driver/nvidia/version``
and the NVRM Xid lines of the kernel log.

Shared by the ``nvidia_gpu_facts`` module, the ``gpu_driver_module_version`` and ``gpu_compute_apps``
filters, the verification scripts in files/verify (gpu_verify copies this file beside them, and
they import it as ``gpu_parsers``) and the health check in files/health. Standard library only,
Python 3.8+.
No function here runs a command or reads a file, so each one is tested with canned output
(tests/fixtures/nvidia_smi/); only :func:`in_container` looks whether two marker files exist.

Every PCI bus ID comes out in one form, the one ``lspci -D`` prints: lower-case ``dddd:bb:dd.f``
(:func:`normalize_bus_id`), whether it came from nvidia-smi (``00000000:17:00.0``), ``lspci``
(``17:00.0``) or ``lspci -D`` (``0000:17:00.0``).

Sources for the formats (all public):

- ``nvidia-smi --help-query-gpu`` and ``nvidia-smi --help-query-compute-apps``: field names and
  meanings, ``memory.total``/``used_memory`` in MiB, bracketed placeholders such as ``[N/A]`` and
  ``[Not Supported]``, ``pci.bus_id`` as ``domain:bus:device.function`` in hex. The nvidia-smi(1)
  man page (https://docs.nvidia.com/deploy/nvidia-smi/index.html): ``--format=csv,noheader,nounits``
  and ``-lms``/``--loop-ms``. Real captures in the public repository
  https://github.com/utkuozdemir/nvidia_gpu_exporter (folder ``testdata/captures/``) also show
  ``[Requested functionality has been deprecated]`` in place of a value.
- ``nvidia-smi topo -m`` (see ``nvidia-smi topo -h`` and the legend the command prints): a
  tab-separated matrix, header ``\\tGPU0\\tGPU1\\t...\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID``,
  then a blank line, ``Legend:`` and, with NICs, ``NIC Legend:``. On a terminal the header carries
  ANSI underline codes, which are stripped.
- lspci(8) from pciutils (https://man7.org/linux/man-pages/man8/lspci.8.html): ``-nn`` prints
  ``BB:DD.F Class name [CCCC]: Vendor Device [VVVV:DDDD] (rev RR)``; ``-n`` prints the numbers only,
  ``BB:DD.F CCCC: VVVV:DDDD (rev RR)``; ``-D`` adds the domain, ``DDDD:BB:DD.F``. Class codes come
  from the PCI-SIG PCI Code and ID Assignment Specification (also listed at https://pci-ids.ucw.cz/).
- sysfs: ``/sys/bus/pci/devices/<dddd:bb:dd.f>/`` holds one folder per PCI function, with the text
  files ``vendor`` (``0x10de``), ``device`` (``0x20b2``) and ``class`` (``0x030200``: class, subclass
  and programming interface), readable before any driver is loaded. The Linux kernel documentation
  "Accessing PCI device resources through sysfs" (https://docs.kernel.org/PCI/sysfs-pci.html) and
  the sysfs ABI description ``Documentation/ABI/testing/sysfs-bus-pci``.
- ``/proc/driver/nvidia/version``: the check in the NVIDIA CUDA Installation Guide for Linux,
  section "Verify the Driver Version" (https://docs.nvidia.com/cuda/cuda-installation-guide-linux/);
  its first line is ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  <version>  <date>`` or, for
  the open kernel modules, ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  <version> ...``.
- The health fields (:data:`HEALTH_FIELDS`): ``nvidia-smi --help-query-gpu`` of driver 590.48.01 as
  captured in https://github.com/utkuozdemir/nvidia_gpu_exporter (``internal/captures/``), whose
  query captures also show the values: ``Enabled``/``Disabled``, ``Active``/``Not Active``,
  ``Yes``/``No`` and ``[N/A]`` (``retired_pages.pending`` on GPUs with row remapping instead).
- ``nvidia-smi nvlink -s`` (:func:`parse_nvlink_status`): ``GPU <i>: <name> (UUID: GPU-...)``, then
  one ``\\t Link <n>: <speed> GB/s`` line per link (H100/H200 captures of driver 590.48.01 in the
  repository above), ``Link <n>: <inactive>`` for a link that is down (``nvidia-smi nvlink -s`` of a
  V100 host in https://github.com/Azure/azhpc-diagnostics/issues/73), and in place of the link lines
  one note: ``NVML: Unable to retrieve Nvlink information as all links are inActive`` (GeForce RTX
  2080 SUPER, drivers 595 and 610), ``Device does not have or support Nvlink`` (L40S) or ``Nvlink
  queries are not supported for Devices in MIG mode`` (H100/H200 in MIG mode), all in the captures.
- ``nvidia-smi -q`` (:func:`parse_query_details`, :func:`memory_error_details`): an empty line, the banner
  ``==============NVSMI LOG==============``, a header of ``Key : Value`` lines (Timestamp, Driver Version,
  CUDA Version, Attached GPUs), then per GPU a line ``GPU 00000000:17:00.0`` and its ``Key : Value`` lines,
  each heading's lines four spaces further in; the key is padded to a column that varies by driver (41
  characters in 535, 54 in 590), a heading may end in spaces. ``-d <TYPE,...>`` prints the same header
  and, per GPU, only those sections (``nvidia-smi -q -d TEMPERATURE`` quoted in
  https://github.com/mikaku/Monitorix/issues/28). Captures of current drivers: 535.161.08 on 8x H100 and
  535.129.03 on an A10 with a row remap pending in https://github.com/leptonai/gpud
  (``components/accelerator/nvidia/query/testdata/``, at commit 5098ae174a618f0893c79cd774d1d3b4788e5360),
  550.127.05 on 8x Tesla V100-SXM2 in https://github.com/thamada/gls (``gls/V100_x8_smi.py``), 590.48.01
  on an H100 and an H200 in MIG mode (one ``MIG Device`` block per instance) and 610.57.04 on a GeForce
  RTX 2080 SUPER (``Processes``) in https://github.com/utkuozdemir/nvidia_gpu_exporter
  (``internal/captures/``). ``ECC Errors`` > ``Volatile``/``Aggregate`` hold ``Single Bit`` and ``Double
  Bit`` sections with a ``Total`` on Volta (V100 at 550, TITAN V at 560.35.03 in the gpud folder), ``SRAM``
  and ``DRAM`` ``Correctable``/``Uncorrectable`` counts on Turing and later, with ``SRAM Uncorrectable``
  split into ``Parity`` and ``SEC-DED`` on Hopper; ``Retired Pages`` (``Single Bit ECC``, ``Double Bit
  ECC``, ``Pending Page Blacklist``: NVIDIA "Dynamic Page Retirement",
  https://docs.nvidia.com/deploy/dynamic-page-retirement/) is N/A on GPUs that remap rows, ``Remapped
  Rows`` (``Correctable Error``, ``Uncorrectable Error``, ``Pending``, ``Remapping Failure Occurred``,
  ``Bank Remap Availability Histogram``: NVIDIA "GPU Memory Error Management",
  https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/) is ``N/A`` on one line before Ampere and in MIG mode.
- Xid lines (:func:`parse_xid_events`): NVIDIA "XID Errors" (https://docs.nvidia.com/deploy/xid-errors/)
  quotes the old form ``NVRM: Xid (0000:03:00): 14, Channel 00000001``; current drivers write
  ``NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.`` and most add ``pid=<n>,
  name=<process>,`` or ``pid='<unknown>', name=<unknown>,`` before the message (kernel logs quoted
  in https://github.com/NVIDIA/open-gpu-kernel-modules issues, e.g. #1151, and in
  https://github.com/stas00/ml-engineering, ``compute/accelerator/nvidia/debug.md``). ``dmesg`` and
  ``journalctl -k -o short-monotonic`` put the seconds since boot in brackets in front
  (journalctl(1), ``--output``).
- nvidia-smi's exit status 9 (:data:`MODULE_NOT_LOADED`, :func:`module_not_loaded_fix`): the nvidia-smi(1)
  man page, RETURN VALUE ("NVIDIA driver is not loaded"); nvidia-smi 535.261.03 (Debian 12's nvidia-smi and
  libnvidia-ml1 packages) answers every command with exit 9 and ``NVIDIA-SMI has failed because it couldn't
  communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.`` where
  no NVIDIA kernel module is loaded. The container markers: podman-run(1), DESCRIPTION (``/run/.containerenv``
  "to indicate to programs they are running in a container"), and Docker's ``SetupInitLayer``, which creates
  ``/.dockerenv`` (https://github.com/moby/moby, ``daemon/initlayer/setup_unix.go``). Passing GPUs into a
  container: NVIDIA Container Toolkit, "Support for Container Device Interface"
  (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html).
- ``dcgmi diag -r <level> -j`` (:func:`parse_dcgmi_diag`): the JSON that dcgmi's ``Diag.cpp`` builds in
  NVIDIA's DCGM repository (https://github.com/NVIDIA/DCGM, ``dcgmi/Diag.cpp``, key names in
  ``nvvs/include/NvvsJsonStrings.h``, schemas in ``testing/python3/dcgm_diag_schema.json``), in the
  forms of its releases: DCGM 4.0 to 4.6 put it under ``"DCGM Diagnostic"``, each test's ``results``
  one per entity (``"entity_group": "GPU"``, ``"entity_id"``) with ``warnings`` objects
  (``"warning"``, ``"error_id"``, ...) and ``info`` a list, plus a ``test_summary``; DCGM 2.x and 3.x
  put it under ``"DCGM GPU Diagnostic"``: per-GPU results carry ``"gpu_ids"`` (a string, up to 3.2)
  or ``"gpu_id"`` (3.3), ``warnings`` a string (up to 3.2) or a list of objects (3.3), ``info`` a
  string; the Deployment tests of 3.3.3 and later name the message key ``"warnings"`` inside each
  warning object and give ``gpu_id`` as a number. A diagnostic that could not complete prints
  ``{"DCGM Diagnostic": {"version", "runtime_error"}}``. Results are the words ``Pass``, ``Fail``,
  ``Skip``, ``Warn`` and ``Not Run`` of dcgmi's ``HelperDisplayDiagResult``; in ``-j`` output dcgmi
  prints a warning result as ``Fail`` (its unit test ``dcgmi/tests/DiagTests.cpp``) and leaves out
  results that did not run.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# The module's --query-gpu fields. The order of the fields is the order of the CSV columns; callers
# build their command line from the same tuple they pass to :func:`parse_query_gpu`.
QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "compute_cap",
    "driver_version",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "persistence_mode",
)
# --query-compute-apps fields read by :func:`parse_compute_apps`, in column order.
COMPUTE_APPS_FIELDS: tuple[str, ...] = ("pid", "process_name", "gpu_uuid", "used_memory")
# --query-gpu fields read by :func:`parse_samples` (with ``-lms N``), in column order.
SAMPLE_FIELDS: tuple[str, ...] = ("index", "utilization.gpu", "memory.used")
# --query-gpu fields of the health check (files/health/gpu_health.py), in column order, read by
# :func:`parse_health_query`. Named as ``nvidia-smi --help-query-gpu`` of current drivers names them;
# older drivers know the four clock fields only as ``clocks_throttle_reasons.*`` (current ones take
# both names, the help text says), so HEALTH_FIELDS_THROTTLE_NAMES is the same query for them.
HEALTH_FIELDS: tuple[str, ...] = (
    "index",
    "pci.bus_id",
    "uuid",
    "name",
    "driver_version",
    "persistence_mode",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_event_reasons.hw_slowdown",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown",
)
HEALTH_FIELDS_THROTTLE_NAMES: tuple[str, ...] = tuple(
    field.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for field in HEALTH_FIELDS
)

# nvidia-smi's exit status 9, what it means, and where a process learns that it runs in a container
# (podman, Docker); sources in the module docstring.
NVIDIA_SMI_MODULE_NOT_LOADED_RC = 9
MODULE_NOT_LOADED = "NVIDIA kernel module not loaded"
CONTAINER_MARKERS: tuple[str, ...] = ("/run/.containerenv", "/.dockerenv")
# The two halves of the fix: the one for where the check runs comes first and names the module in full.
_FIX_ON_A_HOST = (
    "on a host, load {module} (`modprobe nvidia`, see `dmesg | grep -i nvrm`) or reboot after a driver install "
    "or upgrade, and check that nouveau is blacklisted and Secure Boot accepts the module"
)
_FIX_IN_A_CONTAINER = (
    "in a container {module} belongs to the host's kernel, so load it on the host and pass the GPUs into the "
    "container (NVIDIA Container Toolkit: CDI `--device nvidia.com/gpu=all`, or the `/dev/nvidia*` device files)"
)

NVIDIA_VENDOR_ID = "10de"
# PCI class codes (PCI Code and ID Assignment Specification): 0300 VGA-compatible, 0302 3D controller
# (data-centre GPUs), 0403 audio (the HDMI audio function of GeForce/RTX boards), 0680 "other bridge"
# (how NVSwitch chips on HGX baseboards enumerate).
GPU_CLASS_CODES = frozenset({"0300", "0302"})
NVSWITCH_CLASS_CODE = "0680"

# The most NVLinks any single GPU has had so far: V100 6, A100 12, H100/H200/B200 18.
MAX_NVLINKS_PER_GPU = 18

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_LSPCI_BUS = r"(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
_LSPCI_TAIL = r"(?:\s+\(rev [0-9a-fA-F]+\))?(?:\s+\(prog-if [^)]*\))?\s*$"
# lspci -nn / -D -nn: names with the numbers in brackets.
_LSPCI_NAMED = re.compile(
    rf"^{_LSPCI_BUS}\s+(?P<class_name>.*?)\s*\[(?P<class_code>[0-9a-fA-F]{{4}})\]:\s+"
    rf"(?P<description>.*?)\s*\[(?P<vendor>[0-9a-fA-F]{{4}}):(?P<device>[0-9a-fA-F]{{4}})\]{_LSPCI_TAIL}"
)
# lspci -n / -D -n (-d 10de:): numbers only.
_LSPCI_NUMERIC = re.compile(
    rf"^{_LSPCI_BUS}\s+(?P<class_code>[0-9a-fA-F]{{4}}):\s+"
    rf"(?P<vendor>[0-9a-fA-F]{{4}}):(?P<device>[0-9a-fA-F]{{4}}){_LSPCI_TAIL}"
)
_DEVICE_LABEL = re.compile(r"^(GPU|NIC)\d+$")
# nvidia-smi nvlink -s: a GPU line, then "Link <n>: <speed> GB/s" or "Link <n>: <inactive>" lines
# (sources in the module docstring: driver 590.48.01 captures, Azure/azhpc-diagnostics#73).
_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*?)\s*\(UUID: ([^)]*)\)\s*$")
_NVLINK_LINK = re.compile(r"^Link (\d+): (?:(\d+(?:\.\d+)?) GB/s|<inactive>)$")
# Kernel log: "[<seconds since boot>] ... NVRM: Xid (PCI:dddd:bb:dd): <xid>, [pid=<pid>, name=<name>,] <message>"
# (NVIDIA "XID Errors"; the pid/name part as newer drivers log it, quoted in NVIDIA/open-gpu-kernel-modules issues).
_UPTIME = re.compile(r"\[\s*(\d+\.\d+)\]")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): "
    r"(?P<xid>\d+)(?:,\s*(?P<rest>.*))?$"
)
_XID_PROCESS = re.compile(r"^pid=(?P<pid>\d+|'?<unknown>'?),\s*name=(?P<name>[^,]*)(?:,\s*(?P<message>.*))?$")
_NVLINK_CELL = re.compile(r"^NV(\d+)$")
_VERSION = re.compile(r"^\d+(?:\.\d+)+$")
# nvidia-smi -q (sources in the module docstring): the banner, and the line that opens each GPU's block.
_QUERY_BANNER = "==NVSMI LOG=="
_QUERY_GPU = re.compile(r"^GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*$")


def normalize_bus_id(bus_id: str) -> str:
    """Write a PCI address the way ``lspci -D`` does: lower-case ``dddd:bb:dd.f``.

    nvidia-smi prints ``00000000:17:00.0`` (eight-digit domain, upper-case hex), ``lspci -nn``
    prints ``17:00.0`` and ``lspci -D`` prints ``0000:17:00.0``; all three give ``0000:17:00.0``.
    Domains above ``ffff`` (Intel VMD) keep their extra digits, as lspci shows them.

    Raises:
        ValueError: the text is not a PCI address.
    """
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def _strip_ansi(text: str) -> str:
    return _ANSI_ESCAPE.sub("", text)


def _is_placeholder(value: str) -> bool:
    """True for nvidia-smi's non-values: ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``..., ``N/A``, ``""``."""
    return (value.startswith("[") and value.endswith("]")) or value in ("N/A", "")


def _optional_str(value: str, field: str) -> str | None:
    return None if _is_placeholder(value) else value


def _text(value: str, field: str) -> str:
    return value


def _optional_int(value: str, field: str) -> int | None:
    """``"16"`` -> 16; a placeholder -> None; anything else is a parse error."""
    if _is_placeholder(value):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"nvidia-smi field {field} is {value!r}, not a whole number") from None


def _required_int(value: str, field: str) -> int:
    number = _optional_int(value, field)
    if number is None:
        raise ValueError(f"nvidia-smi field {field} is {value!r}, not a whole number")
    return number


def _optional_bool(value: str, field: str) -> bool | None:
    """``Enabled``/``Disabled`` -> True/False; a placeholder -> None."""
    if _is_placeholder(value):
        return None
    lowered = value.lower()
    if lowered in ("enabled", "on", "yes"):
        return True
    if lowered in ("disabled", "off", "no"):
        return False
    raise ValueError(f"nvidia-smi field {field} is {value!r}, not Enabled or Disabled")


# nvidia-smi's words for the two states of a flag: Enabled/Disabled (persistence_mode), Active/Not
# Active (clocks_event_reasons.*), Yes/No (retired_pages.pending, remapped_rows.*; "Pending" in
# some nvidia-smi -q sections).
_STATE_WORDS = {
    "enabled": True,
    "active": True,
    "yes": True,
    "pending": True,
    "disabled": False,
    "not active": False,
    "no": False,
}


def _optional_state(value: str, field: str) -> bool | None:
    """``Enabled``/``Active``/``Yes``/``Pending`` -> True, ``Disabled``/``Not Active``/``No`` -> False,
    a placeholder -> None; anything else is a parse error."""
    if _is_placeholder(value):
        return None
    state = _STATE_WORDS.get(value.lower())
    if state is None:
        raise ValueError(f"nvidia-smi field {field} is {value!r}, not Enabled/Disabled, Active/Not Active or Yes/No")
    return state


def _bus_id_field(value: str, field: str) -> str:
    try:
        return normalize_bus_id(value)
    except ValueError:
        raise ValueError(f"nvidia-smi field {field} is {value!r}, not a PCI address") from None


# --query-gpu field -> (key of the parsed record, converter). A field not listed here keeps its
# text under its name with dots as underscores (``clocks.sm`` -> ``clocks_sm``), placeholders None.
_QUERY_GPU_KEYS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "index": ("index", _required_int),
    "name": ("name", _text),
    "uuid": ("uuid", _text),
    "pci.bus_id": ("pci_bus_id", _bus_id_field),
    "memory.total": ("memory_total_mib", _optional_int),
    "compute_cap": ("compute_capability", _optional_str),
    "driver_version": ("driver_version", _optional_str),
    "pcie.link.gen.current": ("pcie_link_gen_current", _optional_int),
    "pcie.link.gen.max": ("pcie_link_gen_max", _optional_int),
    "pcie.link.width.current": ("pcie_link_width_current", _optional_int),
    "pcie.link.width.max": ("pcie_link_width_max", _optional_int),
    "persistence_mode": ("persistence_mode", _optional_bool),
}


def _health_converter(field: str) -> Callable[[str, str], Any]:
    if field == "index":
        return _required_int
    if field == "pci.bus_id":
        return _bus_id_field
    if field in ("uuid", "name"):
        return _text
    if field == "driver_version":
        return _optional_str
    if field.startswith(("pcie.", "ecc.")):
        return _optional_int
    return _optional_state


# Health field -> (key, converter). Each key is the field with dots as underscores; the old
# clocks_throttle_reasons.* names give the same keys as the clocks_event_reasons.* ones.
_HEALTH_KEYS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    old: (new.replace(".", "_"), _health_converter(new))
    for old, new in zip(HEALTH_FIELDS_THROTTLE_NAMES + HEALTH_FIELDS, HEALTH_FIELDS + HEALTH_FIELDS)
}


def _query_record(
    values: list[str],
    fields: tuple[str, ...] | list[str],
    keys: Mapping[str, tuple[str, Callable[[str, str], Any]]],
) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for field, value in zip(fields, values):
        key, convert = keys.get(field, (field.replace(".", "_"), _optional_str))
        record[key] = convert(value, field)
    return record


def _parse_query_rows(
    text: str,
    fields: tuple[str, ...] | list[str],
    keys: Mapping[str, tuple[str, Callable[[str, str], Any]]],
) -> list[dict[str, Any]]:
    """The rows of ``--query-gpu=<fields> --format=csv,noheader,nounits`` output, one record each."""
    lines = [line for line in _strip_ansi(text).splitlines() if line.strip()]
    if any("no devices were found" in line.lower() for line in lines):
        return []
    gpus: list[dict[str, Any]] = []
    for line_number, row in enumerate(csv.reader(lines, skipinitialspace=True), start=1):
        values = [value.strip() for value in row]
        where = f"line {line_number} of the nvidia-smi --query-gpu output"
        if len(values) != len(fields):
            raise ValueError(
                f"{where} has {len(values)} fields, expected {len(fields)} ({','.join(fields)}): "
                f"{lines[line_number - 1]!r}"
            )
        try:
            gpus.append(_query_record(values, fields, keys))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return gpus


def parse_query_gpu(text: str, fields: tuple[str, ...] | list[str] = QUERY_FIELDS) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``.

    ``fields`` are the query fields in the order given to nvidia-smi (default :data:`QUERY_FIELDS`,
    the module's list). Returns one dict per GPU, in nvidia-smi's order, with one key per field:
    ``index`` (int), ``name``, ``uuid``, ``pci_bus_id`` (normalised by :func:`normalize_bus_id`),
    ``memory_total_mib`` (int, MiB; ``nounits`` drops the `` MiB``), ``compute_capability`` (str such
    as ``"8.0"``), ``driver_version``, ``pcie_link_gen_current``, ``pcie_link_gen_max``,
    ``pcie_link_width_current``, ``pcie_link_width_max`` (ints, lanes for the widths) and
    ``persistence_mode`` (bool). Any value nvidia-smi prints in brackets (``[N/A]``,
    ``[Not Supported]``) becomes None; the index must be a number. Blank lines are ignored;
    "No devices were found" gives an empty list.

    Raises:
        ValueError: a line has the wrong number of fields or a field has an impossible value.
    """
    return _parse_query_rows(text, fields, _QUERY_GPU_KEYS)


def _csv_cells(line: str) -> list[str]:
    """The cells of one ``csv,noheader,nounits`` line (nvidia-smi never quotes them)."""
    return [cell.strip() for cell in line.split(",")]


def parse_compute_apps(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory
    --format=csv,noheader,nounits`` (:data:`COMPUTE_APPS_FIELDS`).

    Returns ``[{"pid": int, "process_name": str, "gpu_uuid": str, "used_memory_mib": int or None}]``
    in nvidia-smi's order; ``used_memory_mib`` is None when nvidia-smi prints ``[N/A]``. Lines that are
    not process rows ("No running processes found", a header, blank lines) are skipped.
    """
    apps = []
    for line in _strip_ansi(text).splitlines():
        cells = _csv_cells(line)
        if len(cells) != len(COMPUTE_APPS_FIELDS) or not cells[0].isdigit():
            continue
        pid, name, uuid, used = cells
        apps.append(
            {
                "pid": int(pid),
                "process_name": name,
                "gpu_uuid": uuid,
                "used_memory_mib": int(used) if used.isdigit() else None,
            }
        )
    return apps


def parse_samples(text: str) -> dict[str, dict[str, Any]]:
    """Peaks per GPU in ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used
    --format=csv,noheader,nounits -lms N`` output (:data:`SAMPLE_FIELDS`, one line per GPU per sample).

    Returns ``{index (str): {"utilization_gpu_peak_pct": int, "memory_used_peak_mib": int,
    "samples": int}}``; lines that do not parse (``[N/A]``, a cut last line) are skipped.
    """
    peaks: dict[str, dict[str, Any]] = {}
    for line in _strip_ansi(text).splitlines():
        cells = _csv_cells(line)
        if len(cells) != len(SAMPLE_FIELDS) or not all(cell.isdigit() for cell in cells):
            continue
        index, util, used = cells[0], int(cells[1]), int(cells[2])
        peak = peaks.setdefault(index, {"utilization_gpu_peak_pct": 0, "memory_used_peak_mib": 0, "samples": 0})
        peak["utilization_gpu_peak_pct"] = max(peak["utilization_gpu_peak_pct"], util)
        peak["memory_used_peak_mib"] = max(peak["memory_used_peak_mib"], used)
        peak["samples"] += 1
    return peaks


def parse_topo_matrix(text: str) -> dict[str, dict[str, str]]:
    """Parse the matrix of ``nvidia-smi topo -m`` into ``{"GPU0": {"GPU0": "X", "GPU1": "NV12", ...}}``.

    Rows and columns are the device labels (``GPU<n>``, ``NIC<n>``) of the header line; the CPU
    Affinity, NUMA Affinity and GPU NUMA ID columns are dropped. Cells are ``X`` (self), ``NV<n>``
    (n bonded NVLinks), ``PIX``, ``PXB``, ``PHB``, ``NODE`` or ``SYS``. Reading stops at the first
    blank line, so the ``Legend:`` and ``NIC Legend:`` blocks are ignored. Cells are split on any
    whitespace: they never contain spaces, and this also reads copies whose tabs became spaces.
    Empty text gives an empty dict.

    Raises:
        ValueError: no header line with ``GPU0``, or a row has fewer cells than the header has devices.
    """
    lines = _strip_ansi(text).splitlines()
    header_at = next((i for i, line in enumerate(lines) if "GPU0" in line.split()), None)
    if header_at is None:
        if not text.strip():
            return {}
        raise ValueError("no header line with GPU0 in the nvidia-smi topo -m output")
    columns: list[str] = []
    for token in lines[header_at].split():
        if not _DEVICE_LABEL.match(token):
            break
        columns.append(token)
    matrix: dict[str, dict[str, str]] = {}
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or not _DEVICE_LABEL.match(tokens[0]):
            break
        label = tokens[0]
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) != len(columns):
            raise ValueError(
                f"row {label} of the nvidia-smi topo -m output has {len(cells)} cells, expected {len(columns)}: {line!r}"
            )
        matrix[label] = dict(zip(columns, cells))
    return matrix


def nvlink_pairs(topology: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """GPU pairs joined by NVLink in a :func:`parse_topo_matrix` result.

    Returns ``[{"gpus": [i, j], "links": n}, ...]`` with ``i < j`` (nvidia-smi indices), sorted,
    one entry per unordered pair; n is the number of bonded links from the ``NV<n>`` cell.
    """
    pairs: dict[tuple[int, int], int] = {}
    for row, cells in topology.items():
        if not row.startswith("GPU"):
            continue
        for column, cell in cells.items():
            match = _NVLINK_CELL.match(cell)
            if not column.startswith("GPU") or not match:
                continue
            a, b = int(row[3:]), int(column[3:])
            if a != b:
                pairs[(min(a, b), max(a, b))] = int(match.group(1))
    return [{"gpus": [a, b], "links": links} for (a, b), links in sorted(pairs.items())]


def nvswitch_in_topology(topology: dict[str, dict[str, str]]) -> bool:
    """Guess from ``topo -m`` alone whether the GPUs talk through NVSwitch.

    Heuristic, not a measurement: at least 4 GPUs, every pair of them is ``NV<n>``, and each GPU
    claims more bonded links to its peers in total than any GPU has (:data:`MAX_NVLINKS_PER_GPU`).
    Example: 8x H100 SXM on HGX shows NV18 for all 28 pairs (7 x 18 = 126 > 18), which only a switch
    can provide; 4x A100 on HGX Redstone shows NV4 per pair (3 x 4 = 12), a direct mesh, so False.
    It misses a switched box when only a few of its GPUs are visible (a VM with 2 of 8).
    """
    gpus = sorted(label for label in topology if label.startswith("GPU"))
    if len(gpus) < 4:
        return False
    for gpu in gpus:
        total = 0
        for peer in gpus:
            if peer == gpu:
                continue
            match = _NVLINK_CELL.match(topology[gpu].get(peer, ""))
            if not match:
                return False
            total += int(match.group(1))
        if total <= MAX_NVLINKS_PER_GPU:
            return False
    return True


def _lspci_nvidia_devices(text: str) -> list[dict[str, Any]]:
    """Every NVIDIA (vendor 10de) function in ``lspci -nn`` or ``lspci -n`` output, with its class code."""
    devices = []
    for line in _strip_ansi(text).splitlines():
        match = _LSPCI_NAMED.match(line.strip()) or _LSPCI_NUMERIC.match(line.strip())
        if not match or match.group("vendor").lower() != NVIDIA_VENDOR_ID:
            continue
        named = "description" in match.groupdict()
        devices.append(
            {
                "pci_bus_id": normalize_bus_id(match.group("bus")),
                "class_code": match.group("class_code").lower(),
                "description": match.group("description").strip() if named else None,
                "device_id": f"{NVIDIA_VENDOR_ID}:{match.group('device').lower()}",
            }
        )
    return devices


def parse_lspci(text: str) -> list[dict[str, Any]]:
    """NVIDIA GPUs in ``lspci -nn``/``lspci -D -nn`` (named) or ``lspci -D -n [-d 10de:]`` (numeric) output.

    Keeps vendor ``10de`` functions of class VGA ``0300`` or 3D controller ``0302``; skips NVIDIA
    audio ``0403``, NVSwitch bridges ``0680`` and every other vendor. Returns
    ``[{"pci_bus_id": "0000:17:00.0", "description": "NVIDIA Corporation GA100 [A100 SXM4 80GB]",
    "device_id": "10de:20b2"}, ...]`` sorted by bus ID; ``description`` is None for the numeric
    form, which prints no names. Lines in other formats (``-v`` detail lines) are ignored.
    """
    gpus = [
        {key: device[key] for key in ("pci_bus_id", "description", "device_id")}
        for device in _lspci_nvidia_devices(text)
        if device["class_code"] in GPU_CLASS_CODES
    ]
    return sorted(gpus, key=lambda gpu: gpu["pci_bus_id"])


def parse_lspci_nvswitches(text: str) -> list[str]:
    """Bus IDs of NVIDIA bridge functions ``0680`` (NVSwitch chips on HGX boards) in lspci output (either form)."""
    return sorted(
        device["pci_bus_id"] for device in _lspci_nvidia_devices(text) if device["class_code"] == NVSWITCH_CLASS_CODE
    )


def _sysfs_hex(value: str, digits: int, where: str) -> str:
    """``"0x10de\\n"`` -> ``"10de"``: a sysfs number as lower-case hex, zero-padded to ``digits``."""
    text = value.strip().lower()
    text = text[2:] if text.startswith("0x") else text
    if not text or len(text) > digits or any(char not in "0123456789abcdef" for char in text):
        raise ValueError(f"{where} is {value.strip()!r}, not a {digits}-digit hexadecimal number")
    return text.zfill(digits)


def _sysfs_nvidia_devices(devices: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """Every NVIDIA function in a sysfs PCI device list (see :func:`parse_sysfs_pci`), with its class code."""
    found = []
    for name, files in devices.items():
        try:
            bus_id = normalize_bus_id(name)
        except ValueError:
            continue  # not a PCI function folder
        if _sysfs_hex(files.get("vendor", ""), 4, f"{name}/vendor") != NVIDIA_VENDOR_ID:
            continue
        device = _sysfs_hex(files.get("device", ""), 4, f"{name}/device")
        found.append(
            {
                "pci_bus_id": bus_id,
                # class is 24 bits (class, subclass, programming interface); lspci's [0302] is the top 16.
                "class_code": _sysfs_hex(files.get("class", ""), 6, f"{name}/class")[:4],
                "description": None,
                "device_id": f"{NVIDIA_VENDOR_ID}:{device}",
            }
        )
    return found


def parse_sysfs_pci(devices: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """NVIDIA GPUs in a sysfs PCI device list, in the shape of :func:`parse_lspci`.

    ``devices`` maps each folder name under ``/sys/bus/pci/devices`` (``0000:17:00.0``) to the text of
    its files ``{"vendor": "0x10de\\n", "device": "0x20b2\\n", "class": "0x030200\\n"}``. Keeps vendor
    ``10de`` functions of class VGA ``0300xx`` or 3D controller ``0302xx``, as :func:`parse_lspci`
    does. Returns ``[{"pci_bus_id", "description": None, "device_id": "10de:20b2"}]`` sorted by bus ID
    (sysfs has no names). Folder names that are no PCI address are skipped.

    Raises:
        ValueError: a vendor file, or a device or class file of an NVIDIA function, is no hex number
            (a folder that is not sysfs-like).
    """
    gpus = [
        {key: device[key] for key in ("pci_bus_id", "description", "device_id")}
        for device in _sysfs_nvidia_devices(devices)
        if device["class_code"] in GPU_CLASS_CODES
    ]
    return sorted(gpus, key=lambda gpu: gpu["pci_bus_id"])


def parse_sysfs_pci_nvswitches(devices: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Bus IDs of NVIDIA bridge functions ``0680xx`` (NVSwitch chips) in a sysfs PCI device list."""
    return sorted(
        device["pci_bus_id"] for device in _sysfs_nvidia_devices(devices) if device["class_code"] == NVSWITCH_CLASS_CODE
    )


def parse_proc_driver_version(text: str | None) -> str | None:
    """Version of the loaded NVIDIA kernel module from ``/proc/driver/nvidia/version`` text, or None.

    ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  <date>`` and the open module's
    ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build ...``:
    the first dotted number after ``Module`` on the ``NVRM version:`` line. None for empty text,
    None, or text without that line (no module loaded).
    """
    for line in (text or "").splitlines():
        line = line.strip()
        if not line.startswith("NVRM version:") or "Module" not in line:
            continue
        for token in line.split("Module", 1)[1].split():
            if _VERSION.match(token):
                return token
    return None


def module_not_loaded_fix(container: bool = False) -> str:
    """The fix for nvidia-smi's exit status 9 (:data:`MODULE_NOT_LOADED`), one sentence for a host and a
    container alike: the container's half first when ``container`` (see :func:`in_container`)."""
    first, second = (_FIX_IN_A_CONTAINER, _FIX_ON_A_HOST) if container else (_FIX_ON_A_HOST, _FIX_IN_A_CONTAINER)
    text = f"{first.format(module='the NVIDIA kernel module')}; {second.format(module='the module')}."
    return text[:1].upper() + text[1:]


def in_container(markers: Sequence[str] = CONTAINER_MARKERS) -> bool:
    """Whether one of the container engines' marker files exists (:data:`CONTAINER_MARKERS`)."""
    return any(os.path.exists(path) for path in markers)


def parse_health_query(text: str, fields: tuple[str, ...] | list[str] = HEALTH_FIELDS) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=<HEALTH_FIELDS> --format=csv,noheader,nounits`` (the health check).

    ``fields`` is :data:`HEALTH_FIELDS` or :data:`HEALTH_FIELDS_THROTTLE_NAMES`, in the order given to
    nvidia-smi. Returns one dict per GPU, keyed by field with dots as underscores (``pci_bus_id``,
    ``ecc_errors_uncorrected_volatile_total``, ``clocks_event_reasons_hw_slowdown``; the clock keys
    are the same under the old names): ``index`` and the ``pcie_*``/``ecc_*`` counts as ints, the
    flags (``persistence_mode``, ``retired_pages_pending``, ``remapped_rows_*``,
    ``clocks_event_reasons_*``) as booleans, ``pci_bus_id`` normalised. A field the GPU does not
    support (``[N/A]``, ``[Not Supported]``, ``N/A``) is None, never an error. "No devices were
    found" gives an empty list.

    Raises:
        ValueError: a line has the wrong number of fields or a field has an impossible value.
    """
    return _parse_query_rows(text, fields, _HEALTH_KEYS)


def parse_nvlink_status(text: str) -> dict[int, dict[str, Any]]:
    """Parse ``nvidia-smi nvlink -s`` (``--status``) into ``{index: {"uuid", "name", "links", "note"}}``.

    ``links`` maps each link number to its speed in GB/s (float), or None for ``<inactive>``. A GPU
    whose block has no link lines has ``links == {}``; ``note`` keeps the line the driver printed
    instead (``... all links are inActive``, ``Device does not have or support Nvlink``, ``Nvlink
    queries are not supported for Devices in MIG mode``), else None. Indentation (a tab and a
    space) and blank lines do not matter; text before the first ``GPU`` line is ignored.

    Raises:
        ValueError: a ``Link`` line in a form this parser does not know.
    """
    gpus: dict[int, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for raw in _strip_ansi(text).splitlines():
        line = raw.strip()
        header = _NVLINK_GPU.match(line)
        if header:
            current = {"uuid": header.group(3), "name": header.group(2), "links": {}, "note": None}
            gpus[int(header.group(1))] = current
            continue
        if current is None or not line:
            continue
        link = _NVLINK_LINK.match(line)
        if link:
            current["links"][int(link.group(1))] = float(link.group(2)) if link.group(2) else None
        elif line.startswith("Link "):
            raise ValueError(f"nvidia-smi nvlink -s line in an unknown form: {line!r}")
        elif current["note"] is None:
            current["note"] = line
    return gpus


def _query_line(line: str) -> tuple[int, str, str | None]:
    """(indentation, key, value) of one ``nvidia-smi -q`` line; the value is None for a section heading
    (a line without `` : ``), '' for a key printed with nothing after its colon."""
    text = line.rstrip()
    key, colon, value = text.strip().partition(" : ")
    if not colon and text.endswith(" :"):
        key, colon = text[:-2], " : "
    return len(text) - len(text.lstrip(" ")), key.strip(), value.strip() if colon else None


def _put(section: dict[str, Any], key: str, value: Any) -> None:
    """Store one entry; a key that comes again in the same section keeps every value, in order, in a list."""
    if key not in section:
        section[key] = value
    elif isinstance(section[key], list):
        section[key].append(value)
    else:
        section[key] = [section[key], value]


def _query_header(lines: list[str]) -> None:
    """Check that text is ``nvidia-smi -q`` output: its banner or its ``Attached GPUs`` line."""
    if not any(_QUERY_BANNER in line or line.startswith("Attached GPUs") for line in lines):
        raise ValueError("not nvidia-smi -q output: no NVSMI LOG banner and no Attached GPUs line")


def _query_entry(stack: list[tuple[int, dict[str, Any]]], indent: int, key: str, value: str | None) -> None:
    """Put one line of a GPU block into the section it is indented under; a heading opens a section."""
    while stack[-1][0] >= indent:
        stack.pop()
    section: dict[str, Any] = {}
    _put(stack[-1][1], key, section if value is None else value)
    if value is None:
        stack.append((indent, section))


def parse_query_details(text: str) -> dict[str, dict[str, Any]]:
    """Parse ``nvidia-smi -q`` (also with ``-d ECC,PAGE_RETIREMENT,ROW_REMAPPER``, ``-i <id>``) into
    ``{bus_id: section}``, one per ``GPU 00000000:17:00.0`` block, bus ids in the form of :func:`normalize_bus_id`.

    A section is a dict of the block's ``Key : Value`` lines, values as printed (strings: ``N/A``, ``[N/A]``,
    ``Not Supported``, ``Requested functionality has been deprecated`` included), and of its headings
    (``ECC Errors``, ``Remapped Rows``, ...), each a section of the lines indented below it, by
    indentation, however deep. Lines indented below a line that has a value (``HW Thermal Slowdown``
    under ``HW Slowdown``, a process's ``Type`` under its ``Process ID``) belong to that line's section.
    A key printed more than once in a section (``MIG Device``, each process's ``Process ID``) has the list
    of its values. The header (Timestamp, Driver Version, CUDA Version, Attached GPUs) is checked, not
    returned. "No devices were found" gives an empty dict.

    Raises:
        ValueError: the text is not ``-q`` output (no banner or ``Attached GPUs`` line, an indented line
            before the first GPU, an unindented one after it) or names a GPU twice.
    """
    lines = _strip_ansi(text).expandtabs(8).splitlines()
    if any("no devices were found" in line.lower() for line in lines):
        return {}
    _query_header(lines)
    gpus: dict[str, dict[str, Any]] = {}
    stack: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        gpu, (indent, key, value) = _QUERY_GPU.match(line), _query_line(line)
        if not line.strip() or _QUERY_BANNER in line or (not stack and not indent and not gpu):
            continue  # blank, the banner, the header
        if gpu:
            bus_id = normalize_bus_id(gpu.group(1))
            if bus_id in gpus:
                raise ValueError(f"nvidia-smi -q output names GPU {bus_id} twice (line {number})")
            stack = [(0, gpus.setdefault(bus_id, {}))]
        elif not stack or not indent:
            where = "indented before the first GPU" if indent else "not indented, nor a GPU line, after the first GPU"
            raise ValueError(f"line {number} of the nvidia-smi -q output is {where}: {line!r}")
        else:
            _query_entry(stack, indent, key, value)
    return gpus


def _entry(section: Any, *names: str) -> Any:
    """The value in a ``-q`` section under one of ``names`` (lower case): a key equal to one, else the first
    key that starts with one; None when the section is none (``Remapped Rows : N/A``) or has no such key."""
    if not isinstance(section, dict):
        return None
    keys = {key.lower(): value for key, value in section.items()}
    found = next((keys[name] for name in names if name in keys), None)
    prefixed = (value for name in names for key, value in keys.items() if key.startswith(name))
    return found if found is not None else next(prefixed, None)


def _detail_count(value: Any) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _detail_flag(value: Any) -> bool | None:
    return _STATE_WORDS.get(value.lower()) if isinstance(value, str) else None


def _uncorrectable(errors: Any) -> int | None:
    """Uncorrectable errors of one ``Volatile`` or ``Aggregate`` section: ``Double Bit`` > ``Total`` where
    the driver prints the Volta-and-older form, else the sum of the ``... Uncorrectable`` counts (``SRAM
    Uncorrectable`` or its ``Parity`` and ``SEC-DED`` parts, and ``DRAM Uncorrectable``); None when none is a count."""
    double = _entry(errors, "double bit")
    if isinstance(double, dict):
        return _detail_count(_entry(double, "total"))
    keys = [key for key in errors if "uncorrectable" in key.lower()] if isinstance(errors, dict) else []
    keys = [key for key in keys if not any(key != other and key.startswith(other) for other in keys)]
    counts = [count for count in (_detail_count(errors[key]) for key in keys) if count is not None]
    return sum(counts) if counts else None


def memory_error_details(section: Any) -> dict[str, dict[str, Any]]:
    """The memory error state of one GPU's :func:`parse_query_details` section:

    ``{"remapped_rows": {"correctable", "uncorrectable", "pending", "failure"}, "retired_pages":
    {"single_bit", "double_bit", "pending"}, "ecc_uncorrected": {"volatile", "aggregate"}}``, counts as
    ints and flags as booleans, None where the GPU prints ``N/A`` or the driver no such line (``Remapped
    Rows : N/A`` before Ampere, ``Retired Pages`` N/A on GPUs that remap rows). Keys are matched without
    regard to case, by their first words: ``Pending Page Blacklist`` (drivers 535 to 610), an older driver's
    ``Pending`` or any other ``Pending ...`` under Retired Pages; both forms of ``ECC Errors`` are read (see
    :func:`_uncorrectable`). Anything else than a section (None, ``"N/A"``) gives all None.
    """
    rows, pages = _entry(section, "remapped rows"), _entry(section, "retired pages")
    errors = _entry(section, "ecc errors")
    return {
        "remapped_rows": {
            "correctable": _detail_count(_entry(rows, "correctable")),
            "uncorrectable": _detail_count(_entry(rows, "uncorrectable")),
            "pending": _detail_flag(_entry(rows, "pending")),
            "failure": _detail_flag(_entry(rows, "remapping failure", "failure")),
        },
        "retired_pages": {
            "single_bit": _detail_count(_entry(pages, "single bit")),
            "double_bit": _detail_count(_entry(pages, "double bit")),
            "pending": _detail_flag(_entry(pages, "pending")),
        },
        "ecc_uncorrected": {
            "volatile": _uncorrectable(_entry(errors, "volatile")),
            "aggregate": _uncorrectable(_entry(errors, "aggregate")),
        },
    }


def _xid_process(rest: str) -> tuple[int | None, str | None, str]:
    """``pid=1234, name=python3, <message>`` -> (1234, "python3", message); ``<unknown>`` -> None."""
    match = _XID_PROCESS.match(rest)
    if not match:
        return None, None, rest
    pid, name = match.group("pid"), match.group("name").strip()
    return (
        int(pid) if pid.isdigit() else None,
        None if name in ("", "<unknown>") else name,
        (match.group("message") or "").strip(),
    )


def parse_xid_events(text: str) -> list[dict[str, Any]]:
    """The NVRM Xid events in kernel log text, as ``dmesg`` or ``journalctl -k`` print it.

    Returns ``[{"bus_id", "xid", "pid", "process", "message", "uptime_seconds"}]`` in log order:
    ``bus_id`` in the form of :func:`normalize_bus_id` (the log names ``domain:bus:device``; a GPU is
    function 0, so ``.0`` is added), ``xid`` an int, ``pid``/``process`` the process the driver
    names (None for ``<unknown>`` or the older lines without them), ``message`` the rest of the line,
    ``uptime_seconds`` the ``[seconds since boot]`` that dmesg and ``journalctl -o short-monotonic``
    print in front (also found after a syslog prefix; None when the line has none, as in
    journalctl's default ``short``). Every other line is skipped.
    """
    events = []
    for raw in _strip_ansi(text).splitlines():
        line = raw.rstrip()
        match = _XID.search(line)
        if not match:
            continue
        pid, process, message = _xid_process((match.group("rest") or "").strip())
        uptimes = _UPTIME.findall(line[: match.start()])
        events.append(
            {
                "bus_id": normalize_bus_id(match.group("bus") + ".0"),
                "xid": int(match.group("xid")),
                "pid": pid,
                "process": process,
                "message": message,
                "uptime_seconds": float(uptimes[-1]) if uptimes else None,
            }
        )
    return events


# dcgmi diag -j (sources in the module docstring): the object's key by DCGM release, and the words of
# a result (dcgmi's HelperDisplayDiagResult).
DCGMI_DIAG_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # DCGM 4.x; DCGM 2.x and 3.x
DCGMI_DIAG_RESULTS = ("Pass", "Fail", "Warn", "Skip", "Not Run")


class DcgmiDiagRuntimeError(ValueError):
    """``dcgmi diag -j`` printed its ``runtime_error`` instead of results: the diagnostic could not
    complete (the message is DCGM's, e.g. ``Error: Unable to complete diagnostic ...``)."""


def _dcgm_texts(value: Any, where: str) -> list[str]:
    """DCGM's messages: a string, a list of strings (4.x ``info``) or a list of warning objects whose
    message is ``"warning"`` (``"warnings"`` in the Deployment tests of 3.3); JSON nulls are gaps."""
    if value is None or isinstance(value, str):
        return [value] if value and value.strip() else []
    if not isinstance(value, list):
        raise ValueError(f"{where} is {value!r}, not a message or a list of them")
    texts = []
    for item in value:
        text = item.get("warning", item.get("warnings")) if isinstance(item, dict) else item
        if text is not None and not isinstance(text, str):
            raise ValueError(f"{where} has {item!r}, not a message")
        texts += [text] if text and text.strip() else []
    return texts


def _dcgm_gpu_index(value: Any, where: str) -> int | None:
    """A GPU id as DCGM prints it (a number or a string of digits); a negative one names no GPU."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where} is {value!r}, not a GPU id")
    return value if value >= 0 else None


def _dcgm_result(category: str, test: str, result: Any) -> dict[str, Any]:
    """One result of a test: DCGM 4.x names its entity (only a GPU gives ``gpu``), 3.x its GPU id."""
    where = f"test {test!r}"
    if not isinstance(result, dict) or result.get("status") not in DCGMI_DIAG_RESULTS:
        raise ValueError(f"{where} has a result {result!r} without a status of {', '.join(DCGMI_DIAG_RESULTS)}")
    gpu = None
    if result.get("entity_group") == "GPU":  # DCGM 4.x; another entity (a CPU) is no GPU
        gpu = _dcgm_gpu_index(result.get("entity_id"), f"{where} entity_id")
    elif "entity_group" not in result:  # DCGM 2.x-3.2 "gpu_ids", 3.3 "gpu_id"
        key = next((name for name in ("gpu_id", "gpu_ids") if name in result), None)
        gpu = _dcgm_gpu_index(result[key], f"{where} {key}") if key else None
    return {
        "category": category,
        "test": test,
        "result": result["status"],
        "gpu": gpu,
        "info": _dcgm_texts(result.get("info"), f"{where} info"),
        "warnings": _dcgm_texts(result.get("warnings"), f"{where} warnings"),
    }


def _dcgm_test(category: str, test: Any) -> list[dict[str, Any]]:
    """The results of one test. A DCGM 3.3.1 Deployment test lists its further messages as results
    without a status: they join the first. A DCGM 4.x ``test_summary`` (the test's overall result,
    with every message) comes last, as a result of no GPU; a 4.x test with neither did not run."""
    if not isinstance(test, dict) or not isinstance(test.get("name"), str):
        raise ValueError(f"category {category!r} has a test {test!r} without a name")
    results = test.get("results") or []
    if not isinstance(results, list):
        raise ValueError(f"test {test['name']!r} has results {results!r}, not a list")
    entries: list[dict[str, Any]] = []
    for result in (item for item in results if item is not None):
        if isinstance(result, dict) and "status" not in result and entries:
            entries[0]["warnings"] += _dcgm_texts(result.get("warnings"), f"test {test['name']!r} warnings")
        else:
            entries.append(_dcgm_result(category, test["name"], result))
    if "test_summary" in test:
        entries.append({**_dcgm_result(category, test["name"], test["test_summary"]), "gpu": None})
    elif not entries and "results" not in test:
        entries.append(_dcgm_result(category, test["name"], {"status": "Not Run"}))
    return entries


def _dcgm_document(text: str) -> dict[str, Any]:
    """The diagnostic's object of ``dcgmi diag -j`` output (text around the JSON is ignored)."""
    start, end = text.find("{"), text.rfind("}")
    try:
        document = json.loads(text[start : end + 1]) if start >= 0 else None
    except ValueError as exc:
        raise ValueError(f"dcgmi diag -j output is not JSON: {exc}") from None
    key = next((name for name in DCGMI_DIAG_KEYS if isinstance(document, dict) and name in document), None)
    if key is None or not isinstance(document[key], dict):
        raise ValueError(f"dcgmi diag -j output has no {' or '.join(repr(name) for name in DCGMI_DIAG_KEYS)} object")
    return document[key]


def parse_dcgmi_diag(text: str) -> list[dict[str, Any]]:
    """Parse ``dcgmi diag -r <level> -j`` into one dict per result, in DCGM's order:
    ``{"category", "test", "result", "gpu", "info", "warnings"}``.

    ``category`` (``Deployment``, ``Integration``, ``Hardware``, ``Stress``) and ``test`` as DCGM
    names them (DCGM 4.x its canonical names, ``software``, ``pcie``, ``memory``, ...; 2.x and 3.x
    display names, ``GPU Memory``, ``PCIe``, ...); ``result`` one of :data:`DCGMI_DIAG_RESULTS` as
    DCGM prints it; ``gpu`` the GPU's DCGM id (its NVML index) or None for a result of no GPU (a
    Deployment test of 3.x, a CPU, and the ``test_summary`` that DCGM 4.x adds after each test's
    results: the test's overall result with all its messages); ``info`` and ``warnings`` lists of
    DCGM's messages (``warnings`` are the errors of a failed test). Release forms: the module
    docstring.

    Raises:
        DcgmiDiagRuntimeError: the output is DCGM's ``runtime_error`` (a ValueError).
        ValueError: the text is not ``dcgmi diag -j`` output.
    """
    body = _dcgm_document(text)
    categories = body.get("test_categories")
    if categories is None and isinstance(body.get("runtime_error"), str):
        raise DcgmiDiagRuntimeError(" ".join(body["runtime_error"].split()))
    if not isinstance(categories, list):
        raise ValueError("dcgmi diag -j output has no test_categories list")
    entries = []
    for category in (item for item in categories if item is not None):
        tests = category.get("tests") if isinstance(category, dict) else None
        if not isinstance(tests, list) or not isinstance(category.get("category"), str):
            raise ValueError(f"test category {category!r} is not an object with a category name and tests")
        for test in (item for item in tests if item is not None):
            entries += _dcgm_test(category["category"], test)
    return entries
