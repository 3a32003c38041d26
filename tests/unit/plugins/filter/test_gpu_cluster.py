"""The multi-worker plumbing on the controller: TF_CONFIG per host, async results, the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))
sys.path.insert(0, str(ROOT / "roles" / "gpu_verify" / "files"))

import fleet_report
import gpu_cluster
import gpu_report


def hostvars(ports: dict | None = None, ready: dict | None = None, **addresses: str) -> dict:
    return {
        host: {
            "gpu_verify_multiworker_worker": {
                "address": address,
                "port": (ports or {}).get(host, 2222),
                "ready": (ready or {}).get(host, True),
            }
        }
        for host, address in addresses.items()
    }


def test_tf_config_lists_every_worker_in_play_order_and_gives_each_its_index():
    configs = gpu_cluster.gpu_tf_config(
        ["gpu01", "gpu02"], hostvars(ports={"gpu02": "3333"}, gpu01="10.0.0.1", gpu02="fd00::2")
    )
    assert configs == {
        "gpu01": {"cluster": {"worker": ["10.0.0.1:2222", "[fd00::2]:3333"]}, "task": {"type": "worker", "index": 0}},
        "gpu02": {"cluster": {"worker": ["10.0.0.1:2222", "[fd00::2]:3333"]}, "task": {"type": "worker", "index": 1}},
    }


@pytest.mark.parametrize(
    "hosts, variables, all_hosts, message",
    [
        (["gpu01"], hostvars(gpu01="10.0.0.1"), None, "needs at least 2 hosts in the play, got 1 (gpu01): run"),
        (
            ["gpu01"],
            hostvars(gpu01="10.0.0.1"),
            ["gpu01", "gpu02"],
            "got 1 (gpu01); gpu02 failed or were unreachable earlier in this run",
        ),
        (
            ["gpu01", "gpu02"],
            hostvars(ports={"gpu02": 70000}, gpu01="10.0.0.1", gpu02="10.0.0.2"),
            None,
            "gpu_verify_multiworker_port of gpu02 must be a TCP port 1-65535, got 70000",
        ),
        (
            ["gpu01", "gpu02"],
            hostvars(ports={"gpu01": "x"}, gpu01="10.0.0.1", gpu02="10.0.0.2"),
            None,
            "of gpu01 must be a TCP port 1-65535, got 'x'",
        ),
        (["gpu01", "gpu02"], hostvars(gpu01="10.0.0.1", gpu02=""), None, "gpu02 has no address"),
        (
            ["gpu01", "gpu02"],
            hostvars(ready={"gpu02": False}, gpu01="10.0.0.1", gpu02="10.0.0.2"),
            None,
            "venv is missing on gpu02; every worker needs it, so no worker was started",
        ),
        (
            ["gpu01", "gpu02"],
            hostvars(gpu01="10.0.0.1", gpu02="10.0.0.1"),
            None,
            "same address and port: 10.0.0.1:2222: gpu01, gpu02",
        ),
    ],
)
def test_tf_config_refuses_a_cluster_that_cannot_form(hosts, variables, all_hosts, message):
    with pytest.raises(AnsibleFilterError) as raised:
        gpu_cluster.gpu_tf_config(hosts, variables, all_hosts)
    assert message in str(raised.value)


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


def test_notes_show_the_loaded_files_a_skipped_pci_check_and_an_unjudged_scaling_figure():
    doc = worker(0)
    doc.update(
        mode="cpu-replicas",
        libraries={"libcudart": {"version": "11.8", "path": "/usr/local/cuda-11.8/lib64/libcudart.so.11.8.89"}},
        gpus={"expected": 2, "seen": 2, "pci_bus_ids": None},
        scaling={"efficiency": 0.66, "note": "measured on logical CPU devices that share the same cores; not judged"},
        utilisation={"0": {"utilization_gpu_peak_pct": 0, "memory_used_peak_mib": 0, "samples": 3}},
    )
    notes = fleet_report.build_report({"gpu01": [doc]}, None)["hosts"]["gpu01"]["mode_notes"]
    assert "loaded libcudart 11.8 /usr/local/cuda-11.8/lib64/libcudart.so.11.8.89" in notes
    assert "PCI cross-check skipped: lspci not found or failed (install pciutils)" in notes
    assert "scaling efficiency 0.66 measured on logical CPU devices that share the same cores; not judged" in notes
    assert not any(n.startswith("peak per GPU") for n in notes)
