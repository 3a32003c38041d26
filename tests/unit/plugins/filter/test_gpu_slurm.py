"""The gpu_slurm role's filters: option rules, the GRES type of a model, gres.conf's lines, scontrol show node read."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

# tests/conftest.py puts ROOT/collections on sys.path: plugins import by their collection path.
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_slurm as slurm

ROOT = Path(__file__).resolve().parents[4]
TYPES = yaml.safe_load((ROOT / "roles/gpu_slurm/defaults/main.yml").read_text())["gpu_slurm_types"]
A100 = [
    {"index": 1, "name": "NVIDIA A100-SXM4-80GB"},
    {"index": 0, "name": "NVIDIA A100-SXM4-80GB"},
]
SETTINGS = {
    "types": TYPES,
    "gres_type": "",
    "autodetect": False,
    "node_name": "gpu01",
    "header": "# managed",
    "cores": {},
}
# Slurm 22.05's scontrol show node (Debian 12), a node draining with a job on it.
SHOW_NODE = """NodeName=gpu01 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=0.10
   AvailableFeatures=(null)
   Gres=gpu:a100:2(S:0)
   NodeAddr=gpu01 NodeHostName=gpu01 Version=22.05.8
   OS=Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)
   RealMemory=1 AllocMem=0 FreeMem=N/A Sockets=2 Boards=1
   State=MIXED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   Reason=gpu_fleet reprovision [root@2026-12-07T20:40:01]
"""
TOPO = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV12\t0-63\t0\t\tN/A\n"
    "GPU1\tNV12\t X \t64-127\t1\t\tN/A\n"
)


def test_the_type_is_the_models_word_or_the_override():
    assert slurm.gpu_slurm_type("NVIDIA A100-SXM4-80GB", TYPES) == "a100"
    assert slurm.gpu_slurm_type("NVIDIA H100 80GB HBM3", TYPES) == "h100"
    assert slurm.gpu_slurm_type("NVIDIA L40S", TYPES) == "l40s"
    assert slurm.gpu_slurm_type("NVIDIA L40S", TYPES, "big") == "big"
    with pytest.raises(
        AnsibleFilterError, match=r"no GRES type for the GPU model 'NVIDIA RTX 4090'.*gpu_slurm_gres_type"
    ):
        slurm.gpu_slurm_type("NVIDIA RTX 4090", TYPES)


def test_one_line_per_gpu_by_index_with_the_cores_given():
    plan = slurm.gpu_slurm_gres(A100, dict(SETTINGS, cores={"1": "64-127"}))
    assert plan["gres"] == "gpu:a100:2"
    assert plan["node_line"] == "NodeName=gpu01 Gres=gpu:a100:2"
    assert plan["gres_conf"] == (
        "# managed\nName=gpu Type=a100 File=/dev/nvidia0\nName=gpu Type=a100 File=/dev/nvidia1 Cores=64-127\n"
    )


def test_autodetect_writes_nvml_only():
    plan = slurm.gpu_slurm_gres(A100, dict(SETTINGS, autodetect=True))
    assert plan["gres_conf"] == "# managed\nAutoDetect=nvml\n"
    assert plan["gres"] == "gpu:a100:2"


def test_no_gpu_or_two_types_stop_with_the_fix():
    with pytest.raises(AnsibleFilterError, match="lists no GPU"):
        slurm.gpu_slurm_gres([], SETTINGS)
    mixed = [A100[0], {"index": 2, "name": "NVIDIA H100 80GB HBM3"}]
    with pytest.raises(AnsibleFilterError, match=r"several types \(a100, h100\).*gpu_slurm_gres_type"):
        slurm.gpu_slurm_gres(mixed, SETTINGS)
    assert slurm.gpu_slurm_gres(mixed, dict(SETTINGS, gres_type="mixed"))["gres"] == "gpu:mixed:2"


def test_the_cores_of_the_topology():
    assert slurm.gpu_slurm_topology_cores(TOPO) == {0: "0-63", 1: "64-127"}
    assert slurm.gpu_slurm_topology_cores("GPU0\tX\n") == {}


def test_scontrol_show_node_is_read_with_spaces_in_reason_and_os():
    node = slurm.gpu_slurm_node(SHOW_NODE)
    assert node["Gres"] == "gpu:a100:2(S:0)"
    assert node["State"] == "MIXED+DRAIN"
    assert node["Reason"] == "gpu_fleet reprovision [root@2026-12-07T20:40:01]"
    assert node["OS"].startswith("Linux 6.1.0-28-amd64 #1")
    assert slurm.gpu_slurm_busy(node)
    assert not slurm.gpu_slurm_busy({"State": "IDLE+DRAIN"})
    assert not slurm.gpu_slurm_busy({"State": "DOWN"})
    assert not slurm.gpu_slurm_busy({})
    assert not slurm.gpu_slurm_drained(node)  # draining: its job still runs
    assert slurm.gpu_slurm_drained({"State": "IDLE+DRAIN"})
    assert slurm.gpu_slurm_drained({"State": "DOWN+DRAIN+NOT_RESPONDING"})
    assert not slurm.gpu_slurm_drained({"State": "IDLE"})


def test_the_gres_slurm_shows_against_the_hosts():
    node = slurm.gpu_slurm_node(SHOW_NODE)
    assert slurm.gpu_slurm_gres_problem(node, "gpu:a100:2", "gpu01") == ""
    problem = slurm.gpu_slurm_gres_problem(node, "gpu:a100:4", "gpu01")
    assert "Slurm shows Gres=gpu:a100:2 for the node gpu01, the host has gpu:a100:4" in problem
    assert "scontrol reconfigure" in problem
    assert "Slurm does not know the node gpu02" in slurm.gpu_slurm_gres_problem({}, "gpu:a100:2", "gpu02")
    invalid = dict(node, State="IDLE+DRAIN+INVALID_REG", Reason="gres/gpu count reported lower than configured (1 < 2)")
    assert "INVALID_REG" in slurm.gpu_slurm_gres_problem(invalid, "gpu:a100:2", "gpu01")


def test_option_rules_name_the_option_and_the_fix():
    good = {
        "gpu_slurm_gres_type": "a100",
        "gpu_slurm_types": TYPES,
        "gpu_slurm_cores": {0: "0-31"},
        "gpu_slurm_node_name": "gpu01",
    }
    assert slurm.gpu_slurm_option_problems(good) == []
    bad = dict(good, gpu_slurm_gres_type="a 100", gpu_slurm_types={"A100": "a:100"}, gpu_slurm_cores={0: "all"})
    problems = slurm.gpu_slurm_option_problems(bad)
    assert len(problems) == 3
    assert problems[0].startswith("gpu_slurm_gres_type is 'a 100': a GRES type is one word of slurm.conf")
    assert "gpu_slurm_types['A100'] is 'a:100'" in problems[1]
    assert "gpu_slurm_cores[0] is 'all'" in problems[2]


def test_a_completing_flag_is_busy_and_not_drained():
    # IDLE+COMPLETING+DRAIN: the last job's epilog still runs (sinfo(1), NODE STATE CODES).
    node = {"State": "IDLE+COMPLETING+DRAIN"}
    assert slurm.gpu_slurm_busy(node)
    assert not slurm.gpu_slurm_drained(node)
    assert slurm.gpu_slurm_busy({"State": "DOWN+COMPLETING"})


def test_a_failed_scontrol_counts_as_busy_unless_the_node_is_not_found():
    down = {
        "rc": 1,
        "stdout": "",
        "stderr": "slurm_load_node error: Unable to contact slurm controller (connect failure)",
    }
    assert slurm.gpu_slurm_show_busy(down)
    munge = {"rc": 1, "stdout": "", "stderr": "Invalid authentication credential"}
    assert slurm.gpu_slurm_show_busy(munge)
    missing = {"rc": 2, "msg": "[Errno 2] No such file or directory: b'scontrol'", "cmd": "scontrol"}
    assert slurm.gpu_slurm_show_busy(missing)
    assert not slurm.gpu_slurm_show_busy({"rc": 1, "stdout": "Node gpu02 not found", "stderr": ""})
    assert slurm.gpu_slurm_show_busy({"rc": 0, "stdout": SHOW_NODE})
    assert not slurm.gpu_slurm_show_busy({"rc": 0, "stdout": SHOW_NODE.replace("MIXED+DRAIN", "IDLE+DRAIN")})
    assert not slurm.gpu_slurm_show_busy({"skipped": True, "changed": False})


def test_mig_mode_without_autodetect_is_refused_with_the_fix():
    mig = {
        "gpu_slurm_enabled": True,
        "gpu_slurm_autodetect": False,
        "gpu_mig_enabled": True,
        "gpu_mig_layout": [{"gpus": "all", "profiles": ["3g.40gb", "3g.40gb"]}],
    }
    (problem,) = slurm.gpu_slurm_option_problems(mig)
    assert "gpu_mig_layout puts GPUs in MIG mode" in problem and "Fix: set gpu_slurm_autodetect: true" in problem
    assert slurm.gpu_slurm_mig_problems(dict(mig, gpu_slurm_autodetect="yes")) == []
    assert slurm.gpu_slurm_mig_problems(dict(mig, gpu_mig_enabled=False)) == []
    assert slurm.gpu_slurm_mig_problems(dict(mig, gpu_slurm_enabled=False)) == []
    assert slurm.gpu_slurm_mig_problems(dict(mig, gpu_mig_layout=[{"gpus": [0], "profiles": []}])) == []


def test_file_is_the_drivers_device_minor_not_the_index():
    # grep -r "Device Minor" /proc/driver/nvidia/gpus on a host whose minors run against nvidia-smi's index.
    found = (
        "/proc/driver/nvidia/gpus/0000:17:00.0/information:Device Minor: \t 1\n"
        "/proc/driver/nvidia/gpus/0000:65:00.0/information:Device Minor: \t 0\n"
    )
    minors = slurm.gpu_slurm_minors(found)
    assert minors == {"0000:17:00.0": 1, "0000:65:00.0": 0}
    gpus = [dict(A100[1], pci_bus_id="0000:17:00.0"), dict(A100[0], pci_bus_id="0000:65:00.0")]
    plan = slurm.gpu_slurm_gres(gpus, dict(SETTINGS, minors=minors))
    assert (
        plan["gres_conf"] == "# managed\nName=gpu Type=a100 File=/dev/nvidia1\nName=gpu Type=a100 File=/dev/nvidia0\n"
    )
    # No procfs of the driver (grep found nothing): the index.
    assert slurm.gpu_slurm_minors("") == {}
    plan = slurm.gpu_slurm_gres(gpus, dict(SETTINGS, minors={}))
    assert "File=/dev/nvidia0\nName=gpu Type=a100 File=/dev/nvidia1\n" in plan["gres_conf"]
