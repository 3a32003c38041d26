"""gpu_health.py end to end, with a stand-in nvidia-smi written into tmp_path: a small Python script
that answers the two command lines the check runs, ``--query-gpu=<fields>
--format=csv,noheader,nounits`` (refusing fields it does not know, as nvidia-smi does) and ``nvlink
-s``, from a JSON file beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_health
import gpu_parsers
import pytest
from gpu_parsers import HEALTH_FIELDS

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPT = ROOT / "files" / "health" / "gpu_health.py"
# Debian 12's nvidia-smi 535.261.03 on a machine without the NVIDIA kernel module (tests/fixtures/nvidia_smi/README.md).
REAL_NO_MODULE = ROOT / "tests" / "fixtures" / "nvidia_smi" / "real-535.261.03-no-module"

STANDIN = """
import json
import sys
import time

config = json.load(open(__file__ + ".json", encoding="utf-8"))
time.sleep(config.get("sleep", 0))
args = sys.argv[1:]
if args == ["nvlink", "-s"]:
    sys.stdout.write(config["nvlink"])
    sys.exit(0)
if len(args) == 2 and args[0].startswith("--query-gpu=") and args[1] == "--format=csv,noheader,nounits":
    if config.get("fail"):
        print(config["fail"]["output"])
        sys.exit(config["fail"]["rc"])
    fields = args[0][len("--query-gpu="):].split(",")
    for field in fields:
        # Current drivers take both names of the clock fields; older ones only clocks_throttle_reasons.
        known = field.replace("clocks_throttle_reasons.", "clocks_event_reasons.")
        if known not in config["gpus"][0] or (config.get("old_driver") and field.startswith("clocks_event_reasons.")):
            print('Field "%s" is not a valid field to query.' % field)
            sys.exit(2)
    for gpu in config["gpus"]:
        print(", ".join(gpu[field.replace("clocks_throttle_reasons.", "clocks_event_reasons.")] for field in fields))
    sys.exit(0)
print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
sys.exit(2)
"""


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def real_capture(file: str) -> tuple[int, str]:
    """(exit status, stdout) of one real capture, as commands.json records it."""
    entry = json.loads((REAL_NO_MODULE / "commands.json").read_text(encoding="utf-8"))["commands"][file]
    return entry["rc"], (REAL_NO_MODULE / file).read_text(encoding="utf-8")


def real_nvidia_smi(tmp_path: Path, file: str) -> str:
    """An nvidia-smi that answers any command line with one real capture, byte for byte, and its exit status."""
    rc, _ = real_capture(file)
    path = tmp_path / "real" / "nvidia-smi"
    path.parent.mkdir(parents=True, exist_ok=True)
    answer = f"import sys\nsys.stdout.write(open({str(REAL_NO_MODULE / file)!r}).read())\nsys.exit({rc})\n"
    path.write_text(f"#!{sys.executable}\n{answer}", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def smi_config(
    query: str = "query-h100x8-healthy.csv", nvlink: str = "nvlink-s-h100x8.txt", **extra: Any
) -> dict[str, Any]:
    gpus = [dict(zip(HEALTH_FIELDS, line.split(", "))) for line in fixture_text(query).splitlines()]
    return {"gpus": gpus, "nvlink": fixture_text(nvlink), **extra}


def standin(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "bin" / "nvidia-smi"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + STANDIN, encoding="utf-8")
    path.chmod(0o755)
    Path(str(path) + ".json").write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def quiet_kernel_log(tmp_path: Path) -> str:
    """A kernel log of a healthy boot: the driver loaded, no Xid."""
    path = tmp_path / "kern.log"
    path.write_text("".join(fixture_text("kernel-dmesg.txt").splitlines(keepends=True)[:5]), encoding="utf-8")
    return str(path)


BASELINE_BUS_IDS = sorted(json.loads(fixture_text("baseline-h100x8.json"))["gpus"])


@pytest.fixture(autouse=True)
def host_beside_nvidia_smi(pci_devices: Any, systemctl: Any) -> None:
    """What run() passes besides nvidia-smi, in tmp_path: the PCI bus with the baseline's 8 GPUs and
    an active nvidia-fabricmanager (the baseline's GPUs expect it)."""
    pci_devices(BASELINE_BUS_IDS)
    systemctl("active")


def test_a_host_without_a_baseline_yet_is_judged_on_the_rest(tmp_path: Path) -> None:
    """Not verified yet: the count and the bus wait for the baseline, the other checks run."""
    done, _ = run(tmp_path, smi_config(), "--baseline", str(tmp_path / "none.json"), "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert {"gpus", "pci"} & set(report["checks"]) == set()
    assert "has not passed a verification" in report["skipped"]["gpus"]
    assert {"nvidia_smi", "ecc", "xid", "persistence"} <= set(report["checks"])


def run(
    tmp_path: Path, config: dict[str, Any], *extra: str, kernel_log: str | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    argv = [
        sys.executable,
        str(SCRIPT),
        "--nvidia-smi",
        standin(tmp_path, config),
        "--baseline",
        str(FIXTURES / "baseline-h100x8.json"),
        "--state",
        str(tmp_path / "state" / "state.json"),
        "--textfile",
        str(tmp_path / "textfile" / "gpu_fleet_health.prom"),
        "--kernel-log",
        kernel_log or quiet_kernel_log(tmp_path),
        "--proc-version",
        str(FIXTURES / "proc-driver-nvidia-version.txt"),
        "--pci-devices",
        str(tmp_path / "pci-devices"),
        "--systemctl",
        str(tmp_path / "bin" / "systemctl"),
        *extra,
    ]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    return done, time.monotonic() - started


def metrics(tmp_path: Path) -> str:
    return (tmp_path / "textfile" / "gpu_fleet_health.prom").read_text(encoding="utf-8")


def test_healthy_host_exits_0_with_no_finding(tmp_path: Path, metrics_problems: Any) -> None:
    done, _ = run(tmp_path, smi_config())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("gpu_health: healthy: 8 GPU(s), driver 550.54.15, 0 Xid event(s)")
    text = metrics(tmp_path)
    assert metrics_problems(text) == []
    assert "gpu_fleet_health_up 1" in text.splitlines()
    assert "gpu_fleet_health_finding" not in text
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == ["gpu_fleet_health.prom"]  # no temporary left
    state = json.loads((tmp_path / "state" / "state.json").read_text(encoding="utf-8"))
    assert gpu_health.read_state(str(tmp_path / "state" / "state.json")) == state["last_check_epoch"]


def test_a_faulty_host_exits_1_with_the_findings(tmp_path: Path, metrics_problems: Any) -> None:
    config = smi_config("query-h100x8-faults.csv", "nvlink-s-h100x8-link-down.txt")
    done, _ = run(tmp_path, config, "--format", "json", kernel_log=str(FIXTURES / "kernel-dmesg.txt"))
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["up"] is True and report["healthy"] is False and report["exit_code"] == 1
    assert {item["check"] for item in report["findings"]} == {
        "gpus",
        "pci",
        "pcie",
        "nvlink",
        "ecc",
        "xid",
        "clocks",
        "persistence",
    }
    assert report["checks"]["driver"] is True and report["skipped"] == {}
    (pci,) = [item for item in report["findings"] if item["check"] == "pci"]  # GPU 7 fell off the bus: still in sysfs
    assert pci["bus_id"] == "0000:db:00.0" and "on the PCI bus but nvidia-smi does not list it" in pci["cause"]
    text = metrics(tmp_path)
    assert metrics_problems(text) == []
    assert 'gpu_fleet_health_finding{check="gpus",bus_id="0000:db:00.0"} 1' in text
    assert 'gpu_fleet_health_finding{check="nvlink",bus_id="0000:5d:00.0"} 1' in text
    assert 'gpu_fleet_health_finding{check="xid",bus_id="0000:db:00.0"} 1' in text
    assert 'gpu_fleet_health_check_ok{check="ecc"} 0' in text


def test_a_hanging_nvidia_smi_is_a_finding_within_the_timeout(tmp_path: Path, metrics_problems: Any) -> None:
    done, elapsed = run(tmp_path, smi_config(sleep=60), "--timeout", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"
    assert "[nvidia_smi]" in done.stdout and "did not answer within 1 s and was killed" in done.stdout
    text = metrics(tmp_path)
    assert metrics_problems(text) == []
    assert "gpu_fleet_health_up 1" in text.splitlines()
    assert 'gpu_fleet_health_finding{check="nvidia_smi",bus_id=""} 1' in text.splitlines()
    assert not (tmp_path / "state" / "state.json").exists()  # the kernel log was not read: read it next time


def test_a_driver_before_clocks_event_reasons_is_asked_with_the_old_names(tmp_path: Path) -> None:
    done, _ = run(tmp_path, smi_config(old_driver=True))
    assert done.returncode == 0, done.stdout + done.stderr


def without_fields(config: dict[str, Any], *prefixes: str) -> dict[str, Any]:
    """``config`` with an nvidia-smi that does not know the fields starting with ``prefixes``."""
    gpus = [{field: value for field, value in gpu.items() if not field.startswith(prefixes)} for gpu in config["gpus"]]
    return {**config, "gpus": gpus}


ECC_AND_CLOCKS = ("ecc.", "retired_pages.", "remapped_rows.", "clocks_event_reasons.")


def test_a_driver_that_knows_no_ecc_or_clock_fields_is_judged_on_the_rest(tmp_path: Path) -> None:
    """An nvidia-smi that knows none of the ECC, page-retirement, row-remapping and clock fields (an older
    driver, or the previous release's stand-in on a host upgraded in place): those two checks are skipped,
    naming the fields, and the others judge the host, here with a finding, the persistence mode off."""
    config = without_fields(smi_config(old_driver=True), *ECC_AND_CLOCKS)
    config["gpus"][0]["persistence_mode"] = "Disabled"
    done, _ = run(tmp_path, config, "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert {"ecc", "clocks"} & set(report["checks"]) == set()
    assert report["skipped"]["ecc"].startswith("nvidia-smi of driver ")
    assert "does not know the fields ecc.errors.uncorrected.volatile" in report["skipped"]["ecc"]
    assert report["skipped"]["ecc"].endswith("the check did not run")
    assert "clocks_throttle_reasons.hw_slowdown" in report["skipped"]["clocks"]
    assert [finding["check"] for finding in report["findings"]] == ["persistence"]
    assert 'gpu_fleet_health_check_skipped{check="ecc"} 1' in metrics(tmp_path).splitlines()


def test_a_field_the_driver_does_not_know_is_not_judged_and_the_check_runs(tmp_path: Path) -> None:
    """Only the row-remapping fields unknown (drivers before them): the ecc check still judges the counts."""
    config = without_fields(smi_config(), "remapped_rows.")
    config["gpus"][1]["ecc.errors.uncorrected.volatile.total"] = "3"
    done, _ = run(tmp_path, config, "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["skipped"]["ecc"].startswith("partly:"), done.stdout
    assert "ecc" in report["checks"]
    assert [finding["check"] for finding in report["findings"]] == ["ecc"]


def test_a_driver_that_does_not_know_a_field_naming_the_gpu_could_not_check(tmp_path: Path) -> None:
    done, _ = run(tmp_path, without_fields(smi_config(), "uuid"))
    assert done.returncode == 2 and 'Field "uuid" is not a valid field to query.' in done.stdout, done.stdout


def test_a_driver_library_mismatch_is_unhealthy(tmp_path: Path) -> None:
    output = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.90"
    done, _ = run(tmp_path, smi_config(fail={"rc": 18, "output": output}), "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert set(report["checks"]) == {"fabric_manager", "xid", "driver"}  # no GPU list: nvidia_smi not judged
    (mismatch,) = [item for item in report["findings"] if "differ" in item["cause"]]
    assert "(550.90) and the loaded kernel module (550.54.15)" in mismatch["cause"]


@pytest.mark.parametrize(
    ("config", "extra", "expected"),
    [
        (
            {"fail": dict(zip(("rc", "output"), real_capture("query-gpu-health.txt")))},
            [],
            "exit status 9 (NVIDIA kernel module not loaded): NVIDIA-SMI has failed because it couldn't",
        ),
        ({}, ["--baseline", "/"], "The baseline / could not be read"),
    ],
)
def test_could_not_check_exits_2(tmp_path: Path, config: dict[str, Any], extra: list[str], expected: str) -> None:
    done, _ = run(tmp_path, {**smi_config(), **config}, *extra)
    assert done.returncode == 2 and expected in done.stdout, done.stdout + done.stderr
    assert "gpu_fleet_health_up 0" in metrics(tmp_path)
    if "fail" in config:  # the fix covers a host and a container, whichever this test runs in
        (fix,) = [line for line in done.stdout.splitlines() if line.startswith("  Fix: ")]
        assert fix == "  Fix: " + gpu_parsers.module_not_loaded_fix(gpu_parsers.in_container())


@pytest.mark.parametrize("container", [False, True])
def test_exit_9_is_the_kernel_module_not_loaded(tmp_path: Path, container: bool) -> None:
    """The real answer to the health query where no kernel module is loaded, with gpu_parsers' words and fix
    (the preflight module's and the verification's); the container's steps first where a marker file exists."""
    marker = tmp_path / "containerenv"
    if container:
        marker.write_text("", encoding="utf-8")
    nvidia_smi = real_nvidia_smi(tmp_path, "query-gpu-health.txt")
    with pytest.raises(gpu_health.CouldNotCheck) as caught:
        gpu_health.query_gpus(nvidia_smi, 30.0, markers=[str(marker)])
    # The field list is counted, not quoted: the 19 names made a cause of about 600 characters.
    command = f"{nvidia_smi} --query-gpu=<{len(HEALTH_FIELDS)} health fields> --format=csv,noheader,nounits"
    assert caught.value.cause == (
        f"`{command}` failed with exit status 9 (NVIDIA kernel module not loaded): NVIDIA-SMI has failed because "
        "it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
    )
    assert caught.value.fix == gpu_parsers.module_not_loaded_fix(container)
    host_step, container_step = (
        caught.value.fix.index("`modprobe nvidia`"),
        caught.value.fix.index("nvidia.com/gpu=all"),
    )
    assert (container_step < host_step) is container


def test_another_failure_keeps_the_general_fix(tmp_path: Path) -> None:
    """The real answer without libnvidia-ml (exit 12) is not exit 9's: run it by hand."""
    nvidia_smi = real_nvidia_smi(tmp_path, "no-libnvidia-ml/query-gpu-health.txt")
    with pytest.raises(gpu_health.CouldNotCheck) as caught:
        gpu_health.query_gpus(nvidia_smi, 30.0, markers=[])
    assert "failed with exit status 12: NVIDIA-SMI couldn't find libnvidia-ml.so library" in caught.value.cause
    assert "kernel module" not in caught.value.cause
    assert caught.value.fix == gpu_health.FIX_NVIDIA_SMI_FAILED


def test_missing_nvidia_smi_exits_2(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        str(SCRIPT),
        "--nvidia-smi",
        str(tmp_path / "absent"),
        "--baseline",
        str(FIXTURES / "baseline-h100x8.json"),
    ]
    done = subprocess.run(
        [*argv, "--state", "", "--kernel-log", quiet_kernel_log(tmp_path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "Could not run nvidia-smi" in done.stdout


def test_help_is_man_style_and_runs_from_a_clone_without_pythonpath() -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    for section in ("DESCRIPTION", "OPTIONS", "EXIT STATUS", "FILES", "SEE ALSO"):
        assert f"\n{section}" in done.stdout, section
    assert "--timeout SECONDS" in done.stdout and "(default: 20)" in done.stdout


def test_run_command_kills_the_whole_process_group() -> None:
    started = time.monotonic()
    with pytest.raises(gpu_health.CommandTimeout):
        gpu_health.run_command(["sh", "-c", "sleep 60 & sleep 60; wait"], 0.5)
    assert time.monotonic() - started < 5


def write_command(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!{sys.executable}\nimport sys\n{body}\n", encoding="utf-8")
    (folder / name).chmod(0o755)


def test_the_kernel_log_comes_from_journalctl_since_the_last_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = FIXTURES / "kernel-journal-short-monotonic.txt"
    body = f"open({str(tmp_path / 'args')!r}, 'w').write(' '.join(sys.argv[1:]))\nsys.stdout.write(open({str(log)!r}).read())"
    write_command(tmp_path / "bin", "journalctl", body)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    events = gpu_health.read_kernel_log(None, 1717171717.9, 5)
    assert (tmp_path / "args").read_text() == "-k --since @1717171717 -o short-monotonic --no-pager"
    assert [event["xid"] for event in events] == [119, 154]
    gpu_health.read_kernel_log(None, None, 5)
    assert (tmp_path / "args").read_text() == "-k -b -o short-monotonic --no-pager"


def test_dmesg_when_journalctl_fails_keeps_the_lines_after_the_last_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_command(tmp_path / "bin", "journalctl", "sys.exit(1)")
    write_command(tmp_path / "bin", "dmesg", f"sys.stdout.write(open({str(FIXTURES / 'kernel-dmesg.txt')!r}).read())")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpu_health, "boot_epoch", lambda: 1_000_000.0)
    events = gpu_health.read_kernel_log(None, 1_000_000.0 + 10_000, 5)
    assert [event["xid"] for event in events] == [79]
    assert len(gpu_health.read_kernel_log(None, None, 5)) == 5


def test_no_kernel_log_at_all_could_not_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_command(tmp_path / "bin", "journalctl", "sys.exit(1)")
    write_command(tmp_path / "bin", "dmesg", "sys.exit(1)")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(gpu_health.CouldNotCheck, match="kernel log could not be read"):
        gpu_health.read_kernel_log(None, None, 5)


# --- looks that leave the Xids, changes made on purpose, fields a driver does not know -----------------------------

# The options the installed command passes on its own (roles/gpu_health/templates/gpu-health.sh.j2): by hand it only
# looks; the timer's unit adds --record after them (gpu-health.service.j2), and the last of the two wins.
BY_HAND = ("--no-record",)
BY_THE_TIMER = ("--no-record", "--record")


def xid_line_now(bus: str = "0000:3a:00", xid: int = 48) -> str:
    """A kernel log line stamped now, in seconds since boot, as the kernel stamps it: after the check before it
    (which began before that one ended), before the check after it."""
    uptime = float(Path("/proc/uptime").read_text(encoding="ascii").split()[0])
    return (
        f"[{uptime:12.6f}] NVRM: Xid (PCI:{bus}): {xid}, An uncorrectable double bit error (DBE) has been detected.\n"
    )


def test_a_hand_run_between_two_timer_runs_leaves_the_xid_for_the_next_timer_run(tmp_path: Path) -> None:
    """With the script's real state and textfile: only the timer's runs move the window, so a look by hand hides
    no Xid from the alert."""
    log = quiet_kernel_log(tmp_path)
    state, textfile = tmp_path / "state" / "state.json", tmp_path / "textfile" / "gpu_fleet_health.prom"
    done, _ = run(tmp_path, smi_config(), *BY_THE_TIMER, kernel_log=log)
    assert done.returncode == 0, done.stdout + done.stderr
    recorded, metrics_before = state.read_text(encoding="utf-8"), textfile.read_text(encoding="utf-8")
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(xid_line_now())
    done, _ = run(tmp_path, smi_config(), *BY_HAND, "--format", "json", kernel_log=log)
    assert done.returncode == 1, done.stdout + done.stderr
    assert [item["check"] for item in json.loads(done.stdout)["findings"]] == ["xid"]
    assert state.read_text(encoding="utf-8") == recorded  # the window stays where the timer left it
    assert textfile.read_text(encoding="utf-8") == metrics_before
    done, _ = run(tmp_path, smi_config(), *BY_HAND, kernel_log=log)
    assert "looked only, --no-record" in done.stdout
    done, _ = run(tmp_path, smi_config(), *BY_THE_TIMER, "--format", "json", kernel_log=log)
    assert done.returncode == 1, done.stdout + done.stderr
    (found,) = json.loads(done.stdout)["findings"]
    assert found["check"] == "xid" and "Xid 48" in found["cause"]
    assert 'gpu_fleet_health_xid_events{bus_id="0000:3a:00.0",xid="48"} 1' in metrics(tmp_path)
    done, _ = run(tmp_path, smi_config(), *BY_THE_TIMER, kernel_log=log)
    assert done.returncode == 0, done.stdout  # the timer's run took it: the next one reads after it


def baseline_with(tmp_path: Path, **changes: Any) -> str:
    document = {**json.loads(fixture_text("baseline-h100x8.json")), **changes}
    path = tmp_path / "baseline-changed.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def intended(driver: str | None = None, stacks: tuple[str, ...] = (), removed: tuple[str, ...] = ()) -> str:
    return json.dumps({"driver_version": driver, "stacks": list(stacks), "removed_stacks": list(removed)})


def test_a_driver_the_run_re_pinned_is_moved_not_drift(tmp_path: Path) -> None:
    """In the run that moved the pin 535.104.05 -> 550.54.15 on purpose, the host is healthy and the
    report says what moved; without the run's pins (the timer) the same host is judged against the baseline."""
    old_pin = baseline_with(tmp_path, driver_version="535.104.05")
    done, _ = run(tmp_path, smi_config(), "--baseline", old_pin, "--format", "json")
    assert done.returncode == 1 and "pins 535.104.05" in json.loads(done.stdout)["findings"][0]["cause"]
    re_pinned = ("--baseline", old_pin, "--intended", intended("550.54.15", ("tf-2.12",)))
    done, _ = run(tmp_path, smi_config(), *re_pinned, "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["findings"] == [] and report["checks"]["driver"] is True
    assert report["moved"] == [
        {"what": "driver", "from": "535.104.05", "to": "550.54.15", "text": "driver 535.104.05 -> 550.54.15"},
        {"what": "stack", "from": "tf-2.12", "to": None, "text": "stack tf-2.12 added"},
    ]
    done, _ = run(tmp_path, smi_config(), *re_pinned)
    assert done.stdout.startswith("gpu_health: healthy: 8 GPU(s)")
    assert "[moved] moved on purpose by this run" in done.stdout and "driver 535.104.05 -> 550.54.15" in done.stdout


def test_a_driver_neither_pinned_nor_intended_is_still_drift(tmp_path: Path) -> None:
    intent = ("--intended", intended("555.42.06"))
    done, _ = run(tmp_path, smi_config(), "--baseline", baseline_with(tmp_path, driver_version="535.104.05"), *intent)
    assert done.returncode == 1 and "Driver 550.54.15 is loaded; the baseline" in done.stdout, done.stdout
    # The run pins a driver it has not installed yet (verify.yml alone after an inventory change): the baseline's
    # driver is no drift, and the verification names the difference.
    done, _ = run(tmp_path, smi_config(), *intent, "--format", "json")
    assert done.returncode == 0 and json.loads(done.stdout)["moved"] == [], done.stdout


def test_a_stack_the_run_removes_is_not_judged(tmp_path: Path) -> None:
    gone = {"old": {"venv": str(tmp_path / "no-such-venv")}}
    baseline = baseline_with(tmp_path, stacks=gone)
    done, _ = run(tmp_path, smi_config(), "--baseline", baseline, "--format", "json")
    assert done.returncode == 1 and [item["check"] for item in json.loads(done.stdout)["findings"]] == ["venv"]
    done, _ = run(
        tmp_path, smi_config(), "--baseline", baseline, "--intended", intended(removed=("old",)), "--format", "json"
    )
    report = json.loads(done.stdout)
    assert (done.returncode, report["findings"]) == (0, []), done.stdout
    assert [item["text"] for item in report["moved"]] == ["stack old removed"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("[]", "not an object"),
        ('{"driver_version": "new"}', "not a driver version"),
        ('{"stacks": "a"}', "stack names"),
    ],
)
def test_a_bad_intent_is_a_usage_error(tmp_path: Path, value: str, words: str) -> None:
    done, _ = run(tmp_path, smi_config(), "--intended", value)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_a_field_the_driver_does_not_know_degrades_its_check_only(tmp_path: Path) -> None:
    """535.261.03's --help-query-gpu lacks the remapped_rows fields (tests/fixtures/nvidia_smi/): a driver that
    rejects them leaves those two unjudged, named, and the rest of the check runs."""
    config = smi_config()
    for gpu in config["gpus"]:
        del gpu["remapped_rows.pending"], gpu["remapped_rows.failure"]
    done, _ = run(tmp_path, config, "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["checks"]["ecc"] is True and report["up"] is True
    assert report["skipped"] == {
        "ecc": "partly: nvidia-smi of driver 550.54.15 does not know the fields remapped_rows.pending, "
        "remapped_rows.failure, so rows pending remapping, row remapping failures are not judged; the rest of the "
        "check ran"
    }
    assert all(row["remapped_rows_pending"] is None for row in report["gpus"])
    assert 'gpu_fleet_health_check_skipped{check="ecc"} 1' in metrics(tmp_path)


def test_an_identity_field_the_driver_does_not_know_is_named_in_short(tmp_path: Path) -> None:
    config = smi_config()
    for gpu in config["gpus"]:
        del gpu["uuid"]
    done, _ = run(tmp_path, config, "--format", "json")
    assert done.returncode == 2, done.stdout + done.stderr
    cause = json.loads(done.stdout)["error"]["cause"]
    assert cause.startswith("nvidia-smi does not know the field uuid, which the check needs to list the GPUs")
    assert len(cause) < 200 and "pci.bus_id" not in cause, cause


def test_a_hang_names_the_kernel_log_the_check_reads(tmp_path: Path) -> None:
    """Told to read a kernel log file, the fix names it, not `journalctl -k` (which such a host may not have)."""
    log = quiet_kernel_log(tmp_path)
    done, _ = run(tmp_path, smi_config(sleep=60), "--timeout", "1", "--format", "json", kernel_log=log)
    (found,) = json.loads(done.stdout)["findings"]
    assert f"look for Xid 79, 119 or 120 in the kernel log {log}, then" in found["fix"], found["fix"]
    assert "journalctl" not in found["fix"]
    assert "<19 health fields>" in found["cause"] and len(found["cause"]) < 250, found["cause"]


def test_a_kernel_log_file_that_cannot_be_read_names_the_file_the_variable_and_why(tmp_path: Path) -> None:
    """The message names the file, the role's variable and the reason, and its fix the variable."""
    missing = str(tmp_path / "no-kern.log")
    done, _ = run(tmp_path, smi_config(), "--format", "json", kernel_log=missing)
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["cause"] == (
        f"The kernel log {missing} (--kernel-log; the role's gpu_health_kernel_log) could not be read "
        "(No such file or directory)."
    )
    assert error["fix"].startswith("Set gpu_health_kernel_log to the file this host's syslog writes kernel lines to")
    assert "leave it empty for the journal (journalctl -k, else dmesg)" in error["fix"]


def test_nothing_moves_before_a_baseline_is_recorded(tmp_path: Path) -> None:
    intent = ("--intended", intended("550.54.15", ("tf-2.12",)))
    done, _ = run(tmp_path, smi_config(), "--baseline", str(tmp_path / "none.json"), *intent, "--format", "json")
    assert done.returncode == 0 and json.loads(done.stdout)["moved"] == [], done.stdout
