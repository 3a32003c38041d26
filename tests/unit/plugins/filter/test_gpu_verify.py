"""gpu_verify's wiring filters: the options' checks, the report's command line, a host's results, the
failure of a stack that did not verify."""

from __future__ import annotations

import json

import pytest
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_verify
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_report import gpu_verify_result

GOOD = {
    "gpu_verify_timeout": 600,
    "gpu_verify_fit_learning_rate": 0.01,
    "gpu_verify_scaling_threshold": 0.75,
    "gpu_verify_expected_gpu_count": 2,
    "gpu_verify_cpu_replicas": 0,
    "gpu_verify_report_keep": 30,
    "gpu_verify_jupyter_kernel_dir": "/usr/local/share/jupyter/kernels",
}
FIX = "Fix it in the inventory or on the -e command line."


def test_the_defaults_are_good_options():
    assert gpu_verify.gpu_verify_option_problems(GOOD) == []
    assert gpu_verify.gpu_verify_option_problems(GOOD | {"gpu_verify_cpu_replicas": 2}) == []


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("gpu_verify_timeout", "-5", "gpu_verify_timeout is -5; it must be a number of seconds above 0."),
        ("gpu_verify_timeout", "soon", "gpu_verify_timeout is soon; it must be a number of seconds above 0."),
        ("gpu_verify_fit_learning_rate", "nan", "gpu_verify_fit_learning_rate is nan; it must be a finite number"),
        ("gpu_verify_fit_learning_rate", "inf", "gpu_verify_fit_learning_rate is inf; it must be a finite number"),
        ("gpu_verify_scaling_threshold", "1.5", "gpu_verify_scaling_threshold is 1.5; it must be a fraction above 0"),
        ("gpu_verify_expected_gpu_count", "0", "gpu_verify_expected_gpu_count is 0; it must be a whole number of GPUs"),
        ("gpu_verify_expected_gpu_count", "-2", "gpu_verify_expected_gpu_count is -2; it must be a whole number"),
        ("gpu_verify_expected_gpu_count", None, "gpu_verify_expected_gpu_count is not set; it must be a whole number"),
        ("gpu_verify_expected_gpu_count", "1.5", "gpu_verify_expected_gpu_count is 1.5; it must be a whole number"),
        ("gpu_verify_cpu_replicas", "-2", "gpu_verify_cpu_replicas is -2; it must be a whole number: 0 fits on"),
        ("gpu_verify_report_keep", "0", "gpu_verify_report_keep is 0; it must be a whole number of run folders"),
        ("gpu_verify_report_keep", "-1", "gpu_verify_report_keep is -1; it must be a whole number of run folders"),
        (
            "gpu_verify_jupyter_kernel_dir",
            "kernels",
            "gpu_verify_jupyter_kernel_dir is kernels; it must be an absolute",
        ),
    ],
)
def test_a_bad_option_is_named_with_its_rule_and_the_fix(name, value, message):
    (problem,) = gpu_verify.gpu_verify_option_problems(GOOD | {name: value})
    assert problem.startswith(message) and problem.endswith(FIX)


def test_every_bad_option_is_named_at_once():
    assert (
        len(gpu_verify.gpu_verify_option_problems(GOOD | {"gpu_verify_timeout": 0, "gpu_verify_fit_learning_rate": -1}))
        == 2
    )


LOCATION = {"out_dir": "/srv/reports", "keep": 30, "inventory_sources": ["/inv/a", "/inv/b"], "inventory_name": ""}


def test_location_args_name_where_the_report_goes_and_what_the_run_covered():
    assert gpu_verify.gpu_verify_location_args(LOCATION | {"limit": None}) == [
        "--out-dir",
        "/srv/reports",
        "--keep",
        "30",
        "--inventory-source=/inv/a",
        "--inventory-source=/inv/b",
    ]
    named = gpu_verify.gpu_verify_location_args(LOCATION | {"inventory_name": "lab", "limit": "gpu01"})
    assert named[-2:] == ["--inventory-name=lab", "--limit=gpu01"]
    # --limit given empty is still a limit.
    assert gpu_verify.gpu_verify_location_args(LOCATION | {"limit": ""})[-1] == "--limit="


def test_report_args_of_a_plain_run_and_of_a_rollouts_batch_under_check():
    settings = {"inventory_hosts": ["a", "b"], "location_args": ["--out-dir", "/r"], "not_verified": {}, "run_id": ""}
    assert gpu_verify.gpu_verify_report_args(settings | {"check_mode": False}) == [
        "--input", "-", "--emit", "json", "--inventory-hosts", '["a", "b"]', "--out-dir", "/r",
    ]  # fmt: skip
    left_out = {"b": {"status": "not reached yet", "reason": "in batch 2 of 2"}}
    batch = settings | {"not_verified": left_out, "run_id": "rollout-1", "check_mode": True}
    assert gpu_verify.gpu_verify_report_args(batch)[-4:] == [
        "--not-verified",
        json.dumps(left_out),
        "--run-id=rollout-1",
        "--dry-run",
    ]


def run(stack: str, doc: dict | None, rc: int = 0) -> dict:
    return {"item": {"name": stack, "venv": f"/opt/{stack}"}, "rc": rc, "stdout": json.dumps(doc) if doc else ""}


def test_results_are_one_document_per_stack_with_the_disk_use_and_the_stacks_held_back():
    passed = {"ok": True, "stack": "tf2.12", "problems": []}
    runs = [run("tf2.12", {"ok": False, "problems": []}), run("tf2.12", passed), run("tf2.18", None, rc=1)]
    du = ["1024\t/usr/local/cuda-11.8", "2048\t/opt/tensorflow/2.12"]
    held = [{"name": "tf2.19", "cause": "its driver is not installed"}]
    results = gpu_verify.gpu_verify_results(runs, "/opt/gpu-verify", du, held)
    assert list(results) == ["tf2.12", "tf2.18", "tf2.19"]
    disk = {"/usr/local/cuda-11.8": 1024, "/opt/tensorflow/2.12": 2048}
    assert results["tf2.12"] == passed | {"disk_used_bytes": disk}  # the last run of a stack counts
    assert results["tf2.18"] == gpu_verify_result(runs[2], "/opt/gpu-verify") | {"disk_used_bytes": disk}
    assert results["tf2.19"]["ok"] is False
    assert gpu_verify.gpu_verify_results([], "/opt/gpu-verify", [], None) == {}


def test_a_failed_stack_names_each_problem_with_its_fix():
    result = {"ok": False, "problems": [{"cause": "lock drift.", "fix": "Rerun."}, {"cause": "NaN loss.", "fix": "x."}]}
    assert gpu_verify.gpu_verify_failure(result, "tf2.12", "gpu-a", {}) == (
        "Stack tf2.12 on gpu-a failed verification: lock drift. Rerun. | NaN loss. x."
    )
    assert (
        gpu_verify.gpu_verify_failure({}, "tf2.18", "gpu-a") == "Stack tf2.18 on gpu-a failed verification: no result "
    )


def test_a_new_default_that_did_not_verify_says_the_old_one_stays():
    switch = {"from": "tf2.12", "to": "tf2.18", "switched": False}
    result = {"ok": False, "problems": [{"cause": "No GPU.", "fix": "Reseat."}]}
    assert gpu_verify.gpu_verify_failure(result, "tf2.18", "gpu-a", switch) == (
        "The default stays tf2.12; tf2.18 becomes the default once it verifies. Stack tf2.18 on gpu-a failed "
        "verification: No GPU. Reseat."
    )
    assert gpu_verify.gpu_verify_failure(result, "tf2.12", "gpu-a", switch).startswith("Stack tf2.12")
    assert gpu_verify.gpu_verify_failure(result, "tf2.18", "gpu-a", switch | {"switched": True}).startswith("Stack")


def test_switch_note_names_the_new_default_once_it_took_over():
    note = gpu_verify.gpu_verify_switch_note({"from": "tf2.12", "to": "tf2.16", "switched": True})
    assert note == "Default stack switched: tf2.12 -> tf2.16"


def test_switch_note_says_the_previous_default_stays_until_the_new_one_verifies():
    note = gpu_verify.gpu_verify_switch_note({"from": "tf2.12", "to": "tf2.16", "switched": False})
    assert note.startswith("The default stays tf2.12: the declared default tf2.16 did not pass verification")
    assert note.endswith("it becomes the default once it does.")


def test_switch_note_names_a_pending_default_that_a_reading_run_leaves_waiting():
    note = gpu_verify.gpu_verify_switch_note({"from": "tf2.12", "to": "tf2.16", "switched": False, "waits": True})
    assert note.startswith("The default stays tf2.12: the declared default tf2.16 waits for a run of site.yml")
    assert note.endswith("playbooks/verify.yml only reads.")
