"""gpu_health.py --record-baseline: the baseline written from a healthy host, and refused (exit 2,
nothing written) from one that is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_health
import pytest

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPT = ROOT / "files" / "health" / "gpu_health.py"
HEALTHY = (FIXTURES / "query-h100x8-healthy.csv").read_text(encoding="utf-8").splitlines()
BUS_IDS = sorted(json.loads((FIXTURES / "baseline-h100x8.json").read_text(encoding="utf-8"))["gpus"])
DRIVER = "550.54.15"  # what the query fixture and proc-driver-nvidia-version.txt say


@pytest.fixture
def record(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    nvidia_smi: Callable[..., str],
    pci_devices: Callable[[list[str]], str],
    systemctl: Callable[..., str],
) -> Callable[..., tuple[int, str]]:
    """``record(*options, query_lines=None, on_bus=BUS_IDS, fabric="active")``: gpu_health.main with
    --record-baseline against stand-ins in tmp_path; returns (exit status, stdout)."""

    def run(
        *options: str, query_lines: list[str] | None = None, on_bus: list[str] | None = None, fabric: str = "active"
    ) -> tuple[int, str]:
        argv = [
            *("--record-baseline", "--baseline", str(tmp_path / "state" / "baseline.json")),
            *("--nvidia-smi", nvidia_smi(HEALTHY if query_lines is None else query_lines)),
            *("--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt")),
            *("--pci-devices", pci_devices(BUS_IDS if on_bus is None else on_bus), "--systemctl", systemctl(fabric)),
            *options,
        ]
        code = gpu_health.main(argv)
        return code, capsys.readouterr().out

    return run


def written(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "state" / "baseline.json").read_text(encoding="utf-8"))


# --- recorded -------------------------------------------------------------------------------------


def test_a_healthy_host_records_its_baseline(tmp_path: Path, record: Any, tf_stack: Any) -> None:
    stack = tf_stack()
    code, out = record(
        *("--expected-gpus", "8", "--driver-version", DRIVER, "--fabric-manager-expected"),
        *("--stack", f"tf-2.12={stack['venv']},{stack['lock']}"),
    )
    assert code == 0, out
    document = written(tmp_path)
    assert out.splitlines()[0] == (
        f"gpu_health: baseline recorded in {tmp_path / 'state' / 'baseline.json'}: 8 GPU(s) of 8 expected, "
        f"driver {DRIVER} pinned, fabric manager expected, 1 stack(s)"
    )
    assert json.loads(out.split("\n", 1)[1]) == document
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["baseline.json"]  # no temporary left
    fixture = json.loads((FIXTURES / "baseline-h100x8.json").read_text(encoding="utf-8"))
    assert {key: document[key] for key in fixture} == fixture  # the same as the 8x H100 fixture
    assert document["schema"] == 1 and document["recorded_at"].endswith("Z")
    assert document["stacks"] == {"tf-2.12": stack}
    assert gpu_health.validate_baseline(document)["expected_gpus"] == 8


def test_the_recorded_baseline_passes_its_own_check(
    tmp_path: Path, record: Any, tf_stack: Any, nvidia_smi: Any, pci_devices: Any, systemctl: Any
) -> None:
    stack = tf_stack()
    code, out = record("--expected-gpus", "8", "--fabric-manager-expected", "--stack", f"tf={stack['venv']}")
    assert code == 0, out
    assert written(tmp_path)["stacks"] == {"tf": stack}  # the lock defaults to <venv>/tf-lock.txt
    (tmp_path / "kern.log").write_text("", encoding="utf-8")
    argv = [
        *(sys.executable, str(SCRIPT), "--baseline", str(tmp_path / "state" / "baseline.json")),
        *("--nvidia-smi", nvidia_smi(HEALTHY), "--state", "", "--kernel-log", str(tmp_path / "kern.log")),
        *("--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt"), "--format", "json"),
        *("--pci-devices", pci_devices(BUS_IDS), "--systemctl", systemctl("active")),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["findings"] == [] and report["skipped"] == {} and report["dcgm"] is None
    assert set(report["checks"]) == set(gpu_health.CHECKS) - {"dcgm"}  # DCGM's diagnostic: only with --dcgm-diag


def test_json_output_and_a_skipped_check(tmp_path: Path, record: Any) -> None:
    code, out = record("--expected-gpus", "8", "--format", "json", on_bus=[])
    assert code == 0, out
    outcome = json.loads(out)
    assert outcome["recorded"] is True and outcome["findings"] == []
    assert outcome["path"] == str(tmp_path / "state" / "baseline.json") and outcome["baseline"] == written(tmp_path)
    assert "lacks 8 of the 8 GPUs nvidia-smi lists" in outcome["skipped"]["pci"]
    assert outcome["baseline"]["driver_version"] is None and outcome["baseline"]["stacks"] == {}
    assert all(gpu["fabric_manager_expected"] is False for gpu in outcome["baseline"]["gpus"].values())


def test_an_older_baseline_is_replaced(tmp_path: Path, record: Any) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "baseline.json").write_text('{"schema": 1, "expected_gpus": 4}\n', encoding="utf-8")
    code, out = record("--expected-gpus", "8")
    assert code == 0, out
    assert written(tmp_path)["expected_gpus"] == 8


def test_the_same_baseline_is_left_as_it_is(tmp_path: Path, record: Any) -> None:
    """A converged host's verification records what the baseline already says: nothing is written."""
    code, out = record("--expected-gpus", "8", "--format", "json")
    assert (code, json.loads(out)["changed"]) == (0, True)
    path = tmp_path / "state" / "baseline.json"
    before = (path.stat().st_mtime_ns, path.read_text())
    code, out = record("--expected-gpus", "8")
    assert code == 0 and "baseline unchanged in" in out, out
    assert (path.stat().st_mtime_ns, path.read_text()) == before
    code, out = record("--expected-gpus", "8", "--driver-version", "550.54.15", "--format", "json")
    assert (code, json.loads(out)["changed"]) == (0, True), out


# --- refused --------------------------------------------------------------------------------------


def refused(tmp_path: Path, code: int, out: str) -> list[str]:
    """The refusal's lines after the head; asserts exit 2 and that nothing was written."""
    assert code == 2, out
    head, *rest = out.splitlines()
    assert head.startswith(f"gpu_health: REFUSED to record a baseline in {tmp_path / 'state' / 'baseline.json'}: ")
    assert "a baseline is only recorded from a healthy host" in head
    assert not (tmp_path / "state" / "baseline.json").exists()
    return rest


def test_fewer_gpus_than_expected_is_refused(tmp_path: Path, record: Any) -> None:
    lines = refused(tmp_path, *record("--expected-gpus", "8", query_lines=HEALTHY[:7], on_bus=BUS_IDS[:7]))
    assert lines[0] == "  [gpus] host: nvidia-smi lists 7 GPUs; --expected-gpus is 8."
    assert lines[1].startswith("      Fix: Look for Xid 79")


def test_more_gpus_than_expected_is_refused(tmp_path: Path, record: Any) -> None:
    lines = refused(tmp_path, *record("--expected-gpus", "4"))
    assert lines[0] == "  [gpus] host: nvidia-smi lists 8 GPUs; --expected-gpus is 4."


def test_a_gpu_off_the_bus_is_refused(tmp_path: Path, record: Any) -> None:
    lines = refused(tmp_path, *record("--expected-gpus", "7", query_lines=HEALTHY[:7]))
    assert lines[0].startswith(
        "  [pci] 0000:db:00.0: GPU 0000:db:00.0 is on the PCI bus but nvidia-smi does not list it"
    )


def test_an_inactive_fabric_manager_is_refused_only_when_expected(tmp_path: Path, record: Any) -> None:
    lines = refused(tmp_path, *record("--expected-gpus", "8", "--fabric-manager-expected", fabric="inactive"))
    assert lines[0].startswith("  [fabric_manager] host: The nvidia-fabricmanager service is inactive")
    code, out = record("--expected-gpus", "8", fabric="inactive")
    assert code == 0, out


def test_a_drifted_or_missing_venv_is_refused(tmp_path: Path, record: Any, tf_stack: Any) -> None:
    stack = tf_stack({"tensorflow": "2.12.1"})
    lines = refused(tmp_path, *record("--expected-gpus", "8", "--stack", f"tf={stack['venv']},{stack['lock']}"))
    assert lines[0].startswith(f"  [venv] host: The venv {stack['venv']} of stack tf differs from its lock")
    lines = refused(tmp_path, *record("--expected-gpus", "8", "--stack", f"tf={tmp_path / 'nowhere'}"))
    assert lines[0] == f"  [venv] host: Stack tf: its venv {tmp_path / 'nowhere'} is gone."


def test_another_driver_than_the_pin_is_refused(tmp_path: Path, record: Any) -> None:
    lines = refused(tmp_path, *record("--expected-gpus", "8", "--driver-version", "535.104.05"))
    assert (
        lines[0]
        == f"  [driver] host: Driver {DRIVER} is loaded; the baseline (the last passing verification) pins 535.104.05."
    )


FAULTS = (FIXTURES / "query-h100x8-faults.csv").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("index", "check", "words"),
    [
        (1, "pcie", "The PCIe link of GPU 0000:2a:00.0 runs at x8, expected x16"),
        (2, "ecc", "GPU 0000:3a:00.0 has had 2 uncorrectable ECC errors since the driver loaded."),
        (5, "persistence", "Persistence mode is off on GPU 0000:ab:00.0"),
    ],
)
def test_any_other_finding_is_refused(tmp_path: Path, record: Any, index: int, check: str, words: str) -> None:
    lines = [FAULTS[index] if number == index else line for number, line in enumerate(HEALTHY)]
    rest = refused(tmp_path, *record("--expected-gpus", "8", query_lines=lines))
    assert rest[0].startswith(f"  [{check}] ") and words in rest[0], rest


def test_refusal_in_json(tmp_path: Path, record: Any) -> None:
    code, out = record("--expected-gpus", "9", "--format", "json")
    outcome = json.loads(out)
    assert (
        code == 2
        and outcome["recorded"] is False
        and [item["check"] for item in outcome["findings"]] == ["gpus", "pci"]
    )
    assert not (tmp_path / "state" / "baseline.json").exists()


# --- could not record, usage ----------------------------------------------------------------------


def test_no_nvidia_smi_could_not_record(tmp_path: Path, record: Any) -> None:
    code, out = record("--expected-gpus", "8", "--nvidia-smi", str(tmp_path / "absent"))
    assert code == 2 and out.startswith("gpu_health: COULD NOT RECORD a baseline: Could not run nvidia-smi"), out


def test_an_unwritable_baseline_could_not_record(tmp_path: Path, record: Any) -> None:
    (tmp_path / "file").write_text("", encoding="utf-8")
    code, out = record("--expected-gpus", "8", "--baseline", str(tmp_path / "file" / "baseline.json"))
    assert code == 2 and f"The baseline {tmp_path / 'file' / 'baseline.json'} could not be written" in out, out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--record-baseline"], "--record-baseline needs --expected-gpus N"),
        (["--expected-gpus", "8"], "go with --record-baseline"),
        (["--stack", "tf=/opt/tf"], "go with --record-baseline"),
        (["--record-baseline", "--expected-gpus", "0"], "'0' is not at least 1"),
        (
            ["--record-baseline", "--expected-gpus", "8", "--driver-version", "latest"],
            "'latest' is not a driver version",
        ),
        (["--record-baseline", "--expected-gpus", "8", "--stack", "tf"], "'tf' is not NAME=VENV[,LOCK]"),
        (
            ["--record-baseline", "--expected-gpus", "8", "--stack", "tf=opt/tf"],
            "venv is 'opt/tf', not an absolute path",
        ),
        (
            ["--record-baseline", "--expected-gpus", "8", "--stack", "tf=/opt/a", "--stack", "tf=/opt/b"],
            "--stack tf is given more than once",
        ),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        gpu_health.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_help_documents_the_mode() -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("NAME\n  gpu-health - ")
    assert "\nSYNOPSIS\n  gpu-health [--baseline FILE]" in done.stdout
    assert "  gpu-health --record-baseline --expected-gpus N" in done.stdout
    for option in ("--record-baseline", "--expected-gpus N", "--driver-version V", "--fabric-manager-expected"):
        assert option in done.stdout
    assert "--stack NAME=VENV[,LOCK]" in done.stdout and "--pci-devices DIR" in done.stdout
    assert "only recorded from\n  a healthy host" in done.stdout or "only recorded from a healthy host" in done.stdout


def test_a_kept_baseline_names_the_width_the_last_verification_recorded(tmp_path: Path, record: Any) -> None:
    """Refused over a narrowed link, the note once named the width of the baseline it would write ("x8 at
    the last verification") where the last verification had recorded x16."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "baseline.json").write_text((FIXTURES / "baseline-h100x8.json").read_text(encoding="utf-8"))
    lines = [FAULTS[1] if number == 1 else line for number, line in enumerate(HEALTHY)]
    code, out = record("--expected-gpus", "8", query_lines=lines)
    rest = out.splitlines()[1:]
    assert code == 2 and "REFUSED" in out and written(tmp_path)["gpus"]["0000:2a:00.0"]["pcie_link_width_current"] == 16
    assert rest[0] == (
        "  [pcie] 0000:2a:00.0: The PCIe link of GPU 0000:2a:00.0 runs at x8, expected x16 "
        "(link maximum x16, x16 at the last verification)."
    ), rest
    (tmp_path / "state" / "baseline.json").unlink()  # no earlier verification: none named
    rest = refused(tmp_path, *record("--expected-gpus", "8", query_lines=lines))
    assert rest[0].endswith("runs at x8, expected x16 (link maximum x16)."), rest


# --- MIG devices ------------------------------------------------------------------------------------
# The MIG devices of ``nvidia-smi -L`` against the baseline's ``mig_devices`` (check gpus): recorded with
# --mig-devices from a host that lists them, refused from one that does not, and a later check that lists fewer
# finds it. Without ``mig_devices`` in the baseline nothing is counted (the other tests' nvidia-smi knows no -L).

GPU = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0c3e8a1f-52d0-4b7e-9a61-0f4d2b8e7c00)\n"
MIG = "  MIG 3g.40gb     Device  {n}: (UUID: MIG-0c3e8a1f-52d0-4b7e-9a61-0f4d2b8e000{n})\n"


def listing(tmp_path: Path, devices: int) -> None:
    """What the test nvidia-smi (tests/unit/health/conftest.py) answers to -L: one GPU with ``devices`` MIG lines."""
    (tmp_path / "smi").mkdir(exist_ok=True)
    (tmp_path / "smi" / "list.txt").write_text(GPU + "".join(MIG.format(n=n) for n in range(devices)))


def check(tmp_path: Path, nvidia_smi: Any, pci_devices: Any, systemctl: Any, capsys: Any) -> dict[str, Any]:
    (tmp_path / "kern.log").write_text("", encoding="utf-8")
    argv = [
        *("--baseline", str(tmp_path / "state" / "baseline.json"), "--state", "", "--format", "json"),
        *("--nvidia-smi", nvidia_smi(), "--kernel-log", str(tmp_path / "kern.log")),
        *("--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt")),
        *("--pci-devices", pci_devices(BUS_IDS), "--systemctl", systemctl("active")),
    ]
    gpu_health.main(argv)
    return json.loads(capsys.readouterr().out)


def test_the_mig_devices_are_recorded_and_a_missing_one_is_found(
    tmp_path, record, nvidia_smi, pci_devices, systemctl, capsys
) -> None:
    nvidia_smi()
    listing(tmp_path, 2)
    code, out = record("--expected-gpus", "8", "--fabric-manager-expected", "--mig-devices", "2")
    assert code == 0, out
    assert json.loads((tmp_path / "state" / "baseline.json").read_text())["mig_devices"] == 2
    assert check(tmp_path, nvidia_smi, pci_devices, systemctl, capsys)["findings"] == []
    listing(tmp_path, 1)
    [finding] = check(tmp_path, nvidia_smi, pci_devices, systemctl, capsys)["findings"]
    assert (
        finding["check"] == "gpus"
        and "lists 1 MIG devices; the baseline (the host's MIG layout) expects 2" in (finding["cause"])
    )
    assert "gpu_mig_layout" in finding["fix"]


def test_a_host_without_its_mig_devices_is_refused(tmp_path, record, nvidia_smi) -> None:
    nvidia_smi()
    listing(tmp_path, 0)
    code, out = record("--expected-gpus", "8", "--fabric-manager-expected", "--mig-devices", "2")
    assert code == 2 and "lists 0 MIG devices" in out
    assert not (tmp_path / "state" / "baseline.json").exists()


def test_a_baseline_with_a_bad_count_is_not_usable() -> None:
    document = {"schema": 1, "expected_gpus": 8, "gpus": {}, "mig_devices": -1}
    try:
        gpu_health.validate_baseline(document)
    except ValueError as exc:
        assert "mig_devices is -1" in str(exc)
    else:
        raise AssertionError("accepted")
    assert gpu_health.validate_baseline({**document, "mig_devices": None})["mig_devices"] is None
