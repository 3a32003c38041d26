#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Ansible module nvidia_gpu_facts: read-only NVIDIA GPU inventory from nvidia-smi, sysfs and lspci."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Gather NVIDIA GPU, NVLink and NVSwitch facts from nvidia-smi, sysfs and lspci
description:
  - "Runs C(nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,compute_cap,driver_version,\
    pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,persistence_mode \
    --format=csv,noheader,nounits) and C(nvidia-smi topo -m), and lists the PCI bus from sysfs
    (O(pci_devices_path)), or with C(lspci -D -nn) when sysfs cannot be read."
  - Sets C(ansible_facts['gpu_facts']). Changes nothing on the host.
  - Works before the driver is installed. When nvidia-smi is missing or fails (NVIDIA kernel module not loaded,
    exit 9; C(No devices were found), exit 6) the GPUs are listed from the PCI bus instead,
    and RV(ansible_facts.gpu_facts.errors) says what failed and how to fix it.
  - The fix for exit 9 covers a host and a container; in a container (C(/run/.containerenv) or C(/.dockerenv)
    exists) it names the container's steps first.
  - The PCI bus is read even when nvidia-smi works, to name GPUs that are on the bus but invisible to the
    driver (a GPU that fell off the bus, or one bound to vfio-pci or nouveau).
  - Never fails because a tool is missing or fails. Fails only when a tool exits 0 but prints output this
    module cannot read, which means a new output format or a bug here.
version_added: "0.9.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
requirements:
  - C(nvidia-smi) from the NVIDIA driver, for anything beyond PCI IDs. C(compute_cap) needs driver R510 or later.
  - C(lspci) from pciutils, for the PCI cross-check and the no-driver fallback where sysfs cannot be read.
  - C(timeout) from coreutils or busybox, for O(timeout) to apply; without it the commands run unbounded.
options:
  nvidia_smi_path:
    description:
      - Name (looked up on E(PATH) and the sbin directories) or absolute path of C(nvidia-smi).
    type: str
    default: nvidia-smi
  lspci_path:
    description:
      - Name (looked up on E(PATH) and the sbin directories) or absolute path of C(lspci).
      - Run only when O(pci_devices_path) cannot be read.
    type: str
    default: lspci
  pci_devices_path:
    description:
      - Folder with one sub-folder per PCI function, named by bus ID, each holding the files C(vendor), C(device)
        and C(class) (the sysfs layout). Read first, before lspci; it needs no driver and no pciutils.
      - Leave the default on real hosts. Test hosts whose C(/sys) is not their own (containers) point it at a
        fixture folder of the same layout.
    type: path
    default: /sys/bus/pci/devices
    version_added: "0.10.0"
  timeout:
    description:
      - Seconds each command may run before it is stopped and reported in RV(ansible_facts.gpu_facts.errors).
      - nvidia-smi can hang for minutes on a GPU in a bad state; the facts then come from lspci.
    type: int
    default: 30
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - Bus IDs are normalised to lower-case C(dddd:bb:dd.f) (the C(lspci -D) form); nvidia-smi prints
    C(00000000:17:00.0), which becomes C(0000:17:00.0).
  - RV(ansible_facts.gpu_facts.nvswitch_present) is a heuristic. It is true when the PCI bus shows an NVIDIA bridge
    function (class C([0680]), how the NVSwitch chips of an HGX baseboard enumerate), or when C(topo -m) shows
    at least 4 GPUs, every pair joined by C(NV#), and each GPU with more bonded links to its peers in total
    than any GPU has (18, on H100/H200/B200). 8x H100 SXM shows C(NV18) for all 28 pairs, which only a switch
    can give; 4x A100 on HGX (direct mesh, C(NV4) per pair) does not count. It misses a switched system seen
    from a VM that has only some of its GPUs and no NVSwitch passed through.
  - C(pcie_link_gen_current) and C(pcie_link_width_current) drop when a GPU idles (power saving); compare the
    C(_max) values, or read them under load, before calling a link degraded.
seealso:
  - name: nvidia-smi documentation
    description: Field meanings of C(--query-gpu); see C(nvidia-smi --help-query-gpu).
    link: https://docs.nvidia.com/deploy/nvidia-smi/index.html
  - name: Accessing PCI device resources through sysfs
    description: The C(/sys/bus/pci/devices) layout read by O(pci_devices_path).
    link: https://docs.kernel.org/PCI/sysfs-pci.html
"""

EXAMPLES = r"""
- name: Gather GPU facts
  nvidia_gpu_facts:

- name: Fail when a GPU on the PCI bus is invisible to the driver
  ansible.builtin.assert:
    that: ansible_facts['gpu_facts']['missing_from_nvidia_smi'] | length == 0
    fail_msg: >-
      GPUs {{ ansible_facts['gpu_facts']['missing_from_nvidia_smi'] | join(', ') }} are on the PCI bus but not in
      nvidia-smi; check dmesg for Xid errors and power-cycle the host.
  when: ansible_facts['gpu_facts']['source'] == 'nvidia-smi'

- name: Use a driver installed outside PATH and allow a slow nvidia-smi
  nvidia_gpu_facts:
    nvidia_smi_path: /opt/nvidia/bin/nvidia-smi
    timeout: 120

- name: Stop when fewer than 8 GPUs are on the PCI bus
  ansible.builtin.assert:
    that: ansible_facts['gpu_facts']['pci_count'] >= 8
    fail_msg: >-
      Only {{ ansible_facts['gpu_facts']['pci_gpus'] | map(attribute='pci_bus_id') | join(', ') }} are on the PCI bus;
      reseat the missing GPUs or check that the BIOS enables their slots.

- name: Report GPUs that run below their PCIe link width
  ansible.builtin.debug:
    msg: "GPU {{ item.index }} ({{ item.pci_bus_id }}) runs at x{{ item.pcie_link_width_current }} of x{{ item.pcie_link_width_max }}"
  loop: "{{ ansible_facts['gpu_facts']['gpus'] }}"
  when: (item.pcie_link_width_current or 0) < (item.pcie_link_width_max or 0)
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    gpu_facts:
      description: What nvidia-smi and the PCI bus (sysfs or lspci) report about the NVIDIA GPUs of the host.
      returned: always
      type: dict
      contains:
        source:
          description:
            - Where RV(ansible_facts.gpu_facts.gpus) or RV(ansible_facts.gpu_facts.pci_gpus) came from.
            - C(nvidia-smi) when the query worked; else where the PCI bus was read, C(sysfs) or C(lspci); C(none)
              when nothing could be read.
          returned: always
          type: str
          sample: nvidia-smi
        driver_loaded:
          description:
            - True when nvidia-smi could talk to the driver (exit 0, or exit 6 "No devices were found"),
              or C(/proc/driver/nvidia/version) exists.
          returned: always
          type: bool
          sample: true
        module_not_loaded:
          description:
            - True when nvidia-smi is installed and exited 9, NVIDIA kernel module not loaded (nvidia-smi(1), RETURN
              VALUE); RV(ansible_facts.gpu_facts.errors) has its message and the fix.
          returned: always
          type: bool
          sample: false
        driver_version:
          description: Driver version from nvidia-smi, else from C(/proc/driver/nvidia/version); null when unknown.
          returned: always
          type: str
          sample: "535.104.05"
        count:
          description: Number of GPUs nvidia-smi lists; 0 when it failed.
          returned: always
          type: int
          sample: 8
        gpus:
          description: One entry per GPU nvidia-smi lists, by index; empty when it failed.
          returned: always
          type: list
          elements: dict
          contains:
            index:
              description: nvidia-smi index (can change at each boot).
              type: int
            name:
              description: Product name, e.g. C(NVIDIA A100-SXM4-80GB).
              type: str
            uuid:
              description: C(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), stable across boots.
              type: str
            pci_bus_id:
              description: Bus ID, normalised to lower-case C(dddd:bb:dd.f).
              type: str
            memory_total_mib:
              description: Total memory in MiB; null for C([N/A]).
              type: int
            compute_capability:
              description: CUDA compute capability as C(major.minor), e.g. C(8.0) for A100, C(9.0) for H100.
              type: str
            driver_version:
              description: Driver version as reported for this GPU.
              type: str
            pcie_link_gen_current:
              description: Current PCIe generation (may be lower at idle); null for C([N/A]).
              type: int
            pcie_link_gen_max:
              description: Highest PCIe generation of the GPU and slot; null for C([N/A]).
              type: int
            pcie_link_width_current:
              description: Current PCIe link width in lanes (16 for x16); null for C([N/A]).
              type: int
            pcie_link_width_max:
              description: Highest PCIe link width in lanes; null for C([N/A]).
              type: int
            persistence_mode:
              description: True when persistence mode is C(Enabled); null for C([N/A]).
              type: bool
          sample:
            - index: 0
              name: NVIDIA A100-SXM4-80GB
              uuid: GPU-89fdc1e1-18b2-f499-c12b-82bcb9bfb3fa
              pci_bus_id: "0000:07:00.0"
              memory_total_mib: 81920
              compute_capability: "8.0"
              driver_version: "535.104.05"
              pcie_link_gen_current: 4
              pcie_link_gen_max: 4
              pcie_link_width_current: 16
              pcie_link_width_max: 16
              persistence_mode: true
        models:
          description:
            - Sorted unique GPU names from nvidia-smi; when RV(ansible_facts.gpu_facts.source) is C(lspci),
              the lspci descriptions instead; when it is C(sysfs), the C(vendor:device) PCI IDs (sysfs has no names).
          returned: always
          type: list
          elements: str
          sample: ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"]
        pci_gpus:
          description:
            - NVIDIA VGA C([0300]) and 3D controller C([0302]) functions on the PCI bus, by bus ID.
            - NVIDIA audio functions C([0403]), NVSwitch bridges C([0680]) and other vendors are left out.
            - From sysfs, else from lspci (RV(ansible_facts.gpu_facts.pci_source)); empty when neither could be read.
          returned: always
          type: list
          elements: dict
          contains:
            pci_bus_id:
              description: Bus ID, lower-case C(dddd:bb:dd.f).
              type: str
            description:
              description: lspci's vendor and device text; null from sysfs, which has no names.
              type: str
            device_id:
              description: C(vendor:device) PCI ID.
              type: str
          sample:
            - pci_bus_id: "0000:07:00.0"
              description: NVIDIA Corporation GA100 [A100 SXM4 80GB]
              device_id: "10de:20b2"
        pci_count:
          description: Length of RV(ansible_facts.gpu_facts.pci_gpus); null when neither sysfs nor lspci could be read.
          returned: always
          type: int
          sample: 8
        pci_nvswitch_count:
          description:
            - NVIDIA bridge functions C([0680]) (NVSwitch chips) on the PCI bus; null when neither sysfs nor lspci
              could be read.
          returned: always
          type: int
          sample: 4
        pci_source:
          description:
            - Where RV(ansible_facts.gpu_facts.pci_gpus) came from - C(sysfs) (O(pci_devices_path)), C(lspci) when
              sysfs could not be read, C(none) when neither could.
          returned: always
          type: str
          sample: sysfs
        pci_devices_path:
          description:
            - The folder read for RV(ansible_facts.gpu_facts.pci_gpus) (O(pci_devices_path)) when
              RV(ansible_facts.gpu_facts.pci_source) is C(sysfs), else empty; messages name it, so that a mistyped
              path does not read as missing GPUs.
          returned: always
          type: str
          sample: /sys/bus/pci/devices
        missing_from_nvidia_smi:
          description:
            - Bus IDs of GPUs on the PCI bus that nvidia-smi does not list.
            - Filled only when both nvidia-smi and the PCI bus could be read; otherwise empty (compare RV(ansible_facts.gpu_facts.count)
              and RV(ansible_facts.gpu_facts.pci_count)).
          returned: always
          type: list
          elements: str
          sample: ["0000:0f:00.0"]
        topology:
          description:
            - The C(nvidia-smi topo -m) matrix, device label to device label to cell (C(X), C(NV12), C(PIX), C(PXB),
              C(PHB), C(NODE), C(SYS)). NIC rows and columns are kept; affinity columns are dropped.
            - Empty when nvidia-smi failed or found no GPU.
          returned: always
          type: dict
          sample: {"GPU0": {"GPU0": "X", "GPU1": "NV12"}, "GPU1": {"GPU0": "NV12", "GPU1": "X"}}
        nvlink_pairs:
          description: GPU pairs joined by NVLink, with the number of bonded links, from the C(NV#) cells.
          returned: always
          type: list
          elements: dict
          contains:
            gpus:
              description: The two nvidia-smi indices, lower first.
              type: list
              elements: int
            links:
              description: Bonded NVLinks between the two.
              type: int
          sample: [{"gpus": [0, 1], "links": 12}]
        nvswitch_present:
          description: Heuristic, see the notes. True when the PCI bus shows NVSwitch bridges or C(topo -m) implies a switch.
          returned: always
          type: bool
          sample: false
        nvidia_smi_problem:
          description:
            - Why nvidia-smi gave no list, naming what was tried - not installed (and where it was looked for), or the
              command, its exit status and its first line; null when it listed the GPUs.
          returned: always
          type: str
          sample: "nvidia-smi is not installed (not on PATH (/usr/bin:/bin) nor in /sbin, /usr/sbin, /usr/local/sbin)"
          version_added: "0.19.0"
        pci_devices_problem:
          description:
            - Why O(pci_devices_path) gave no GPU list, naming the folder - it does not exist, is not a folder, cannot
              be read (and why), is empty, or is not sysfs-like; null when it was read.
          returned: always
          type: str
          sample: /srv/pci-devices does not exist
          version_added: "0.19.0"
        lspci_path:
          description:
            - Where C(lspci) is on the host, looked up whether or not it ran; null when the host has none, so that a
              fix suggests it only with the advice to install pciutils.
          returned: always
          type: str
          sample: /usr/bin/lspci
          version_added: "0.19.0"
        errors:
          description: What failed, each with the cause and the fix; empty when everything ran.
          returned: always
          type: list
          elements: str
          sample:
            - "/usr/bin/nvidia-smi --query-gpu exited 9: NVIDIA-SMI has failed because it couldn't communicate with
              the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running. NVIDIA kernel module
              not loaded: on a host, load the NVIDIA kernel module (`modprobe nvidia`, see `dmesg | grep -i nvrm`) or
              reboot after a driver install or upgrade, and check that nouveau is blacklisted and Secure Boot accepts
              the module; in a container the module belongs to the host's kernel, so load it on the host and pass the
              GPUs into the container (NVIDIA Container Toolkit: CDI `--device nvidia.com/gpu=all`, or the
              `/dev/nvidia*` device files)."
"""

import os  # noqa: E402  (imports follow the documentation blocks, as ansible-test validate-modules requires)
from typing import TYPE_CHECKING, Any, Optional  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_parsers import (  # noqa: E402
    MODULE_NOT_LOADED,
    NVIDIA_SMI_MODULE_NOT_LOADED_RC,
    QUERY_FIELDS,
    in_container,
    module_not_loaded_fix,
    nvlink_pairs,
    nvswitch_in_topology,
    parse_lspci,
    parse_lspci_nvswitches,
    parse_proc_driver_version,
    parse_query_gpu,
    parse_sysfs_pci,
    parse_sysfs_pci_nvswitches,
    parse_topo_matrix,
)

if TYPE_CHECKING:  # the module also runs on managed hosts with Python 3.8, where these aliases cannot be built
    from collections.abc import Callable, Mapping, Sequence

    # (exit status, stdout, stderr) of one command.
    Runner = Callable[[Sequence[str]], tuple[int, str, str]]
    # Name or path of a tool -> absolute path, or None when it is not there.
    Finder = Callable[[str], Optional[str]]  # not str | None: pylint checks this file as Python 3.8

PROC_DRIVER_VERSION = "/proc/driver/nvidia/version"
# The files of each PCI function folder that the sysfs parser reads (docs.kernel.org/PCI/sysfs-pci.html).
PCI_DEVICE_FILES = ("vendor", "device", "class")
EXIT_TIMED_OUT = 124  # what coreutils and busybox `timeout` return
# Where AnsibleModule.get_bin_path looks for a bare name besides PATH (ansible.module_utils.common.process).
SBIN_DIRS = ("/sbin", "/usr/sbin", "/usr/local/sbin")
# Said after a command the fix suggests that is not on the host (pciutils ships lspci: lspci(8)).
LSPCI_MISSING = " (install pciutils first: this host has no lspci)"


def module_not_loaded_hint(container: bool = False) -> str:
    """Exit 9's hint: gpu_parsers' meaning and fix, the container's half of the fix first when ``container``."""
    fix = module_not_loaded_fix(container)
    return f"{MODULE_NOT_LOADED}: {fix[:1].lower()}{fix[1:]}"


# nvidia-smi exit codes (nvidia-smi(1), RETURN VALUE) and what an administrator does about each; exit 9's hint
# is the host's (query_nvidia_smi puts the container's first in a container).
NVIDIA_SMI_HINTS = {
    2: "nvidia-smi rejected the query; drivers older than R510 do not know compute_cap, so upgrade the driver.",
    3: "This GPU or driver does not support the query.",
    4: "Run the task with become: true; this user may not query the GPUs.",
    6: "The driver is loaded but sees no GPU: compare with `lspci -nn -d 10de:`{lspci} and look for NVRM errors in "
    "`dmesg`.",
    NVIDIA_SMI_MODULE_NOT_LOADED_RC: module_not_loaded_hint(),
    12: "libnvidia-ml.so is missing: reinstall the driver so its user-space libraries match the kernel module.",
    15: "A GPU has fallen off the bus: look for Xid 79 in `dmesg` and power-cycle the host.",
    EXIT_TIMED_OUT: "nvidia-smi hung, which usually means a GPU in a bad state: check `dmesg` for Xid errors.",
}


class OutputFormatError(Exception):
    """A tool exited 0 but printed something the parsers cannot read."""

    def __init__(self, command: Sequence[str], output: str, cause: Exception) -> None:
        super().__init__(f"could not read the output of `{' '.join(command)}`: {cause}")
        self.output = output


def _first_line(*texts: str) -> str:
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return "no output"


def _exited(label: str, rc: int, stdout: str, stderr: str) -> str:
    """``<command> exited <rc>: <its first line>``; nvidia-smi prints its errors on stdout, lspci on stderr."""
    return f"{label} exited {rc}: {_first_line(stdout, stderr).rstrip('.')}"


def _failure(label: str, rc: int, stdout: str, stderr: str, hint: str = "") -> str:
    message = f"{_exited(label, rc, stdout, stderr)}."
    return f"{message} {hint}" if hint else message


def _parse(command: Sequence[str], output: str, parser: Callable[[str], Any]) -> Any:
    try:
        return parser(output)
    except ValueError as exc:
        raise OutputFormatError(command, output, exc) from exc


def query_nvidia_smi(
    run: Runner, nvidia_smi: str, errors: list[str], container: bool = False, lspci_found: bool = True
) -> tuple[list[dict[str, Any]] | None, int, str]:
    """Run the --query-gpu command; return (GPUs or None when it failed, exit status, what it said when it
    failed: ``<path> --query-gpu exited <rc>: <first line>``, else ''). ``container``: this runs in a
    container (gpu_parsers.in_container), whose steps come first in exit 9's fix; ``lspci_found``: the host
    has lspci, which a hint may suggest (else it says to install pciutils)."""
    command = [nvidia_smi, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]
    rc, stdout, stderr = run(command)
    if rc != 0:
        hints = {**NVIDIA_SMI_HINTS, NVIDIA_SMI_MODULE_NOT_LOADED_RC: module_not_loaded_hint(container)}
        hint = hints.get(rc, "").replace("{lspci}", "" if lspci_found else LSPCI_MISSING)
        errors.append(_failure(f"{nvidia_smi} --query-gpu", rc, stdout, stderr, hint))
        return None, rc, _exited(f"{nvidia_smi} --query-gpu", rc, stdout, stderr)
    return sorted(_parse(command, stdout, parse_query_gpu), key=lambda gpu: gpu["index"]), rc, ""


def query_topology(run: Runner, nvidia_smi: str, errors: list[str]) -> dict[str, dict[str, str]]:
    """Run ``nvidia-smi topo -m``; an empty matrix when it failed."""
    command = [nvidia_smi, "topo", "-m"]
    rc, stdout, stderr = run(command)
    if rc != 0:
        errors.append(_failure(f"{nvidia_smi} topo -m", rc, stdout, stderr, "NVLink pairs and NVSwitch are unknown."))
        return {}
    return _parse(command, stdout, parse_topo_matrix)


def query_lspci(run: Runner, lspci: str, errors: list[str]) -> tuple[list[dict[str, str]] | None, list[str]]:
    """Run ``lspci -D -nn``; return (NVIDIA GPUs or None when it failed, NVSwitch bus IDs)."""
    command = [lspci, "-D", "-nn"]
    rc, stdout, stderr = run(command)
    if rc != 0:
        errors.append(_failure(f"{lspci} -D -nn", rc, stdout, stderr, "GPUs missing from nvidia-smi cannot be named."))
        return None, []
    return _parse(command, stdout, parse_lspci), _parse(command, stdout, parse_lspci_nvswitches)


def not_found(name: str, searched: str = "PATH") -> str:
    """Why a tool the Finder did not find is not there, naming where it looked: a path is no executable file;
    a bare name is not installed (``searched``: where bare names are looked up)."""
    if "/" in name:
        return f"{name} does not exist or is not an executable file"
    return f"{name} is not installed (not on {searched})"


def _smi_facts(
    run: Runner, find: Finder, tools: tuple[str, str | None, str], errors: list[str], container: bool = False
) -> tuple[list[dict[str, Any]] | None, int | None, dict[str, dict[str, str]], str]:
    """GPUs (None when nvidia-smi is missing or failed), its exit status, the ``topo -m`` matrix and why it gave
    no list ('' when it did). ``tools``: the nvidia-smi option, lspci's path (None when the host has none) and
    where names are looked up."""
    nvidia_smi, lspci_path, searched = tools
    smi_path = find(nvidia_smi)
    if smi_path is None:
        missing = not_found(nvidia_smi, searched)
        errors.append(
            f"{missing}: it comes with the NVIDIA driver, so install the driver, or set nvidia_smi_path to where it is."
        )
        return None, None, {}, missing
    gpus, smi_rc, said = query_nvidia_smi(run, smi_path, errors, container, lspci_path is not None)
    return gpus, smi_rc, query_topology(run, smi_path, errors) if gpus else {}, said


def _lspci_facts(
    run: Runner, lspci: str, lspci_path: str | None, searched: str, errors: list[str]
) -> tuple[list[dict[str, str]] | None, list[str]]:
    """NVIDIA GPUs on the PCI bus (None when lspci is missing or failed) and NVSwitch bus IDs."""
    if lspci_path is None:
        errors.append(
            f"{not_found(lspci, searched)}: install pciutils to list GPUs without the driver, or set lspci_path to "
            "where it is."
        )
        return None, []
    return query_lspci(run, lspci_path, errors)


def _pci_facts(
    run: Runner,
    tools: tuple[str, str | None, str, str],
    sysfs: tuple[Mapping[str, Mapping[str, str]] | None, str],
    errors: list[str],
) -> tuple[str, list[dict[str, Any]] | None, list[str], str]:
    """Where the PCI bus was read ("sysfs", "lspci" or "none"), its NVIDIA GPUs (None when unread), NVSwitch bus
    IDs, and why the sysfs folder gave nothing ('' when it was read or not asked for).

    sysfs is (read_pci_devices' folder contents or None, why it could not be read: the folder and the reason);
    lspci runs only when sysfs gives nothing usable. ``tools``: lspci's option, its path (None when the host
    has none), where names are looked up and the folder sysfs came from.
    """
    lspci, lspci_path, searched, folder = tools
    devices, why = sysfs
    if devices is not None:
        try:
            return "sysfs", parse_sysfs_pci(devices), parse_sysfs_pci_nvswitches(devices), ""
        except ValueError as exc:
            why = f"{folder} is not sysfs-like ({exc})"
    lspci_errors: list[str] = []
    pci_gpus, nvswitches = _lspci_facts(run, lspci, lspci_path, searched, lspci_errors)
    if why:
        instead = "the GPUs were listed with lspci instead" if pci_gpus is not None else "nor could lspci list them"
        errors.append(
            f"{why[:1].upper()}{why[1:]}: {instead}. Point pci_devices_path at /sys/bus/pci/devices (the default) or "
            "a folder of the same layout (<bus id>/vendor, device, class)."
        )
    errors.extend(lspci_errors)
    return ("none" if pci_gpus is None else "lspci"), pci_gpus, nvswitches, why


def _source_and_models(
    gpus: list[dict[str, Any]] | None, pci_gpus: list[dict[str, Any]] | None, pci_source: str
) -> tuple[str, list[str]]:
    """Where the GPUs were listed ("nvidia-smi", "sysfs", "lspci" or "none") and the sorted model names given.

    sysfs and ``lspci -n`` have no names: their GPUs are named by ``vendor:device`` ID.
    """
    if gpus is not None:
        return "nvidia-smi", sorted({gpu["name"] for gpu in gpus})
    if pci_gpus is not None:
        return pci_source, sorted({gpu["description"] or gpu["device_id"] for gpu in pci_gpus})
    return "none", []


def _missing_from_smi(gpus: list[dict[str, Any]] | None, pci_gpus: list[dict[str, Any]] | None) -> list[str]:
    """Bus IDs of the GPUs on the PCI bus that nvidia-smi does not list (none unless both listed GPUs)."""
    if gpus is None or pci_gpus is None:
        return []
    # Both parsers give bus IDs in one form (gpu_parsers.normalize_bus_id), so they compare as text.
    seen = {gpu["pci_bus_id"] for gpu in gpus}
    return [gpu["pci_bus_id"] for gpu in pci_gpus if gpu["pci_bus_id"] not in seen]


def gather_gpu_facts(
    run: Runner,
    find: Finder,
    nvidia_smi: str = "nvidia-smi",
    lspci: str = "lspci",
    proc_driver_version: str | None = None,
    sysfs: tuple[Mapping[str, Mapping[str, str]] | None, str] = (None, ""),
    container: bool = False,
    searched: str = "PATH",
    pci_devices_path: str = "The PCI device folder",
) -> dict[str, Any]:
    """Build the gpu_facts dict; all I/O goes through run and find, so tests pass fakes.

    proc_driver_version is the text of /proc/driver/nvidia/version, or None when it does not exist.
    sysfs is what :func:`read_pci_devices` returned; the default (None, "") means "not read" and
    lists the PCI bus with lspci, without an error. container says whether this runs in a container
    (gpu_parsers.in_container), for the order of exit 9's fix. searched says where find looks for a
    bare name (for the message of a tool that is not installed); pci_devices_path names the folder sysfs
    came from.

    Raises:
        OutputFormatError: a tool succeeded but its output could not be parsed.
    """
    errors: list[str] = []
    lspci_path = find(lspci)
    gpus, smi_rc, topology, smi_problem = _smi_facts(run, find, (nvidia_smi, lspci_path, searched), errors, container)
    pci_source, pci_gpus, nvswitches, pci_devices_problem = _pci_facts(
        run, (lspci, lspci_path, searched, pci_devices_path), sysfs, errors
    )

    missing = _missing_from_smi(gpus, pci_gpus)
    source, models = _source_and_models(gpus, pci_gpus, pci_source)

    driver_version = next((gpu["driver_version"] for gpu in gpus or [] if gpu["driver_version"]), None)
    if driver_version is None and proc_driver_version is not None:
        driver_version = parse_proc_driver_version(proc_driver_version)

    return {
        "source": source,
        # exit 6 ("No devices were found") comes after NVML initialised, so the driver answered.
        "driver_loaded": smi_rc in (0, 6) or proc_driver_version is not None,
        # nvidia-smi is there and says the kernel module is not (exit 9): the driver's user space without it.
        "module_not_loaded": smi_rc == NVIDIA_SMI_MODULE_NOT_LOADED_RC,
        "driver_version": driver_version,
        "count": len(gpus or []),
        "gpus": gpus or [],
        "models": models,
        "pci_gpus": pci_gpus or [],
        "pci_count": None if pci_gpus is None else len(pci_gpus),
        "pci_nvswitch_count": None if pci_gpus is None else len(nvswitches),
        "pci_source": pci_source,
        "missing_from_nvidia_smi": missing,
        "topology": topology,
        "nvlink_pairs": nvlink_pairs(topology),
        "nvswitch_present": bool(nvswitches) or nvswitch_in_topology(topology),
        "nvidia_smi_problem": smi_problem or None,
        "pci_devices_problem": pci_devices_problem or None,
        "lspci_path": lspci_path,
        "errors": errors,
    }


def make_runner(module: AnsibleModule, timeout: int) -> Runner:
    """A Runner that stops each command after timeout seconds (when `timeout` exists) and never raises."""
    timeout_bin = module.get_bin_path("timeout")

    def run(command: Sequence[str]) -> tuple[int, str, str]:
        argv = [timeout_bin, "-k", "5", str(timeout), *command] if timeout_bin else list(command)
        try:
            # LC_ALL=C: lspci class names and nvidia-smi messages must not be translated.
            rc, stdout, stderr = module.run_command(argv, environ_update={"LC_ALL": "C"}, handle_exceptions=False)
        except OSError as exc:
            return 127, "", f"cannot run {command[0]}: {exc}"
        if timeout_bin and rc in (EXIT_TIMED_OUT, 128 + 9):
            return EXIT_TIMED_OUT, "", f"timed out after {timeout} s (option timeout)"
        return rc, stdout, stderr

    return run


def make_finder(module: AnsibleModule) -> Finder:
    """A Finder: a path with a slash must be an executable file; a bare name is looked up on PATH and sbin."""

    def find(name: str) -> str | None:
        if "/" in name:
            return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
        return module.get_bin_path(name)

    return find


def read_pci_devices(path: str) -> tuple[dict[str, dict[str, str]] | None, str]:
    """The vendor, device and class files of each PCI function folder under path (sysfs layout).

    Returns (bus ID folder -> file name -> text, ""), or (None, the folder and why it gives nothing: it
    does not exist, is not a folder, cannot be read, is empty). A file that cannot be read is ''; the
    parser decides whether that matters.
    """
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except NotADirectoryError:
        return None, f"{path} is not a folder"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    if not names:
        return None, f"{path} is empty"
    devices: dict[str, dict[str, str]] = {}
    for name in names:
        files = devices[name] = {}
        for key in PCI_DEVICE_FILES:
            try:
                with open(os.path.join(path, name, key), encoding="ascii", errors="replace") as handle:
                    files[key] = handle.read()
            except OSError:
                files[key] = ""
    return devices, ""


def read_proc_driver_version() -> str | None:
    """Text of /proc/driver/nvidia/version, or None when the kernel module is not loaded."""
    try:
        with open(PROC_DRIVER_VERSION, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
            "lspci_path": {"type": "str", "default": "lspci"},
            "pci_devices_path": {"type": "path", "default": "/sys/bus/pci/devices"},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["timeout"] < 1:
        module.fail_json(msg=f"timeout must be at least 1 second, got {params['timeout']}.")
    try:
        facts = gather_gpu_facts(
            make_runner(module, params["timeout"]),
            make_finder(module),
            params["nvidia_smi_path"],
            params["lspci_path"],
            read_proc_driver_version(),
            read_pci_devices(params["pci_devices_path"]),
            in_container(),
            f"PATH ({os.environ.get('PATH', '')}) nor in {', '.join(SBIN_DIRS)}",
            params["pci_devices_path"],
        )
    except OutputFormatError as exc:
        module.fail_json(
            msg=f"nvidia_gpu_facts {exc}. This tool version prints a format the module does not know; "
            "report it with the output (in 'output') attached.",
            output=exc.output[:4000],
        )
    facts["pci_devices_path"] = params["pci_devices_path"] if facts["pci_source"] == "sysfs" else ""
    module.exit_json(changed=False, ansible_facts={"gpu_facts": facts})


if __name__ == "__main__":
    main()
