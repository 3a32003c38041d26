"""The Prometheus textfile of gpu_health.py, checked with promtool when it is installed and with the
small exposition-format validator of conftest.py when it is not."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_health
import pytest
from gpu_parsers import parse_health_query, parse_nvlink_status, parse_xid_events

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CATALOG = gpu_health.load_xid_catalog(str(Path(__file__).resolve().parents[3] / "data" / "xid.yml"))
NOW = 1717171717.25


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def report(query: str = "query-h100x8-healthy.csv", kernel_log: str | None = None) -> dict[str, Any]:
    baseline = gpu_health.validate_baseline(json.loads(fixture_text("baseline-h100x8.json")))
    observed = {
        "gpus": parse_health_query(fixture_text(query)),
        "mismatch": None,
        "nvlink": parse_nvlink_status(fixture_text("nvlink-s-h100x8.txt")),
        "nvlink_error": None,
        "xid_events": parse_xid_events(fixture_text(kernel_log)) if kernel_log else [],
        "module_version": "550.54.15",
        "pci": [gpu["pci_bus_id"] for gpu in parse_health_query(fixture_text("query-h100x8-healthy.csv"))],
        "pci_note": None,
        "fabric_manager": {"state": "active", "note": None},
        "stacks": {},
    }
    return gpu_health.build_report(NOW, observed, baseline, gpu_health.judge(observed, baseline, CATALOG))


def samples(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]


def test_healthy_metrics(metrics_problems: Callable[[str], list[str]]) -> None:
    text = gpu_health.render_metrics(report())
    assert metrics_problems(text) == []
    assert samples(text, "gpu_fleet_health_up") == ["gpu_fleet_health_up 1"]
    assert samples(text, "gpu_fleet_health_last_run_timestamp_seconds") == [
        "gpu_fleet_health_last_run_timestamp_seconds 1717171717.25"
    ]
    assert samples(text, "gpu_fleet_health_finding") == []
    # no stacks: no venv check; no --dcgm-diag: no dcgm check
    assert len(samples(text, "gpu_fleet_health_check_ok")) == len(gpu_health.CHECKS) - 2
    assert all(line.endswith(" 1") for line in samples(text, "gpu_fleet_health_check_ok"))
    assert 'gpu_fleet_health_pcie_link_width{bus_id="0000:18:00.0"} 16' in text
    assert 'gpu_fleet_health_nvlink_active_links{bus_id="0000:db:00.0"} 18' in text
    assert 'gpu_fleet_health_clocks_event_active{bus_id="0000:18:00.0",reason="hw_thermal_slowdown"} 0' in text
    assert (
        'gpu_fleet_health_driver_info{user_space="550.54.15",kernel_module="550.54.15",baseline="550.54.15"} 1' in text
    )
    assert "# TYPE gpu_fleet_health_ecc_uncorrected_volatile_errors_total counter" in text
    assert samples(text, "gpu_fleet_health_retired_pages_pending") == []  # [N/A] on H100: no series


def test_faulty_metrics(metrics_problems: Callable[[str], list[str]]) -> None:
    text = gpu_health.render_metrics(report("query-h100x8-faults.csv", "kernel-dmesg.txt"))
    assert metrics_problems(text) == []
    findings = samples(text, "gpu_fleet_health_finding")
    assert 'gpu_fleet_health_finding{check="gpus",bus_id="0000:db:00.0"} 1' in findings
    assert 'gpu_fleet_health_finding{check="pcie",bus_id="0000:2a:00.0"} 1' in findings
    assert 'gpu_fleet_health_finding{check="ecc",bus_id="0000:3a:00.0"} 3' in findings
    assert 'gpu_fleet_health_finding{check="xid",bus_id="0000:3a:00.0"} 3' in findings
    assert 'gpu_fleet_health_check_ok{check="persistence"} 0' in text
    assert 'gpu_fleet_health_gpu_present{bus_id="0000:db:00.0"} 0' in text
    assert 'gpu_fleet_health_xid_events{bus_id="0000:3a:00.0",xid="13"} 2' in text
    assert 'gpu_fleet_health_remapped_rows_failure{bus_id="0000:5d:00.0"} 1' in text


def test_could_not_check_metrics(metrics_problems: Callable[[str], list[str]]) -> None:
    failed = gpu_health.failed_report(NOW, gpu_health.CouldNotCheck("nvidia-smi hung.", "Reboot."))
    text = gpu_health.render_metrics(failed)
    assert metrics_problems(text) == []
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "gpu_fleet_health_up 0",
        "gpu_fleet_health_last_run_timestamp_seconds 1717171717.25",
    ]


def test_label_values_are_escaped(validator: Callable[[str], list[str]]) -> None:
    line = gpu_health.gpu_metrics.sample_line("gpu_fleet_health_x", {"a": 'say "hi"\\\nbye'}, 2.5)
    assert line == 'gpu_fleet_health_x{a="say \\"hi\\"\\\\\\nbye"} 2.5'
    assert validator("# HELP gpu_fleet_health_x x\n# TYPE gpu_fleet_health_x gauge\n" + line + "\n") == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("gpu_fleet_health_up 1\n", "outside its family"),
        (
            "# HELP gpu_fleet_health_a a\n# TYPE gpu_fleet_health_a gauge\ngpu_fleet_health_a 1\ngpu_fleet_health_a 2\n",
            "twice",
        ),
        (
            "# HELP gpu_fleet_health_a a\n# TYPE gpu_fleet_health_a counter\ngpu_fleet_health_a 1\n",
            "only counters end in _total",
        ),
        (
            "# HELP gpu_fleet_health_a_total a\n# TYPE gpu_fleet_health_a_total gauge\ngpu_fleet_health_a_total 1\n",
            "only counters",
        ),
        ("# HELP other a\n# TYPE other gauge\nother 1\n", "not named gpu_fleet_health_"),
        ('# HELP gpu_fleet_health_a a\n# TYPE gpu_fleet_health_a gauge\ngpu_fleet_health_a{x="a"b"} 1\n', "neither"),
        ("# HELP gpu_fleet_health_a a\n# TYPE gpu_fleet_health_a gauge\ngpu_fleet_health_a one\n", "not a number"),
        ("# HELP gpu_fleet_health_a a\n# TYPE gpu_fleet_health_a gauge\ngpu_fleet_health_a 1", "newline"),
    ],
)
def test_the_validator_catches_broken_exposition(
    validator: Callable[[str], list[str]], text: str, problem: str
) -> None:
    assert any(problem in found for found in validator(text)), validator(text)


def test_text_report_names_cause_and_fix() -> None:
    text = gpu_health.render_text(report("query-h100x8-faults.csv"))
    first = text.splitlines()[0]
    assert first.startswith("gpu_health: UNHEALTHY, ") and "7 GPU(s), driver 550.54.15" in first
    assert "  [pcie] 0000:2a:00.0: The PCIe link of GPU 0000:2a:00.0 runs at x8" in text
    assert "      Fix: Drain the host, reseat the GPU" in text
    assert gpu_health.render_text(report()).startswith(
        "gpu_health: healthy: 8 GPU(s), driver 550.54.15, 0 Xid event(s)"
    )
