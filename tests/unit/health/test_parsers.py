"""The health check's parsers in gpu_parsers.py, on the canned output of fixtures/ (see its README)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import gpu_parsers
import pytest
from gpu_parsers import (
    HEALTH_FIELDS,
    HEALTH_FIELDS_THROTTLE_NAMES,
    DcgmiDiagRuntimeError,
    parse_dcgmi_diag,
    parse_health_query,
    parse_nvlink_status,
    parse_xid_events,
)

H100_GPU0 = {
    "index": 0,
    "pci_bus_id": "0000:18:00.0",
    "uuid": "GPU-0c3e8a1f-52d0-4b7e-9a61-0f4d2b8e7c00",
    "name": "NVIDIA H100 80GB HBM3",
    "driver_version": "550.54.15",
    "persistence_mode": True,
    "pcie_link_gen_current": 5,
    "pcie_link_gen_max": 5,
    "pcie_link_width_current": 16,
    "pcie_link_width_max": 16,
    "ecc_errors_uncorrected_volatile_total": 0,
    "ecc_errors_uncorrected_aggregate_total": 0,
    "retired_pages_pending": None,
    "remapped_rows_pending": False,
    "remapped_rows_failure": False,
    "clocks_event_reasons_hw_slowdown": False,
    "clocks_event_reasons_hw_thermal_slowdown": False,
    "clocks_event_reasons_sw_thermal_slowdown": False,
    "clocks_event_reasons_hw_power_brake_slowdown": False,
}


def test_health_fields_are_the_names_of_current_drivers() -> None:
    assert HEALTH_FIELDS[:2] == ("index", "pci.bus_id")
    assert len(set(HEALTH_FIELDS)) == len(HEALTH_FIELDS) == 19
    clocks = [field for field in HEALTH_FIELDS if field.startswith("clocks")]
    assert clocks == [
        "clocks_event_reasons.hw_slowdown",
        "clocks_event_reasons.hw_thermal_slowdown",
        "clocks_event_reasons.sw_thermal_slowdown",
        "clocks_event_reasons.hw_power_brake_slowdown",
    ]
    old = [field for field in HEALTH_FIELDS_THROTTLE_NAMES if field.startswith("clocks")]
    assert old == [field.replace("event", "throttle") for field in clocks]
    assert [f for f in HEALTH_FIELDS_THROTTLE_NAMES if not f.startswith("clocks")] == [
        f for f in HEALTH_FIELDS if not f.startswith("clocks")
    ]


def test_parse_healthy_h100x8(read_fixture: Callable[[str], str]) -> None:
    gpus = parse_health_query(read_fixture("query-h100x8-healthy.csv"))
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert gpus[0] == H100_GPU0
    assert gpus[7]["pci_bus_id"] == "0000:db:00.0"


def test_parse_faults_gives_typed_values(read_fixture: Callable[[str], str]) -> None:
    gpus = parse_health_query(read_fixture("query-h100x8-faults.csv"))
    assert len(gpus) == 7
    assert gpus[1]["pcie_link_width_current"] == 8
    assert (gpus[2]["ecc_errors_uncorrected_volatile_total"], gpus[2]["remapped_rows_pending"]) == (2, True)
    assert (gpus[3]["remapped_rows_failure"], gpus[3]["ecc_errors_uncorrected_aggregate_total"]) == (True, 14)
    assert gpus[4]["clocks_event_reasons_hw_thermal_slowdown"] is True
    assert gpus[4]["clocks_event_reasons_sw_thermal_slowdown"] is False
    assert gpus[5]["persistence_mode"] is False


def test_parse_geforce_placeholders_are_none(read_fixture: Callable[[str], str]) -> None:
    (gpu,) = parse_health_query(read_fixture("query-rtx2080super.csv"))
    assert gpu["pci_bus_id"] == "0000:0c:00.0"
    assert (gpu["pcie_link_gen_current"], gpu["pcie_link_gen_max"]) == (1, 3)
    for key in (
        "ecc_errors_uncorrected_volatile_total",
        "ecc_errors_uncorrected_aggregate_total",
        "retired_pages_pending",
        "remapped_rows_pending",
        "remapped_rows_failure",
    ):
        assert gpu[key] is None, key
    (l40s,) = parse_health_query(read_fixture("query-l40s.csv"))
    assert (l40s["persistence_mode"], l40s["ecc_errors_uncorrected_volatile_total"], l40s["driver_version"]) == (
        False,
        0,
        "595.80",
    )


def test_every_state_word_and_placeholder() -> None:
    row = "0, 0000:17:00.0, GPU-x, A100, 535.129.03, Disabled, [Not Supported], 4, N/A, 16, [N/A], 3, Pending, Yes, No, Active, Not Active, [Not Supported], Active"
    (gpu,) = parse_health_query(row)
    assert gpu["pcie_link_gen_current"] is None and gpu["pcie_link_width_current"] is None
    assert gpu["ecc_errors_uncorrected_volatile_total"] is None
    assert gpu["ecc_errors_uncorrected_aggregate_total"] == 3
    assert (gpu["retired_pages_pending"], gpu["remapped_rows_pending"], gpu["remapped_rows_failure"]) == (
        True,
        True,
        False,
    )
    assert gpu["clocks_event_reasons_sw_thermal_slowdown"] is None
    assert gpu["clocks_event_reasons_hw_power_brake_slowdown"] is True


def test_old_clock_names_give_the_same_keys(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture("query-h100x8-healthy.csv")
    assert parse_health_query(text, HEALTH_FIELDS_THROTTLE_NAMES) == parse_health_query(text)


def test_no_devices_and_empty_output() -> None:
    assert parse_health_query("No devices were found\n") == []
    assert parse_health_query("") == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0, 0000:17:00.0, GPU-x", "has 3 fields, expected 19"),
        (
            "0, 0000:17:00.0, GPU-x, A100, 535.129.03, Maybe, 4, 4, 16, 16, 0, 0, No, No, No, Not Active, Not Active, Not Active, Not Active",
            "persistence_mode is 'Maybe'",
        ),
        (
            "0, 0000:17:00.0, GPU-x, A100, 535.129.03, Enabled, 4, 4, x16, 16, 0, 0, No, No, No, Not Active, Not Active, Not Active, Not Active",
            "pcie.link.width.current is 'x16', not a whole number",
        ),
    ],
)
def test_impossible_values_are_errors(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_health_query(line)


def test_parse_nvlink_h100x8(read_fixture: Callable[[str], str]) -> None:
    status = parse_nvlink_status(read_fixture("nvlink-s-h100x8.txt"))
    assert sorted(status) == list(range(8))
    assert status[0]["uuid"] == "GPU-0c3e8a1f-52d0-4b7e-9a61-0f4d2b8e7c00"
    assert status[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert status[0]["links"] == {link: 26.562 for link in range(18)}
    assert status[0]["note"] is None
    down = parse_nvlink_status(read_fixture("nvlink-s-h100x8-link-down.txt"))
    assert down[3]["links"][7] is None and sum(1 for speed in down[3]["links"].values() if speed) == 17


def test_parse_nvlink_inactive_links(read_fixture: Callable[[str], str]) -> None:
    status = parse_nvlink_status(read_fixture("nvlink-s-v100x4-inactive.txt"))
    assert status[0]["links"] == {link: 25.781 for link in range(6)}
    assert status[3]["links"] == {0: 25.781, 1: 25.781, 2: 25.781, 3: None, 4: 25.781, 5: None}


@pytest.mark.parametrize(
    ("name", "note"),
    [
        ("nvlink-s-rtx2080super.txt", "NVML: Unable to retrieve Nvlink information as all links are inActive"),
        ("nvlink-s-l40s.txt", "Device does not have or support Nvlink"),
        ("nvlink-s-h100-mig.txt", "Nvlink queries are not supported for Devices in MIG mode"),
    ],
)
def test_parse_nvlink_gpu_without_link_lines(read_fixture: Callable[[str], str], name: str, note: str) -> None:
    status = parse_nvlink_status(read_fixture(name))
    assert status == {
        0: {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "name": status[0]["name"], "links": {}, "note": note}
    }


def test_parse_nvlink_header_only_and_empty() -> None:
    text = "GPU 0: NVIDIA A100-PCIE-40GB (UUID: GPU-a)\nGPU 1: NVIDIA A100-PCIE-40GB (UUID: GPU-b)\n"
    assert parse_nvlink_status(text) == {
        0: {"uuid": "GPU-a", "name": "NVIDIA A100-PCIE-40GB", "links": {}, "note": None},
        1: {"uuid": "GPU-b", "name": "NVIDIA A100-PCIE-40GB", "links": {}, "note": None},
    }
    assert parse_nvlink_status("") == {}


def test_parse_nvlink_unknown_link_form_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown form"):
        parse_nvlink_status("GPU 0: X (UUID: GPU-a)\n\t Link 0: 26.562 Gbps\n")


def test_parse_xid_events_from_dmesg(read_fixture: Callable[[str], str]) -> None:
    events = parse_xid_events(read_fixture("kernel-dmesg.txt"))
    assert [(event["xid"], event["bus_id"]) for event in events] == [
        (13, "0000:3a:00.0"),
        (13, "0000:3a:00.0"),
        (48, "0000:3a:00.0"),
        (63, "0000:3a:00.0"),
        (79, "0000:db:00.0"),
    ]
    assert events[0]["pid"] is None and events[0]["process"] is None
    assert events[0]["message"].startswith("Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)")
    assert events[2] == {
        "bus_id": "0000:3a:00.0",
        "xid": 48,
        "pid": None,
        "process": None,
        "message": "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "uptime_seconds": 9188.204377,
    }
    assert events[4] == {
        "bus_id": "0000:db:00.0",
        "xid": 79,
        "pid": 1234,
        "process": "python3",
        "message": "GPU has fallen off the bus.",
        "uptime_seconds": 12345.678901,
    }


def test_parse_xid_events_from_journalctl(read_fixture: Callable[[str], str]) -> None:
    monotonic = parse_xid_events(read_fixture("kernel-journal-short-monotonic.txt"))
    assert [(e["xid"], e["pid"], e["process"], e["uptime_seconds"]) for e in monotonic] == [
        (119, 48213, "python3", 8812.301786),
        (154, None, None, 8812.301901),
    ]
    assert monotonic[1]["message"] == "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    (short,) = parse_xid_events(read_fixture("kernel-journal-short.txt"))
    assert short == {
        "bus_id": "0000:2b:00.0",
        "xid": 79,
        "pid": None,
        "process": None,
        "message": "GPU has fallen off the bus.",
        "uptime_seconds": None,
    }


def test_parse_xid_events_oldest_form_and_other_lines() -> None:
    text = (
        "[ 269.517039] NVRM: Xid (0000:03:00): 14, Channel 00000001\n"
        "[ 269.600000] NVRM: GPU at PCI:0000:03:00: GPU-0b11d014\n"
        "[ 270.000000] nvidia-nvswitch3: SXid (PCI:0000:4e:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error\n"
    )
    assert parse_xid_events(text) == [
        {
            "bus_id": "0000:03:00.0",
            "xid": 14,
            "pid": None,
            "process": None,
            "message": "Channel 00000001",
            "uptime_seconds": 269.517039,
        }
    ]


def test_xid_bus_ids_match_nvidia_smi_bus_ids(read_fixture: Callable[[str], str]) -> None:
    """The Xid line names dddd:bb:dd, nvidia-smi 00000000:BB:DD.F: both normalise to one form."""
    seen = {gpu["pci_bus_id"] for gpu in parse_health_query(read_fixture("query-h100x8-healthy.csv"))}
    assert {event["bus_id"] for event in parse_xid_events(read_fixture("kernel-dmesg.txt"))} <= seen
    assert gpu_parsers.normalize_bus_id("00000000:DB:00.0") == "0000:db:00.0"


# --- dcgmi diag -r <level> -j (gpu_parsers.parse_dcgmi_diag) -----------------------------------------


def results_of(entries: list[dict[str, Any]], result: str) -> list[tuple[str, int | None]]:
    return [(entry["test"], entry["gpu"]) for entry in entries if entry["result"] == result]


def test_parse_dcgmi_diag_dcgm4_passing_level_2(read_fixture: Callable[[str], str]) -> None:
    entries = parse_dcgmi_diag(read_fixture("dcgmi-diag-r2-dcgm4-h100x8-pass.json"))
    assert [(entry["category"], entry["test"]) for entry in entries[::9]] == [
        ("Deployment", "software"),
        ("Integration", "pcie"),
        ("Hardware", "memory"),
    ]
    assert [entry["gpu"] for entry in entries[:9]] == [*range(8), None]  # 8 GPUs, then the test's summary
    assert {entry["result"] for entry in entries} == {"Pass"}
    assert all(entry["info"] == [] and entry["warnings"] == [] for entry in entries)
    assert set(entries[0]) == {"category", "test", "result", "gpu", "info", "warnings"}


def test_parse_dcgmi_diag_dcgm4_failures_name_gpu_and_message(read_fixture: Callable[[str], str]) -> None:
    entries = parse_dcgmi_diag(read_fixture("dcgmi-diag-r2-dcgm4-h100x8-faults.json"))
    assert results_of(entries, "Fail") == [("pcie", 2), ("pcie", None), ("memory", 3), ("memory", None)]
    assert results_of(entries, "Skip") == [("memory", 5)]
    pcie = next(entry for entry in entries if entry["test"] == "pcie" and entry["gpu"] == 2)
    assert pcie["warnings"] == [
        "Detected more than 8 PCIe replays per minute for GPU 2 : 12 Reconnect PCIe card. Run system side PCIE "
        "diagnostic utilities to verify hops off the GPU board. If issue is on the board, run the field diagnostic."
    ]
    summary = entries[-1]
    assert summary["test"] == "memory" and summary["gpu"] is None
    assert summary["info"][1].startswith("Only 1024 mb of memory is free")


def test_parse_dcgmi_diag_dcgm3_3_deployment_and_per_gpu_forms(read_fixture: Callable[[str], str]) -> None:
    entries = parse_dcgmi_diag(read_fixture("dcgmi-diag-r3-dcgm3.3-a100x2.json"))
    assert [entry["test"] for entry in entries[:9]][4] == "Persistence Mode"
    assert results_of(entries, "Fail") == [("Persistence Mode", 1), ("Diagnostic", 1)]
    persistence, diagnostic = (entry for entry in entries if entry["result"] == "Fail")
    assert persistence["category"] == "Deployment" and persistence["warnings"][0].startswith(
        "Persistence mode for GPU 1 is disabled."
    )
    assert diagnostic["warnings"] == ["Found 4 faulty memory elements on GPU 1 Run a field diagnostic on the GPU."]
    skipped = next(entry for entry in entries if entry["result"] == "Skip")
    assert (skipped["test"], skipped["gpu"]) == ("GPU Memory", 0) and len(skipped["info"]) == 1
    assert entries[0] == {
        "category": "Deployment",
        "test": "Denylist",
        "result": "Pass",
        "gpu": None,
        "info": [],
        "warnings": [],
    }


def test_parse_dcgmi_diag_dcgm3_2_string_messages(read_fixture: Callable[[str], str]) -> None:
    entries = parse_dcgmi_diag(read_fixture("dcgmi-diag-r2-dcgm3.2-a100x2.json"))
    failed = [entry for entry in entries if entry["result"] == "Fail"]
    assert [(entry["test"], entry["gpu"]) for entry in failed] == [("GPU Memory", 0)]
    assert failed[0]["warnings"][0].startswith("A memory mismatch was detected on GPU 0")
    assert len(entries) == 13  # 9 Deployment tests, PCIe and GPU Memory on 2 GPUs


def test_parse_dcgmi_diag_runtime_error(read_fixture: Callable[[str], str]) -> None:
    with pytest.raises(DcgmiDiagRuntimeError, match=r"Return: \(-39\) : A diag instance is already running"):
        parse_dcgmi_diag(read_fixture("dcgmi-diag-dcgm4-runtime-error.json"))
    assert issubclass(DcgmiDiagRuntimeError, ValueError)


def test_parse_dcgmi_diag_quirks_of_older_releases() -> None:
    # DCGM 3.3.1 lists a Deployment test's further messages as results without a status; JSON nulls
    # (jsoncpp fills gaps in an array) are skipped; a 4.x test with only its name did not run; Warn is
    # a word dcgmi knows; a CPU entity is no GPU.
    document = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [
                        {
                            "name": "Inforom",
                            "results": [
                                {"status": "Fail", "warnings": "first", "error_id": 1},
                                {"warnings": "second", "error_id": 2},
                            ],
                        },
                        None,
                    ],
                },
                {
                    "category": "Hardware",
                    "tests": [{"name": "Diagnostic", "results": [None, {"gpu_id": "1", "status": "Warn"}]}],
                },
            ]
        }
    }
    entries = parse_dcgmi_diag(json.dumps(document))
    assert [(entry["test"], entry["result"], entry["gpu"], entry["warnings"]) for entry in entries] == [
        ("Inforom", "Fail", None, ["first", "second"]),
        ("Diagnostic", "Warn", 1, []),
    ]
    dcgm4 = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {"name": "eud"},
                        {
                            "name": "cpu_eud",
                            "results": [
                                {
                                    "entity_group": "CPU",
                                    "entity_group_id": 7,
                                    "entity_id": 0,
                                    "status": "Pass",
                                    "info": ["ok"],
                                }
                            ],
                        },
                    ],
                }
            ]
        }
    }
    assert [
        (entry["test"], entry["result"], entry["gpu"], entry["info"]) for entry in parse_dcgmi_diag(json.dumps(dcgm4))
    ] == [
        ("eud", "Not Run", None, []),
        ("cpu_eud", "Pass", None, ["ok"]),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'DCGM Diagnostic'"),
        ("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.", "no 'DCGM"),
        ("{not json}", "not JSON"),
        ('{"iterations": [], "Overall Result": "Pass"}', "no 'DCGM Diagnostic'"),
        ('{"DCGM Diagnostic": {"version": "4.2.3"}}', "no test_categories"),
        ('{"DCGM Diagnostic": {"test_categories": [{"category": "Stress"}]}}', "category name and tests"),
        (
            '{"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [{"results": []}]}]}}',
            "without a name",
        ),
        (
            '{"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [{"name": "x", "results": [{"status": "Passed"}]}]}]}}',
            "without a status",
        ),
        (
            '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Stress", "tests": [{"name": "x", "results": [{"status": "Pass", "gpu_id": "GPU0"}]}]}]}}',
            "not a GPU id",
        ),
        (
            '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Stress", "tests": [{"name": "x", "results": [{"status": "Fail", "warnings": 7}]}]}]}}',
            "not a message",
        ),
    ],
)
def test_parse_dcgmi_diag_rejects_other_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_dcgmi_diag(text)
    assert not isinstance(caught.value, DcgmiDiagRuntimeError)
