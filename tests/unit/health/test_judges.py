"""The judge functions of gpu_health.py: no finding on a healthy host, one per fault."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import gpu_health
import pytest
from gpu_parsers import parse_health_query, parse_nvlink_status, parse_xid_events

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


CATALOG = gpu_health.load_xid_catalog(str(ROOT / "data" / "xid.yml"))
MODULE = "550.54.15"


def healthy_gpus() -> list[dict[str, Any]]:
    return parse_health_query(fixture_text("query-h100x8-healthy.csv"))


def baseline() -> dict[str, Any]:
    return gpu_health.validate_baseline(json.loads(fixture_text("baseline-h100x8.json")))


def nvlink(name: str = "nvlink-s-h100x8.txt") -> dict[int, dict[str, Any]]:
    return parse_nvlink_status(fixture_text(name))


def with_change(index: int, **changes: Any) -> list[dict[str, Any]]:
    gpus = healthy_gpus()
    gpus[index].update(changes)
    return gpus


def observed(**changes: Any) -> dict[str, Any]:
    state = {
        "gpus": healthy_gpus(),
        "mismatch": None,
        "nvlink": nvlink(),
        "nvlink_error": None,
        "xid_events": [],
        "module_version": MODULE,
        "pci": [gpu["pci_bus_id"] for gpu in healthy_gpus()],
        "pci_note": None,
        "fabric_manager": {"state": "active", "note": None},
        "stacks": {},
    }
    state.update(changes)
    return state


def test_a_healthy_host_has_no_finding() -> None:
    results = gpu_health.judge(observed(), baseline(), CATALOG)
    # the baseline names no stacks, and DCGM's diagnostic runs only with --dcgm-diag
    asked = [check for check in gpu_health.CHECKS if check not in ("venv", "dcgm")]
    assert list(results) == asked
    assert results == {check: [] for check in asked}


@pytest.mark.parametrize(
    "judge",
    [
        lambda: gpu_health.judge_gpus(healthy_gpus(), baseline()),
        lambda: gpu_health.checks.judge_pci(healthy_gpus(), observed()["pci"], baseline()),
        lambda: gpu_health.judge_pcie(healthy_gpus(), baseline()),
        lambda: gpu_health.judge_nvlink(healthy_gpus(), nvlink(), None, baseline()),
        lambda: gpu_health.checks.judge_fabric_manager("active", MODULE),
        lambda: gpu_health.judge_ecc(healthy_gpus()),
        lambda: gpu_health.judge_xid([], CATALOG),
        lambda: gpu_health.judge_clocks(healthy_gpus()),
        lambda: gpu_health.judge_persistence(healthy_gpus()),
        lambda: gpu_health.judge_driver(healthy_gpus(), MODULE, baseline(), None),
        lambda: gpu_health.checks.judge_venv({}),
        lambda: gpu_health.checks.judge_dcgm(gpu_health.checks.dcgm_seen(1, []), healthy_gpus()),
    ],
    ids=[check for check in gpu_health.CHECKS if check != "nvidia_smi"],  # nvidia_smi: its answer is the finding
)
def test_each_judge_passes_a_healthy_host(judge: Any) -> None:
    assert judge() == []


def only(findings: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(findings) == 1, findings
    item = findings[0]
    assert set(item) == {"check", "bus_id", "cause", "fix"}
    assert item["cause"][:1].isupper() and item["fix"][:1].isupper(), item
    return item


def test_one_gpu_gone_names_its_bus_id() -> None:
    gpus = healthy_gpus()[:7]
    item = only(gpu_health.judge_gpus(gpus, baseline()))
    assert item["check"] == "gpus" and item["bus_id"] == "0000:db:00.0"
    assert "7 of 8 GPUs" in item["cause"] and "Xid 79" in item["fix"]


def test_gpu_count_without_bus_ids_in_the_baseline() -> None:
    thin = {"expected_gpus": 8, "driver_version": None, "gpus": {}}
    item = only(gpu_health.judge_gpus(healthy_gpus()[:6], thin))
    assert item["bus_id"] is None and "lists 6 GPUs; the baseline expects 8" in item["cause"]
    extra = only(gpu_health.judge_gpus(healthy_gpus(), {**thin, "expected_gpus": 4}))
    assert "new baseline" in extra["fix"]


def test_a_link_at_x8() -> None:
    item = only(gpu_health.judge_pcie(with_change(1, pcie_link_width_current=8), baseline()))
    assert item["bus_id"] == "0000:2a:00.0"
    assert "runs at x8, expected x16 (link maximum x16, x16 at the last verification)" in item["cause"]


def test_a_link_that_trained_narrower_than_the_baseline() -> None:
    gpus = with_change(2, pcie_link_width_current=8, pcie_link_width_max=8)
    item = only(gpu_health.judge_pcie(gpus, baseline()))
    assert "expected x16 (link maximum x8, x16 at the last verification)" in item["cause"]


def test_pcie_generation_max_below_the_baseline_but_idle_generation_is_fine() -> None:
    assert gpu_health.judge_pcie(with_change(0, pcie_link_gen_current=1), baseline()) == []
    item = only(gpu_health.judge_pcie(with_change(0, pcie_link_gen_max=3, pcie_link_gen_current=3), baseline()))
    assert "Gen 3 at most; it reached Gen 5" in item["cause"]


def test_an_nvlink_down() -> None:
    item = only(gpu_health.judge_nvlink(healthy_gpus(), nvlink("nvlink-s-h100x8-link-down.txt"), None, baseline()))
    assert item["bus_id"] == "0000:5d:00.0"
    assert item["cause"] == "GPU 0000:5d:00.0 has 17 of 18 NVLinks active; inactive: link 7."
    assert "nvidia-fabricmanager" in item["fix"]


def test_nvlink_all_inactive_note_and_bridge_fix() -> None:
    base = baseline()
    base["gpus"]["0000:18:00.0"].update(nvlink_active_links=4, fabric_manager_expected=False)
    links = {
        0: {
            "uuid": "GPU-a",
            "name": "x",
            "links": {},
            "note": "NVML: Unable to retrieve Nvlink information as all links are inActive",
        }
    }
    item = only(gpu_health.judge_nvlink(healthy_gpus()[:1], links, None, base))
    assert "0 of 4 NVLinks active; nvidia-smi says: NVML: Unable" in item["cause"]
    assert "bridge" in item["fix"]


def test_nvlink_unreadable_mig_and_no_nvlink_expected() -> None:
    item = only(gpu_health.judge_nvlink(healthy_gpus()[:1], None, "exit status 3", baseline()))
    assert "could not be read (exit status 3)" in item["cause"]
    mig = parse_nvlink_status(fixture_text("nvlink-s-h100-mig.txt"))
    assert gpu_health.judge_nvlink(healthy_gpus()[:1], mig, None, baseline()) == []
    pcie_only = {"expected_gpus": 8, "driver_version": None, "gpus": {}}
    assert gpu_health.judge_nvlink(healthy_gpus(), {}, None, pcie_only) == []


def test_ecc_uncorrectable_errors() -> None:
    findings = gpu_health.judge_ecc(
        with_change(2, ecc_errors_uncorrected_volatile_total=2, ecc_errors_uncorrected_aggregate_total=2)
    )
    assert [(item["check"], item["bus_id"]) for item in findings] == [("ecc", "0000:3a:00.0")] * 2
    assert "2 uncorrectable ECC errors since the driver loaded" in findings[0]["cause"]
    assert "`nvidia-smi -r -i 0000:3a:00.0`" in findings[0]["fix"]
    assert "over its life" in findings[1]["cause"]


def test_retired_pages_pending() -> None:
    item = only(gpu_health.judge_ecc(with_change(0, retired_pages_pending=True)))
    assert "pending retirement" in item["cause"] and "reload the driver or reboot" in item["fix"]


def test_row_remap_pending_and_failure() -> None:
    pending = only(gpu_health.judge_ecc(with_change(0, remapped_rows_pending=True)))
    assert "pending remapping" in pending["cause"]
    failure = only(gpu_health.judge_ecc(with_change(3, remapped_rows_failure=True)))
    assert failure["bus_id"] == "0000:5d:00.0" and "RMA" in failure["fix"]


def test_unsupported_fields_are_not_findings() -> None:
    gpus = parse_health_query(fixture_text("query-rtx2080super.csv"))
    assert gpu_health.judge_ecc(gpus) == [] and gpu_health.judge_clocks(gpus) == []


def test_an_xid_79_and_an_xid_48() -> None:
    events = [event for event in parse_xid_events(fixture_text("kernel-dmesg.txt")) if event["xid"] in (48, 79)]
    xid48, xid79 = gpu_health.judge_xid(events, CATALOG)
    assert xid79["bus_id"] == "0000:db:00.0"
    assert xid79["cause"] == (
        "Xid 79 (GPU has fallen off the bus) on GPU 0000:db:00.0, once, process python3 (pid 1234): GPU has fallen off the bus."
    )
    assert xid79["fix"].startswith("Reboot: ")
    assert xid48["bus_id"] == "0000:3a:00.0" and xid48["cause"].startswith("Xid 48 (Double Bit ECC Error)")
    assert xid48["fix"].startswith("Reset the GPU: ")


def test_repeated_xids_are_one_finding_and_unknown_xids_name_the_catalog() -> None:
    events = parse_xid_events(fixture_text("kernel-dmesg.txt"))
    (xid13,) = [item for item in gpu_health.judge_xid(events, CATALOG) if item["cause"].startswith("Xid 13 ")]
    assert ", 2 times:" in xid13["cause"] and xid13["fix"].startswith("Check the application")
    unknown = only(gpu_health.judge_xid([dict(events[0], xid=999)], CATALOG))
    assert "not in data/xid.yml" in unknown["fix"]
    assert "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in unknown["fix"]


def test_thermal_slowdown() -> None:
    gpus = with_change(4, clocks_event_reasons_hw_slowdown=True, clocks_event_reasons_hw_thermal_slowdown=True)
    item = only(gpu_health.judge_clocks(gpus))
    assert (
        item["cause"] == "The clocks of GPU 0000:9a:00.0 are held down by hardware slowdown, hardware thermal slowdown."
    )
    brake = only(gpu_health.judge_clocks(with_change(0, clocks_event_reasons_hw_power_brake_slowdown=True)))
    assert "power brake" in brake["cause"]


def test_persistence_off() -> None:
    item = only(gpu_health.judge_persistence(with_change(5, persistence_mode=False)))
    assert item["bus_id"] == "0000:ab:00.0" and "nvidia-persistenced" in item["fix"]
    assert gpu_health.judge_persistence(with_change(5, persistence_mode=None)) == []


def test_driver_module_mismatch() -> None:
    item = only(gpu_health.judge_driver(healthy_gpus(), "535.161.08", {**baseline(), "driver_version": None}, None))
    assert item["bus_id"] is None
    assert "user-space driver (550.54.15) and the loaded kernel module (535.161.08) differ" in item["cause"]
    assert item["fix"].startswith("Drain the host and reboot")


def test_driver_mismatch_reported_by_nvml() -> None:
    """An upgrade to the pin without a reboot: one finding, whose fix (reboot) loads the pinned driver."""
    mismatch = {"library_version": "550.54", "output": "Failed to initialize NVML: Driver/library version mismatch"}
    findings = gpu_health.judge_driver(None, "535.161.08", baseline(), mismatch)
    assert [item["fix"][:5] for item in findings] == ["Drain"]
    assert 'nvidia-smi: "Failed to initialize NVML' in findings[0]["cause"]


def test_driver_mismatch_away_from_the_pin_names_both() -> None:
    mismatch = {"library_version": "555.42", "output": "Failed to initialize NVML: Driver/library version mismatch"}
    findings = gpu_health.judge_driver(None, "535.161.08", baseline(), mismatch)
    assert [item["fix"][:5] for item in findings] == ["Drain", "Re-ru"]
    assert (
        findings[1]["cause"]
        == "Driver 535.161.08 is loaded; the baseline (the last passing verification) pins 550.54.15."
    )


def test_nvml_major_minor_is_the_pin_when_the_module_version_is_unreadable() -> None:
    gpus = [dict(gpu, driver_version="550.54") for gpu in healthy_gpus()]
    assert gpu_health.judge_driver(gpus, None, baseline(), None) == []


def test_driver_differs_from_the_pinned_version() -> None:
    gpus = [dict(gpu, driver_version="550.90.07") for gpu in healthy_gpus()]
    item = only(gpu_health.judge_driver(gpus, "550.90.07", baseline(), None))
    assert "pins 550.54.15" in item["cause"] and "new baseline" in item["fix"]


def test_only_the_checks_that_need_no_gpu_list_run_without_nvidia_smi() -> None:
    mismatch = {"library_version": None, "output": "Driver/library version mismatch"}
    results = gpu_health.judge(observed(gpus=None, mismatch=mismatch, nvlink=None), baseline(), CATALOG)
    assert list(results) == ["fabric_manager", "xid", "driver"] and len(results["driver"]) == 1


def test_baseline_bus_ids_are_normalised_and_checked() -> None:
    document = json.loads(fixture_text("baseline-h100x8.json"))
    document["gpus"] = {"00000000:18:00.0": {"pcie_link_width_max": 16}}
    assert gpu_health.validate_baseline(document)["gpus"] == {
        "0000:18:00.0": {
            "pcie_link_gen_max": None,
            "pcie_link_width_max": 16,
            "pcie_link_gen_current": None,
            "pcie_link_width_current": None,
            "nvlink_active_links": None,
            "fabric_manager_expected": False,
        }
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": 2}, "schema is 2"),
        ({"expected_gpus": -1}, "expected_gpus is -1"),
        ({"expected_gpus": True}, "expected_gpus is True"),
        ({"driver_version": 550}, "driver_version is 550"),
        ({"gpus": []}, "gpus is not an object"),
        ({"gpus": {"not-a-bus": {}}}, "not a PCI bus id"),
        ({"gpus": {"0000:18:00.0": {"nvlink_active_links": "18"}}}, "nvlink_active_links is '18'"),
        ({"gpus": {"0000:18:00.0": {"fabric_manager_expected": "yes"}}}, "fabric_manager_expected is 'yes'"),
    ],
)
def test_a_baseline_outside_the_schema_is_refused(change: dict[str, Any], message: str) -> None:
    document = {**json.loads(fixture_text("baseline-h100x8.json")), **change}
    with pytest.raises(ValueError, match=message):
        gpu_health.validate_baseline(copy.deepcopy(document))


def test_unreadable_baseline_could_not_check(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    assert gpu_health.load_baseline(str(tmp_path / "absent.json")) is None  # not verified yet
    for path in (tmp_path, tmp_path / "bad.json"):
        with pytest.raises(gpu_health.CouldNotCheck) as caught:
            gpu_health.load_baseline(str(path))
        assert str(path) in caught.value.cause and "gpu_verify" in caught.value.fix
