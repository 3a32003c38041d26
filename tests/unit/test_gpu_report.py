"""Filters that turn gpu_verify.py runs into the fleet report's input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))

import gpu_report


def test_result_is_the_printed_document():
    doc = {"ok": True, "problems": [], "stack": "tf2.12"}
    assert gpu_report.gpu_verify_result({"stdout": json.dumps(doc), "rc": 0}) == doc


def test_result_without_json_names_rc_and_stderr():
    doc = gpu_report.gpu_verify_result(
        {"stdout": "", "stderr": "x\ny\nNo such file: /opt/tensorflow/2.12/bin/python", "rc": 2}
    )
    assert doc["ok"] is False
    assert doc["problems"][0]["cause"] == (
        "gpu_verify.py exited with rc 2 and printed no report: x y No such file: /opt/tensorflow/2.12/bin/python"
    )


def test_collect_lists_every_host_with_stacks_and_overrides():
    hostvars = {
        "a": {
            "gpu_verify_results": {"tf2.12": {"ok": True}, "tf2.15": {"ok": False}},
            "gpu_preflight_overridden": [{"check": "noexec", "cause": "c", "fix": "f"}],
        },
        "b": {},
    }
    report = gpu_report.gpu_verify_collect(["a", "b"], hostvars, ["a"])
    assert [d["ok"] for d in report["a"]] == [True, False]
    assert report["a"][0]["preflight_overridden"][0]["check"] == "noexec"
    assert report["b"]["ok"] is False and report["b"]["unreachable"] is True


def test_missing_venv_names_it_and_the_playbook_to_run():
    run = {"skipped": True, "item": {"name": "tf2.12", "venv": "/opt/tensorflow/2.12"}}
    doc = gpu_report.gpu_verify_result(run, "/opt/gpu-verify")
    assert doc["ok"] is False and doc["stack"] == "tf2.12"
    assert doc["problems"][0]["cause"] == "The venv /opt/tensorflow/2.12 of stack tf2.12 does not exist on the host."
    assert doc["problems"][0]["fix"].startswith("Run playbooks/tensorflow.yml (or site.yml) first; then verify by hand")


def test_du_bytes_parses_du_output():
    lines = ["5368709120\t/usr/local/cuda-11.8", "1717986918\t/opt/tensorflow/2.12", "du: cannot access 'x'"]
    assert gpu_report.gpu_du_bytes(lines) == {"/usr/local/cuda-11.8": 5368709120, "/opt/tensorflow/2.12": 1717986918}
