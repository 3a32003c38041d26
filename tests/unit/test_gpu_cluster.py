"""The multi-worker plumbing on the controller: TF_CONFIG per host, async results, the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "filter_plugins"))
sys.path.insert(0, str(ROOT / "roles" / "gpu_verify" / "files"))

import fleet_report
import gpu_cluster
import gpu_report


def hostvars(**addresses: str) -> dict:
    return {host: {"__gpu_verify_mw_address": address} for host, address in addresses.items()}


def test_tf_config_lists_every_worker_in_play_order_and_gives_each_its_index():
    configs = gpu_cluster.gpu_tf_config(["gpu01", "gpu02"], hostvars(gpu01="10.0.0.1", gpu02="fd00::2"), "2222")
    assert configs == {
        "gpu01": {"cluster": {"worker": ["10.0.0.1:2222", "[fd00::2]:2222"]}, "task": {"type": "worker", "index": 0}},
        "gpu02": {"cluster": {"worker": ["10.0.0.1:2222", "[fd00::2]:2222"]}, "task": {"type": "worker", "index": 1}},
    }


@pytest.mark.parametrize(
    "hosts, addresses, port, message",
    [
        (["gpu01"], {"gpu01": "10.0.0.1"}, 2222, "needs at least 2 hosts in the play, got 1 (gpu01)"),
        (["gpu01", "gpu02"], {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2"}, 70000, "must be a TCP port 1-65535"),
        (["gpu01", "gpu02"], {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2"}, "x", "must be a TCP port 1-65535"),
        (["gpu01", "gpu02"], {"gpu01": "10.0.0.1", "gpu02": ""}, 2222, "gpu02 has no address"),
        (
            ["gpu01", "gpu02"],
            {"gpu01": "10.0.0.1", "gpu02": "10.0.0.1"},
            2222,
            "same address and port: 10.0.0.1:2222: gpu01, gpu02",
        ),
    ],
)
def test_tf_config_refuses_a_cluster_that_cannot_form(hosts, addresses, port, message):
    with pytest.raises(AnsibleFilterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gpu_cluster.gpu_tf_config(hosts, hostvars(**addresses), port)


def test_async_status_results_keep_their_stack():
    stack = {"name": "tf2.12", "venv": "/opt/tensorflow/2.12"}
    doc = {"ok": True, "problems": []}
    status = {
        "ansible_job_id": "j1",
        "finished": 1,
        "rc": 0,
        "stdout": json.dumps(doc),
        "item": {"ansible_job_id": "j1", "item": stack},
    }
    assert gpu_report.gpu_verify_stack_name(status) == "tf2.12"
    assert gpu_report.gpu_verify_result(status) == doc


def test_a_worker_ansible_stopped_waiting_for_is_a_failure():
    status = {"ansible_job_id": "j1", "finished": 0, "item": {"ansible_job_id": "j1", "item": {"name": "tf2.12"}}}
    doc = gpu_report.gpu_verify_result(status)
    assert doc["ok"] is False
    assert "still running when Ansible stopped waiting" in doc["problems"][0]["cause"]


def worker(index: int, ok: bool = True, workers: int = 2) -> dict:
    return {
        "ok": ok,
        "stack": "tf2.12",
        "problems": [] if ok else [{"check": "fit", "cause": "The fit did not finish within 45 s", "fix": "x"}],
        "multiworker": {"workers": workers, "task_index": index, "is_chief": index == 0, "cluster": ["a:1", "b:1"]},
        "fit": {
            "ok": ok,
            "num_replicas_in_sync": 2,
            "samples_per_second": 100.0 + index,
            "loss_start": 2.4,
            "loss_end": 1.2,
            "fit_seconds": 3.0,
            "problems": [] if ok else [{"check": "fit", "cause": "The fit did not finish within 45 s", "fix": "x"}],
        },
    }


def test_report_shows_the_chiefs_result_and_the_workers():
    report = fleet_report.build_report({"gpu01": [worker(0)], "gpu02": [worker(1)]}, None)
    summary = report["multiworker"]
    assert summary["status"] == "PASS"
    assert (summary["workers"], summary["chief"], summary["num_replicas_in_sync"]) == (2, "gpu01", 2)
    assert summary["samples_per_second"] == 100.0
    assert report["hosts"]["gpu01"]["rows"][0]["workers"] == "2 (chief)"
    assert report["hosts"]["gpu02"]["rows"][0]["workers"] == "2"
    line = "Multi-worker fit (MultiWorkerMirroredStrategy): PASS, 2 workers (chief gpu01), 2 replicas in sync"
    assert line in fleet_report.format_text(report)
    assert line in fleet_report.format_markdown(report)
    assert '<p id="multiworker" class="pass">' + line in fleet_report.format_html(report)
    assert 'name="multiworker"' in fleet_report.format_junit(report)


def test_report_fails_the_cluster_when_a_worker_failed_or_is_missing():
    failed = fleet_report.build_report({"gpu01": [worker(0, ok=False)], "gpu02": [worker(1)]}, None)
    assert failed["multiworker"]["status"] == "FAIL"
    assert failed["multiworker"]["problems"][0]["host"] == "gpu01"
    missing = fleet_report.build_report(
        {"gpu01": [worker(0)], "gpu02": {"ok": False, "problems": [{"check": "run", "cause": "c", "fix": "f"}]}}, None
    )
    assert missing["multiworker"]["status"] == "FAIL"
    assert missing["multiworker"]["problems"][-1]["cause"] == "Only 1 of 2 workers returned a result."


def test_no_multiworker_section_without_a_multiworker_run():
    report = fleet_report.build_report({"gpu01": {"ok": True, "problems": []}}, None)
    assert report["multiworker"] is None
    assert "Multi-worker" not in fleet_report.format_text(report)
