# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""gpu_slurm's filters: the option rules, the GRES type of a GPU model, the lines of ``gres.conf`` and the node's
``Gres=`` for ``slurm.conf``, and ``scontrol show node`` read.

Slurm's documentation: gres.conf(5) (https://slurm.schedmd.com/gres.conf.html: ``Name``, ``Type``, ``File``,
``Cores``, ``AutoDetect``), Generic Resource Scheduling (https://slurm.schedmd.com/gres.html: a node's
``Gres=gpu:<type>:<count>`` in slurm.conf), scontrol(1) (https://slurm.schedmd.com/scontrol.html: ``show node``).
"""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

OPTIONS = ("gpu_slurm_gres_type", "gpu_slurm_types", "gpu_slurm_cores", "gpu_slurm_node_name")
# The inputs the option rules read besides those they check (their types are checked by their roles' argument
# specifications): MIG mode with a gres.conf of physical GPUs is refused (gpu_slurm_mig_problems).
READS = ("gpu_slurm_enabled", "gpu_slurm_autodetect", "gpu_mig_enabled", "gpu_mig_layout")
# A GRES type or a node name is one word of slurm.conf: letters, digits, and . _ - (a space or a ':' would
# split the Gres= value, gres.html, "Configuration").
WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Slurm's core list syntax, gres.conf(5) Cores: "0-3,8,10-11".
CORES = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
# A GPU's line of the driver's /proc/driver/nvidia/gpus/<bus id>/information, as grep -r prints it.
MINOR = re.compile(
    r"^/proc/driver/nvidia/gpus/([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])/information:"
    r"Device Minor:\s*(\d+)$"
)
# scontrol show node: KEY=value pairs; a value runs to the next " Key=" (Reason and OS hold spaces).
PAIR = re.compile(r"([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_:/]*=|$)")
# The base states of a node with jobs on it (scontrol(1), NODE STATE CODES; squeue/sinfo man pages).
BUSY = ("ALLOCATED", "MIXED", "COMPLETING")
# COMPLETING is also a flag on another base state (IDLE+COMPLETING+DRAIN: the last job's epilog still runs;
# sinfo(1), NODE STATE CODES, "COMPLETING").
BUSY_FLAGS = ("COMPLETING",)
# scontrol's answer for a node slurm.conf does not list ("Node gpu01 not found", scontrol(1) show node).
NOT_FOUND = re.compile(r"\bNode \S+ not found\b", re.IGNORECASE)


def _word_problem(name: str, value: Any, what: str) -> list[str]:
    if value in (None, "") or (isinstance(value, str) and WORD.match(value)):
        return []
    return [
        f"{name} is {value!r}: {what} is one word of slurm.conf (letters, digits, '.', '_', '-'; no space or ':'). "
        f"Fix: set {name} to a name such as 'a100' in your inventory."
    ]


def _on(value: Any) -> bool:
    """An inventory's boolean (true, "yes", 1, ...) as Ansible's ``bool`` filter reads it; anything else is off."""
    return boolean(value, strict=False) if value is not None else False


def gpu_slurm_mig_problems(options: dict[str, Any]) -> list[str]:
    """The cause and fix where gpu_slurm would write File=/dev/nvidiaN per physical GPU on a host gpu_mig puts in MIG
    mode: Slurm then schedules MIG devices, not those GPUs, and the node's GRES no longer match (gres.html,
    "MIG Management": MIG devices are configured with AutoDetect=nvml). ``[]`` with gpu_slurm_autodetect, without
    gpu_slurm_enabled or gpu_mig_enabled, or when gpu_mig_layout gives no GPU any profile (MIG mode off)."""
    layout = options.get("gpu_mig_layout") or []
    mig_on = [entry for entry in layout if isinstance(entry, dict) and entry.get("profiles")]
    if not (
        _on(options.get("gpu_slurm_enabled"))
        and _on(options.get("gpu_mig_enabled"))
        and mig_on
        and not _on(options.get("gpu_slurm_autodetect"))
    ):
        return []
    return [
        "gpu_slurm_enabled and gpu_mig_enabled are both set and gpu_mig_layout puts GPUs in MIG mode, but "
        "gpu_slurm_autodetect is false: gpu_slurm would write one File=/dev/nvidiaN per physical GPU, while Slurm "
        "schedules MIG devices on such GPUs, so slurmd's GRES would not match and the node goes INVALID. Fix: set "
        "gpu_slurm_autodetect: true (gres.conf AutoDetect=nvml, which finds the MIG devices; Slurm's Generic "
        "Resource Scheduling guide, section MIG Management) and give the node's Gres= in slurm.conf the MIG types, "
        "or leave gpu_mig_enabled false on Slurm nodes."
    ]


def gpu_slurm_option_problems(options: dict[str, Any]) -> list[str]:
    """``{{ {'gpu_slurm_gres_type': ..., ...} | gpu_fleet.tf_hosts.gpu_slurm_option_problems }}``: one message
    (cause and fix) per option that breaks its rule, MIG mode without autodetection among them; ``[]`` when
    none."""
    found = gpu_slurm_mig_problems(options)
    found += _word_problem("gpu_slurm_gres_type", options.get("gpu_slurm_gres_type"), "a GRES type")
    found += _word_problem("gpu_slurm_node_name", options.get("gpu_slurm_node_name"), "a node name")
    for model, gres_type in (options.get("gpu_slurm_types") or {}).items():
        found += _word_problem(f"gpu_slurm_types[{model!r}]", gres_type, "a GRES type")
    for index, cores in (options.get("gpu_slurm_cores") or {}).items():
        if not CORES.match(str(cores)):
            found.append(
                f"gpu_slurm_cores[{index!r}] is {cores!r}, not a core list of gres.conf(5) Cores= such as '0-31' "
                "or '0-15,32-47'. Fix: give each GPU index its cores in that form, or leave the GPU out."
            )
    return found


def gpu_slurm_type(model: str, types: dict[str, str], override: str = "") -> str:
    """The GRES type of a GPU named ``model`` (nvidia-smi's name, ``NVIDIA A100-SXM4-80GB``): ``override`` when
    given, else the type of the first key of ``types`` that is a word of the name (split at spaces and '-')."""
    if override:
        return override
    words = {word.upper() for word in re.split(r"[\s-]+", model or "")}
    for key, gres_type in types.items():
        if str(key).upper() in words:
            return gres_type
    raise AnsibleFilterError(
        f"gpu_slurm: no GRES type for the GPU model {model!r} (known: {', '.join(types)}). "
        "Fix: set gpu_slurm_gres_type (one type for the host) or add the model to gpu_slurm_types."
    )


def gpu_slurm_topology_cores(topo: str) -> dict[int, str]:
    """``{GPU index: CPU list}`` from the ``CPU Affinity`` column of ``nvidia-smi topo -m``; GPUs whose cell is
    ``N/A`` are left out."""
    lines = [line for line in (topo or "").splitlines() if line.strip()]
    if not lines or "CPU Affinity" not in lines[0]:
        return {}
    # The header's labels are tab-separated; "CPU Affinity" is one label.
    header = [cell.strip() for cell in lines[0].strip("\n").split("\t") if cell.strip()]
    column = header.index("CPU Affinity") + 1  # each row starts with its own label
    found = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split("\t")]
        match = re.match(r"^GPU(\d+)$", cells[0])
        if match and len(cells) > column and CORES.match(cells[column]):
            found[int(match.group(1))] = cells[column]
    return found


def gpu_slurm_minors(text: str) -> dict[str, int]:
    """``{PCI bus id: device minor}`` from ``grep -r 'Device Minor' /proc/driver/nvidia/gpus``: one line per GPU,
    ``/proc/driver/nvidia/gpus/0000:17:00.0/information:Device Minor:     0``. The NVIDIA driver names each GPU's
    device file /dev/nvidia<minor>, and the minor need not be nvidia-smi's index (which follows PCI order, or
    CUDA_DEVICE_ORDER); bus ids come as nvidia_gpu_facts writes them (lower-case ``dddd:bb:dd.f``)."""
    found = {}
    for line in (text or "").splitlines():
        match = MINOR.match(line.strip())
        if match:
            found[match.group(1).lower()] = int(match.group(2))
    return found


def gpu_slurm_gres(gpus: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """gres.conf's text and the node's ``Gres=`` value from nvidia_gpu_facts' ``gpus`` and ``settings``
    (``types``, ``gres_type``, ``cores`` {index: list}, ``autodetect``, ``node_name``, ``header``, ``minors``
    {PCI bus id: device minor}, from gpu_slurm_minors: File=/dev/nvidia<minor>, the index where the driver does not
    say)."""
    if not gpus:
        raise AnsibleFilterError(
            "gpu_slurm: nvidia-smi lists no GPU on this host, so no gres.conf can be written. "
            "Fix: install and load the NVIDIA driver (playbooks/driver.yml) first, or leave gpu_slurm_enabled false."
        )
    types = sorted(
        {gpu_slurm_type(gpu.get("name", ""), settings["types"], settings.get("gres_type") or "") for gpu in gpus}
    )
    if len(types) > 1:
        raise AnsibleFilterError(
            f"gpu_slurm: this host has GPUs of several types ({', '.join(types)}); one Gres=gpu:<type>:<n> per node "
            "is written. Fix: set gpu_slurm_gres_type to one type for the host."
        )
    gres = f"gpu:{types[0]}:{len(gpus)}"
    lines = [settings.get("header", "")]
    if settings.get("autodetect"):
        lines.append("AutoDetect=nvml")
    else:
        cores = {int(key): str(value) for key, value in (settings.get("cores") or {}).items()}
        minors = settings.get("minors") or {}
        for gpu in sorted(gpus, key=lambda item: item["index"]):
            minor = minors.get(str(gpu.get("pci_bus_id") or "").lower(), gpu["index"])
            line = f"Name=gpu Type={types[0]} File=/dev/nvidia{minor}"
            if gpu["index"] in cores:
                line += f" Cores={cores[gpu['index']]}"
            lines.append(line)
    text = "\n".join(line for line in lines if line) + "\n"
    node = f"NodeName={settings['node_name']} Gres={gres}"
    return {"gres": gres, "gres_conf": text, "node_line": node, "count": len(gpus), "type": types[0]}


def gpu_slurm_node(text: str) -> dict[str, str]:
    """``scontrol show node <name>``'s answer as ``{key: value}`` (``State``, ``Gres``, ``Reason``, ...)."""
    found: dict[str, str] = {}
    for line in (text or "").splitlines():
        for key, value in PAIR.findall(line.strip()):
            found.setdefault(key, value.strip())
    return found


def gpu_slurm_busy(node: dict[str, str]) -> bool:
    """True when the node's base state has jobs on it (``MIXED+DRAIN`` is still draining: busy) or a job still
    completes on it (a ``COMPLETING`` flag: ``IDLE+COMPLETING+DRAIN`` runs the epilog)."""
    states = (node.get("State") or "").upper().split("+")
    return states[0] in BUSY or any(flag in BUSY_FLAGS for flag in states[1:])


def gpu_slurm_show_busy(result: dict[str, Any]) -> bool:
    """Whether a registered ``scontrol show node`` result forbids a slurmd restart. A failed scontrol (controller
    down, munge broken, no scontrol) says nothing about the node's jobs, so it counts as busy: the restart waits.
    Only "not found" (Slurm does not list the node, so it runs no job there) and a skipped task do not."""
    if not result or result.get("skipped"):
        return False
    if result.get("rc") == 0:
        return gpu_slurm_busy(gpu_slurm_node(result.get("stdout") or ""))
    said = f"{result.get('stdout') or ''} {result.get('stderr') or ''} {result.get('msg') or ''}"
    return not NOT_FOUND.search(said)


def gpu_slurm_drained(node: dict[str, str]) -> bool:
    """True when Slurm shows the node drained: a DRAIN flag and no jobs left (``IDLE+DRAIN``, not ``MIXED+DRAIN``,
    which is still draining)."""
    return "DRAIN" in (node.get("State") or "").upper().split("+") and not gpu_slurm_busy(node)


def gpu_slurm_gres_problem(node: dict[str, str], expected: str, name: str) -> str:
    """``''`` when Slurm's view of node ``name`` (gpu_slurm_node) has the GRES ``expected``, else the cause and fix."""
    if not node:
        return (
            f"Slurm does not know the node {name} (scontrol show node {name} found nothing). Fix: add "
            f"'NodeName={name} Gres={expected}' to slurm.conf on the Slurm controller and run 'scontrol reconfigure'."
        )
    seen = re.sub(r"\(S:[^)]*\)", "", node.get("Gres") or "(null)")
    if "INVALID" in (node.get("State") or "").upper():
        return (
            f"Slurm refused the node {name}'s registration (State={node.get('State')}, "
            f"Reason={node.get('Reason') or '(none)'}). Fix: make the node's line in slurm.conf and gres.conf on "
            f"{name} agree (Gres={expected}), run 'scontrol reconfigure' and restart slurmd on {name}."
        )
    if expected in seen.split(","):
        return ""
    return (
        f"Slurm shows Gres={seen} for the node {name}, the host has {expected}. Fix: set 'Gres={expected}' in the "
        f"node's line of slurm.conf, run 'scontrol reconfigure', and restart slurmd on {name} when it is idle."
    )


class FilterModule:
    """gpu_slurm's filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_slurm_option_problems": gpu_slurm_option_problems,
            "gpu_slurm_topology_cores": gpu_slurm_topology_cores,
            "gpu_slurm_gres": gpu_slurm_gres,
            "gpu_slurm_minors": gpu_slurm_minors,
            "gpu_slurm_node": gpu_slurm_node,
            "gpu_slurm_busy": gpu_slurm_busy,
            "gpu_slurm_show_busy": gpu_slurm_show_busy,
            "gpu_slurm_drained": gpu_slurm_drained,
            "gpu_slurm_gres_problem": gpu_slurm_gres_problem,
        }
