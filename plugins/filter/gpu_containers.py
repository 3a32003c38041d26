# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Filters of the gpu_containers role and of gpu_verify's check of GPU containers.

The CDI specification format: https://github.com/cncf-tags/container-device-interface, SPEC.md (``cdiVersion``,
``kind``, ``devices[].name``, ``containerEdits.deviceNodes[].path``/``hostPath``, ``mounts[].hostPath``).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import yaml

KIND = "nvidia.com/gpu"
GPU_NODE = re.compile(r"^/dev/nvidia[0-9]+$")
# nvidia-smi -L: "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-...)" and under it "MIG 1g.5gb Device 0: (UUID: MIG-...)"
# (NVIDIA MIG User Guide, "Getting Started with MIG": "List GPU instances" and "Device Enumeration").
UUID = re.compile(r"UUID: ((?:GPU|MIG)-[^)\s]+)")
FIX = "Run the driver phase again (playbooks/driver.yml --tags containers) to regenerate it."


def gpu_containers_driver_version(libcuda: str) -> str:
    """The path ``libcuda.so.1`` resolves to (``/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03``) -> its driver
    version (``535.261.03``); empty where there is none."""
    found = re.search(r"libcuda\.so\.([0-9]+(?:\.[0-9]+)+)$", (libcuda or "").strip())
    return found.group(1) if found else ""


def gpu_containers_gpu_uuids(listing: str) -> list[str]:
    """The output of ``nvidia-smi -L`` -> the UUIDs of its GPUs and MIG devices, in order: a changed GPU or MIG
    layout changes the devices the CDI specification names (NVIDIA Container Toolkit, "Support for Container
    Device Interface": the specification is generated again after a change of the GPUs or of MIG)."""
    return UUID.findall(listing or "")


def gpu_containers_cdi_plan(state: Any, spec_exists: bool, record: dict[str, Any]) -> dict[str, Any]:
    """Whether to generate the CDI specification: ``state`` is the slurp result of the last generation's record
    (``{driver_version, toolkit_version, spec, gpus}`` as JSON), ``record`` what it would record now."""
    if not spec_exists:
        return {"generate": True, "reason": "the specification is missing"}
    try:
        last = json.loads(base64.b64decode((state or {}).get("content") or "").decode())
    except ValueError:
        last = None
    if not isinstance(last, dict):
        return {"generate": True, "reason": "no record of what the specification was generated from"}
    for key, what in (("driver_version", "driver"), ("toolkit_version", "toolkit"), ("spec", "path")):
        if str(last.get(key)) != str(record.get(key)):
            return {"generate": True, "reason": f"the {what} changed from {last.get(key)} to {record.get(key)}"}
    # A record from before the GPUs were recorded has none: generated once more, then recorded.
    if last.get("gpus") != list(record.get("gpus") or []):
        return {"generate": True, "reason": "the GPUs or their MIG devices changed"}
    return {"generate": False, "reason": "up to date"}


def spec_paths(spec_text: str) -> list[str]:
    """Every host path the specification gives a container: device nodes (their ``hostPath`` or ``path``) and
    mounts' ``hostPath``, in order, once each. Empty for text that is no CDI specification."""
    spec = _load(spec_text)
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    paths = [n.get("hostPath") or n.get("path") for e in edits for n in e.get("deviceNodes") or []]
    paths += [m.get("hostPath") for e in edits for m in e.get("mounts") or []]
    return list(dict.fromkeys(p for p in paths if p))


def gpu_containers_problems(
    spec_text: str, spec_path: str, present: list[str], gpu_nodes: list[str], run: Any = None
) -> list[dict[str, str]]:
    """What is wrong with the host's GPU containers: the specification at ``spec_path`` (its text) against the
    host paths that exist (``present``) and the host's GPU device files (``gpu_nodes``); ``run`` the result of
    ``<engine> run --device nvidia.com/gpu=all <image> ls /dev`` (none where no container ran)."""
    spec = _load(spec_text)
    gpu_nodes = sorted(set(gpu_nodes))  # a file listed twice (found, and named by the specification) counts once
    if spec.get("kind") != KIND:
        return [_problem(f"{spec_path} is no CDI specification of kind {KIND}.", FIX)]
    names = [str(d.get("name")) for d in spec.get("devices") or []]
    problems = []
    gpus = sorted(n for n in names if n.isdigit())
    if "all" not in names or len(gpus) != len(gpu_nodes):
        problems.append(
            _problem(
                f"{spec_path} names GPUs {', '.join(gpus) or 'none'} (all: {'all' in names}) but the host has "
                f"{len(gpu_nodes)} GPU device files ({', '.join(sorted(gpu_nodes)) or 'none'}).",
                FIX,
            )
        )
    missing = [p for p in spec_paths(spec_text) if p not in present]
    if missing:
        problems.append(_problem(f"{spec_path} gives containers files the host lacks: {', '.join(missing)}.", FIX))
    if isinstance(run, dict) and run:
        seen = {f"/dev/{line.strip()}" for line in run.get("stdout_lines") or []}
        lacking = sorted(set(gpu_nodes) - seen)
        if run.get("rc") != 0 or lacking:
            said = " ".join((run.get("stderr") or "").splitlines()[-2:])
            problems.append(
                _problem(
                    f"A container run with --device {KIND}=all did not see the host's GPUs "
                    f"(rc {run.get('rc')}; missing {', '.join(lacking) or 'none'}) {said}".strip(),
                    f"Run `{' '.join(run.get('cmd') or [])}` on the host to see why; check gpu_containers_verify_image.",
                )
            )
    return problems


def gpu_containers_verify_results(results: Any, problems: list[dict[str, str]]) -> Any:
    """``gpu_verify_results`` with the containers' ``problems`` added to every stack's document (a host whose GPU
    containers fail fails, with the cause in each row of the fleet report)."""
    if not problems or not isinstance(results, dict):
        return results
    return {
        stack: dict(doc, ok=False, problems=list(doc.get("problems") or []) + problems)
        for stack, doc in results.items()
    }


def _load(text: str) -> dict[str, Any]:
    try:
        spec = yaml.safe_load(text or "")
    except yaml.YAMLError:
        return {}
    return spec if isinstance(spec, dict) else {}


def _problem(cause: str, fix: str) -> dict[str, str]:
    return {"check": "containers", "cause": cause, "fix": fix}


class FilterModule:
    """gpu_containers filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_containers_driver_version": gpu_containers_driver_version,
            "gpu_containers_cdi_plan": gpu_containers_cdi_plan,
            "gpu_containers_gpu_uuids": gpu_containers_gpu_uuids,
            "gpu_containers_spec_paths": spec_paths,
            "gpu_containers_problems": gpu_containers_problems,
            "gpu_containers_verify_results": gpu_containers_verify_results,
        }
