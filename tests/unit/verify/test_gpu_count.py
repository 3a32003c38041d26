"""gpu_count.py: parsing canned nvidia-smi/lspci output and the count messages."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
# Debian 12's nvidia-smi 535.261.03 on a machine without the NVIDIA kernel module (tests/fixtures/nvidia_smi/README.md).
REAL_NO_MODULE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "nvidia_smi" / "real-535.261.03-no-module"
sys.path.insert(0, str(VERIFY_DIR))

import gpu_count
import gpu_parsers
from gpu_count import CommandResult

A100_X2 = (
    "0, NVIDIA A100 80GB PCIe, GPU-3f1c2a7e-5b9d-4c11-8e2a-9d0b7c6e4a21, 00000000:17:00.0, 81920, 520.61.05\n"
    "1, NVIDIA A100 80GB PCIe, GPU-a84e0d3b-1c6f-4e7a-b2d9-5f3e8c1a0b67, 00000000:65:00.0, 81920, 520.61.05\n"
)
RTX3090_X4 = "".join(
    f"{i}, NVIDIA GeForce RTX 3090, GPU-6b0e9f2c-7d41-4a3b-9c85-2e1f0a7d3b9{i}, 00000000:{bus}:00.0, 24576, 535.104.05\n"
    for i, bus in enumerate(("01", "21", "41", "61"))
)
NO_DEVICES = "No devices were found\n"
LSPCI_A100_X3 = (
    "0000:17:00.0 0302: 10de:20b5 (rev a1)\n"
    "0000:65:00.0 0302: 10de:20b5 (rev a1)\n"
    "0000:ca:00.0 0302: 10de:20b5 (rev a1)\n"
    "0000:ca:00.1 0403: 10de:1aef (rev a1)\n"
    "0000:05:00.0 0680: 10de:22a3 (rev a1)\n"
)


def ok(stdout: str) -> CommandResult:
    return CommandResult(0, stdout, "", None)


def parse(text: str) -> list[dict[str, Any]]:
    """What gpu_count.evaluate reads: the shared parser with gpu_count's own field list."""
    return gpu_parsers.parse_query_gpu(text, gpu_count.QUERY_FIELDS)


def test_parse_two_a100() -> None:
    devices = parse(A100_X2)
    assert [d["index"] for d in devices] == [0, 1]
    assert devices[0] == {
        "index": 0,
        "name": "NVIDIA A100 80GB PCIe",
        "uuid": "GPU-3f1c2a7e-5b9d-4c11-8e2a-9d0b7c6e4a21",
        "pci_bus_id": "0000:17:00.0",
        "memory_total_mib": 81920,
        "driver_version": "520.61.05",
    }


def test_parse_four_rtx3090() -> None:
    devices = parse(RTX3090_X4)
    assert len(devices) == 4
    assert {d["name"] for d in devices} == {"NVIDIA GeForce RTX 3090"}
    assert [d["pci_bus_id"] for d in devices][-1] == "0000:61:00.0"
    assert all(d["memory_total_mib"] == 24576 for d in devices)


def test_parse_empty_and_no_devices() -> None:
    assert parse("") == []
    assert parse(NO_DEVICES) == []


def test_parse_not_available_memory_is_none() -> None:
    line = "0, NVIDIA H100 80GB HBM3, GPU-1, 00000000:18:00.0, [N/A], 550.54.15\n"
    assert parse(line)[0]["memory_total_mib"] is None


def test_parse_rejects_wrong_field_count() -> None:
    with pytest.raises(ValueError, match="has 3 fields, expected 6"):
        parse("0, NVIDIA A100, GPU-1\n")


def test_busy_gpus_text_formats_the_shared_compute_apps_records() -> None:
    devices = parse(A100_X2)
    text = (
        "4242, python3, GPU-a84e0d3b-1c6f-4e7a-b2d9-5f3e8c1a0b67, 30512\n"
        "4343, ollama, GPU-00000000-0000-0000-0000-000000000009, [N/A]\n"
        "No running processes found\n"
    )
    assert gpu_count.busy_gpus_text(text, devices) == (
        "GPU 1: PID 4242 python3 (30512 MiB); GPU-00000000-0000-0000-0000-000000000009: PID 4343 ollama (memory unknown)"
    )
    assert gpu_count.busy_gpus_text("No running processes found\n", devices) is None


def test_build_command_queries_the_documented_fields() -> None:
    assert gpu_count.build_command("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,name,uuid,pci.bus_id,memory.total,driver_version",
        "--format=csv,noheader,nounits",
    ]


def test_evaluate_match() -> None:
    doc = gpu_count.evaluate(2, ok(A100_X2))
    assert doc["ok"] is True and doc["error"] is None and doc["problems"] == []
    assert (doc["expected"], doc["seen"], doc["missing"]) == (2, 2, 0)
    assert doc["driver_version"] == "520.61.05"
    assert "driver_version" not in doc["devices"][0]
    assert doc["devices"][1]["memory_total_mib"] == 81920


def test_missing_gpu_message_names_expected_seen_missing() -> None:
    doc = gpu_count.evaluate(3, ok(A100_X2))
    assert doc["ok"] is False
    assert (doc["seen"], doc["missing"]) == (2, 1)
    (found,) = doc["problems"]
    assert found["check"] == "gpu_count"
    assert found["cause"] == "Expected 3 GPUs, nvidia-smi sees 2 (1 missing)."
    assert "nvidia-smi -L" in found["fix"] and "lspci -d 10de:" in found["fix"]
    assert "gpu_verify_expected_gpu_count" in found["fix"]
    assert doc["error"] == found["cause"]


def test_missing_gpu_names_bus_id_seen_by_lspci(tmp_path: Path) -> None:
    listing = tmp_path / "lspci.txt"
    listing.write_text(LSPCI_A100_X3)
    # Answers only the numeric query gpu_count.py runs.
    fake = _script(tmp_path / "lspci", f'[ "$*" = "-D -n -d 10de:" ] || exit 1\ncat "{listing}"\n')
    bus_ids = gpu_count.lspci_bus_ids(fake)
    assert bus_ids == ["0000:17:00.0", "0000:65:00.0", "0000:ca:00.0"]
    doc = gpu_count.evaluate(3, ok(A100_X2), pci_bus_ids=bus_ids)
    # nvidia-smi's 00000000:17:00.0 and lspci's 0000:17:00.0 are the same GPU: only ca:00.0 is missing.
    assert doc["missing_bus_ids"] == ["0000:ca:00.0"]
    assert [d["pci_bus_id"] for d in doc["devices"]] == ["0000:17:00.0", "0000:65:00.0"]
    assert "(1 missing)" in doc["problems"][0]["cause"]
    assert "0000:ca:00.0" in doc["problems"][0]["cause"]


def test_more_gpus_than_inventory_is_a_failure_pointing_at_stale_inventory() -> None:
    doc = gpu_count.evaluate(2, ok(RTX3090_X4))
    assert doc["ok"] is False
    assert (doc["seen"], doc["missing"], doc["extra"]) == (4, 0, 2)
    cause, fix = doc["problems"][0]["cause"], doc["problems"][0]["fix"]
    assert cause == "Expected 2 GPUs, nvidia-smi sees 4 (2 more than the inventory says)."
    assert "stale" in fix and "gpu_verify_expected_gpu_count" in fix


def test_empty_output_counts_all_missing() -> None:
    doc = gpu_count.evaluate(2, ok(""))
    assert doc["ok"] is False
    assert doc["problems"][0]["cause"] == "Expected 2 GPUs, nvidia-smi sees 0 (2 missing)."


def test_no_devices_found_exit_6() -> None:
    doc = gpu_count.evaluate(2, CommandResult(6, NO_DEVICES, "", None))
    assert doc["ok"] is False and doc["seen"] == 0 and doc["missing"] == 2
    cause = doc["problems"][0]["cause"]
    assert "Expected 2 GPUs, nvidia-smi sees 0 (2 missing)" in cause
    assert "No devices were found" in cause and "exit 6" in cause


def real_answer(file: str) -> CommandResult:
    """One real capture as run_command gives it (exit status from commands.json)."""
    entry = json.loads((REAL_NO_MODULE / "commands.json").read_text(encoding="utf-8"))["commands"][file]
    stderr = (REAL_NO_MODULE / entry["stderr"]).read_text(encoding="utf-8") if entry["stderr"] else ""
    return CommandResult(entry["rc"], (REAL_NO_MODULE / file).read_text(encoding="utf-8"), stderr, None)


@pytest.mark.parametrize("container", [False, True])
def test_driver_not_loaded_exit_9(container: bool) -> None:
    """The real answer to gpu_count's query (the module's fields, of which gpu_count asks a part: the same
    answer) where no kernel module is loaded; the fix is gpu_parsers', the container's steps first in one."""
    assert set(gpu_count.QUERY_FIELDS) <= set(gpu_parsers.QUERY_FIELDS)
    doc = gpu_count.evaluate(2, real_answer("query-gpu.txt"), container=container)
    assert doc["ok"] is False and doc["seen"] == 0
    (found,) = doc["problems"]
    assert found["cause"] == (
        "nvidia-smi failed with exit 9 (NVIDIA kernel module not loaded): NVIDIA-SMI has failed because it couldn't "
        "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
    )
    assert found["fix"] == gpu_parsers.module_not_loaded_fix(container)
    host_step, container_step = found["fix"].index("`modprobe nvidia`"), found["fix"].index("nvidia.com/gpu=all")
    assert (container_step < host_step) is container
    assert gpu_count.NVIDIA_SMI_EXIT_MEANINGS[9] == "NVIDIA kernel module not loaded"


def test_check_gpus_looks_whether_it_runs_in_a_container(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_count, "run_command", lambda argv, timeout: real_answer("query-gpu.txt"))
    monkeypatch.setattr(gpu_count, "in_container", lambda: True)
    doc = gpu_count.check_gpus(2, lspci=None)
    assert doc["problems"][0]["fix"] == gpu_parsers.module_not_loaded_fix(True)


def test_nvidia_smi_not_found_and_timeout() -> None:
    doc = gpu_count.evaluate(2, CommandResult(None, "", "", "not-found"), "/opt/none/nvidia-smi")
    assert doc["problems"][0]["cause"].startswith("/opt/none/nvidia-smi does not exist or is not executable;")
    doc = gpu_count.evaluate(2, CommandResult(None, "", "", "timeout"))
    assert "did not answer" in doc["problems"][0]["cause"]


def test_garbled_output_is_a_problem_not_a_crash() -> None:
    doc = gpu_count.evaluate(1, ok('Field "pci.bus_id" is not a valid field to query.\n'))
    assert doc["ok"] is False
    assert "Could not read nvidia-smi's output" in doc["problems"][0]["cause"]


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_cli_runs_a_fake_nvidia_smi(tmp_path: Path) -> None:
    csv_file = tmp_path / "gpus.csv"
    csv_file.write_text(A100_X2)
    fake = _script(tmp_path / "nvidia-smi", f'cat "{csv_file}"\n')
    run = [
        sys.executable,
        str(VERIFY_DIR / "gpu_count.py"),
        "--nvidia-smi",
        fake,
        "--no-lspci",
    ]
    done = subprocess.run(run + ["--expected", "2"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["seen"] == 2
    done = subprocess.run(run + ["--expected", "3"], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert json.loads(done.stdout)["problems"][0]["cause"].startswith("Expected 3 GPUs, nvidia-smi sees 2")


def test_cli_exit_6_from_fake_nvidia_smi(tmp_path: Path) -> None:
    fake = _script(tmp_path / "nvidia-smi", "echo 'No devices were found'\nexit 6\n")
    doc = gpu_count.check_gpus(1, fake, timeout=10, lspci=None)
    assert doc["ok"] is False and "exit 6" in doc["error"]


def test_cli_missing_binary(tmp_path: Path) -> None:
    doc = gpu_count.check_gpus(1, str(tmp_path / "absent"), timeout=10, lspci=None)
    assert doc["ok"] is False and doc["error"].startswith(f"{tmp_path / 'absent'} does not exist or is not executable")


def test_a_missing_nvidia_smi_is_named_not_installed_with_the_path_it_was_looked_for_on(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    doc = gpu_count.evaluate(2, CommandResult(None, "", "", "not-found"))
    assert doc["problems"][0]["cause"] == (
        "nvidia-smi is not installed (not on PATH (/usr/bin:/bin)); no NVIDIA driver user space on this host."
    )


def test_fixes_say_to_install_pciutils_before_lspci_on_a_host_without_it() -> None:
    no_devices = CommandResult(6, "No devices were found\n", "", None)
    without = gpu_count.evaluate(2, no_devices, lspci_missing=True)["problems"][0]["fix"]
    assert "check `lspci -d 10de:` (install pciutils first: this host has no lspci) and" in without
    assert "(install pciutils" not in gpu_count.evaluate(2, no_devices)["problems"][0]["fix"]


def test_check_gpus_knows_a_host_without_lspci(tmp_path: Path, monkeypatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    doc = gpu_count.check_gpus(1, str(smi), timeout=10, lspci="lspci")
    assert "(install pciutils first: this host has no lspci)" in doc["problems"][0]["fix"]


def test_cli_usage_error_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        gpu_count.main(["--expected", "-1"])
    assert exc.value.code == 2
    assert os.path.exists(VERIFY_DIR / "gpu_count.py")


@pytest.fixture
def smi_standin(request: pytest.FixtureRequest) -> Any:
    """The nvidia_smi_standin fixture from tests/conftest.py (GPU descriptions in JSON)."""
    try:
        return request.getfixturevalue("nvidia_smi_standin")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py fixture 'nvidia_smi_standin' is not available")


@pytest.mark.parametrize(
    "description, expected, seen, ok",
    [
        ("2xA100-SXM4-80GB.json", 2, 2, True),
        ("2xA100-one-missing.json", 2, 1, False),
        ("4xRTX3090-PCIe-x8.json", 4, 4, True),
        ("4xRTX3090-PCIe-x8.json", 2, 4, False),
        (None, 2, 0, False),
    ],
)
def test_against_the_nvidia_smi_standin(
    smi_standin: Any,
    monkeypatch: pytest.MonkeyPatch,
    description: Any,
    expected: int,
    seen: int,
    ok: bool,
) -> None:
    monkeypatch.setenv("NVIDIA_STANDIN_GPUS", smi_standin.env(description)["NVIDIA_STANDIN_GPUS"])
    doc = gpu_count.check_gpus(expected, str(smi_standin.path), timeout=30, lspci=None)
    assert (doc["seen"], doc["ok"]) == (seen, ok), doc
    if seen:
        assert doc["driver_version"] == "520.61.05"
        # The stand-in prints nvidia-smi's 00000000:07:00.0; the parser gives lspci -D's form.
        assert all(d["pci_bus_id"].startswith("0000:") and len(d["pci_bus_id"]) == 12 for d in doc["devices"])
    if description == "2xA100-one-missing.json":
        assert doc["problems"][0]["cause"] == "Expected 2 GPUs, nvidia-smi sees 1 (1 missing)."
