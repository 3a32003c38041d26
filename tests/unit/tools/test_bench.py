"""tools/bench.py's pure parts on captured output: no containers are started here.

The callback document in tests/fixtures/bench/callback_noop.txt is ansible.posix.json's output of a
small play on two hosts (trimmed to the keys the bench reads): fact gathering, a probe, a set_fact,
a loop with one skipped item, a skipped task, a changed copy and a run_once task delegated to the
controller.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import bench

CAPTURED = (ROOT / "tests/fixtures/bench/callback_noop.txt").read_text()

# The figures measured on 2026-12-01, before the fleet targets were worked on: none of the ratio targets met.
TODAY = {
    1: {"first_s": 235.0, "noop_s": 96.0, "noop_prov_s": 61.0, "facts_s": 3.8, "round_trips": 86,
        "noop_changed": 0, "pushes": 0, "written_bytes": 0, "fit_s": [3.1],
        "health": {"cpu_s": 0.21, "wall_s": 0.48}},
    4: {"first_s": 554.0, "noop_s": 211.0, "facts_s": 6.5, "round_trips": 86, "noop_changed": 0,
        "pushes": 0, "written_bytes": 0, "fit_s": [3.0, 3.4, 3.2, 3.3]},
}  # fmt: skip


def row(rows: list[list[str]], measure: str) -> list[str]:
    return next(r for r in rows if r[0].startswith(measure))


def test_callback_document_is_found_after_warnings():
    doc = bench.load_callback_json(CAPTURED)
    assert sorted(doc["stats"]) == ["h1", "h2"]
    with pytest.raises(ValueError, match="no JSON"):
        bench.load_callback_json("ERROR! the playbook could not be parsed\n")


def test_round_trips_skip_controller_actions_skipped_items_and_delegated_tasks():
    doc = bench.load_callback_json(CAPTURED)
    # facts 1 + probe 1 + two of three loop items + copy 1; not the set_fact, the skipped task or
    # the stat delegated to localhost (which h1 carries as run_once).
    assert bench.round_trips(doc) == {"h1": 5, "h2": 5}
    assert bench.round_trips_by_task(doc)["h2"] == {
        "Gathering Facts": 1,
        "Probe": 1,
        "Probe each item but the second": 2,
        "Push a file": 1,
    }


def test_delegated_loops_and_hidden_skipped_loops_cost_no_round_trip(tmp_path):
    tasks = tmp_path / "tasks.yml"
    tasks.write_text(
        "---\n- name: Hash on the controller\n  ansible.builtin.stat:\n    path: /x\n  loop: [1, 2]\n"
        "  delegate_to: localhost\n\n- name: Probe\n  ansible.builtin.stat:\n    path: /y\n"
        "  loop: [1, 2]\n  vars:\n    delegate_to: localhost\n"
    )
    items = [{"changed": False, "item": 1}, {"changed": False, "item": 2}]
    hidden = [{"censored": "hidden", "changed": False}] * 2

    def task(name: str, line: int, result: dict) -> dict:
        return {"task": {"name": name, "path": f"{tasks}:{line}"}, "hosts": {"h1": result}}

    doc = {
        "stats": {"h1": {}},
        "plays": [
            {
                "tasks": [
                    task("Hash on the controller", 2, {"action": "ansible.builtin.stat", "results": items}),
                    # A key of vars named delegate_to is no delegation: only the task's own keyword is.
                    task("Probe", 8, {"action": "ansible.builtin.stat", "results": items}),
                    task("Fetch", 8, {"action": "ansible.builtin.get_url", "skipped": True, "results": hidden}),
                ]
            }
        ],
    }
    assert bench.round_trips_by_task(doc) == {"h1": {"Probe": 2}}
    assert bench.delegated_in_source(f"{tasks}:2") is True
    assert bench.delegated_in_source(f"{tasks}:8") is False
    assert bench.delegated_in_source("cbtest.yml") is False


def test_an_action_that_runs_several_modules_counts_each():
    def task(name: str, result: dict) -> dict:
        return {"task": {"name": name, "path": "x.yml:1"}, "hosts": {"h1": result}}

    doc = {
        "stats": {"h1": {}},
        "plays": [
            {
                "tasks": [
                    task("Resolve", {"action": "gpu_fleet.tf_hosts.gpu_stacks", "module_runs": 2}),
                    task("Hold back", {"action": "gpu_fleet.tf_hosts.gpu_stacks", "module_runs": 0}),
                    task("Lock", {"action": "gpu_fleet.tf_hosts.gpu_run_lock"}),
                ]
            }
        ],
    }
    assert bench.round_trips_by_task(doc) == {"h1": {"Resolve": 2, "Lock": 1}}


def test_changed_content_pushes_and_recap():
    doc = bench.load_callback_json(CAPTURED)
    assert bench.pushes_changed(doc) == 2
    assert bench.recap(doc)["h1"]["changed"] == 1
    assert bench.run_failed(doc) == []
    doc["stats"]["h2"]["unreachable"] = 1
    assert bench.run_failed(doc) == ["h2"]


def test_find_sizes_sum_regular_lines_only():
    text = "120 /opt/gpu-verify/result.json\n4096 /etc/profile.d/cuda.sh\nfind: '/x': Permission denied\n"
    assert bench.parse_find_sizes(text) == (2, 4216, ["/opt/gpu-verify/result.json", "/etc/profile.d/cuda.sh"])


def test_fit_seconds_from_fleet_report():
    report = {"hosts": {"a": {"results": [{"fit": {"fit_seconds": 3.25}}, {"fit": None}]}, "b": {"results": None}}}
    assert bench.fit_seconds(report) == [3.25]


def test_table_with_todays_figures_names_every_gap():
    rows = bench.table_rows(TODAY)
    assert rows[0][:3] == ["measure", "1 host(s)", "4 hosts"]
    assert row(rows, "first provisioning")[3:] == ["4v1 2.36", "<= 1.8", "not met"]
    assert row(rows, "no-op provisioning / facts")[1] == "16.1x"
    assert row(rows, "no-op provisioning / facts")[-1] == "not met"
    assert row(rows, "no-op site.yml / facts")[1] == "25.3x"
    assert row(rows, "module round trips")[-1] == "not met"
    # 2.20 against the facts' own 1.71: 1.28 x, over the 1.2 x allowed.
    assert row(rows, "no-op site.yml, s")[3] == "4v1 2.20 = 1.28 x facts'"
    assert row(rows, "no-op site.yml, s")[-1] == "not met"
    assert row(rows, "second run: bytes")[-1] == "met"
    assert row(rows, "fit seconds")[1:4] == ["3.1", "3.0-3.4", "5 fits"]
    # Without a 4-host provisioning no-op, its ratio stays empty.
    assert row(rows, "no-op --skip-tags verify")[1:4] == ["61.0", "-", "-"]


def test_provisioning_noop_scales_against_the_facts_ratio_without_a_target_of_its_own():
    runs = {1: dict(TODAY[1]), 4: dict(TODAY[4], noop_prov_s=122.0)}
    found = row(bench.table_rows(runs), "no-op --skip-tags verify")
    # 122 / 61 = 2.00 against the facts' 6.5 / 3.8 = 1.71: 1.17 x.
    assert found[1:] == ["61.0", "122.0", "4v1 2.00 = 1.17 x facts'", "", ""]


def test_table_with_targets_met_and_a_byte_written():
    good = {n: dict(r) for n, r in TODAY.items()}
    good[1].update(noop_s=20.0, noop_prov_s=12.0, round_trips=18, index_downloads=1, noop_cpu_s=4.5, noop_headers=88)
    good[4].update(noop_s=33.0, first_s=400.0, round_trips=18, written_bytes=1, index_downloads=1)
    rows = bench.table_rows(good)
    verdicts = {r[0]: r[-1] for r in rows[1:] if r[-1]}
    assert verdicts.pop("second run: bytes written on host") == "not met"
    assert set(verdicts.values()) == {"met"}


def test_the_no_op_controller_cost_per_host_is_shown_against_its_targets():
    runs = {1: dict(TODAY[1], noop_cpu_s=12.4, noop_headers=208), 4: dict(TODAY[4], noop_cpu_s=9.87, noop_headers=208)}
    assert row(bench.table_rows(runs), "controller CPU s per host")[1:] == ["12.4", "9.9", "", "<= 5", "not met"]
    assert row(bench.table_rows(runs), "task headers, no-op")[1:] == ["208", "208", "", "<= 90", "not met"]
    # 4 x 9.87 - 12.4 over 3 added hosts: the run's fixed cost left out.
    assert row(bench.table_rows(runs), "controller CPU s per added host")[1:3] == ["", "9.0"]
    assert row(bench.table_rows({1: TODAY[1]}), "controller CPU s per added host")[1:3] == ["", "-"]
    assert row(bench.table_rows({1: TODAY[1]}), "task headers, no-op")[-1] == "not measured"


def test_task_headers_count_every_task_of_every_play_skipped_or_not():
    doc = {
        "plays": [{"tasks": [{"task": {"name": "a"}}, {"task": {"name": "b"}}]}, {"tasks": [{"task": {"name": "c"}}]}]
    }
    assert bench.task_headers(doc) == 3
    assert bench.task_headers({"plays": []}) == 0


def test_the_health_check_cost_is_shown_against_its_target():
    assert row(bench.table_rows(TODAY), "gpu-health per run")[1:] == ["0.21 (0.48)", "-", "", "<= 1 s CPU", "met"]
    slow = {1: dict(TODAY[1], health={"cpu_s": 1.5, "wall_s": 2.0})}
    assert row(bench.table_rows(slow), "gpu-health per run")[-1] == "not met"


def test_one_host_count_leaves_scaling_unmeasured():
    rows = bench.table_rows({1: TODAY[1]})
    assert row(rows, "first provisioning")[-1] == "not measured"
    assert row(rows, "first provisioning")[3] == "-"
    header, rule, first = bench.render(rows).splitlines()[:3]
    assert set(rule) == {"-", " "}
    # Columns line up: each cell starts where its header does.
    assert first.index("235.0") == header.index("1 host(s)")
    assert first.index("<= 1.8") == header.index("target")


def test_arguments():
    assert bench.parse_args(["--quick"]).counts == [1]
    assert bench.parse_args(["--hosts", "4,1,4"]).counts == [1, 4]
    with pytest.raises(SystemExit):
        bench.parse_args(["--hosts", "one"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--hosts", "0"])


def test_a_bench_stopped_half_way_still_renders_what_it_measured():
    rows = bench.table_rows({1: {"hosts": ["gpu-bench-1"], "first_s": 240.0}, 4: {}})
    assert row(rows, "first provisioning")[1:3] == ["240.0", "-"]
    assert {r[-1] for r in rows[1:] if r[-1]} == {"not measured"}
    assert "240.0" in bench.render(rows)


def _pip_result(changed: bool, cmd: str) -> dict:
    return {"action": "ansible.builtin.pip", "changed": changed, "cmd": cmd}


def test_index_downloads_count_each_hosts_pip_from_an_index_and_each_controller_download():
    install = {"name": "Install TensorFlow 2.12.1"}
    by_index = {"h1": _pip_result(True, "pip install --require-hashes --no-deps -r /v/tf-lock.txt"),
                "h2": _pip_result(True, "pip install --require-hashes --no-deps -r /v/tf-lock.txt"),
                "h3": _pip_result(False, "pip install --require-hashes --no-deps -r /v/tf-lock.txt")}  # fmt: skip
    assert bench.index_downloads({"plays": [{"tasks": [{"task": install, "hosts": by_index}]}]}) == 2
    download = {"name": "gpu_fleet.tf_hosts.tf_venv : " + bench.CONTROLLER_DOWNLOAD_TASK}
    once = {"h1": {"action": "ansible.builtin.command", "results": [{"changed": True}, {"skipped": True}]}}
    no_index = {
        h: _pip_result(True, "pip install --require-hashes --no-deps --no-index --find-links /w -r x")
        for h in ("h1", "h2")
    }
    doc = {"plays": [{"tasks": [{"task": download, "hosts": once}, {"task": install, "hosts": no_index}]}]}
    assert bench.index_downloads(doc) == 1


def test_the_index_downloads_row_says_whether_they_grow_with_the_fleet():
    runs = {1: dict(TODAY[1], index_downloads=1, wheels_from="index"), 4: dict(TODAY[4], index_downloads=4)}
    assert row(bench.table_rows(runs), "index downloads")[1:] == [
        "1",
        "4",
        "wheels from index",
        "no more than 1 host's",
        "not met",
    ]
    runs = {1: dict(TODAY[1], index_downloads=1, wheels_from="controller"), 4: dict(TODAY[4], index_downloads=1)}
    assert row(bench.table_rows(runs), "index downloads")[-1] == "met"
    assert bench.wheel_args(Path("/w"), None) == ["-e", "tf_venv_wheel_cache_dir=/w/wheel-cache"]
    assert bench.wheel_args(Path("/w"), "controller")[:2] == ["-e", "tf_venv_wheels_from=controller"]
