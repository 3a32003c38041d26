"""tools/test_suite.py (`make check`, `make test`): which parts run, in what order, and the table.

The parts here are shell one-liners that take no time; the real list is tests/parts.yml, which must
name every Molecule scenario and every integration test file, so that no test is left out of CI.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import yaml
from helpers import ROOT


def load_suite():
    spec = importlib.util.spec_from_file_location("test_suite_tool", ROOT / "tools" / "test_suite.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["test_suite_tool"] = module
    spec.loader.exec_module(module)
    return module


suite = load_suite()


def part(name, command="true", estimate=1.0, needs=(), alone=False, offline=False, after=()):
    return suite.Part(name, command, "test", estimate, list(needs), alone, offline, list(after))


def run(parts, jobs=2, tmp_path=None, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setattr(suite, "LOGS", tmp_path / "logs")
    return suite.Runner(parts, jobs, {"PATH": "/usr/bin:/bin"}).run()


def test_every_scenario_and_integration_file_is_a_part():
    commands = " ".join(
        spec["command"] for spec in yaml.safe_load((ROOT / "tests/parts.yml").read_text())["parts"].values()
    )
    scenarios = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
    missing = [s for s in scenarios if f"molecule test -s {s}" not in commands]
    missing += [
        f.name for f in (ROOT / "tests/integration").glob("test_*.py") if f"tests/integration/{f.name}" not in commands
    ]
    assert not missing, f"not run by make test: {missing}"


def test_the_check_tier_is_lint_unit_and_sanity():
    assert [p.name for p in suite.load("check", [])] == ["lint", "unit", "sanity"]
    names = [p.name for p in suite.load("test", [])]
    assert names[:3] == ["lint", "unit", "sanity"] and len(names) > 10


def test_only_brings_what_the_part_needs():
    assert {p.name for p in suite.load("test", ["integration:bad_input_suite"])} == {
        "integration:bad_input_suite",
        "snapshot:converged",
    }


def test_a_part_starts_after_what_it_needs(tmp_path, monkeypatch):
    log = tmp_path / "order"
    parts = [
        part("consumer", f"echo consumer >> {log}", estimate=100, needs=["snapshot"]),
        part("snapshot", f"sleep 0.2; echo snapshot >> {log}", estimate=1),
    ]
    assert run(parts, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert log.read_text().split() == ["snapshot", "consumer"]
    assert all(p.result == "passed" for p in parts)


def test_the_longest_ready_part_goes_first(tmp_path, monkeypatch):
    log = tmp_path / "order"
    parts = [part(name, f"echo {name} >> {log}", estimate=est) for name, est in (("short", 1), ("long", 9), ("mid", 5))]
    assert run(parts, jobs=1, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert log.read_text().split() == ["long", "mid", "short"]


def test_a_part_marked_alone_has_nothing_beside_it(tmp_path, monkeypatch):
    log = tmp_path / "events"
    body = "echo {0} start >> {1}; sleep 0.3; echo {0} end >> {1}"
    parts = [
        part("alone", body.format("alone", log), estimate=5, alone=True),
        part("a", body.format("a", log), estimate=4),
        part("b", body.format("b", log), estimate=3),
    ]
    assert run(parts, jobs=2, tmp_path=tmp_path, monkeypatch=monkeypatch)
    events = log.read_text().splitlines()
    start, end = events.index("alone start"), events.index("alone end")
    assert end == start + 1, events  # nothing started or ended while it ran


def test_a_part_alone_but_for_offline_parts_has_only_those_beside_it_and_they_wait_for_it(tmp_path, monkeypatch):
    """The bad-input suite's case: the offline parts (lint, unit, sanity) may run beside it, the
    container parts never; and the offline parts leave the slots to container parts still waiting."""
    parts = [
        part("suite", "sleep 0.3", estimate=5, alone="offline", needs=["snapshot"]),
        part("snapshot", "sleep 0.3", estimate=1),
        part("lint", "sleep 0.3", estimate=4.5, offline=True),  # ahead of molecule, were it not to keep
        part("molecule", "sleep 0.3", estimate=4),
    ]
    assert run(parts, jobs=2, tmp_path=tmp_path, monkeypatch=monkeypatch)
    # The scheduler's own start and end times: two parts started in one pass may write their first
    # line in either order.
    suite_part, snapshot, lint, molecule = parts
    for other in (snapshot, molecule):  # the container parts ended before the suite started
        assert other.started + other.seconds <= suite_part.started, [(p.name, p.started, p.seconds) for p in parts]
    assert lint.started >= molecule.started  # it kept while a container part waited for a slot


@pytest.mark.parametrize("maker", ["true", "exit 1"])
def test_a_part_starts_after_a_part_it_comes_after_whatever_its_result(tmp_path, monkeypatch, maker):
    """Molecule default keeps its converged host as the snapshot: the snapshot part comes after it,
    even with a slot free, and runs even when it failed (it then builds the image itself)."""
    parts = [
        part("snapshot", "true", estimate=10, after=["maker"]),
        part("maker", f"sleep 0.3; {maker}", estimate=2),
        part("other", "sleep 0.3", estimate=5),
    ]
    run(parts, jobs=2, tmp_path=tmp_path, monkeypatch=monkeypatch)
    snapshot, made, other = parts
    assert snapshot.started >= made.started + made.seconds  # the scheduler's own times
    assert other.started < made.started + made.seconds  # the free slot went to another part
    assert snapshot.result == "passed"


def test_what_others_come_after_goes_first(tmp_path, monkeypatch):
    log = tmp_path / "order"
    parts = [
        part("other", f"echo other >> {log}", estimate=2.5),  # less than maker's 2 plus the snapshot's 1
        part("snapshot", f"echo snapshot >> {log}", estimate=1, after=["maker"]),
        part("maker", f"echo maker >> {log}", estimate=2),
    ]
    assert run(parts, jobs=1, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert log.read_text().split() == ["maker", "other", "snapshot"]


def test_only_does_not_bring_in_what_a_part_comes_after(tmp_path, monkeypatch):
    parts = suite.load("test", ["snapshot:converged"])
    assert [p.name for p in parts] == ["snapshot:converged"]
    assert parts[0].after == ["molecule:default"]


def test_an_offline_part_takes_a_slot_that_only_alone_parts_wait_for(tmp_path, monkeypatch):
    """The last container part runs; the alone part cannot start beside it and nothing else is left:
    the offline part uses the free slot instead of keeping it empty for the alone part."""
    parts = [
        part("last", "sleep 0.5", estimate=10),
        part("suite", "sleep 0.2", estimate=5, alone="offline"),
        part("lint", "sleep 0.2", estimate=4, offline=True),
    ]
    assert run(parts, jobs=2, tmp_path=tmp_path, monkeypatch=monkeypatch)
    last, suite_part, lint = parts
    assert lint.started < last.started + last.seconds  # beside the last container part
    assert suite_part.started >= last.started + last.seconds


def test_a_failed_need_fails_its_consumers_without_running_them(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "ran"
    parts = [part("snapshot", "echo broken; exit 3"), part("consumer", f"touch {marker}", needs=["snapshot"])]
    assert not run(parts, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert [p.result for p in parts] == ["failed", "not run"]
    assert not marker.exists()
    assert "broken" in capsys.readouterr().out  # the failed part's log tail is printed


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_table_lists_every_part_with_its_result_and_time(tmp_path, monkeypatch, jobs):
    parts = [part("one"), part("two", "exit 1")]
    run(parts, jobs=jobs, tmp_path=tmp_path, monkeypatch=monkeypatch)
    text = suite.table(parts, 12.0)
    assert re.search(r"^\| one \| passed \| \d+ \| \d+ \|$", text, re.MULTILINE), text
    assert re.search(r"^\| two \| failed \| \d+ \| \d+ \|$", text, re.MULTILINE), text
    assert "12 wall" in text


def test_a_part_others_wait_for_goes_before_a_longer_one(tmp_path, monkeypatch):
    log = tmp_path / "order"
    parts = [
        part("long", f"echo long >> {log}", estimate=10),
        part("snapshot", f"echo snapshot >> {log}", estimate=3),
        part("consumer", f"echo consumer >> {log}", estimate=8, needs=["snapshot"]),
    ]
    assert run(parts, jobs=1, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert log.read_text().split() == ["snapshot", "long", "consumer"]


def test_a_failed_parts_error_lines_are_kept_for_the_end_of_the_output(tmp_path, monkeypatch):
    lines = ["collecting"] * 200 + [
        "ERROR: changelogs/config.yaml:0:0: config file does not exist",
        "FAILED tests/unit/test_x.py::test_y - AssertionError: 1 != 2",
        "fatal: [gpu-sandbox]: FAILED! => {}",
        "galaxy[no-repository]: galaxy.yaml should have a repository key for publication to Galaxy.",
        "plugins/filter/gpu_tf_kernel_spec.yml",  # yamllint's file line, kept with its error lines
        "  7:7       error    wrong indentation: expected 8 but found 6  (indentation)",
        "  12:71     error    syntax error: mapping values are not allowed here (syntax)",
        "tools/x.py:3:1: F401 [*] `os` imported but unused",
        "   --> tests/unit/test_y.py:780:23",
        "1 file would be reformatted, 128 files already formatted",
    ]
    failing = part("sanity", "printf '%s\\n' " + " ".join(f"'{line}'" for line in lines) + "; exit 1")
    assert not run([failing], tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert suite.causes(failing) == lines[-10:]
    assert suite.causes(part("never-ran")) == []


def test_no_more_than_the_last_cause_lines_are_kept(tmp_path, monkeypatch):
    lines = [f"FAILED tests/unit/test_x.py::test_{number}" for number in range(100)]
    failing = part("unit", "printf '%s\\n' " + " ".join(f"'{line}'" for line in lines) + "; exit 1")
    assert not run([failing], tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert suite.causes(failing) == lines[-suite.CAUSES :]
