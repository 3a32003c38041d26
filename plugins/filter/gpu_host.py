"""Decide, from facts gathered by gpu_preflight, whether a host is fit for the pinned stacks.

Pure functions: the role gathers the raw facts (mounts, /proc/modules, ``mokutil --sb-state``,
kernel headers, nvidia_gpu_facts, compute processes) and this module turns them into problems
(the host stops) and warnings (the run goes on), each with a cause and a fix. Exposed to Ansible
as the filters ``gpu_host_check``, ``gpu_space_needs``, ``gpu_compute_apps`` and
``gpu_findmnt_mounts``; plain functions for unit tests.

Sources: the CUDA Installation Guide for Linux (nouveau must be disabled; ``--tmpdir`` "when /tmp
is full or mounted noexec"; the kernel headers of the running kernel are needed to build the
module; Secure Boot needs signed modules), reference sections 3.1, 4.1, 4.2; the multi-GPU
hardware advice (mixed models, PCIe width, NVLink) is the project's seed guidance.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from typing import Any

MIB = 1024 * 1024
HOST_CHECKS = (
    "os",
    "disk",
    "noexec",
    "nouveau",
    "secure_boot",
    "kernel_headers",
    "gpus_busy",
    "installer_running",
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
    return f"{value / MIB:,.0f} MiB"


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
            signing_key: bool,               # a module signing key is configured
            kernel: str, kernel_headers: bool, kernel_headers_package: str,
            gpus: nvidia_gpu_facts result (count, gpus, models, nvlink_pairs, nvswitch_present) or {},
            compute_apps: [{pid, process_name, gpu_uuid, used_memory_mib}],
            driver_change: bool,             # the run would install a different driver
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

    def add(check: str, cause: str, fix: str, hardware: bool = False) -> None:
        item = {"check": check, "cause": cause, "fix": fix}
        (problems if (not hardware or settings.get("strict_hardware")) else warnings).append(item)

    os_facts = facts.get("os") or {}
    supported = facts.get("supported_os") or {}
    dist, major = os_facts.get("distribution"), str(os_facts.get("major_version"))
    known = [str(v) for v in supported.get(dist, [])]
    if major not in known and str(os_facts.get("version")) not in known:
        names = ", ".join(f"{d} {'/'.join(str(v) for v in vs)}" for d, vs in supported.items())
        add(
            "os",
            f"{dist} {major} is not a supported OS ({names}).",
            "Use a supported release, or add it to the role's supported list after testing it.",
        )

    mounts = facts.get("mounts") or []
    for want in facts.get("space") or []:
        mount = mount_for(want["path"], mounts)
        if mount is None:
            continue
        free = int(mount.get("size_available") or 0)
        if free < int(want["need_bytes"]):
            add(
                "disk",
                f"{want['path']} ({want['purpose']}) is on {mount['mount']} with {_mib(free)} free; "
                f"{_mib(want['need_bytes'])} is needed.",
                f"Free space on {mount['mount']}, or point {_target(want)} at a larger disk.",
            )
    for want in facts.get("exec_paths") or []:
        mount = mount_for(want["path"], mounts)
        if mount and "noexec" in str(mount.get("options", "")).split(","):
            add(
                "noexec",
                f"{want['path']} ({want['purpose']}) is on {mount['mount']}, mounted noexec; "
                "NVIDIA's installers run programs from it.",
                f"Point {_target(want)} at a file system mounted with exec.",
            )

    if facts.get("manage_kernel"):
        if re.search(r"^nouveau\s", facts.get("proc_modules") or "", re.M):
            add(
                "nouveau",
                "The nouveau driver is loaded; the NVIDIA kernel module cannot load beside it.",
                "Let the run blacklist it (nvidia_driver_blacklist_nouveau: true) and reboot, then rerun.",
            )
        secure_boot = facts.get("secure_boot") or ""
        if "SecureBoot enabled" in secure_boot and not facts.get("signing_key"):
            add(
                "secure_boot",
                "Secure Boot is on and no module signing key is configured; the kernel "
                "will refuse the unsigned NVIDIA module.",
                "Enrol a Machine Owner Key and configure it for DKMS signing, or turn Secure Boot off.",
            )
        if not facts.get("kernel_headers"):
            add(
                "kernel_headers",
                f"No kernel headers for the running kernel {facts.get('kernel')} "
                "(/lib/modules/<kernel>/build), and none can be installed.",
                f"Install {facts.get('kernel_headers_package')} or boot a kernel whose headers are available.",
            )

    running = facts.get("installers") or []
    if running:
        add(
            "installer_running",
            "An install from an earlier run is still running on the host: "
            + "; ".join(line[:200] for line in running)
            + ".",
            "Wait for it to finish (or stop it), then rerun; the rerun skips what it completed.",
        )

    apps = facts.get("compute_apps") or []
    if apps and facts.get("driver_change"):
        listed = ", ".join(f"{a.get('process_name')} (pid {a.get('pid')})" for a in apps)
        add(
            "gpus_busy",
            f"The driver would change while GPUs run compute processes: {listed}.",
            "Drain the host (stop those jobs) and rerun.",
        )

    gpus = facts.get("gpus") or {}
    records = gpus.get("gpus") or []
    if len(set(gpus.get("models") or [])) > 1:
        add(
            "mixed_models",
            f"Mixed GPU models: {', '.join(gpus['models'])}; MirroredStrategy runs at the pace of the slowest.",
            "Group hosts by GPU model or accept the slower replicas.",
            hardware=True,
        )
    if len(records) > 1:
        narrow = [g for g in records if g.get("pcie_link_width_max") and g["pcie_link_width_max"] < 16]
        narrow += [
            g
            for g in records
            if g not in narrow
            and g.get("pcie_link_width_current")
            and g.get("pcie_link_width_max")
            and g["pcie_link_width_current"] < g["pcie_link_width_max"]
        ]
        if narrow:
            which = ", ".join(f"GPU {g.get('index')} at x{g.get('pcie_link_width_current')}" for g in narrow)
            add(
                "pcie_width",
                f"PCIe links below x16 on a multi-GPU host: {which}; all-reduce traffic is "
                "limited by the narrowest link.",
                "Move the cards to x16 slots or check the riser/BIOS lane settings.",
                hardware=True,
            )
    if len(records) > 2 and not gpus.get("nvlink_pairs") and not gpus.get("nvswitch_present"):
        add(
            "nvlink",
            f"{len(records)} GPUs without NVLink: gradients cross PCIe, scaling beyond 2 GPUs is usually poor.",
            "Expect lower scaling efficiency, or use NVLink-connected GPUs.",
            hardware=True,
        )

    skip = set(settings.get("skip_checks") or [])
    for name in sorted(skip - set(HOST_CHECKS)):
        close = difflib.get_close_matches(name, HOST_CHECKS, n=1)
        problems.append(
            {
                "check": "skip_checks",
                "cause": f"gpu_preflight_skip_checks names an unknown check {name!r}"
                + (f" (did you mean {close[0]!r}?)." if close else "."),
                "fix": f"Use the names {', '.join(HOST_CHECKS)}, as a list: "
                '-e \'{"gpu_preflight_skip_checks": ["disk"]}\'.',
            }
        )
    overridden = [
        p for p in problems if p["check"] != "skip_checks" and (settings.get("allow_unsupported") or p["check"] in skip)
    ]
    problems = [p for p in problems if p not in overridden]
    return {"ok": not problems, "problems": problems, "warnings": warnings, "overridden": overridden}


# Sizes used when the manifest does not know them (bytes). NVIDIA publishes no sizes; third parties
# report CUDA 12.x runfiles of 4-5.5 GB and an installed 12.8 toolkit of about 8.7 GB (reference 3.3).
DEFAULT_RUNFILE_BYTES = 5 * 1024**3
DEFAULT_TOOLKIT_INSTALLED_BYTES = 10 * 1024**3
INSTALLED_PER_DOWNLOADED = 2.5  # installed toolkit / runfile, from the figures above
# A TensorFlow venv: about 1.6 GB for tensorflow-cpu 2.21 (measured), more with CUDA wheels.
VENV_BYTES = 4 * 1024**3


def space_needs(stacks: list[dict], driver: dict | None, present: dict, paths: dict, floor_mib: int = 0) -> list:
    """Free space wanted on the host for what this run will install.

    Args:
        stacks: resolved stacks (gpu_stacks_resolve).
        driver: resolved driver (``{version, runfile}``) or None when the driver is not installed by us.
        present: ``{cuda_roots: [existing toolkit roots], venvs: [existing venvs], driver_installed: bool}``;
            what exists already needs no space.
        paths: ``{cache_dir, cuda_tmpdir, driver_tmpdir}``.
        floor_mib: every location needs at least this much (MiB); a threshold for cautious sites.

    Returns:
        ``[{path, need_bytes, purpose}]`` for :func:`check_host` (``facts['space']``).
    """
    cuda_todo = {
        s["cuda_toolkit"]["root"]: s
        for s in stacks
        if s.get("cuda_toolkit") and s["cuda_toolkit"]["root"] not in present.get("cuda_roots", [])
    }
    files = [s["cuda_toolkit"]["runfile"] for s in cuda_todo.values()]
    files += [s["cudnn"]["archive"] for s in cuda_todo.values() if s.get("cudnn")]
    driver_todo = driver is not None and not present.get("driver_installed")
    if driver_todo:
        files.append(driver["runfile"])

    def size(record: dict) -> int:
        return int(record.get("size_bytes") or DEFAULT_RUNFILE_BYTES)

    needs = []
    if files:
        needs.append(
            {
                "path": paths["cache_dir"],
                "need_bytes": sum(size(f) for f in files),
                "purpose": "artifact cache",
                "variable": "gpu_artifacts_host_cache_dir",
            }
        )
    if cuda_todo:
        runfiles = [s["cuda_toolkit"]["runfile"] for s in cuda_todo.values()]
        needs.append(
            {
                "path": paths["cuda_tmpdir"],
                "need_bytes": max(size(r) for r in runfiles),
                "purpose": "CUDA installer scratch",
                "variable": "cuda_toolkit_tmpdir",
            }
        )
        installed = sum(
            int(r["size_bytes"] * INSTALLED_PER_DOWNLOADED) if r.get("size_bytes") else DEFAULT_TOOLKIT_INSTALLED_BYTES
            for r in runfiles
        )
        needs.append({"path": next(iter(cuda_todo)), "need_bytes": installed, "purpose": "CUDA toolkits"})
    if driver_todo:
        needs.append(
            {
                "path": paths["driver_tmpdir"],
                "need_bytes": size(driver["runfile"]),
                "purpose": "driver installer scratch",
                "variable": "nvidia_driver_tmpdir",
            }
        )
    venvs = [s["venv"] for s in stacks if s["venv"] not in present.get("venvs", [])]
    if venvs:
        needs.append(
            {
                "path": venvs[0],
                "need_bytes": VENV_BYTES * len(venvs),
                "purpose": "TensorFlow venvs",
                "variable": "the stack's venv",
            }
        )
    floor = int(floor_mib) * MIB
    return [dict(n, need_bytes=max(n["need_bytes"], floor)) for n in needs]


def compute_apps(lines: list[str]) -> list[dict]:
    """Rows of ``nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory
    --format=csv,noheader,nounits`` -> ``[{pid, process_name, gpu_uuid, used_memory_mib}]``."""
    apps = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        memory = int(cells[3]) if cells[3].isdigit() else None
        apps.append({"pid": int(cells[0]), "process_name": cells[1], "gpu_uuid": cells[2], "used_memory_mib": memory})
    return apps


def gpu_host_check(facts: dict, settings: dict | None = None) -> dict:
    """Ansible filter: ``{{ facts | gpu_host_check(settings) }}``."""
    return check_host(facts, settings)


class FilterModule:
    """Host fitness filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_host_check": gpu_host_check,
            "gpu_space_needs": space_needs,
            "gpu_compute_apps": compute_apps,
            "gpu_findmnt_mounts": findmnt_mounts,
        }
