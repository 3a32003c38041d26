"""The checks of gpu_health.py that look past nvidia-smi's GPU list: the PCI bus, the NVSwitch fabric
manager, each TensorFlow stack's venv against its lock, the memory details of the ecc check's findings
and, on request, NVIDIA DCGM's diagnostic.

gpu_health.py imports this file by name from its own folder: files/health in a clone of the
collection, the install folder on a host, where the role copies it beside gpu_health.py with
gpu_parsers.py and gpu_lock.py. The readers here read files only; the commands these checks need,
``systemctl is-active nvidia-fabricmanager``, ``dcgmi diag -r LEVEL -j`` and the ecc details' ``nvidia-smi
-q``, are run by gpu_health.py and their answers read here (:func:`fabric_manager_answer`,
:func:`dcgm_answer`, :func:`ecc_detail_answer`).
Each judge is a pure function that returns findings in the
form of gpu_health.py, ``{"check", "bus_id", "cause", "fix"}`` (bus_id None for the host).

- ``pci``: the NVIDIA GPUs (vendor ``10de``, class ``0300`` VGA or ``0302`` 3D controller) that the
  kernel sees on the PCI bus, from ``/sys/bus/pci/devices/<bus id>/{vendor,device,class}``
  (gpu_parsers.parse_sysfs_pci; the Linux kernel documentation "Accessing PCI device resources
  through sysfs", https://docs.kernel.org/PCI/sysfs-pci.html), against the baseline and against
  what nvidia-smi lists. A GPU that fell off the bus (NVIDIA "XID Errors",
  https://docs.nvidia.com/deploy/xid-errors/, Xid 79) stays in sysfs while NVML no longer lists it;
  a GPU gone from sysfs is gone from the bus.
- ``fabric_manager``: on NVSwitch systems (HGX) NVIDIA Fabric Manager sets up the NVSwitch fabric,
  and CUDA work on the GPUs waits for it; its version must match the driver's (NVIDIA Fabric
  Manager User Guide, https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/).
  ``systemctl is-active UNIT`` prints the unit's active state (systemctl(1), ``is-active``; the
  states are those ``systemctl --state=help`` lists).
- ``venv``: what a venv holds, read without running its Python: each
  ``lib/python3.*/site-packages/*.dist-info/METADATA`` (Python Packaging User Guide, "Recording
  installed projects",
  https://packaging.python.org/en/latest/specifications/recording-installed-packages/), whose
  ``Name:`` and ``Version:`` header fields ("Core metadata specifications",
  https://packaging.python.org/en/latest/specifications/core-metadata/) are compared with the lock
  by gpu_lock.lock_drift. Legacy ``*.egg-info`` installs are not read (pip installs a lock's wheels
  as ``.dist-info``).
- ``ecc`` details: only for a GPU that the ecc check (in gpu_health.py) has a finding on, gpu_health.py runs
  ``nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER -i <bus id>`` (nvidia-smi(1), ``-q``, ``-d``, ``-i``;
  NVML takes a PCI bus id ``domain:bus:device.function`` for ``-i``, NVML API Reference,
  ``nvmlDeviceGetHandleByPciBusId_v2``) and its answer is read here (gpu_parsers.parse_query_details and
  memory_error_details) into a sentence that ends each of that GPU's ecc findings: remapped rows, retired
  pages and uncorrectable ECC errors, as far as the GPU reports them. An answer that fails or cannot be
  read only leaves the sentence out.
- ``dcgm`` (only with ``--dcgm-diag LEVEL``): NVIDIA DCGM's active diagnostic, ``dcgmi diag -r LEVEL
  -j``, run by gpu_health.py and read here (gpu_parsers.parse_dcgmi_diag, whose docstring names the
  JSON's sources). A finding per failed test result, naming its GPU and DCGM's message, whose last
  sentence is DCGM's own next step; ``Warn`` results are listed, not findings. The fix follows the
  DCGM User Guide, "DCGM Diagnostics"
  (https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html): level 1 is a
  readiness check, level 2 the check after a failure, levels 3 and 4 the post-mortem an
  administrator runs on a drained host. dcgmi not installed, or no host engine to run the
  diagnostic (what ``dcgmi/Command.cpp`` and ``dcgmi/Diag.cpp`` of https://github.com/NVIDIA/DCGM
  print then; ``nvidia-dcgm.service`` runs ``nv-hostengine``, DCGM's "Install DCGM" guide), skips the
  check; a diagnostic past ``--dcgm-timeout`` or one DCGM could not complete is a finding.
- the textfile's reader (a note, never a finding): whether a node_exporter process on the host reads the
  folder the metrics go to, from each process's ``/proc/<pid>/cmdline`` (proc(5)): its
  ``--collector.textfile.directory`` ("Textfile Collector" in https://github.com/prometheus/node_exporter),
  else the folder its build defaults to - Debian's and Ubuntu's ``prometheus-node-exporter``
  ``/var/lib/prometheus/node-exporter`` (its ``--help``), an upstream ``node_exporter`` none - and not
  with ``--no-collector.textfile``, or ``--collector.disable-defaults`` without ``--collector.textfile``.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

try:
    import gpu_lock
    import gpu_parsers
except ImportError:  # a clone of the collection: the shared modules are in plugins/module_utils
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins", "module_utils"))
    import gpu_lock
    import gpu_parsers

DEFAULT_PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DEVICE_FILES = ("vendor", "device", "class")
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"
# systemctl --state=help, "Available unit ACTIVE states"; some systemd versions print "unknown" for a
# unit they have not loaded (not installed), which is not running either.
UNIT_RUNNING = frozenset({"active", "reloading", "refreshing"})
UNIT_STATES = UNIT_RUNNING | {"inactive", "failed", "activating", "deactivating", "maintenance", "unknown"}
DRIFT_SHOWN = 3  # differences named in a venv finding; the rest are counted
# nvidia-smi -q -d: the display types of a GPU's memory error state, as nvidia-smi -h lists them (driver 590.48.01
# in the captures of https://github.com/utkuozdemir/nvidia_gpu_exporter, internal/captures/).
ECC_DETAIL_DISPLAY = "ECC,PAGE_RETIREMENT,ROW_REMAPPER"

PCI_SKIP_FIX = "point --pci-devices at this host's /sys/bus/pci/devices or a folder of its layout"
FIX_PCI_GONE = (
    "Drain the host and power-cycle it (a warm reboot may not bring the GPU back); if it stays gone, "
    "reseat it, check its slot, riser and power cables, and read the BMC's event log (`ipmitool sel elist`)."
)
FIX_PCI_UNLISTED = (
    "Look for Xid 79 (fallen off the bus) and NVRM errors at driver load for this bus id in "
    "`journalctl -k`; drain the host, then reset the GPU or reboot (nvidia-smi cannot reset a GPU "
    "it does not list), and reseat or RMA a GPU that drops off again."
)
FIX_VENV = "Rerun site.yml (tf_venv) to restore the lock, or update the lock (`make locks`) and verify (verify.yml)."

DCGMI_MISSING = "dcgmi not installed (NVIDIA DCGM)"
# What dcgmi prints when no host engine answers (https://github.com/NVIDIA/DCGM): dcgmi/Command.cpp,
# Connect and DoExecuteConnectionFailure; `dcgmi diag` without --host then starts an embedded host
# engine and, when that fails too, prints dcgmi/Diag.cpp's StartDiag::DoExecuteConnectionFailure line.
DCGM_NO_HOSTENGINE = (
    "unable to connect to host engine",
    "unable to establish a connection to the specified host",
    "unable to start an embedded host engine",
)
DCGM_PASSED = {"Pass": 1, "Warn": 1, "Fail": 0}  # DCGM: WARN "passed with warnings"; Skip/Not Run did not run
FIX_DCGM_HOSTENGINE = (
    "start DCGM's host engine, `systemctl enable --now nvidia-dcgm` (the service that runs nv-hostengine), "
    "check that `dcgmi discovery -l` lists the GPUs, and read `journalctl -u nvidia-dcgm` if it stops"
)
FIX_DCGM_RUNTIME = (
    "Read DCGM's message: drain the host so that no job and no other diagnostic uses the GPUs, rerun "
    "`dcgmi diag -r {level}` by hand, and if it still cannot complete restart DCGM (`systemctl restart "
    "nvidia-dcgm`) and read `journalctl -u nvidia-dcgm` (DCGM User Guide, Diagnostics)."
)
FIX_DCGM_HUNG = (
    "A diagnostic that hangs usually means a GPU in a bad state: drain the host, look for Xid errors in "
    "`journalctl -k` and at `nvidia-smi`, reset the GPUs or reboot, then rerun `dcgmi diag -r {level}` by hand; "
    "if level {level} legitimately takes longer on this host (DCGM: level 3 about 15 minutes, level 4 longer), "
    "raise --dcgm-timeout."
)
FIX_DCGM_FAILED = (
    "Drain the host and read DCGM's message (it ends with DCGM's next step); then rerun the diagnostic on the "
    "idle host at {higher} (levels 3 and 4 are DCGM's post-mortem tests), and RMA the GPU if the test keeps "
    "failing (DCGM User Guide, Diagnostics)."
)


def finding(check: str, bus_id: str | None, cause: str, fix: str) -> dict[str, Any]:
    """One finding: which check, which GPU (None: the host), what is wrong and what to do."""
    return {"check": check, "bus_id": bus_id, "cause": cause, "fix": fix[:1].upper() + fix[1:]}


def _read_text(path: str) -> str:
    """The text of a small file, or '' when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def read_pci_devices(path: str) -> tuple[dict[str, dict[str, str]] | None, str | None]:
    """``{folder: {"vendor", "device", "class": text}}`` of each PCI function folder under ``path``
    (the sysfs layout; a file that cannot be read is ''), and None; or None and why not."""
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        return None, f"the PCI device folder {path} cannot be read ({exc.strerror or exc}); {PCI_SKIP_FIX}"
    devices = {name: {key: _read_text(os.path.join(path, name, key)) for key in PCI_DEVICE_FILES} for name in names}
    return devices, None


def pci_gpus(path: str, listed: list[str]) -> tuple[list[str] | None, str | None]:
    """The bus ids of the NVIDIA GPUs on the PCI bus (sysfs folder ``path``), and None; or None and
    why the pci check is skipped. ``listed``: the bus ids nvidia-smi lists. NVML lists only GPUs on
    the bus, so a folder without one of them is not this host's bus (a container sees the /sys of
    the machine it runs on) and is not judged."""
    devices, why = read_pci_devices(path)
    if devices is None:
        return None, why
    try:
        found = [gpu["pci_bus_id"] for gpu in gpu_parsers.parse_sysfs_pci(devices)]
    except ValueError as exc:
        return None, f"{path} is not a PCI device folder ({exc}); {PCI_SKIP_FIX}"
    absent = sorted(set(listed) - set(found))
    if absent:
        return None, (
            f"{path} lacks {len(absent)} of the {len(listed)} GPUs nvidia-smi lists (first {absent[0]}), so it is "
            f"not this host's PCI bus (a container sees the /sys of the machine it runs on); {PCI_SKIP_FIX}"
        )
    return found, None


def judge_pci(gpus: list[dict[str, Any]], on_bus: list[str], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Each GPU of the baseline gone from the PCI bus, each GPU on the bus that nvidia-smi does not
    list, and the count on the bus below the baseline's expected_gpus (when no bus id says it)."""
    listed, bus, expected = {gpu["pci_bus_id"] for gpu in gpus}, set(on_bus), baseline["expected_gpus"]
    gone = sorted(set(baseline["gpus"]) - bus)
    findings = [
        finding(
            "pci",
            bus_id,
            f"GPU {bus_id} of the baseline is gone from the PCI bus: the kernel no longer sees it.",
            FIX_PCI_GONE,
        )
        for bus_id in gone
    ]
    findings += [
        finding(
            "pci",
            bus_id,
            f"GPU {bus_id} is on the PCI bus but nvidia-smi does not list it: it fell off the bus, or the driver did not initialise it.",
            FIX_PCI_UNLISTED,
        )
        for bus_id in sorted(bus - listed)
    ]
    if len(bus) < expected and not gone:
        cause = f"The PCI bus has {len(bus)} NVIDIA GPUs; the baseline expects {expected}."
        findings.append(finding("pci", None, cause, FIX_PCI_GONE))
    return findings


def fabric_manager_expected(baseline: dict[str, Any]) -> bool:
    """Whether the baseline says this is an NVSwitch system (any GPU's fabric_manager_expected)."""
    return any(gpu.get("fabric_manager_expected") for gpu in baseline["gpus"].values())


def fabric_manager_answer(command: str, stdout: str, stderr: str) -> dict[str, str | None]:
    """``{"state", "note"}`` from the answer of ``systemctl is-active nvidia-fabricmanager``: the unit's
    state, or None and why there is none (systemd not running, as in most containers)."""
    words = stdout.split()
    if words and words[0] in UNIT_STATES:
        return {"state": words[0], "note": None}
    said = " ".join((stdout + " " + stderr).split())[:200] or "no output"
    return {"state": None, "note": f"`{command}` printed no unit state ({said}): systemd does not run here"}


def judge_fabric_manager(state: str, driver: str | None) -> list[dict[str, Any]]:
    """A finding when nvidia-fabricmanager, which the baseline expects, is not running."""
    if state in UNIT_RUNNING:
        return []
    cause = (
        f"The nvidia-fabricmanager service is {state}; the baseline expects it (NVSwitch system): without it the "
        "NVSwitch fabric is not set up and CUDA work on these GPUs fails to start."
    )
    version = f" ({driver})" if driver else ""
    fix = (
        "Start and enable it, `systemctl enable --now nvidia-fabricmanager`, and read "
        f"`journalctl -u nvidia-fabricmanager` if it stops: its version must match the driver's{version}, "
        "so `nv-fabricmanager --version` must print the driver's version; upgrade both together."
    )
    return [finding("fabric_manager", None, cause, fix)]


def validate_stacks(stacks: Any) -> dict[str, dict[str, str]]:
    """The baseline's ``stacks`` (None: {}): ``{name: {"venv", "lock"}}``, both absolute paths; the
    lock defaults to ``<venv>/tf-lock.txt`` (gpu_lock.VENV_LOCK_FILE).

    Raises:
        ValueError: it does not follow the schema; the message names the key.
    """
    if stacks is None:
        return {}
    if not isinstance(stacks, dict):
        raise ValueError("stacks is not an object keyed by stack name")
    checked = {}
    for name, entry in stacks.items():
        if not name:
            raise ValueError("stacks has an empty stack name")
        if not isinstance(entry, dict):
            raise ValueError(f"stacks[{name!r}] is not an object")
        venv = entry.get("venv")
        lock = entry.get("lock", os.path.join(venv, gpu_lock.VENV_LOCK_FILE) if isinstance(venv, str) else None)
        for key, value in (("venv", venv), ("lock", lock)):
            if not isinstance(value, str) or not os.path.isabs(value):
                raise ValueError(f"stacks[{name!r}].{key} is {value!r}, not an absolute path")
        checked[name] = {"venv": venv, "lock": lock}
    return checked


def dist_info(folder: str) -> tuple[str | None, str | None]:
    """Name and version of one ``*.dist-info`` folder: its METADATA's ``Name:`` and ``Version:``
    headers, else the folder's name ``{name}-{version}.dist-info``; (None, None) when neither says."""
    fields: dict[str, str] = {}
    try:
        with open(os.path.join(folder, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the headers end at the first blank line; the description follows
                key, colon, value = line.partition(":")
                if colon and key in ("Name", "Version"):
                    fields.setdefault(key, value.strip())
    except OSError:
        pass
    if fields.get("Name") and fields.get("Version"):
        return fields["Name"], fields["Version"]
    name, dash, version = os.path.basename(folder)[: -len(".dist-info")].rpartition("-")
    return (name, version) if dash and name and version else (None, None)


def read_installed(venv: str) -> dict[str, str] | None:
    """``{normalised name: version}`` of every distribution in the venv's
    ``lib/python3.*/site-packages``, or None when it has no such folder."""
    folders = sorted(glob.glob(os.path.join(glob.escape(venv), "lib", "python3.*", "site-packages")))
    if not folders:
        return None
    installed = {}
    for folder in folders:
        for info in sorted(glob.glob(os.path.join(glob.escape(folder), "*.dist-info"))):
            name, version = dist_info(info)
            if name and version:
                installed[gpu_lock.normalize_name(name)] = version
    return installed


def read_stack(venv: str, lock: str) -> dict[str, Any]:
    """What a stack's venv holds and its lock pins: ``{"venv", "lock", "installed", "lock_text",
    "problem"}``; ``problem`` says why they cannot be compared (the venv or the lock is gone)."""
    seen: dict[str, Any] = {"venv": venv, "lock": lock, "installed": None, "lock_text": None, "problem": None}
    if not os.path.isdir(venv):
        seen["problem"] = f"its venv {venv} is gone"
        return seen
    seen["installed"] = read_installed(venv)
    if seen["installed"] is None:
        seen["problem"] = f"its venv {venv} has no lib/python3.*/site-packages"
        return seen
    try:
        with open(lock, encoding="utf-8") as handle:
            seen["lock_text"] = handle.read()
    except OSError as exc:
        seen["problem"] = f"its lock {lock} cannot be read ({exc.strerror or exc})"
    return seen


def drift_summary(drift: dict[str, Any]) -> str:
    """``1 changed, 2 extra: numpy 1.26.4 installed, the lock has 1.24.3; ...`` (the first
    :data:`DRIFT_SHOWN` differences, then how many more)."""
    counts = ", ".join(f"{len(drift[key])} {key}" for key in ("changed", "missing", "extra") if drift[key])
    lines = list(drift["lines"])
    shown = "; ".join(lines[:DRIFT_SHOWN])
    more = f"; and {len(lines) - DRIFT_SHOWN} more" if len(lines) > DRIFT_SHOWN else ""
    return f"{counts}: {shown}{more}"


def judge_venv(stacks: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A finding per stack whose venv or lock is gone, or whose venv differs from its lock."""
    findings = []
    for name, seen in sorted(stacks.items()):
        if seen["problem"]:
            findings.append(finding("venv", None, f"Stack {name}: {seen['problem']}.", FIX_VENV))
            continue
        drift = gpu_lock.lock_drift(seen["lock_text"], seen["installed"])
        if not drift["ok"]:
            cause = f"The venv {seen['venv']} of stack {name} differs from its lock {seen['lock']} ({drift_summary(drift)})."
            findings.append(finding("venv", None, cause, FIX_VENV))
    return findings


def ecc_detail_command(nvidia_smi: str, bus_id: str) -> list[str]:
    """The command that shows one GPU's memory error state (:data:`ECC_DETAIL_DISPLAY`)."""
    return [nvidia_smi, "-q", "-d", ECC_DETAIL_DISPLAY, "-i", bus_id]


def _number(count: int | None) -> str:
    return "N/A" if count is None else str(count)


def _yes_no(flag: bool | None) -> str:
    return "N/A" if flag is None else ("Yes" if flag else "No")


def memory_error_words(details: dict[str, dict[str, Any]]) -> str:
    """gpu_parsers.memory_error_details in words, leaving out each part the GPU does not report at all:
    ``Remapped rows: 3 uncorrectable, 0 correctable, pending Yes, failure No. Retired pages: ...``."""
    rows, pages, ecc = details["remapped_rows"], details["retired_pages"], details["ecc_uncorrected"]
    parts = [
        f"Remapped rows: {_number(rows['uncorrectable'])} uncorrectable, {_number(rows['correctable'])} correctable, "
        f"pending {_yes_no(rows['pending'])}, failure {_yes_no(rows['failure'])}.",
        f"Retired pages: {_number(pages['single_bit'])} single-bit, {_number(pages['double_bit'])} double-bit, "
        f"pending {_yes_no(pages['pending'])}.",
        f"Uncorrectable ECC errors: {_number(ecc['volatile'])} volatile, {_number(ecc['aggregate'])} aggregate.",
    ]
    reported = [any(value is not None for value in part.values()) for part in (rows, pages, ecc)]
    return " ".join(part for part, shown in zip(parts, reported) if shown)


def ecc_detail_answer(bus_id: str, rc: int, stdout: str) -> str | None:
    """The memory error state of GPU ``bus_id`` in words (:func:`memory_error_words`) from what
    :func:`ecc_detail_command` answered; None when it failed, lacks the GPU or cannot be read."""
    try:
        section = gpu_parsers.parse_query_details(stdout).get(bus_id) if rc == 0 else None
    except ValueError:
        return None
    if not section:
        return None
    return memory_error_words(gpu_parsers.memory_error_details(section)) or None


def with_ecc_details(findings: list[dict[str, Any]], details: dict[str, str]) -> list[dict[str, Any]]:
    """The ecc findings, each of a GPU in ``details`` ({bus_id: words}) with those words after its cause."""
    return [
        {**item, "cause": f"{item['cause']} {details[item['bus_id']]}"} if details.get(item["bus_id"]) else item
        for item in findings
    ]


def dcgm_command(dcgmi: str, level: int) -> list[str]:
    """The diagnostic's command line: level ``level`` with JSON output."""
    return [dcgmi, "diag", "-r", str(level), "-j"]


def dcgm_seen(level: int, tests: list[dict[str, Any]], note: str | None = None, error: Any = None) -> dict[str, Any]:
    """What the dcgm check saw: ``{"level", "tests", "note", "error"}``; a note skips the check, an
    error (``{"cause", "fix"}``) is its finding."""
    return {"level": level, "tests": tests, "note": note, "error": error}


def dcgm_unstarted(level: int, command: str, missing: bool, why: str) -> dict[str, Any]:
    """dcgmi could not be started: not installed (``missing``), or not runnable for ``why``."""
    return dcgm_seen(level, [], DCGMI_MISSING if missing else f"`{command}` could not be run ({why})")


def dcgm_hung(level: int, command: str, timeout: float) -> dict[str, Any]:
    """The diagnostic ran past its time and was stopped: a finding."""
    cause = f"`{command}` did not finish within {timeout:g} s and was stopped: the DCGM diagnostic hung."
    return dcgm_seen(level, [], error={"cause": cause, "fix": FIX_DCGM_HUNG.format(level=level)})


def dcgm_answer(level: int, command: str, rc: int, stdout: str, stderr: str) -> dict[str, Any]:
    """Read what ``dcgmi diag -r LEVEL -j`` answered: its results, DCGM's runtime error (a finding), no
    host engine (skipped, with the fix) or an answer in no known form (skipped)."""
    said = " ".join((stdout + " " + stderr).split())
    try:
        return dcgm_seen(level, gpu_parsers.parse_dcgmi_diag(stdout))
    except gpu_parsers.DcgmiDiagRuntimeError as exc:
        cause = f"DCGM could not complete the diagnostic (`{command}`): {exc}"
        return dcgm_seen(level, [], error={"cause": cause, "fix": FIX_DCGM_RUNTIME.format(level=level)})
    except ValueError as exc:
        if any(words in said.lower() for words in DCGM_NO_HOSTENGINE):
            return dcgm_seen(
                level, [], f"`{command}` could not reach DCGM's host engine ({said[:200]}); fix: {FIX_DCGM_HOSTENGINE}"
            )
        return dcgm_seen(
            level,
            [],
            f"`{command}` exited with status {rc} without results ({exc}; it said: {said[:200] or 'nothing'})",
        )


def _dcgm_where(entry: dict[str, Any], bus_ids: dict[int, str]) -> tuple[str | None, str]:
    """The bus id of a result's GPU (nvidia-smi's index is DCGM's GPU id) and words for it."""
    if entry["gpu"] is None:
        return None, "the host (no GPU named)"
    bus_id = bus_ids.get(entry["gpu"])
    return bus_id, f"GPU {entry['gpu']}" + (f" ({bus_id})" if bus_id else "")


def judge_dcgm(seen: dict[str, Any], gpus: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A finding per failed result (a test's summary only when no GPU's result of it failed), or the
    diagnostic's hang or runtime error."""
    if seen["error"]:
        return [finding("dcgm", None, seen["error"]["cause"], seen["error"]["fix"])]
    level, bus_ids = seen["level"], {gpu["index"]: gpu["pci_bus_id"] for gpu in gpus or []}
    higher = "level 4, `dcgmi diag -r 4`" if level >= 3 else "level 3, `dcgmi diag -r 3`"
    failed = [entry for entry in seen["tests"] if entry["result"] == "Fail"]
    owned = {(entry["category"], entry["test"]) for entry in failed if entry["gpu"] is not None}
    findings = []
    for entry in failed:
        if entry["gpu"] is None and (entry["category"], entry["test"]) in owned:
            continue
        bus_id, where = _dcgm_where(entry, bus_ids)
        said = "; ".join(entry["warnings"]) or "DCGM gave no message"
        cause = f"DCGM diagnostic (level {level}) {entry['category']}/{entry['test']} failed on {where}: {said}"
        findings.append(finding("dcgm", bus_id, cause, FIX_DCGM_FAILED.format(higher=higher)))
    return findings


def dcgm_report(seen: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report's ``dcgm``: ``{"level", "tests"}`` (parse_dcgmi_diag's results), None when not run."""
    return None if seen is None else {"level": seen["level"], "tests": seen["tests"]}


def dcgm_samples(dcgm: dict[str, Any] | None) -> list[tuple[dict[str, str], int]]:
    """``gpu_fleet_health_dcgm_test_passed{test,gpu}``: 1 passed (Warn too), 0 failed; ``gpu=""`` a
    result of no GPU (a test's summary); Skip and Not Run give none; one series per test and GPU
    (a failure wins)."""
    passed: dict[tuple[str, str], int] = {}
    for entry in (dcgm or {}).get("tests") or []:
        if entry["result"] in DCGM_PASSED:
            key = (entry["test"], "" if entry["gpu"] is None else str(entry["gpu"]))
            passed[key] = min(passed.get(key, 1), DCGM_PASSED[entry["result"]])
    return [({"test": test, "gpu": gpu}, value) for (test, gpu), value in passed.items()]


def dcgm_lines(dcgm: dict[str, Any] | None) -> list[str]:
    """The diagnostic in the report for people: a count of each result, then each warning."""
    if not dcgm or not dcgm["tests"]:
        return []
    counts: dict[str, int] = {}
    for entry in dcgm["tests"]:
        counts[entry["result"]] = counts.get(entry["result"], 0) + 1
    said = ", ".join(f"{count} {result}" for result, count in counts.items())
    lines = [f"  [dcgm] dcgmi diag level {dcgm['level']}: {len(dcgm['tests'])} result(s): {said}"]
    for entry in (item for item in dcgm["tests"] if item["result"] == "Warn"):
        where = "host" if entry["gpu"] is None else f"GPU {entry['gpu']}"
        message = "; ".join(entry["warnings"] + entry["info"]) or "no message"
        lines.append(f"  [dcgm] {where}: Warn in {entry['category']}/{entry['test']} (not a finding): {message}")
    return lines


# node_exporter's program names (upstream's binary, Debian's and Ubuntu's package) and the folder each reads
# textfiles from when its command line names none.
NODE_EXPORTERS = {"node_exporter": None, "prometheus-node-exporter": "/var/lib/prometheus/node-exporter"}
TEXTFILE_FLAG = "--collector.textfile.directory"
FIX_NO_TEXTFILE_READER = (
    "Install node_exporter (Debian's and Ubuntu's prometheus-node-exporter reads that folder as it is), start it "
    "with --collector.textfile.directory={folder}, or set gpu_health_textfile_dir to the folder yours reads; the "
    'check and its reports work without it (docs/monitoring.md, "A host without node_exporter").'
)


def textfile_folders(argv: list[str]) -> list[str]:
    """The textfile folders of one node_exporter command line (none where its textfile collector is off)."""
    if "--no-collector.textfile" in argv or (
        "--collector.disable-defaults" in argv and "--collector.textfile" not in argv
    ):
        return []
    folders = [arg.split("=", 1)[1] for arg in argv if arg.startswith(TEXTFILE_FLAG + "=")]
    folders += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == TEXTFILE_FLAG]
    default = NODE_EXPORTERS.get(os.path.basename(argv[0]))
    return [folder for part in folders for folder in part.split(",") if folder] or ([default] if default else [])


def node_exporters(proc: str = "/proc") -> dict[str, list[str]]:
    """``{"<program> (pid N)": [textfile folders]}`` of each node_exporter process that ``proc`` shows."""
    found = {}
    for path in sorted(glob.glob(os.path.join(proc, "[0-9]*", "cmdline"))):
        try:
            with open(path, "rb") as handle:
                argv = [arg.decode("utf-8", "replace") for arg in handle.read().split(b"\0") if arg]
        except OSError:
            continue  # a process that ended meanwhile
        if argv and os.path.basename(argv[0]) in NODE_EXPORTERS:
            found[f"{os.path.basename(argv[0])} (pid {os.path.basename(os.path.dirname(path))})"] = textfile_folders(
                argv
            )
    return found


def textfile_note(textfile: str | None, proc: str = "/proc") -> dict[str, str] | None:
    """``{"cause", "fix"}`` when no node_exporter on the host reads the folder of ``textfile``; None when one
    does, or no textfile is written."""
    if not textfile:
        return None
    folder = os.path.dirname(os.path.abspath(textfile))
    exporters = node_exporters(proc)
    readers = [name for name, folders in exporters.items() if folder in (os.path.abspath(f) for f in folders)]
    if readers:
        return None
    if exporters:
        seen = "; ".join(
            f"{name} reads {', '.join(folders) or 'no textfile folder'}" for name, folders in exporters.items()
        )
        why = f"no node_exporter on this host reads that folder ({seen})"
    else:
        why = "no node_exporter runs on this host"
    cause = f"The health metrics go to {textfile}, but {why}: no Prometheus sees them."
    return {"cause": cause, "fix": FIX_NO_TEXTFILE_READER.format(folder=folder)}
