"""gpu_verify_mig: the host's stacks fail with check mig where the MIG devices differ from the layout."""

from __future__ import annotations

from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_verify import gpu_verify_mig

RESULTS = {"tf2.15": {"ok": True, "problems": []}, "tf2.12": {"ok": False, "problems": [{"check": "fit"}]}}


def test_the_same_devices_give_their_count_and_no_result_leaves_the_documents_alone():
    counted = gpu_verify_mig(RESULTS, {"differences": {}, "problems": [], "devices": 2})
    assert counted == {stack: {**doc, "mig_devices": 2} for stack, doc in RESULTS.items()}
    assert gpu_verify_mig(RESULTS, {}) == RESULTS


def test_a_difference_fails_every_stack_with_check_mig():
    mig = {
        "differences": {"1": "MIG devices 7g.80gb; the layout asks for 3g.40gb, 3g.40gb"},
        "problems": [],
        "devices": 4,
    }
    failed = gpu_verify_mig(RESULTS, mig)
    assert [doc["ok"] for doc in failed.values()] == [False, False]
    problem = failed["tf2.15"]["problems"][-1]
    assert (
        problem["check"] == "mig"
        and "GPU 1: MIG devices 7g.80gb" in problem["cause"]
        and "4 asked for" in problem["cause"]
    )
    assert [p["check"] for p in failed["tf2.12"]["problems"]] == ["fit", "mig"]
    assert RESULTS["tf2.15"]["ok"]  # not changed in place


def test_the_counted_mig_devices_go_into_the_health_baseline():
    from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_health import gpu_health_baseline_args

    passed = {"tf2.15": {"ok": True, "stack": "tf2.15", "problems": [], "gpus": {"expected": 2}}}
    counted = gpu_verify_mig(passed, {"differences": {}, "problems": [], "devices": 4})
    assert gpu_health_baseline_args(counted, [])[-2:] == ["--mig-devices", "4"]
    assert "--mig-devices" not in gpu_health_baseline_args(passed, [])
