# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""MIG layouts: what a layout asks of each GPU, whether the GPU's model has the profiles, and what
``nvidia-smi`` says the GPUs have now. Pure functions; the module gpu_mig runs the commands.

Profiles and their limits: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/). A GPU has 7 compute slices and 8 memory
slices; a profile ``Ng.Mgb`` takes N compute slices and its memory slices, and the guide gives how many
instances of each profile fit. ``nvidia-smi -L`` lists one ``MIG <profile> Device <n>: (UUID: MIG-...)``
line under its GPU for each compute instance (the guide's "Getting Started with MIG" examples).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
GPU_LINE = re.compile(r"^GPU (\d+): (.*) \(UUID: (GPU-[^)]+)\)$")
MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)$")
FIX_LAYOUT = "Fix gpu_mig_layout (the collection's data/mig_profiles.yml lists the profiles of each model)."


def model_profiles(gpu: dict[str, Any], models: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The profiles (``{profile: {instances, memory_slices}}``) of the first model whose ``match`` (a regular
    expression) is found in the GPU's ``name``, or whose ``pci_ids`` hold its ``device_id`` (a GPU known only
    from the PCI bus); None for a GPU without MIG in the table."""
    for model in models:
        if re.search(model["match"], gpu.get("name") or "") or gpu.get("device_id") in model.get("pci_ids", []):
            return model["profiles"]
    return None


def desired_layout(layout: list[dict[str, Any]], indices: list[int]) -> tuple[dict[int, list[str]], list[str]]:
    """``({index: [profile, ...]}, problems)``: each GPU the layout names, with its profiles (an empty list:
    MIG mode off). GPUs it does not name are left alone. ``gpus: all`` names every GPU of the host."""
    wanted: dict[int, list[str]] = {}
    problems = []
    for number, entry in enumerate(layout):
        gpus = indices if entry.get("gpus") == "all" else entry.get("gpus")
        if not isinstance(gpus, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in gpus):
            problems.append(f"gpu_mig_layout[{number}].gpus is {gpus!r}, not 'all' or a list of GPU indices.")
            continue
        for index in gpus:
            if index not in indices:
                problems.append(f"gpu_mig_layout[{number}] names GPU {index}; the host has GPUs {indices}.")
            elif index in wanted:
                problems.append(f"gpu_mig_layout names GPU {index} twice (entry {number}).")
            else:
                wanted[index] = list(entry.get("profiles") or [])
    return wanted, problems


def fit_problems(index: int, name: str, profiles: list[str], known: dict[str, Any] | None) -> list[str]:
    """What stops the profiles from fitting on GPU ``index`` (model ``name``): a model without MIG, a profile
    the model does not have, more instances than the model allows, more slices than the GPU has."""
    if not profiles:
        return []
    if known is None:
        return [f"GPU {index} ({name}) has no MIG profiles in data/mig_profiles.yml (its models: A100, H100, "
                f"H200). Leave GPU {index} out of gpu_mig_layout, or add its model's profiles there."]  # fmt: skip
    unknown = sorted(set(profiles) - set(known))
    if unknown:
        return [f"GPU {index} ({name}) has no MIG profile {', '.join(unknown)}; its profiles: "
                f"{', '.join(known)}. {FIX_LAYOUT}"]  # fmt: skip
    counts = Counter(profiles)
    over = [
        f"{count} x {p} (at most {known[p]['instances']})"
        for p, count in counts.items()
        if count > known[p]["instances"]
    ]
    compute = sum(int(p.split("g.")[0]) for p in profiles)
    memory = sum(known[p]["memory_slices"] for p in profiles)
    if compute > COMPUTE_SLICES or memory > MEMORY_SLICES:
        over.append(f"{compute} of {COMPUTE_SLICES} compute slices and {memory} of {MEMORY_SLICES} memory slices")
    return (
        [f"The profiles {profiles} do not fit on GPU {index} ({name}): {'; '.join(over)}. {FIX_LAYOUT}"] if over else []
    )


def layout_problems(
    layout: list[dict[str, Any]], gpus: list[dict[str, Any]], models: list[dict[str, Any]]
) -> list[str]:
    """Every problem of the layout on these GPUs (``[{index, name}]``), before any change."""
    wanted, problems = desired_layout(layout, [gpu["index"] for gpu in gpus])
    known = {gpu["index"]: gpu for gpu in gpus}
    for index, profiles in sorted(wanted.items()):
        gpu = known[index]
        name = gpu.get("name") or f"PCI device {gpu.get('device_id')}"
        problems += fit_problems(index, name, profiles, model_profiles(gpu, models))
    return problems


def parse_list(text: str) -> dict[int, dict[str, Any]]:
    """``nvidia-smi -L`` -> ``{index: {name, uuid, mig: [{profile, device, uuid}]}}``."""
    gpus: dict[int, dict[str, Any]] = {}
    current = None
    for line in text.splitlines():
        gpu, mig = GPU_LINE.match(line.strip()), MIG_LINE.match(line)
        if gpu:
            current = int(gpu.group(1))
            gpus[current] = {"name": gpu.group(2), "uuid": gpu.group(3), "mig": []}
        elif mig and current is not None:
            gpus[current]["mig"].append({"profile": mig.group(1), "device": int(mig.group(2)), "uuid": mig.group(3)})
    return gpus


def parse_modes(text: str) -> dict[int, dict[str, str]]:
    """``--query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader`` -> ``{index: {current,
    pending}}`` (``Enabled``, ``Disabled``, or ``[N/A]`` on a GPU without MIG)."""
    modes = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == 3 and cells[0].isdigit():
            modes[int(cells[0])] = {"current": cells[1], "pending": cells[2]}
    return modes


def differences(
    wanted: dict[int, list[str]], listed: dict[int, dict[str, Any]], modes: dict[int, dict[str, str]]
) -> dict[int, str]:
    """``{index: what differs}`` for each GPU whose MIG mode or MIG devices are not what the layout asks."""
    found = {}
    for index, profiles in sorted(wanted.items()):
        mode = modes.get(index, {}).get("current", "[N/A]")
        have = sorted(device["profile"] for device in listed.get(index, {}).get("mig", []))
        if not profiles and mode == "Enabled":
            found[index] = "MIG mode is enabled; the layout asks for it off"
        elif profiles and mode != "Enabled":
            found[index] = f"MIG mode is {mode}; the layout asks for {', '.join(profiles)}"
        elif profiles and have != sorted(profiles):
            found[index] = f"MIG devices {', '.join(have) or 'none'}; the layout asks for {', '.join(sorted(profiles))}"
    return found


def creation_order(profiles: list[str]) -> list[str]:
    """The biggest instances first, which leaves the placements of the smaller ones free (the guide's
    "Placement" of GPU instances: a profile takes fixed slice positions)."""
    return sorted(profiles, key=lambda p: (-int(p.split("g.")[0]), p))


def cuda_devices(layout: list[dict[str, Any]], gpu_count: int) -> int:
    """The devices one CUDA process (TensorFlow) enumerates on a host of ``gpu_count`` GPUs laid out by ``layout``:
    the GPUs the layout leaves without MIG, plus one MIG device when some GPU has MIG devices, since CUDA 11 and 12
    enumerate a single MIG device per process (MIG User Guide, "CUDA Device Enumeration"). GPUs the layout does
    not name count as without MIG; a layout's wrong indices are the module's to report, not counted here."""
    indices = list(range(gpu_count))
    wanted = desired_layout(layout, indices)[0]
    in_mig = [index for index, profiles in wanted.items() if profiles]
    return gpu_count - len(in_mig) + (1 if in_mig else 0)
