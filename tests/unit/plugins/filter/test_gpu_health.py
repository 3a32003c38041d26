"""The gpu_health role's filters: the health summary line, the verification's metrics, the baseline's options."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError

# tests/conftest.py puts ROOT/collections on sys.path: plugins import by their collection path.
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_health as health_filters

STACKS = [{"name": "tf2.12", "venv": "/opt/tensorflow/2.12"}, {"name": "tf2.18", "venv": "/opt/tensorflow/2.18"}]


def document(stack: str, ok: bool = True) -> dict:
    """A stack's verification document, trimmed to the keys the filters read."""
    return {
        "stack": stack,
        "ok": ok,
        "expected": {"cuda": "11.8", "cudnn": "8.6.0", "driver": "520.61.05", "gpus": 2, "tensorflow": "2.12.1"},
        "driver_version": "520.61.05",
        "gpus": {"expected": 2, "seen": 2 if ok else 1, "ok": ok},
        "libraries": {"libcudart": {"ok": True}, "libcudnn": {"ok": True}},
        "tensorflow": {"version": "2.12.1", "ok": None},
        "fit": {"ok": ok, "steady_samples_per_second": 5085.8},
        "lock": {"ok": True, "path": f"/opt/tensorflow/{stack[2:]}/tf-lock.txt"},
        "fabricmanager": {"required": False},
        "problems": [] if ok else [{"check": "gpu_count", "cause": "1 of 2 GPUs", "fix": "reseat"}],
    }


RESULTS = {"tf2.12": document("tf2.12"), "tf2.18": document("tf2.18")}


def samples(text: str) -> dict[str, str]:
    """``{'name{labels}': value}`` of a textfile, checking every family has HELP and TYPE first."""
    out, declared = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            declared.add(line.split()[2])
        elif not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            assert re.match(r"[a-z_]+", key).group(0) in declared, line
            out[key] = value
    return out


def test_verification_metrics_of_a_passing_host():
    got = samples(health_filters.gpu_health_verification_metrics(RESULTS, now=1_750_000_000))
    assert got["gpu_fleet_verification_passed"] == "1"
    assert got["gpu_fleet_verification_last_run_timestamp_seconds"] == "1750000000"
    assert got['gpu_fleet_verification_check_passed{stack="tf2.18",check="libcudnn"}'] == "1"
    assert got['gpu_fleet_verification_fit_samples_per_second{stack="tf2.12"}'] == "5085.8"
    assert (got["gpu_fleet_verification_gpus_expected"], got["gpu_fleet_verification_gpus_seen"]) == ("2", "2")
    info = [key for key in got if key.startswith("gpu_fleet_verification_info{")]
    assert info[0] == (
        'gpu_fleet_verification_info{stack="tf2.12",tensorflow_version="2.12.1",cuda_version="11.8",'
        'cudnn_version="8.6.0",driver_version="520.61.05"}'
    )
    # a section whose ok is not a bool is no check
    assert not any('check="tensorflow"' in key for key in got)


def test_verification_metrics_of_a_failed_host_name_the_failed_check():
    results = {"tf2.12": document("tf2.12", ok=False), "tf2.18": document("tf2.18")}
    got = samples(health_filters.gpu_health_verification_metrics(results, now=1))
    assert got["gpu_fleet_verification_passed"] == "0"
    assert got['gpu_fleet_verification_check_passed{stack="tf2.12",check="gpu_count"}'] == "0"
    assert got['gpu_fleet_verification_check_passed{stack="tf2.12",check="fit"}'] == "0"
    assert got["gpu_fleet_verification_gpus_seen"] == "1"


@pytest.mark.parametrize("results", [None, {}, "not a dict"])
def test_no_result_is_a_verification_that_did_not_pass(results):
    got = samples(health_filters.gpu_health_verification_metrics(results, now=5))
    assert got == {"gpu_fleet_verification_last_run_timestamp_seconds": "5", "gpu_fleet_verification_passed": "0"}


def test_every_metric_written_is_declared_in_the_one_list():
    with open(health_filters.METRICS_FILE, encoding="utf-8") as handle:
        names = {spec["name"] for spec in yaml.safe_load(handle)["metrics"]}
    text = health_filters.gpu_health_verification_metrics(RESULTS, now=1)
    assert {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")} == names


def test_baseline_args_of_a_passing_host():
    results = copy.deepcopy(RESULTS)
    results["tf2.18"]["fabricmanager"]["required"] = True
    assert health_filters.gpu_health_baseline_args(results, STACKS) == [
        "--expected-gpus", "2",
        "--driver-version", "520.61.05",
        "--fabric-manager-expected",
        "--stack", "tf2.12=/opt/tensorflow/2.12,/opt/tensorflow/2.12/tf-lock.txt",
        "--stack", "tf2.18=/opt/tensorflow/2.18,/opt/tensorflow/2.18/tf-lock.txt",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "results",
    [None, {}, {"tf2.12": document("tf2.12"), "tf2.18": document("tf2.18", ok=False)}],
    ids=["no result", "empty", "one stack failed"],
)
def test_no_baseline_from_a_verification_that_did_not_pass(results):
    assert health_filters.gpu_health_baseline_args(results, STACKS) == []


def test_summary_lines():
    healthy = {"up": True, "findings": []}
    unhealthy = {
        "up": True,
        "findings": [{"check": "pcie", "bus_id": "0000:07:00.0", "cause": "x8 of x16.", "fix": "Reseat it."}],
    }
    down = {"up": False, "error": {"cause": "nvidia-smi did not answer.", "fix": "Check the driver."}}
    assert health_filters.gpu_health_summary(healthy, "a") == "GPU health of a: healthy."
    assert health_filters.gpu_health_summary(unhealthy, "a") == (
        "GPU health of a: 1 finding(s): [pcie 0000:07:00.0] x8 of x16. Fix: Reseat it."
    )
    assert health_filters.gpu_health_summary(down, "a") == (
        "GPU health of a could not be checked: nvidia-smi did not answer. Check the driver."
    )


def test_outcome_of_the_record_command():
    written = health_filters.gpu_health_outcome('{"recorded": true, "changed": true, "path": "/x"}')
    assert (written["changed"], written["error"]) == (True, None)
    refused = health_filters.gpu_health_outcome('{"recorded": false, "changed": false, "findings": [{}]}')
    assert (refused["changed"], refused["error"]) == (False, None)
    failed = health_filters.gpu_health_outcome(
        '{"recorded": false, "changed": false, "error": {"cause": "No room.", "fix": "Free it."}}'
    )
    assert failed["error"] == {"cause": "No room.", "fix": "Free it."}
    broken = health_filters.gpu_health_outcome("", "python3: can't open file")
    assert broken["changed"] is False and "python3: can't open file" in broken["error"]["cause"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5min", 300.0), ("1h 30min", 5400.0), ("90", 90.0), ("2 min", 120.0), ("1d", 86400.0), ("500ms", 0.5)],
)
def test_timespans_as_systemd_reads_them(text, seconds):
    assert health_filters.gpu_health_timespan_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "every 5 minutes", "5 parsecs", "-5min", "5min later"])
def test_what_is_no_timespan(text):
    assert health_filters.gpu_health_timespan_seconds(text) is None


# --- the role's checks and what it says --------------------------------------------------------------

GOOD_OPTIONS = {
    "gpu_health_interval": "5min",
    "gpu_health_timeout": 20,
    "gpu_health_dcgm_diag_level": 0,
    "gpu_health_dcgm_timeout": 900,
    "gpu_health_fail_on_findings": False,
    "gpu_health_kernel_log": "",
    "gpu_health_textfile_dir": "/var/lib/prometheus/node-exporter",
    "gpu_health_state_dir": "/var/lib/gpu-health",
    "gpu_health_install_dir": "/opt/gpu-health",
    "gpu_health_command": "/usr/local/sbin/gpu-health",
    "gpu_health_python": "/usr/bin/python3",
}
FIX = "Fix it in the inventory or on the -e command line."


def test_the_defaults_are_good_options():
    assert health_filters.gpu_health_option_problems(GOOD_OPTIONS) == []


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "gpu_health_interval",
            "30s",
            "gpu_health_interval is 30s; it must be a systemd time span of at least a minute",
        ),
        ("gpu_health_interval", "soon", "gpu_health_interval is soon; it must be a systemd time span"),
        ("gpu_health_timeout", "0", "gpu_health_timeout is 0; it must be a whole number of seconds above 0 and below"),
        ("gpu_health_timeout", "2.5", "gpu_health_timeout is 2.5; it must be a whole number of seconds"),
        ("gpu_health_dcgm_diag_level", 5, "gpu_health_dcgm_diag_level is 5; it must be 0 (no DCGM diagnostic)"),
        ("gpu_health_dcgm_timeout", 86400, "gpu_health_dcgm_timeout is 86400; it must be a whole number of seconds"),
        ("gpu_health_fail_on_findings", "maybe", "gpu_health_fail_on_findings is maybe; it must be true or false."),
        ("gpu_health_kernel_log", "kern.log", "gpu_health_kernel_log is kern.log; it must be empty (journalctl"),
        (
            "gpu_health_state_dir",
            "state",
            "gpu_health_state_dir is state; it must be an absolute path on the host (the",
        ),
    ],
)
def test_a_bad_option_is_named_with_its_rule_and_the_fix(name, value, message):
    (problem,) = health_filters.gpu_health_option_problems(GOOD_OPTIONS | {name: value})
    assert problem.startswith(message) and problem.endswith(FIX)


def test_every_bad_option_is_named_at_once():
    bad = GOOD_OPTIONS | {"gpu_health_timeout": -1, "gpu_health_command": "gpu-health"}
    assert len(health_filters.gpu_health_option_problems(bad)) == 2


def test_the_install_reads_its_files_through_the_options_check():
    files = [{"dest": "/usr/local/sbin/gpu-health"}]
    assert health_filters.gpu_health_options_checked(files, GOOD_OPTIONS) is files
    bad = GOOD_OPTIONS | {"gpu_health_timeout": -1, "gpu_health_command": "gpu-health"}
    with pytest.raises(AnsibleFilterError) as raised:
        health_filters.gpu_health_options_checked(files, bad)
    assert str(raised.value) == " ".join(health_filters.gpu_health_option_problems(bad))


HEALTHY = {"up": True, "exit_code": 0, "findings": []}
UNHEALTHY = {"up": True, "exit_code": 1, "findings": [{"check": "ecc", "cause": "3 ECC errors.", "fix": "Drain it."}]}


def run_of(report: dict | None, rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": "" if report is None else json.dumps(report), "stderr": stderr}


def test_the_check_of_a_healthy_host_says_nothing():
    assert health_filters.gpu_health_check(run_of(HEALTHY), "/usr/local/sbin/gpu-health", "a") == {
        "problem": None,
        "summary": None,
    }


def test_the_check_of_an_unhealthy_host_names_the_findings_and_does_not_stop():
    found = health_filters.gpu_health_check(run_of(UNHEALTHY, rc=1), "gpu-health", "a")
    assert found == {"problem": None, "summary": health_filters.gpu_health_summary(UNHEALTHY, "a")}


def test_a_check_without_a_report_stops_naming_the_exit_status_and_its_error():
    found = health_filters.gpu_health_check(
        run_of(None, rc=127, stderr=" not found \n"), "/usr/local/sbin/gpu-health", "a"
    )
    assert found["problem"] == (
        "/usr/local/sbin/gpu-health on a ended with exit status 127 and no report: not found. Run "
        "`/usr/local/sbin/gpu-health --format json` there and read its error; rerun playbooks/verify.yml to reinstall it."
    )
    long = health_filters.gpu_health_check(run_of(HEALTHY, rc=3, stderr="word " * 200), "c", "a")["problem"]
    assert "word word..." in long and len(long) < 600


def recorded(outcome: dict | None = None, stderr: str = "") -> dict:
    return {"rc": 0, "stdout": json.dumps(outcome) if outcome is not None else "", "stderr": stderr}


def test_a_recorded_baseline_of_a_healthy_host_says_nothing():
    done = recorded({"recorded": True, "changed": False, "error": None})
    assert health_filters.gpu_health_record_verdict(done, HEALTHY, True, "a") == {"problem": None, "note": None}
    assert health_filters.gpu_health_record_verdict({"skipped": True}, None, True, "a") == {
        "problem": None,
        "note": None,
    }


def test_a_baseline_that_could_not_be_written_stops_the_host():
    done = recorded({"recorded": False, "error": {"cause": "/var/lib/gpu-health is read-only.", "fix": "Remount it."}})
    assert health_filters.gpu_health_record_verdict(done, UNHEALTHY, True, "a") == {
        "problem": "The health baseline of a could not be recorded: /var/lib/gpu-health is read-only. Remount it.",
        "note": None,
    }
    broken = health_filters.gpu_health_record_verdict(recorded(None, stderr="Traceback"), HEALTHY, False, "a")
    assert broken["problem"].startswith("The health baseline of a could not be recorded: the command gave no outcome")


def test_a_refused_baseline_is_said_and_an_unhealthy_host_fails_only_when_asked():
    refused = recorded({"recorded": False, "error": None, "findings": [{"cause": "1 GPU fewer."}, {"cause": "x8."}]})
    note = (
        "The health baseline of a was not renewed: though verified, the host is not healthy against what it would "
        "record - 1 GPU fewer. x8."
    )
    assert health_filters.gpu_health_record_verdict(refused, UNHEALTHY, "false", "a") == {"problem": None, "note": note}
    fails = (
        f"{health_filters.gpu_health_summary(UNHEALTHY, 'a')} (It fails because gpu_health_fail_on_findings is true.)"
    )
    assert health_filters.gpu_health_record_verdict({"skipped": True}, UNHEALTHY, True, "a") == {
        "problem": fails,
        "note": None,
    }
    assert health_filters.gpu_health_record_verdict(refused, UNHEALTHY, True, "a") == {
        "problem": f"{note} {fails}",
        "note": None,
    }


# --- the run's own check: what it pins, and whether it records ----------------------------------------------------


def test_the_runs_check_gets_what_the_run_pins_and_records_only_without_a_timer():
    driver, absent = {"version": "555.42.06", "runfile": {}}, [{"name": "tf2.11", "venv": "/opt/tensorflow/2.11"}]
    args = health_filters.gpu_health_check_args(True, driver, STACKS, absent)
    assert args[0] == "--intended" and len(args) == 2
    assert json.loads(args[1]) == {
        "driver_version": "555.42.06",
        "stacks": ["tf2.12", "tf2.18"],
        "removed_stacks": ["tf2.11"],
    }
    assert health_filters.gpu_health_check_args("false", None, None, None) == [
        "--intended",
        '{"driver_version": null, "removed_stacks": [], "stacks": []}',
        "--record",
    ]


def test_what_the_run_moved_is_said_with_a_healthy_host():
    moved = [{"what": "driver", "from": "520.61.05", "to": "555.42.06", "text": "driver 520.61.05 -> 555.42.06"}]
    report = {"up": True, "exit_code": 0, "findings": [], "moved": moved}
    summary = health_filters.gpu_health_summary(report, "gpu-a")
    assert summary == (
        "GPU health of gpu-a: healthy. Moved on purpose by this run, judged against its pins (the baseline follows "
        "once the verification passes): driver 520.61.05 -> 555.42.06."
    )
    check = health_filters.gpu_health_check({"rc": 0, "stdout": json.dumps(report)}, "gpu-health", "gpu-a")
    assert check == {"problem": None, "summary": summary}
    quiet = health_filters.gpu_health_check({"rc": 0, "stdout": json.dumps({**report, "moved": []})}, "gpu-health", "a")
    assert quiet == {"problem": None, "summary": None}


def test_metrics_that_no_node_exporter_serves_are_said_with_the_fix():
    note = {
        "cause": "The health metrics go to /x/gpu_fleet_health.prom, but no node_exporter runs.",
        "fix": "Install it.",
    }
    report = {"up": True, "exit_code": 0, "findings": [], "notes": [note]}
    summary = health_filters.gpu_health_summary(report, "gpu-a")
    assert summary == f"GPU health of gpu-a: healthy. Note: {note['cause']} Fix: Install it."
    check = health_filters.gpu_health_check({"rc": 0, "stdout": json.dumps(report)}, "gpu-health", "gpu-a")
    assert check["summary"] == summary
