"""Filters of gpu_containers (plugins/filter/gpu_containers.py): the driver version, when the CDI specification is
generated again, and gpu_verify's check of the specification."""

from __future__ import annotations

import base64
import json

from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_containers import (
    gpu_containers_cdi_plan,
    gpu_containers_driver_version,
    gpu_containers_gpu_uuids,
    gpu_containers_problems,
    gpu_containers_verify_results,
    spec_paths,
)

RECORD = {
    "driver_version": "535.261.03",
    "toolkit_version": "1.17.8",
    "spec": "/etc/cdi/nvidia.yaml",
    "gpus": ["GPU-5a2e1b3c-0000-0000-0000-000000000000"],
}
# nvidia-smi -L of an A100 in MIG mode with two 3g.20gb devices (NVIDIA MIG User Guide, "Device Enumeration").
MIG_LISTING = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5a2e1b3c-0000-0000-0000-000000000000)
  MIG 3g.20gb     Device  0: (UUID: MIG-0a1b2c3d-0000-5000-8000-000000000001)
  MIG 3g.20gb     Device  1: (UUID: MIG-0a1b2c3d-0000-5000-8000-000000000002)
"""
SPEC = """
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- {name: "0", containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}}
- {name: "1", containerEdits: {deviceNodes: [{path: /dev/nvidia1}]}}
- {name: all, containerEdits: {deviceNodes: [{path: /dev/nvidia0}, {path: /dev/nvidia1}]}}
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl}]
  mounts: [{hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03, containerPath: /x}]
"""
PATHS = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1", "/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03"]
NODES = ["/dev/nvidia0", "/dev/nvidia1"]


def _state(record):
    return {"content": base64.b64encode(json.dumps(record).encode()).decode()}


def test_driver_version_from_the_resolved_libcuda():
    assert gpu_containers_driver_version("/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03\n") == "535.261.03"
    assert gpu_containers_driver_version("/usr/lib/x86_64-linux-gnu/libcuda.so.1") == ""
    assert gpu_containers_driver_version("") == ""


def test_generated_when_missing_unrecorded_or_the_driver_changed():
    assert gpu_containers_cdi_plan(_state(RECORD), True, RECORD) == {"generate": False, "reason": "up to date"}
    assert gpu_containers_cdi_plan(_state(RECORD), False, RECORD)["generate"]
    assert gpu_containers_cdi_plan({"failed": True, "msg": "file not found"}, True, RECORD)["generate"]
    changed = gpu_containers_cdi_plan(_state(dict(RECORD, driver_version="520.61.05")), True, RECORD)
    assert changed == {"generate": True, "reason": "the driver changed from 520.61.05 to 535.261.03"}
    assert gpu_containers_cdi_plan(_state(dict(RECORD, toolkit_version="1.16.2")), True, RECORD)["generate"]


def test_gpu_and_mig_uuids_of_nvidia_smi_l():
    assert gpu_containers_gpu_uuids(MIG_LISTING) == [
        "GPU-5a2e1b3c-0000-0000-0000-000000000000",
        "MIG-0a1b2c3d-0000-5000-8000-000000000001",
        "MIG-0a1b2c3d-0000-5000-8000-000000000002",
    ]
    # The R470 form of a MIG device's name; nothing where nvidia-smi printed an error.
    assert gpu_containers_gpu_uuids("  MIG 1g.5gb Device 0: (UUID: MIG-GPU-5a2e/7/0)") == ["MIG-GPU-5a2e/7/0"]
    assert gpu_containers_gpu_uuids("NVIDIA-SMI has failed because it couldn't communicate with the driver.") == []


def test_generated_again_when_the_gpus_or_the_mig_layout_changed():
    # gpu_mig put the GPU in MIG mode with two instances: the specification's devices are gone.
    mig = dict(RECORD, gpus=gpu_containers_gpu_uuids(MIG_LISTING))
    assert gpu_containers_cdi_plan(_state(RECORD), True, mig) == {
        "generate": True,
        "reason": "the GPUs or their MIG devices changed",
    }
    assert not gpu_containers_cdi_plan(_state(mig), True, mig)["generate"]
    # A record written before the GPUs were recorded: generated once more.
    old = {k: v for k, v in RECORD.items() if k != "gpus"}
    assert gpu_containers_cdi_plan(_state(old), True, RECORD)["generate"]


def test_spec_paths_are_device_nodes_and_mounts_once_each():
    assert spec_paths(SPEC) == PATHS
    assert spec_paths("not: [a spec") == []


def test_a_spec_that_matches_the_host_has_no_problems():
    assert gpu_containers_problems(SPEC, "/etc/cdi/nvidia.yaml", PATHS, NODES) == []
    assert gpu_containers_problems(SPEC, "/etc/cdi/nvidia.yaml", PATHS, NODES + NODES) == []  # found and named
    run = {"rc": 0, "stdout_lines": ["null", "nvidia0", "nvidia1", "nvidiactl"], "cmd": ["podman", "run"]}
    assert gpu_containers_problems(SPEC, "/etc/cdi/nvidia.yaml", PATHS, NODES, run) == []


def test_a_missing_gpu_a_missing_file_and_a_failed_container_are_named():
    problems = gpu_containers_problems(SPEC, "/s.yaml", PATHS[1:] + ["/dev/nvidia2"], NODES + ["/dev/nvidia2"])
    assert "names GPUs 0, 1 (all: True) but the host has 3 GPU device files" in problems[0]["cause"]
    assert "files the host lacks: /dev/nvidiactl" in problems[1]["cause"]
    run = {
        "rc": 125,
        "stdout_lines": [],
        "stderr": "Error: unresolvable CDI devices nvidia.com/gpu=all",
        "cmd": ["podman"],
    }
    failed = gpu_containers_problems(SPEC, "/s.yaml", PATHS, NODES, run)
    assert "did not see the host's GPUs (rc 125; missing /dev/nvidia0, /dev/nvidia1)" in failed[0]["cause"]
    assert "unresolvable CDI devices" in failed[0]["cause"]


def test_no_spec_is_one_problem():
    problems = gpu_containers_problems("", "/etc/cdi/nvidia.yaml", [], NODES)
    assert [p["cause"] for p in problems] == ["/etc/cdi/nvidia.yaml is no CDI specification of kind nvidia.com/gpu."]


def test_problems_fail_every_stack_document():
    results = {"tf2.12": {"ok": True, "problems": []}}
    problem = {"check": "containers", "cause": "c", "fix": "f"}
    assert gpu_containers_verify_results(results, []) is results
    assert gpu_containers_verify_results(results, [problem]) == {"tf2.12": {"ok": False, "problems": [problem]}}
