"""nvidia_gpu_facts: parsers on canned nvidia-smi/lspci output, and the module with a fake command runner."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

# tests/conftest.py puts ROOT/collections on sys.path: the module and its module_utils are imported by
# their collection path, as Ansible's module finder resolves them.
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils import gpu_parsers
from ansible_collections.gpu_fleet.tf_hosts.plugins.modules import nvidia_gpu_facts as facts_module

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"
# Debian 12's nvidia-smi 535.261.03 on a machine without the NVIDIA kernel module (its README section).
REAL_NO_MODULE = FIXTURES / "real-535.261.03-no-module"

QUERY_ARG = "--query-gpu=" + ",".join(gpu_parsers.QUERY_FIELDS)
DRIVER_NOT_LOADED = 9
NO_DEVICES = 6


def fixture(case: str, name: str) -> str:
    return (FIXTURES / case / name).read_text(encoding="utf-8")


def real_answer(file: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one real capture, as commands.json records it."""
    entry = json.loads((REAL_NO_MODULE / "commands.json").read_text(encoding="utf-8"))["commands"][file]
    stderr = (REAL_NO_MODULE / entry["stderr"]).read_text(encoding="utf-8") if entry["stderr"] else ""
    return entry["rc"], (REAL_NO_MODULE / file).read_text(encoding="utf-8"), stderr


def canned(case: str) -> dict[str, str]:
    """The stdout files of one fixture folder, keyed by command."""
    folder = FIXTURES / case
    files = {
        "query": folder / "query-gpu.csv",
        "topo": folder / "topo-m.txt",
        "lspci": folder / "lspci-D-nn.txt" if (folder / "lspci-D-nn.txt").exists() else folder / "lspci-nn.txt",
        "smi-error": folder / "nvidia-smi.txt",
    }
    return {key: path.read_text(encoding="utf-8") for key, path in files.items() if path.exists()}


class FakeHost:
    """A Runner and Finder over canned output; records the commands it was asked to run."""

    def __init__(
        self,
        tools: dict[str, str | None],
        outputs: dict[str, tuple[int, str, str]],
    ) -> None:
        self.tools = tools  # name -> path, None when missing
        self.outputs = outputs  # "query" | "topo" | "lspci" -> (rc, stdout, stderr)
        self.commands: list[list[str]] = []

    def find(self, name: str) -> str | None:
        return self.tools.get(name)

    def run(self, command: Sequence[str]) -> tuple[int, str, str]:
        self.commands.append(list(command))
        if command[1:2] == [QUERY_ARG]:
            key = "query"
        elif list(command[1:]) == ["topo", "-m"]:
            key = "topo"
        elif list(command[1:]) == ["-D", "-nn"]:
            key = "lspci"
        else:
            raise AssertionError(f"unexpected command {command}")
        return self.outputs[key]


ALL_TOOLS = {"nvidia-smi": "/usr/bin/nvidia-smi", "lspci": "/usr/bin/lspci"}


def host_for(case: str, tools: dict[str, str | None] | None = None) -> FakeHost:
    """A FakeHost that answers every command with the fixture folder's files (exit 0)."""
    files = canned(case)
    outputs = {key: (0, files[key], "") for key in ("query", "topo", "lspci") if key in files}
    return FakeHost(dict(ALL_TOOLS) if tools is None else tools, outputs)


# --- normalize_bus_id -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:17:00.0", "0000:17:00.0"),
        ("0000:17:00.0", "0000:17:00.0"),
        ("17:00.0", "0000:17:00.0"),
        ("00000000:CA:00.1", "0000:ca:00.1"),
        (" 0000:0F:00.0 ", "0000:0f:00.0"),
        ("10000:e1:00.0", "10000:e1:00.0"),
    ],
)
def test_normalize_bus_id(raw: str, expected: str) -> None:
    assert gpu_parsers.normalize_bus_id(raw) == expected


@pytest.mark.parametrize("raw", ["", "GPU0", "17:00", "0000:17:00.8", "zz:00.0"])
def test_normalize_bus_id_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        gpu_parsers.normalize_bus_id(raw)


# --- parse_query_gpu --------------------------------------------------------------------------------


def test_query_two_a100_fields_and_units() -> None:
    gpus = gpu_parsers.parse_query_gpu(fixture("a100x2-nvlink", "query-gpu.csv"))
    assert len(gpus) == 2
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": "GPU-89fdc1e1-18b2-f499-c12b-82bcb9bfb3fa",
        "pci_bus_id": "0000:07:00.0",
        "memory_total_mib": 81920,
        "compute_capability": "8.0",
        "driver_version": "535.104.05",
        "pcie_link_gen_current": 4,
        "pcie_link_gen_max": 4,
        "pcie_link_width_current": 16,
        "pcie_link_width_max": 16,
        "persistence_mode": True,
    }
    assert gpus[1]["pci_bus_id"] == "0000:0f:00.0"


def test_query_eight_h100() -> None:
    gpus = gpu_parsers.parse_query_gpu(fixture("h100x8-nvswitch", "query-gpu.csv"))
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert {gpu["name"] for gpu in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {gpu["compute_capability"] for gpu in gpus} == {"9.0"}
    assert {gpu["memory_total_mib"] for gpu in gpus} == {81559}
    assert {gpu["pcie_link_gen_max"] for gpu in gpus} == {5}
    assert len({gpu["uuid"] for gpu in gpus}) == 8


def test_query_rtx3090_detects_x8_links() -> None:
    gpus = gpu_parsers.parse_query_gpu(fixture("rtx3090x4-pcie-x8", "query-gpu.csv"))
    narrowed = [gpu["index"] for gpu in gpus if gpu["pcie_link_width_current"] < gpu["pcie_link_width_max"]]
    assert narrowed == [1, 3]
    assert gpus[1]["pcie_link_width_current"] == 8
    assert gpus[1]["pcie_link_width_max"] == 16
    assert {gpu["compute_capability"] for gpu in gpus} == {"8.6"}
    assert {gpu["persistence_mode"] for gpu in gpus} == {False}
    # Idle GPUs drop to gen 1; the maximum still says gen 4.
    assert {(gpu["pcie_link_gen_current"], gpu["pcie_link_gen_max"]) for gpu in gpus} == {(1, 4)}


def test_query_mixed_models() -> None:
    gpus = gpu_parsers.parse_query_gpu(fixture("mixed-a100-v100", "query-gpu.csv"))
    assert {gpu["name"]: gpu["compute_capability"] for gpu in gpus} == {
        "NVIDIA A100-PCIE-40GB": "8.0",
        "Tesla V100-PCIE-32GB": "7.0",
    }
    assert [gpu["memory_total_mib"] for gpu in gpus] == [40960, 40960, 32768, 32768]
    assert gpus[3]["pci_bus_id"] == "0000:ca:00.0"


def test_query_bracketed_values_become_none() -> None:
    first, second = gpu_parsers.parse_query_gpu(fixture("na-values", "query-gpu.csv"))
    assert first["pcie_link_gen_current"] is None
    assert first["pcie_link_width_max"] is None
    assert first["persistence_mode"] is None
    assert first["memory_total_mib"] == 24512
    assert second["memory_total_mib"] is None
    assert second["pcie_link_gen_current"] is None  # [Not Supported]
    assert second["pcie_link_gen_max"] == 4
    assert second["pcie_link_width_current"] is None  # [Requested functionality has been deprecated]
    assert second["persistence_mode"] is False


def test_query_no_devices_is_empty() -> None:
    assert gpu_parsers.parse_query_gpu(fixture("no-devices", "nvidia-smi.txt")) == []
    assert gpu_parsers.parse_query_gpu("") == []


def test_query_wrong_field_count_names_the_line() -> None:
    with pytest.raises(ValueError, match=r"line 1 .* has 3 fields, expected 12"):
        gpu_parsers.parse_query_gpu("0, NVIDIA A100-SXM4-80GB, GPU-x\n")


def test_query_bad_number_names_the_field() -> None:
    line = fixture("a100x2-nvlink", "query-gpu.csv").splitlines()[0].replace("81920", "80 GiB")
    with pytest.raises(ValueError, match=r"memory.total is '80 GiB'"):
        gpu_parsers.parse_query_gpu(line)


def test_query_bad_bus_id_and_missing_index_are_errors() -> None:
    line = fixture("a100x2-nvlink", "query-gpu.csv").splitlines()[0]
    with pytest.raises(ValueError, match=r"line 1 .*pci.bus_id is 'GPU0', not a PCI address"):
        gpu_parsers.parse_query_gpu(line.replace("00000000:07:00.0", "GPU0"))
    with pytest.raises(ValueError, match=r"index is '\[N/A\]', not a whole number"):
        gpu_parsers.parse_query_gpu("[N/A]" + line[1:])


def test_query_with_a_shorter_field_list() -> None:
    # gpu_count.py's query: the same parser, its own columns; keys and conversions are the module's.
    fields = ("index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version")
    text = "0, NVIDIA H100 80GB HBM3, GPU-1, 00000000:18:00.0, [N/A], 550.54.15\n"
    assert gpu_parsers.parse_query_gpu(text, fields) == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-1",
            "pci_bus_id": "0000:18:00.0",
            "memory_total_mib": None,
            "driver_version": "550.54.15",
        }
    ]
    with pytest.raises(
        ValueError, match=r"has 12 fields, expected 6 \(index,name,uuid,pci.bus_id,memory.total,driver_version\)"
    ):
        gpu_parsers.parse_query_gpu(fixture("a100x2-nvlink", "query-gpu.csv"), fields)


def test_query_unknown_field_keeps_its_text() -> None:
    assert gpu_parsers.parse_query_gpu("0, 1410, [N/A]\n", ("index", "clocks.max.sm", "serial")) == [
        {"index": 0, "clocks_max_sm": "1410", "serial": None}
    ]


# --- parse_compute_apps, parse_samples -----------------------------------------------------------


def test_compute_apps_records() -> None:
    text = (
        "4242, python3, GPU-89fdc1e1-18b2-f499-c12b-82bcb9bfb3fa, 30512\n"
        "4343, /usr/bin/ollama, GPU-fd26179c-de1f-3f6f-f298-383b36269b35, [N/A]\n"
    )
    assert gpu_parsers.parse_compute_apps(text) == [
        {
            "pid": 4242,
            "process_name": "python3",
            "gpu_uuid": "GPU-89fdc1e1-18b2-f499-c12b-82bcb9bfb3fa",
            "used_memory_mib": 30512,
        },
        {
            "pid": 4343,
            "process_name": "/usr/bin/ollama",
            "gpu_uuid": "GPU-fd26179c-de1f-3f6f-f298-383b36269b35",
            "used_memory_mib": None,
        },
    ]


def test_compute_apps_skips_non_rows() -> None:
    text = "pid, process_name, gpu_uuid, used_gpu_memory [MiB]\nNo running processes found\n\n4242, python3\n"
    assert gpu_parsers.parse_compute_apps(text) == []
    assert gpu_parsers.parse_compute_apps("") == []


def test_samples_keep_the_peak_per_gpu_and_skip_bad_lines() -> None:
    text = "0, 10, 100\n1, 5, 50\n0, 95, 70000\n1, [N/A], 60\n0, 40, 2\n1, 7"
    assert gpu_parsers.parse_samples(text) == {
        "0": {"utilization_gpu_peak_pct": 95, "memory_used_peak_mib": 70000, "samples": 3},
        "1": {"utilization_gpu_peak_pct": 5, "memory_used_peak_mib": 50, "samples": 1},
    }
    assert gpu_parsers.parse_samples("") == {}


# --- parse_topo_matrix, nvlink_pairs, nvswitch_in_topology ------------------------------------------


def test_topo_two_a100_nvlink() -> None:
    topology = gpu_parsers.parse_topo_matrix(fixture("a100x2-nvlink", "topo-m.txt"))
    assert topology == {"GPU0": {"GPU0": "X", "GPU1": "NV12"}, "GPU1": {"GPU0": "NV12", "GPU1": "X"}}
    assert gpu_parsers.nvlink_pairs(topology) == [{"gpus": [0, 1], "links": 12}]
    assert gpu_parsers.nvswitch_in_topology(topology) is False


def test_topo_h100_nvswitch_with_nics() -> None:
    topology = gpu_parsers.parse_topo_matrix(fixture("h100x8-nvswitch", "topo-m.txt"))
    assert sorted(topology) == [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(4)]
    assert topology["GPU0"]["NIC0"] == "PIX"
    assert topology["NIC3"]["GPU7"] == "PIX"
    assert "CPU Affinity" not in topology["GPU0"]
    pairs = gpu_parsers.nvlink_pairs(topology)
    assert len(pairs) == 28  # 8 choose 2
    assert {pair["links"] for pair in pairs} == {18}
    assert pairs[0] == {"gpus": [0, 1], "links": 18}
    assert gpu_parsers.nvswitch_in_topology(topology) is True


def test_topo_rtx3090_pcie_only_with_terminal_codes() -> None:
    text = fixture("rtx3090x4-pcie-x8", "topo-m.txt")
    assert "\x1b[4m" in text
    topology = gpu_parsers.parse_topo_matrix(text)
    assert sorted(topology) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topology["GPU0"]["GPU1"] == "NODE"
    assert topology["GPU2"]["GPU3"] == "PHB"
    assert topology["GPU0"]["GPU3"] == "SYS"
    assert gpu_parsers.nvlink_pairs(topology) == []
    assert gpu_parsers.nvswitch_in_topology(topology) is False


def test_topo_mixed_partial_nvlink() -> None:
    topology = gpu_parsers.parse_topo_matrix(fixture("mixed-a100-v100", "topo-m.txt"))
    assert gpu_parsers.nvlink_pairs(topology) == [{"gpus": [0, 1], "links": 12}]
    assert gpu_parsers.nvswitch_in_topology(topology) is False


def test_topo_single_gpu() -> None:
    topology = gpu_parsers.parse_topo_matrix(fixture("a100x2-one-missing", "topo-m.txt"))
    assert topology == {"GPU0": {"GPU0": "X"}}
    assert gpu_parsers.nvlink_pairs(topology) == []


def test_topo_with_spaces_instead_of_tabs() -> None:
    text = (
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
        "GPU0     X      NV12    0-31,64-95      0               N/A\n"
        "GPU1    NV12     X      32-63,96-127    1               N/A\n"
    )
    assert gpu_parsers.nvlink_pairs(gpu_parsers.parse_topo_matrix(text)) == [{"gpus": [0, 1], "links": 12}]


def test_topo_four_gpu_direct_mesh_is_not_nvswitch() -> None:
    # HGX A100 4-GPU (Redstone): NV4 between every pair, 3 x 4 = 12 links per GPU, no switch.
    gpus = [f"GPU{i}" for i in range(4)]
    topology = {a: {b: "X" if a == b else "NV4" for b in gpus} for a in gpus}
    assert len(gpu_parsers.nvlink_pairs(topology)) == 6
    assert gpu_parsers.nvswitch_in_topology(topology) is False


def test_topo_unparsable() -> None:
    assert gpu_parsers.parse_topo_matrix("") == {}
    with pytest.raises(ValueError, match="no header line with GPU0"):
        gpu_parsers.parse_topo_matrix("Failed to initialize NVML: Unknown Error\n")
    with pytest.raises(ValueError, match=r"row GPU1 .* has 1 cells, expected 2"):
        gpu_parsers.parse_topo_matrix("\tGPU0\tGPU1\nGPU0\t X \tNV12\nGPU1\tNV12\n")


# --- parse_lspci ----------------------------------------------------------------------------------


def test_lspci_skips_audio_foreign_vga_and_bridges() -> None:
    gpus = gpu_parsers.parse_lspci(fixture("a100x2-one-missing", "lspci-nn.txt"))
    assert gpus == [
        {
            "pci_bus_id": "0000:07:00.0",
            "description": "NVIDIA Corporation GA100 [A100 SXM4 80GB]",
            "device_id": "10de:20b2",
        },
        {
            "pci_bus_id": "0000:0f:00.0",
            "description": "NVIDIA Corporation GA100 [A100 SXM4 80GB]",
            "device_id": "10de:20b2",
        },
    ]


def test_lspci_vga_class_counts_and_audio_does_not() -> None:
    gpus = gpu_parsers.parse_lspci(fixture("rtx3090x4-pcie-x8", "lspci-nn.txt"))
    assert [gpu["pci_bus_id"] for gpu in gpus] == ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0"]
    assert {gpu["description"] for gpu in gpus} == {"NVIDIA Corporation GA102 [GeForce RTX 3090]"}


def test_lspci_nvswitch_bridges() -> None:
    text = fixture("h100x8-nvswitch", "lspci-D-nn.txt")
    assert len(gpu_parsers.parse_lspci(text)) == 8
    assert gpu_parsers.parse_lspci_nvswitches(text) == ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    assert gpu_parsers.parse_lspci_nvswitches(fixture("a100x2-nvlink", "lspci-D-nn.txt")) == []


# `lspci -D -n -d 10de:` as gpu_count.py runs it: numbers only, NVIDIA functions only.
LSPCI_D_N = (
    "0000:17:00.0 0302: 10de:20b5 (rev a1)\n"
    "0000:65:00.0 0302: 10de:20b5 (rev a1)\n"
    "0000:ca:00.0 0300: 10de:2204 (rev a1) (prog-if 00 [VGA controller])\n"
    "0000:ca:00.1 0403: 10de:1aef (rev a1)\n"
    "0000:05:00.0 0680: 10de:22a3 (rev a1)\n"
)


def test_lspci_numeric_form() -> None:
    gpus = gpu_parsers.parse_lspci(LSPCI_D_N)
    assert gpus == [
        {"pci_bus_id": "0000:17:00.0", "description": None, "device_id": "10de:20b5"},
        {"pci_bus_id": "0000:65:00.0", "description": None, "device_id": "10de:20b5"},
        {"pci_bus_id": "0000:ca:00.0", "description": None, "device_id": "10de:2204"},
    ]
    assert gpu_parsers.parse_lspci_nvswitches(LSPCI_D_N) == ["0000:05:00.0"]


def test_lspci_numeric_form_without_domain_other_vendors_and_upper_case() -> None:
    text = (
        "00:02.0 0300: 8086:3e92 (rev 02)\n"  # Intel iGPU: not NVIDIA
        "3B:00.0 0302: 10DE:20B2 (rev a1)\n"
        "3b:00.1 0403: 10de:1aef (rev a1)\n"
    )
    assert gpu_parsers.parse_lspci(text) == [
        {"pci_bus_id": "0000:3b:00.0", "description": None, "device_id": "10de:20b2"}
    ]


def test_lspci_ignores_verbose_detail_lines() -> None:
    text = (
        "0000:17:00.0 0302: 10de:20b5 (rev a1)\n"
        "\tSubsystem: NVIDIA Corporation Device 1533\n"
        "\tKernel driver in use: nvidia\n"
        "\tKernel modules: nvidiafb, nouveau, nvidia_drm, nvidia\n"
        "\n"
    )
    assert [gpu["pci_bus_id"] for gpu in gpu_parsers.parse_lspci(text)] == ["0000:17:00.0"]
    assert gpu_parsers.parse_lspci("Subsystem: NVIDIA Corporation\n") == []
    assert gpu_parsers.parse_lspci("") == []


def test_bus_id_has_one_form_from_nvidia_smi_lspci_and_lspci_d() -> None:
    """The same GPU read from all three kinds of output has the same bus ID, the lspci -D form."""
    smi = "0, NVIDIA A100 80GB PCIe, GPU-1, 00000000:CA:00.0, 81920, 520.61.05\n"
    fields = ("index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version")
    from_smi = gpu_parsers.parse_query_gpu(smi, fields)[0]["pci_bus_id"]
    from_lspci_nn = gpu_parsers.parse_lspci(
        "ca:00.0 3D controller [0302]: NVIDIA Corporation GA100 [10de:20b5] (rev a1)"
    )
    from_lspci_d_nn = gpu_parsers.parse_lspci(
        "0000:ca:00.0 3D controller [0302]: NVIDIA Corporation GA100 [10de:20b5] (rev a1)"
    )
    from_lspci_d_n = gpu_parsers.parse_lspci("0000:ca:00.0 0302: 10de:20b5 (rev a1)")
    ids = {from_smi} | {gpu["pci_bus_id"] for gpu in from_lspci_nn + from_lspci_d_nn + from_lspci_d_n}
    assert ids == {"0000:ca:00.0"}
    assert len(from_lspci_nn) == len(from_lspci_d_nn) == len(from_lspci_d_n) == 1


def test_proc_driver_version() -> None:
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76  Mon Sep 12 19:21:56 UTC 2022\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  (dvs-builder@x)\n"
    assert gpu_parsers.parse_proc_driver_version(proprietary) == "515.76"
    assert gpu_parsers.parse_proc_driver_version(open_module) == "575.57.08"
    assert gpu_parsers.parse_proc_driver_version("") is None
    assert gpu_parsers.parse_proc_driver_version(None) is None


def test_proc_driver_version_second_line_aarch64_and_no_version() -> None:
    aarch64 = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.54.15  Release Build  (x)\n"
    assert gpu_parsers.parse_proc_driver_version(aarch64) == "550.54.15"
    two_lines = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  520.61.05  Thu Sep 29 05:30:25 UTC 2022\nGCC version:  gcc 12\n"
    assert gpu_parsers.parse_proc_driver_version(two_lines) == "520.61.05"
    assert gpu_parsers.parse_proc_driver_version("GCC version:  gcc version 12.2.0\n") is None
    assert gpu_parsers.parse_proc_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  \n") is None


# --- the module, with a fake runner -----------------------------------------------------------------


def test_gather_h100_nvswitch_host() -> None:
    host = host_for("h100x8-nvswitch")
    facts = facts_module.gather_gpu_facts(host.run, host.find)
    assert facts["source"] == "nvidia-smi"
    assert facts["driver_loaded"] is True
    assert facts["driver_version"] == "550.54.15"
    assert facts["count"] == 8
    assert facts["pci_count"] == 8
    assert facts["pci_nvswitch_count"] == 4
    assert facts["missing_from_nvidia_smi"] == []
    assert facts["nvswitch_present"] is True
    assert len(facts["nvlink_pairs"]) == 28
    assert facts["models"] == ["NVIDIA H100 80GB HBM3"]
    assert facts["errors"] == []
    assert [command[1:] for command in host.commands] == [
        [QUERY_ARG, "--format=csv,noheader,nounits"],
        ["topo", "-m"],
        ["-D", "-nn"],
    ]


def test_gather_nvswitch_from_lspci_alone() -> None:
    host = host_for("h100x8-nvswitch")
    host.outputs["topo"] = (3, "", "topology is not supported in this VM")
    facts = facts_module.gather_gpu_facts(host.run, host.find)
    assert facts["topology"] == {}
    assert facts["nvswitch_present"] is True
    assert facts["errors"] == [
        "/usr/bin/nvidia-smi topo -m exited 3: topology is not supported in this VM. NVLink pairs and NVSwitch are unknown."
    ]


def test_gather_gpu_missing_from_nvidia_smi() -> None:
    host = host_for("a100x2-one-missing")
    facts = facts_module.gather_gpu_facts(host.run, host.find)
    assert facts["source"] == "nvidia-smi"
    assert facts["count"] == 1
    assert facts["pci_count"] == 2
    assert facts["missing_from_nvidia_smi"] == ["0000:0f:00.0"]
    assert facts["nvswitch_present"] is False


def test_gather_no_driver_falls_back_to_lspci() -> None:
    """The real 535.261.03 answer to the module's own query where no kernel module is loaded (exit 9)."""
    answer = real_answer("query-gpu.txt")
    assert answer[0] == DRIVER_NOT_LOADED
    host = FakeHost(dict(ALL_TOOLS), {"query": answer, "lspci": (0, canned("no-driver")["lspci"], "")})
    facts = facts_module.gather_gpu_facts(host.run, host.find)
    assert facts["source"] == "lspci"
    assert facts["driver_loaded"] is False
    assert facts["module_not_loaded"] is True
    assert facts["driver_version"] is None
    assert facts["count"] == 0
    assert facts["gpus"] == []
    assert facts["pci_count"] == 2
    assert facts["models"] == ["NVIDIA Corporation GA102 [GeForce RTX 3090]"]
    assert facts["missing_from_nvidia_smi"] == []
    assert facts["topology"] == {}
    (error,) = facts["errors"]
    assert error == (
        "/usr/bin/nvidia-smi --query-gpu exited 9: NVIDIA-SMI has failed because it couldn't communicate with the "
        "NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running. "
        "NVIDIA kernel module not loaded: on a host, load the NVIDIA kernel module (`modprobe nvidia`, see "
        "`dmesg | grep -i nvrm`) or reboot after a driver install or upgrade, and check that nouveau is blacklisted "
        "and Secure Boot accepts the module; in a container the module belongs to the host's kernel, so load it on "
        "the host and pass the GPUs into the container (NVIDIA Container Toolkit: CDI `--device nvidia.com/gpu=all`, "
        "or the `/dev/nvidia*` device files)."
    )
    # topo -m is not tried once the query failed.
    assert [command[1] for command in host.commands] == [QUERY_ARG, "-D"]


@pytest.mark.parametrize("container", [False, True])
def test_exit_9_names_the_module_with_the_shared_fix(container: bool) -> None:
    """The words and the fix are gpu_parsers', the same as the verification's and the health check's; in a
    container the container's steps come first."""
    host = FakeHost(dict(ALL_TOOLS), {"query": real_answer("query-gpu.txt"), "lspci": (0, "", "")})
    (error, *_) = facts_module.gather_gpu_facts(host.run, host.find, container=container)["errors"]
    fix = gpu_parsers.module_not_loaded_fix(container)
    assert error.endswith(f". NVIDIA kernel module not loaded: {fix[:1].lower()}{fix[1:]}")
    host_step, container_step = error.index("`modprobe nvidia`"), error.index("`--device nvidia.com/gpu=all`")
    assert (container_step < host_step) is container
    assert facts_module.NVIDIA_SMI_HINTS[9] == facts_module.module_not_loaded_hint(False)


@pytest.mark.parametrize(("container", "first"), [(False, "on a host, load"), (True, "in a container the NVIDIA")])
def test_main_looks_whether_it_runs_in_a_container(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], container: bool, first: str
) -> None:
    host = FakeHost(dict(ALL_TOOLS), {"query": real_answer("query-gpu.txt"), "lspci": (0, "", "")})
    monkeypatch.setattr(facts_module, "in_container", lambda: container)
    facts = run_main(monkeypatch, capsys, {}, host)["ansible_facts"]["gpu_facts"]
    assert f"NVIDIA kernel module not loaded: {first}" in facts["errors"][0]


def test_gather_no_devices_means_driver_loaded() -> None:
    files = canned("no-devices")
    host = FakeHost(
        dict(ALL_TOOLS),
        {"query": (NO_DEVICES, files["smi-error"], ""), "lspci": (0, "", "")},
    )
    facts = facts_module.gather_gpu_facts(host.run, host.find)
    assert facts["driver_loaded"] is True
    assert facts["source"] == "lspci"
    assert facts["pci_count"] == 0
    assert facts["errors"][0].startswith("/usr/bin/nvidia-smi --query-gpu exited 6: No devices were found.")


def test_gather_nvidia_smi_missing_lspci_present() -> None:
    host = host_for("no-driver", tools={"nvidia-smi": None, "lspci": "/usr/sbin/lspci"})
    facts = facts_module.gather_gpu_facts(host.run, host.find)
    assert facts["source"] == "lspci"
    assert facts["pci_count"] == 2
    assert facts["errors"] == [
        "nvidia-smi is not installed (not on PATH): it comes with the NVIDIA driver, so install the driver, or set "
        "nvidia_smi_path to where it is."
    ]
    assert facts["nvidia_smi_problem"] == "nvidia-smi is not installed (not on PATH)"
    assert host.commands == [["/usr/sbin/lspci", "-D", "-nn"]]


def test_gather_nothing_available() -> None:
    host = FakeHost({}, {})
    facts = facts_module.gather_gpu_facts(host.run, host.find, proc_driver_version=None)
    assert facts == {
        "source": "none",
        "driver_loaded": False,
        "module_not_loaded": False,
        "driver_version": None,
        "count": 0,
        "gpus": [],
        "models": [],
        "pci_gpus": [],
        "pci_count": None,
        "pci_nvswitch_count": None,
        "pci_source": "none",
        "missing_from_nvidia_smi": [],
        "topology": {},
        "nvlink_pairs": [],
        "nvswitch_present": False,
        "nvidia_smi_problem": "nvidia-smi is not installed (not on PATH)",
        "pci_devices_problem": None,
        "lspci_path": None,
        "errors": [
            "nvidia-smi is not installed (not on PATH): it comes with the NVIDIA driver, so install the driver, or set "
            "nvidia_smi_path to where it is.",
            "lspci is not installed (not on PATH): install pciutils to list GPUs without the driver, or set lspci_path "
            "to where it is.",
        ],
    }
    assert host.commands == []


def test_gather_driver_version_from_proc_when_smi_fails() -> None:
    host = FakeHost({"nvidia-smi": "/usr/bin/nvidia-smi"}, {"query": (15, "Unable to determine the device handle", "")})
    proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Thu Aug 10 2023\n"
    facts = facts_module.gather_gpu_facts(host.run, host.find, proc_driver_version=proc)
    assert facts["driver_loaded"] is True
    assert facts["driver_version"] == "535.104.05"
    assert "fallen off the bus" in facts["errors"][0]


def test_gather_unparsable_output_raises_with_command() -> None:
    host = host_for("a100x2-nvlink")
    host.outputs["query"] = (0, "this is not csv, at all\n", "")
    with pytest.raises(facts_module.OutputFormatError, match=r"could not read the output of `/usr/bin/nvidia-smi"):
        facts_module.gather_gpu_facts(host.run, host.find)


# --- main(): argument handling, the real runner wrapper, exit_json ---------------------------------


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: dict[str, Any], host: FakeHost):
    """Run main() with run_command/get_bin_path patched; return the JSON the module printed."""

    def fake_run_command(self: Any, argv: list[str], **kwargs: Any) -> tuple[int, str, str]:
        assert kwargs.get("environ_update") == {"LC_ALL": "C"}
        if argv[0] == "timeout":
            assert argv[1:4] == ["-k", "5", str(args.get("timeout", 30))]
            argv = argv[4:]
        return host.run(argv)

    monkeypatch.setattr(facts_module.AnsibleModule, "run_command", fake_run_command)
    monkeypatch.setattr(facts_module.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: host.find(name))
    monkeypatch.setattr(facts_module, "PROC_DRIVER_VERSION", "/nonexistent/proc/driver/nvidia/version")
    # This machine's own /sys has no NVIDIA GPU: tests that give no folder read none.
    args = {"pci_devices_path": "/nonexistent/sys/bus/pci/devices", **args}
    with patch_module_args(args), pytest.raises(SystemExit):
        facts_module.main()
    return json.loads(capsys.readouterr().out)


def test_main_reports_facts_and_never_changes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host = host_for("rtx3090x4-pcie-x8", tools={**ALL_TOOLS, "timeout": "timeout"})
    result = run_main(monkeypatch, capsys, {"timeout": 10, "_ansible_check_mode": True}, host)
    assert result["changed"] is False
    assert "failed" not in result
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["count"] == 4
    assert [gpu["pcie_link_width_current"] for gpu in facts["gpus"]] == [16, 8, 16, 8]
    assert facts["missing_from_nvidia_smi"] == []


def test_main_timeout_is_reported(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    host = host_for("no-driver", tools={**ALL_TOOLS, "timeout": "timeout"})
    host.outputs["query"] = (124, "", "")
    facts = run_main(monkeypatch, capsys, {}, host)["ansible_facts"]["gpu_facts"]
    assert facts["source"] == "lspci"
    assert facts["errors"][0].startswith("/usr/bin/nvidia-smi --query-gpu exited 124: timed out after 30 s")


def test_main_fails_clearly_on_unparsable_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host = host_for("a100x2-nvlink")
    host.outputs["topo"] = (0, "something new\n", "")
    result = run_main(monkeypatch, capsys, {}, host)
    assert result["failed"] is True
    assert "could not read the output of `/usr/bin/nvidia-smi topo -m`" in result["msg"]
    assert result["output"] == "something new\n"


def test_main_rejects_zero_timeout(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(monkeypatch, capsys, {"timeout": 0}, FakeHost({}, {}))
    assert result["failed"] is True
    assert result["msg"] == "timeout must be at least 1 second, got 0."


# --- the PCI bus from sysfs -------------------------------------------------------------------------

A100_3D = ("0x10de", "0x20b2", "0x030200")
SYSFS_MIXED = {
    "0000:00:00.0": ("0x8086", "0x09a2", "0x060000"),  # Intel host bridge
    "0000:07:00.0": A100_3D,
    "0000:0f:00.0": A100_3D,
    "0000:0f:00.1": ("0x10de", "0x1aef", "0x040300"),  # NVIDIA audio function
    "0000:65:00.0": ("0x10de", "0x2204", "0x030000"),  # GeForce (VGA)
    "0000:c5:00.0": ("0x10de", "0x22a3", "0x068000"),  # NVSwitch bridge
}


def sysfs_files(devices: dict[str, tuple[str, str, str]]) -> dict[str, dict[str, str]]:
    """What read_pci_devices returns for these (vendor, device, class) triples."""
    return {bus: dict(zip(("vendor", "device", "class"), (f"{v}\n" for v in ids))) for bus, ids in devices.items()}


def sysfs_tree(root: Path, devices: dict[str, tuple[str, str, str]]) -> Path:
    """A folder in the /sys/bus/pci/devices layout."""
    for bus, files in sysfs_files(devices).items():
        (root / bus).mkdir(parents=True)
        for name, text in files.items():
            (root / bus / name).write_text(text, encoding="ascii")
    return root


def test_sysfs_keeps_nvidia_display_and_3d_functions_only() -> None:
    assert gpu_parsers.parse_sysfs_pci(sysfs_files(SYSFS_MIXED)) == [
        {"pci_bus_id": "0000:07:00.0", "description": None, "device_id": "10de:20b2"},
        {"pci_bus_id": "0000:0f:00.0", "description": None, "device_id": "10de:20b2"},
        {"pci_bus_id": "0000:65:00.0", "description": None, "device_id": "10de:2204"},
    ]
    assert gpu_parsers.parse_sysfs_pci_nvswitches(sysfs_files(SYSFS_MIXED)) == ["0000:c5:00.0"]


def test_sysfs_agrees_with_lspci_on_the_same_bus() -> None:
    lspci = "0000:07:00.0 0302: 10de:20b2 (rev a1)\n0000:0f:00.0 0302: 10de:20b2 (rev a1)\n"
    assert gpu_parsers.parse_sysfs_pci(sysfs_files({"0000:07:00.0": A100_3D, "0000:0F:00.0": A100_3D})) == (
        gpu_parsers.parse_lspci(lspci)
    )


def test_sysfs_skips_folders_that_are_no_bus_id_and_rejects_garbage() -> None:
    files = sysfs_files({"0000:07:00.0": A100_3D})
    files["not-a-device"] = {"vendor": "", "device": "", "class": ""}
    assert [gpu["pci_bus_id"] for gpu in gpu_parsers.parse_sysfs_pci(files)] == ["0000:07:00.0"]
    files["0000:0f:00.0"] = {"vendor": "0x10de\n", "device": "0x20b2\n", "class": ""}
    with pytest.raises(ValueError, match=r"0000:0f:00.0/class is '', not a 6-digit hexadecimal number"):
        gpu_parsers.parse_sysfs_pci(files)


def test_read_pci_devices_reads_the_sysfs_layout(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path / "devices", {"0000:07:00.0": A100_3D})
    (root / "0000:07:00.0" / "device").unlink()
    devices, why = facts_module.read_pci_devices(str(root))
    assert why == ""
    assert devices == {"0000:07:00.0": {"vendor": "0x10de\n", "device": "", "class": "0x030200\n"}}
    missing, why = facts_module.read_pci_devices(str(tmp_path / "nowhere"))
    assert missing is None
    assert why == f"{tmp_path / 'nowhere'} does not exist"


def test_read_pci_devices_names_the_folder_and_why_it_gives_nothing(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    assert facts_module.read_pci_devices(str(tmp_path / "a-file")) == (None, f"{tmp_path}/a-file is not a folder")
    assert facts_module.read_pci_devices(str(tmp_path / "empty")) == (None, f"{tmp_path}/empty is empty")


def test_gather_a_missing_pci_folder_and_no_lspci_says_both_and_does_not_claim_lspci_listed_them() -> None:
    host = host_for("a100x2-nvlink", tools={"nvidia-smi": "/usr/bin/nvidia-smi", "lspci": None})
    facts = facts_module.gather_gpu_facts(
        host.run, host.find, sysfs=(None, "/srv/pci does not exist"), searched="PATH (/usr/bin:/bin)"
    )
    assert facts["pci_source"] == "none"
    assert facts["pci_devices_problem"] == "/srv/pci does not exist"
    assert facts["lspci_path"] is None
    assert facts["errors"] == [
        "/srv/pci does not exist: nor could lspci list them. Point pci_devices_path at /sys/bus/pci/devices (the "
        "default) or a folder of the same layout (<bus id>/vendor, device, class).",
        "lspci is not installed (not on PATH (/usr/bin:/bin)): install pciutils to list GPUs without the driver, or "
        "set lspci_path to where it is.",
    ]


def test_gather_a_failed_nvidia_smi_is_named_with_what_it_said_and_no_lspci_hint_without_lspci() -> None:
    host = FakeHost({"nvidia-smi": "/usr/bin/nvidia-smi"}, {"query": (6, "No devices were found", "")})
    facts = facts_module.gather_gpu_facts(host.run, host.find)
    assert facts["nvidia_smi_problem"] == "/usr/bin/nvidia-smi --query-gpu exited 6: No devices were found"
    assert "`lspci -nn -d 10de:` (install pciutils first: this host has no lspci) and" in facts["errors"][0]
    host = FakeHost(
        {"nvidia-smi": "/usr/bin/nvidia-smi", "lspci": "/usr/bin/lspci"}, {"query": (6, "", ""), "lspci": (0, "", "")}
    )
    said = facts_module.gather_gpu_facts(host.run, host.find)["errors"][0]
    assert "compare with `lspci -nn -d 10de:` and look for NVRM errors" in said


def test_not_found_says_where_it_looked() -> None:
    assert facts_module.not_found("nvidia-smi", "PATH (/usr/bin) nor in /sbin") == (
        "nvidia-smi is not installed (not on PATH (/usr/bin) nor in /sbin)"
    )
    assert (
        facts_module.not_found("/opt/nv/nvidia-smi") == "/opt/nv/nvidia-smi does not exist or is not an executable file"
    )


def test_gather_before_any_driver_reads_sysfs_not_lspci() -> None:
    host = host_for("no-driver", tools={"nvidia-smi": None, "lspci": "/usr/bin/lspci"})
    facts = facts_module.gather_gpu_facts(host.run, host.find, sysfs=(sysfs_files(SYSFS_MIXED), ""))
    assert facts["source"] == facts["pci_source"] == "sysfs"
    assert facts["pci_count"] == 3
    assert facts["pci_nvswitch_count"] == 1
    assert facts["nvswitch_present"] is True
    assert facts["models"] == ["10de:20b2", "10de:2204"]
    assert host.commands == []


def test_gather_with_driver_compares_nvidia_smi_with_sysfs() -> None:
    host = host_for("a100x2-one-missing")
    sysfs = (sysfs_files({"0000:07:00.0": A100_3D, "0000:0f:00.0": A100_3D}), "")
    facts = facts_module.gather_gpu_facts(host.run, host.find, sysfs=sysfs)
    assert facts["source"] == "nvidia-smi"
    assert facts["pci_source"] == "sysfs"
    assert (facts["count"], facts["pci_count"]) == (1, 2)
    assert facts["missing_from_nvidia_smi"] == ["0000:0f:00.0"]
    assert [command[1] for command in host.commands] == [QUERY_ARG, "topo"]


def test_gather_unreadable_sysfs_falls_back_to_lspci_and_says_why() -> None:
    host = host_for("no-driver", tools={"nvidia-smi": None, "lspci": "/usr/bin/lspci"})
    facts = facts_module.gather_gpu_facts(
        host.run, host.find, sysfs=(None, "/sys/bus/pci/devices cannot be read (Permission denied)")
    )
    assert facts["source"] == facts["pci_source"] == "lspci"
    assert facts["pci_count"] == 2
    assert facts["pci_devices_problem"] == "/sys/bus/pci/devices cannot be read (Permission denied)"
    assert facts["errors"][1] == (
        "/sys/bus/pci/devices cannot be read (Permission denied): the GPUs were listed with lspci instead. Point "
        "pci_devices_path at /sys/bus/pci/devices (the default) or a folder of the same layout (<bus id>/vendor, "
        "device, class)."
    )
    garbage = {"0000:07:00.0": {"vendor": "banana", "device": "", "class": ""}}
    facts = facts_module.gather_gpu_facts(host.run, host.find, sysfs=(garbage, ""))
    assert facts["pci_source"] == "lspci"
    named = facts_module.gather_gpu_facts(host.run, host.find, sysfs=(garbage, ""), pci_devices_path="/srv/pci")
    assert named["pci_devices_problem"].startswith("/srv/pci is not sysfs-like (0000:07:00.0/vendor is 'banana'")
    assert facts["errors"][1] == (
        "The PCI device folder is not sysfs-like (0000:07:00.0/vendor is 'banana', not a 4-digit hexadecimal "
        "number): the GPUs were listed with lspci instead. Point pci_devices_path at /sys/bus/pci/devices (the "
        "default) or a folder of the same layout (<bus id>/vendor, device, class)."
    )


def test_main_reads_pci_devices_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sysfs_tree(tmp_path / "devices", SYSFS_MIXED)
    host = FakeHost({"lspci": "/usr/bin/lspci"}, {})
    facts = run_main(monkeypatch, capsys, {"pci_devices_path": str(root)}, host)["ansible_facts"]["gpu_facts"]
    assert facts["source"] == "sysfs"
    assert [gpu["pci_bus_id"] for gpu in facts["pci_gpus"]] == ["0000:07:00.0", "0000:0f:00.0", "0000:65:00.0"]
    assert host.commands == []


@pytest.mark.parametrize("description", sorted((ROOT / "tests" / "fixtures" / "nvidia" / "gpus").glob("*.json")))
def test_sandbox_pci_fixture_matches_the_standin_nvidia_smi(tmp_path: Path, description: Path) -> None:
    """The sandbox image's PCI folder (pci_sysfs.py) lists each GPU at the bus ID the stand-in nvidia-smi prints."""
    script = ROOT / "tests" / "fixtures" / "nvidia" / "pci_sysfs.py"
    subprocess.run(
        [sys.executable, str(script), "--gpus", str(description), "--out", str(tmp_path / "devices")], check=True
    )
    devices, why = facts_module.read_pci_devices(str(tmp_path / "devices"))
    assert why == ""
    gpus = json.loads(description.read_text(encoding="utf-8"))["gpus"]
    expected = sorted(gpu_parsers.normalize_bus_id(gpu["pci_bus_id"]) for gpu in gpus)
    assert [gpu["pci_bus_id"] for gpu in gpu_parsers.parse_sysfs_pci(devices)] == expected


def test_main_names_the_pci_folder_it_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Preflight's gpu_count cause names this folder: a mistyped path must not read as missing GPUs.
    root = sysfs_tree(tmp_path / "devices", {"0000:07:00.0": A100_3D})
    host = host_for("no-driver", tools={"nvidia-smi": None, "lspci": "/usr/bin/lspci"})
    facts = run_main(monkeypatch, capsys, {"pci_devices_path": str(root)}, host)["ansible_facts"]["gpu_facts"]
    assert (facts["pci_source"], facts["pci_devices_path"], facts["pci_count"]) == ("sysfs", str(root), 1)
    unread = run_main(
        monkeypatch, capsys, {}, host_for("no-driver", tools={"nvidia-smi": None, "lspci": "/usr/bin/lspci"})
    )
    assert unread["ansible_facts"]["gpu_facts"]["pci_source"] == "lspci"
    assert unread["ansible_facts"]["gpu_facts"]["pci_devices_path"] == ""
