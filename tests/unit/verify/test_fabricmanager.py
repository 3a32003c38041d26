"""fabricmanager.py: NVIDIA's fabric manager on NVSwitch hosts (running, at the driver's version)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))

import fabricmanager
import gpu_verify


def test_a_host_without_nvswitches_needs_none() -> None:
    assert fabricmanager.fabricmanager_problems(False, False, None, "535.104.05") == []
    assert fabricmanager.check(False, "535.104.05")["problems"] == []


def test_nvswitch_host_without_a_running_fabric_manager() -> None:
    (found,) = fabricmanager.fabricmanager_problems(True, False, None, "535.104.05")
    assert found["check"] == "fabricmanager"
    assert "has NVSwitches" in found["cause"] and "not running" in found["cause"] and "error 802" in found["cause"]
    assert found["fix"].startswith("Start it (`systemctl enable --now nvidia-fabricmanager`")


def test_fabric_manager_of_another_version() -> None:
    (found,) = fabricmanager.fabricmanager_problems(True, True, "535.86.10", "535.104.05")
    assert found["cause"].startswith("The fabric manager is version 535.86.10 and the driver 535.104.05")
    assert found["fix"].startswith("Install the fabric manager package of driver 535.104.05")


def test_matching_fabric_manager_passes() -> None:
    assert fabricmanager.fabricmanager_problems(True, True, "535.104.05", "535.104.05") == []


@pytest.mark.parametrize(
    "text, version",
    [
        ("Fabric Manager version is : 535.104.05\n", "535.104.05"),
        ("nv-fabricmanager version 550.54.15", "550.54.15"),
        ("usage: nv-fabricmanager [options]", None),
        ("", None),
    ],
)
def test_version_output(text: str, version: str | None) -> None:
    assert fabricmanager.parse_version(text) == version


def test_running_is_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "comm").write_text("bash\n")
    (tmp_path / "self").mkdir()
    assert not fabricmanager.is_running(str(tmp_path))
    (tmp_path / "40").mkdir()
    (tmp_path / "40" / "comm").write_text("nv-fabricmanager\n")
    assert fabricmanager.is_running(str(tmp_path))


def test_missing_binary_on_an_nvswitch_host_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fabricmanager, "is_running", lambda proc="/proc": False)
    result = fabricmanager.check(True, "535.104.05", binary="/nonexistent/nv-fabricmanager")
    assert (result["running"], result["version"]) == (False, None)
    assert [p["check"] for p in result["problems"]] == ["fabricmanager"]


def test_gpu_verify_takes_the_option() -> None:
    args = gpu_verify.build_parser().parse_args(["--expected-gpus", "8", "--expect-fabricmanager"])
    assert args.expect_fabricmanager
    assert not gpu_verify.build_parser().parse_args(["--expected-gpus", "8"]).expect_fabricmanager
