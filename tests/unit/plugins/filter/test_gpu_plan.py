"""Check mode as a plan: the driver's plan item, one line per host and phase, plan.{json,md}."""

from __future__ import annotations

import datetime
import io
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))
sys.path.insert(0, str(ROOT / "roles" / "gpu_verify" / "files"))

import fleet_plan
import gpu_plan

PIN = "535.104.05"
PACKAGE = {"method": "package", "switch_from": None}
NOW = datetime.datetime(2026, 12, 2, 12, 0, 0, tzinfo=datetime.timezone.utc)  # noqa: UP017


def driver(**kw):
    args = {
        "decided": PACKAGE,
        "installed": False,
        "found": None,
        "loaded": None,
        "manage_kernel": True,
        "reboot_allowed": False,
    }
    args.update(kw)
    return gpu_plan.gpu_plan_driver(PIN, **args)["driver"]


@pytest.mark.parametrize(
    ("kw", "change", "text"),
    [
        ({}, True, f"driver {PIN} would be installed (package, reboot required)"),
        ({"manage_kernel": False}, True, f"driver {PIN} would be installed (package)"),
        ({"found": "520.61.05"}, True, f"driver 520.61.05 -> {PIN} (package, reboot required)"),
        (
            {"found": "520.61.05", "decided": {"method": "package", "switch_from": "runfile"}, "reboot_allowed": True},
            True,
            f"driver 520.61.05 -> {PIN} (runfile -> package, the run reboots the host)",
        ),
        ({"found": PIN}, True, f"driver {PIN} would be reinstalled, incomplete (package, reboot required)"),
        ({"installed": True, "loaded": PIN}, False, f"driver {PIN} installed (package)"),
        ({"installed": True, "loaded": None, "manage_kernel": False}, False, f"driver {PIN} installed (package)"),
        (
            {"installed": True, "loaded": "520.61.05"},
            False,
            f"driver {PIN} installed, loaded kernel module 520.61.05 (reboot required)",
        ),
        (
            {"installed": True, "loaded": "520.61.05", "reboot_allowed": True},
            True,
            f"driver {PIN} installed, loaded kernel module 520.61.05 (the run reboots the host)",
        ),
    ],
)
def test_driver_plan_names_the_versions_the_method_and_the_reboot(kw, change, text) -> None:
    assert driver(**kw) == {"change": change, "text": text}


def _facts(**plans):
    return {f"{role}_plan": plan for role, plan in plans.items()}


def test_collect_gives_one_line_per_phase_in_role_order_and_nothing_to_do_for_a_converged_host() -> None:
    fresh = _facts(
        tf_venv={"tf2.18": {"change": True, "text": "venv tf2.18 would be created in /opt/tf (TensorFlow 2.18.0)"}},
        nvidia_driver={"driver": {"change": True, "text": f"driver {PIN} would be installed (package)"}},
        cuda_toolkit={
            "/usr/local/cuda-12.2": {"change": True, "text": "CUDA 12.2 would be installed in /usr/local/cuda-12.2"},
            "/usr/local/cuda-11.8": {"change": True, "text": "CUDA 11.8 would be installed in /usr/local/cuda-11.8"},
            "/usr/local/cuda": {"change": False, "text": "/usr/local/cuda -> /usr/local/cuda-12.2"},
        },
    )
    done = _facts(
        nvidia_driver={"driver": {"change": False, "text": f"driver {PIN} installed (package)"}},
        cudnn={"/usr/local/cuda-12.2": {"change": False, "text": "cuDNN 8.9.4 in /usr/local/cuda-12.2"}},
    )
    plan = gpu_plan.gpu_plan_collect(
        ["fresh", "done", "gone"], {"fresh": fresh, "done": done, "gone": {}}, ["fresh", "done"]
    )
    assert [p["phase"] for p in plan["fresh"]["phases"]] == ["driver", "CUDA", "TensorFlow"]
    assert plan["fresh"]["phases"][1] == {
        "phase": "CUDA",
        "change": True,
        "line": "CUDA 12.2 would be installed in /usr/local/cuda-12.2; CUDA 11.8 would be installed in /usr/local/cuda-11.8",
    }
    assert plan["fresh"]["changes"] == 3 and not plan["fresh"]["failed"]
    assert plan["done"]["changes"] == 0
    assert plan["done"]["phases"][0]["line"] == f"nothing to do (driver {PIN} installed (package))"
    assert plan["gone"] == {
        "phases": [{"phase": "host", "change": False, "line": gpu_plan.NO_PLAN}],
        "changes": 0,
        "failed": True,
    }


def test_collect_leaves_a_live_host_without_plans_empty_and_ignores_malformed_items() -> None:
    plan = gpu_plan.gpu_plan_collect(["a"], {"a": _facts(cudnn={"x": "not an item", "y": {"change": True}})}, ["a"])
    assert plan["a"] == {
        "phases": [{"phase": "cuDNN", "change": False, "line": "nothing to do"}],
        "changes": 0,
        "failed": False,
    }
    assert gpu_plan.gpu_plan_collect(["b"], {"b": {}}, ["b"])["b"]["phases"] == []


PLAN = {
    "gpu-a": {
        "phases": [
            {"phase": "driver", "change": True, "line": f"driver 520.61.05 -> {PIN} (package, reboot required)"},
            {"phase": "CUDA", "change": False, "line": "nothing to do (CUDA 12.2 installed)"},
        ],
        "changes": 1,
        "failed": False,
    },
    "gpu-b": {
        "phases": [{"phase": "driver", "change": False, "line": "nothing to do (x)"}],
        "changes": 0,
        "failed": False,
    },
    "gpu-c": {"phases": [{"phase": "host", "change": False, "line": gpu_plan.NO_PLAN}], "changes": 0, "failed": True},
}


def _run(tmp_path: Path, plan: dict, *extra: str, now=NOW) -> dict:
    out = io.StringIO()
    (tmp_path / "fleet").mkdir(parents=True, exist_ok=True)  # the -i folder names the inventory
    argv = [
        "--input",
        "-",
        "--emit",
        "json",
        "--out-dir",
        str(tmp_path),
        "--inventory-source",
        str(tmp_path / "fleet"),
        *extra,
    ]
    assert fleet_plan.main(argv, stdin=io.StringIO(json.dumps(plan)), stdout=out, now=now) == 0
    return json.loads(out.getvalue())


def test_plan_is_written_beside_the_reports_without_touching_the_report_history(tmp_path: Path) -> None:
    inventory = tmp_path / "fleet"
    (inventory / "20260101T000000Z").mkdir(parents=True)
    (inventory / "latest").symlink_to("20260101T000000Z")
    done = _run(tmp_path, PLAN, "--limit", "gpu-a")
    folder = inventory / "plans" / "20261202T120000Z"
    assert done["written"] and done["plan_dir"] == str(folder)
    assert os.readlink(inventory / "plans" / "latest") == folder.name
    assert os.readlink(inventory / "latest") == "20260101T000000Z"
    assert sorted(p.name for p in inventory.iterdir()) == ["20260101T000000Z", "latest", "plans"]
    document = json.loads((folder / "plan.json").read_text())
    assert document["summary"] == {"hosts": 3, "would_change": 1, "nothing_to_do": 1, "no_plan": 1}
    assert document["limit"] == "gpu-a" and document["hosts"] == PLAN
    markdown = (folder / "plan.md").read_text()
    assert f"| gpu-a | driver | driver 520.61.05 -> {PIN} (package, reboot required) |" in markdown
    assert "| gpu-b |  | nothing to do |" in markdown
    table = done["table"].splitlines()
    assert "1 would change, 1 nothing to do, 1 no plan" in table[0]
    assert table[1].split() == ["gpu-a", "driver", "driver", "520.61.05", "->", PIN, "(package,", "reboot", "required)"]
    assert table[2].split()[:2] == ["CUDA", "nothing"]
    assert table[3].split() == ["gpu-b", "nothing", "to", "do"]


def test_plan_folders_are_pruned_to_keep_and_a_run_with_nothing_to_plan_writes_nothing(tmp_path: Path) -> None:
    for minute in range(3):
        _run(tmp_path, PLAN, "--keep", "2", now=NOW + datetime.timedelta(minutes=minute))
    plans = tmp_path / "fleet" / "plans"
    assert sorted(p.name for p in plans.iterdir()) == ["20261202T120100Z", "20261202T120200Z", "latest"]
    empty = tmp_path / "empty"
    no_plan = {"phases": [{"phase": "host", "change": False, "line": gpu_plan.NO_PLAN}], "changes": 0, "failed": True}
    done = _run(empty, {"gpu-a": {"phases": [], "changes": 0, "failed": False}, "gpu-b": no_plan})
    assert done == {"table": "", "summary": done["summary"], "plan_dir": None, "written": False}
    assert sorted(p.name for p in empty.iterdir()) == ["fleet"]  # only the inventory folder


def test_bad_input_names_the_cause(tmp_path: Path, capsys) -> None:
    argv = ["--input", "-", "--out-dir", str(tmp_path)]
    assert fleet_plan.main(argv, stdin=io.StringIO("[1]"), stdout=io.StringIO()) == 2
    assert "must hold a JSON object" in capsys.readouterr().err
