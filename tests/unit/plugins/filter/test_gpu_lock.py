"""Dependency locks: the lock lookup (file name from the stack), parsing, the drift comparison, the
preflight decision (gpu_tf_lock_plan), and the locks kept in data/locks for the shipped inventories."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

# tests/conftest.py puts ROOT/collections on sys.path: plugins import by their collection path.
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_lock as lock_filters
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils import gpu_lock
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[4]
LOCKS = ROOT / "data" / "locks"
HASH = "--hash=sha256:" + "a" * 64
LOCK_TEXT = f"""# a header comment
--index-url https://pypi.org/simple
absl-py==2.5.1 \\
    {HASH} \\
    --hash=sha256:{"b" * 64}
    # via
    #   tensorflow-cpu
numpy==1.24.3 {HASH}
Typing_Extensions==4.5.0 ; python_version >= "3.8" {HASH}
tensorflow-cpu[and-cuda]==2.12.1 {HASH}  # via -r pins.in
setuptools==84.2.1 {HASH}
unpinned>=1.0
"""
PINS = {
    "absl-py": "2.5.1",
    "numpy": "1.24.3",
    "typing-extensions": "4.5.0",
    "tensorflow-cpu": "2.12.1",
    "setuptools": "84.2.1",
}


def stack(package: str = "tensorflow-cpu", version: str = "2.12.1", python: str = "3.11.2") -> dict:
    return {"name": "tf2.12", "tensorflow": {"version": version, "package": package}, "python": {"version": python}}


# --- the lookup: a stack's lock file ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "version", "python", "expected"),
    [
        ("tensorflow-cpu", "2.12.1", "3.11.2", "tensorflow-cpu-2.12.1-py3.11.txt"),
        ("tensorflow", "2.12.1", "3.10", "tensorflow-2.12.1-py3.10.txt"),
        ("TensorFlow_CPU", "2.15.1", "3.9.18", "tensorflow-cpu-2.15.1-py3.9.txt"),
        # A package's extras follow its name, normalised and sorted as the name is.
        ("tensorflow[and-cuda]", "2.18.1", "3.11.2", "tensorflow-and-cuda-2.18.1-py3.11.txt"),
        ("TensorFlow[And_CUDA]", "2.18.1", "3.11", "tensorflow-and-cuda-2.18.1-py3.11.txt"),
        ("tensorflow[ b , and-cuda ]", "2.18.1", "3.11", "tensorflow-and-cuda-b-2.18.1-py3.11.txt"),
    ],
)
def test_the_lock_file_is_named_by_package_version_and_python_series(package, version, python, expected):
    assert gpu_lock.lock_file_name(package, version, python) == expected


def test_the_filter_names_the_lock_of_a_resolved_stack_with_the_default_package():
    assert lock_filters.gpu_tf_lock_name(stack()) == "tensorflow-cpu-2.12.1-py3.11.txt"
    assert lock_filters.gpu_tf_lock_name(stack(package=""), "tensorflow") == "tensorflow-2.12.1-py3.11.txt"
    wheels = stack(package="tensorflow[and-cuda]", version="2.18.1")
    assert lock_filters.gpu_tf_lock_name(wheels, "tensorflow-cpu") == "tensorflow-and-cuda-2.18.1-py3.11.txt"
    assert lock_filters.gpu_tf_lock_name(stack(package=""), "tensorflow[and-cuda]") == (
        "tensorflow-and-cuda-2.12.1-py3.11.txt"
    )


def test_a_stack_whose_python_is_unknown_has_no_lock_name():
    with pytest.raises(AnsibleFilterError, match=r"stack tf2.12: Python version '' has no X.Y"):
        lock_filters.gpu_tf_lock_name(stack(python=""))


@pytest.mark.parametrize("package", ["tensorflow==2.18.1", "tensorflow[and-cuda", "tensorflow[and cuda]", "x y", "-tf"])
def test_a_package_that_is_no_name_with_extras_has_no_lock_name(package):
    with pytest.raises(AnsibleFilterError, match=rf"stack tf2.12: package {re.escape(repr(package))} is not a "):
        lock_filters.gpu_tf_lock_name(stack(package=package))


@pytest.mark.parametrize(
    "package",
    ["tensorflow", "TensorFlow_CPU", "tensorflow[and-cuda]", "tensorflow[And_CUDA]", "tf.x [b,a]", "tensorflow []"],
)
def test_the_distribution_and_extras_are_the_ones_packaging_reads(package):
    """The standard-library reading agrees with packaging's Requirement (names and extras normalised)."""
    requirement = Requirement(package)
    name, extras = gpu_lock.split_package(package)
    assert name == canonicalize_name(requirement.name) == gpu_lock.distribution_name(package)
    assert extras == tuple(sorted(canonicalize_name(extra) for extra in requirement.extras))


def test_the_requirement_of_a_package_keeps_its_extras():
    assert gpu_lock.package_requirement("tensorflow[and_cuda]", "2.18.1") == "tensorflow[and-cuda]==2.18.1"
    assert gpu_lock.package_requirement("TensorFlow_CPU", "2.12.1") == "tensorflow-cpu==2.12.1"


# --- parsing ------------------------------------------------------------------------------------


def test_parse_lock_reads_every_pin_across_continuations_comments_extras_and_markers():
    assert gpu_lock.parse_lock(LOCK_TEXT) == PINS
    assert gpu_lock.parse_lock("") == {} and gpu_lock.parse_lock(None) == {}


@pytest.mark.parametrize(
    ("name", "expected"),
    [("Typing_Extensions", "typing-extensions"), ("zope.interface", "zope-interface"), ("A--B__c", "a-b-c")],
)
def test_names_are_normalised_per_pep_503(name, expected):
    assert gpu_lock.normalize_name(name) == expected


# --- the drift comparison -----------------------------------------------------------------------


def test_a_venv_that_holds_exactly_the_lock_has_no_drift_whatever_the_name_spelling():
    installed = {"Absl_Py": "2.5.1", "numpy": "1.24.3", "typing_extensions": "4.5.0", "tensorflow-cpu": "2.12.1"}
    installed.update(setuptools="84.2.1", pip="24.0", wheel="0.45.1")
    drift = gpu_lock.lock_drift(LOCK_TEXT, installed)
    assert drift == {"missing": [], "changed": [], "extra": [], "ok": True, "lines": []}


def test_drift_lists_what_is_missing_changed_and_not_in_the_lock_in_words():
    installed = {"absl-py": "2.5.1", "numpy": "1.26.4", "typing-extensions": "4.5.0", "setuptools": "84.2.1"}
    installed.update(pandas="2.2.3", pip="24.0")
    drift = gpu_lock.lock_drift(LOCK_TEXT, installed)
    assert drift["ok"] is False
    assert drift["missing"] == [{"name": "tensorflow-cpu", "locked": "2.12.1"}]
    assert drift["changed"] == [{"name": "numpy", "locked": "1.24.3", "installed": "1.26.4"}]
    assert drift["extra"] == [{"name": "pandas", "installed": "2.2.3"}]
    assert drift["lines"] == [
        "numpy 1.26.4 installed, the lock has 1.24.3",
        "tensorflow-cpu 2.12.1 missing",
        "pandas 2.2.3 not in the lock",
    ]


def test_bootstrap_tools_count_only_when_the_lock_names_them():
    pins = {"six": "1.17.0", "setuptools": "84.2.1"}
    drift = gpu_lock.lock_drift(pins, {"six": "1.17.0", "setuptools": "65.5.0", "pip": "23.0.1", "wheel": "0.40"})
    assert drift["changed"] == [{"name": "setuptools", "locked": "84.2.1", "installed": "65.5.0"}]
    assert drift["extra"] == [] and drift["missing"] == []


def test_the_drift_filter_takes_the_lock_text_and_an_empty_venv():
    drift = lock_filters.gpu_lock_drift("six==1.17.0 " + HASH, None)
    assert drift["missing"] == [{"name": "six", "locked": "1.17.0"}] and drift["ok"] is False


def test_requirements_outside_the_lock_are_named():
    requirements = ["numpy==1.24.3", "NumPy==1.26.4", "pandas==2.2.3", "absl_py==2.5.1", "scipy>=1"]
    assert gpu_lock.unlocked_requirements(LOCK_TEXT, requirements) == ["NumPy==1.26.4", "pandas==2.2.3", "scipy>=1"]


# --- the preflight decision ---------------------------------------------------------------------

PATH = "/srv/locks/tensorflow-cpu-2.12.1-py3.11.txt"


def test_a_stack_without_a_lock_stops_with_cause_and_fix():
    plan = lock_filters.tf_lock_plan(None, stack(), PATH, "tensorflow", [], True)
    assert plan["locked"] is False
    assert plan["problem"].startswith(
        f"Stack tf2.12 has no dependency lock: {PATH} does not exist. Make it with `make locks`"
    )
    assert "tools/locks.py --package tensorflow-cpu --tensorflow 2.12.1 --python 3.11 --out-dir" in plan["problem"]
    assert "set tf_venv_require_lock: false" in plan["problem"]


def test_the_fix_quotes_a_package_with_extras_for_the_shell():
    """Unquoted, a shell takes tensorflow[and-cuda] for a file name pattern."""
    wheels = stack(package="tensorflow[and-cuda]", version="2.18.1")
    plan = lock_filters.tf_lock_plan(None, wheels, PATH, "tensorflow", ["ipykernel==6.29.5"], True)
    assert (
        "`tools/locks.py --package 'tensorflow[and-cuda]' --tensorflow 2.18.1 --python 3.11 --extra ipykernel==6.29.5"
        " --out-dir <tf_venv_lock_dir>`" in plan["problem"]
    )


def test_without_require_lock_a_stack_without_a_lock_installs_unlocked():
    assert lock_filters.tf_lock_plan(None, stack(), PATH, "tensorflow", [], False) == {"locked": False, "problem": ""}


def test_a_stack_with_its_lock_installs_from_it_and_extras_must_be_in_it():
    assert lock_filters.tf_lock_plan(LOCK_TEXT, stack(), PATH, "tensorflow", ["numpy==1.24.3"], True)["locked"] is True
    plan = lock_filters.tf_lock_plan(LOCK_TEXT, stack(), PATH, "tensorflow", ["numpy==1.24.3", "pandas==2.2.3"], True)
    assert plan["locked"] is False
    assert plan["problem"].startswith(f"tf_venv_extra_packages pandas==2.2.3 not in stack tf2.12's lock {PATH}")
    assert "--extra numpy==1.24.3 --extra pandas==2.2.3 --out-dir <folder>" in plan["problem"]
    assert "point tf_venv_lock_dir at that folder" in plan["problem"]
    unlocked = lock_filters.tf_lock_plan(LOCK_TEXT, stack(), PATH, "tensorflow", ["pandas==2.2.3"], False)
    assert unlocked == {"locked": False, "problem": ""}


# --- the locks kept in data/locks ---------------------------------------------------------------


def targets() -> list[tuple[str, str, str]]:
    data = yaml.safe_load((LOCKS / "targets.yml").read_text())
    return [(row["package"], str(row["tensorflow"]), str(py)) for row in data["locks"] for py in row["python"]]


def test_every_target_has_its_lock_and_every_lock_is_a_target():
    expected = {gpu_lock.lock_file_name(*target) for target in targets()}
    assert {p.name for p in LOCKS.glob("*.txt")} == expected


@pytest.mark.parametrize("path", sorted(LOCKS.glob("*.txt")), ids=lambda p: p.name)
def test_each_lock_says_how_it_was_made_and_pins_every_distribution_with_hashes(path: Path):
    text = path.read_text()
    [(package, version, python)] = [t for t in targets() if gpu_lock.lock_file_name(*t) == path.name]
    head = text.split("\n", 6)
    assert head[0] == f"# Dependency lock of {package}=={version} for CPython {python} on Linux x86_64:"
    assert "Made by `make locks` (tools/locks.py) with uv " in head[2]
    assert "uv pip compile --generate-hashes" in head[3] and f"--python-version {python}" in head[3]
    assert "--python-platform x86_64-manylinux_2_17" in head[3] and "--exclude-newer " in head[3]
    pins = gpu_lock.parse_lock(text)
    # The distribution is pinned by its own name: pip freeze lists tensorflow, not tensorflow[and-cuda].
    assert pins[gpu_lock.distribution_name(package)] == version and len(pins) > 20
    requirements = [line for line in text.replace("\\\n", " ").splitlines() if re.match(r"^[a-z0-9]", line)]
    assert len(requirements) == len(pins)
    assert all("==" in line and "--hash=sha256:" in line and ";" not in line for line in requirements)


# The nvidia-*-cu12 wheels TensorFlow 2.18's and-cuda extra pins (its setup.py, REQUIRED_PACKAGES' and-cuda
# list: CUDA 12.5, cuDNN 9.3), the series of each.
AND_CUDA_2_18 = {
    "nvidia-cublas-cu12": "12.5.",
    "nvidia-cuda-cupti-cu12": "12.5.",
    "nvidia-cuda-nvcc-cu12": "12.5.",
    "nvidia-cuda-nvrtc-cu12": "12.5.",
    "nvidia-cuda-runtime-cu12": "12.5.",
    "nvidia-cudnn-cu12": "9.3.",
    "nvidia-cufft-cu12": "11.2.",
    "nvidia-curand-cu12": "10.3.",
    "nvidia-cusolver-cu12": "11.6.",
    "nvidia-cusparse-cu12": "12.5.",
    "nvidia-nccl-cu12": "2.21.",
    "nvidia-nvjitlink-cu12": "12.5.",
}


def test_the_wheels_stacks_lock_holds_nvidias_wheels_with_their_hashes_and_no_tensorrt():
    text = (LOCKS / "tensorflow-and-cuda-2.18.1-py3.11.txt").read_text()
    pins = gpu_lock.lock_hashes(text)
    nvidia = {name: version for name, (version, _) in pins.items() if name.startswith("nvidia-")}
    assert sorted(nvidia) == sorted(AND_CUDA_2_18)
    assert all(nvidia[name].startswith(series) for name, series in AND_CUDA_2_18.items()), nvidia
    assert all(pins[name][1] for name in nvidia), "an NVIDIA wheel without its hashes"
    assert not any(name.startswith("tensorrt") for name in pins)
    # The same release's CPU build pins no NVIDIA wheel: the extra brings them.
    cpu = gpu_lock.parse_lock((LOCKS / "tensorflow-cpu-2.18.1-py3.11.txt").read_text())
    assert not any(name.startswith("nvidia-") for name in cpu)


def test_a_venv_installed_from_the_wheels_stacks_lock_has_no_drift():
    """pip freeze names the distribution tensorflow (no extras): the lock's pins compare with it as they are."""
    text = (LOCKS / "tensorflow-and-cuda-2.18.1-py3.11.txt").read_text()
    installed = {name.replace("-", "_"): version for name, version in gpu_lock.parse_lock(text).items()}
    assert gpu_lock.lock_drift(text, installed)["ok"] is True
    assert gpu_lock.unlocked_requirements(text, ["tensorflow[and-cuda]==2.18.1", "nvidia-cudnn-cu12==9.3.0.75"]) == []
    del installed["nvidia_cudnn_cu12"]
    assert gpu_lock.lock_drift(text, installed)["lines"] == ["nvidia-cudnn-cu12 9.3.0.75 missing"]


def test_the_shipped_inventories_stacks_have_their_locks():
    """The sandbox (tensorflow-cpu 2.12 on Debian 12's Python 3.11) and the example fleet (tensorflow
    2.12.1 on the Python 3 of each supported OS that TensorFlow 2.12 allows)."""
    matrix = yaml.safe_load((ROOT / "data" / "version_matrix.yml").read_text())["tensorflow"]
    sandbox = yaml.safe_load((ROOT / "inventories/sandbox/group_vars/gpu_hosts.yml").read_text())
    fleet = yaml.safe_load((ROOT / "inventories/gpu_hosts/group_vars/gpu_hosts.yml").read_text())
    # /usr/bin/python3 of each supported release (data/supported_os.yml): Debian 12, Ubuntu 22.04
    # and 24.04, RHEL/Rocky 9.
    system_pythons = {"3.11", "3.10", "3.12", "3.9"}
    wanted = set()
    for pins, pythons in ((sandbox["gpu_preflight_stacks"], {"3.11"}), (fleet["gpu_preflight_stacks"], system_pythons)):
        for pin in pins:
            row = matrix[".".join(str(pin["tensorflow"]).split(".")[:2])]
            version = str(pin["tensorflow"]) if str(pin["tensorflow"]).count(".") == 2 else row["latest"]
            allowed = {py for py in pythons if f"{py}.0" in SpecifierSet(row["python"])}
            wanted |= {gpu_lock.lock_file_name(pin.get("package", "tensorflow"), version, py) for py in allowed}
    assert wanted and wanted <= {p.name for p in LOCKS.glob("*.txt")}


# --- the wheelhouse against the lock (tf_venv's check before anything is pushed) --------------------

SIX_SHA, NUMPY_SHA = "a" * 64, "b" * 64
WHEEL_LOCK = (
    f"six==1.17.0 \\\n    --hash=sha256:{SIX_SHA}\n"
    f"numpy==1.24.3 \\\n    --hash=sha256:{'c' * 64} \\\n    --hash=sha256:{NUMPY_SHA}\n"
)


def test_the_locked_wheels_other_releases_and_other_files_pass():
    wheels = {
        "six-1.17.0-py2.py3-none-any.whl": SIX_SHA,
        "numpy-1.24.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": NUMPY_SHA.upper(),
        "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl": "d" * 64,  # another release: not pinned
        "requests-2.32.3-py3-none-any.whl": "e" * 64,  # not in this lock (another stack's)
        "six-1.17.0.tar.gz": "f" * 64,  # not a wheel
    }
    assert gpu_lock.wheelhouse_problems(WHEEL_LOCK, wheels) == []


def test_a_wheel_of_a_pinned_release_that_is_not_the_locked_file_is_named_with_both_digests():
    wheels = {"six-1.17.0-py2.py3-none-any.whl": "0" * 64, "Numpy-1.24.3-1-cp311-cp311-linux_x86_64.whl": "1" * 64}
    assert gpu_lock.wheelhouse_problems(WHEEL_LOCK, wheels) == [
        "Numpy-1.24.3-1-cp311-cp311-linux_x86_64.whl is not the file the lock pins: its sha256 is "
        f"1111111111111111…, the lock lists {NUMPY_SHA[:16]}, {'c' * 16} for Numpy==1.24.3",
        "six-1.17.0-py2.py3-none-any.whl is not the file the lock pins: its sha256 is 0000000000000000…, the lock "
        f"lists {SIX_SHA[:16]} for six==1.17.0",
    ]


def test_the_filter_takes_the_lookups_entries(tmp_path):
    found = [{"path": f"{tmp_path}/six-1.17.0-py2.py3-none-any.whl", "exists": True, "checksum": "0" * 64}]
    assert lock_filters.gpu_lock_wheelhouse(WHEEL_LOCK, found)[0].startswith("six-1.17.0-py2.py3-none-any.whl is not")
    assert lock_filters.gpu_lock_wheelhouse(WHEEL_LOCK, []) == []


# --- a folder that holds the whole lock (tf_venv's controller cache, tf_venv_wheels_from: controller) -------


def test_a_folder_with_every_locked_wheel_misses_nothing():
    wheels = {
        "six-1.17.0-py2.py3-none-any.whl": SIX_SHA,
        "numpy-1.24.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": NUMPY_SHA,
        "requests-2.32.3-py3-none-any.whl": "e" * 64,  # another lock's
    }
    assert gpu_lock.wheelhouse_missing(WHEEL_LOCK, wheels) == []


def test_a_pin_without_its_locked_wheel_is_missing():
    # numpy's wheel of another release, six's of the pinned release but altered: neither holds its pin
    wheels = {"numpy-1.26.4-cp311-cp311-linux_x86_64.whl": NUMPY_SHA, "six-1.17.0-py2.py3-none-any.whl": "0" * 64}
    assert gpu_lock.wheelhouse_missing(WHEEL_LOCK, wheels) == ["numpy==1.24.3", "six==1.17.0"]
    assert gpu_lock.wheelhouse_missing(WHEEL_LOCK, {}) == ["numpy==1.24.3", "six==1.17.0"]


def test_the_filter_names_missing_pins_only_when_asked_for_the_whole_lock(tmp_path):
    found = [{"path": f"{tmp_path}/six-1.17.0-py2.py3-none-any.whl", "exists": True, "checksum": "0" * 64}]
    assert len(lock_filters.gpu_lock_wheelhouse(WHEEL_LOCK, found)) == 1
    whole = lock_filters.gpu_lock_wheelhouse(WHEEL_LOCK, found, complete=True)
    assert whole[0].startswith("six-1.17.0-py2.py3-none-any.whl is not")
    assert whole[1:] == ["no locked wheel of numpy==1.24.3", "no locked wheel of six==1.17.0"]
    assert lock_filters.gpu_lock_wheelhouse(WHEEL_LOCK, [], complete=True) == [
        "no locked wheel of numpy==1.24.3",
        "no locked wheel of six==1.17.0",
    ]


# --- a wheel counts only for the Python and architecture of the host (PEP 425 tags) -------------------------


@pytest.mark.parametrize(
    ("name", "python", "arch", "fits"),
    [
        ("six-1.17.0-py2.py3-none-any.whl", "3.11", "x86_64", True),
        ("numpy-1.24.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.11.4", "x86_64", True),
        ("numpy-1.24.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.10", "x86_64", False),
        ("numpy-1.24.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.11", "aarch64", False),
        ("numpy-1.24.3-cp311-cp311-macosx_11_0_arm64.whl", "3.11", "x86_64", False),
        ("numpy-1.24.3-cp311-cp311-win_amd64.whl", "3.11", "x86_64", False),
        ("cryptography-42.0.0-cp39-abi3-manylinux_2_28_aarch64.whl", "3.11", "aarch64", True),
        ("cryptography-42.0.0-cp312-abi3-manylinux_2_28_aarch64.whl", "3.11", "aarch64", False),
        ("wrapt-1.14.1-cp311-cp311-linux_x86_64.whl", "3.11", "x86_64", True),
        ("typing_extensions-4.5.0-py3-none-any.whl", "3.8", "aarch64", True),
        ("oldlib-1.0-py312-none-any.whl", "3.11", "x86_64", False),
        ("numpy-1.24.3-cp311-cp311-manylinux_2_17_x86_64.whl", "", "", True),
        ("numpy-1.24.3.tar.gz", "", "", False),
    ],
)
def test_a_wheel_fits_the_hosts_cpython_and_architecture(name, python, arch, fits):
    assert gpu_lock.wheel_fits(name, python, arch) is fits


def test_a_locked_wheel_for_another_platform_does_not_hold_its_pin():
    # Both files are locked (a lock lists every platform's wheel); only the host's counts.
    wheels = {
        "six-1.17.0-py2.py3-none-any.whl": SIX_SHA,
        "numpy-1.24.3-cp311-cp311-macosx_11_0_arm64.whl": NUMPY_SHA,
    }
    assert gpu_lock.wheelhouse_missing(WHEEL_LOCK, wheels) == []
    assert gpu_lock.wheelhouse_missing(WHEEL_LOCK, wheels, "3.11", "x86_64") == ["numpy==1.24.3"]
    found = [{"path": f"/w/{name}", "checksum": digest} for name, digest in wheels.items()]
    assert lock_filters.gpu_lock_wheelhouse(WHEEL_LOCK, found, True, "3.11", "x86_64") == [
        "no locked wheel of numpy==1.24.3"
    ]
