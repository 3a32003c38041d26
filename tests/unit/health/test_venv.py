"""The venv check of gpu_health.py: each stack's venv (its site-packages, read without running its
Python) against its lock, and the baseline's ``stacks``."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gpu_health
import gpu_health_checks as checks
import pytest

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# What the conftest's tf_stack installs by default: the lock's pins, one spelled as its wheel spells it.
INSTALLED = {"tensorflow": "2.12.1", "numpy": "1.23.5", "keras": "2.12.0", "Typing_Extensions": "4.5.0"}


def judge(stacks: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    return checks.judge_venv({name: checks.read_stack(s["venv"], s["lock"]) for name, s in stacks.items()})


def only(findings: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(findings) == 1, findings
    item = findings[0]
    assert item["check"] == "venv" and item["bus_id"] is None
    assert item["cause"][:1].isupper() and item["fix"][:1].isupper(), item
    assert (
        item["fix"]
        == "Rerun site.yml (tf_venv) to restore the lock, or update the lock (`make locks`) and verify (verify.yml)."
    )
    return item


# --- the baseline's stacks ------------------------------------------------------------------------


def test_stacks_are_validated_and_the_lock_defaults_to_the_venvs() -> None:
    document = json.loads((FIXTURES / "baseline-h100x8.json").read_text(encoding="utf-8"))
    assert gpu_health.validate_baseline(document)["stacks"] == {}
    document["stacks"] = {
        "tf-2.12": {"venv": "/opt/tensorflow/2.12", "lock": "/srv/locks/tf-2.12.txt"},
        "tf-2.13": {"venv": "/opt/tensorflow/2.13"},
    }
    assert gpu_health.validate_baseline(document)["stacks"] == {
        "tf-2.12": {"venv": "/opt/tensorflow/2.12", "lock": "/srv/locks/tf-2.12.txt"},
        "tf-2.13": {"venv": "/opt/tensorflow/2.13", "lock": "/opt/tensorflow/2.13/tf-lock.txt"},
    }


@pytest.mark.parametrize(
    ("stacks", "message"),
    [
        ([], "stacks is not an object keyed by stack name"),
        ({"": {"venv": "/opt/tf"}}, "stacks has an empty stack name"),
        ({"tf": "/opt/tf"}, r"stacks\['tf'\] is not an object"),
        ({"tf": {}}, r"stacks\['tf'\].venv is None, not an absolute path"),
        ({"tf": {"venv": "opt/tf"}}, r"stacks\['tf'\].venv is 'opt/tf', not an absolute path"),
        ({"tf": {"venv": "/opt/tf", "lock": 3}}, r"stacks\['tf'\].lock is 3, not an absolute path"),
    ],
)
def test_stacks_outside_the_schema_are_refused(stacks: Any, message: str) -> None:
    document = {**json.loads((FIXTURES / "baseline-h100x8.json").read_text(encoding="utf-8")), "stacks": stacks}
    with pytest.raises(ValueError, match=message):
        gpu_health.validate_baseline(copy.deepcopy(document))


# --- reading a venv -------------------------------------------------------------------------------


def test_the_site_packages_are_read_from_metadata_headers(tmp_path: Path, venv_folder: Any) -> None:
    venv = venv_folder(tmp_path / "venv", {"Typing_Extensions": "4.5.0", "numpy": "1.23.5"})
    # A second interpreter folder, and a dist-info whose METADATA is gone: its folder name says.
    venv_folder(venv, {"absl-py": "1.4.0"}, python="3.10")
    broken = venv / "lib" / "python3.11" / "site-packages" / "grpcio-1.54.2.dist-info"
    broken.mkdir()
    (venv / "lib" / "python3.11" / "site-packages" / "numpy").mkdir()  # a package folder, not a dist-info
    assert checks.read_installed(str(venv)) == {
        "absl-py": "1.4.0",
        "grpcio": "1.54.2",
        "numpy": "1.23.5",
        "typing-extensions": "4.5.0",
    }
    assert checks.read_installed(str(tmp_path / "empty")) is None


def test_metadata_headers_end_at_the_first_blank_line(tmp_path: Path) -> None:
    info = tmp_path / "x-1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: real\nVersion: 2.0\n\nName: fake\n", encoding="utf-8")
    assert checks.dist_info(str(info)) == ("real", "2.0")
    (info / "METADATA").write_text("Metadata-Version: 2.1\n\nName: fake\nVersion: 9\n", encoding="utf-8")
    assert checks.dist_info(str(info)) == ("x", "1")


# --- judging it -----------------------------------------------------------------------------------


def test_a_venv_that_matches_its_lock_has_no_finding(tf_stack: Any) -> None:
    assert judge({"tf-2.12": tf_stack()}) == []
    assert checks.judge_venv({}) == []


def test_a_drifted_venv_names_the_changes(tmp_path: Path, tf_stack: Any) -> None:
    installed = {**INSTALLED, "numpy": "1.26.4", "pandas": "2.2.3"}
    del installed["keras"]
    item = only(judge({"tf-2.12": tf_stack(installed)}))
    venv = tmp_path / "tf-2.12"
    assert item["cause"] == (
        f"The venv {venv} of stack tf-2.12 differs from its lock {venv / 'tf-lock.txt'} (1 changed, 1 missing, "
        "1 extra: numpy 1.26.4 installed, the lock has 1.23.5; keras 2.12.0 missing; pandas 2.2.3 not in the lock)."
    )


def test_a_long_drift_is_cut_short(tf_stack: Any) -> None:
    extra = {f"extra-{n}": "1.0" for n in range(6)}
    item = only(judge({"tf-2.12": tf_stack({**INSTALLED, **extra})}))
    assert (
        "(6 extra: extra-0 1.0 not in the lock; extra-1 1.0 not in the lock; extra-2 1.0 not in the lock; and 3 more)."
        in item["cause"]
    )


def test_a_venv_or_lock_that_is_gone(tmp_path: Path, tf_stack: Any) -> None:
    gone = only(
        judge({"tf-2.12": {"venv": str(tmp_path / "nowhere"), "lock": str(tmp_path / "nowhere" / "tf-lock.txt")}})
    )
    assert gone["cause"] == f"Stack tf-2.12: its venv {tmp_path / 'nowhere'} is gone."
    spec = tf_stack()
    Path(spec["lock"]).unlink()
    lost = only(judge({"tf-2.12": spec}))
    assert lost["cause"] == f"Stack tf-2.12: its lock {spec['lock']} cannot be read (No such file or directory)."
    (tmp_path / "bare").mkdir()
    bare = only(judge({"bare": {"venv": str(tmp_path / "bare"), "lock": spec["lock"]}}))
    assert bare["cause"] == f"Stack bare: its venv {tmp_path / 'bare'} has no lib/python3.*/site-packages."


def test_one_finding_per_drifted_stack(tf_stack: Any) -> None:
    good = tf_stack(folder="a")
    bad = tf_stack({**INSTALLED, "numpy": "1.26.4"}, folder="b")
    findings = judge({"good": good, "bad": bad})
    assert len(findings) == 1 and "stack bad" in findings[0]["cause"]


def test_the_check_end_to_end(tmp_path: Path, nvidia_smi: Any, pci_devices: Any, systemctl: Any, tf_stack: Any) -> None:
    spec = tf_stack({**INSTALLED, "numpy": "1.26.4"})
    document = json.loads((FIXTURES / "baseline-h100x8.json").read_text(encoding="utf-8"))
    document["stacks"] = {"tf-2.12": spec}
    (tmp_path / "baseline.json").write_text(json.dumps(document), encoding="utf-8")
    (tmp_path / "kern.log").write_text("", encoding="utf-8")
    bus_ids = sorted(document["gpus"])
    argv = [
        *(sys.executable, str(ROOT / "files" / "health" / "gpu_health.py"), "--nvidia-smi", nvidia_smi()),
        *("--baseline", str(tmp_path / "baseline.json"), "--state", "", "--kernel-log", str(tmp_path / "kern.log")),
        *("--proc-version", str(FIXTURES / "proc-driver-nvidia-version.txt"), "--pci-devices", pci_devices(bus_ids)),
        *("--systemctl", systemctl("active"), "--textfile", str(tmp_path / "metrics.prom")),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "  [venv] host: The venv" in done.stdout and "numpy 1.26.4 installed, the lock has 1.23.5" in done.stdout
    metrics = (tmp_path / "metrics.prom").read_text(encoding="utf-8")
    assert 'gpu_fleet_health_check_ok{check="venv"} 0' in metrics
    assert 'gpu_fleet_health_finding{check="venv",bus_id=""} 1' in metrics
    Path(spec["venv"], "lib", "python3.11", "site-packages", "numpy-1.26.4.dist-info").rename(
        Path(spec["venv"], "lib", "python3.11", "site-packages", "numpy-1.23.5.dist-info")
    )
    Path(spec["venv"], "lib", "python3.11", "site-packages", "numpy-1.23.5.dist-info", "METADATA").write_text(
        "Name: numpy\nVersion: 1.23.5\n", encoding="utf-8"
    )
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_baseline_without_stacks_has_no_venv_check(tf_stack: Any) -> None:
    base = gpu_health.validate_baseline(json.loads((FIXTURES / "baseline-h100x8.json").read_text(encoding="utf-8")))
    state = {"gpus": None, "mismatch": None, "module_version": None, "stacks": {}}
    assert "venv" not in gpu_health.judge_host(state, base)
    spec = tf_stack()
    with_stack = {**base, "stacks": {"tf": spec}}
    state["stacks"] = {"tf": checks.read_stack(spec["venv"], spec["lock"])}
    assert gpu_health.judge_host(state, with_stack)["venv"] == []
