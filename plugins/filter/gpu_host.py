"""Decide, from facts gathered by gpu_preflight, whether a host is fit for the pinned stacks.

Pure functions: the role gathers the raw facts (mounts, /proc/modules, ``mokutil --sb-state``,
kernel headers, nvidia_gpu_facts, compute processes), ``gpu_host_facts`` shapes them and this module
turns them into problems (the host stops) and warnings (the run goes on), each with a cause and a
fix. Exposed to Ansible as the filters ``gpu_host_facts``, ``gpu_host_check``, ``gpu_space_needs``,
``gpu_compute_apps`` and ``gpu_findmnt_mounts``; plain functions for unit tests.

Sources (public):

- NVIDIA CUDA Installation Guide for Linux, https://docs.nvidia.com/cuda/cuda-installation-guide-linux/ :
  "Pre-installation Actions" (a supported distribution; the kernel headers and development packages
  of the running kernel, which building the kernel module needs); "Disabling Nouveau" (nouveau must
  not be loaded when the NVIDIA driver is installed); "Runfile Installation", advanced options:
  ``--tmpdir`` moves the installer's scratch space for when /tmp cannot be used, e.g. when it is
  full or mounted noexec.
- Secure Boot only loads signed kernel modules: the NVIDIA driver README, chapter "Installing the
  NVIDIA Driver", section "Signing the NVIDIA Kernel Module" (shipped per driver release, e.g.
  https://download.nvidia.com/XFree86/Linux-x86_64/470.239.06/README/installdriver.html), and the
  Linux kernel's "Kernel module signing facility", https://docs.kernel.org/admin-guide/module-signing.html.
  Signing needs the private key and its X.509 certificate, the certificate enrolled as a Machine
  Owner Key (mokutil(1), ``--import``); DKMS keeps a pair of its own (``/var/lib/dkms/mok.pub``).
- A kernel upgrade that waits for a reboot: the package manager installs the new kernel's headers,
  not the running kernel's, and the running kernel's may no longer be offered; once the host runs
  the new kernel, its headers are there (NVIDIA Driver Installation Guide, "Pre-installation
  Actions", "Verify the System has the Correct Kernel Packages Installed",
  https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/).
- A run cannot reboot the machine it runs on: ansible.builtin.reboot refuses a local connection
  ("Running reboot with local connection would reboot the control node",
  https://docs.ansible.com/ansible/latest/collections/ansible/builtin/reboot_module.html).
- The GPU count check counts PCI functions as well as nvidia-smi's list, so a missing GPU is found
  before any driver exists: the Linux kernel documentation "Accessing PCI device resources through
  sysfs" (https://docs.kernel.org/PCI/sysfs-pci.html) and lspci(8)
  (https://man7.org/linux/man-pages/man8/lspci.8.html).
- The multi-GPU hardware advice (mixed models, PCIe width, NVLink) is the project's seed guidance.
"""

from __future__ import annotations

import difflib
import json
import posixpath
import re
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_parsers import parse_compute_apps

MIB = 1024 * 1024
# Said after a command a fix suggests where the host has no lspci (pciutils ships it: lspci(8)).
LSPCI_MISSING = " (install pciutils first: this host has no lspci)"
HOST_CHECKS = (
    "root",
    "os",
    "venv_occupied",
    "disk",
    "noexec",
    "nouveau",
    "secure_boot",
    "kernel_headers",
    "reboot_local",
    "gpus_busy",
    "installer_running",
    "pci_devices",
    "gpu_count",
    "kernel_module",
    "mixed_models",
    "pcie_width",
    "nvlink",
)


def mount_for(path: str, mounts: list[dict]) -> dict | None:
    """The mount (an ``ansible_facts['mounts']`` item) holding ``path``; longest mount point wins.

    ``path`` need not exist yet: the folder a runfile will create lives on its parent's mount.
    """
    path = posixpath.normpath(path)
    best = None
    for mount in mounts:
        point = mount.get("mount", "")
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) > len(best["mount"]):
                best = mount
    return best


def findmnt_mounts(data: dict) -> list[dict]:
    """``findmnt --json --bytes --list --output TARGET,OPTIONS,AVAIL`` -> mounts in the shape of
    ``ansible_facts['mounts']`` (``{mount, options, size_available}``), tmpfs and overlay included."""
    return [
        {"mount": fs.get("target"), "options": fs.get("options") or "", "size_available": int(fs.get("avail") or 0)}
        for fs in (data or {}).get("filesystems", [])
    ]


def _target(want: dict) -> str:
    """What to move: 'cuda_toolkit_tmpdir (CUDA installer scratch)' or 'the <purpose> folder'."""
    return f"{want['variable']} ({want['purpose']})" if want.get("variable") else f"the {want['purpose']} folder"


def _mib(value: float) -> str:
    """Bytes as MiB; below 1 MiB as KiB, so that a tiny tmpfs does not read "0 MiB free; 0 MiB needed"."""
    return f"{value / MIB:,.0f} MiB" if value >= MIB else f"{value / 1024:,.0f} KiB"


# What each check reports: (cause, fix) templates, filled with str.format from the fields a check
# function returns for each finding. "<check>/<variant>" is the message of a finding whose fields
# name that variant. "skip_checks" reports settings that name an unknown check.
MESSAGES: dict[str, tuple[str, str]] = {
    "root": (
        "Tasks run as {user} (uid {uid}), not root; the driver, the toolkits and the venvs need root.",
        "Connect as root, or let Ansible become root: become: true (ansible_become) with a user that may sudo.",
    ),
    "venv_occupied": (
        "{path} (venv of stack {stack}) exists and is not a virtual environment (no pyvenv.cfg); "
        "python -m venv would mix its files with what is there.",
        "Move what is there elsewhere, or set the stack's venv: to a new folder.",
    ),
    "os": (
        "{dist} {major} is not a supported OS ({names}).",
        "Use a supported release, or add it to the role's supported list after testing it.",
    ),
    "disk": (
        "{path} ({purpose}) is on {mount} with {free} free; {need} is needed.",
        "Free space on {mount}, or point {target} at a larger disk.",
    ),
    "noexec": (
        "{path} ({purpose}) is on {mount}, mounted noexec; NVIDIA's installers run programs from it.",
        "Point {target} at a file system mounted with exec.",
    ),
    "nouveau": (
        "The nouveau driver is loaded; the NVIDIA kernel module cannot load beside it.",
        "Let the run blacklist it (nvidia_driver_blacklist_nouveau: true) and reboot, then rerun.",
    ),
    "secure_boot": (
        "Secure Boot is on and no module signing key is configured (no nvidia_driver_module_signing_key and "
        "nvidia_driver_module_signing_certificate, no DKMS key /var/lib/dkms/mok.pub); the kernel will refuse the "
        "unsigned NVIDIA module.",
        "Set nvidia_driver_module_signing_key and nvidia_driver_module_signing_certificate to the private key and "
        "certificate of a Machine Owner Key enrolled on the host (mokutil --import), or turn Secure Boot off.",
    ),
    "secure_boot/pair": (
        "Secure Boot is on and the module signing pair is incomplete: {missing}; without both the NVIDIA module "
        "stays unsigned and the kernel refuses it.",
        "Set both nvidia_driver_module_signing_key and nvidia_driver_module_signing_certificate to files on the "
        "controller (the private key and certificate of a Machine Owner Key enrolled on the host with mokutil "
        "--import), or turn Secure Boot off.",
    ),
    "kernel_headers": (
        "No kernel headers for the running kernel {kernel} (/lib/modules/<kernel>/build), and none can be installed.",
        "Install {package} or boot a kernel whose headers are available.",
    ),
    "kernel_headers/pending_reboot": (
        "No kernel headers for the running kernel {kernel}, and none can be installed: a kernel upgrade is pending, "
        "{newer} is installed but the host still runs {kernel}.",
        "Reboot into the new kernel {newer} first, then rerun.",
    ),
    "reboot_local": (
        "nvidia_driver_reboot_allowed is true, but this host is managed over a local connection "
        "(ansible_connection: {connection}); a run cannot reboot the machine it runs on.",
        "Run the play from another controller, or set nvidia_driver_reboot_allowed: false and reboot by hand when "
        "the run asks for it.",
    ),
    "installer_running": (
        "An install from an earlier run is still running on the host: {running}.",
        "Wait for it to finish (or stop it), then rerun; the rerun skips what it completed.",
    ),
    "gpus_busy": (
        "The driver would change while GPUs run compute processes: {listed}.",
        "Drain the host (stop those jobs) and rerun. To change the driver under them anyway (they lose their "
        "GPUs), skip this check (gpu_preflight_skip_checks: [gpus_busy]) and set nvidia_driver_allow_busy_gpus: true.",
    ),
    "pci_devices": (
        "{problem} (gpu_preflight_pci_devices_path): the GPU count check reads the GPUs on the PCI bus there, "
        "before any driver can list them{instead}.",
        "Set gpu_preflight_pci_devices_path to /sys/bus/pci/devices (the default; leave it out of the inventory) or "
        "to a folder of the same layout (<bus id>/vendor, device, class).",
    ),
    "gpu_count": (
        "{expected} GPUs expected, {seen} seen: {where}; bus IDs seen: {bus_ids}.",
        "Reseat or power the missing GPUs and check that the BIOS enables their slots (`lspci -nn -d 10de:`{lspci} "
        "lists what the PCI bus shows), or correct the expected count in the inventory (gpu_verify_expected_gpu_count "
        "or gpu_preflight_expected_gpu_count) if this host has {seen}.",
    ),
    "mixed_models": (
        "Mixed GPU models: {models}; MirroredStrategy runs at the pace of the slowest.",
        "Group hosts by GPU model or accept the slower replicas.",
    ),
    "pcie_width": (
        "PCIe links below x16 on a multi-GPU host: {which}; all-reduce traffic is limited by the narrowest link.",
        "Move the cards to x16 slots or check the riser/BIOS lane settings.",
    ),
    "nvlink": (
        "{count} GPUs without NVLink: gradients cross PCIe, scaling beyond 2 GPUs is usually poor.",
        "Expect lower scaling efficiency, or use NVLink-connected GPUs.",
    ),
    # nvidia_gpu_facts' error names the exit status, nvidia-smi's words, the meaning and the fix (gpu_parsers).
    "kernel_module": (
        "{said}",
        "Until it is loaded the verification fails: nvidia-smi, TensorFlow and every CUDA program see no GPU.",
    ),
    "skip_checks": (
        "gpu_preflight_skip_checks names an unknown check {name!r}{hint}",
        'Use the names {names}, as a list: -e \'{{"gpu_preflight_skip_checks": ["disk"]}}\'.',
    ),
}


def _finding(check: str, fields: dict[str, Any]) -> dict[str, str]:
    """The record of one problem or warning, ``{check, cause, fix}``, from the MESSAGES of ``check``,
    or of ``check/<variant>`` when the fields name a ``variant``."""
    variant = fields.get("variant")
    cause, fix = MESSAGES[f"{check}/{variant}" if variant else check]
    return {"check": check, "cause": cause.format(**fields), "fix": fix.format(**fields)}


# Check functions: facts -> one dict of MESSAGES fields per finding; [] when the host passes.


def _os_supported(facts: dict) -> list[dict[str, Any]]:
    os_facts = facts.get("os") or {}
    supported = facts.get("supported_os") or {}
    dist, major = os_facts.get("distribution"), str(os_facts.get("major_version"))
    known = [str(v) for v in supported.get(dist, [])]
    if major in known or str(os_facts.get("version")) in known:
        return []
    names = ", ".join(f"{d} {'/'.join(str(v) for v in vs)}" for d, vs in supported.items())
    return [{"dist": dist, "major": major, "names": names}]


def _placed(want: dict, mount: dict) -> dict[str, Any]:
    """Fields naming a wanted path, the mount it lands on and the setting that moves it."""
    return {"path": want["path"], "purpose": want["purpose"], "mount": mount["mount"], "target": _target(want)}


def _disk_space(facts: dict) -> list[dict[str, Any]]:
    mounts = facts.get("mounts") or []
    found = []
    for want in facts.get("space") or []:
        mount = mount_for(want["path"], mounts)
        if mount is None:
            continue
        free = int(mount.get("size_available") or 0)
        if free < int(want["need_bytes"]):
            found.append(dict(_placed(want, mount), free=_mib(free), need=_mib(want["need_bytes"])))
    return found


def _noexec(facts: dict) -> list[dict[str, Any]]:
    mounts = facts.get("mounts") or []
    placed = [(want, mount_for(want["path"], mounts)) for want in facts.get("exec_paths") or []]
    return [
        _placed(want, mount) for want, mount in placed if mount and "noexec" in str(mount.get("options", "")).split(",")
    ]


def _nouveau(facts: dict) -> list[dict[str, Any]]:
    return [{}] if re.search(r"^nouveau\s", facts.get("proc_modules") or "", re.M) else []


def _signing_pair_gaps(pair: dict) -> list[str]:
    """What is wrong with a configured key and certificate (``module_signing``), one phrase each."""
    gaps = []
    for part in ("key", "certificate"):
        variable = f"nvidia_driver_module_signing_{part}"
        if not pair.get(part):
            gaps.append(f"{variable} is not set")
        elif not pair.get(f"{part}_found"):
            gaps.append(f"{variable} ({pair[part]}) is not a file on the controller")
    return gaps


def _secure_boot(facts: dict) -> list[dict[str, Any]]:
    """Secure Boot on needs a signing pair: the one configured (both files on the controller) or,
    when none is configured, DKMS's own key on the host."""
    if "SecureBoot enabled" not in (facts.get("secure_boot") or ""):
        return []
    pair = facts.get("module_signing") or {}
    if not (pair.get("key") or pair.get("certificate")):
        return [] if facts.get("signing_key") else [{}]
    gaps = _signing_pair_gaps(pair)
    return [{"variant": "pair", "missing": "; ".join(gaps)}] if gaps else []


def _version_key(name: str) -> tuple:
    """Sort key of a kernel release that orders like ``sort -V``: digit runs as numbers."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.findall(r"\d+|\D+", name))


def _newer_kernel(facts: dict) -> str | None:
    """The newest kernel under /lib/modules (``installed_kernels``) when it is newer than the running one."""
    running = str(facts.get("kernel") or "")
    installed = [k for k in facts.get("installed_kernels") or [] if k != running and k[:1].isdigit()]
    newest = max(installed, key=_version_key, default=None)
    return newest if newest and _version_key(newest) > _version_key(running) else None


def _kernel_headers(facts: dict) -> list[dict[str, Any]]:
    if facts.get("kernel_headers"):
        return []
    fields = {"kernel": facts.get("kernel"), "package": facts.get("kernel_headers_package")}
    newer = _newer_kernel(facts)
    return [dict(fields, variant="pending_reboot", newer=newer) if newer else fields]


def _reboot_local(facts: dict) -> list[dict[str, Any]]:
    connection = str(facts.get("connection") or "")
    local = connection in ("local", "ansible.builtin.local")
    return [{"connection": connection}] if local and facts.get("reboot_allowed") else []


def _installer_running(facts: dict) -> list[dict[str, Any]]:
    running = facts.get("installers") or []
    return [{"running": "; ".join(line[:200] for line in running)}] if running else []


def _gpus_busy(facts: dict) -> list[dict[str, Any]]:
    apps = facts.get("compute_apps") or []
    if not (apps and facts.get("driver_change")):
        return []
    return [{"listed": ", ".join(f"{a.get('process_name')} (pid {a.get('pid')})" for a in apps)}]


def _pci_unread(gpus: dict) -> str:
    """Why neither the PCI folder nor lspci listed the GPUs, naming the folder, its variable and the tool."""
    reasons = (
        [f"{gpus['pci_devices_problem']} (gpu_preflight_pci_devices_path)"] if gpus.get("pci_devices_problem") else []
    )
    if "lspci_path" in gpus:  # facts of an older module do not say
        reasons.append("lspci failed" if gpus["lspci_path"] else "lspci is not installed (pciutils)")
    return "the PCI bus could not be read" + (f": {' and '.join(reasons)}" if reasons else "")


def _gpus_seen(gpus: dict) -> tuple[int, str]:
    """How many GPUs the host shows (the larger of nvidia-smi's and the PCI bus's count) and who saw what, each
    source named with why it gave nothing (not installed, the folder missing, ...) where it did not."""
    smi = int(gpus.get("count") or 0)
    pci = gpus.get("pci_count")
    if gpus.get("source") == "nvidia-smi":
        by_smi = f"nvidia-smi lists {smi}"
    else:
        by_smi = gpus.get("nvidia_smi_problem") or "nvidia-smi gave no list"
    if pci is None:
        return smi, f"{by_smi}; {_pci_unread(gpus)}"
    if gpus.get("pci_source") == "sysfs":
        folder = gpus.get("pci_devices_path") or "sysfs"
        return max(smi, int(pci)), f"{by_smi}, {folder} (gpu_preflight_pci_devices_path) lists {pci} NVIDIA GPUs"
    return max(smi, int(pci)), f"{by_smi}, {gpus.get('pci_source') or 'the PCI bus'} shows {pci} on the PCI bus"


def _gpu_count(facts: dict) -> list[dict[str, Any]]:
    expected = facts.get("expected_gpu_count")
    if expected in (None, ""):
        return []
    try:
        wanted = int(expected)
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            f"gpu_preflight_expected_gpu_count (by default gpu_verify_expected_gpu_count) is {expected!r}, not a "
            "number of GPUs. Set it to the count each host must show, such as 8."
        ) from None
    gpus = facts.get("gpus") or {}
    seen, where = _gpus_seen(gpus)
    if seen >= wanted:
        return []
    bus_ids = sorted({g["pci_bus_id"] for g in (gpus.get("gpus") or []) + (gpus.get("pci_gpus") or [])})
    # Facts of an older module have no lspci_path: suggest lspci as before.
    lspci = "" if gpus.get("lspci_path", "lspci") else LSPCI_MISSING
    return [{"expected": wanted, "seen": seen, "where": where, "bus_ids": ", ".join(bus_ids) or "none", "lspci": lspci}]


def _pci_devices(facts: dict) -> list[dict[str, Any]]:
    """The PCI folder (gpu_preflight_pci_devices_path) gave no GPU list: it does not exist, cannot be read, ..."""
    gpus = facts.get("gpus") or {}
    if not gpus.get("pci_devices_problem"):
        return []
    instead = "; lspci listed them instead" if gpus.get("pci_source") == "lspci" else ""
    return [{"problem": gpus["pci_devices_problem"], "instead": instead}]


def _kernel_module(facts: dict) -> list[dict[str, Any]]:
    """The driver's user space is there but nvidia-smi says its kernel module is not (exit 9)."""
    gpus = facts.get("gpus") or {}
    if not gpus.get("module_not_loaded"):
        return []
    said = next((error for error in gpus.get("errors") or [] if " exited 9: " in error), "nvidia-smi exited 9.")
    return [{"said": said}]


def _mixed_models(facts: dict) -> list[dict[str, Any]]:
    gpus = facts.get("gpus") or {}
    return [{"models": ", ".join(gpus["models"])}] if len(set(gpus.get("models") or [])) > 1 else []


def _narrow_links(records: list[dict]) -> list[dict]:
    """GPUs in slots narrower than x16, then GPUs whose link runs below their slot's width."""
    narrow = [g for g in records if g.get("pcie_link_width_max") and g["pcie_link_width_max"] < 16]
    return narrow + [
        g
        for g in records
        if g not in narrow
        and g.get("pcie_link_width_current")
        and g.get("pcie_link_width_max")
        and g["pcie_link_width_current"] < g["pcie_link_width_max"]
    ]


def _pcie_width(facts: dict) -> list[dict[str, Any]]:
    records = (facts.get("gpus") or {}).get("gpus") or []
    narrow = _narrow_links(records) if len(records) > 1 else []
    if not narrow:
        return []
    return [{"which": ", ".join(f"GPU {g.get('index')} at x{g.get('pcie_link_width_current')}" for g in narrow)}]


def _nvlink(facts: dict) -> list[dict[str, Any]]:
    gpus = facts.get("gpus") or {}
    records = gpus.get("gpus") or []
    if len(records) > 2 and not gpus.get("nvlink_pairs") and not gpus.get("nvswitch_present"):
        return [{"count": len(records)}]
    return []


def _root(facts: dict) -> list[dict[str, Any]]:
    user = facts.get("user") or {}
    return [] if user.get("uid", 0) == 0 else [{"user": user.get("name", "?"), "uid": user.get("uid")}]


def _venv_occupied(facts: dict) -> list[dict[str, Any]]:
    """Venv folders that exist and hold something other than a venv (an empty folder is fine)."""
    entries = set(facts.get("venv_entries") or [])
    present = set(facts.get("present") or [])
    found = []
    for stack, path in (facts.get("venvs") or {}).items():
        inside = {entry for entry in entries if posixpath.dirname(entry) == path}
        if path in present and inside and posixpath.join(path, "pyvenv.cfg") not in inside:
            found.append({"path": path, "stack": stack})
    return found


# (check name, check function, scope), run in this order. Scope "kernel": only where the run builds
# kernel modules (facts['manage_kernel']); "hardware": advice, a warning unless strict_hardware;
# "host": always a problem. HOST_CHECKS holds the same names, in the order messages list them.
CHECKS = (
    ("root", _root, "host"),
    ("os", _os_supported, "host"),
    ("venv_occupied", _venv_occupied, "host"),
    ("disk", _disk_space, "host"),
    ("noexec", _noexec, "host"),
    ("nouveau", _nouveau, "kernel"),
    ("secure_boot", _secure_boot, "kernel"),
    ("kernel_headers", _kernel_headers, "kernel"),
    ("reboot_local", _reboot_local, "kernel"),
    ("installer_running", _installer_running, "host"),
    ("gpus_busy", _gpus_busy, "host"),
    ("pci_devices", _pci_devices, "host"),
    ("gpu_count", _gpu_count, "host"),
    ("kernel_module", _kernel_module, "hardware"),
    ("mixed_models", _mixed_models, "hardware"),
    ("pcie_width", _pcie_width, "hardware"),
    ("nvlink", _nvlink, "hardware"),
)


def _skip_names(skip_checks: list | str | None) -> set:
    """The check names to skip. A string is a comma-separated list (``-e gpu_preflight_skip_checks=disk``),
    as Ansible's argument validation reads a string for a list option (Ansible documentation, "Argument
    spec", type list); the role's variable itself stays the string."""
    if isinstance(skip_checks, str):
        return {name.strip() for name in skip_checks.split(",") if name.strip()}
    return set(skip_checks or [])


def _unknown_skips(skip: set) -> list[dict[str, str]]:
    """A problem for each name in ``skip_checks`` that is no check, with the closest name if any."""
    found = []
    for name in sorted(skip - set(HOST_CHECKS)):
        close = difflib.get_close_matches(name, HOST_CHECKS, n=1)
        hint = f" (did you mean {close[0]!r}?)." if close else "."
        found.append(_finding("skip_checks", {"name": name, "hint": hint, "names": ", ".join(HOST_CHECKS)}))
    return found


def check_host(facts: dict, settings: dict | None = None) -> dict:
    """Check one host.

    Args:
        facts: ``{
            os: {distribution, major_version, version},
            supported_os: {distribution: [major versions or full versions such as '22.04']},
            manage_kernel: bool,            # the driver role builds kernel modules here
            mounts: [{mount, options, size_available}] (findmnt_mounts),
            space: [{path, need_bytes, purpose, variable?}],  # free space wanted where things land
            exec_paths: [{path, purpose, variable?}],  # installer scratch folders (must allow exec);
                                                       # variable: the setting that moves the folder
            proc_modules: str,               # text of /proc/modules ('' when unreadable)
            secure_boot: str | None,         # stdout of `mokutil --sb-state`, None when absent
            signing_key: bool,               # DKMS's module signing key is on the host
            module_signing: {key, certificate: str (controller paths, '' when unset),
                             key_found, certificate_found: bool},  # the configured signing pair
            kernel: str, kernel_headers: bool, kernel_headers_package: str,
            installed_kernels: [str],        # the folders under /lib/modules (kernel releases)
            reboot_allowed: bool, connection: str,  # nvidia_driver may reboot; ansible_connection
            gpus: nvidia_gpu_facts result (count, gpus, models, nvlink_pairs, nvswitch_present, source,
                  pci_count, pci_gpus, pci_source) or {},
            expected_gpu_count: int | None,  # GPUs the inventory says the host has; None: not checked
            compute_apps: [{pid, process_name, gpu_uuid, used_memory_mib}],
            driver_change: bool,             # the run would install a different driver
            user: {name, uid},               # who the tasks run as (missing: root)
            venvs: {stack name: venv folder}, present: [paths that exist],
            venv_entries: [paths of what is directly inside the venv folders],
            installers: [str],               # "<pid> <command line>" of installers still running
        }``
        settings: ``{strict_hardware: bool, skip_checks: [check names], allow_unsupported: bool}``.

    Returns:
        ``{ok, problems, warnings, overridden}``; each item ``{check, cause, fix}``. Problems
        that an override turns off move to ``overridden`` (and are shown by the report).
    """
    settings = settings or {}
    problems: list[dict] = []
    warnings: list[dict] = []
    for name, check, scope in CHECKS:
        if scope == "kernel" and not facts.get("manage_kernel"):
            continue
        found = [_finding(name, fields) for fields in check(facts)]
        (warnings if scope == "hardware" and not settings.get("strict_hardware") else problems).extend(found)
    skip = _skip_names(settings.get("skip_checks"))
    problems += _unknown_skips(skip)
    overridden = [
        p for p in problems if p["check"] != "skip_checks" and (settings.get("allow_unsupported") or p["check"] in skip)
    ]
    problems = [p for p in problems if p not in overridden]
    return {"ok": not problems, "problems": problems, "warnings": warnings, "overridden": overridden}


# Sizes used when the manifest does not know them (bytes). NVIDIA publishes no sizes; third parties
# report CUDA 12.x runfiles of 4-5.5 GB and an installed 12.8 toolkit of about 8.7 GB.
DEFAULT_RUNFILE_BYTES = 5 * 1024**3
DEFAULT_TOOLKIT_INSTALLED_BYTES = 10 * 1024**3
INSTALLED_PER_DOWNLOADED = 2.5  # installed toolkit / runfile, from the figures above
# A TensorFlow venv: about 1.6 GB for tensorflow-cpu 2.21 (measured), more with CUDA wheels.
VENV_BYTES = 4 * 1024**3
# NVIDIA's CUDA 12 and cuDNN 9 wheels of tensorflow[and-cuda] (cuda_source: wheels), unpacked in the venv:
# about 3.5 GB for TensorFlow 2.18's (the sizes of the nvidia-*-cu12 wheels on PyPI, unpacked).
CUDA_WHEELS_BYTES = 4 * 1024**3


def _download_bytes(record: dict) -> int:
    """Size of a manifest file record (runfile, archive); DEFAULT_RUNFILE_BYTES when unknown."""
    return int(record.get("size_bytes") or DEFAULT_RUNFILE_BYTES)


def _installed_bytes(runfiles: list[dict]) -> int:
    """Disk an installed toolkit takes per runfile: INSTALLED_PER_DOWNLOADED x its size, or the default."""
    return sum(
        int(r["size_bytes"] * INSTALLED_PER_DOWNLOADED) if r.get("size_bytes") else DEFAULT_TOOLKIT_INSTALLED_BYTES
        for r in runfiles
    )


def _need(path: str, need_bytes: int, purpose: str, variable: str | None = None) -> dict[str, Any]:
    """One ``space_needs`` item; ``variable`` (the setting that moves the folder) only when there is one."""
    need: dict[str, Any] = {"path": path, "need_bytes": need_bytes, "purpose": purpose}
    if variable is not None:
        need["variable"] = variable
    return need


def space_needs(stacks: list[dict], driver: dict | None, present: dict, paths: dict, floor_mib: int = 0) -> list:
    """Free space wanted on the host for what this run will install.

    Args:
        stacks: resolved stacks (gpu_stacks_resolve).
        driver: resolved driver (``{version, runfile}``) or None when the driver is not installed by us;
            ``runfile`` None (package method) needs no space here.
        present: ``{cuda_roots: [existing toolkit roots], venvs: [existing venvs], driver_installed: bool}``;
            what exists already needs no space.
        paths: ``{cache_dir, cuda_tmpdir, driver_tmpdir}``.
        floor_mib: every location needs at least this much (MiB); a threshold for cautious sites.

    Returns:
        ``[{path, need_bytes, purpose}]`` for :func:`check_host` (``facts['space']``).
    """
    # A stack whose CUDA comes from wheels in its venv (root None) installs no toolkit tree.
    roots = {(s.get("cuda_toolkit") or {}).get("root"): s for s in stacks}
    cuda_todo = {root: s for root, s in roots.items() if root and root not in present.get("cuda_roots", [])}
    runfiles = [s["cuda_toolkit"]["runfile"] for s in cuda_todo.values()]
    files = runfiles + [s["cudnn"]["archive"] for s in cuda_todo.values() if s.get("cudnn")]
    # A driver from packages has no runfile to push or unpack; the package manager checks its own space.
    driver_todo = driver is not None and driver.get("runfile") is not None and not present.get("driver_installed")
    if driver_todo:
        files.append(driver["runfile"])

    needs = []
    if files:
        cache_bytes = sum(_download_bytes(f) for f in files)
        needs.append(_need(paths["cache_dir"], cache_bytes, "artifact cache", "gpu_artifacts_host_cache_dir"))
    if cuda_todo:
        scratch_bytes = max(_download_bytes(r) for r in runfiles)
        needs.append(_need(paths["cuda_tmpdir"], scratch_bytes, "CUDA installer scratch", "cuda_toolkit_tmpdir"))
        needs.append(_need(next(iter(cuda_todo)), _installed_bytes(runfiles), "CUDA toolkits"))
    if driver_todo:
        driver_bytes = _download_bytes(driver["runfile"])
        needs.append(_need(paths["driver_tmpdir"], driver_bytes, "driver installer scratch", "nvidia_driver_tmpdir"))
    venvs = [s for s in stacks if s["venv"] not in present.get("venvs", [])]
    if venvs:
        venv_bytes = sum(VENV_BYTES + (CUDA_WHEELS_BYTES if _from_wheels(s) else 0) for s in venvs)
        needs.append(_need(venvs[0]["venv"], venv_bytes, "TensorFlow venvs", "the stack's venv"))
    floor = int(floor_mib) * MIB
    return [dict(n, need_bytes=max(n["need_bytes"], floor)) for n in needs]


def _from_wheels(stack: dict) -> bool:
    return (stack.get("cuda_toolkit") or {}).get("source") == "wheels"


def compute_apps(lines: list[str]) -> list[dict]:
    """Rows of ``nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory
    --format=csv,noheader,nounits`` (``stdout_lines``) -> ``[{pid, process_name, gpu_uuid,
    used_memory_mib}]``, read by the shared ``gpu_parsers.parse_compute_apps``."""
    return parse_compute_apps("\n".join(lines))


def _flag(value: Any) -> bool:
    """A role setting read as Ansible's ``bool`` filter reads it: ``yes``, ``true``, ``1``, ``on``."""
    return boolean(value, strict=False)


def _venv_entries(venv_paths: list[str], existing: list[str], globbed: dict) -> list[str]:
    """What is directly inside each existing venv folder, from the probe's ``<venv>/*`` and ``<venv>/.*``."""
    folders = [path for path in venv_paths if path in existing]
    return [entry for pattern in ("/*", "/.*") for path in folders for entry in globbed.get(path + pattern) or []]


def _kernel_facts(state: dict, inputs: dict, facts: dict) -> dict[str, Any]:
    """The kernel side of the check: what the probe found (nothing where the host gets no kernel modules)."""
    stat = state.get("stat") or {}
    build = stat.get(inputs.get("kernel_build")) or {}
    return {
        "proc_modules": (state.get("read") or {}).get("/proc/modules") or "",
        "secure_boot": ((state.get("run") or {}).get("secure_boot") or {}).get("stdout"),
        "signing_key": bool((stat.get(inputs.get("dkms_signing_key")) or {}).get("exists", False)),
        "module_signing": {
            "key": inputs.get("module_signing_key") or "",
            "certificate": inputs.get("module_signing_certificate") or "",
            "key_found": _flag(inputs.get("key_found")),
            "certificate_found": _flag(inputs.get("certificate_found")),
        },
        "kernel": facts.get("kernel"),
        # No build tree probed (no kernel modules here) counts as headers present, as before the probe.
        "kernel_headers": bool(build.get("exists", True)) or _flag(inputs.get("headers_installable")),
        "kernel_headers_package": inputs.get("headers_package"),
        "installed_kernels": [
            posixpath.basename(path.rstrip("/")) for path in (state.get("glob") or {}).get("/lib/modules/*/") or []
        ],
    }


def _gpu_facts(run: dict, gpus: dict, inputs: dict) -> dict[str, Any]:
    """The GPUs, their compute processes (nvidia-smi answers only with a driver loaded) and the installers."""
    apps = run.get("compute_apps") or {}
    lines = apps.get("stdout", "").splitlines() if gpus.get("driver_loaded") and apps.get("rc") == 0 else []
    loaded = gpus.get("driver_version")
    return {
        "gpus": gpus,
        "expected_gpu_count": inputs.get("expected_gpu_count"),
        "compute_apps": compute_apps(lines),
        "installers": (run.get("installers") or {}).get("stdout", "").splitlines(),
        "driver_change": _flag(inputs.get("driver_install"))
        and bool(gpus.get("driver_loaded"))
        and loaded not in (None, inputs.get("driver_version")),
    }


def _space_facts(resolved: dict, existing: list[str], gpus: dict, inputs: dict) -> list[dict]:
    """Free space wanted for what is not on the host yet (:func:`space_needs`)."""
    present = {
        "cuda_roots": existing,
        "venvs": existing,
        "driver_installed": gpus.get("driver_version") == inputs.get("driver_version"),
    }
    paths = {key: inputs.get(key) for key in ("cache_dir", "cuda_tmpdir", "driver_tmpdir")}
    return space_needs(
        resolved.get("stacks") or [], resolved.get("driver"), present, paths, inputs.get("min_free_mib") or 0
    )


def host_facts(facts: dict, resolved: dict, inputs: dict) -> dict:
    """The facts :func:`check_host` reads, from what gpu_preflight gathered.

    Args:
        facts: the host's ``ansible_facts`` (distribution, user, kernel, ``gpu_facts``).
        resolved: the ``gpu_stacks_resolve`` result (``stacks``, ``driver``).
        inputs: ``state`` and ``present`` (``gpu_host_probe`` results; gpu_preflight's one look gives both), ``installed_paths``,
            ``venv_paths``, ``supported_os``, ``manage_kernel``, ``kernel_build``, ``dkms_signing_key``,
            ``headers_installable``, ``headers_package``, the role's settings (``driver_version``,
            ``driver_install``, ``cache_dir``, ``cuda_tmpdir``, ``driver_tmpdir``, ``min_free_mib``,
            ``module_signing_key``, ``module_signing_certificate``, ``reboot_allowed``,
            ``expected_gpu_count``), ``key_found`` and ``certificate_found`` (the signing pair's files
            on the controller) and ``connection``.
    """
    state, present = inputs.get("state") or {}, inputs.get("present") or {}
    run, gpus = state.get("run") or {}, facts.get("gpu_facts") or {}
    stat = present.get("stat") or {}
    existing = [path for path in inputs.get("installed_paths") or [] if (stat.get(path) or {}).get("exists")]
    stacks = resolved.get("stacks") or []
    return {
        "os": {
            "distribution": facts.get("distribution"),
            "major_version": facts.get("distribution_major_version"),
            "version": facts.get("distribution_version"),
        },
        "supported_os": inputs.get("supported_os") or {},
        "user": {"name": facts.get("user_id"), "uid": int(facts.get("user_uid", 0))},
        "venvs": {stack["name"]: stack["venv"] for stack in stacks},
        "present": existing,
        "venv_entries": _venv_entries(inputs.get("venv_paths") or [], existing, present.get("glob") or {}),
        "manage_kernel": _flag(inputs.get("manage_kernel")),
        "mounts": findmnt_mounts(json.loads((run.get("findmnt") or {}).get("stdout") or "{}")),
        "space": _space_facts(resolved, existing, gpus, inputs),
        "exec_paths": [
            {"path": inputs.get("cuda_tmpdir"), "purpose": "CUDA installer scratch", "variable": "cuda_toolkit_tmpdir"},
            {
                "path": inputs.get("driver_tmpdir"),
                "purpose": "driver installer scratch",
                "variable": "nvidia_driver_tmpdir",
            },
        ],
        "reboot_allowed": _flag(inputs.get("reboot_allowed")),
        "connection": inputs.get("connection") or "ssh",
        **_kernel_facts(state, inputs, facts),
        **_gpu_facts(run, gpus, inputs),
    }


def gpu_host_check(facts: dict, settings: dict | None = None) -> dict:
    """Ansible filter: ``{{ facts | gpu_host_check(settings) }}``."""
    return check_host(facts, settings)


class FilterModule:
    """Host fitness filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_host_check": gpu_host_check,
            "gpu_host_facts": host_facts,
            "gpu_space_needs": space_needs,
            "gpu_compute_apps": compute_apps,
            "gpu_findmnt_mounts": findmnt_mounts,
        }
