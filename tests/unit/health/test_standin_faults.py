"""gpu_health.py against the nvidia-smi stand-in of tests/fixtures/nvidia and the fault knobs of its GPU
description (tests/fixtures/nvidia/README.md, "Fault knobs"): the default 2x A100 host passes, each
injected fault fails with a finding of its check that names it, and a hanging nvidia-smi is killed.

Each fault is the healthy description with one change; the baseline is always the healthy host's, as
the verification would have written it. The stand-in of driver 520.61.05 knows only the
clocks_throttle_reasons.* names, so the check's fallback query runs there; 535.104.05 takes both."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from gpu_parsers import (
    HEALTH_FIELDS,
    HEALTH_FIELDS_THROTTLE_NAMES,
    memory_error_details,
    parse_health_query,
    parse_query_details,
)
from helpers import NVIDIA_FIXTURES, load_builder

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "files" / "health" / "gpu_health.py"
KERNEL_LOGS = NVIDIA_FIXTURES / "kernel-log"
HEALTHY: dict[str, Any] = json.loads((NVIDIA_FIXTURES / "gpus" / "2xA100-SXM4-80GB.json").read_text(encoding="utf-8"))
GPU0, GPU1 = "0000:07:00.0", "0000:0f:00.0"
OLD_DRIVER, NEW_DRIVER = "520.61.05", "535.104.05"
CUDA_API = {OLD_DRIVER: 11080, NEW_DRIVER: 12020}


class Fault(NamedTuple):
    """One injected fault: knobs for GPU 1 (``0f:00.0``) and the top level, and what the check must say."""

    name: str
    gpu1: dict[str, Any]
    check: str
    bus_id: str | None
    cause: tuple[str, ...]  # words the finding's cause contains
    metric: str  # a sample line of the textfile ({nvml}: the driver's major.minor)
    top: dict[str, Any] | None = None
    kernel_log: str = "healthy.txt"
    also: frozenset[str] = frozenset()  # other checks this fault trips, as on a real host


def clock_fault(reason: str, words: str) -> Fault:
    metric = f'gpu_fleet_health_clocks_event_active{{bus_id="{GPU1}",reason="{reason}"}} 1'
    return Fault(f"clocks-{reason}", {"clocks_event_reasons": [reason]}, "clocks", GPU1, (words,), metric)


FAULTS = [
    # The peer's 12 links to the missing GPU go down with it.
    Fault(
        "gpu-gone",
        {"visible": False},
        "gpus",
        GPU1,
        ("missing", "1 of 2"),
        f'gpu_fleet_health_gpu_present{{bus_id="{GPU1}"}} 0',
        also=frozenset({"nvlink"}),
    ),
    Fault(
        "pcie-x8",
        {"pcie_link_width_current": 8},
        "pcie",
        GPU1,
        ("x8", "x16"),
        f'gpu_fleet_health_pcie_link_width{{bus_id="{GPU1}"}} 8',
    ),
    Fault(
        "persistence-off",
        {"persistence_mode": "Disabled"},
        "persistence",
        GPU1,
        ("Persistence mode is off",),
        f'gpu_fleet_health_persistence_mode{{bus_id="{GPU1}"}} 0',
    ),
    Fault(
        "driver-module-mismatch",
        {},
        "driver",
        None,
        ("515.65.01", "differ"),
        'gpu_fleet_health_driver_info{user_space="{nvml}",kernel_module="515.65.01",baseline="{driver}"} 1',
        top={"kernel_module_version": "515.65.01"},
    ),
    Fault(
        "ecc-uncorrected-volatile",
        {"ecc_uncorrected_volatile": 2},
        "ecc",
        GPU1,
        ("2 uncorrectable ECC errors since the driver loaded",),
        f'gpu_fleet_health_ecc_uncorrected_volatile_errors_total{{bus_id="{GPU1}"}} 2',
    ),
    Fault(
        "ecc-uncorrected-aggregate",
        {"ecc_uncorrected_aggregate": 14},
        "ecc",
        GPU1,
        ("14 uncorrectable ECC errors over its life",),
        f'gpu_fleet_health_ecc_uncorrected_aggregate_errors_total{{bus_id="{GPU1}"}} 14',
    ),
    Fault(
        "retired-pages-pending",
        {"retired_pages_pending": "Yes"},
        "ecc",
        GPU1,
        ("pages pending retirement",),
        f'gpu_fleet_health_retired_pages_pending{{bus_id="{GPU1}"}} 1',
    ),
    Fault(
        "remapped-rows-pending",
        {"remapped_rows_pending": "Yes"},
        "ecc",
        GPU1,
        ("rows pending remapping",),
        f'gpu_fleet_health_remapped_rows_pending{{bus_id="{GPU1}"}} 1',
    ),
    Fault(
        "remapped-rows-failure",
        {"remapped_rows_failure": "Yes"},
        "ecc",
        GPU1,
        ("row remapping failed",),
        f'gpu_fleet_health_remapped_rows_failure{{bus_id="{GPU1}"}} 1',
    ),
    clock_fault("hw_slowdown", "hardware slowdown"),
    clock_fault("hw_thermal_slowdown", "hardware thermal slowdown"),
    clock_fault("sw_thermal_slowdown", "software thermal slowdown"),
    clock_fault("hw_power_brake_slowdown", "hardware power brake"),
    Fault(
        "nvlink-2-down",
        {"nvlink_down": 2},
        "nvlink",
        GPU1,
        ("10 of 12 NVLinks", "link 10, link 11"),
        f'gpu_fleet_health_nvlink_active_links{{bus_id="{GPU1}"}} 10',
    ),
    Fault(
        "xid-79-fallen-off-the-bus",
        {},
        "xid",
        GPU1,
        ("Xid 79", "fallen off the bus"),
        f'gpu_fleet_health_xid_events{{bus_id="{GPU1}",xid="79"}} 1',
        kernel_log="xid-48-79.txt",
    ),
    Fault(
        "xid-48-double-bit-ecc",
        {},
        "xid",
        GPU0,
        ("Xid 48", "double bit"),
        f'gpu_fleet_health_xid_events{{bus_id="{GPU0}",xid="48"}} 1',
        kernel_log="xid-48-79.txt",
    ),
]
FAULT_CASES = [pytest.param(fault, OLD_DRIVER, id=fault.name) for fault in FAULTS] + [
    pytest.param(fault, NEW_DRIVER, id=f"{fault.name}-{NEW_DRIVER}") for fault in FAULTS if fault.check == "clocks"
]


class Run(NamedTuple):
    rc: int
    report: dict[str, Any]
    metrics: str
    seconds: float


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The nvidia-smi stand-in of each driver, run by this interpreter (not whatever python3 is on PATH)."""
    builder, folder = load_builder(), tmp_path_factory.mktemp("nvidia-smi")
    paths = {}
    for driver, api in CUDA_API.items():
        path = folder / f"nvidia-smi-{driver}"
        text = builder.render_nvidia_smi(driver, api)
        path.write_text(f"#!{sys.executable}\n" + text.split("\n", 1)[1], encoding="utf-8")
        path.chmod(0o755)
        paths[driver] = path
    return paths


def with_knobs(gpu1: dict[str, Any], top: dict[str, Any] | None = None) -> dict[str, Any]:
    """The healthy description with knobs on GPU 1 and at the top level."""
    description = copy.deepcopy(HEALTHY)
    description["gpus"][1].update(gpu1)
    description.update(top or {})
    return description


def nvlinks_of(description: dict[str, Any], index: int) -> int:
    pairs = (description.get("nvlink") or {}).items()
    return sum(count for pair, count in pairs if str(index) in pair.split("-"))


def baseline_of(description: dict[str, Any], driver: str) -> dict[str, Any]:
    """The baseline that a passing verification of ``description`` writes (gpu_health.py docstring)."""
    keys = ("pcie_link_gen_max", "pcie_link_width_max", "pcie_link_gen_current", "pcie_link_width_current")
    gpus = {
        gpu["pci_bus_id"]: {
            **{key: gpu[key] for key in keys},
            "nvlink_active_links": nvlinks_of(description, gpu["index"]),
            "fabric_manager_expected": False,
        }
        for gpu in description["gpus"]
    }
    return {"schema": 1, "expected_gpus": len(gpus), "driver_version": driver, "gpus": gpus}


def proc_version(module: str) -> str:
    """/proc/driver/nvidia/version of a loaded module (NVIDIA CUDA Installation Guide for Linux,
    "Verify the Driver Version"); the date is made up."""
    return (
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {module}  Thu Sep 29 05:30:25 UTC 2022\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def run_health(
    tmp_path: Path,
    smi: Path,
    description: dict[str, Any],
    driver: str,
    kernel_log: str = "healthy.txt",
    timeout: float = 20,
) -> Run:
    """Run gpu_health.py as a host runs it, against the stand-in answering from ``description``."""
    module = description.get("kernel_module_version", driver)
    textfile = tmp_path / "metrics" / "gpu_health.prom"
    argv = [
        *(sys.executable, str(SCRIPT), "--nvidia-smi", str(smi), "--format", "json", "--timeout", f"{timeout:g}"),
        *("--baseline", write(tmp_path / "baseline.json", json.dumps(baseline_of(HEALTHY, driver)))),
        *("--proc-version", write(tmp_path / "proc-version", proc_version(module))),
        *("--kernel-log", str(KERNEL_LOGS / kernel_log), "--state", str(tmp_path / "state.json")),
        *("--textfile", str(textfile)),
    ]
    env = dict(os.environ, NVIDIA_STANDIN_GPUS=write(tmp_path / "gpus.json", json.dumps(description)))
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    seconds = time.monotonic() - started
    assert done.stderr == "", done.stderr
    return Run(done.returncode, json.loads(done.stdout), textfile.read_text(encoding="utf-8"), seconds)


def finding_samples(metrics: str) -> list[str]:
    """The gpu_fleet_health_finding samples of a textfile whose value is above 0."""
    samples = [line for line in metrics.splitlines() if line.startswith("gpu_fleet_health_finding{")]
    return [line for line in samples if float(line.rsplit(" ", 1)[1]) > 0]


HEALTHY_CASES = [
    pytest.param({}, OLD_DRIVER, id=f"default-{OLD_DRIVER}"),
    pytest.param({}, NEW_DRIVER, id=f"default-{NEW_DRIVER}"),
    # An A100 remaps rows and prints [N/A] for retired_pages.pending; [N/A] is never a finding.
    pytest.param({"retired_pages_pending": "[N/A]"}, OLD_DRIVER, id="retired-pages-not-supported"),
    pytest.param(
        {"ecc_uncorrected_volatile": "[N/A]", "ecc_uncorrected_aggregate": "[N/A]"}, OLD_DRIVER, id="ecc-not-supported"
    ),
]


@pytest.mark.parametrize(("gpu1", "driver"), HEALTHY_CASES)
def test_the_healthy_host_passes(gpu1, driver, standins, tmp_path, metrics_problems):
    run = run_health(tmp_path, standins[driver], with_knobs(gpu1), driver)
    assert (run.rc, run.report["findings"]) == (0, []), run.report
    assert run.report["checks"] == dict.fromkeys(run.report["checks"], True) and len(run.report["checks"]) == 9
    assert finding_samples(run.metrics) == []
    assert "gpu_fleet_health_up 1" in run.metrics.splitlines()
    assert metrics_problems(run.metrics) == []


@pytest.mark.parametrize(("fault", "driver"), FAULT_CASES)
def test_each_fault_is_found_and_named(fault, driver, standins, tmp_path, metrics_problems):
    run = run_health(tmp_path, standins[driver], with_knobs(fault.gpu1, fault.top), driver, fault.kernel_log)
    findings = run.report["findings"]
    assert run.rc == 1, run.report
    assert {item["check"] for item in findings} == {fault.check} | fault.also, findings
    ours = [item for item in findings if item["check"] == fault.check and item["bus_id"] == fault.bus_id]
    assert any(all(word in item["cause"] for word in fault.cause) for item in ours), findings
    lines = run.metrics.splitlines()
    assert f'gpu_fleet_health_check_ok{{check="{fault.check}"}} 0' in lines
    assert f'gpu_fleet_health_finding{{check="{fault.check}",bus_id="{fault.bus_id or ""}"}} {len(ours)}' in lines
    nvml = ".".join(driver.split(".")[:2])
    assert fault.metric.replace("{nvml}", nvml).replace("{driver}", driver) in lines, run.metrics
    assert metrics_problems(run.metrics) == []


def test_a_hanging_nvidia_smi_is_killed(standins, tmp_path):
    """hang_seconds: every command waits before answering; the check gives up after --timeout, kills the
    stand-in's process group and names the hang as the finding nvidia_smi (exit 1)."""
    smi = tmp_path / "hanging-nvidia-smi"
    smi.write_bytes(standins[OLD_DRIVER].read_bytes())
    smi.chmod(0o755)
    run = run_health(tmp_path, smi, with_knobs({}, {"hang_seconds": 60}), OLD_DRIVER, timeout=1)
    assert run.rc == 1 and run.seconds < 10, run
    (found,) = run.report["findings"]
    assert found["check"] == "nvidia_smi" and "did not answer within 1 s and was killed" in found["cause"]
    assert "gpu_fleet_health_up 1" in run.metrics.splitlines()
    assert finding_samples(run.metrics) == ['gpu_fleet_health_finding{check="nvidia_smi",bus_id=""} 1']
    assert not still_running(smi), "the hanging stand-in outlived the check"


def still_running(program: Path) -> bool:
    """Whether a process runs ``program`` (its path is in the command line)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(program).encode() in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


# -- the stand-in itself ------------------------------------------------------------------------------


def smi(standins: dict[str, Path], driver: str, description: dict[str, Any], tmp_path: Path, *args: str):
    env = dict(os.environ, NVIDIA_STANDIN_GPUS=write(tmp_path / "gpus.json", json.dumps(description)))
    return subprocess.run([str(standins[driver]), *args], env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("driver", "fields", "header"),
    [
        pytest.param(OLD_DRIVER, HEALTH_FIELDS_THROTTLE_NAMES, "clocks_throttle_reasons", id="old-throttle-names"),
        pytest.param(NEW_DRIVER, HEALTH_FIELDS, "clocks_event_reasons", id="new-event-names"),
        pytest.param(NEW_DRIVER, HEALTH_FIELDS_THROTTLE_NAMES, "clocks_event_reasons", id="new-throttle-aliases"),
    ],
)
def test_the_standin_answers_every_health_field(driver, fields, header, standins, tmp_path):
    knobs = {
        "ecc_uncorrected_volatile": "[N/A]",
        "remapped_rows_failure": "Yes",
        "clocks_event_reasons": ["hw_slowdown"],
    }
    query = "--query-gpu=" + ",".join(fields)
    done = smi(standins, driver, with_knobs(knobs), tmp_path, query, "--format=csv")
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[0].split(", ")[-1] == f"{header}.hw_power_brake_slowdown"
    rows = smi(standins, driver, with_knobs(knobs), tmp_path, query, "--format=csv,noheader,nounits").stdout
    gpu0, gpu1 = parse_health_query(rows, fields)
    assert gpu0["ecc_errors_uncorrected_volatile_total"] == 0 and gpu1["ecc_errors_uncorrected_volatile_total"] is None
    assert (gpu0["remapped_rows_failure"], gpu1["remapped_rows_failure"]) == (False, True)
    assert (gpu0["clocks_event_reasons_hw_slowdown"], gpu1["clocks_event_reasons_hw_slowdown"]) == (False, True)


def test_a_driver_before_r535_rejects_the_event_names(standins, tmp_path):
    done = smi(
        standins, OLD_DRIVER, HEALTHY, tmp_path, "--query-gpu=index,clocks_event_reasons.hw_slowdown", "--format=csv"
    )
    assert done.returncode == 2
    assert 'Field "clocks_event_reasons.hw_slowdown" is not a valid field to query.' in done.stdout


@pytest.mark.parametrize(
    "gpu1",
    [
        pytest.param({"nvlink_down": -1}, id="nvlink_down-negative"),
        pytest.param({"clocks_event_reasons": ["hw_slowdwon"]}, id="clock-reason-misspelt"),
        pytest.param({"clocks_event_reasons": "hw_slowdown"}, id="clock-reasons-not-a-list"),
        pytest.param({"remapped_rows_uncorrectable": -1}, id="remapped-rows-negative"),
        pytest.param({"retired_pages_single_bit": "2"}, id="retired-pages-not-a-number"),
    ],
)
def test_a_bad_knob_is_refused_not_taken_as_healthy(gpu1, standins, tmp_path):
    done = smi(standins, OLD_DRIVER, with_knobs(gpu1), tmp_path, "-L")
    assert done.returncode == 255 and "nvidia-smi stand-in:" in done.stdout


# -- memory error details: nvidia-smi -q, run only for the GPUs of ecc findings --------------------------------

DETAIL_ARGS = ["-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER", "-i", GPU1]
MEMORY_SECTIONS = ["ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows"]
NO_ROWS = {"correctable": None, "uncorrectable": None, "pending": None, "failure": None}
NO_PAGES = {"single_bit": None, "double_bit": None, "pending": None}
HEALTHY_A100 = {
    "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
    "retired_pages": NO_PAGES,
    "ecc_uncorrected": {"volatile": 0, "aggregate": 0},
}
# A stand-in in front of the stand-in: it appends each command line to a log (one JSON list a line), and on -q
# it answers (run), fails (fail) or does not answer (hang).
WRAPPER = """
import json, os, sys, time
args = sys.argv[1:]
with open({log!r}, "a", encoding="utf-8") as handle:
    handle.write(json.dumps(args) + "\\n")
if "-q" in args and {mode!r} == "fail":
    print("stand-in wrapper: -q fails")
    sys.exit(15)
if "-q" in args and {mode!r} == "hang":
    time.sleep(60)
os.execv({standin!r}, [{standin!r}, *args])
"""


def logging_smi(tmp_path: Path, standin: Path, mode: str = "run") -> tuple[Path, Path]:
    """The wrapper above around ``standin`` and its log."""
    path, log = tmp_path / f"nvidia-smi-{mode}", tmp_path / f"nvidia-smi-{mode}.log"
    text = WRAPPER.format(log=str(log), mode=mode, standin=str(standin))
    path.write_text(f"#!{sys.executable}\n{text}", encoding="utf-8")
    path.chmod(0o755)
    return path, log


def logged(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def ecc_causes(run: Run) -> list[str]:
    return [item["cause"] for item in run.report["findings"] if item["check"] == "ecc"]


@pytest.mark.parametrize("driver", [OLD_DRIVER, NEW_DRIVER])
def test_a_healthy_host_never_runs_query_details(driver, standins, tmp_path):
    smi_path, log = logging_smi(tmp_path, standins[driver])
    run = run_health(tmp_path, smi_path, with_knobs({}), driver)
    assert (run.rc, run.report["findings"]) == (0, [])
    commands = logged(log)
    assert commands and not [args for args in commands if "-q" in args], commands


DETAIL_CASES = [
    pytest.param(
        {"remapped_rows_pending": "Yes", "remapped_rows_uncorrectable": 3},
        ["GPU 0000:0f:00.0 has memory rows pending remapping."],
        "Remapped rows: 3 uncorrectable, 0 correctable, pending Yes, failure No. "
        "Uncorrectable ECC errors: 0 volatile, 0 aggregate.",
        id="a100-row-remap-pending",
    ),
    pytest.param(
        {"remapped_rows_failure": "Yes", "remapped_rows_uncorrectable": 8, "ecc_uncorrected_volatile": 2},
        [
            "GPU 0000:0f:00.0 has had 2 uncorrectable ECC errors since the driver loaded.",
            "A memory row remapping failed on GPU 0000:0f:00.0.",
        ],
        "Remapped rows: 8 uncorrectable, 0 correctable, pending No, failure Yes. "
        "Uncorrectable ECC errors: 2 volatile, 0 aggregate.",
        id="a100-remap-failure-and-ecc",
    ),
    pytest.param(
        {
            "compute_cap": "7.0",
            "retired_pages_pending": "Yes",
            "retired_pages_double_bit": 1,
            "ecc_uncorrected_aggregate": 1,
        },
        [
            "GPU 0000:0f:00.0 has had 1 uncorrectable ECC errors over its life (aggregate count).",
            "GPU 0000:0f:00.0 has memory pages pending retirement.",
        ],
        "Retired pages: 0 single-bit, 1 double-bit, pending Yes. Uncorrectable ECC errors: 0 volatile, 1 aggregate.",
        id="v100-page-retirement",
    ),
]


@pytest.mark.parametrize(("gpu1", "causes", "details"), DETAIL_CASES)
def test_an_ecc_finding_carries_its_gpus_memory_details(gpu1, causes, details, standins, tmp_path):
    smi_path, log = logging_smi(tmp_path, standins[NEW_DRIVER])
    run = run_health(tmp_path, smi_path, with_knobs(gpu1), NEW_DRIVER)
    assert run.rc == 1 and {item["check"] for item in run.report["findings"]} == {"ecc"}, run.report
    assert ecc_causes(run) == [f"{cause} {details}" for cause in causes]
    assert [args for args in logged(log) if "-q" in args] == [DETAIL_ARGS]  # once, for the GPU with findings


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_query_details_that_fail_or_hang_leave_the_verdict(mode, standins, tmp_path):
    """Both GPUs have a finding; -q fails (each GPU is asked) or hangs (killed after --timeout, and the second
    GPU is not asked): the findings are those of a run without details, exit status 1."""
    description = with_knobs({"remapped_rows_pending": "Yes"})
    description["gpus"][0]["remapped_rows_pending"] = "Yes"
    smi_path, log = logging_smi(tmp_path, standins[NEW_DRIVER], mode)
    run = run_health(tmp_path, smi_path, description, NEW_DRIVER, timeout=2)
    assert run.rc == 1 and run.seconds < 20, run
    assert ecc_causes(run) == [f"GPU {bus_id} has memory rows pending remapping." for bus_id in (GPU0, GPU1)]
    asked = [args[-1] for args in logged(log) if "-q" in args]
    assert asked == ([GPU0, GPU1] if mode == "fail" else [GPU0])
    assert not still_running(smi_path), "the hanging wrapper outlived the check"


def test_the_standin_answers_query_details_in_the_real_format(standins, tmp_path):
    knobs = {
        **{"remapped_rows_correctable": 1, "remapped_rows_uncorrectable": 3, "remapped_rows_pending": "Yes"},
        **{"ecc_uncorrected_volatile": 2, "ecc_uncorrected_aggregate": 5},
    }
    done = smi(standins, NEW_DRIVER, with_knobs(knobs), tmp_path, "-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER")
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[:3] == ["", "==============NVSMI LOG==============", ""]
    assert lines[4:8] == [
        f"Driver Version                            : {NEW_DRIVER}",
        "CUDA Version                              : 12.2",
        "",
        "Attached GPUs                             : 2",
    ]
    gpus = parse_query_details(done.stdout)
    assert list(gpus) == [GPU0, GPU1] and all(list(section) == MEMORY_SECTIONS for section in gpus.values())
    assert memory_error_details(gpus[GPU0]) == HEALTHY_A100
    assert memory_error_details(gpus[GPU1]) == {
        "remapped_rows": {"correctable": 1, "uncorrectable": 3, "pending": True, "failure": False},
        "retired_pages": NO_PAGES,
        "ecc_uncorrected": {"volatile": 2, "aggregate": 5},
    }
    assert gpus[GPU1]["ECC Errors"]["Volatile"]["DRAM Uncorrectable"] == "2"


@pytest.mark.parametrize(
    "gpu_id", [GPU1, "00000000:0F:00.0", "0f:00.0", "1", "GPU-fd26179c-de1f-3f6f-f298-383b36269b35"]
)
def test_the_standin_picks_a_gpu_and_types_as_nvidia_smi_does(gpu_id, standins, tmp_path):
    done = smi(standins, OLD_DRIVER, with_knobs({}), tmp_path, "-q", "--display=row_remapper", "-i", gpu_id)
    assert done.returncode == 0, done.stdout
    gpus = parse_query_details(done.stdout)
    assert list(gpus) == [GPU1] and list(gpus[GPU1]) == ["Remapped Rows"]
    assert "Attached GPUs                             : 2" in done.stdout.splitlines()


@pytest.mark.parametrize(
    ("gpu1", "expected"),
    [
        pytest.param(
            {
                "compute_cap": "7.0",
                "retired_pages_single_bit": 2,
                "retired_pages_pending": "Yes",
                "ecc_uncorrected_aggregate": 1,
            },
            {
                "remapped_rows": NO_ROWS,
                "retired_pages": {"single_bit": 2, "double_bit": 0, "pending": True},
                "ecc_uncorrected": {"volatile": 0, "aggregate": 1},
            },
            id="volta-retires-pages",
        ),
        pytest.param(
            {"compute_cap": "9.0", "ecc_uncorrected_volatile": 1},
            {**HEALTHY_A100, "ecc_uncorrected": {"volatile": 1, "aggregate": 0}},
            id="hopper",
        ),
        pytest.param(
            {"ecc_uncorrected_volatile": "[N/A]", "ecc_uncorrected_aggregate": "[N/A]"},
            {**HEALTHY_A100, "ecc_uncorrected": {"volatile": None, "aggregate": None}},
            id="ecc-off",
        ),
    ],
)
def test_the_standin_prints_each_generations_form(gpu1, expected, standins, tmp_path):
    done = smi(
        standins, NEW_DRIVER, with_knobs(gpu1), tmp_path, "-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER", "-i", "1"
    )
    section = parse_query_details(done.stdout)[GPU1]
    assert memory_error_details(section) == expected
    volatile = section["ECC Errors"]["Volatile"]
    if gpu1.get("compute_cap") == "7.0":
        assert section["Remapped Rows"] == "N/A" and volatile["Double Bit"]["Total"] == "0"
    elif gpu1.get("compute_cap") == "9.0":
        assert volatile["SRAM Uncorrectable Parity"] == volatile["SRAM Uncorrectable SEC-DED"] == "0"
    else:
        assert section["ECC Mode"] == {"Current": "N/A", "Pending": "N/A"} and volatile["DRAM Uncorrectable"] == "N/A"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(("-q", "-d", "ECC,RETIRED_PAGES"), "Invalid combination of input arguments.", id="unknown-type"),
        pytest.param(("-d", "ECC"), "Invalid combination of input arguments.", id="display-without-query"),
        pytest.param(("-q", "-d", "ECC", "-L"), "Invalid combination of input arguments.", id="query-with-list"),
        pytest.param(("-q", "-d", "MEMORY"), "nvidia-smi stand-in: -q prints only", id="type-not-modelled"),
        pytest.param(("-q",), "nvidia-smi stand-in: -q prints only", id="query-without-display"),
        pytest.param(("-q", "-d", "ECC", "-i", "0000:99:00.0"), "No devices were found matching", id="no-such-gpu"),
    ],
)
def test_the_standin_refuses_what_nvidia_smi_refuses(args, said, standins, tmp_path):
    done = smi(standins, NEW_DRIVER, with_knobs({}), tmp_path, *args)
    assert done.returncode == 2 and said in done.stdout, done.stdout
