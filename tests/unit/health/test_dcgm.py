"""The dcgm check of gpu_health.py (``--dcgm-diag LEVEL``): NVIDIA DCGM's diagnostic, ``dcgmi diag -r
LEVEL -j``, run under its own timeout and judged per test result.

Most tests run the check end to end on the 8x H100 host of fixtures/ (conftest's nvidia-smi) with a
small dcgmi written into tmp_path that prints a fixture of dcgmi's JSON (fixtures/README.md names the
sources of the format); the last ones run it against the dcgmi stand-in of tests/fixtures/nvidia
(dcgmi.py) and the nvidia-smi stand-in, with the stand-ins' fault knobs."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_health
import gpu_health_checks
import pytest
from gpu_parsers import parse_health_query
from helpers import NVIDIA_FIXTURES, load_builder

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPT = ROOT / "files" / "health" / "gpu_health.py"
DCGMI_STANDIN = NVIDIA_FIXTURES / "dcgmi.py"
BUS_IDS = [gpu["pci_bus_id"] for gpu in parse_health_query((FIXTURES / "query-h100x8-healthy.csv").read_text())]
BASELINE_BUS_IDS = sorted(json.loads((FIXTURES / "baseline-h100x8.json").read_text())["gpus"])

# A dcgmi that keeps its arguments beside it and answers with a file's text and an exit status.
DCGMI = """
import sys, time
open(__file__ + ".args", "w").write(" ".join(sys.argv[1:]))
time.sleep({sleep})
sys.stdout.write(open({answer!r}).read())
sys.exit({rc})
"""


def write_dcgmi(tmp_path: Path, answer: str, rc: int = 0, sleep: float = 0, name: str = "dcgmi") -> str:
    """A dcgmi in tmp_path/dcgm that prints ``answer`` (text) after ``sleep`` seconds and exits ``rc``."""
    folder = tmp_path / "dcgm"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.out").write_text(answer, encoding="utf-8")
    path = folder / name
    body = DCGMI.format(sleep=sleep, answer=str(folder / f"{name}.out"), rc=rc)
    path.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def check(tmp_path: Path, nvidia_smi: Any, pci_devices: Any, systemctl: Any) -> Any:
    """``check(*options)``: gpu_health.py on the healthy 8x H100 host -> (exit status, JSON report,
    metrics text, seconds)."""
    (tmp_path / "kern.log").write_text("", encoding="utf-8")
    argv = [
        *(sys.executable, str(SCRIPT), "--nvidia-smi", nvidia_smi(), "--format", "json", "--state", ""),
        *("--baseline", str(FIXTURES / "baseline-h100x8.json"), "--kernel-log", str(tmp_path / "kern.log")),
        *("--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt")),
        *("--pci-devices", pci_devices(BASELINE_BUS_IDS), "--systemctl", systemctl("active")),
        *("--textfile", str(tmp_path / "metrics.prom")),
    ]

    def run(*options: str) -> tuple[int, dict[str, Any], str, float]:
        started = time.monotonic()
        done = subprocess.run([*argv, *options], capture_output=True, text=True, check=False, timeout=120)
        seconds = time.monotonic() - started
        assert done.stderr == "", done.stderr
        metrics = (tmp_path / "metrics.prom").read_text(encoding="utf-8")
        return done.returncode, json.loads(done.stdout), metrics, seconds

    return run


def dcgm_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in report["findings"] if item["check"] == "dcgm"]


def test_a_passing_diagnostic(check: Any, tmp_path: Path, read_fixture: Any, metrics_problems: Any) -> None:
    dcgmi = write_dcgmi(tmp_path, read_fixture("dcgmi-diag-r2-dcgm4-h100x8-pass.json"))
    rc, report, metrics, _ = check("--dcgm-diag", "2", "--dcgmi", dcgmi)
    assert (rc, report["findings"], report["skipped"]) == (0, [], {}), report
    assert report["checks"]["dcgm"] is True and gpu_health.CHECKS[-2:] == ("venv", "dcgm")
    assert Path(dcgmi + ".args").read_text() == "diag -r 2 -j"
    assert report["dcgm"]["level"] == 2 and len(report["dcgm"]["tests"]) == 27  # 3 tests x (8 GPUs + summary)
    assert report["dcgm"]["tests"][0] == {
        "category": "Deployment",
        "test": "software",
        "result": "Pass",
        "gpu": 0,
        "info": [],
        "warnings": [],
    }
    lines = metrics.splitlines()
    assert 'gpu_fleet_health_dcgm_test_passed{test="memory",gpu="7"} 1' in lines
    assert 'gpu_fleet_health_dcgm_test_passed{test="memory",gpu=""} 1' in lines  # the test overall
    assert 'gpu_fleet_health_check_ok{check="dcgm"} 1' in lines
    assert metrics_problems(metrics) == []


def test_a_failed_test_is_a_finding_naming_gpu_and_test(check: Any, tmp_path: Path, read_fixture: Any) -> None:
    # dcgmi exits 205 (DCGM_ST_NVVS_ISOLATE_ERROR) after a failure of isolate severity; the JSON counts.
    dcgmi = write_dcgmi(tmp_path, read_fixture("dcgmi-diag-r2-dcgm4-h100x8-faults.json"), rc=205)
    rc, report, metrics, _ = check("--dcgm-diag", "2", "--dcgmi", dcgmi)
    assert rc == 1
    findings = dcgm_findings(report)
    assert [item["bus_id"] for item in findings] == [BUS_IDS[2], BUS_IDS[3]]  # the summaries add none
    pcie, memory = findings
    assert f"Integration/pcie failed on GPU 2 ({BUS_IDS[2]})" in pcie["cause"]
    assert "Detected more than 8 PCIe replays per minute for GPU 2" in pcie["cause"]
    assert "Hardware/memory failed on GPU 3" in memory["cause"] and "double-bit ECC error" in memory["cause"]
    assert "level 2" in memory["cause"]
    for word in ("Drain the host", "`dcgmi diag -r 3`", "RMA", "DCGM User Guide, Diagnostics"):
        assert word in memory["fix"], word
    lines = metrics.splitlines()
    assert 'gpu_fleet_health_dcgm_test_passed{test="pcie",gpu="2"} 0' in lines
    assert 'gpu_fleet_health_dcgm_test_passed{test="pcie",gpu="1"} 1' in lines
    assert not any('test="memory",gpu="5"' in line for line in lines)  # skipped: no sample
    assert f'gpu_fleet_health_finding{{check="dcgm",bus_id="{BUS_IDS[3]}"}} 1' in lines


def test_a_host_wide_failure_is_a_finding_of_the_host(check: Any, tmp_path: Path) -> None:
    document = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [
                        {
                            "name": "software",
                            "results": [
                                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"}
                            ],
                            "test_summary": {"status": "Fail", "warnings": [{"warning": "global", "error_id": 1}]},
                        }
                    ],
                }
            ]
        }
    }
    rc, report, _, _ = check("--dcgm-diag", "1", "--dcgmi", write_dcgmi(tmp_path, json.dumps(document), rc=226))
    (finding,) = dcgm_findings(report)
    assert rc == 1 and finding["bus_id"] is None and "Deployment/software failed on the host" in finding["cause"]
    assert "`dcgmi diag -r 3`" in finding["fix"]


def test_a_warning_is_listed_not_a_finding(check: Any, tmp_path: Path) -> None:
    document = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Stress",
                    "tests": [
                        {
                            "name": "Targeted Power",
                            "results": [
                                {"gpu_id": "0", "status": "Pass"},
                                {"gpu_id": "1", "status": "Warn", "warnings": [{"warning": "power capped"}]},
                            ],
                        }
                    ],
                }
            ]
        }
    }
    dcgmi = write_dcgmi(tmp_path, json.dumps(document))
    rc, report, metrics, _ = check("--dcgm-diag", "3", "--dcgmi", dcgmi)
    assert (rc, report["findings"], report["checks"]["dcgm"]) == (0, [], True)
    assert [entry["result"] for entry in report["dcgm"]["tests"]] == ["Pass", "Warn"]
    assert 'gpu_fleet_health_dcgm_test_passed{test="Targeted Power",gpu="1"} 1' in metrics.splitlines()
    text = subprocess.run(
        [sys.executable, str(SCRIPT), *report_argv(tmp_path, dcgmi)], capture_output=True, text=True, check=False
    ).stdout
    assert "[dcgm] dcgmi diag level 3: 2 result(s): 1 Pass, 1 Warn" in text
    assert "[dcgm] GPU 1: Warn in Stress/Targeted Power (not a finding): power capped" in text


def report_argv(tmp_path: Path, dcgmi: str) -> list[str]:
    """The check's arguments of the ``check`` fixture again, for the text report (no --format json)."""
    return [
        *("--nvidia-smi", str(tmp_path / "smi" / "nvidia-smi"), "--state", "", "--dcgm-diag", "3"),
        *("--baseline", str(FIXTURES / "baseline-h100x8.json"), "--kernel-log", str(tmp_path / "kern.log")),
        *("--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt"), "--dcgmi", dcgmi),
        *("--pci-devices", str(tmp_path / "pci-devices"), "--systemctl", str(tmp_path / "bin" / "systemctl")),
    ]


def test_without_dcgmi_the_check_is_skipped(check: Any, tmp_path: Path) -> None:
    rc, report, metrics, _ = check("--dcgm-diag", "1", "--dcgmi", str(tmp_path / "no" / "dcgmi"))
    assert (rc, report["findings"]) == (0, [])
    assert report["skipped"] == {"dcgm": "dcgmi not installed (NVIDIA DCGM)"}
    assert "dcgm" not in report["checks"] and report["dcgm"] == {"level": 1, "tests": []}
    assert 'gpu_fleet_health_check_skipped{check="dcgm"} 1' in metrics.splitlines()
    assert "gpu_fleet_health_dcgm_test_passed" not in metrics


HOSTENGINE_DOWN = (
    "Error: unable to establish a connection to the specified host: localhost\n"
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
)


@pytest.mark.parametrize(
    "answer",
    [HOSTENGINE_DOWN, "Error: Unable to start an embedded host engine. Error loading the DCGM library.\n"],
    ids=["no-connection", "no-embedded-host-engine"],
)
def test_without_a_host_engine_the_check_is_skipped_with_a_fix(check: Any, tmp_path: Path, answer: str) -> None:
    rc, report, _, _ = check("--dcgm-diag", "2", "--dcgmi", write_dcgmi(tmp_path, answer, rc=235))
    assert (rc, report["findings"], "dcgm" in report["checks"]) == (0, [], False)
    note = report["skipped"]["dcgm"]
    assert "could not reach DCGM's host engine" in note and " ".join(answer.split())[:60] in note
    assert "systemctl enable --now nvidia-dcgm" in note and "dcgmi discovery -l" in note


def test_an_answer_in_no_known_form_skips_the_check(check: Any, tmp_path: Path) -> None:
    answer = "PARSE ERROR: Argument: -j\n             Couldn't find match for argument\n"
    rc, report, _, _ = check("--dcgm-diag", "2", "--dcgmi", write_dcgmi(tmp_path, answer, rc=1))
    assert (rc, report["findings"]) == (0, [])
    assert "exited with status 1 without results" in report["skipped"]["dcgm"]
    assert "Couldn't find match" in report["skipped"]["dcgm"]


def test_a_diagnostic_dcgm_could_not_complete_is_a_finding(check: Any, tmp_path: Path, read_fixture: Any) -> None:
    dcgmi = write_dcgmi(tmp_path, read_fixture("dcgmi-diag-dcgm4-runtime-error.json"), rc=217)
    rc, report, _, _ = check("--dcgm-diag", "2", "--dcgmi", dcgmi)
    (finding,) = dcgm_findings(report)
    assert rc == 1 and finding["bus_id"] is None
    assert "DCGM could not complete the diagnostic" in finding["cause"] and "already running" in finding["cause"]
    assert "`dcgmi diag -r 2`" in finding["fix"]


def test_a_hanging_diagnostic_is_killed_within_its_timeout(check: Any, tmp_path: Path) -> None:
    dcgmi = write_dcgmi(tmp_path, "{}", sleep=60)
    rc, report, metrics, seconds = check("--dcgm-diag", "3", "--dcgm-timeout", "1", "--dcgmi", dcgmi)
    assert seconds < 15, seconds  # the diagnostic's 1 s, plus the check's own commands
    (finding,) = dcgm_findings(report)
    assert rc == 1 and "did not finish within 1 s and was stopped: the DCGM diagnostic hung" in finding["cause"]
    assert "--dcgm-timeout" in finding["fix"] and "`dcgmi diag -r 3`" in finding["fix"]
    assert report["dcgm"] == {"level": 3, "tests": []}
    assert 'gpu_fleet_health_check_ok{check="dcgm"} 0' in metrics.splitlines()


def test_a_dcgmi_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path, monkeypatch: Any) -> None:
    """dcgmi stops its diagnostic on SIGTERM; one that does not stop gets SIGKILL after the grace."""
    script = tmp_path / "dcgmi"
    body = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    script.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    script.chmod(0o755)
    monkeypatch.setattr(gpu_health, "DCGM_STOP_GRACE", 0.5)
    started = time.monotonic()
    seen = gpu_health.read_dcgm(str(script), 2, 0.5)
    assert time.monotonic() - started < 4
    assert "hung" in seen["error"]["cause"] and seen["tests"] == []


def test_sigterm_reaches_dcgmi_first(tmp_path: Path) -> None:
    """The grace lets dcgmi stop the diagnostic on the host engine: it sees SIGTERM, not SIGKILL."""
    marker = tmp_path / "stopped"
    body = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').write('stopped'), sys.exit(0)))\n"
        "time.sleep(60)\n"
    )
    script = tmp_path / "dcgmi"
    script.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    script.chmod(0o755)
    with pytest.raises(gpu_health.CommandTimeout):
        gpu_health.run_command([str(script)], 0.5, grace=5)
    assert marker.read_text() == "stopped"


def test_not_run_without_the_option(check: Any, tmp_path: Path, read_fixture: Any) -> None:
    dcgmi = write_dcgmi(tmp_path, read_fixture("dcgmi-diag-r2-dcgm4-h100x8-faults.json"))
    rc, report, metrics, _ = check("--dcgmi", dcgmi)
    assert (rc, report["findings"]) == (0, [])
    assert "dcgm" not in report["checks"] and "dcgm" not in report["skipped"] and report["dcgm"] is None
    assert not Path(dcgmi + ".args").exists() and "dcgm" not in metrics


@pytest.mark.parametrize("value", ["0", "5", "two", "1.5"])
def test_the_level_is_1_to_4(value: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dcgm-diag", value], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "not a DCGM diagnostic level, 1 to 4" in done.stderr


def test_the_timeout_defaults_to_900_seconds_and_takes_hours() -> None:
    args = gpu_health.build_parser().parse_args(["--dcgm-diag", "4", "--dcgm-timeout", "7200"])
    assert (args.dcgm_diag, args.dcgm_timeout, args.dcgmi) == (4, 7200.0, "dcgmi")
    assert gpu_health.build_parser().parse_args([]).dcgm_timeout == 900 == gpu_health.DEFAULT_DCGM_TIMEOUT
    assert gpu_health.build_parser().parse_args([]).dcgm_diag is None


def test_help_names_the_options() -> None:
    text = gpu_health.build_parser().format_help()
    for words in ("--dcgm-diag LEVEL", "--dcgm-timeout SECONDS", "(default: 900)", "--dcgmi PATH", "dcgm-diagnostics"):
        assert words in text, words


# --- against the stand-ins of tests/fixtures/nvidia --------------------------------------------------

HEALTHY: dict[str, Any] = json.loads((NVIDIA_FIXTURES / "gpus" / "2xA100-SXM4-80GB.json").read_text(encoding="utf-8"))
GPU1 = "0000:0f:00.0"
DRIVER = "535.104.05"


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The nvidia-smi stand-in of driver 535.104.05, run by this interpreter."""
    path = tmp_path_factory.mktemp("nvidia-smi") / "nvidia-smi"
    text = load_builder().render_nvidia_smi(DRIVER, 12020)
    path.write_text(f"#!{sys.executable}\n" + text.split("\n", 1)[1], encoding="utf-8")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def dcgmi(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The dcgmi stand-in, run by this interpreter."""
    path = tmp_path_factory.mktemp("dcgmi") / "dcgmi"
    path.write_text(f"#!{sys.executable}\n" + DCGMI_STANDIN.read_text(encoding="utf-8").split("\n", 1)[1])
    path.chmod(0o755)
    return str(path)


def run_standins(tmp_path: Path, smi: str, dcgmi: str, description: dict[str, Any], level: str) -> dict[str, Any]:
    """gpu_health.py (no baseline yet: the GPU count waits for one) against both stand-ins."""
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps(description), encoding="utf-8")
    (tmp_path / "kern.log").write_text("", encoding="utf-8")
    argv = [
        *(sys.executable, str(SCRIPT), "--nvidia-smi", smi, "--dcgmi", dcgmi, "--dcgm-diag", level),
        *("--baseline", str(tmp_path / "none.json"), "--state", "", "--kernel-log", str(tmp_path / "kern.log")),
        *("--proc-version", str(tmp_path / "no-proc-version"), "--format", "json"),
    ]
    env = dict(os.environ, NVIDIA_STANDIN_GPUS=str(gpus))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=60)
    assert done.stderr == "", done.stderr
    return {"rc": done.returncode, **json.loads(done.stdout)}


def with_knobs(gpu1: dict[str, Any], top: dict[str, Any] | None = None) -> dict[str, Any]:
    description = copy.deepcopy(HEALTHY)
    description["gpus"][1].update(gpu1)
    return {**description, **(top or {})}


@pytest.mark.parametrize("version", ["4.2.3", "3.3.9"])
def test_the_standin_host_passes_at_each_level(tmp_path: Path, smi: str, dcgmi: str, version: str) -> None:
    for level, tests in (("1", {"software"}), ("4", {"software", "pcie", "memory", "diagnostic", "memtest"})):
        report = run_standins(tmp_path, smi, dcgmi, with_knobs({}, {"dcgm_version": version}), level)
        assert (report["rc"], report["findings"], report["checks"]["dcgm"]) == (0, [], True), report
        names = {entry["test"] for entry in report["dcgm"]["tests"]}
        if version.startswith("4"):
            assert tests <= names and (level == "4" or names == tests)
        else:
            assert ("Memtest" in names) == (level == "4") and "Persistence Mode" in names


@pytest.mark.parametrize(("version", "test"), [("4.2.3", "diagnostic"), ("3.3.9", "Diagnostic")])
def test_a_standin_failure_names_the_gpu(tmp_path: Path, smi: str, dcgmi: str, version: str, test: str) -> None:
    report = run_standins(tmp_path, smi, dcgmi, with_knobs({"dcgm_fail": "diagnostic"}, {"dcgm_version": version}), "3")
    (finding,) = dcgm_findings(report)
    assert report["rc"] == 1 and finding["bus_id"] == GPU1
    assert f"Hardware/{test} failed on GPU 1 ({GPU1}): Found 4 faulty memory elements on GPU 1" in finding["cause"]
    assert "at level 4, `dcgmi diag -r 4`" in finding["fix"]  # level 3 ran: the next is 4


def test_a_standin_failure_above_the_level_does_not_run(tmp_path: Path, smi: str, dcgmi: str) -> None:
    report = run_standins(tmp_path, smi, dcgmi, with_knobs({"dcgm_fail": "memtest"}), "3")
    assert (report["rc"], report["findings"]) == (0, [])


def test_the_standin_without_a_host_engine_skips_the_check(tmp_path: Path, smi: str, dcgmi: str) -> None:
    report = run_standins(tmp_path, smi, dcgmi, with_knobs({}, {"dcgm_hostengine": False}), "1")
    assert (report["rc"], report["findings"], "dcgm" in report["checks"]) == (0, [], False)
    assert "Unable to connect to host engine" in report["skipped"]["dcgm"]


def test_the_standin_honours_only_diag_r_level_j(dcgmi: str, tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps(with_knobs({"dcgm_fail": "pcie"})), encoding="utf-8")
    env = dict(os.environ, NVIDIA_STANDIN_GPUS=str(gpus))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([dcgmi, *args], env=env, capture_output=True, text=True, check=False)

    failed = run("diag", "--run", "medium", "--json")
    assert failed.returncode == 205  # DCGM_ST_NVVS_ISOLATE_ERROR: a PCIe replay failure isolates the GPU
    tests = gpu_health_checks.dcgm_answer(2, "dcgmi", 205, failed.stdout, "")["tests"]
    assert [(entry["test"], entry["gpu"]) for entry in tests if entry["result"] == "Fail"] == [
        ("pcie", 1),
        ("pcie", None),
    ]
    unknown = run("diag", "-r", "1", "-j", "--bogus")
    assert unknown.returncode == 1 and "PARSE ERROR: Argument: --bogus" in unknown.stderr
    assert "Couldn't find match for argument" in unknown.stderr
    for args in (
        ("diag", "-r", "1"),
        ("diag", "-r", "pcie", "-j"),
        ("diag", "-r", "1", "-j", "--host", "h"),
        ("discovery", "-l"),
    ):
        assert run(*args).returncode == 1 and "only `dcgmi diag -r" in run(*args).stderr, args
    typo = dict(env, NVIDIA_STANDIN_GPUS=str(tmp_path / "typo.json"))
    (tmp_path / "typo.json").write_text(json.dumps(with_knobs({"dcgm_fail": "memroy"})), encoding="utf-8")
    done = subprocess.run([dcgmi, "diag", "-r", "1", "-j"], env=typo, capture_output=True, text=True, check=False)
    assert done.returncode == 255 and "dcgm_fail 'memroy'" in done.stderr


def test_the_standin_hang_is_stopped_by_sigterm(tmp_path: Path, dcgmi: str) -> None:
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps(with_knobs({}, {"dcgm_hang_seconds": 60})), encoding="utf-8")
    process = subprocess.Popen(
        [dcgmi, "diag", "-r", "1", "-j"], env=dict(os.environ, NVIDIA_STANDIN_GPUS=str(gpus)), start_new_session=True
    )
    time.sleep(0.3)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=5) == -signal.SIGTERM
