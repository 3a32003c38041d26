"""The pci check (GPUs on the PCI bus, from a sysfs-like folder, against nvidia-smi and the baseline)
and the fabric_manager check (``systemctl is-active nvidia-fabricmanager``) of gpu_health.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_health
import gpu_health_checks as checks
import pytest
from gpu_parsers import parse_health_query, parse_nvlink_status

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CATALOG = gpu_health.load_xid_catalog(str(ROOT / "data" / "xid.yml"))
MODULE = "550.54.15"
NOW = 1717171717.0


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def healthy_gpus() -> list[dict[str, Any]]:
    return parse_health_query(fixture_text("query-h100x8-healthy.csv"))


def baseline(**changes: Any) -> dict[str, Any]:
    return gpu_health.validate_baseline({**json.loads(fixture_text("baseline-h100x8.json")), **changes})


BUS_IDS = [gpu["pci_bus_id"] for gpu in healthy_gpus()]
LOST = "0000:db:00.0"  # GPU 7


def only(findings: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(findings) == 1, findings
    item = findings[0]
    assert set(item) == {"check", "bus_id", "cause", "fix"}
    assert item["cause"][:1].isupper() and item["fix"][:1].isupper(), item
    return item


def observed(**changes: Any) -> dict[str, Any]:
    state = {
        "gpus": healthy_gpus(),
        "mismatch": None,
        "nvlink": parse_nvlink_status(fixture_text("nvlink-s-h100x8.txt")),
        "nvlink_error": None,
        "xid_events": [],
        "module_version": MODULE,
        "pci": list(BUS_IDS),
        "pci_note": None,
        "fabric_manager": {"state": "active", "note": None},
        "stacks": {},
    }
    return {**state, **changes}


def report(state: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    base = base or baseline()
    return gpu_health.build_report(NOW, state, base, gpu_health.judge(state, base, CATALOG))


# --- reading the PCI bus --------------------------------------------------------------------------


def test_the_sysfs_folder_gives_the_nvidia_gpus_only(tmp_path: Path, pci_devices: Callable[[list[str]], str]) -> None:
    root = Path(pci_devices(BUS_IDS))
    for bus_id, ids in {
        "0000:db:00.1": ("0x10de", "0x22a3", "0x040300"),  # an NVIDIA audio function
        "0000:c5:00.0": ("0x10de", "0x22a3", "0x068000"),  # an NVSwitch bridge
        "0000:17:00.0": ("0x15b3", "0x1021", "0x020700"),  # a ConnectX NIC
    }.items():
        (root / bus_id).mkdir()
        for name, text in zip(("vendor", "device", "class"), ids):
            (root / bus_id / name).write_text(text + "\n", encoding="ascii")
    (root / "not-a-function").mkdir()
    assert checks.pci_gpus(str(root), BUS_IDS) == (BUS_IDS, None)
    assert checks.pci_gpus(str(root), BUS_IDS[:7]) == (BUS_IDS, None)  # GPU 7 off the bus: still in sysfs


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("absent", "cannot be read (No such file or directory)"),
        ("garbage", "is not a PCI device folder (0000:18:00.0/class is 'x'"),
        ("no-nvidia", "lacks 8 of the 8 GPUs nvidia-smi lists (first 0000:18:00.0), so it is not this host's PCI bus"),
        ("other-gpus", "lacks 1 of the 8 GPUs nvidia-smi lists (first 0000:db:00.0), so it is not this host's PCI bus"),
    ],
)
def test_an_unusable_pci_folder_skips_the_check(tmp_path: Path, layout: str, words: str) -> None:
    root = tmp_path / "devices"
    if layout != "absent":
        root.mkdir()
        (root / "0000:00:00.0").mkdir()
        for name, text in zip(("vendor", "device", "class"), ("0x8086", "0x09a2", "0x060000")):
            (root / "0000:00:00.0" / name).write_text(text + "\n", encoding="ascii")
    for bus_id in BUS_IDS[:7] if layout == "other-gpus" else []:
        (root / bus_id).mkdir()
        for name, text in zip(("vendor", "device", "class"), ("0x10de", "0x2330", "0x030200")):
            (root / bus_id / name).write_text(text + "\n", encoding="ascii")
    if layout == "garbage":
        (root / "0000:18:00.0").mkdir()
        for name, text in zip(("vendor", "device", "class"), ("0x10de", "0x2330", "x")):
            (root / "0000:18:00.0" / name).write_text(text + "\n", encoding="ascii")
    pci, note = checks.pci_gpus(str(root), BUS_IDS)
    assert pci is None and words in note and str(root) in note and "--pci-devices" in note
    result = report(observed(pci=None, pci_note=note))
    assert "pci" not in result["checks"] and result["skipped"] == {"pci": note}
    assert result["findings"] == [] and result["exit_code"] == 0
    assert f"  [pci] skipped: {note}" in gpu_health.render_text(result)
    assert 'gpu_fleet_health_check_skipped{check="pci"} 1' in gpu_health.render_metrics(result)
    assert "gpu_fleet_health_gpu_on_pci_bus" not in gpu_health.render_metrics(result)


def test_an_empty_bus_is_judged_when_nvidia_smi_lists_no_gpu_either(tmp_path: Path) -> None:
    # Every GPU gone: nvidia-smi lists none, so an empty folder is this host's bus and is judged.
    (tmp_path / "devices").mkdir()
    assert checks.pci_gpus(str(tmp_path / "devices"), []) == ([], None)
    findings = checks.judge_pci([], [], baseline())
    assert [item["bus_id"] for item in findings] == BUS_IDS


# --- judging it -----------------------------------------------------------------------------------


def test_a_healthy_bus_has_no_finding() -> None:
    assert checks.judge_pci(healthy_gpus(), BUS_IDS, baseline()) == []
    result = report(observed())
    assert result["checks"]["pci"] is True and result["skipped"] == {} and result["findings"] == []


def test_a_gpu_gone_from_the_pci_bus() -> None:
    gpus = [gpu for gpu in healthy_gpus() if gpu["pci_bus_id"] != LOST]
    item = only(checks.judge_pci(gpus, [bus for bus in BUS_IDS if bus != LOST], baseline()))
    assert item["check"] == "pci" and item["bus_id"] == LOST
    assert item["cause"] == f"GPU {LOST} of the baseline is gone from the PCI bus: the kernel no longer sees it."
    assert "power-cycle" in item["fix"] and "reseat" in item["fix"] and "BMC" in item["fix"]


def test_a_gpu_on_the_bus_that_nvidia_smi_does_not_list() -> None:
    gpus = [gpu for gpu in healthy_gpus() if gpu["pci_bus_id"] != LOST]
    item = only(checks.judge_pci(gpus, BUS_IDS, baseline()))
    assert item["bus_id"] == LOST and "on the PCI bus but nvidia-smi does not list it" in item["cause"]
    assert "fell off the bus" in item["cause"] and "Xid 79" in item["fix"] and "reboot" in item["fix"]


def test_the_count_on_the_bus_below_expected_gpus() -> None:
    thin = baseline(gpus={})
    item = only(checks.judge_pci(healthy_gpus()[:6], BUS_IDS[:6], thin))
    assert item["bus_id"] is None and item["cause"] == "The PCI bus has 6 NVIDIA GPUs; the baseline expects 8."
    assert checks.judge_pci(healthy_gpus(), BUS_IDS, thin) == []


def test_gpu_on_pci_bus_metric_and_rows() -> None:
    gpus = [gpu for gpu in healthy_gpus() if gpu["pci_bus_id"] != LOST]
    extra = "0000:e0:00.0"  # on the bus, not listed, not in the baseline
    result = report(observed(gpus=gpus, pci=[*BUS_IDS, extra]))
    text = gpu_health.render_metrics(result)
    assert 'gpu_fleet_health_gpu_on_pci_bus{bus_id="0000:18:00.0"} 1' in text
    assert f'gpu_fleet_health_gpu_on_pci_bus{{bus_id="{LOST}"}} 1' in text
    assert f'gpu_fleet_health_gpu_present{{bus_id="{extra}"}} 0' in text
    assert f'gpu_fleet_health_finding{{check="pci",bus_id="{extra}"}} 1' in text
    gone = report(observed(gpus=gpus, pci=[bus for bus in BUS_IDS if bus != LOST]))
    assert f'gpu_fleet_health_gpu_on_pci_bus{{bus_id="{LOST}"}} 0' in gpu_health.render_metrics(gone)


def test_the_pci_check_needs_the_gpu_list() -> None:
    mismatch = {"library_version": None, "output": "Driver/library version mismatch"}
    state = observed(gpus=None, mismatch=mismatch, nvlink=None, pci=None)
    assert "pci" not in gpu_health.judge(state, baseline(), CATALOG)


def test_the_sandbox_pci_folder_agrees_with_the_nvidia_smi_standin(tmp_path: Path) -> None:
    """tests/fixtures/nvidia/pci_sysfs.py writes every GPU of a description, visible or not: the GPU
    that fell off the bus (visible false) is the one finding."""
    script = ROOT / "tests" / "fixtures" / "nvidia" / "pci_sysfs.py"
    description = ROOT / "tests" / "fixtures" / "nvidia" / "gpus" / "2xA100-one-missing.json"
    out = tmp_path / "devices"
    subprocess.run([sys.executable, str(script), "--gpus", str(description), "--out", str(out)], check=True)
    gpus = json.loads(description.read_text(encoding="utf-8"))["gpus"]
    visible = [gpu_health.gpu_parsers.normalize_bus_id(gpu["pci_bus_id"]) for gpu in gpus if gpu.get("visible", True)]
    listed = [{"pci_bus_id": bus_id} for bus_id in visible]
    pci, note = checks.pci_gpus(str(out), visible)
    assert note is None and len(pci) == len(gpus)
    base = {"expected_gpus": len(gpus), "gpus": {bus: {} for bus in pci}}
    (item,) = checks.judge_pci(listed, pci, base)
    assert "nvidia-smi does not list it" in item["cause"]
    assert checks.judge_pci([{"pci_bus_id": bus} for bus in pci], pci, base) == []


# --- the fabric manager ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "stderr", "expected"),
    [
        ("active\n", "", {"state": "active", "note": None}),
        ("inactive\n", "", {"state": "inactive", "note": None}),
        ("failed\n", "", {"state": "failed", "note": None}),
        ("unknown\n", "", {"state": "unknown", "note": None}),
    ],
)
def test_the_unit_state_is_read(stdout: str, stderr: str, expected: dict[str, Any]) -> None:
    assert checks.fabric_manager_answer("systemctl is-active nvidia-fabricmanager", stdout, stderr) == expected


def test_no_unit_state_is_a_note() -> None:
    answer = checks.fabric_manager_answer(
        "systemctl is-active nvidia-fabricmanager",
        "",
        "System has not been booted with systemd as init system (PID 1).",
    )
    assert answer["state"] is None and "printed no unit state (System has not been booted" in answer["note"]


def test_an_active_fabric_manager_passes_and_others_are_findings() -> None:
    assert checks.judge_fabric_manager("active", MODULE) == []
    assert checks.judge_fabric_manager("reloading", MODULE) == []
    for state in ("inactive", "failed", "activating", "unknown"):
        item = only(checks.judge_fabric_manager(state, MODULE))
        assert item["check"] == "fabric_manager" and item["bus_id"] is None
        assert item["cause"].startswith(f"The nvidia-fabricmanager service is {state}; the baseline expects it")
        assert "systemctl enable --now nvidia-fabricmanager" in item["fix"]
        assert f"must match the driver's ({MODULE})" in item["fix"]


def test_the_fabric_manager_is_judged_only_where_the_baseline_expects_it() -> None:
    failed = observed(fabric_manager={"state": "failed", "note": None})
    assert len(gpu_health.judge(failed, baseline(), CATALOG)["fabric_manager"]) == 1
    document = json.loads(fixture_text("baseline-h100x8.json"))
    for entry in document["gpus"].values():
        entry["fabric_manager_expected"] = False
    plain = gpu_health.validate_baseline(document)
    assert "fabric_manager" not in gpu_health.judge(observed(fabric_manager=None), plain, CATALOG)


def test_systemctl_is_asked_and_its_absence_or_hang_is_a_note(tmp_path: Path, systemctl: Callable[..., str]) -> None:
    path = systemctl("inactive")
    assert gpu_health.read_fabric_manager(path, 5) == {"state": "inactive", "note": None}
    assert (tmp_path / "bin" / "systemctl.args").read_text() == "is-active nvidia-fabricmanager"
    assert gpu_health.read_fabric_manager(systemctl(None), 5)["state"] is None
    missing = gpu_health.read_fabric_manager(str(tmp_path / "absent"), 5)
    assert missing == {"state": None, "note": f"`{tmp_path / 'absent'}` could not be run (No such file or directory)"}
    hang = tmp_path / "hang"
    hang.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n", encoding="utf-8")
    hang.chmod(0o755)
    started = time.monotonic()
    slow = gpu_health.read_fabric_manager(str(hang), 0.5)
    assert slow["state"] is None and "did not answer within 0.5 s" in slow["note"]
    assert time.monotonic() - started < 5


def test_a_skipped_fabric_manager_check_is_reported() -> None:
    note = "`systemctl is-active nvidia-fabricmanager` printed no unit state (x): systemd does not run here"
    result = report(observed(fabric_manager={"state": None, "note": note}))
    assert "fabric_manager" not in result["checks"] and result["skipped"] == {"fabric_manager": note}
    assert result["exit_code"] == 0


def test_the_check_end_to_end_with_a_gpu_off_the_bus_and_the_fabric_manager_down(
    tmp_path: Path, nvidia_smi: Callable[..., str], pci_devices: Callable[[list[str]], str], systemctl: Any
) -> None:
    lines = fixture_text("query-h100x8-healthy.csv").splitlines()[:7]  # GPU 7 fell off: nvidia-smi lists 7
    (tmp_path / "kern.log").write_text("", encoding="utf-8")
    argv = [
        *("--nvidia-smi", nvidia_smi(lines), "--baseline", str(FIXTURES / "baseline-h100x8.json")),
        *("--state", "", "--kernel-log", str(tmp_path / "kern.log"), "--format", "json"),
        *("--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt")),
        *("--pci-devices", pci_devices(BUS_IDS), "--systemctl", systemctl("failed")),
        *("--textfile", str(tmp_path / "metrics.prom")),
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "files" / "health" / "gpu_health.py"), *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert sorted((item["check"], item["bus_id"] or "") for item in result["findings"]) == [
        ("fabric_manager", ""),
        ("gpus", LOST),
        ("pci", LOST),
    ]
    metrics = (tmp_path / "metrics.prom").read_text(encoding="utf-8")
    assert f'gpu_fleet_health_gpu_on_pci_bus{{bus_id="{LOST}"}} 1' in metrics
    assert 'gpu_fleet_health_check_ok{check="fabric_manager"} 0' in metrics


def test_systemctl_is_not_asked_where_no_fabric_manager_is_expected(
    tmp_path: Path, nvidia_smi: Any, pci_devices: Any, systemctl: Any
) -> None:
    argv = ["--nvidia-smi", nvidia_smi(), "--pci-devices", pci_devices(BUS_IDS), "--systemctl", systemctl("failed")]
    args = gpu_health.build_parser().parse_args(
        [*argv, "--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt")]
    )
    seen = gpu_health.observe_devices(args, False, {})
    assert seen["fabric_manager"] is None and not (tmp_path / "bin" / "systemctl.args").exists()
    assert seen["pci"] == BUS_IDS and seen["pci_note"] is None and seen["stacks"] == {}
    assert gpu_health.observe_devices(args, True, {})["fabric_manager"] == {"state": "failed", "note": None}
