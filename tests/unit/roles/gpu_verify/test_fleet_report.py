"""fleet_report.py: report files, table columns, failing and unreachable hosts."""

from __future__ import annotations

import copy
import datetime
import html
import io
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[4] / "roles" / "gpu_verify" / "files" / "fleet_report.py"
sys.path.insert(0, str(SCRIPT.parent))

import fleet_report
import report_history

HEADERS = [
    "host",
    "status",
    "GPU health",
    "driver",
    "CUDA",
    "cuDNN",
    "TensorFlow",
    "GPUs (exp/seen)",
    "replicas",
    "workers",
    "loss start→end",
    "fit s",
    "samples/s",
    "scaling eff.",
    "disk GiB",
    "lock sha256",
    "mode",
    "problems",
    "not run",
]


def passing_doc() -> dict[str, Any]:
    return {
        "schema": 1,
        "host": "gpu01",
        "stack": "tf2.12",
        "ok": True,
        "mode": "gpu",
        "mode_note": None,
        "driver_version": "520.61.05",
        "gpus": {
            "expected": 2,
            "seen": 2,
            "missing": 0,
            "driver_version": "520.61.05",
            "ok": True,
        },
        "libraries": {
            "libcuda": {"version": "11.8", "ok": True},
            "libcudart": {
                "version": "11.8",
                "path": "/usr/local/cuda-11.8/lib64/libcudart.so.11.8.89",
                "ok": True,
            },
            "libcudnn": {
                "version": "8.6.0",
                "path": "/usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0",
                "ok": True,
            },
        },
        "tensorflow": {"version": "2.12.1", "is_cuda_build": True, "gpus": 2},
        "disk_used_bytes": {"/usr/local/cuda-11.8": 5 * 1024**3, "/opt/tensorflow/2.12": 1024**3 + 512 * 1024**2},
        "fit": {
            "ok": True,
            "num_replicas_in_sync": 2,
            "loss_start": 2.4028,
            "loss_end": 0.5953,
            "fit_seconds": 3.214,
            "samples_per_second": 1234.56,
            "timed_out": False,
        },
        "problems": [],
        # pins differ from what is loaded on purpose: the report must show the loaded versions
        "expected": {
            "gpus": 2,
            "driver": "999.1",
            "cuda": "99.9",
            "cudnn": "9.9.9",
            "tensorflow": "9.9.9",
        },
        "seconds": 12.3,
    }


def failing_doc() -> dict[str, Any]:
    doc = passing_doc()
    doc.update(ok=False, host="gpu02")
    doc["gpus"].update(seen=1, missing=1, ok=False)
    doc["libraries"]["libcudnn"]["version"] = "8.1.1"
    doc["fit"].update(ok=False, num_replicas_in_sync=1)
    doc["problems"] = [
        {
            "check": "gpu_count",
            "cause": "Expected 2 GPUs, nvidia-smi sees 1 (1 missing).",
            "fix": "reseat it",
        },
        {
            "check": "libcudnn",
            "cause": "cuDNN libcudnn.so.8 at /usr/lib/x | y is 8.1.1, the stack pins 8.6.0.",
            "fix": "reorder",
        },
    ]
    return doc


def cpu_doc() -> dict[str, Any]:
    doc = passing_doc()
    doc.update(
        mode="cpu-replicas",
        mode_note="fit ran on 2 logical CPU devices (--cpu-replicas 2), not on GPUs",
    )
    return doc


RESULTS = {
    "gpu01": passing_doc(),
    "gpu02": failing_doc(),
    "gpu03": {
        "unreachable": True,
        "error": "ssh: connect to host gpu03 port 22: No route to host",
    },
    "gpu04": {
        "ok": False,
        "problems": [{"check": "fit", "cause": "fit.py not found", "fix": "rerun the role"}],
    },
    "sandbox": cpu_doc(),
}


def test_rows_show_loaded_versions_and_columns() -> None:
    report = fleet_report.build_report(
        RESULTS,
        "r1",
        datetime.datetime(2026, 11, 29, 12, 0, tzinfo=datetime.timezone.utc),  # noqa: UP017
    )
    row = report["hosts"]["gpu01"]["rows"][0]
    assert row == {
        "host": "gpu01 (tf2.12)",
        "status": "PASS",
        "driver": "520.61.05",
        "cuda": "11.8",
        "cudnn": "8.6.0",
        "tensorflow": "2.12.1",
        "gpus": "2/2",
        "replicas": "2",
        "workers": "-",
        "loss": "2.403→0.595",
        "fit_seconds": "3.21",
        "samples_per_second": "1234.6",
        "efficiency": "-",
        "disk_gib": "6.50",
        "lock": "-",
        "mode": "gpu",
        "problems": "",
        "not_run": "",
        "default_stack": False,
        "checks": {name: {"status": "pass", "passed": True, "reason": None} for name in fleet_report.CHECKS},
    }
    assert list(row["checks"]) == list(fleet_report.CHECKS)
    assert report["generated_at"] == "2026-11-29T12:00:00Z" and report["run_id"] == "r1"
    assert report["summary"] == {
        "hosts": 5,
        "passed": 2,
        "failed": 3,
        "unreachable": 1,
        "rechecked": 5,
        "not_in_run": 0,
        "health": {"healthy": 0, "unhealthy": 0, "could_not_check": 0, "not_checked": 5},
    }


def test_failing_and_unreachable_hosts() -> None:
    report = fleet_report.build_report(RESULTS, None)
    gpu02 = report["hosts"]["gpu02"]
    assert gpu02["status"] == "FAIL"
    assert gpu02["rows"][0]["gpus"] == "2/1" and gpu02["rows"][0]["cudnn"] == "8.1.1"
    assert gpu02["rows"][0]["problems"] == "gpu_count, libcudnn"
    gpu03 = report["hosts"]["gpu03"]
    assert gpu03["status"] == "FAIL" and gpu03["unreachable"] is True
    assert gpu03["rows"][0]["problems"] == "unreachable"
    assert "No route to host" in gpu03["problems"][0]["cause"]
    assert report["hosts"]["gpu04"]["problems"][0]["cause"] == "fit.py not found"


def test_ok_true_with_problems_or_ok_false_without_is_a_failure() -> None:
    odd = passing_doc()
    odd["problems"] = [{"check": "fit", "cause": "c", "fix": "f"}]
    silent = {"ok": False, "error": "boom"}
    report = fleet_report.build_report({"a": odd, "b": silent, "c": "garbage"}, None)
    assert [report["hosts"][h]["status"] for h in "abc"] == ["FAIL"] * 3
    assert "boom" in report["hosts"]["b"]["problems"][0]["cause"]


def test_one_row_per_stack_and_host_fails_if_any_stack_fails() -> None:
    other = failing_doc()
    other["stack"] = "tf2.15"
    report = fleet_report.build_report({"gpu01": [passing_doc(), other]}, None)
    host = report["hosts"]["gpu01"]
    assert [r["host"] for r in host["rows"]] == ["gpu01 (tf2.12)", "gpu01 (tf2.15)"]
    assert host["status"] == "FAIL" and report["summary"]["failed"] == 1


def test_text_table(tmp_path: Path) -> None:
    out = io.StringIO()
    source = tmp_path / "results.json"
    source.write_text(json.dumps(RESULTS))
    assert fleet_report.main(["--input", str(source), "--out-dir", str(tmp_path / "reports")], stdout=out) == 0
    lines = out.getvalue().splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == HEADERS
    by_host = {line.split()[0]: line for line in lines[2:7]}
    assert by_host["gpu01"].split()[2] == "PASS" and by_host["gpu03"].split()[1] == "FAIL"
    text = out.getvalue()
    assert "5 hosts: 2 passed, 3 failed (1 unreachable)" in text
    assert "sandbox: fit ran on 2 logical CPU devices (--cpu-replicas 2), not on GPUs" in text
    assert "gpu02 (tf2.12) [gpu_count]: Expected 2 GPUs, nvidia-smi sees 1 (1 missing)." in text
    assert "      fix: reseat it" in text


def test_report_files(tmp_path: Path) -> None:
    source = tmp_path / "results.json"
    source.write_text(json.dumps(RESULTS))
    out_dir = tmp_path / "reports"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--input",
            str(source),
            "--out-dir",
            str(out_dir),
            "--run-id",
            "42",
            "--inventory-source",
            str(tmp_path / "inventories" / "lab" / "hosts.yml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    latest = out_dir / "lab" / "latest"
    data = json.loads((latest / "fleet-report.json").read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["generated_at"])
    assert os.readlink(latest) == data["run_folder"] == data["generated_at"].replace("-", "").replace(":", "")
    assert data["summary"] == {
        "hosts": 5,
        "passed": 2,
        "failed": 3,
        "unreachable": 1,
        "rechecked": 5,
        "not_in_run": 0,
        "health": {"healthy": 0, "unhealthy": 0, "could_not_check": 0, "not_checked": 5},
    }
    assert data["hosts"]["gpu02"]["results"] == [RESULTS["gpu02"]]
    md = (latest / "fleet-report.md").read_text()
    assert md.startswith("# GPU fleet report — run 42")
    assert "| " + " | ".join(HEADERS) + " |" in md
    assert (
        "| gpu01 (tf2.12) | PASS | not checked | 520.61.05 | 11.8 | 8.6.0 | 2.12.1 | 2/2 | 2 | - | 2.403→0.595 | 3.21 | 1234.6 | - | 6.50 | - | gpu |  |  |\n"
        in md
    )
    assert "/usr/lib/x \\| y" in md  # a pipe in a cause must not break the table
    assert "Fix: reseat it" in md and "## Problems" in md


def test_stdin_input(tmp_path: Path) -> None:
    out = io.StringIO()
    stdin = io.StringIO(json.dumps({"gpu01": passing_doc()}))
    assert fleet_report.main(["--input", "-", "--out-dir", str(tmp_path)], stdin=stdin, stdout=out) == 0
    assert (tmp_path / "default" / "latest" / "fleet-report.md").exists()
    assert "1 host: 1 passed, 0 failed" in out.getvalue()


@pytest.mark.parametrize("text", ["not json", "[1, 2]", ""])
def test_bad_input_exits_2(tmp_path: Path, text: str) -> None:
    stdin = io.StringIO(text)
    assert (
        fleet_report.main(
            ["--input", "-", "--out-dir", str(tmp_path)],
            stdin=stdin,
            stdout=io.StringIO(),
        )
        == 2
    )
    assert list(tmp_path.iterdir()) == []


def test_missing_input_file_exits_2(tmp_path: Path) -> None:
    assert fleet_report.main(["--input", str(tmp_path / "nope.json"), "--out-dir", str(tmp_path)]) == 2


def test_input_is_not_modified() -> None:
    before = copy.deepcopy(RESULTS)
    fleet_report.build_report(RESULTS, None)
    assert RESULTS == before


def test_a_host_that_needs_a_reboot_says_so():
    doc = dict(passing_doc(), driver_reboot_required=True, driver_loaded_version="520.61.05")
    doc["expected"] = dict(doc["expected"], driver="535.104.05")
    host = fleet_report.build_report({"gpu01": [doc]}, None)["hosts"]["gpu01"]
    assert host["reboot_required"] is True
    assert (
        "reboot required: the loaded NVIDIA kernel module is 520.61.05, the installed driver 535.104.05; "
        "reboot the host (or rerun with nvidia_driver_reboot_allowed: true)"
    ) in host["mode_notes"]
    calm = fleet_report.build_report({"gpu01": [passing_doc()]}, None)["hosts"]["gpu01"]
    assert calm["reboot_required"] is False and not [n for n in calm["mode_notes"] if "reboot" in n]


@pytest.mark.parametrize(
    ("outcome", "note"),
    [
        ({"switched": True}, "default stack switched: tf2.12 -> tf2.18 (verified first)"),
        (
            {"switched": False},
            "default stays tf2.12: the declared default tf2.18 did not pass verification; it becomes the "
            "default once it does",
        ),
        (
            {"switched": False, "waits": True},
            "default stays tf2.12: the declared default tf2.18 is pending; site.yml switches to it once it "
            "verifies (playbooks/verify.yml only reads)",
        ),
    ],
    ids=["switched", "stays", "waits"],
)
def test_the_notes_say_what_became_of_a_default_switch(outcome, note):
    doc = dict(passing_doc(), default_switch={"from": "tf2.12", "to": "tf2.18", **outcome})
    notes = fleet_report.build_report({"gpu01": [doc]}, None)["hosts"]["gpu01"]["mode_notes"]
    assert note in notes
    calm = fleet_report.build_report({"gpu01": [passing_doc()]}, None)["hosts"]["gpu01"]["mode_notes"]
    assert not [n for n in calm if "default" in n]


def test_overridden_preflight_checks_are_listed_in_the_notes():
    doc = dict(passing_doc(), preflight_overridden=[{"check": "noexec", "cause": "/tmp is noexec.", "fix": "x"}])
    report = fleet_report.build_report({"gpu01": [doc]}, None)
    assert "preflight check noexec overridden: /tmp is noexec." in report["hosts"]["gpu01"]["mode_notes"]
    assert "preflight check noexec overridden" in fleet_report.format_markdown(report)


def _two_host_report() -> dict[str, Any]:
    failing = dict(
        passing_doc(), ok=False, problems=[{"check": "libcudnn", "cause": "cuDNN 8.5.0 <b>", "fix": "Pin 8.6"}]
    )
    return fleet_report.build_report({"gpu01": [passing_doc()], "gpu02": [failing]}, None)


def test_html_is_self_contained_with_a_coloured_row_per_host():
    page = fleet_report.format_html(_two_host_report())
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page
    assert page.count('<tr class="pass">') == 1 and page.count('<tr class="fail">') == 1
    assert "cuDNN 8.5.0 &lt;b&gt;" in page and "<b>gpu02" in page


def test_junit_has_a_case_per_host_and_check_and_the_failure():
    suite = ET.fromstring(fleet_report.format_junit(_two_host_report()))
    cases = suite.findall("testcase")
    assert len(cases) == 2 * len(fleet_report.CHECKS) + 2  # and each host's health
    failed = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failed == [("gpu02 (tf2.12)", "libcudnn")]
    # gpu_health did not run: each host's health is skipped, never passed
    assert [(c.get("classname"), c.get("name")) for c in cases if c.find("skipped") is not None] == [
        ("gpu01", "health"),
        ("gpu02", "health"),
    ]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        str(len(cases)),
        "1",
        "0",
        "2",
    )


def test_peak_utilisation_per_gpu_in_the_notes():
    doc = dict(
        passing_doc(),
        utilisation={
            "1": {"utilization_gpu_peak_pct": 95, "memory_used_peak_mib": 30000},
            "0": {"utilization_gpu_peak_pct": 97, "memory_used_peak_mib": 30512},
        },
    )
    notes = fleet_report.build_report({"gpu01": [doc]}, None)["hosts"]["gpu01"]["mode_notes"]
    assert "peak per GPU during the fit: GPU 0 97% 30512 MiB, GPU 1 95% 30000 MiB" in notes


# --- checks that did not run, hosts without a verification document -------------------------


def _fit_not_run_docs() -> list[dict[str, Any]]:
    """Documents whose fit did not run, otherwise passing (ok true, no problems): the worst case
    for a report that would count a missing check as passed."""
    no_section = passing_doc()
    del no_section["fit"]
    no_result = passing_doc()
    no_result["fit"] = {"ok": None, "note": "fit not started"}
    return [no_section, no_result]


FIT_NOT_RUN_REASONS = ["no fit section in the result", "fit not started"]


@pytest.mark.parametrize("doc, reason", list(zip(_fit_not_run_docs(), FIT_NOT_RUN_REASONS)))
def test_fit_not_run_is_null_with_a_reason_in_json(tmp_path: Path, doc: dict[str, Any], reason: str) -> None:
    source = tmp_path / "results.json"
    source.write_text(json.dumps({"gpu01": [doc]}))
    assert fleet_report.main(["--input", str(source), "--out-dir", str(tmp_path)], stdout=io.StringIO()) == 0
    report = tmp_path / "default" / "latest" / "fleet-report.json"
    row = json.loads(report.read_text())["hosts"]["gpu01"]["rows"][0]
    assert row["checks"]["fit"] == {"status": "not run", "passed": None, "reason": reason}
    assert row["not_run"] == "fit"
    passed = {name for name, outcome in row["checks"].items() if outcome["passed"] is True}
    assert passed == set(fleet_report.CHECKS) - {"fit"}


@pytest.mark.parametrize("doc, reason", list(zip(_fit_not_run_docs(), FIT_NOT_RUN_REASONS)))
def test_fit_not_run_is_skipped_in_junit(doc: dict[str, Any], reason: str) -> None:
    suite = ET.fromstring(fleet_report.format_junit(fleet_report.build_report({"gpu01": [doc]}, None)))
    fit = [c for c in suite.findall("testcase") if c.get("name") == "fit"]
    assert len(fit) == 1 and fit[0].find("failure") is None
    assert fit[0].find("skipped").get("message") == f"not run: {reason}"
    passed = [c.get("name") for c in suite.findall("testcase") if len(c) == 0]
    assert "fit" not in passed and len(passed) == len(fleet_report.CHECKS) - 1
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (
        str(len(fleet_report.CHECKS) + 1),  # and the host's health, not checked
        "0",
        "2",
    )


@pytest.mark.parametrize("doc, reason", list(zip(_fit_not_run_docs(), FIT_NOT_RUN_REASONS)))
def test_fit_not_run_shows_in_markdown_html_and_text(doc: dict[str, Any], reason: str) -> None:
    report = fleet_report.build_report({"gpu01": [doc]}, None)
    md = fleet_report.format_markdown(report)
    md_row = next(line for line in md.splitlines() if line.startswith("| gpu01 (tf2.12) |"))
    assert md_row.endswith("| gpu |  | fit |")
    assert f"- **gpu01 (tf2.12)** `fit`: not run: {reason}" in md.split("## Not run")[1]
    page = fleet_report.format_html(report)
    assert '<td class="not_run">fit</td>' in page
    assert f"<li><b>gpu01 (tf2.12)</b> <code>fit</code>: not run: {html.escape(reason)}</li>" in page
    text = fleet_report.format_text(report)
    lines = text.splitlines()
    header = re.split(r"\s{2,}", lines[0].strip())
    assert header[-1] == "not run" and lines[2].split()[-1] == "fit"
    assert f"  gpu01 (tf2.12) [fit]: not run: {reason}" in text.split("Not run:")[1]


def _outcomes(doc: Any) -> dict[str, dict[str, Any]]:
    return fleet_report.build_report({"h": [doc]}, None)["hosts"]["h"]["rows"][0]["checks"]


def test_each_check_is_not_run_when_its_section_holds_no_result() -> None:
    doc = passing_doc()
    del doc["libraries"]["libcudnn"]
    doc["tensorflow"] = {"version": None, "error": "TensorFlow information unavailable: the fit stopped"}
    doc["expected"]["driver"] = None
    outcomes = _outcomes(doc)
    assert outcomes["libcudnn"] == {
        "status": "not run",
        "passed": None,
        "reason": "no libraries.libcudnn in the result",
    }
    assert outcomes["tensorflow"]["status"] == "not run"
    assert outcomes["tensorflow"]["reason"] == "TensorFlow information unavailable: the fit stopped"
    assert outcomes["driver"]["status"] == "not run" and "no driver version pinned" in outcomes["driver"]["reason"]
    assert [name for name, o in outcomes.items() if o["status"] == "pass"] == [
        "gpu_count",
        "libcuda",
        "libcudart",
        "fit",
    ]


def test_gpu_count_did_not_run_when_nvidia_smi_gave_no_list() -> None:
    doc = passing_doc()
    doc.update(ok=False, driver_version=None)
    doc["gpus"].update(seen=0, driver_version=None, error="Driver/library version mismatch", ok=False)
    doc["problems"] = [{"check": "driver", "cause": "Driver/library version mismatch: ...", "fix": "reboot"}]
    outcomes = _outcomes(doc)
    assert outcomes["gpu_count"]["status"] == "not run"
    assert outcomes["gpu_count"]["reason"] == "nvidia-smi gave no GPU list: Driver/library version mismatch"
    assert outcomes["driver"] == {"status": "fail", "passed": False, "reason": "Driver/library version mismatch: ..."}


def test_a_problem_fails_its_check_and_optional_checks_follow_their_sections() -> None:
    doc = passing_doc()
    doc["scaling"] = {"ok": None, "note": "measured on logical CPU devices that share the same cores; not judged"}
    doc["multiworker"] = {"workers": 2, "is_chief": True}
    doc["fit"].update(ok=False)
    doc.update(ok=False, problems=[{"check": "fit", "cause": "The fit did not finish within 45 s", "fix": "x"}])
    outcomes = _outcomes(doc)
    assert list(outcomes)[-2:] == ["multiworker", "scaling"]
    assert outcomes["fit"] == {"status": "fail", "passed": False, "reason": "The fit did not finish within 45 s"}
    assert outcomes["multiworker"]["status"] == "fail"
    assert outcomes["scaling"]["status"] == "not run" and outcomes["scaling"]["reason"].endswith("not judged")
    del doc["fit"]
    doc.update(problems=[{"check": "libraries", "cause": "two CUDA majors", "fix": "x"}])
    outcomes = _outcomes(doc)
    assert outcomes["multiworker"] == {"status": "not run", "passed": None, "reason": "no fit section in the result"}
    assert outcomes["libraries"]["status"] == "fail"


@pytest.mark.parametrize("host", ["gpu03", "gpu04", "garbage"])
def test_a_host_without_a_verification_document_is_one_failure_and_every_check_not_run(host: str) -> None:
    results = dict(RESULTS, garbage="not an object")
    report = fleet_report.build_report(results, None)
    row = report["hosts"][host]["rows"][0]
    assert list(row["checks"]) == ["verification", *fleet_report.CHECKS]
    assert row["checks"]["verification"]["passed"] is False
    cause = report["hosts"][host]["problems"][0]["cause"]
    for name in fleet_report.CHECKS:  # null in JSON, with the reason: never a pass
        assert row["checks"][name] == {
            "status": "not run",
            "passed": None,
            "reason": f"the host was not verified: {cause}",
        }, name
    assert row["not_run"] == "all"
    suite = ET.fromstring(fleet_report.format_junit(report))
    cases = [c for c in suite.findall("testcase") if c.get("classname") == host]
    assert [c.get("name") for c in cases] == ["verification", *fleet_report.CHECKS, "health"]
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("message") == cause
    assert "Fix: " in failure.text
    assert all(c.find("skipped") is not None for c in cases[1:])


def test_the_json_has_the_same_checks_for_every_host_null_where_not_known(tmp_path: Path) -> None:
    reached, other = passing_doc(), passing_doc()
    reached["lock"] = {"path": "/opt/tensorflow/2.12/tf-lock.txt", "sha256": LOCK_SHA, "pins": 45, "ok": True}
    reached["default"] = {"symlink": "/usr/local/cuda", "points_at": "/usr/local/cuda-11.8", "ok": True}
    other["stack"] = "tf2.15"
    results = {"gpu01": [reached, other], "gpu03": RESULTS["gpu03"]}
    source = tmp_path / "results.json"
    source.write_text(json.dumps(results))
    assert fleet_report.main(["--input", str(source), "--out-dir", str(tmp_path)], stdout=io.StringIO()) == 0
    hosts = json.loads((tmp_path / "default" / "latest" / "fleet-report.json").read_text())["hosts"]
    rows = hosts["gpu01"]["rows"] + hosts["gpu03"]["rows"]
    names = {"verification", *fleet_report.CHECKS, "lock", "default"}
    assert [set(row["checks"]) for row in rows] == [names] * 3
    unreachable = hosts["gpu03"]["rows"][0]["checks"]
    cause = hosts["gpu03"]["problems"][0]["cause"]
    for name in ("lock", "default"):  # present, null, with the reason its other checks give
        assert unreachable[name] == {
            "status": "not run",
            "passed": None,
            "reason": f"the host was not verified: {cause}",
        }
    first, second = hosts["gpu01"]["rows"][0]["checks"], hosts["gpu01"]["rows"][1]["checks"]
    assert first["verification"] == {"status": "pass", "passed": True, "reason": None}
    assert (first["default"]["passed"], second["default"]["passed"]) == (True, None)
    assert second["default"]["reason"] == "no default result for this stack (another row of this run has one)"
    # The other formats list each row's own checks.
    report = fleet_report.build_report(results, None)
    assert "default" not in report["hosts"]["gpu01"]["rows"][1]["checks"]
    assert "lock" not in report["hosts"]["gpu03"]["rows"][0]["checks"]


def test_unreachable_host_in_junit_has_one_failure_with_the_reason_the_checks_skipped_and_no_pass() -> None:
    report = fleet_report.build_report({"gpu03": RESULTS["gpu03"]}, None)
    suite = ET.fromstring(fleet_report.format_junit(report))
    case, *not_run = suite.findall("testcase")
    assert (case.get("classname"), case.get("name")) == ("gpu03", "verification")
    failure = case.find("failure")
    assert failure.get("type") == "unreachable"
    assert failure.get("message") == "Host unreachable: ssh: connect to host gpu03 port 22: No route to host"
    checks = len(fleet_report.CHECKS) + 1  # and its health, not checked
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (str(1 + checks), "1", str(checks))
    assert [c.get("name") for c in not_run] == [*fleet_report.CHECKS, "health"]


@pytest.mark.parametrize(
    "connection, expected",
    [
        (None, "check SSH reachability and keys (`ssh gpu03`"),
        ("ssh", "check SSH reachability and keys (`ssh gpu03`"),
        ("containers.podman.podman", "check the container is running (`podman ps -a --filter name=gpu03`"),
        ("podman", "check the container is running (`podman ps -a --filter name=gpu03`"),
        ("podman_pipelined", "check the container is running (`podman ps -a --filter name=gpu03`"),
        ("community.docker.docker", "check the container is running (`docker ps -a --filter name=gpu03`"),
        ("local", "the host is the controller itself (connection local)"),
        ("winrm", "check that Ansible can connect to gpu03 over its winrm connection (`ansible -m ping gpu03`)"),
    ],
)
def test_unreachable_fix_depends_on_the_connection(connection: str | None, expected: str) -> None:
    doc = {"unreachable": True, "error": "boom", "connection": connection}
    (problem,) = fleet_report.build_report({"gpu03": doc}, None)["hosts"]["gpu03"]["problems"]
    assert problem["fix"].startswith(expected)
    assert ("SSH" in problem["fix"]) == (connection in (None, "ssh"))


def test_unreachable_without_a_message_says_so_instead_of_no_detail() -> None:
    doc = {"ok": False, "unreachable": True, "error": None, "connection": "containers.podman.podman"}
    report = fleet_report.build_report({"gpu-f3": doc}, None)
    (problem,) = report["hosts"]["gpu-f3"]["problems"]
    assert problem["cause"] == "Host unreachable or failed earlier in this run (see the run's output above)."
    assert "podman ps -a --filter name=gpu-f3" in problem["fix"] and "SSH" not in problem["fix"]
    for text in (fleet_report.format_text(report), fleet_report.format_markdown(report)):
        assert "no detail" not in text and "unreachable or failed earlier in this run" in text


def test_notes_name_the_host_once() -> None:
    other = passing_doc()
    other["stack"] = "tf2.15"
    other["libraries"]["libcudart"]["path"] = "/usr/local/cuda-12.2/lib64/libcudart.so.12.2.140"
    report = fleet_report.build_report(
        {"gpu-f3": [passing_doc(), other], "gpu01": [dict(passing_doc(), mode_note="on CPUs")]}, None
    )
    for text in (fleet_report.format_text(report), fleet_report.format_markdown(report)):
        assert "gpu-f3: gpu-f3" not in text
        assert "gpu-f3 (tf2.12): loaded libcudart 11.8 /usr/local/cuda-11.8/lib64/libcudart.so.11.8.89" in text
        assert "gpu-f3 (tf2.15): loaded libcudart 11.8 /usr/local/cuda-12.2/lib64/libcudart.so.12.2.140" in text
        assert "gpu01: on CPUs" in text and "gpu01: loaded libcudart 11.8" in text
    # The HTML page shows a note several share once, naming them.
    notes = _unwrapped(fleet_report.format_html(report)).split('<ul id="notes">')[1].split("</ul>")[0]
    assert "gpu-f3: gpu-f3" not in notes
    assert "<li>gpu-f3 (tf2.15): loaded libcudart 11.8 /usr/local/cuda-12.2/lib64/libcudart.so.12.2.140" in notes
    assert "<li>loaded libcudart 11.8 /usr/local/cuda-11.8/lib64/libcudart.so.11.8.89" in notes
    assert '<span class="hosts">(2 hosts and stacks: gpu-f3 (tf2.12), gpu01)</span>' in notes
    assert "<li>gpu01: on CPUs</li>" in notes


def _unwrapped(page: str) -> str:
    """The page without the spans that keep a word whole (fleet_report._words)."""
    return re.sub(r'<span class="w">([^<]*)</span>', r"\1", page)


def test_html_shows_a_note_many_hosts_share_once_with_the_hosts() -> None:
    """The sandbox's "PCI cross-check skipped" note, on every stack of every host, is one line in the
    HTML page (text and Markdown keep one line per host)."""
    no_lspci = dict(passing_doc(), gpus=dict(passing_doc()["gpus"], pci_bus_ids=None))
    other = dict(no_lspci, stack="tf2.15")
    results = {"gpu01": [no_lspci, other], "gpu02": [no_lspci], "gpu03": [dict(passing_doc(), mode_note="on CPUs")]}
    report = fleet_report.build_report(results, None)
    page = _unwrapped(fleet_report.format_html(report))
    assert page.count("PCI cross-check skipped") == 1
    assert '(install pciutils) <span class="hosts">(2 hosts: gpu01, gpu02)</span></li>' in page
    report = fleet_report.build_report(dict(results, gpu03=[no_lspci]), None)
    assert '(install pciutils) <span class="hosts">(all 3 hosts)</span></li>' in _unwrapped(
        fleet_report.format_html(report)
    )
    assert fleet_report.format_text(report).count("PCI cross-check skipped") == 4
    assert fleet_report.format_markdown(report).count("PCI cross-check skipped") == 4


NO_DEVICE_NOTE = (
    "cudaRuntimeGetVersion returned 100 (cudaErrorNoDevice: no CUDA-capable device is detected): no usable GPU or "
    "driver (the driver sees no CUDA device: kernel module not loaded, GPU not passed into the container, or no GPU); "
    "version 11.8 read from the file name libcudart.so.11.8.89"
)


def test_a_library_note_is_shown_and_its_check_passes_or_did_not_run() -> None:
    # libraries.py: on a host without a usable GPU the runtime's version comes from its file name, with a
    # note; a library the probe did not reach is neither passed nor failed.
    doc = cpu_doc()
    doc["libraries"]["libcudart"].update(raw=None, version_source="file name", call_status=100, note=NO_DEVICE_NOTE)
    not_probed = "not probed: the probe process ended while probing libcudart"
    doc["libraries"]["libcudnn"] = {"soname": "libcudnn.so.8", "version": None, "ok": None, "note": not_probed}
    report = fleet_report.build_report({"sandbox": [doc]}, None)
    outcomes = report["hosts"]["sandbox"]["rows"][0]["checks"]
    assert outcomes["libcudart"] == {"status": "pass", "passed": True, "reason": None}
    assert outcomes["libcudnn"] == {"status": "not run", "passed": None, "reason": not_probed}
    notes = report["hosts"]["sandbox"]["mode_notes"]
    assert f"libcudart: {NO_DEVICE_NOTE}" in notes and f"libcudnn: {not_probed}" in notes
    assert f"libcudart: {NO_DEVICE_NOTE}" in fleet_report.format_text(report)


def test_the_notes_name_the_real_files_releases_and_tensorflows_build() -> None:
    # The sandbox with NVIDIA's real files: the runtime's release from its file name, the driver's
    # version from libcuda's, TensorFlow's GPU build as tf.sysconfig.get_build_info() gives it.
    doc = cpu_doc()
    doc["libraries"]["libcuda"].update(path="/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05", release="520.61.05")
    doc["libraries"]["libcudart"].update(release="11.8.89", version_source="file name")
    doc["libraries"]["libcudnn"].update(release="8.6.0")
    doc["tensorflow"] = {
        "version": "2.12.1",
        "is_cuda_build": True,
        "gpus": 0,
        "build_info": {"cuda_version": "11.8", "cudnn_version": "8"},
    }
    notes = fleet_report.build_report({"sandbox": [doc]}, None)["hosts"]["sandbox"]["mode_notes"]
    assert (
        "loaded libcuda CUDA 11.8 (driver 520.61.05) /usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05, "
        "libcudart 11.8.89 /usr/local/cuda-11.8/lib64/libcudart.so.11.8.89, "
        "libcudnn 8.6.0 /usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0"
    ) in notes
    assert "TensorFlow 2.12.1: GPU build for CUDA 11.8 and cuDNN 8; it sees 0 GPUs" in notes
    doc["tensorflow"] = {"version": "2.12.1", "is_cuda_build": False, "gpus": 0}
    notes = fleet_report.build_report({"sandbox": [doc]}, None)["hosts"]["sandbox"]["mode_notes"]
    assert "TensorFlow 2.12.1: CPU-only build (tensorflow-cpu)" in notes


# --- history: run folders, latest, merging a partial run -------------------------------------------

T0 = datetime.datetime(2026, 12, 1, 17, 4, 0, tzinfo=datetime.timezone.utc)  # noqa: UP017
T1 = T0 + datetime.timedelta(hours=1)
T2 = T0 + datetime.timedelta(hours=2)


def _failed_doc() -> dict[str, Any]:
    doc = passing_doc()
    doc["ok"] = False
    doc["problems"] = [{"check": "fit", "cause": "loss is nan", "fix": "lower the learning rate"}]
    return doc


def _cli(out_dir: Path, results: dict[str, Any], now: datetime.datetime, *extra: str) -> dict[str, Any]:
    out = io.StringIO()
    argv = ["--input", "-", "--out-dir", str(out_dir), "--inventory-name", "lab", "--emit", "json", *extra]
    assert fleet_report.main(argv, stdin=io.StringIO(json.dumps(results)), stdout=out, now=now) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize(
    "sources, override, expected",
    [
        (["{tmp}/inventories/sandbox"], None, "sandbox"),
        (["{tmp}/inventories/gpu_hosts/hosts.yml"], None, "gpu_hosts"),
        (["{tmp}/inventories/sandbox", "{tmp}/inventories/gpu_hosts/hosts.yml"], None, "sandbox+gpu_hosts"),
        (["{tmp}/inventories/sandbox"], "GPU fleet (prod)", "GPU_fleet__prod_"),
        (["gpu01,gpu02,"], None, "adhoc"),
        ([], "", "default"),
        ([], "../..", "default"),
    ],
)
def test_inventory_name(tmp_path: Path, sources: list[str], override: str | None, expected: str) -> None:
    (tmp_path / "inventories" / "sandbox").mkdir(parents=True)
    (tmp_path / "inventories" / "gpu_hosts").mkdir()
    (tmp_path / "inventories" / "gpu_hosts" / "hosts.yml").write_text("all: {}\n")
    sources = [s.format(tmp=tmp_path) for s in sources]
    assert report_history.inventory_name(sources, override) == expected


def _report(results: dict[str, Any], now: datetime.datetime) -> dict[str, Any]:
    return fleet_report.build_report(results, None, now)


def test_merge_carries_over_the_hosts_a_limited_run_did_not_verify() -> None:
    previous = _report({"gpu01": passing_doc(), "gpu02": passing_doc(), "gpu03": _failed_doc()}, T0)
    merged = report_history.merge(previous, _report({"gpu01": _failed_doc()}, T1), ["gpu01", "gpu02", "gpu03"])
    assert merged["hosts"]["gpu01"]["status"] == "FAIL"  # this run's result, not the old PASS
    for host, last in (("gpu02", "PASS"), ("gpu03", "FAIL")):
        entry = merged["hosts"][host]
        assert (entry["status"], entry["carried_over"], entry["last_status"]) == ("NOT IN THIS RUN", True, last)
        assert [row["status"] for row in entry["rows"]] == [f"not in this run (last seen 2026-12-01T17:04:00Z: {last})"]
        assert [o["passed"] for row in entry["rows"] for o in row["checks"].values()] == [None]
        assert entry["problems"] == []  # not a current failure either
    assert merged["hosts"]["gpu03"]["last_problems"][0]["cause"] == "loss is nan"
    # fleet_report.run counts the health of the merged hosts (test_merge_keeps_each_hosts_health_...)
    assert {key: value for key, value in merged["summary"].items() if key != "health"} == {
        "hosts": 3,
        "passed": 0,
        "failed": 1,
        "unreachable": 0,
        "rechecked": 1,
        "not_in_run": 2,
    }


def test_a_stale_pass_is_never_a_current_pass() -> None:
    previous = _report({"gpu01": passing_doc(), "gpu02": passing_doc()}, T0)
    merged = report_history.merge(previous, _report({"gpu01": _failed_doc()}, T1), None)
    assert merged["summary"]["passed"] == 0
    junit = ET.fromstring(fleet_report.format_junit(merged))
    cases = [c for c in junit.iter("testcase") if c.get("classname").startswith("gpu02")]
    assert [(c.get("name"), [(e.tag, e.get("message")) for e in c]) for c in cases] == [
        ("verification", [("skipped", "not in this run (last seen 2026-12-01T17:04:00Z: PASS)")]),
        ("health", [("skipped", "not in this run: no GPU health report from an earlier run")]),
    ]
    text = fleet_report.format_text(merged)
    assert "3 hosts" not in text and "2 hosts: 0 passed, 1 failed (0 unreachable), 1 not in this run" in text
    page = fleet_report.format_html(merged)
    assert '<tr class="carried">' in page and page.count('<tr class="pass">') == 0


def test_merge_keeps_the_time_a_host_was_last_verified_and_drops_hosts_gone_from_the_inventory() -> None:
    first = _report({"gpu01": passing_doc(), "gpu02": passing_doc(), "gpu03": passing_doc()}, T0)
    second = report_history.merge(first, _report({"gpu01": passing_doc()}, T1), None)
    third = report_history.merge(second, _report({"gpu01": passing_doc()}, T2), ["gpu01", "gpu02"])
    assert sorted(third["hosts"]) == ["gpu01", "gpu02"]  # gpu03 left the inventory
    assert third["hosts"]["gpu02"]["last_seen"] == "2026-12-01T17:04:00Z"
    assert third["hosts"]["gpu02"]["last_status"] == "PASS"


def test_a_full_run_carries_nothing_over() -> None:
    previous = _report({"gpu01": _failed_doc(), "gpu02": passing_doc()}, T0)
    merged = report_history.merge(previous, _report({"gpu01": passing_doc(), "gpu02": passing_doc()}, T1), None)
    assert merged["summary"]["not_in_run"] == 0 and merged["summary"]["passed"] == 2
    assert merged["merged_from"] is None


def test_each_run_gets_a_folder_and_latest_follows_the_last_one(tmp_path: Path) -> None:
    first = _cli(tmp_path, {"gpu01": passing_doc(), "gpu02": passing_doc()}, T0)
    second = _cli(tmp_path, {"gpu01": _failed_doc()}, T1, "--inventory-hosts", '["gpu01", "gpu02"]', "--limit", "gpu01")
    lab = tmp_path / "lab"
    assert first["run_dir"] == str(lab / "20261201T170400Z") and second["run_dir"] == str(lab / "20261201T180400Z")
    assert os.readlink(lab / "latest") == "20261201T180400Z"  # relative, so the folder can move
    old = json.loads((lab / "20261201T170400Z" / "fleet-report.json").read_text())
    assert old["summary"]["passed"] == 2  # history kept as it was
    new = json.loads((lab / "latest" / "fleet-report.json").read_text())
    assert (new["limit"], new["merged_from"], new["inventory"]) == ("gpu01", "20261201T170400Z", "lab")
    assert second["summary"]["not_in_run"] == 1 and second["summary"]["rechecked"] == 1
    assert new["hosts"]["gpu02"]["rows"][0]["status"] == "not in this run (last seen 2026-12-01T17:04:00Z: PASS)"
    junit = (lab / "latest" / "fleet-report.junit.xml").read_text()
    assert '<skipped message="not in this run (last seen 2026-12-01T17:04:00Z: PASS)" />' in junit
    assert "not in this run (last seen 2026-12-01T17:04:00Z: PASS)" in (lab / "latest" / "fleet-report.md").read_text()
    assert not [p for p in lab.iterdir() if p.name.startswith(".")]  # no temporary link left


def test_only_the_last_runs_are_kept(tmp_path: Path) -> None:
    for hour in range(4):
        _cli(tmp_path, {"gpu01": passing_doc()}, T0 + datetime.timedelta(hours=hour), "--keep", "2")
    assert sorted(p.name for p in (tmp_path / "lab").iterdir()) == ["20261201T190400Z", "20261201T200400Z", "latest"]
    out = io.StringIO()
    bad = ["--input", "-", "--out-dir", str(tmp_path), "--keep", "0"]
    assert fleet_report.main(bad, stdin=io.StringIO("{}"), stdout=out) == 2


def test_two_runs_in_one_second_get_two_folders(tmp_path: Path) -> None:
    _cli(tmp_path, {"gpu01": passing_doc()}, T0)
    again = _cli(tmp_path, {"gpu01": _failed_doc()}, T0)
    assert again["run_dir"].endswith("/20261201T170400Z-1")
    assert os.readlink(tmp_path / "lab" / "latest") == "20261201T170400Z-1"


def test_dry_run_writes_and_deletes_nothing(tmp_path: Path) -> None:
    _cli(tmp_path, {"gpu01": passing_doc(), "gpu02": passing_doc()}, T0, "--keep", "1")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    done = _cli(tmp_path, {"gpu01": _failed_doc()}, T1, "--dry-run", "--keep", "1")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert os.readlink(tmp_path / "lab" / "latest") == "20261201T170400Z"
    assert (done["written"], done["run_dir"], done["summary"]["not_in_run"]) == (False, None, 1)
    assert "1 not in this run" in done["table"]
    lines = done["table"].splitlines()
    assert lines[0] == fleet_report.CHECK_MODE_TOP
    summary = next(line for line in lines if line.startswith("2 hosts: "))
    assert summary.endswith("(check mode: not written)"), summary


def test_a_written_report_does_not_say_check_mode(tmp_path: Path) -> None:
    done = _cli(tmp_path, {"gpu01": passing_doc()}, T0)
    assert "CHECK MODE" not in done["table"] and "check mode" not in done["table"]


def test_an_unreadable_previous_report_is_named_and_not_merged(tmp_path: Path) -> None:
    _cli(tmp_path, {"gpu01": passing_doc(), "gpu02": passing_doc()}, T0)
    (tmp_path / "lab" / "latest" / "fleet-report.json").write_text("{truncated")
    done = _cli(tmp_path, {"gpu01": passing_doc()}, T1)
    assert done["summary"]["not_in_run"] == 0
    assert (
        "previous report" in done["table"] and "unreadable" in done["table"] and "Remove it or fix it" in done["table"]
    )


LOCK_SHA = "0123456789abcdef" * 4


def test_the_lock_column_shows_each_venvs_lock_digest_and_its_check_passes() -> None:
    doc = passing_doc()
    doc["lock"] = {"path": "/opt/tensorflow/2.12/tf-lock.txt", "sha256": LOCK_SHA, "pins": 45, "ok": True}
    row = fleet_report.build_report({"h": [doc]}, None)["hosts"]["h"]["rows"][0]
    assert row["lock"] == "0123456789ab"
    assert row["checks"]["lock"] == {"status": "pass", "passed": True, "reason": None}
    assert "lock sha256" in fleet_report.format_text(fleet_report.build_report({"h": [doc]}, None))


def test_a_venv_that_drifted_from_its_lock_fails_the_lock_check_with_cause_and_fix() -> None:
    doc = passing_doc()
    lines = ["numpy 1.26.4 installed, the lock has 1.24.3", "pandas 2.2.3 not in the lock"]
    doc["lock"] = {
        "path": "/opt/tf/tf-lock.txt",
        "sha256": LOCK_SHA,
        "pins": 45,
        "ok": False,
        "drift": {"lines": lines},
    }
    cause = "The venv differs from its lock /opt/tf/tf-lock.txt (sha256 0123456789ab): " + "; ".join(lines) + "."
    fix = "Rerun the playbook (site.yml, or playbooks/tensorflow.yml --limit <host>) to restore the lock"
    doc.update(ok=False, problems=[{"check": "lock", "cause": cause, "fix": fix}])
    report = fleet_report.build_report({"h": [doc]}, None)
    row = report["hosts"]["h"]["rows"][0]
    assert row["status"] == "FAIL" and row["problems"] == "lock"
    assert row["checks"]["lock"] == {"status": "fail", "passed": False, "reason": cause}
    text = fleet_report.format_text(report)
    assert f"[lock]: {cause}" in text and f"fix: {fix}" in text
    # without the problem (an older gpu_verify.py), the section alone still fails the check
    doc.update(problems=[])
    assert _outcomes(doc)["lock"]["reason"] == "; ".join(lines)


def test_a_venv_installed_without_a_lock_is_not_run_never_passed() -> None:
    doc = passing_doc()
    note = "no lock at /opt/tf/tf-lock.txt: the venv was installed without one"
    doc["lock"] = {"path": "/opt/tf/tf-lock.txt", "sha256": None, "ok": None, "note": note}
    row = fleet_report.build_report({"h": [doc]}, None)["hosts"]["h"]["rows"][0]
    assert row["lock"] == "none" and row["status"] == "PASS"
    assert row["checks"]["lock"] == {"status": "not run", "passed": None, "reason": note}
    junit = fleet_report.format_junit(fleet_report.build_report({"h": [doc]}, None))
    assert f'name="lock"><skipped message="not run: {note}"' in junit


def test_the_plan_header_counts_one_host_in_the_singular() -> None:
    import fleet_plan

    one = {"inventory": "sandbox", "summary": fleet_plan.summarize({"a": {"changes": 0}}), "hosts": {}}
    assert fleet_plan.format_text(one).startswith(f"{fleet_plan.TITLE}. Inventory sandbox: 1 host, 0 would change")
    two = one | {"summary": fleet_plan.summarize({"a": {"changes": 1}, "b": {"changes": 0}})}
    assert "Inventory sandbox: 2 hosts, 1 would change, 1 nothing to do" in fleet_plan.format_text(two)


def test_the_default_stacks_pointers_are_a_check_of_its_row_only() -> None:
    default, other = passing_doc(), passing_doc()
    default["default"] = {"symlink": "/usr/local/cuda", "points_at": "/usr/local/cuda-11.8", "ok": True}
    report = fleet_report.build_report({"h": [default, other]}, None)
    rows = report["hosts"]["h"]["rows"]
    assert rows[0]["checks"]["default"] == {"status": "pass", "passed": True, "reason": None}
    assert "default" not in rows[1]["checks"]


def test_a_moved_default_symlink_fails_the_default_check_with_cause_and_fix() -> None:
    doc = passing_doc()
    doc["default"] = {"symlink": "/usr/local/cuda", "points_at": None, "ok": False}
    cause = "/usr/local/cuda is missing; the default stack's toolkit is /usr/local/cuda-11.8."
    doc.update(ok=False, problems=[{"check": "default", "cause": cause, "fix": "Rerun the playbook"}])
    row = fleet_report.build_report({"h": [doc]}, None)["hosts"]["h"]["rows"][0]
    assert row["status"] == "FAIL" and row["problems"] == "default"
    assert row["checks"]["default"] == {"status": "fail", "passed": False, "reason": cause}


def test_a_stacks_jupyter_kernel_is_a_check_of_its_row_where_the_venv_has_one() -> None:
    with_kernel, without = passing_doc(), passing_doc()
    with_kernel["kernel"] = {"name": "tf-stack-tf2.12", "started": True, "ok": True}
    without["kernel"] = None
    rows = fleet_report.build_report({"h": [with_kernel, without]}, None)["hosts"]["h"]["rows"]
    assert rows[0]["checks"]["kernel"] == {"status": "pass", "passed": True, "reason": None}
    assert "kernel" not in rows[1]["checks"]


def test_a_kernel_that_cannot_start_fails_its_row_with_the_import_error() -> None:
    doc = passing_doc()
    doc["kernel"] = {"name": "tf-stack-tf2.12", "started": False, "ok": False}
    cause = "ipykernel is in the venv /opt/tensorflow/2.12 but does not import (ImportError: cannot import name X)"
    doc.update(ok=False, problems=[{"check": "kernel", "cause": cause, "fix": "Lock versions that import together"}])
    row = fleet_report.build_report({"h": [doc]}, None)["hosts"]["h"]["rows"][0]
    assert row["status"] == "FAIL" and row["problems"] == "kernel"
    assert row["checks"]["kernel"] == {"status": "fail", "passed": False, "reason": cause}


def test_a_later_report_of_the_same_run_replaces_the_earlier_and_other_runs_stay(tmp_path: Path) -> None:
    not_reached = json.dumps({"gpu02": {"status": "not reached yet", "reason": "a later batch"}})
    other = _cli(tmp_path, {"gpu01": passing_doc(), "gpu02": passing_doc()}, T0)
    first = _cli(tmp_path, {"gpu01": passing_doc()}, T1, "--run-id", "rollout-A", "--not-verified", not_reached)
    last = _cli(tmp_path, {"gpu02": _failed_doc()}, T2, "--run-id", "rollout-A")
    lab = tmp_path / "lab"
    assert sorted(p.name for p in lab.iterdir()) == sorted(
        [Path(other["run_dir"]).name, Path(last["run_dir"]).name, "latest"]
    )
    assert not Path(first["run_dir"]).exists()
    final = json.loads((lab / "latest" / "fleet-report.json").read_text())
    assert final["supersedes"] == [Path(first["run_dir"]).name] and final["run_id"] == "rollout-A"
    assert (final["hosts"]["gpu01"]["status"], final["hosts"]["gpu02"]["status"]) == ("NOT IN THIS RUN", "FAIL")
    assert "not reached yet" not in json.dumps(final)


# --- GPU health at the time of the run (gpu_verify_collect's ``health``, from gpu_health) ----------

CHECKED = "2026-12-01T17:03:12Z"
ECC = {
    "check": "ecc",
    "bus_id": "00000000:3B:00.0",
    "cause": "GPU 00000000:3B:00.0 has 2 uncorrectable ECC errors <since load>.",
    "fix": "Drain the host and have the GPU replaced.",
}
PERSISTENCE = {"check": "persistence", "bus_id": None, "cause": "Persistence mode is off.", "fix": "nvidia-smi -pm 1"}
NO_SMI = {"cause": "nvidia-smi was not found.", "fix": "Install the driver (playbooks/site.yml)."}


def _health(status: str, findings: list | None = None, error: dict | None = None) -> dict[str, Any]:
    return {"status": status, "checked_at": CHECKED, "findings": findings or [], "error": error}


def _health_results() -> dict[str, Any]:
    """Four hosts whose verification passed: healthy, unhealthy, could not check, not checked."""
    return {
        "gpu01": [dict(passing_doc(), health=_health("healthy"))],
        "gpu02": [dict(passing_doc(), health=_health("unhealthy", [ECC, PERSISTENCE]))],
        "gpu03": [dict(passing_doc(), health=_health("could not check", error=NO_SMI))],
        "gpu04": [dict(passing_doc(), health=None)],
    }


def test_each_hosts_health_is_in_the_json_and_counted_in_the_summary() -> None:
    report = fleet_report.build_report(_health_results(), None)
    assert {host: entry["health"] for host, entry in report["hosts"].items()} == {
        "gpu01": _health("healthy"),
        "gpu02": _health("unhealthy", [ECC, PERSISTENCE]),
        "gpu03": _health("could not check", error=NO_SMI),
        "gpu04": None,
    }
    assert report["summary"]["health"] == {"healthy": 1, "unhealthy": 1, "could_not_check": 1, "not_checked": 1}
    # health is shown, never part of the verification's verdict
    assert [entry["status"] for entry in report["hosts"].values()] == ["PASS"] * 4
    assert (report["summary"]["passed"], report["summary"]["failed"]) == (4, 0)
    assert "health" not in report["hosts"]["gpu01"]["rows"][0]  # a host's, not a row's


def test_the_health_headline_counts_the_dcgm_results() -> None:
    tests = [{"test": "memory", "gpu": 1, "result": "Fail"}, {"test": "pcie", "gpu": 0, "result": "Pass"}]
    health = dict(_health("unhealthy", [ECC]), dcgm={"level": 2, "tests": tests})
    assert fleet_report.health_headline(health) == (
        f"unhealthy, 1 finding, DCGM diag level 2: 1 Fail, 1 Pass (checked {CHECKED})"
    )
    assert fleet_report.health_headline(_health("unhealthy", [ECC])) == f"unhealthy, 1 finding (checked {CHECKED})"


def test_what_the_run_moved_on_purpose_is_said_for_a_healthy_host() -> None:
    """The run that re-pinned the driver reports the move beside "healthy", in every format's details."""
    health = dict(_health("healthy"), moved=["driver 520.61.05 -> 555.42.06"])
    report = fleet_report.build_report({"gpu01": [dict(passing_doc(), health=health)]}, None)
    headline = f"healthy (checked {CHECKED}); moved on purpose by this run: driver 520.61.05 -> 555.42.06"
    assert fleet_report.health_details(report) == [("gpu01", headline, [])]
    assert f"- **gpu01**: {headline}" in fleet_report.format_markdown(report)
    assert fleet_report.health_cell(health) == "healthy"


def test_a_note_of_the_health_check_is_listed_with_its_fix() -> None:
    note = {
        "cause": "The health metrics go to /x/gpu_fleet_health.prom, but no node_exporter runs.",
        "fix": "Install it.",
    }
    report = fleet_report.build_report(
        {"gpu01": [dict(passing_doc(), health=dict(_health("healthy"), notes=[note]))]}, None
    )
    assert fleet_report.health_details(report) == [
        ("gpu01", f"healthy (checked {CHECKED})", [("note", note["cause"], "Install it.")])
    ]


def test_each_health_status_shows_in_the_markdown_column_and_the_details() -> None:
    md = fleet_report.format_markdown(fleet_report.build_report(_health_results(), None))
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[2] for line in md.splitlines() if line.startswith("| gpu0")}
    assert cells == {
        "gpu01 (tf2.12)": "healthy",
        "gpu02 (tf2.12)": "unhealthy (2 findings)",
        "gpu03 (tf2.12)": "could not check",
        "gpu04 (tf2.12)": "not checked",
    }
    assert "GPU health: 1 healthy, 1 unhealthy, 1 could not check, 1 not checked." in md
    assert md.split("## GPU health\n\n")[1].splitlines() == [
        f"- **gpu02**: unhealthy, 2 findings (checked {CHECKED})",
        f"  - `ecc 00000000:3B:00.0`: {ECC['cause']}  ",
        f"    Fix: {ECC['fix']}",
        "  - `persistence`: Persistence mode is off.  ",
        "    Fix: nvidia-smi -pm 1",
        f"- **gpu03**: could not check (checked {CHECKED})",
        "  - `health`: nvidia-smi was not found.  ",
        "    Fix: Install the driver (playbooks/site.yml).",
    ]


def test_each_health_status_shows_in_the_html_column_and_the_details() -> None:
    page = fleet_report.format_html(fleet_report.build_report(_health_results(), None))
    for status, cell in (
        ("healthy", "healthy"),
        ("unhealthy", "unhealthy (2 findings)"),
        ("could-not-check", "could not check"),
        ("not-checked", "not checked"),
    ):
        assert f'<td class="health"><span class="health {status}">{cell}</span></td>' in page
    heads = re.findall(r"<th class=\"[a-z_]+\">([^<]*)</th>", page)
    assert heads[:3] == ["host", "status", "GPU health"]  # beside the status at 1400 px
    assert '<p id="health-summary">GPU health: 1 healthy, 1 unhealthy, 1 could not check, 1 not checked.</p>' in page
    hosts = dict(re.findall(r'<details class="host [a-z]+" id="host-([^"]+)"( open)?>', page))
    assert hosts == {"gpu02": " open", "gpu03": " open"}  # folded open: each needs a look; the others say nothing
    gpu02 = page.split('id="host-gpu02"')[1].split("</details>")[0]
    assert "<summary><b>gpu02</b> PASS: GPU health unhealthy (2 findings)</summary>" in gpu02
    assert f'<h3>GPU health</h3><p class="health">unhealthy, 2 findings (checked {CHECKED})</p>' in gpu02
    assert f"<code>ecc 00000000:3B:00.0</code>: {html.escape(ECC['cause'])}<br>Fix: {ECC['fix']}" in gpu02
    gpu03 = page.split('id="host-gpu03"')[1].split("</details>")[0]
    assert "<li><code>health</code>: nvidia-smi was not found.<br>Fix: Install the driver" in gpu03
    assert page.count('<tr class="pass">') == 4


def test_each_host_has_a_junit_health_case_failed_when_unhealthy_skipped_when_not_checked() -> None:
    suite = ET.fromstring(fleet_report.format_junit(fleet_report.build_report(_health_results(), None)))
    cases = {c.get("classname"): c for c in suite.findall("testcase") if c.get("name") == "health"}
    assert list(cases) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert len(cases["gpu01"]) == 0  # passed
    failure = cases["gpu02"].find("failure")
    assert (failure.get("type"), failure.get("message")) == (
        "ecc, persistence",
        f"unhealthy, 2 findings (checked {CHECKED})",
    )
    assert failure.text == (
        f"[ecc 00000000:3B:00.0] {ECC['cause']}\nFix: {ECC['fix']}\n"
        "[persistence] Persistence mode is off.\nFix: nvidia-smi -pm 1"
    )
    assert cases["gpu03"].find("skipped").get("message") == (
        f"could not check (checked {CHECKED}): nvidia-smi was not found. Fix: Install the driver (playbooks/site.yml)."
    )
    assert cases["gpu04"].find("skipped").get("message") == f"not checked: {fleet_report.NOT_CHECKED_REASON}"
    # every verification case passed; the one failure is gpu02's health
    assert [c.get("name") for c in suite.findall("testcase") if len(c)] == ["health"] * 3
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (
        str(4 * len(fleet_report.CHECKS) + 4),
        "1",
        "2",
    )


def test_the_text_report_counts_health_and_lists_the_findings() -> None:
    text = fleet_report.format_text(fleet_report.build_report(_health_results(), None))
    assert "GPU health: 1 healthy, 1 unhealthy, 1 could not check, 1 not checked" in text
    assert text.split("GPU health:\n")[1].splitlines()[:3] == [
        f"  gpu02: unhealthy, 2 findings (checked {CHECKED})",
        f"    [ecc 00000000:3B:00.0] {ECC['cause']}",
        f"        fix: {ECC['fix']}",
    ]


def test_a_passing_verification_with_an_unhealthy_gpu_still_passes_verification() -> None:
    report = fleet_report.build_report({"gpu02": _health_results()["gpu02"]}, None)
    host = report["hosts"]["gpu02"]
    assert (host["status"], host["rows"][0]["status"], host["problems"]) == ("PASS", "PASS", [])
    assert report["summary"] == {
        "hosts": 1,
        "passed": 1,
        "failed": 0,
        "unreachable": 0,
        "rechecked": 1,
        "not_in_run": 0,
        "health": {"healthy": 0, "unhealthy": 1, "could_not_check": 0, "not_checked": 0},
    }
    assert "1 host: 1 passed, 0 failed (0 unreachable)" in fleet_report.format_markdown(report)
    checks = [c for c in ET.fromstring(fleet_report.format_junit(report)).iter("testcase") if c.get("name") != "health"]
    assert checks and all(len(c) == 0 for c in checks)  # every verification check passed


def test_an_unreachable_host_shows_the_health_it_was_failed_for() -> None:
    doc = {
        "ok": False,
        "unreachable": True,
        "failed": "task 'Fail this host when it is unhealthy'",
        "health": _health("unhealthy", [ECC]),
    }
    report = fleet_report.build_report({"gpu05": doc}, None)
    assert report["hosts"]["gpu05"]["status"] == "FAIL"
    assert report["hosts"]["gpu05"]["health"]["findings"] == [ECC]
    assert "| gpu05 | FAIL | unhealthy (1 finding) |" in fleet_report.format_markdown(report)


def test_merge_keeps_each_hosts_health_from_when_it_was_checked(tmp_path: Path) -> None:
    _cli(tmp_path, _health_results(), T0)
    later = dict(passing_doc(), health=dict(_health("healthy"), checked_at="2026-12-01T18:03:00Z"))
    _cli(
        tmp_path,
        {"gpu01": [later]},
        T1,
        "--inventory-hosts",
        '["gpu01", "gpu02", "gpu03", "gpu04"]',
        "--limit",
        "gpu01",
    )
    latest = tmp_path / "lab" / "latest"
    data = json.loads((latest / "fleet-report.json").read_text())
    assert data["hosts"]["gpu01"]["health"]["checked_at"] == "2026-12-01T18:03:00Z"  # this run's
    assert data["hosts"]["gpu02"]["carried_over"] is True
    assert data["hosts"]["gpu02"]["health"] == _health("unhealthy", [ECC, PERSISTENCE])  # from when it was checked
    assert data["hosts"]["gpu03"]["health"] == _health("could not check", error=NO_SMI)
    assert data["summary"]["health"] == {"healthy": 1, "unhealthy": 1, "could_not_check": 1, "not_checked": 1}
    md = (latest / "fleet-report.md").read_text()
    assert "| unhealthy (2 findings) |" in md and f"- **gpu02**: unhealthy, 2 findings (checked {CHECKED})" in md
    junit = ET.fromstring((latest / "fleet-report.junit.xml").read_text())
    (carried,) = [c for c in junit.iter("testcase") if (c.get("classname"), c.get("name")) == ("gpu02", "health")]
    assert (
        carried.find("skipped").get("message")
        == f"not in this run: GPU health as last checked, unhealthy, 2 findings (checked {CHECKED})"
    )
    assert junit.get("failures") == "0"  # an earlier run's findings are not this run's failure


SITE = "/opt/tensorflow/2.18/lib/python3.11/site-packages"


def wheels_doc() -> dict[str, Any]:
    """gpu_verify.py's document of a stack whose CUDA comes from NVIDIA's wheels (tensorflow[and-cuda])."""
    doc = passing_doc()
    doc["stack"] = "tf2.18"
    doc["cuda"] = {
        "source": "wheels",
        "root": None,
        "library_dirs": [f"{SITE}/nvidia/cuda_runtime/lib", f"{SITE}/nvidia/cudnn/lib"],
    }
    doc["libraries"]["libcudart"] = {
        "version": "12.5",
        "path": f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12",
        "version_source": "cudaRuntimeGetVersion",
        "wheel": "nvidia-cuda-runtime-cu12 12.5.82",
        "ok": True,
    }
    doc["libraries"]["libcudnn"] = {
        "version": "9.3.0",
        "path": f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9",
        "version_source": "cudnnGetVersion",
        "wheel": "nvidia-cudnn-cu12 9.3.0.75",
        "ok": True,
    }
    return doc


def test_the_report_says_where_each_stacks_cuda_comes_from_and_the_wheels_files() -> None:
    runfile = dict(passing_doc(), cuda={"source": "runfile", "root": "/usr/local/cuda-11.8", "library_dirs": []})
    report = fleet_report.build_report({"gpu-f3": [runfile, wheels_doc()]}, None)
    cudart = (
        f"libcudart 12.5 (cudaRuntimeGetVersion; wheel nvidia-cuda-runtime-cu12 12.5.82) "
        f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12"
    )
    cudnn = f"libcudnn 9.3.0 (cudnnGetVersion; wheel nvidia-cudnn-cu12 9.3.0.75) {SITE}/nvidia/cudnn/lib/libcudnn.so.9"
    for text in (fleet_report.format_text(report), fleet_report.format_markdown(report)):
        assert "gpu-f3 (tf2.12): CUDA from the runfile tree /usr/local/cuda-11.8" in text
        assert f"gpu-f3 (tf2.18): CUDA from the venv's NVIDIA wheels (tensorflow[and-cuda]) under {SITE}/nvidia" in text
        assert f"gpu-f3 (tf2.18): loaded {cudart}, {cudnn}" in text
    suite = ET.fromstring(fleet_report.format_junit(report))
    said = {
        (case.get("classname"), case.get("name")): case.findtext("system-out")
        for case in suite.findall("testcase")
        if case.find("system-out") is not None
    }
    wheels = f"CUDA from the venv's NVIDIA wheels (tensorflow[and-cuda]) under {SITE}/nvidia"
    assert said == {
        ("gpu-f3 (tf2.12)", "libcudart"): "CUDA from the runfile tree /usr/local/cuda-11.8: libcudart 11.8 "
        "/usr/local/cuda-11.8/lib64/libcudart.so.11.8.89",
        ("gpu-f3 (tf2.12)", "libcudnn"): "CUDA from the runfile tree /usr/local/cuda-11.8: libcudnn 8.6.0 "
        "/usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0",
        ("gpu-f3 (tf2.18)", "libcudart"): f"{wheels}: {cudart}",
        ("gpu-f3 (tf2.18)", "libcudnn"): f"{wheels}: {cudnn}",
    }
