"""tools/locks.py (`make locks`): the uv command per lock, the header, writing and --check, with a
stand-in uv (the real one asks PyPI; `make locks LOCKS_ARGS=--check` runs it by hand)."""

from __future__ import annotations

import importlib.util
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SPEC = importlib.util.spec_from_file_location("locks_tool", ROOT / "tools" / "locks.py")
locks = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(locks)

# Prints its arguments' platform and pins as a uv pip compile would print a lock; ipykernel brings
# ipython 8.23.0, or 8.22.2 under a constraints file that bounds it.
FAKE_UV = """#!{python}
import sys
if sys.argv[1:] == ["--version"]:
    print("uv 9.9.9 (fake)")
    sys.exit(0)
pins = open("pins.in").read().split()
if any(pin.startswith("ipykernel==") for pin in pins):
    bounded = "--constraint" in sys.argv and "ipython<8.23" in open("constraints.txt").read()
    pins.append("ipython==8.22.2" if bounded else "ipython==8.23.0")
python = sys.argv[sys.argv.index("--python-version") + 1]
for pin in pins:
    print(pin + " \\\\\\n    --hash=sha256:" + "d" * 64 + "\\n    # via -r pins.in (py" + python + ")")
"""
TARGETS = """index_url: https://pypi.org/simple
platform: x86_64-manylinux_2_17
exclude_newer: "2026-12-01T00:00:00Z"
locks:
  - {package: tensorflow-cpu, tensorflow: "2.12.1", python: ["3.11", "3.10"]}
"""


@pytest.fixture
def fake_uv(tmp_path: Path) -> str:
    path = tmp_path / "uv"
    path.write_text(FAKE_UV.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_uv_command_targets_the_hosts_not_this_machine():
    settings = locks.Settings("https://pypi.org/simple", "x86_64-manylinux_2_17", "2026-12-01T00:00:00Z")
    command = locks.uv_command("uv", settings, locks.Lock("tensorflow", "2.12.1", "3.9"))
    assert command[:4] == ["uv", "pip", "compile", "--generate-hashes"]
    pairs = {option: command[i + 1] for i, option in enumerate(command[:-1])}
    assert pairs["--python-version"] == "3.9" and pairs["--python-platform"] == "x86_64-manylinux_2_17"
    assert pairs["--exclude-newer"] == "2026-12-01T00:00:00Z" and pairs["--only-binary"] == ":all:"
    assert "--no-config" in command and command[-1] == "pins.in"


def test_make_locks_writes_one_lock_per_target_with_a_header_and_check_finds_them_current(tmp_path, fake_uv):
    targets = tmp_path / "targets.yml"
    targets.write_text(TARGETS)
    assert locks.main(["--targets", str(targets), "--uv", fake_uv]) == 0
    lock = (tmp_path / "tensorflow-cpu-2.12.1-py3.10.txt").read_text()
    assert lock.startswith("# Dependency lock of tensorflow-cpu==2.12.1 for CPython 3.10 on Linux x86_64:\n")
    assert "with uv 9.9.9, from pins.in = tensorflow-cpu==2.12.1:" in lock
    assert "#   uv pip compile --generate-hashes --no-header" in lock
    assert "tensorflow-cpu==2.12.1 \\\n    --hash=sha256:" in lock and "(py3.10)" in lock
    assert (tmp_path / "tensorflow-cpu-2.12.1-py3.11.txt").exists()
    assert locks.main(["--targets", str(targets), "--uv", fake_uv, "--check"]) == 0
    (tmp_path / "tensorflow-cpu-2.12.1-py3.11.txt").write_text("numpy==1.0\n")
    assert locks.main(["--targets", str(targets), "--uv", fake_uv, "--check"]) == 1
    assert (tmp_path / "tensorflow-cpu-2.12.1-py3.11.txt").read_text() == "numpy==1.0\n", "--check wrote"


def test_one_lock_with_extras_into_a_folder_of_ones_own(tmp_path, fake_uv):
    out = tmp_path / "my-locks"
    argv = ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3.10", "--extra", "pandas==2.2.3"]
    assert locks.main([*argv, "--out-dir", str(out), "--uv", fake_uv]) == 0
    text = (out / "tensorflow-2.12.1-py3.10.txt").read_text()
    assert "from pins.in = tensorflow==2.12.1 pandas==2.2.3" in text and "pandas==2.2.3 \\" in text


def test_a_package_with_extras_is_resolved_with_them_into_a_lock_named_after_them(tmp_path, fake_uv):
    targets = tmp_path / "targets.yml"
    targets.write_text(TARGETS.replace("{package: tensorflow-cpu,", '{package: "TensorFlow[ And_CUDA ]",'))
    assert locks.main(["--targets", str(targets), "--uv", fake_uv]) == 0
    text = (tmp_path / "tensorflow-and-cuda-2.12.1-py3.11.txt").read_text()
    assert text.startswith("# Dependency lock of tensorflow[and-cuda]==2.12.1 for CPython 3.11 on Linux x86_64:\n")
    assert "from pins.in = tensorflow[and-cuda]==2.12.1:" in text
    assert "tensorflow[and-cuda]==2.12.1 \\\n    --hash=sha256:" in text  # what uv was given to resolve
    assert sorted(path.name for path in tmp_path.glob("*.txt")) == [
        "tensorflow-and-cuda-2.12.1-py3.10.txt",
        "tensorflow-and-cuda-2.12.1-py3.11.txt",
    ]


def test_a_targets_row_whose_package_is_no_name_is_a_usage_error(tmp_path, fake_uv, capsys):
    targets = tmp_path / "targets.yml"
    targets.write_text(TARGETS.replace("{package: tensorflow-cpu,", '{package: "tensorflow>=2",'))
    assert locks.main(["--targets", str(targets), "--uv", fake_uv]) == 2
    assert "package 'tensorflow>=2' is not a distribution name with optional extras" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--package", "tensorflow"],
        ["--package", "tensorflow", "--tensorflow", "2.12", "--python", "3.10"],
        ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3"],
        ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3.10", "--extra", "pandas"],
        ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3.10", "--extra", "ipykernel=="],
        ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3.10", "--extra", "==6.29.5"],
        ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3.10", "--extra", "ipykernel>=6.29"],
        ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3.10", "--extra", "a==1 b==2"],
        ["--package", "tensorflow", "--tensorflow", "2.12.1", "--python", "3.10", "--extra", "a==1\n--index-url x"],
        ["--package", "tensorflow==2.18.1", "--tensorflow", "2.18.1", "--python", "3.11"],
        ["--package", "tensorflow[and-cuda", "--tensorflow", "2.18.1", "--python", "3.11"],
    ],
)
def test_bad_arguments_exit_2(argv, fake_uv, capsys):
    assert locks.main([*argv, "--uv", fake_uv]) == 2
    assert capsys.readouterr().err.startswith("locks: ")


def test_the_shipped_targets_file_loads():
    settings, planned = locks.load_targets()
    assert settings.platform == "x86_64-manylinux_2_17" and settings.exclude_newer
    assert {lock.file for lock in planned} == {p.name for p in (ROOT / "data" / "locks").glob("*.txt")}


CONSTRAINED = (
    TARGETS
    + """constraints:
  - pin: ipython<8.23
    tensorflow: "<2.14"
    why: IPython 8.23 needs typing-extensions 4.6
"""
)


@pytest.mark.parametrize(
    ("tensorflow", "extra", "ipython", "bounded"),
    [
        ("2.12.1", "ipykernel==6.29.5", "ipython==8.22.2", True),  # in the range, holds ipython: bounded
        ("2.18.1", "ipykernel==6.29.5", "ipython==8.23.0", False),  # another TensorFlow: not bounded
        ("2.12.1", "pandas==2.2.3", None, False),  # no ipython in the resolution: the lock as before
    ],
)
def test_a_constraint_applies_only_to_a_lock_of_its_range_that_holds_its_distribution(
    tmp_path, fake_uv, tensorflow, extra, ipython, bounded
):
    targets = tmp_path / "targets.yml"
    targets.write_text(CONSTRAINED)
    argv = ["--targets", str(targets), "--package", "tensorflow-cpu", "--tensorflow", tensorflow, "--python", "3.11"]
    assert locks.main([*argv, "--extra", extra, "--out-dir", str(tmp_path), "--uv", fake_uv]) == 0
    text = (tmp_path / f"tensorflow-cpu-{tensorflow}-py3.11.txt").read_text()
    assert (ipython is None and "ipython" not in text) or f"{ipython} \\" in text
    assert ("--constraint constraints.txt pins.in" in text) is bounded
    assert ("#   constraints.txt: ipython<8.23 (IPython 8.23 needs typing-extensions 4.6)" in text) is bounded


def test_a_malformed_constraint_is_a_usage_error(tmp_path, fake_uv, capsys):
    targets = tmp_path / "targets.yml"
    targets.write_text(CONSTRAINED.replace('tensorflow: "<2.14"', 'tensorflow: "before 2.14"'))
    assert locks.main(["--targets", str(targets), "--uv", fake_uv]) == 2
    assert "a constraint's pin or tensorflow range is malformed" in capsys.readouterr().err


def test_the_shipped_constraints_leave_the_shipped_locks_unbounded():
    settings, planned = locks.load_targets()
    assert settings.constraints, "the targets file bounds IPython for TensorFlow 2.12 and 2.13"
    for lock in planned:
        text = (ROOT / "data" / "locks" / lock.file).read_text()
        assert not [c for c in settings.constraints if c.applies(lock, text)], lock.file
