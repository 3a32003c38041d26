"""Resolution of pinned stacks against the real version matrix and artifact manifest."""

from __future__ import annotations

import ast
import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))

import gpu_stack

MATRIX = yaml.safe_load((ROOT / "data/version_matrix.yml").read_text())
REAL_MANIFEST = yaml.safe_load((ROOT / "data/artifacts.yml").read_text())["artifacts"]


def _manifest(**extra: dict) -> dict:
    """The real manifest, with sha256 filled in where NVIDIA publishes none, plus extra entries."""
    manifest = copy.deepcopy(REAL_MANIFEST)
    for entry in manifest.values():
        entry["sha256"] = entry["sha256"] or "0" * 64
    for name, entry in extra.items():
        manifest[name] = dict({"sha256": "1" * 64, "size_bytes": None, "url": None}, **entry)
    return manifest


CUDNN_89 = {
    "cudnn-linux-x86_64-8.9.7.29_cuda12-archive.tar.xz": {"component": "cudnn", "version": "8.9.7.29", "cuda_major": 12}
}
CUDNN_86_12 = {
    "cudnn-linux-x86_64-8.6.0.163_cuda12-archive.tar.xz": {
        "component": "cudnn",
        "version": "8.6.0.163",
        "cuda_major": 12,
    }
}
CUDNN_93 = {
    "cudnn-linux-x86_64-9.3.0.75_cuda12-archive.tar.xz": {"component": "cudnn", "version": "9.3.0.75", "cuda_major": 12}
}
CUDNN_87 = {
    "cudnn-linux-x86_64-8.7.0.84_cuda11-archive.tar.xz": {"component": "cudnn", "version": "8.7.0.84", "cuda_major": 11}
}
CUDA_123 = {
    "cuda_12.3.2_545.23.08_linux.run": {"component": "cuda_toolkit", "version": "12.3.2", "nvcc_version": "12.3.107"}
}
DRIVER_535 = {"NVIDIA-Linux-x86_64-535.104.05.run": {"component": "nvidia_driver", "version": "535.104.05"}}


DEFAULT_PYTHON = "/usr/bin/python3"  # gpu_preflight_python's default


def resolve(pins, python="3.11.2", driver="520.61.05", manifest=None, default="", driver_install=True, **host):
    manifest = manifest if manifest is not None else _manifest()
    pins = pins if isinstance(pins, list) else [pins]
    host = dict(
        {
            "python_versions": {p.get("python", DEFAULT_PYTHON): python for p in pins},
            "default_python": DEFAULT_PYTHON,
            "driver_version": driver,
            "driver_install": driver_install,
        },
        **host,
    )
    return gpu_stack.resolve_stacks(pins, MATRIX, manifest, host, default)


# --- the matrix itself --------------------------------------------------------------------------

# TensorFlow's "Tested build configurations", Linux GPU (tensorflow/docs source.md @7c3650212740).
TESTED = """
2.21.0 3.10-3.13 9.3 12.5
2.20.0 3.9-3.13 9.3 12.5
2.19.0 3.9-3.12 9.3 12.5
2.18.0 3.9-3.12 9.3 12.5
2.17.0 3.9-3.12 8.9 12.3
2.16.1 3.9-3.12 8.9 12.3
2.15.0 3.9-3.11 8.9 12.2
2.14.0 3.9-3.11 8.7 11.8
2.13.0 3.8-3.11 8.6 11.8
2.12.0 3.8-3.11 8.6 11.8
2.11.0 3.7-3.10 8.1 11.2
2.10.0 3.7-3.10 8.1 11.2
2.9.0 3.7-3.10 8.1 11.2
2.8.0 3.7-3.10 8.1 11.2
2.7.0 3.7-3.9 8.1 11.2
2.6.0 3.6-3.9 8.1 11.2
2.5.0 3.6-3.9 8.1 11.2
2.4.0 3.6-3.8 8.0 11.0
"""


@pytest.mark.parametrize("row", TESTED.split("\n")[1:-1])
def test_matrix_reproduces_tensorflow_tested_configurations(row):
    tf, python, cudnn, cuda = row.split()
    entry = MATRIX["tensorflow"][gpu_stack._series(tf)]
    assert gpu_stack._spec_text(entry["python"]) == python
    assert entry["cudnn"] == cudnn
    assert entry["cuda"] == cuda


def test_every_matrix_cuda_series_has_a_release_with_a_min_driver():
    for series, row in MATRIX["tensorflow"].items():
        releases = [v for v in MATRIX["cuda"] if gpu_stack._starts(v, row["cuda"])]
        assert releases, f"TensorFlow {series}: no CUDA {row['cuda']} release in the matrix"


# --- good stacks --------------------------------------------------------------------------------


def test_default_stack_resolves_from_tensorflow_alone():
    result = resolve({"name": "tf2.12", "tensorflow": "2.12"})
    assert result["ok"], result["messages"]
    stack = result["stacks"][0]
    assert stack["tensorflow"]["version"] == "2.12.1"
    assert stack["cuda_toolkit"]["version"] == "11.8.0"
    assert stack["cuda_toolkit"]["root"] == "/usr/local/cuda-11.8"
    assert stack["cuda_toolkit"]["runfile"]["file"] == "cuda_11.8.0_520.61.05_linux.run"
    assert stack["cuda_toolkit"]["min_driver"] == "520.61.05"
    assert stack["cudnn"]["short"] == "8.6.0"
    assert stack["cudnn"]["archive"]["file"] == "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"
    assert stack["venv"] == "/opt/tensorflow/2.12"
    assert stack["default"] is True
    assert result["driver"]["runfile"]["file"] == "NVIDIA-Linux-x86_64-520.61.05.run"


def test_exact_pins_are_kept():
    result = resolve(
        {
            "name": "a",
            "tensorflow": "2.12.0",
            "cuda": "11.8.0",
            "cudnn": "8.6.0.163",
            "venv": "/srv/tf",
            "package": "tensorflow-cpu",
        }
    )
    stack = result["stacks"][0]
    assert result["ok"]
    assert (stack["tensorflow"]["version"], stack["venv"], stack["tensorflow"]["package"]) == (
        "2.12.0",
        "/srv/tf",
        "tensorflow-cpu",
    )


def test_tf_2_12_runs_on_driver_520_not_only_525():
    # A common claim says TF 2.12 needs >= 525.60.13; CUDA 11.8 needs 520.61.05 (release notes).
    assert resolve({"name": "a", "tensorflow": "2.12"}, driver="520.61.05")["ok"]


def test_newer_cudnn_minor_is_accepted():
    result = resolve({"name": "a", "tensorflow": "2.12", "cudnn": "8.7"}, manifest=_manifest(**CUDNN_87))
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["cudnn"]["version"] == "8.7.0.84"


def test_tf_2_15_with_cuda_12_2_and_cudnn_8_9():
    result = resolve(
        {"name": "a", "tensorflow": "2.15"}, driver="535.104.05", manifest=_manifest(**CUDNN_89, **DRIVER_535)
    )
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["cuda_toolkit"]["version"] == "12.2.2"
    assert result["stacks"][0]["cuda_toolkit"]["cudart_soname"] == "libcudart.so.12"


def test_cuda_11_runtime_soname_keeps_its_minor():
    result = resolve({"name": "a", "tensorflow": "2.12"})
    assert result["stacks"][0]["cuda_toolkit"]["cudart_soname"] == "libcudart.so.11.0"


def test_tf_2_18_with_cudnn_9():
    result = resolve(
        {"name": "a", "tensorflow": "2.18"},
        python="3.12.3",
        driver="555.42.06",
        manifest=_manifest(
            **CUDNN_93, **{"NVIDIA-Linux-x86_64-555.42.06.run": {"component": "nvidia_driver", "version": "555.42.06"}}
        ),
    )
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["cudnn"]["short"] == "9.3.0"


def test_driver_not_required_in_manifest_when_not_installed_by_runfile():
    manifest = _manifest()
    del manifest["NVIDIA-Linux-x86_64-520.61.05.run"]
    assert resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest, driver_install=False)["ok"]


def test_package_method_needs_no_runfile_but_keeps_the_pinned_driver():
    manifest = _manifest()
    del manifest["NVIDIA-Linux-x86_64-520.61.05.run"]
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest, driver_method="package")
    assert result["ok"], result["messages"]
    assert result["driver"] == {"version": "520.61.05", "runfile": None}


def test_package_method_still_checks_the_driver_against_cuda():
    result = resolve({"name": "a", "tensorflow": "2.12"}, driver="470.57.02", driver_method="package")
    assert not result["ok"]
    assert any("470.57.02" in m for m in result["messages"]), result["messages"]


def test_known_bad_release_warns():
    result = resolve(
        {"name": "a", "tensorflow": "2.16.1"},
        driver="545.23.08",
        manifest=_manifest(
            **CUDNN_89,
            **CUDA_123,
            **{"NVIDIA-Linux-x86_64-545.23.08.run": {"component": "nvidia_driver", "version": "545.23.08"}},
        ),
    )
    assert result["ok"], result["messages"]
    assert any("63362" in w["cause"] for w in result["warnings"])


# --- bad stacks: exact messages -----------------------------------------------------------------


def test_python_outside_tensorflow_range():
    result = resolve({"name": "tf2.12", "tensorflow": "2.12"}, python="3.12.1")
    assert not result["ok"]
    assert result["messages"] == [
        "tf2.12: TensorFlow 2.12 supports Python 3.8-3.11; /usr/bin/python3 on this host is 3.12.1. "
        "Point the stack's python at a Python 3.8-3.11 interpreter, or pin TensorFlow 2.16-2.21 for Python 3.12."
    ]


def test_python_too_new_for_any_tensorflow():
    result = resolve({"name": "x", "tensorflow": "2.12"}, python="3.14.0")
    assert "no TensorFlow in the matrix supports Python 3.14" in result["messages"][0]


def test_python_unreadable():
    result = resolve({"name": "x", "tensorflow": "2.12", "python": "/opt/py/bin/python3"}, python="")
    assert result["messages"] == [
        "x: Could not read the version of /opt/py/bin/python3 on the host: no such file, or it does not run. "
        "Install Python 3.8-3.11 or point the stack's python at it."
    ]
    printed = resolve({"name": "x", "tensorflow": "2.12", "python": "/opt/py/bin/python3"}, python="Python 2.7.18")
    assert printed["messages"][0].startswith(
        "x: Could not read the version of /opt/py/bin/python3 on the host (it printed 'Python 2.7.18')."
    )


def test_unknown_tensorflow():
    result = resolve({"name": "x", "tensorflow": "1.15"})
    assert result["messages"] == [
        "x: TensorFlow 1.15 is not in the version matrix, whose newest release is 2.21.0. Pin one of TensorFlow "
        "2.4-2.21, or add a row with its sources to data/version_matrix.yml."
    ]
    assert result["stacks"] == []


@pytest.mark.parametrize("pin", ["2.12.2", "2.12.9", "2.12.10"])
def test_a_patch_release_above_the_series_newest_is_refused_naming_the_newest(pin):
    """2.12.9 is no release the matrix knows (its newest 2.12 is 2.12.1): refused in the checks, not later by a lock
    that cannot be made."""
    result = resolve({"name": "x", "tensorflow": pin})
    assert result["messages"] == [
        f"x: TensorFlow {pin} is not in the version matrix: the newest 2.12 release it knows is 2.12.1. Pin "
        '"2.12.1" (or "2.12", which takes 2.12.1). A newer release needs its row\'s latest raised in the version '
        "matrix (gpu_preflight_matrix_file) and its dependency lock made (make locks) first."
    ]
    assert result["stacks"] == [] and not result["ok"]


@pytest.mark.parametrize("pin", ["2.12", "2.12.0", "2.12.1"])
def test_the_releases_of_a_series_up_to_its_newest_resolve(pin):
    result = resolve({"name": "x", "tensorflow": pin})
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["tensorflow"]["version"] == ("2.12.1" if pin == "2.12" else pin)


def test_an_unquoted_series_read_as_a_number_is_told_to_quote_it():
    result = resolve({"name": "x", "tensorflow": 2.10})
    assert result["messages"] == [
        "x: TensorFlow 2.1 is not in the version matrix, whose newest release is 2.21.0. Pin one of TensorFlow 2.4-2.21 "
        'in quotes (tensorflow: "2.10"; unquoted, YAML reads 2.10 as 2.1), or add a row with its sources to '
        "data/version_matrix.yml."
    ]


def test_tf_2_15_with_cudnn_8_6_is_refused():
    result = resolve(
        {"name": "tf2.15", "tensorflow": "2.15", "cudnn": "8.6"},
        driver="535.104.05",
        manifest=_manifest(**CUDNN_86_12, **DRIVER_535),
    )
    assert result["messages"] == [
        "tf2.15: TensorFlow 2.15 was built with cuDNN 8.9; it refuses cuDNN 8.6 (it needs the same major "
        "and an equal or higher minor). Pin cuDNN 8.9 for TensorFlow 2.15."
    ]


def test_cudnn_other_major_is_refused():
    result = resolve(
        {"name": "a", "tensorflow": "2.17", "cudnn": "9.3"},
        driver="545.23.08",
        manifest=_manifest(**CUDNN_93, **CUDA_123),
    )
    assert any("built with cuDNN 8.9; it refuses cuDNN 9.3" in m for m in result["messages"])


def test_cudnn_pin_not_a_version():
    result = resolve({"name": "a", "tensorflow": "2.12", "cudnn": "eight"})
    # Only the pin's own problem: no archive is looked up for it.
    assert result["messages"] == [
        "a: The cudnn pin 'eight' is not a version like 8.6 or 8.6.0.163. Write it as X.Y, X.Y.Z or X.Y.Z.B, in "
        'quotes (cudnn: "8.6" for TensorFlow 2.12), or leave cudnn out to take it from the matrix.'
    ]


def test_cuda_12_2_with_driver_525_is_refused():
    result = resolve(
        {"name": "tf2.15", "tensorflow": "2.15"},
        driver="525.147.05",
        manifest=_manifest(
            **CUDNN_89,
            **{"NVIDIA-Linux-x86_64-525.147.05.run": {"component": "nvidia_driver", "version": "525.147.05"}},
        ),
    )
    assert result["messages"] == [
        "tf2.15: CUDA 12.2.2 needs driver >= 535.104.05; the pinned driver is 525.147.05. "
        "Raise nvidia_driver_version to >= 535.104.05 or pin TensorFlow 2.4-2.14."
    ]


def test_cuda_other_major_than_tensorflow_build():
    result = resolve({"name": "a", "tensorflow": "2.12", "cuda": "12.2"})
    assert (
        "a: TensorFlow 2.12 was built with CUDA 11.8; CUDA 12.2 is another major release, whose runtime "
        "library TensorFlow does not load. Pin CUDA 11.8 for TensorFlow 2.12, or leave cuda out to take it "
        "from the matrix."
    ) in result["messages"]


def test_a_cuda_pin_the_driver_cannot_run_points_back_at_the_built_cuda_not_older_tensorflow():
    result = resolve({"name": "a", "tensorflow": "2.12", "cuda": "12.2"})
    assert result["messages"][-1] == (
        "a: CUDA 12.2.2 needs driver >= 535.104.05; the pinned driver is 520.61.05. Raise nvidia_driver_version "
        "to >= 535.104.05 or pin CUDA 11.8, which TensorFlow 2.12 was built with and driver 520.61.05 runs."
    )


def test_the_built_cuda_is_suggested_only_where_the_release_it_resolves_to_runs_on_the_driver():
    # TensorFlow 2.15 was built with CUDA 12.2; the manifest's 12.2 is 12.2.2, which needs 535.104.05.
    manifest = _manifest(**CUDNN_89)
    messages = resolve({"name": "a", "tensorflow": "2.15", "cuda": "12.5"}, driver="535.104.05", manifest=manifest)
    assert messages["messages"][-1].endswith(
        "or pin CUDA 12.2, which TensorFlow 2.15 was built with and driver 535.104.05 runs."
    )
    older = resolve({"name": "a", "tensorflow": "2.15", "cuda": "12.5"}, driver="535.86.05", manifest=manifest)
    assert older["messages"][-1].endswith("Raise nvidia_driver_version to >= 555.42.06 or pin TensorFlow 2.4-2.14.")


def test_cuda_other_minor_warns_only():
    manifest = _manifest(
        **{
            "cuda_11.7.0_515.43.04_linux.run": {
                "component": "cuda_toolkit",
                "version": "11.7.0",
                "nvcc_version": "11.7.64",
            }
        }
    )
    result = resolve({"name": "a", "tensorflow": "2.12", "cuda": "11.7"}, manifest=manifest)
    assert result["ok"], result["messages"]
    assert result["warnings"][0]["cause"] == "TensorFlow 2.12 was tested with CUDA 11.8, not 11.7."


def test_cuda_runfile_missing_from_manifest():
    manifest = _manifest()
    del manifest["cuda_11.8.0_520.61.05_linux.run"]
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest)
    assert result["messages"] == [
        "a: No CUDA 11.8 runfile is in the artifact manifest. Add its cuda_11.8*_linux.run entry with a sha256 "
        "to an artifact manifest (gpu_preflight_manifest_overlays), or pin a CUDA release the manifest has: "
        "none of CUDA 11."
    ]


def test_a_cuda_release_nvidia_never_shipped_is_named_so_with_the_releases_of_its_major():
    result = resolve({"name": "a", "tensorflow": "2.12", "cuda": "11.9"})
    assert result["messages"] == [
        "a: CUDA 11.9 is not a CUDA release the version matrix knows, and the artifact manifest has no runfile "
        "for it. Pin a CUDA release the manifest has: 11.8.0."
    ]


def test_cudnn_archive_missing_for_cuda_major():
    manifest = _manifest(**DRIVER_535)
    del manifest["cudnn-linux-x86_64-8.9.7.29_cuda12-archive.tar.xz"]
    result = resolve({"name": "a", "tensorflow": "2.15"}, driver="535.104.05", manifest=manifest)
    assert result["messages"] == [
        "a: No cuDNN 8.9 archive for CUDA 12 is in the artifact manifest. Add its "
        "cudnn-linux-x86_64-8.9*_cuda12-archive.tar.xz (or, for older releases, cudnn-12.*-linux-x64-v8.9*.tgz) "
        "entry with a sha256 to an artifact manifest (gpu_preflight_manifest_overlays)."
    ]


def test_artifact_without_sha256_is_refused():
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=copy.deepcopy(REAL_MANIFEST))
    assert (
        "a: cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz has no sha256 in the artifact manifest. Add the "
        "sha256 of the file you downloaded to an overlay manifest (gpu_preflight_manifest_overlays); unpinned files "
        "are never installed." in result["messages"]
    )
    assert any(m.startswith("NVIDIA-Linux-x86_64-520.61.05.run has no sha256") for m in result["messages"])


def test_driver_runfile_missing_from_manifest():
    result = resolve({"name": "a", "tensorflow": "2.12"}, driver="530.30.02")
    assert result["messages"] == [
        "No NVIDIA-Linux-x86_64-530.30.02.run is in the artifact manifest. Add its entry with a sha256 to an "
        "artifact manifest (gpu_preflight_manifest_overlays), or pin a driver the manifest has."
    ]


@pytest.mark.parametrize("pin", ["latest", "535", "535.104.05-1", "R535"])
def test_driver_pin_must_be_an_exact_version(pin):
    result = resolve({"name": "a", "tensorflow": "2.12"}, driver=pin)
    assert result["messages"] == [
        f"nvidia_driver_version {pin!r} is not an exact driver version; a moving target such as 'latest' lets "
        'reruns drift. Pin the exact version, in quotes (nvidia_driver_version: "535.104.05").'
    ]


def test_compute_capability_below_wheel_floor():
    result = resolve(
        {"name": "tf2.17", "tensorflow": "2.17"},
        driver="545.23.08",
        manifest=_manifest(
            **CUDNN_89,
            **CUDA_123,
            **{"NVIDIA-Linux-x86_64-545.23.08.run": {"component": "nvidia_driver", "version": "545.23.08"}},
        ),
        gpus=[{"index": 0, "name": "NVIDIA GeForce GTX 980", "compute_capability": "5.2"}],
    )
    assert result["messages"] == [
        "tf2.17: GPU 0 (NVIDIA GeForce GTX 980) has compute capability 5.2; the TensorFlow 2.17 wheel needs >= 6.0. "
        "Pin an older TensorFlow that still ships code for it, or use newer GPUs."
    ]


def test_all_problems_are_reported_together():
    result = resolve({"name": "old", "tensorflow": "2.10"}, python="3.11.2")
    checks = [p["check"] for p in result["problems"]]
    assert checks == ["python", "cuda", "cudnn"]


def test_no_stacks():
    assert resolve([])["messages"] == [
        "No stack is pinned. Set gpu_preflight_stacks in the inventory (see inventories/gpu_hosts)."
    ]


def test_duplicate_stack_names():
    result = resolve([{"name": "a", "tensorflow": "2.12"}, {"name": "a", "tensorflow": "2.13", "venv": "/x"}])
    assert (
        "a: Stack name 'a' is used twice. Give every stack in gpu_preflight_stacks its own name." in result["messages"]
    )


def test_unknown_default_stack():
    result = resolve({"name": "a", "tensorflow": "2.12"}, default="b")
    assert result["messages"] == [
        "b: The default stack 'b' is not one of the stacks pinned (a). Set gpu_preflight_default_stack to one of the stack names."
    ]


def test_two_stacks_share_a_venv():
    result = resolve([{"name": "a", "tensorflow": "2.12"}, {"name": "b", "tensorflow": "2.12.0"}])
    assert result["messages"] == [
        "b: Stacks a and b share the virtual environment /opt/tensorflow/2.12. Set venv: for one of them "
        "(e.g. venv: /opt/tensorflow/b for b), so that each stack has its own."
    ]


def test_two_stacks_in_one_toolkit_get_the_highest_cudnn_of_one_major():
    result = resolve(
        [{"name": "a", "tensorflow": "2.12"}, {"name": "b", "tensorflow": "2.13", "cudnn": "8.7", "venv": "/srv/b"}],
        manifest=_manifest(**CUDNN_87),
    )
    assert result["ok"], result["messages"]
    assert [s["cudnn"]["version"] for s in result["stacks"]] == ["8.7.0.84", "8.7.0.84"]
    assert {s["cudnn"]["archive"]["file"] for s in result["stacks"]} == {
        "cudnn-linux-x86_64-8.7.0.84_cuda11-archive.tar.xz"
    }
    warning = next(w for w in result["warnings"] if w["check"] == "cudnn")
    assert warning["cause"].startswith(
        "Stacks a, b share /usr/local/cuda-11.8 and pin cuDNN 8.6.0.163, 8.7.0.84; each gets cuDNN 8.7.0.84"
    )


def test_two_stacks_in_one_toolkit_with_cudnn_of_two_majors_stop_with_the_conflict():
    result = resolve(
        [
            {"name": "a", "tensorflow": "2.17"},
            {"name": "b", "tensorflow": "2.18", "cuda": "12.3", "cudnn": "9.3", "venv": "/srv/b"},
        ],
        driver="545.23.08",
        manifest=_manifest(**CUDNN_89, **CUDNN_93, **CUDA_123),
        driver_install=False,
    )
    assert result["messages"] == [
        "b: Stacks a and b want cuDNN 8.9.7.29 and 9.3.0.75 in the same /usr/local/cuda-12.3; one toolkit tree "
        "holds one cuDNN, and cuDNN of another major cannot serve both. Pin one cuDNN major for the stacks on this "
        "CUDA release (the highest minor then serves both), or put one stack on another CUDA release, which gets "
        "its own tree."
    ]


def test_two_stacks_side_by_side_and_default():
    result = resolve(
        [{"name": "a", "tensorflow": "2.12"}, {"name": "b", "tensorflow": "2.15"}],
        driver="535.104.05",
        manifest=_manifest(**CUDNN_89, **DRIVER_535),
        default="b",
    )
    assert result["ok"], result["messages"]
    assert [(s["name"], s["default"], s["cuda_toolkit"]["root"]) for s in result["stacks"]] == [
        ("a", False, "/usr/local/cuda-11.8"),
        ("b", True, "/usr/local/cuda-12.2"),
    ]


def test_two_stacks_want_different_cuda_in_one_toolkit():
    result = resolve(
        [{"name": "a", "tensorflow": "2.15", "cuda": "12.2.0"}, {"name": "b", "tensorflow": "2.15", "venv": "/x"}],
        driver="535.104.05",
        manifest=_manifest(
            **CUDNN_89,
            **DRIVER_535,
            **{"cuda_12.2.0_535.54.03_linux.run": {"component": "cuda_toolkit", "version": "12.2.0"}},
        ),
    )
    assert result["messages"] == [
        "b: Stacks a and b want CUDA 12.2.0 and 12.2.2 in the same /usr/local/cuda-12.2. "
        "Pin the same CUDA release in both stacks."
    ]


def test_cuda_release_without_min_driver_row():
    manifest = _manifest(**{"cuda_11.8.1_x_linux.run": {"component": "cuda_toolkit", "version": "11.8.1"}})
    result = resolve({"name": "a", "tensorflow": "2.12", "cuda": "11.8.1"}, manifest=manifest)
    assert result["messages"] == [
        "a: CUDA 11.8.1 has no minimum-driver row in the version matrix. "
        "Add it to data/version_matrix.yml from NVIDIA's CUDA release notes."
    ]
    assert result["stacks"][0]["cuda_toolkit"]["min_driver"] is None


# --- bad inputs refused before anything resolves: names, version forms, paths ---------------------


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("tf 2.12", "tf2.12"),
        ("a/b", "a-b"),
        (".hidden", "hidden"),
        ("-x", "x"),
        ("_x", "x"),
        ("tf:2.12", "tf-2.12"),
        ("a" * 65, "a" * 64),
    ],
)
def test_unsafe_stack_name_is_refused_with_a_suggestion(name, suggestion):
    result = resolve({"name": name, "tensorflow": "2.12"})
    assert not result["ok"]
    assert result["messages"] == [
        f"{name}: Stack name {name!r} is not safe in file names, config files and JUnit class names. Use up to 64 "
        f"letters, digits, '.', '_' and '-', starting with a letter or digit (e.g. {suggestion!r})."
    ]


def test_stack_name_with_a_space():
    result = resolve({"name": "tf 2.12", "tensorflow": "2.12"})
    assert result["problems"] == [
        {
            "stack": "tf 2.12",
            "check": "stacks",
            "cause": "Stack name 'tf 2.12' is not safe in file names, config files and JUnit class names.",
            "fix": "Use up to 64 letters, digits, '.', '_' and '-', starting with a letter or digit (e.g. 'tf2.12').",
        }
    ]


def test_blank_stack_name_is_labelled_by_position_and_gets_a_name_from_tensorflow():
    result = resolve([{"name": "a", "tensorflow": "2.12"}, {"name": "  ", "tensorflow": "2.13", "venv": "/srv/b"}])
    assert result["messages"] == [
        "stack #2: Stack name '  ' is not safe in file names, config files and JUnit class names. Use up to 64 "
        "letters, digits, '.', '_' and '-', starting with a letter or digit (e.g. 'tf2.13')."
    ]


def test_empty_stack_name_is_only_a_missing_name():
    result = resolve({"name": "", "tensorflow": "2.12"})
    assert result["messages"] == [
        "stack #1: The stack has no 'name'. Give every item of gpu_preflight_stacks a 'name'."
    ]


# Ansible passes its own subclasses of the YAML types (tagged values since ansible-core 2.19).
TaggedFloat = type("TaggedFloat", (float,), {})


@pytest.mark.parametrize(
    ("name", "kind"),
    [(2.12, "a number"), (TaggedFloat(2.12), "a number"), (True, "a yes/no value"), (["a"], "a list or dict")],
)
def test_stack_name_that_is_not_text(name, kind):
    result = resolve({"name": name, "tensorflow": "2.12"})
    assert result["messages"] == [
        f"{name}: Stack name {name!r} is {kind}, not text. Quote the name, and start it with a letter so that "
        'YAML keeps it text (e.g. name: "tf2.12").'
    ]


@pytest.mark.parametrize("name", ["tf2.12", "TF_2.12-cpu", "2.12", "a" * 64])
def test_safe_stack_names_resolve(name):
    result = resolve({"name": name, "tensorflow": "2.12"})
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["name"] == name


def test_tensorflow_pin_not_a_version():
    result = resolve({"name": "a", "tensorflow": "2.x"})
    assert result["messages"] == [
        "a: The tensorflow pin '2.x' is not a version like 2.12 or 2.12.1. Write it as X.Y or X.Y.Z, in quotes "
        '(tensorflow: "2.12"); the version matrix has TensorFlow 2.4-2.21.'
    ]
    assert result["problems"][0]["check"] == "tensorflow"
    assert result["stacks"] == []


@pytest.mark.parametrize("pin", ["2.12.x", "2.12.1.5", "2", " 2.12", "2.12 ", "v2.12", "2.12.1rc0", "２.12"])
def test_tensorflow_pins_of_other_forms_are_refused(pin):
    # 2.12.x and 2.12.1.5 used to pass (their X.Y is in the matrix) and fail in pip later.
    result = resolve({"name": "a", "tensorflow": pin})
    assert result["messages"] == [
        f"a: The tensorflow pin {pin!r} is not a version like 2.12 or 2.12.1. Write it as X.Y or X.Y.Z, in quotes "
        '(tensorflow: "2.12"); the version matrix has TensorFlow 2.4-2.21.'
    ]


def test_cuda_pin_not_a_version():
    # It used to crash the filter (int('eleven') when picking the cuDNN archive).
    result = resolve({"name": "a", "tensorflow": "2.12", "cuda": "eleven"})
    assert result["messages"] == [
        "a: The cuda pin 'eleven' is not a version like 11.8 or 11.8.0. Write it as X.Y or X.Y.Z, in quotes "
        '(cuda: "11.8" for TensorFlow 2.12), or leave cuda out to take it from the matrix.'
    ]
    stack = result["stacks"][0]
    assert (stack["cuda_toolkit"], stack["cudnn"], result["warnings"]) == (None, None, [])


@pytest.mark.parametrize("pin", ["11", "11.x", "11..8", "11.8.0.1", "11.8/../../etc"])
def test_cuda_pins_of_other_forms_are_refused(pin):
    result = resolve({"name": "a", "tensorflow": "2.12", "cuda": pin})
    assert [p["check"] for p in result["problems"]] == ["cuda"]
    assert result["problems"][0]["cause"] == f"The cuda pin {pin!r} is not a version like 11.8 or 11.8.0."


@pytest.mark.parametrize("pin", ["8..6", "8", " 8.6", "8_6.1", "8.6.0.163.1", "8.6-1"])
def test_cudnn_pins_of_other_forms_are_refused(pin):
    result = resolve({"name": "a", "tensorflow": "2.12", "cudnn": pin})
    assert result["messages"] == [
        f"a: The cudnn pin {pin!r} is not a version like 8.6 or 8.6.0.163. Write it as X.Y, X.Y.Z or X.Y.Z.B, in "
        'quotes (cudnn: "8.6" for TensorFlow 2.12), or leave cudnn out to take it from the matrix.'
    ]


@pytest.mark.parametrize(
    "pins",
    [
        {"tensorflow": "2.12"},
        {"tensorflow": "2.12.0"},
        {"tensorflow": "2.12.1", "cuda": "11.8", "cudnn": "8.6"},
        {"tensorflow": "2.12", "cuda": "11.8.0", "cudnn": "8.6.0"},
        {"tensorflow": "2.12", "cudnn": "8.6.0.163"},
        {"tensorflow": 2.12, "cuda": 11.8, "cudnn": 8.6},  # unquoted in YAML: read as numbers
    ],
)
def test_well_formed_version_pins_still_resolve(pins):
    result = resolve(dict({"name": "a"}, **pins))
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["cuda_toolkit"]["root"] == "/usr/local/cuda-11.8"


def test_relative_venv_is_refused():
    result = resolve({"name": "tf2.12", "tensorflow": "2.12", "venv": "venvs/tf2.12"})
    assert result["messages"] == [
        "tf2.12: venv 'venvs/tf2.12' is not an absolute path. Set venv: to an absolute path of its own "
        "(e.g. /opt/tensorflow/tf2.12), or leave it out for /opt/tensorflow/X.Y."
    ]


def test_venv_that_is_a_shared_folder_is_refused():
    result = resolve({"name": "tf2.12", "tensorflow": "2.12", "venv": "/usr/"})
    assert result["messages"] == [
        "tf2.12: venv '/usr/' is /usr, a folder the system or other software shares; python -m venv would put its "
        "bin/, lib/ and pyvenv.cfg among the files there. Set venv: to a folder of its own "
        "(e.g. /opt/tensorflow/tf2.12), or leave it out for /opt/tensorflow/X.Y."
    ]


@pytest.mark.parametrize(
    "venv", ["/", "/usr", "/etc", "/opt", "/var", "/home", "/usr/local", "/opt/tensorflow", "/opt/tensorflow/", "//"]
)
def test_every_shared_folder_is_refused_as_a_venv(venv):
    result = resolve({"name": "a", "tensorflow": "2.12", "venv": venv})
    assert [p["check"] for p in result["problems"]] == ["venv"]
    assert "a folder the system or other software shares" in result["problems"][0]["cause"]


@pytest.mark.parametrize(
    "venv", ["/usr/local/cuda", "/usr/local/cuda/", "/usr/local/cuda/tf", "/usr/local/cuda-11.8/tf"]
)
def test_venv_inside_a_cuda_toolkit_tree_is_refused(venv):
    result = resolve({"name": "a", "tensorflow": "2.12", "venv": venv})
    assert result["messages"] == [
        f"a: venv {venv!r} is inside /usr/local/cuda or /usr/local/cuda-X.Y, the CUDA toolkit trees the CUDA "
        "installer owns. Set venv: to a folder of its own (e.g. /opt/tensorflow/a), or leave it out for "
        "/opt/tensorflow/X.Y."
    ]


@pytest.mark.parametrize("venv", ["/srv/tf", "/opt/tf", "/opt/tensorflow/a", "/home/ml/venvs/tf2.12", "/usr/local/tf"])
def test_venvs_of_their_own_resolve(venv):
    result = resolve({"name": "a", "tensorflow": "2.12", "venv": venv})
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["venv"] == venv


def test_relative_python_is_refused():
    result = resolve({"name": "a", "tensorflow": "2.12", "python": "python3.11"})
    assert result["messages"] == [
        "a: python 'python3.11' is not an absolute path; which interpreter runs would depend on the PATH on the host. "
        "Set python: to the interpreter's full path (e.g. /usr/bin/python3.11), or leave it out for "
        "gpu_preflight_python."
    ]


def test_absolute_python_resolves():
    result = resolve({"name": "a", "tensorflow": "2.12", "python": "/usr/bin/python3.11"})
    assert result["ok"], result["messages"]
    assert result["stacks"][0]["python"]["path"] == "/usr/bin/python3.11"


def test_explicit_venv_equal_to_another_stacks_default_is_refused():
    result = resolve(
        [{"name": "a", "tensorflow": "2.12"}, {"name": "b", "tensorflow": "2.13", "venv": "/opt/tensorflow/2.12/"}]
    )
    assert result["messages"] == [
        "b: Stacks a and b share the virtual environment /opt/tensorflow/2.12. Set venv: for one of them "
        "(e.g. venv: /opt/tensorflow/b for b), so that each stack has its own."
    ]


def test_two_stacks_with_their_own_venvs_resolve():
    result = resolve([{"name": "a", "tensorflow": "2.12"}, {"name": "b", "tensorflow": "2.12.0", "venv": "/srv/b"}])
    assert result["ok"], result["messages"]
    assert [s["venv"] for s in result["stacks"]] == ["/opt/tensorflow/2.12", "/srv/b"]


def test_bad_inputs_of_one_stack_are_reported_together():
    result = resolve({"name": "tf 2.12", "tensorflow": "2.12", "cuda": "11.x", "venv": "tf", "python": "python3"})
    assert [p["check"] for p in result["problems"]] == ["stacks", "venv", "python", "cuda"]
    assert {p["stack"] for p in result["problems"]} == {"tf 2.12"}


def test_problem_stack_is_text():
    assert gpu_stack._problem(2.12, "duplicate_name", name=2.12)["stack"] == "2.12"


# --- helpers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "text"), [(">=3.8,<3.12", "3.8-3.11"), (">=3.10,<3.14", "3.10-3.13")])
def test_spec_text(spec, text):
    assert gpu_stack._spec_text(spec) == text


def test_versions_compare_as_versions_not_strings():
    # "535.104.05" < "535.54.03" as strings, but not as versions.
    assert gpu_stack._v("535.104.05") > gpu_stack._v("535.54.03")
    result = resolve(
        {"name": "a", "tensorflow": "2.15"},
        driver="535.54.03",
        manifest=_manifest(
            **CUDNN_89, **{"NVIDIA-Linux-x86_64-535.54.03.run": {"component": "nvidia_driver", "version": "535.54.03"}}
        ),
    )
    assert any("needs driver >= 535.104.05" in m for m in result["messages"])


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("#define CUDNN_MAJOR 8\n#define CUDNN_MINOR 6\n#define CUDNN_PATCHLEVEL 0\n", "8.6.0"),
        (
            "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 3\n#define CUDNN_PATCHLEVEL 0\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000)",
            "9.3.0",
        ),
        ("#define CUDNN_MAJOR 8\n", ""),
        ("", ""),
    ],
)
def test_cudnn_header_version(text, version):
    assert gpu_stack.cudnn_header_version(text) == version


def test_unknown_stack_key_is_named():
    result = resolve({"name": "x", "tensorflow": "2.12", "pakage": "tensorflow-cpu"})
    assert result["messages"] == [
        "x: Unknown key 'pakage' in gpu_preflight_stacks. Use only name, tensorflow, cuda, cudnn, cuda_source, "
        "python, package, venv, state (check the spelling)."
    ]


def test_stack_without_tensorflow_is_named():
    result = resolve([{"name": "x"}])
    assert (
        "x: The stack has no 'tensorflow'. Give every item of gpu_preflight_stacks a 'tensorflow'."
        in result["messages"]
    )


def test_problem_records_come_from_the_message_table():
    assert gpu_stack._problem("a", "missing_key", key="name") == {
        "stack": "a",
        "check": "stacks",
        "cause": "The stack has no 'name'.",
        "fix": "Give every item of gpu_preflight_stacks a 'name'.",
    }
    shared = gpu_stack._problem("-", "sha256_missing", check="driver", file="f.run", manifest="/m.yml")
    assert (shared["check"], shared["cause"]) == ("driver", "f.run has no sha256 in /m.yml.")


def test_problem_with_a_missing_field_raises():
    with pytest.raises(KeyError):
        gpu_stack._problem("a", "missing_key")


def test_every_message_in_the_table_is_used():
    source = Path(gpu_stack.__file__).read_text()
    unused = [key for key in gpu_stack.MESSAGES if source.count(f'"{key}"') < 2]
    assert unused == []


def test_every_message_but_the_shared_one_names_its_check():
    assert [k for k, m in gpu_stack.MESSAGES.items() if not m.check] == ["sha256_missing", "sha256_not_a_digest"]


@pytest.mark.parametrize(
    ("problem", "line"),
    [
        ({"stack": "-", "cause": "No stack is pinned.", "fix": "Set it."}, "No stack is pinned. Set it."),
        ({"stack": "a", "cause": "TensorFlow 2.16.1: note", "fix": ""}, "a: TensorFlow 2.16.1: note"),
    ],
)
def test_message_line(problem, line):
    assert gpu_stack._message(problem) == line


@pytest.mark.parametrize(
    ("built", "pinned", "accepted"),
    [
        ("8.6", [8, 6], True),
        ("8.6", [8, 6, 0, 163], True),
        ("8.6", [8, 9, 7, 29], True),
        ("8.9", [8, 6], False),
        ("8.9", [9, 3], False),
        ("9.3", [8, 9], False),
    ],
)
def test_cudnn_accepts_same_major_and_equal_or_higher_minor(built, pinned, accepted):
    assert gpu_stack.cudnn_accepts(built, pinned) is accepted


@pytest.mark.parametrize(("text", "parts"), [("8.6.0.163", [8, 6, 0, 163]), ("8", [8]), ("eight", []), ("8.x", [])])
def test_int_parts(text, parts):
    assert gpu_stack._int_parts(text) == parts


def test_no_function_longer_than_60_lines():
    tree = ast.parse(Path(gpu_stack.__file__).read_text())
    lengths = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert {name: n for name, n in lengths.items() if n > 60} == {}


# --- cuDNN archive layouts (NVIDIA cuDNN Installation Guide, "Tar File Installation") ------------

LEGACY_86 = {"cudnn-11.8-linux-x64-v8.6.0.163.tgz": {"component": "cudnn", "version": "8.6.0.163", "cuda_major": 11}}


def _only_cudnn(**entries: dict) -> dict:
    """The test manifest with its CUDA 11 cuDNN archives replaced by ``entries``."""
    manifest = _manifest(**entries)
    for name in [n for n, e in manifest.items() if e["component"] == "cudnn" and e["cuda_major"] == 11]:
        if name not in entries:
            del manifest[name]
    return manifest


def test_current_archive_layout_is_its_own_top_folder_with_lib():
    stack = resolve({"name": "a", "tensorflow": "2.12"})["stacks"][0]
    top = "cudnn-linux-x86_64-8.6.0.163_cuda11-archive"
    assert {k: stack["cudnn"]["layout"][k] for k in ("name", "include", "lib")} == {
        "name": "archive",
        "include": f"{top}/include",
        "lib": f"{top}/lib",
    }


def test_older_tgz_archive_layout_is_cuda_include_and_lib64():
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=_only_cudnn(**LEGACY_86))
    assert result["ok"], result["messages"]
    cudnn = result["stacks"][0]["cudnn"]
    assert cudnn["archive"]["file"] == "cudnn-11.8-linux-x64-v8.6.0.163.tgz"
    assert (cudnn["version"], cudnn["major"]) == ("8.6.0.163", 8)
    assert {k: cudnn["layout"][k] for k in ("name", "include", "lib")} == {
        "name": "legacy",
        "include": "cuda/include",
        "lib": "cuda/lib64",
    }


@pytest.mark.parametrize(
    "name",
    [
        "cudnn-11.2-linux-x64-v8.1.1.33.tgz",
        "cudnn-10.0-linux-x64-v7.4.1.5.tgz",
        "cudnn-linux-x86_64-8.3.2.44_cuda11.5-archive.tar.xz",
        "cudnn-linux-x86_64-9.3.0.75_cuda12-archive.tar.xz",
    ],
)
def test_nvidia_archive_names_have_a_layout(name):
    assert gpu_stack.cudnn_layout(name) is not None


@pytest.mark.parametrize(
    "name",
    [
        "cudnn-8.6.0.163.tar.gz",
        "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.zip",
        "cudnn-linux-sbsa-8.6.0.163_cuda11-archive.tar.xz",
        "cudnn-11.2-linux-x64-v8.1.1.33.tgz.part",
    ],
)
def test_other_archive_names_have_none(name):
    assert gpu_stack.cudnn_layout(name) is None


def test_unknown_archive_name_is_refused_naming_the_manifest_and_the_forms():
    entry = {"component": "cudnn", "version": "8.6.0.163", "cuda_major": 11, "manifest": "/srv/my-artifacts.yml"}
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=_only_cudnn(**{"cudnn-8.6.0.163.tar.gz": entry}))
    assert not result["ok"]
    assert result["messages"] == [
        "a: cudnn-8.6.0.163.tar.gz (in /srv/my-artifacts.yml) is not named like one of NVIDIA's cuDNN tar "
        "archives, so where its headers and libraries are inside is unknown. Use NVIDIA's archive under its own "
        "name: cudnn-linux-x86_64-<version>_cuda<M>-archive.tar.xz (unpacks to <name>/include/ and <name>/lib/) "
        "or cudnn-<CUDA X.Y>-linux-x64-v<version>.tgz (unpacks to cuda/include/ and cuda/lib64/)."
    ]


PLACEHOLDER = "replace-with-the-sha256-of-your-file"  # manifests/gpu_hosts-artifacts-local.yml's


def test_the_example_overlays_placeholder_is_named_as_a_placeholder_with_what_to_fill_in_and_where():
    manifest = _manifest()
    entry = manifest["cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"]
    entry.update(sha256=PLACEHOLDER, manifest="/srv/fleet/manifests/gpu_hosts-artifacts-local.yml")
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest)
    assert result["messages"] == [
        f"a: cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz has the placeholder '{PLACEHOLDER}' as its sha256 in "
        "/srv/fleet/manifests/gpu_hosts-artifacts-local.yml, not a sha256 (64 hexadecimal digits). Put the sha256 of "
        "the file you downloaded from NVIDIA and checked (`sha256sum cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz` "
        "prints it) in its place there; unpinned files are never installed."
    ]
    assert result["problems"][0]["check"] == "cudnn"


def test_a_digest_cut_short_is_named_with_its_length_and_the_drivers_too():
    manifest = _manifest()
    manifest["NVIDIA-Linux-x86_64-520.61.05.run"].update(sha256="ab" * 20, manifest="/m.yml")
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest)
    assert result["messages"][0].startswith(
        f"NVIDIA-Linux-x86_64-520.61.05.run has '{'ab' * 20}' (40 characters) as its sha256 in /m.yml, not a sha256"
    )
    assert result["problems"][0]["check"] == "driver"


def test_a_sha256_in_capitals_is_a_sha256():
    manifest = _manifest()
    manifest["NVIDIA-Linux-x86_64-520.61.05.run"]["sha256"] = "AB" * 32
    assert resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest)["ok"]


def test_missing_sha256_names_the_overlay_the_entry_came_from():
    manifest = _manifest()
    entry = manifest["cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"]
    entry.update(sha256=None, manifest="/home/ops/overlay.yml")
    result = resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest)
    assert result["messages"][0].startswith(
        "a: cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz has no sha256 in /home/ops/overlay.yml. "
    )
    assert result["stacks"][0]["cudnn"]["archive"]["manifest"] == "/home/ops/overlay.yml"


@pytest.mark.parametrize(
    ("component", "series", "record", "field", "theirs"),
    [
        ("cudnn", "8.6", "cudnn", "archive", "cudnn-11.8-linux-x64-v8.6.0.163.tgz"),
        ("cuda_toolkit", "11.8", "cuda_toolkit", "runfile", "cuda_11.8.0_mirror_linux.run"),
    ],
)
def test_an_overlay_entry_wins_over_the_built_in_entry_of_the_same_release(component, series, record, field, theirs):
    """gpu_preflight merges the overlays after the built-in manifests: of two entries of one release the
    later wins (before, the tie kept the built-in entry and the overlay's file was never used)."""
    manifest = _manifest()
    name, built_in = next(
        (n, e) for n, e in manifest.items() if e["component"] == component and str(e["version"]).startswith(series)
    )
    manifest[theirs] = dict(built_in, sha256="ab" * 32, manifest="/srv/overlay.yml")
    picked = resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest)["stacks"][0][record][field]
    assert (picked["file"], picked["manifest"]) == (theirs, "/srv/overlay.yml")
    manifest[name] = manifest.pop(name)  # the built-in entry last: it wins
    assert resolve({"name": "a", "tensorflow": "2.12"}, manifest=manifest)["stacks"][0][record][field]["file"] == name


# --- stacks with state: absent (removal) -----------------------------------------------------------

KEEP = {"name": "tf2.12", "tensorflow": "2.12", "cuda": "11.8", "cudnn": "8.6"}


@pytest.mark.parametrize(
    ("old", "venv", "root", "remove_toolkit"),
    [
        ({"tensorflow": "2.11", "cuda": "11.2", "cudnn": "8.1"}, "/opt/tensorflow/2.11", "/usr/local/cuda-11.2", True),
        ({"tensorflow": "2.12", "cuda": "11.8", "venv": "/srv/tf-old"}, "/srv/tf-old", "/usr/local/cuda-11.8", False),
        # A series the matrix dropped: removed by its own cuda and venv pins.
        ({"tensorflow": "2.3", "cuda": "10.1", "venv": "/srv/tf-2.3"}, "/srv/tf-2.3", "/usr/local/cuda-10.1", True),
    ],
    ids=["own-toolkit", "toolkit-in-use-stays", "series-left-the-matrix"],
)
def test_an_absent_stack_is_not_installed_and_lists_what_goes(old, venv, root, remove_toolkit):
    result = resolve([KEEP, dict(old, name="old", state="absent")])
    assert result["ok"], result["messages"]
    assert [s["name"] for s in result["stacks"]] == ["tf2.12"]
    assert result["absent"] == [{"name": "old", "venv": venv, "cuda_root": root, "remove_toolkit": remove_toolkit}]


def test_an_absent_stack_needs_no_artifacts_and_takes_its_cuda_from_the_matrix():
    old = {"name": "tf2.11", "tensorflow": "2.11", "state": "absent"}  # nothing of 2.11 in the manifest
    result = resolve([KEEP, old], manifest=_manifest())
    assert result["ok"], result["messages"]
    assert result["absent"][0]["cuda_root"] == "/usr/local/cuda-" + MATRIX["tensorflow"]["2.11"]["cuda"]


@pytest.mark.parametrize(
    ("pins", "default", "message"),
    [
        (
            [dict(KEEP, state="absent"), {"name": "b", "tensorflow": "2.12", "venv": "/srv/b"}],
            "tf2.12",
            "tf2.12: The default stack 'tf2.12' has state: absent;",
        ),
        ([dict(KEEP, state="absent")], "", "Every stack has state: absent;"),
        (
            [KEEP, {"name": "gone", "tensorflow": "2.12", "state": "absent"}],
            "",
            "gone: Stack 'gone' has state: absent, but its venv /opt/tensorflow/2.12 is, holds or sits inside",
        ),
        (
            [KEEP, {"name": "gone", "tensorflow": "2.12", "venv": "/opt/tensorflow", "state": "absent"}],
            "",
            "gone: Stack 'gone' has state: absent, but its venv /opt/tensorflow is, holds or sits inside",
        ),
        (
            [KEEP, {"name": "gone", "tensorflow": "2.11", "cuda": "11.x", "state": "absent"}],
            "",
            "gone: The cuda pin '11.x' is not a version",
        ),
        (
            [KEEP, {"name": "gone", "tensorflow": "2.3", "state": "absent"}],
            "",
            "gone: TensorFlow 2.3 is not in the version matrix, whose newest release is 2.21.0.",
        ),
        ([dict(KEEP, state="removed")], "", "tf2.12: state 'removed' is neither present nor absent."),
    ],
    ids=[
        "default-absent",
        "all-absent",
        "venv-in-use",
        "venv-holds-one",
        "cuda-malformed",
        "tf-unknown",
        "state-misspelt",
    ],
)
def test_a_removal_that_would_break_a_host_stops_with_cause_and_fix(pins, default, message):
    result = resolve(pins, default=default)
    assert not result["ok"]
    assert any(text.startswith(message) for text in result["messages"]), result["messages"]


def test_the_current_default_cannot_go_in_the_run_that_switches_away_from_it():
    other = {"name": "new", "tensorflow": "2.12", "cuda": "11.8", "cudnn": "8.6", "venv": "/srv/new"}
    result = resolve([dict(KEEP, state="absent"), other], default="new", current_default="tf2.12")
    assert not result["ok"]
    assert result["messages"][0].startswith(
        "tf2.12: Stack 'tf2.12' has state: absent, but it is this host's default now (/etc/tf-stacks/default);"
    )
    assert "Run once with 'tf2.12' present" in result["messages"][0]
    # Once the host serves the new default, the old one can go.
    assert resolve([dict(KEEP, state="absent"), other], default="new", current_default="new")["ok"]


# --- which stack the default pointers serve --------------------------------------------------

SECOND = {"name": "tf2.12-b", "tensorflow": "2.12", "cuda": "11.8", "cudnn": "8.6", "venv": "/srv/b"}


def _served(current, default="tf2.12-b"):
    result = resolve([KEEP, SECOND], default=default)
    assert result["ok"], result["messages"]
    return gpu_stack.serve_default(result["stacks"], current)


@pytest.mark.parametrize(
    ("current", "served", "pending"),
    [
        ("tf2.12", "tf2.12", "tf2.12-b"),  # a new default waits for its verification
        ("tf2.12-b", "tf2.12-b", None),  # already the host's default
        ("", "tf2.12-b", None),  # a new host: nothing to keep
        ("gone", "tf2.12-b", None),  # the host's default is no present stack: nothing to keep
    ],
    ids=["switch-waits", "converged", "new-host", "current-not-declared"],
)
def test_the_pointers_serve_the_current_default_until_the_declared_one_verified(current, served, pending):
    result = _served(current)
    assert result["default"]["name"] == served
    assert [s["name"] for s in result["stacks"] if s["default"]] == [served]
    assert [s["name"] for s in result["stacks"] if s["declared_default"]] == ["tf2.12-b"]
    assert (result["pending"] or {}).get("name") == pending


def test_serving_the_verified_stack_ends_the_switch_and_serving_back_restores_it():
    waiting = _served("tf2.12")
    switched = gpu_stack.serve_default(waiting["stacks"], waiting["pending"]["name"])
    assert (switched["default"]["name"], switched["pending"]) == ("tf2.12-b", None)
    back = gpu_stack.serve_default(switched["stacks"], "tf2.12")
    assert (back["default"]["name"], back["pending"]["name"]) == ("tf2.12", "tf2.12-b")
    assert gpu_stack.serve_default([], "tf2.12") == {"stacks": [], "default": None, "pending": None}


def test_a_held_back_declared_default_leaves_nothing_pending():
    waiting = _served("tf2.12")
    held = [s for s in waiting["stacks"] if s["name"] != "tf2.12-b"]
    result = gpu_stack.serve_default(held, "tf2.12")
    assert (result["default"]["name"], result["pending"]) == ("tf2.12", None)


def test_a_role_that_runs_before_the_stacks_are_resolved_names_the_cause_and_the_fix():
    message = gpu_stack.FilterModule().filters()["gpu_stacks_unresolved"]("cudnn")
    assert message.startswith("cudnn reads the pinned stacks")
    assert "gpu_preflight_resolved_stacks" in message
    assert (
        "playbooks/tasks/stacks.yml" in message and "gpu_fleet.tf_hosts.gpu_stacks" in message and "`always`" in message
    )
    assert "pre_tasks" in message and "apply: {tags: [always]}" in message


def test_the_stacks_a_role_reads_come_back_or_stop_it_with_the_fix():
    required = gpu_stack.FilterModule().filters()["gpu_stacks_required"]
    stacks = [{"name": "tf2.15"}]
    assert required(stacks, "tf_venv") is stacks
    assert required([], "cudnn") == []
    # The roles that install toolkit trees read only the stacks that have one (not those whose CUDA is wheels).
    runfile = {"name": "r", "cuda_toolkit": {"source": "runfile", "root": "/usr/local/cuda-11.8"}}
    wheels = {"name": "w", "cuda_toolkit": {"source": "wheels", "root": None}}
    assert required([runfile, wheels], "cudnn") == required([runfile, wheels], "cuda_toolkit") == [runfile]
    assert required([runfile, wheels], "gpu_env") == [runfile, wheels]
    with pytest.raises(AnsibleFilterError) as raised:
        required(None, "cudnn")
    assert str(raised.value) == gpu_stack.stacks_unresolved("cudnn")


HOST_PINS = {
    "python_versions": {"/usr/bin/python3.11": "3.11.2"},
    "default_python": "/usr/bin/python3.11",
    "driver_version": "535.104.05",
    "driver_install": True,
    "driver_method": "package",
    "current_default": "tf2.15",
}
LOADED = {"gpu_facts": {"driver_version": "525.147.05", "gpus": [{"index": 0, "compute_capability": "8.0"}]}}


def test_stacks_host_checks_against_the_pinned_driver_when_the_run_installs_it():
    host = gpu_stack.stacks_host(LOADED, HOST_PINS)
    # The pins as given (the pinned driver 535, not the loaded 525), and the gathered GPUs.
    assert host == dict(HOST_PINS, gpus=[{"index": 0, "compute_capability": "8.0"}])
    assert host["driver_version"] == "535.104.05"


def test_stacks_host_checks_against_the_loaded_driver_otherwise():
    host = gpu_stack.stacks_host(LOADED, dict(HOST_PINS, driver_install="no"))
    assert host["driver_version"] == "525.147.05" and host["driver_install"] is False


def test_stacks_host_without_gpu_facts_has_no_driver_and_no_gpus():
    host = gpu_stack.stacks_host({}, dict(HOST_PINS, driver_install=False, current_default=None))
    assert (host["driver_version"], host["gpus"], host["current_default"]) == ("", [], "")
    unloaded = gpu_stack.stacks_host({"gpu_facts": {"driver_version": None}}, dict(HOST_PINS, driver_install=False))
    assert unloaded["driver_version"] == ""


def test_stacks_host_is_the_filter_gpu_stacks_host():
    pins = dict(HOST_PINS, driver_install=False)
    assert gpu_stack.FilterModule().filters()["gpu_stacks_host"](LOADED, pins)["driver_version"] == "525.147.05"


def test_hosts_to_resolve_leaves_out_the_hosts_an_earlier_play_resolved():
    hostvars = {"a": {"gpu_preflight_resolved_stacks": []}, "b": {"other": 1}}
    assert gpu_stack.stacks_hosts_to_resolve(["a", "b", "c"], hostvars) == ["b", "c"]
    assert gpu_stack.stacks_hosts_to_resolve(["b", "a"], {}) == ["b", "a"]  # the run's first play: no hostvars yet


def test_a_phase_playbook_resolves_the_stacks_for_the_hosts_no_earlier_play_did(tmp_path):
    """The hosts of playbooks/stacks.yml, templated by Ansible: every host as the run's first play (no hostvars
    yet), then only the hosts that an earlier play did not publish the model for (site.yml: none)."""
    (play,) = yaml.safe_load((ROOT / "playbooks/stacks.yml").read_text())
    said = {"name": "Say", "ansible.builtin.debug": {"msg": "{{ inventory_hostname }} resolves"}}
    publish = {"name": "Publish", "ansible.builtin.set_fact": {"gpu_preflight_resolved_stacks": []}}
    plays = [
        {"name": "first", "hosts": play["hosts"], "gather_facts": False, "tasks": [said]},
        {"name": "preflight", "hosts": "a", "gather_facts": False, "tasks": [publish]},
        {"name": "phase", "hosts": play["hosts"], "gather_facts": False, "tasks": [said]},
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable} for name in "ab"}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"gpu_hosts": {"hosts": hosts}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "play.yml", "-i", "hosts.yml"]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    first, phase = run.stdout.split("PLAY [first]", 1)[1].split("PLAY [phase]", 1)
    assert "a resolves" in first and "b resolves" in first
    assert "b resolves" in phase and "a resolves" not in phase


# --- cuda_source: wheels (tensorflow[and-cuda]) -------------------------------------------------------

DRIVER_55X = "555.42.06"
WHEELS = {"name": "wheels", "tensorflow": "2.18", "cuda_source": "wheels"}


def _wheels(pins=WHEELS, driver="535.104.05", python="3.11.2", **host):
    return resolve(pins, python=python, driver=driver, manifest=_manifest(**DRIVER_535), **host)


def test_a_wheels_stack_needs_no_runfile_nor_archive_and_names_the_wheels_folders():
    # On driver 535 the CUDA 12.5 runfile stops (it needs 555.42.06); the wheels' runtime runs (minor version
    # compatibility of CUDA 12: 525.60.13).
    assert [p["check"] for p in _wheels(dict(WHEELS, cuda_source="runfile"))["problems"]] == ["driver"]
    result = _wheels()
    assert result["ok"], result["messages"]
    stack = result["stacks"][0]
    site = "/opt/tensorflow/2.18/lib/python3.11/site-packages"
    assert stack["tensorflow"]["package"] == "tensorflow[and-cuda]"
    assert gpu_stack.tf_requirement(stack["tensorflow"]) == "tensorflow[and-cuda]==2.18.1"
    cuda, cudnn = stack["cuda_toolkit"], stack["cudnn"]
    assert (cuda["source"], cuda["version"], cuda["root"], cuda["runfile"]) == ("wheels", "12.5", None, None)
    assert (cuda["min_driver"], cuda["cudart_soname"], cuda["site_packages"]) == ("525.60.13", "libcudart.so.12", site)
    assert f"{site}/nvidia/cuda_runtime/lib" in cuda["library_dirs"]
    assert f"{site}/nvidia/cudnn/lib" in cuda["library_dirs"]
    assert (cudnn["source"], cudnn["version"], cudnn["major"], cudnn["archive"]) == ("wheels", "9.3", 9, None)
    assert gpu_stack.tree_root(stack) is None


def test_runfile_stacks_say_where_their_cuda_comes_from():
    stack = resolve({"name": "a", "tensorflow": "2.12"})["stacks"][0]
    assert (stack["cuda_toolkit"]["source"], stack["cudnn"]["source"]) == ("runfile", "runfile")
    assert gpu_stack.tree_root(stack) == "/usr/local/cuda-11.8"


@pytest.mark.parametrize(("release", "instead"), [("2.15.0", "2.15.1"), ("2.16.1", "2.16.2")])
def test_wheels_refuse_the_known_bad_releases_with_the_fix(release, instead):
    result = _wheels(dict(WHEELS, tensorflow=release))
    refused = [p for p in result["problems"] if p["check"] == "tensorflow"]
    assert len(refused) == 1, result["messages"]
    assert release in refused[0]["cause"] and f"Pin TensorFlow {instead}" in refused[0]["fix"]
    # A runfile stack of the same release only gets the known_bad warning.
    runfile = resolve(dict(WHEELS, tensorflow=release, cuda_source="runfile"), driver=DRIVER_55X)
    assert not [p for p in runfile["problems"] if p["check"] == "tensorflow"]


def test_wheels_refuse_a_tensorflow_without_the_extra():
    result = _wheels(dict(WHEELS, tensorflow="2.12"))
    assert [p["check"] for p in result["problems"]] == ["cuda"]
    assert "from 2.15 on" in result["messages"][0] and "leave cuda_source out" in result["messages"][0]


def test_wheels_need_the_cuda_major_floor_of_the_driver():
    result = _wheels(driver="520.61.05")
    assert [p["check"] for p in result["problems"]] == ["driver"], result["messages"]
    assert "525.60.13" in result["problems"][0]["cause"] and "520.61.05" in result["problems"][0]["cause"]
    assert "pin TensorFlow 2.4-2.14 with cuda_source: runfile" in result["problems"][0]["fix"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"package": "tensorflow-cpu"}, "tensorflow-cpu"),
        ({"cuda": "12.3"}, "cuda 12.3"),
        ({"cudnn": "8.9"}, "cudnn 8.9"),
    ],
)
def test_wheels_refuse_pins_the_extra_does_not_install(extra, named):
    result = _wheels(dict(WHEELS, **extra))
    assert len(result["problems"]) == 1 and named in result["messages"][0], result["messages"]
    assert _wheels(dict(WHEELS, cuda="12.5", cudnn="9.3", package="tensorflow"))["ok"]


def test_wheels_stacks_share_no_tree_with_each_other_or_a_runfile_stack():
    pins = [
        {"name": "tf2.12", "tensorflow": "2.12"},
        dict(WHEELS, name="w2.18"),
        dict(WHEELS, name="w2.17", tensorflow="2.17"),
    ]
    result = _wheels(pins, default="tf2.12")
    assert result["ok"], result["messages"]
    assert [gpu_stack.tree_root(s) for s in result["stacks"]] == ["/usr/local/cuda-11.8", None, None]


def test_an_absent_wheels_stack_removes_its_venv_and_no_toolkit():
    pins = [{"name": "tf2.12", "tensorflow": "2.12"}, dict(WHEELS, state="absent")]
    result = _wheels(pins, default="tf2.12")
    assert result["absent"] == [
        {"name": "wheels", "venv": "/opt/tensorflow/2.18", "cuda_root": "", "remove_toolkit": False}
    ]


def test_an_unknown_cuda_source_is_named():
    result = _wheels(dict(WHEELS, cuda_source="conda"))
    assert any("cuda_source 'conda' is neither runfile nor wheels" in m for m in result["messages"])


def test_a_runfile_stack_refuses_the_and_cuda_extra_and_a_wheels_stack_takes_it():
    runfile = _wheels(dict(WHEELS, cuda_source="runfile", package="tensorflow[and-cuda]"), driver=DRIVER_55X)
    assert any("brings NVIDIA's CUDA wheels into the venv" in m for m in runfile["messages"]), runfile["messages"]
    assert _wheels(dict(WHEELS, package="tensorflow[and-cuda]"))["ok"]


@pytest.mark.parametrize(("key", "pin"), [("cuda", "12.5.1"), ("cudnn", "9.3.1")])
def test_wheels_take_only_the_series_the_lock_decides_the_release(key, pin):
    result = _wheels(dict(WHEELS, **{key: pin}))
    assert [p["check"] for p in result["problems"]] == ["cuda"] and "exact release" in result["messages"][0]


def test_a_matrix_without_the_wheels_section_is_named_not_a_crash():
    matrix = {k: v for k, v in MATRIX.items() if k != "cuda_wheels"}
    pins = [WHEELS]
    host = {
        "python_versions": {DEFAULT_PYTHON: "3.11.2"},
        "default_python": DEFAULT_PYTHON,
        "driver_version": "535.104.05",
        "driver_install": True,
    }
    result = gpu_stack.resolve_stacks(pins, matrix, _manifest(**DRIVER_535), host)
    assert any("has no cuda_wheels section" in m for m in result["messages"]), result["messages"]


def test_an_unknown_cuda_source_is_the_only_problem_named():
    result = _wheels(dict(WHEELS, cuda_source="Wheels"))
    assert [p["check"] for p in result["problems"]] == ["cuda"], result["messages"]
