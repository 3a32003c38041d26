"""venv_lock.py (files/verify): the venv against its lock, the ``lock`` section of gpu_verify.py's
document, and the drift problem with its cause and fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

VERIFY_DIR = Path(__file__).resolve().parents[3] / "files" / "verify"
sys.path.insert(0, str(VERIFY_DIR))

import gpu_verify
import venv_lock

HASH = "--hash=sha256:" + "c" * 64
LOCK = f"numpy==1.24.3 \\\n    {HASH}\nsix==1.17.0 \\\n    {HASH}\n"


def test_a_venv_that_matches_its_lock_passes_with_the_lock_digest():
    section = venv_lock.lock_section("/opt/tf/tf-lock.txt", LOCK, {"NumPy": "1.24.3", "six": "1.17.0", "pip": "24"})
    assert section["ok"] is True and section["problems"] == [] and section["pins"] == 2
    assert section["sha256"] == __import__("hashlib").sha256(LOCK.encode()).hexdigest()
    assert venv_lock.format_line(section).endswith(f"sha256 {section['sha256'][:12]}, 2 pins: the venv matches it")


def test_drift_is_one_lock_problem_naming_each_difference_and_the_rerun():
    section = venv_lock.lock_section("/opt/tf/tf-lock.txt", LOCK, {"numpy": "1.26.4", "pandas": "2.2.3"})
    assert section["ok"] is False
    [found] = section["problems"]
    assert found["check"] == "lock"
    assert found["cause"] == (
        f"The venv differs from its lock /opt/tf/tf-lock.txt (sha256 {section['sha256'][:12]}): numpy 1.26.4 "
        "installed, the lock has 1.24.3; six 1.17.0 missing; pandas 2.2.3 not in the lock."
    )
    assert found["fix"].startswith("Rerun the playbook (site.yml, or playbooks/tensorflow.yml --limit <host>)")
    assert section["drift"]["extra"] == [{"name": "pandas", "installed": "2.2.3"}]


def test_a_venv_without_a_lock_is_not_judged():
    section = venv_lock.lock_section("/opt/tf/tf-lock.txt", None, {"numpy": "1.26.4"})
    assert section["ok"] is None and section["problems"] == [] and section["sha256"] is None
    assert "installed without one" in section["note"]


def test_a_lock_that_pins_nothing_is_a_problem():
    section = venv_lock.lock_section("/opt/tf/tf-lock.txt", "# empty\n", {})
    assert section["ok"] is False and "pins nothing" in section["problems"][0]["cause"]


def test_check_compares_this_interpreters_distributions(tmp_path: Path):
    installed = venv_lock.installed_distributions()
    assert installed["pytest"]  # this interpreter's own packages
    lock = tmp_path / "tf-lock.txt"
    lock.write_text("".join(f"{name}=={version} {HASH}\n" for name, version in installed.items()))
    assert venv_lock.check(str(lock))["ok"] is True
    lock.write_text("".join(f"{name}=={version} {HASH}\n" for name, version in installed.items() if name != "pytest"))
    section = venv_lock.check(str(lock))
    assert section["ok"] is False and section["drift"]["extra"][0]["name"] == "pytest"
    assert venv_lock.check(str(tmp_path / "none.txt"))["ok"] is None


def test_the_script_exits_1_on_drift_and_0_without_a_lock(tmp_path: Path):
    lock = tmp_path / "tf-lock.txt"
    lock.write_text(LOCK)
    run = [sys.executable, str(VERIFY_DIR / "venv_lock.py"), "--lock"]
    drifted = subprocess.run([*run, str(lock)], capture_output=True, text=True, check=False)
    assert drifted.returncode == 1 and json.loads(drifted.stdout)["drift"]["missing"]
    absent = subprocess.run([*run, str(tmp_path / "x"), "--format", "table"], capture_output=True, text=True)
    assert absent.returncode == 0 and "not compared (no lock at" in absent.stdout


def test_gpu_verify_reads_the_venvs_own_lock_by_default_and_reports_the_section():
    args = gpu_verify.build_parser().parse_args(["--expected-gpus", "0"])
    assert args.lock == str(Path(sys.prefix) / "tf-lock.txt")
    doc = {"host": "h", "ok": False, "lock": venv_lock.lock_section("/opt/tf/tf-lock.txt", LOCK, {})}
    doc["problems"] = doc["lock"].pop("problems")
    table = gpu_verify.format_table(doc)
    assert "  lock /opt/tf/tf-lock.txt sha256 " in table and "the venv differs from it" in table
    assert "[lock] The venv differs from its lock" in table
