"""Filters that turn gpu_verify.py runs into the fleet report's input."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))
sys.path.insert(0, str(ROOT / "roles" / "gpu_verify" / "files"))

import fleet_report
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
    assert report["b"] == {
        "ok": False,
        "unreachable": True,
        "error": None,
        "failed": None,
        "failed_check": None,
        "connection": "ssh",
        "health": None,
    }


def test_collect_carries_the_drivers_reboot_facts():
    hostvars = {
        "a": {
            "gpu_verify_results": {"tf2.12": {"ok": True}},
            "nvidia_driver_reboot_required": True,
            "nvidia_driver_loaded_version": "520.61.05",
        },
        "b": {"gpu_verify_results": {"tf2.12": {"ok": True}}},
    }
    report = gpu_report.gpu_verify_collect(["a", "b"], hostvars, ["a", "b"])
    assert (report["a"][0]["driver_reboot_required"], report["a"][0]["driver_loaded_version"]) == (True, "520.61.05")
    assert (report["b"][0]["driver_reboot_required"], report["b"][0]["driver_loaded_version"]) == (False, None)


def test_collect_passes_the_connection_and_ansibles_message_of_a_host_that_left_the_play():
    hostvars = {
        "c1": {"ansible_connection": "containers.podman.podman"},
        "c2": {"ansible_connection": "ssh", "gpu_verify_unreachable_reason": "ssh: connect to host c2: timed out"},
        "up": {},
    }
    report = gpu_report.gpu_verify_collect(["c1", "c2", "up"], hostvars, ["up"])
    assert (report["c1"]["connection"], report["c1"]["error"]) == ("containers.podman.podman", None)
    assert (report["c2"]["connection"], report["c2"]["error"]) == ("ssh", "ssh: connect to host c2: timed out")
    assert report["c1"]["failed"] is None


def test_collect_passes_the_failed_task_of_a_host_that_left_the_play():
    hostvars = {"f": {"gpu_verify_failed_reason": "task 'Install the driver': exit status 1"}, "up": {}}
    report = gpu_report.gpu_verify_collect(["f", "up"], hostvars, ["up"])
    assert (report["f"]["failed"], report["f"]["error"]) == ("task 'Install the driver': exit status 1", None)
    assert report["f"]["unreachable"] is False and report["f"]["failed_check"] is None
    built = fleet_report.build_report(report, None)
    (found,) = built["hosts"]["f"]["problems"]
    assert found["cause"] == "Host failed before verification, at task 'Install the driver': exit status 1"
    assert "SSH" not in found["fix"]
    assert built["hosts"]["f"]["unreachable"] is False and built["summary"]["unreachable"] == 0
    # still in the play but without results: its verification did not run; not called unreachable
    assert report["up"]["unreachable"] is False and report["up"]["problems"][0]["check"] == "run"
    assert report["up"]["problems"][0]["cause"].startswith("The verification did not run on this host")


PREFLIGHT_STOP = (
    "task 'gpu_fleet.tf_hosts.gpu_preflight : Stop this host before any change, with every problem found, or say its "
    "warnings': 4 GPUs expected (gpu_preflight_expected_gpu_count), nvidia-smi sees 2"
)


def test_a_host_stopped_by_a_preflight_check_is_failed_in_that_check_never_unreachable():
    """A host stopped in preflight (the callback kept the failed task and its check) is reported failed
    (check preflight) in the JSON, text, Markdown, HTML and JUnit reports, and never counted unreachable;
    the unreachable host beside it still is."""
    hostvars = {
        "stopped": {"gpu_verify_failed_reason": PREFLIGHT_STOP, "gpu_verify_failed_check": "preflight"},
        # An earlier failure's check does not outlive an unreachable message (the callback clears it too).
        "gone": {"gpu_verify_unreachable_reason": "ssh: connect to host gone port 22: No route to host"},
        "up": {"gpu_verify_results": {"tf2.12": {"ok": True}}},
    }
    collected = gpu_report.gpu_verify_collect(["stopped", "gone", "up"], hostvars, ["up"])
    assert (collected["stopped"]["unreachable"], collected["stopped"]["failed_check"]) == (False, "preflight")
    assert collected["gone"]["unreachable"] is True
    report = fleet_report.build_report(collected, None)
    stopped = report["hosts"]["stopped"]
    assert (stopped["status"], stopped["unreachable"]) == ("FAIL", False)
    (problem,) = stopped["problems"]
    cause = f"Host failed (check preflight) before any change, at {PREFLIGHT_STOP}"
    assert (problem["check"], problem["cause"]) == ("preflight", cause)
    assert stopped["rows"][0]["problems"] == "preflight"
    assert stopped["rows"][0]["checks"]["verification"] == {"status": "fail", "passed": False, "reason": cause}
    assert (report["summary"]["failed"], report["summary"]["unreachable"]) == (2, 1)
    text, markdown = fleet_report.format_text(report), fleet_report.format_markdown(report)
    html = fleet_report.format_html(report)
    assert "3 hosts: 1 passed, 2 failed (1 unreachable)" in text and "(1 unreachable)" in markdown
    for shown in (text, markdown, html):
        assert "failed (check preflight)" in shown
        assert "stopped [unreachable]" not in shown and "**stopped** `unreachable`" not in shown
    junit = ET.fromstring(fleet_report.format_junit(report))
    (failure,) = [
        c.find("failure")
        for c in junit.iter("testcase")
        if c.get("classname") == "stopped" and c.find("failure") is not None
    ]
    assert (failure.get("type"), failure.get("message")) == ("preflight", cause)


PASSED = {"ok": True, "problems": [], "stack": "tf2.12", "schema": 1, "gpus": {"expected": 2, "seen": 2}}
BASELINE_TASK = "task 'Stop when the baseline could not be written or the host is unhealthy': nvidia-smi failed"


def test_a_host_failed_after_its_verification_passed_is_failed_at_that_step():
    hostvars = {
        "late": {"gpu_verify_results": {"tf2.12": PASSED}, "gpu_verify_failed_reason": BASELINE_TASK},
        "lost": {"gpu_verify_results": {"tf2.12": PASSED}, "gpu_verify_unreachable_reason": "ssh: timed out"},
        "up": {"gpu_verify_results": {"tf2.12": PASSED}},
    }
    collected = gpu_report.gpu_verify_collect(["late", "lost", "up"], hostvars, ["up"])
    (late,) = collected["late"]
    assert late["ok"] is False and late["stack"] == "tf2.12" and late["gpus"] == PASSED["gpus"]
    assert late["problems"] == [
        {
            "check": "after_verification",
            "cause": f"The verification passed, then the run failed this host at {BASELINE_TASK}",
            "fix": late["problems"][0]["fix"],
        }
    ]
    assert collected["lost"][0]["problems"][0]["cause"].endswith("at a connection lost: ssh: timed out")
    assert collected["up"][0]["ok"] is True and collected["up"][0]["problems"] == []
    hosts = fleet_report.build_report(collected, None)["hosts"]
    assert (hosts["late"]["status"], hosts["up"]["status"]) == ("FAIL", "PASS")
    assert hosts["late"]["rows"][0]["checks"]["after_verification"]["reason"] == late["problems"][0]["cause"]
    assert "after_verification" in fleet_report.format_text(fleet_report.build_report(collected, None))


def test_a_host_whose_checks_failed_keeps_its_own_documents_when_it_left_the_play():
    failed = {"ok": False, "problems": [{"check": "fit", "cause": "loss went up", "fix": "f"}], "stack": "tf2.12"}
    hostvars = {"f": {"gpu_verify_results": {"tf2.12": failed}, "gpu_verify_failed_reason": "task 'Fail': fit"}}
    assert gpu_report.gpu_verify_collect(["f"], hostvars, [])["f"][0]["problems"] == failed["problems"]


def test_collected_podman_host_gets_the_container_fix_and_one_failed_junit_case_per_host():
    hostvars = {"gpu-f3": {"ansible_connection": "containers.podman.podman"}, "gpu-f4": {}}
    report = fleet_report.build_report(gpu_report.gpu_verify_collect(["gpu-f3", "gpu-f4"], hostvars, []), None)
    (podman,) = report["hosts"]["gpu-f3"]["problems"]
    assert podman["cause"] == "Host unreachable or failed earlier in this run (see the run's output above)."
    assert "`podman ps -a --filter name=gpu-f3`" in podman["fix"] and "SSH" not in podman["fix"]
    assert "SSH reachability and keys" in report["hosts"]["gpu-f4"]["problems"][0]["fix"]
    suite = ET.fromstring(fleet_report.format_junit(report))
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        (host, check) for host in ("gpu-f3", "gpu-f4") for check in ("verification", *fleet_report.CHECKS, "health")
    ]
    # One failure per host; its checks did not run and its health was not checked (skipped), none passed.
    assert [c.get("name") for c in cases if c.find("failure") is not None] == ["verification"] * 2
    assert all(c.find("skipped") is not None for c in cases if c.get("name") != "verification")
    checks = len(fleet_report.CHECKS) + 1
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (
        str(2 + 2 * checks),
        "2",
        str(2 * checks),
    )


def test_missing_venv_names_it_and_the_playbook_to_run():
    run = {"skipped": True, "item": {"name": "tf2.12", "venv": "/opt/tensorflow/2.12"}}
    doc = gpu_report.gpu_verify_result(run, "/opt/gpu-verify")
    assert doc["ok"] is False and doc["stack"] == "tf2.12"
    assert doc["problems"][0]["cause"] == "The venv /opt/tensorflow/2.12 of stack tf2.12 does not exist on the host."
    assert doc["problems"][0]["fix"].startswith("Run playbooks/tensorflow.yml (or site.yml) first; then verify by hand")


def test_du_bytes_parses_du_output():
    lines = ["5368709120\t/usr/local/cuda-11.8", "1717986918\t/opt/tensorflow/2.12", "du: cannot access 'x'"]
    assert gpu_report.gpu_du_bytes(lines) == {"/usr/local/cuda-11.8": 5368709120, "/opt/tensorflow/2.12": 1717986918}


def test_collect_carries_the_default_switch():
    switch = {"from": "tf2.12", "to": "tf2.18", "switched": False, "default": "tf2.12", "results": {}}
    hostvars = {
        "a": {"gpu_verify_results": {"tf2.12": {"ok": True}}, "gpu_env_default_switch": switch},
        "b": {"gpu_verify_results": {"tf2.12": {"ok": True}}},
    }
    report = gpu_report.gpu_verify_collect(["a", "b"], hostvars, ["a", "b"])
    assert (report["a"][0]["default_switch"], report["b"][0]["default_switch"]) == (switch, None)


def test_collect_shows_the_failed_check_through_the_system_path_in_the_new_defaults_row():
    recheck = {"ok": False, "stack": "tf2.18", "problems": [{"cause": "libcudnn from /opt/shadow", "fix": "x"}]}
    switch = {"from": "tf2.12", "to": "tf2.18", "switched": False, "results": {"tf2.18": recheck}}
    results = {
        "tf2.12": {"ok": True, "disk_used_bytes": {"/a": 1}},
        "tf2.18": {"ok": True, "disk_used_bytes": {"/a": 1}},
    }
    hostvars = {"a": {"gpu_verify_results": results, "gpu_env_default_switch": switch}}
    docs = gpu_report.gpu_verify_collect(["a"], hostvars, ["a"])["a"]
    assert [doc["ok"] for doc in docs] == [True, False]
    assert docs[1]["problems"] == recheck["problems"] and docs[1]["disk_used_bytes"] == {"/a": 1}


def test_outcome_is_the_results_as_given_without_checks_of_the_switch():
    results = {"tf2.12": {"ok": True}}
    assert gpu_report.gpu_verify_outcome(results, None) is results
    assert gpu_report.gpu_verify_outcome(None, {"results": {}}) is None
    assert gpu_report.gpu_verify_outcome(None, {"results": {"tf2.18": {"ok": True}}}) == {"tf2.18": {"ok": True}}


def test_held_back_stacks_become_failed_results_that_name_the_artifact():
    held = gpu_report.gpu_verify_held_back([{"name": "tf2.18", "cause": "cudnn.tar.xz has sha256 aa, not bb."}])
    assert list(held) == ["tf2.18"] and held["tf2.18"]["ok"] is False
    problem = held["tf2.18"]["problems"][0]
    assert problem["check"] == "artifacts"
    assert problem["cause"].startswith("Held back: nothing of stack tf2.18 was installed or changed in this run.")
    assert problem["cause"].endswith("cudnn.tar.xz has sha256 aa, not bb.")
    assert gpu_report.gpu_verify_held_back([]) == {}


# gpu_health.py's JSON report (build_report / failed_report there), as gpu_health publishes it.
ECC = {
    "check": "ecc",
    "bus_id": "00000000:3B:00.0",
    "cause": "GPU 00000000:3B:00.0 has 2 uncorrectable ECC errors since the driver loaded.",
    "fix": "Drain the host and have the GPU replaced.",
}
PERSISTENCE = {"check": "persistence", "bus_id": None, "cause": "Persistence mode is off.", "fix": "nvidia-smi -pm 1"}


def _health_report(exit_code: int, findings: list | None = None, error: dict | None = None) -> dict:
    return {
        "up": exit_code != 2,
        "healthy": None if exit_code == 2 else exit_code == 0,
        "exit_code": exit_code,
        "checked_at": "2026-12-01T17:03:12Z",
        "checked_at_epoch": 1796144592.0,
        "error": error,
        "checks": {} if exit_code == 2 else {"ecc": not findings, "persistence": not findings},
        "findings": findings or [],
        "gpus": [] if exit_code == 2 else [{"bus_id": "00000000:3B:00.0", "present": 1}],
        "driver": {} if exit_code == 2 else {"user_space": "535.104.05", "kernel_module": "535.104.05"},
        "xid_events": [],
    }


NO_SMI = {"cause": "nvidia-smi was not found.", "fix": "Install the driver (playbooks/site.yml)."}


def _compact(status: str, findings: list | None = None, error: dict | None = None) -> dict:
    return {
        "status": status,
        "checked_at": "2026-12-01T17:03:12Z",
        "findings": findings or [],
        "error": error,
        "dcgm": None,
        "moved": [],
        "notes": [],
    }


def test_collect_carries_each_hosts_health_compact_and_none_without_the_fact():
    results = {"gpu_verify_results": {"tf2.12": {"ok": True}, "tf2.18": {"ok": True}}}
    hostvars = {
        "ok": dict(results, gpu_health_report=_health_report(0)),
        "sick": dict(results, gpu_health_report=_health_report(1, [ECC, PERSISTENCE])),
        "blind": dict(results, gpu_health_report=_health_report(2, error=NO_SMI)),
        "unchecked": dict(results),  # gpu_health did not run (or ran under --check)
    }
    report = gpu_report.gpu_verify_collect(list(hostvars), hostvars, list(hostvars))
    expected = {
        "ok": _compact("healthy"),
        "sick": _compact("unhealthy", [ECC, PERSISTENCE]),
        "blind": _compact("could not check", error=NO_SMI),
        "unchecked": None,
    }
    assert {host: [doc["health"] for doc in docs] for host, docs in report.items()} == {
        host: [health, health] for host, health in expected.items()
    }
    # compact: not the GPU rows, the driver, the checks or the XID events
    assert set(report["sick"][0]["health"]) == {"status", "checked_at", "findings", "error", "dcgm", "moved", "notes"}


def test_what_the_run_moved_on_purpose_is_carried_as_its_words():
    moved = [{"what": "driver", "from": "520.61.05", "to": "555.42.06", "text": "driver 520.61.05 -> 555.42.06"}]
    health = gpu_report.compact_health({**_health_report(0), "moved": moved})
    assert (health["status"], health["moved"]) == ("healthy", ["driver 520.61.05 -> 555.42.06"])


def test_collect_carries_the_dcgm_result_per_test():
    dcgm = {
        "level": 2,
        "tests": [
            {"category": "Hardware", "test": "memory", "result": "Fail", "gpu": 1, "info": [], "warnings": ["x"]},
            {"category": "Integration", "test": "pcie", "result": "Pass", "gpu": 0, "info": [], "warnings": []},
        ],
    }
    hostvars = {
        "h": {"gpu_verify_results": {"tf": {"ok": True}}, "gpu_health_report": dict(_health_report(1), dcgm=dcgm)}
    }
    (doc,) = gpu_report.gpu_verify_collect(["h"], hostvars, ["h"])["h"]
    assert doc["health"]["dcgm"] == {
        "level": 2,
        "tests": [{"test": "memory", "gpu": 1, "result": "Fail"}, {"test": "pcie", "gpu": 0, "result": "Pass"}],
    }


def test_collect_carries_the_health_of_hosts_without_verification_results():
    sick = _health_report(1, [ECC])
    hostvars = {
        "left": {
            "gpu_verify_failed_reason": "task 'Fail this host when it is unhealthy': ...",
            "gpu_health_report": sick,
        },
        "stayed": {"gpu_health_report": _health_report(2, error=NO_SMI)},
        "plain": {},
    }
    report = gpu_report.gpu_verify_collect(["left", "stayed", "plain"], hostvars, ["stayed", "plain"])
    assert report["left"]["unreachable"] is False and report["left"]["health"] == _compact("unhealthy", [ECC])
    assert report["stayed"]["unreachable"] is False
    assert report["stayed"]["health"] == _compact("could not check", error=NO_SMI)
    assert report["plain"]["health"] is None


def test_health_status_without_an_exit_code_follows_up_and_the_findings():
    rows = [
        ({"up": True, "healthy": True, "findings": []}, "healthy"),
        ({"up": True, "healthy": False, "findings": [ECC]}, "unhealthy"),
        ({"up": False, "error": NO_SMI}, "could not check"),
    ]
    for report, status in rows:
        hostvars = {"h": {"gpu_verify_results": {"tf": {"ok": True}}, "gpu_health_report": report}}
        assert gpu_report.gpu_verify_collect(["h"], hostvars, ["h"])["h"][0]["health"]["status"] == status


def test_a_collected_unhealthy_host_still_passes_verification_and_fails_its_health_case():
    passed = {"schema": 1, "ok": True, "problems": []}
    hostvars = {"gpu1": {"gpu_verify_results": {"tf2.12": passed}, "gpu_health_report": _health_report(1, [ECC])}}
    report = fleet_report.build_report(gpu_report.gpu_verify_collect(["gpu1"], hostvars, ["gpu1"]), None)
    assert report["hosts"]["gpu1"]["status"] == "PASS" and report["summary"]["passed"] == 1
    assert report["hosts"]["gpu1"]["health"]["status"] == "unhealthy"
    suite = ET.fromstring(fleet_report.format_junit(report))
    assert [c.get("name") for c in suite.findall("testcase") if c.find("failure") is not None] == ["health"]


VERIFY_STACK = {
    "name": "tf215",
    "venv": "/opt/tensorflow/2.15",
    "cuda_toolkit": {"series": "12.2", "root": "/usr/local/cuda-12.2"},
    "cudnn": {"short": "8.9"},
    "tensorflow": {"version": "2.15.1"},
}
VERIFY_SETTINGS = {
    "install_dir": "/opt/gpu-verify",
    "expected_gpu_count": 4,
    "driver": {"version": "535.104.05"},
    "cpu_replicas": 0,
    "timeout": 600,
    "learning_rate": 0.01,
    "nvidia_smi": "nvidia-smi",
    "default_symlink": "/usr/local/cuda",
    "kernel_dir": "/usr/local/share/jupyter/kernels",
    "mixed_precision": False,
    "fabricmanager": False,
    "scaling": False,
    "scaling_threshold": 0.75,
    "multiworker": False,
}


def verify_argv(stack=None, **over):
    return gpu_report.gpu_verify_argv(stack or VERIFY_STACK, dict(VERIFY_SETTINGS, **over))


def test_verify_argv_for_a_plain_stack():
    assert verify_argv() == [
        "/opt/tensorflow/2.15/bin/python", "/opt/gpu-verify/gpu_verify.py", "--stack", "tf215",
        "--expected-gpus", "4", "--expect-driver", "535.104.05",
        "--expect-cuda", "12.2", "--cuda-root", "/usr/local/cuda-12.2",
        "--expect-cudnn", "8.9", "--expect-tensorflow", "2.15.1",
        "--cpu-replicas", "0", "--timeout", "600", "--learning-rate", "0.01", "--nvidia-smi", "nvidia-smi",
        "--kernel-dir", "/usr/local/share/jupyter/kernels",
    ]  # fmt: skip


def test_verify_argv_without_a_pinned_driver_expects_none():
    argv = verify_argv(driver=None)
    assert argv[argv.index("--expect-driver") + 1] == ""


def test_verify_argv_checks_the_default_symlink_only_for_the_default_stack():
    assert "--default-symlink" not in verify_argv()
    argv = verify_argv(dict(VERIFY_STACK, default=True))
    assert argv[argv.index("--default-symlink") + 1] == "/usr/local/cuda"
    assert argv.index("--default-symlink") < argv.index("--kernel-dir")


def test_verify_argv_flags_read_as_ansible_booleans():
    argv = verify_argv(mixed_precision="yes", fabricmanager=True)
    assert argv[-2:] == ["--mixed-precision", "--expect-fabricmanager"]
    assert "--mixed-precision" not in verify_argv(mixed_precision="false")


def test_verify_argv_scaling_only_on_one_host():
    assert verify_argv(scaling=True)[-3:] == ["--scaling", "--scaling-threshold", "0.75"]
    assert "--scaling" not in verify_argv(scaling=True, multiworker=True)


def test_verify_argv_names_a_stack_that_is_not_resolved():
    with pytest.raises(AnsibleFilterError, match="stack 'tf215' is not resolved"):
        verify_argv(dict(VERIFY_STACK, cudnn=None))


SITE = "/opt/tensorflow/2.18/lib/python3.11/site-packages"
# A stack of NVIDIA's wheels as gpu_stack resolves it (tensorflow[and-cuda]: no tree, the venv's wheel folders).
WHEELS_STACK = {
    "name": "tf218",
    "venv": "/opt/tensorflow/2.18",
    "cuda_toolkit": {
        "source": "wheels",
        "version": "12.5",
        "series": "12.5",
        "root": None,
        "site_packages": SITE,
        "library_dirs": [f"{SITE}/nvidia/cuda_runtime/lib", f"{SITE}/nvidia/cublas/lib", f"{SITE}/nvidia/cudnn/lib"],
    },
    "cudnn": {"source": "wheels", "version": "9.3", "short": "9.3", "series": "9.3", "major": 9},
    "tensorflow": {"version": "2.18.1", "package": "tensorflow[and-cuda]"},
}


def test_verify_argv_for_a_wheels_stack_passes_its_wheel_folders_not_a_tree():
    argv = verify_argv(WHEELS_STACK)
    start = argv.index("--expect-cuda")
    assert argv[start : argv.index("--expect-cudnn")] == [
        "--expect-cuda", "12.5", "--cuda-source", "wheels",
        "--library-dir", f"{SITE}/nvidia/cuda_runtime/lib",
        "--library-dir", f"{SITE}/nvidia/cublas/lib",
        "--library-dir", f"{SITE}/nvidia/cudnn/lib",
    ]  # fmt: skip
    assert "--cuda-root" not in argv and argv[argv.index("--expect-cudnn") + 1] == "9.3"
    # A runfile stack with the source named keeps its tree.
    runfile = dict(VERIFY_STACK, cuda_toolkit=dict(VERIFY_STACK["cuda_toolkit"], source="runfile"))
    assert verify_argv(runfile) == verify_argv()


def test_verify_argv_names_a_wheels_stack_without_its_wheel_folders():
    stack = dict(WHEELS_STACK, cuda_toolkit=dict(WHEELS_STACK["cuda_toolkit"], library_dirs=[]))
    with pytest.raises(AnsibleFilterError, match="stack 'tf218' is not resolved \\(no 'library_dirs'\\)"):
        verify_argv(stack)


@pytest.mark.parametrize(
    ("layout", "devices"),
    [
        ([], None),  # no MIG: TensorFlow is held to the 4 GPUs
        ([{"gpus": "all", "profiles": ["3g.40gb", "3g.40gb"]}], "1"),  # one MIG device per CUDA process
        ([{"gpus": [0, 1], "profiles": ["7g.80gb"]}], "3"),  # GPUs 2 and 3 plus one MIG device
        ([{"gpus": [0], "profiles": []}], None),  # MIG off on GPU 0
    ],
)
def test_verify_argv_on_a_mig_host_expects_the_devices_cuda_enumerates(layout, devices):
    argv = verify_argv(mig_layout=layout)
    assert argv[argv.index("--expected-gpus") + 1] == "4"  # nvidia-smi still counts the physical GPUs
    found = argv[argv.index("--expected-cuda-devices") + 1] if "--expected-cuda-devices" in argv else None
    assert found == devices


def test_a_run_without_a_document_still_says_where_its_stacks_cuda_comes_from():
    run = {"skipped": True, "item": WHEELS_STACK}
    doc = gpu_report.gpu_verify_result(run, "/opt/gpu-verify")
    assert doc["cuda"] == {
        "source": "wheels",
        "root": None,
        "library_dirs": WHEELS_STACK["cuda_toolkit"]["library_dirs"],
    }
    runfile = gpu_report.gpu_verify_result({"stdout": "", "rc": 1, "item": VERIFY_STACK})
    assert runfile["cuda"] == {"source": "runfile", "root": "/usr/local/cuda-12.2", "library_dirs": []}
    notes = fleet_report.build_report({"gpu1": [doc, runfile]}, None)["hosts"]["gpu1"]["mode_notes"]
    assert f"gpu1 (tf218): CUDA from the venv's NVIDIA wheels (tensorflow[and-cuda]) under {SITE}/nvidia" in notes
    assert "gpu1: CUDA from the runfile tree /usr/local/cuda-12.2" in notes  # that document names no stack
