"""Pure parsers for ``nvidia-smi`` and ``lspci -nn`` output, shared by the ``nvidia_gpu_facts`` module.

No function here runs a command or reads a file, so each one is tested with canned output
(tests/fixtures/nvidia_smi/). Sources for the formats:

- ``nvidia-smi --help-query-gpu`` (field meanings, ``[N/A]`` placeholders, ``pci.bus_id`` as
  ``domain:bus:device.function`` in hex) and real captures such as
  utkuozdemir/nvidia_gpu_exporter ``testdata/captures/linux-x86_64__nvidia-h200__590.48.01.txt``
  (``[Requested functionality has been deprecated]`` also appears in place of a value).
- ``nvidia-smi topo -m``: a tab-separated matrix, header ``\\tGPU0\\tGPU1\\t...\\tCPU Affinity\\t
  NUMA Affinity\\tGPU NUMA ID``, then a blank line, ``Legend:`` and, with NICs, ``NIC Legend:``.
  On a terminal the header carries ANSI underline codes, which are stripped.
- ``lspci -nn`` (pciutils): ``BB:DD.F Class name [CCCC]: Vendor Device [VVVV:DDDD] (rev RR)``;
  with ``-D`` the address has a domain, ``DDDD:BB:DD.F``.
- /work/shared/reference/nvidia-tensorflow-facts.md sections 6 and 7.
"""

from __future__ import annotations

import csv
import re
from typing import Any

# The order of these fields is the order of the CSV columns; the module builds its command line from it.
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
_LSPCI_LINE = re.compile(
    r"^(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<class_name>.*?)\s*\[(?P<class_code>[0-9a-fA-F]{4})\]:\s+"
    r"(?P<description>.*?)\s*\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
    r"(?:\s+\(rev [0-9a-fA-F]+\))?(?:\s+\(prog-if [^)]*\))?\s*$"
)
_DEVICE_LABEL = re.compile(r"^(GPU|NIC)\d+$")
_NVLINK_CELL = re.compile(r"^NV(\d+)$")


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


def _is_placeholder(value: str) -> bool:
    """True for nvidia-smi's bracketed non-values: ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``...."""
    return value.startswith("[") and value.endswith("]")


def _optional_int(value: str, field: str) -> int | None:
    """``"16"`` -> 16; a bracketed placeholder -> None; anything else is a parse error."""
    if _is_placeholder(value) or value in ("N/A", ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"nvidia-smi field {field} is {value!r}, not a whole number") from None


def _optional_bool(value: str, field: str) -> bool | None:
    """``Enabled``/``Disabled`` -> True/False; a bracketed placeholder -> None."""
    if _is_placeholder(value) or value in ("N/A", ""):
        return None
    lowered = value.lower()
    if lowered in ("enabled", "on", "yes"):
        return True
    if lowered in ("disabled", "off", "no"):
        return False
    raise ValueError(f"nvidia-smi field {field} is {value!r}, not Enabled or Disabled")


def _optional_str(value: str) -> str | None:
    return None if _is_placeholder(value) or value in ("N/A", "") else value


def parse_query_gpu(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``.

    Returns one dict per GPU, in nvidia-smi's order, with the keys ``index`` (int), ``name``,
    ``uuid``, ``pci_bus_id`` (normalised by :func:`normalize_bus_id`), ``memory_total_mib`` (int,
    MiB; ``nounits`` drops the `` MiB``), ``compute_capability`` (str such as ``"8.0"``),
    ``driver_version``, ``pcie_link_gen_current``, ``pcie_link_gen_max``, ``pcie_link_width_current``,
    ``pcie_link_width_max`` (ints, lanes for the widths) and ``persistence_mode`` (bool). Any value
    nvidia-smi prints in brackets (``[N/A]``, ``[Not Supported]``) becomes None.
    Blank lines are ignored; "No devices were found" gives an empty list.

    Raises:
        ValueError: a line has the wrong number of fields or a field has an impossible value.
    """
    gpus: list[dict[str, Any]] = []
    lines = [line for line in _strip_ansi(text).splitlines() if line.strip()]
    if any("no devices were found" in line.lower() for line in lines):
        return gpus
    for line_number, row in enumerate(csv.reader(lines, skipinitialspace=True), start=1):
        values = [value.strip() for value in row]
        if len(values) != len(QUERY_FIELDS):
            raise ValueError(
                f"line {line_number} of the nvidia-smi --query-gpu output has {len(values)} fields, "
                f"expected {len(QUERY_FIELDS)} ({','.join(QUERY_FIELDS)}): {lines[line_number - 1]!r}"
            )
        raw = dict(zip(QUERY_FIELDS, values))
        index = _optional_int(raw["index"], "index")
        if index is None:
            raise ValueError(f"line {line_number} of the nvidia-smi --query-gpu output has no GPU index")
        try:
            bus_id = normalize_bus_id(raw["pci.bus_id"])
        except ValueError:
            raise ValueError(
                f"nvidia-smi field pci.bus_id is {raw['pci.bus_id']!r} for GPU {index}, not a PCI address"
            ) from None
        gpus.append(
            {
                "index": index,
                "name": raw["name"],
                "uuid": raw["uuid"],
                "pci_bus_id": bus_id,
                "memory_total_mib": _optional_int(raw["memory.total"], "memory.total"),
                "compute_capability": _optional_str(raw["compute_cap"]),
                "driver_version": _optional_str(raw["driver_version"]),
                "pcie_link_gen_current": _optional_int(raw["pcie.link.gen.current"], "pcie.link.gen.current"),
                "pcie_link_gen_max": _optional_int(raw["pcie.link.gen.max"], "pcie.link.gen.max"),
                "pcie_link_width_current": _optional_int(raw["pcie.link.width.current"], "pcie.link.width.current"),
                "pcie_link_width_max": _optional_int(raw["pcie.link.width.max"], "pcie.link.width.max"),
                "persistence_mode": _optional_bool(raw["persistence_mode"], "persistence_mode"),
            }
        )
    return gpus


def _strip_ansi(text: str) -> str:
    return _ANSI_ESCAPE.sub("", text)


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
        if not tokens:
            break
        label = tokens[0]
        if not _DEVICE_LABEL.match(label):
            break
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


def _lspci_nvidia_devices(text: str) -> list[dict[str, str]]:
    """Every NVIDIA (vendor 10de) function in ``lspci -nn`` output, with its class code."""
    devices = []
    for line in _strip_ansi(text).splitlines():
        match = _LSPCI_LINE.match(line.strip())
        if not match or match.group("vendor").lower() != NVIDIA_VENDOR_ID:
            continue
        devices.append(
            {
                "pci_bus_id": normalize_bus_id(match.group("bus")),
                "class_code": match.group("class_code").lower(),
                "description": match.group("description").strip(),
                "device_id": f"{NVIDIA_VENDOR_ID}:{match.group('device').lower()}",
            }
        )
    return devices


def parse_lspci(text: str) -> list[dict[str, str]]:
    """NVIDIA GPUs in ``lspci -nn`` (or ``lspci -D -nn``) output.

    Keeps vendor ``10de`` functions of class VGA ``[0300]`` or 3D controller ``[0302]``; skips
    NVIDIA audio ``[0403]``, NVSwitch bridges ``[0680]`` and every other vendor. Returns
    ``[{"pci_bus_id": "0000:17:00.0", "description": "NVIDIA Corporation GA100 [A100 SXM4 80GB]",
    "device_id": "10de:20b2"}, ...]`` sorted by bus ID. Lines in other formats are ignored.
    """
    gpus = [
        {key: device[key] for key in ("pci_bus_id", "description", "device_id")}
        for device in _lspci_nvidia_devices(text)
        if device["class_code"] in GPU_CLASS_CODES
    ]
    return sorted(gpus, key=lambda gpu: gpu["pci_bus_id"])


def parse_lspci_nvswitches(text: str) -> list[str]:
    """Bus IDs of NVIDIA bridge functions ``[0680]`` (NVSwitch chips on HGX boards) in ``lspci -nn`` output."""
    return sorted(
        device["pci_bus_id"] for device in _lspci_nvidia_devices(text) if device["class_code"] == NVSWITCH_CLASS_CODE
    )


def parse_proc_driver_version(text: str) -> str | None:
    """Driver version from ``/proc/driver/nvidia/version``, or None.

    ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  <date>`` and the open module's
    ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build ...``:
    the first token after ``Module`` that starts with a digit (reference section 4.3).
    """
    for line in text.splitlines():
        if not line.startswith("NVRM version:") or "Module" not in line:
            continue
        for token in line.split("Module", 1)[1].split():
            if token[:1].isdigit():
                return token
    return None
