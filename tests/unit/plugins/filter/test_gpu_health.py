"""The gpu_health role's filters: the health summary line, the verification's metrics, the baseline's options."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

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
