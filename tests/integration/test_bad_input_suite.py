"""The bad-input suite: one run of the real site.yml, many bad inventories, one healthy host.

Every case is an inventory host of its own with one bad input. All of them point at the same fresh
sandbox container (``ansible_host``), except the cases that need a host of another kind (an
unsupported OS). One more container is a healthy host with the sandbox's own settings, started from
the ``converged`` snapshot (tests/snapshots.py: a fresh converge is Molecule default's and the
snapshot build's), run through every play of the same run and verified. Each case must:

1. fail in the first play (preflight), before any change: a listing of /usr/local, /opt and /etc
   of its container, taken before the run, is unchanged after it;
2. say the cause and the fix (the case's expected phrases, all of them);
3. leave the other hosts alone: the healthy host passes every play and verifies in the same run.

The module prints a table of cases and results. Cases that need state on the host (a folder that
is not a venv, a small tmpfs, a non-root user) set it up before the listing is taken; the bad files
on the controller (artifacts and an overlay manifest that pins them, a wheelhouse with an altered
wheel) are made in a temporary folder before the run.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_lock import lock_hashes, normalize_name
from ansible_run import latest_report
from sandbox_hosts import ROOT, STANDINS, link_or_copy, site, start_container, start_converged, stop_container
from wheelhouse import WHEELHOUSE

TF = {"name": "tf2.12", "tensorflow": "2.12", "cuda": "11.8", "cudnn": "8.6", "package": "tensorflow-cpu"}
WHEELS = {"name": "tf2.18w", "tensorflow": "2.18", "cuda_source": "wheels", "venv": "/opt/tensorflow/2.18-wheels"}
PREFLIGHT_PLAY = "Check the pinned stacks, the hosts and the artifacts before any change"
LISTED = ["/usr/local", "/opt", "/etc"]
SMALL_TMPFS = "/var/tmp/small"
# Artifacts that only the cases pinning them need (an overlay manifest adds them for every host).
FOLDER = "cudnn-linux-x86_64-8.7.0.84_cuda11-archive.tar.xz"  # a folder under an archive's name
PAGE = "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"  # an error page, pinned by its own sha256
ABSENT = "cudnn-linux-x86_64-8.8.1.3_cuda11-archive.tar.xz"  # not in the controller folder
SHORT = "NVIDIA-Linux-x86_64-525.147.05.run"  # a download cut short
TAMPERED = "NVIDIA-Linux-x86_64-530.30.02.run"  # one byte more than the pinned file
UNNAMED = "cudnn-8.9.2.26-custom-build.zip"  # named like none of NVIDIA's cuDNN archive layouts
# A wheel of the tf2.12 lock (six==1.17.0) under its own name, with one byte more than the session's
# wheelhouse holds (some bytes of its own where that wheelhouse was not downloaded): not the file the
# lock pins. The message lists the lock's digests of six (first 16 hex digits each).
WHEEL = "six-1.17.0-py2.py3-none-any.whl"
WHEEL_HASHES = ", ".join(
    sorted(d[:16] for d in lock_hashes((ROOT / "data/locks/tensorflow-2.12.1-py3.11.txt").read_text())["six"][1])
)
ALTERED_WHEEL = ((WHEELHOUSE / WHEEL).read_bytes() if (WHEELHOUSE / WHEEL).is_file() else b"not a wheel") + b"\n"
OUTPUT = ROOT / "build" / "test-output" / "bad-input-suite.log"
PROXY_SECRET = "inventory-S3cret"  # the password of a malformed proxy URL, never shown
ERROR_PAGE = b"<!DOCTYPE html><html><body>403 Forbidden</body></html>\n"
EXAMPLE_OVERLAY = ROOT / "manifests/gpu_hosts-artifacts-local.yml"  # the example fleet's, with its placeholders


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stacks(*items: dict, **default: str) -> dict:
    """Inventory variables for a list of stacks (each a change of the sandbox's tf2.12)."""
    out: dict = {"gpu_preflight_stacks": [{**TF, **item} for item in items]}
    if default:
        out["gpu_preflight_default_stack"] = default["default"]
    return out


@dataclass(frozen=True)
class Case:
    """One bad input: inventory variables, phrases the failure must contain, the container it uses."""

    id: str
    vars: dict
    expect: tuple[str, ...]
    container: str = "main"
    extra: dict = field(default_factory=dict)
    forbid: tuple[str, ...] = ()  # text that no output of the run may hold (a password)


CASES = [
    Case(
        "default_stack_unknown",
        {"gpu_preflight_default_stack": "tf9"},
        ("The default stack 'tf9' is not one of", "Set gpu_preflight_default_stack to one of the stack names"),
    ),
    Case(
        "tensorflow_pin_malformed",
        stacks({"tensorflow": "2.x"}),
        ("The tensorflow pin '2.x' is not a version like 2.12", "Write it as X.Y or X.Y.Z, in quotes"),
    ),
    Case(
        "tensorflow_unknown",
        stacks({"tensorflow": "2.99"}),
        ("TensorFlow 2.99 is not in the version matrix", "add a row with its sources"),
    ),
    Case(
        "cuda_pin_malformed",
        stacks({"cuda": "eleven"}),
        ("The cuda pin 'eleven' is not a version like 11.8", "Write it as X.Y or X.Y.Z"),
    ),
    Case(
        "cuda_other_major",
        stacks({"cuda": "12.2"}),
        ("CUDA 12.2 is another major release", "Pin CUDA 11.8 for TensorFlow 2.12"),
    ),
    Case(
        "cudnn_pin_malformed",
        stacks({"cudnn": "8.x"}),
        ("The cudnn pin '8.x' is not a version like 8.6", "Write it as X.Y, X.Y.Z or X.Y.Z.B"),
    ),
    Case("cudnn_too_old", stacks({"cudnn": "8.1"}), ("it refuses cuDNN 8.1", "Pin cuDNN 8.6 for TensorFlow 2.12")),
    Case(
        "duplicate_stacks",
        stacks({}, {}),
        ("Stack name 'tf2.12' is used twice", "Give every stack in gpu_preflight_stacks its own name"),
    ),
    Case(
        "name_with_space",
        stacks({"name": "tf 2.12"}, default="tf 2.12"),
        ("Stack name 'tf 2.12' is not safe in file names", "letters, digits"),
    ),
    Case(
        "name_with_slash",
        stacks({"name": "a/b"}, default="a/b"),
        ("Stack name 'a/b' is not safe in file names", "letters, digits"),
    ),
    Case("name_is_a_number", stacks({"name": 2.12}), ("Stack name 2.12 is a number, not text", "Quote the name")),
    Case(
        "stack_key_misspelt",
        {"gpu_preflight_stacks": [{"name": "tf2.12", "tensorflw": "2.12"}]},
        ("Unknown key", "tensorflw", "check the spelling"),
    ),
    Case(
        "stack_without_tensorflow",
        {"gpu_preflight_stacks": [{"name": "tf2.12"}]},
        ("The stack has no 'tensorflow'", "Give every item of gpu_preflight_stacks a 'tensorflow'"),
    ),
    Case(
        "no_stacks", {"gpu_preflight_stacks": []}, ("No stack is pinned", "Set gpu_preflight_stacks in the inventory")
    ),
    Case(
        "venv_relative",
        stacks({"venv": "envs/tf"}),
        ("venv 'envs/tf' is not an absolute path", "Set venv: to an absolute path of its own"),
    ),
    Case(
        "venv_system_folder",
        stacks({"venv": "/usr"}),
        ("a folder the system or other software shares", "Set venv: to a folder of its own"),
    ),
    Case(
        "venv_inside_cuda",
        stacks({"venv": "/usr/local/cuda-11.8/venv"}),
        ("the CUDA toolkit trees the CUDA installer owns", "Set venv: to a folder of its own"),
    ),
    Case(
        "venv_shared",
        stacks({}, {"name": "tf2.12b", "venv": "/opt/tensorflow/2.12"}),
        ("share the virtual environment", "so that each stack has its own"),
    ),
    Case(
        "venv_not_a_venv",
        stacks({"venv": "/opt/datasets"}),
        (
            "/opt/datasets (venv of stack tf2.12) exists and is not a virtual environment",
            "Move what is there elsewhere",
        ),
    ),
    Case(
        "python_relative",
        stacks({"python": "python3"}),
        ("python 'python3' is not an absolute path", "Set python: to the interpreter's full path"),
    ),
    Case(
        "python_missing",
        stacks({"python": "/usr/bin/python3.99"}),
        ("Could not read the version of /usr/bin/python3.99 on the host", "Install Python"),
    ),
    Case(
        "expected_gpus_zero",
        {"gpu_verify_expected_gpu_count": 0},
        ("gpu_verify_expected_gpu_count is 0", "a whole number of GPUs of at least 1"),
    ),
    Case(
        "expected_gpus_negative",
        {"gpu_verify_expected_gpu_count": -2},
        ("gpu_verify_expected_gpu_count is -2", "a whole number of GPUs of at least 1"),
    ),
    Case(
        "expected_gpus_not_set",
        {"gpu_verify_expected_gpu_count": None},
        ("gpu_verify_expected_gpu_count is not set", "a whole number of GPUs of at least 1", "Fix it in the inventory"),
    ),
    Case(
        "more_gpus_expected_than_seen",
        {"gpu_verify_expected_gpu_count": 4},
        ("4 GPUs expected, 2 seen", "bus IDs seen: 0000:07:00.0, 0000:0f:00.0", "correct the expected count"),
    ),
    Case(
        "skip_checks_misspelt",
        {"gpu_preflight_skip_checks": ["dsk"]},
        ("gpu_preflight_skip_checks names an unknown check 'dsk'", "Use the names"),
    ),
    # A string, as -e gpu_preflight_skip_checks=... gives it: one name per comma, not one per letter.
    Case(
        "skip_checks_string_misspelt",
        {"gpu_preflight_skip_checks": "disk,nuveau"},
        ("gpu_preflight_skip_checks names an unknown check 'nuveau' (did you mean 'nouveau'?)", "Use the names"),
    ),
    Case(
        "driver_not_in_manifest",
        {"nvidia_driver_version": "535.104.05"},
        ("NVIDIA-Linux-x86_64-535.104.05.run has no sha256", "unpinned files are never installed"),
    ),
    Case(
        "driver_method_misspelt",
        {"nvidia_driver_method": "packages"},
        ("nvidia_driver_method", "auto, package, runfile"),
    ),
    Case(
        "driver_package_key_missing",
        {"nvidia_driver_method": "package"},
        ("needs its signing key and none is configured", "set nvidia_driver_package_repository_key"),
    ),
    Case(
        "driver_package_key_not_a_file",
        {"nvidia_driver_method": "package", "nvidia_driver_package_repository_key": "/nonexistent/3bf863cc.pub"},
        ("the key file /nonexistent/3bf863cc.pub is not a file on the controller", "key_download_allowed: true"),
    ),
    Case(
        "driver_version_latest",
        {"nvidia_driver_version": "latest"},
        ("nvidia_driver_version 'latest' is not an exact driver version", "535.104.05"),
    ),
    Case(
        "manifest_overlay_missing",
        {"gpu_preflight_manifest_overlays": ["/nonexistent/overlay.yml"]},
        ("/nonexistent/overlay.yml does not exist on the controller", "gpu_preflight_manifest_overlays"),
    ),
    Case(
        "artifact_is_a_folder",
        stacks({"tensorflow": "2.14", "cudnn": "8.7"}),
        (f"/{FOLDER} is a folder, not the file {FOLDER}", "Nothing was installed"),
    ),
    Case(
        "archive_is_not_a_tar",
        stacks({"tensorflow": "2.14", "cudnn": "8.9"}),
        (f"{PAGE} is not an xz-compressed tar archive: it starts with '<!DOCTYPE html>", "(an error page?)"),
    ),
    Case(
        "artifact_missing",
        stacks({"tensorflow": "2.14", "cudnn": "8.8"}),
        (f"{ABSENT} is not in", "on the controller. Put NVIDIA's file there under this exact name"),
    ),
    Case(
        "cudnn_archive_unnamed",
        stacks({"tensorflow": "2.14", "cudnn": "8.9.2"}),
        (
            f"{UNNAMED} (in ",
            "/bad-artifacts.yml) is not named like one of NVIDIA's cuDNN tar archives",
            "Use NVIDIA's archive under its own name",
        ),
    ),
    Case(
        "runfile_cut_short",
        {"nvidia_driver_version": "525.147.05"},
        (f"{SHORT} has 1000 bytes; the manifest says", "The download was cut short"),
    ),
    Case(
        "runfile_checksum_mismatch",
        {"nvidia_driver_version": "530.30.02"},
        (f"{TAMPERED} has sha256", "download it again and compare"),
    ),
    Case(
        "tensorflow_needs_older_python",
        stacks({"tensorflow": "2.10", "cuda": "11.2", "cudnn": "8.1"}),
        ("TensorFlow 2.10 supports Python 3.7-3.10", "Point the stack's python at a Python 3.7-3.10 interpreter"),
    ),
    Case(
        "pip_index_unreachable",
        {"tf_venv_pip_index_url": "http://127.0.0.1:9/simple/"},
        ("127.0.0.1:9", "cannot be reached from the host", "tf_venv_pip_index_url"),
    ),
    Case(
        "pip_index_without_scheme",
        {"tf_venv_pip_index_url": f"fleet:{PROXY_SECRET}@pypi.example.com/simple"},
        ("The pip index URL pypi.example.com/simple (tf_venv_pip_index_url", "no http:// or https:// scheme"),
        forbid=(PROXY_SECRET,),
    ),
    Case(
        "proxy_malformed",
        {"gpu_preflight_proxy": {"url": f"ftp://fleet:{PROXY_SECRET}@proxy.example.com:3128"}},
        (
            "nvidia_driver_proxy (by default gpu_preflight_proxy) url 'ftp://fleet:****@proxy.example.com:3128'",
            "its scheme is ftp, not http or https",
            "or leave its url empty for no proxy",
        ),
        forbid=(PROXY_SECRET,),
    ),
    Case(
        "lock_missing",
        {"tf_venv_lock_dir": "/nonexistent/locks"},
        (
            "Stack tf2.12 has no dependency lock: /nonexistent/locks/tensorflow-2.12.1-py3.11.txt does not exist",
            "make locks",
            "tf_venv_require_lock: false",
        ),
    ),
    Case(
        "extra_package_not_in_the_lock",
        {"tf_venv_extra_packages": ["pandas==2.2.3"]},
        (
            "tf_venv_extra_packages pandas==2.2.3 not in stack tf2.12's lock",
            "--extra pandas==2.2.3",
            "tf_venv_lock_dir",
        ),
    ),
    Case(
        "ca_bundle_missing",
        {"tf_venv_pip_ca_bundle": "/nonexistent/corp-ca.pem"},
        ("/nonexistent/corp-ca.pem does not exist on the controller", "tf_venv_pip_ca_bundle"),
    ),
    # The folder _artifacts makes beside the artifacts.
    Case(
        "wheelhouse_wheel_altered",
        {"tf_venv_wheelhouse": "{{ gpu_artifacts_controller_dir | dirname }}/wheelhouse"},
        (
            f"{WHEEL} is not the file the lock pins: its sha256 is {_sha256(ALTERED_WHEEL)[:16]}",
            f"the lock lists {WHEEL_HASHES} for six==1.17.0",
            "(tf_venv_wheelhouse) does not hold the wheels of the lock tensorflow-2.12.1-py3.11.txt",
            "Nothing was pushed to the host",
        ),
    ),
    Case(
        "jupyter_kernel_dir_relative",
        {
            "tf_venv_jupyter_kernel_dir": "relative/kernels",
            "gpu_verify_jupyter_kernel_dir": "/usr/local/share/jupyter/kernels",
        },
        ("tf_venv_jupyter_kernel_dir is relative/kernels", "an absolute path", "/usr/local/share/jupyter/kernels"),
    ),
    Case(
        "verify_kernel_dir_relative",
        {"gpu_verify_jupyter_kernel_dir": "kernels"},
        ("gpu_verify_jupyter_kernel_dir is kernels", "an absolute folder on the host"),
    ),
    Case(
        "health_interval_malformed",
        {"gpu_health_interval": "every 5 minutes"},
        ("gpu_health_interval is every 5 minutes", "a systemd time span of at least a minute, such as 5min"),
    ),
    Case(
        "health_state_dir_relative",
        {"gpu_health_state_dir": "gpu-health"},
        ("gpu_health_state_dir is gpu-health", "an absolute path on the host"),
    ),
    Case(
        "health_dcgm_level_unknown",
        {"gpu_health_dcgm_diag_level": 7},
        ("gpu_health_dcgm_diag_level is 7", "a dcgmi diag level from 1 to 4"),
    ),
    Case(
        "health_textfile_dir_relative",
        {"gpu_health_textfile_dir": "node-exporter"},
        ("gpu_health_textfile_dir is node-exporter", "--collector.textfile.directory"),
    ),
    Case(
        "cuda_tmpdir_too_small",
        {"cuda_toolkit_tmpdir": SMALL_TMPFS},
        (
            f"{SMALL_TMPFS} (CUDA installer scratch) is on {SMALL_TMPFS}",
            "point cuda_toolkit_tmpdir (CUDA installer scratch) at a larger disk",
        ),
    ),
    Case(
        "cuda_install_timeout_too_short",
        {"cuda_toolkit_install_timeout": 30},
        ("cuda_toolkit_install_timeout is 30", "at least 60", "3600 (the default)"),
    ),
    Case(
        "pip_install_timeout_zero",
        {"tf_venv_pip_install_timeout": 0},
        ("tf_venv_pip_install_timeout is 0", "at least 60", "3600 (the default)"),
    ),
    Case(
        "gpu_env_relative_path",
        {"gpu_env_profile_path": "gpu-env.sh"},
        ("gpu_env_profile_path is gpu-env.sh", "must be an absolute path on the host", "/etc/profile.d/gpu-env.sh"),
    ),
    Case(
        "pip_network_timeout_negative",
        {"tf_venv_pip_timeout": -1},
        ("tf_venv_pip_timeout is -1", "a whole number above 0", "120 (the default)"),
    ),
    Case(
        "cpu_replicas_negative",
        {"gpu_verify_cpu_replicas": -2},
        ("gpu_verify_cpu_replicas is -2", "0 fits on the GPUs", "Fix it in the inventory"),
    ),
    Case(
        "report_keep_zero",
        {"gpu_verify_report_keep": 0},
        ("gpu_verify_report_keep is 0", "at least 1", "Fix it in the inventory"),
    ),
    Case(
        "run_lock_max_age_negative",
        {"gpu_preflight_run_lock_max_age": -1},
        ("gpu_preflight_run_lock_max_age is -1", "at least 1", "Fix it in the inventory"),
    ),
    Case(
        "cuda_link_over_a_folder",
        {"cuda_toolkit_default_symlink": "/usr/lib"},
        ("cuda_toolkit_default_symlink /usr/lib", "not a symbolic link", "/usr/local/cuda"),
    ),
    Case(
        "not_root", {"ansible_user": "deploy", "ansible_become": False}, ("Tasks run as deploy", "not root", "become")
    ),
    Case("unsupported_os", {}, ("Debian 11 is not a supported OS", "Use a supported release"), container="os"),
    # Ansible ignores a variable no task reads: the default driver would be installed, rc 0.
    Case(
        "role_variable_misspelt",
        {"nvidia_driver_versoin": "535.104.05"},
        ("nvidia_driver_versoin is no option of the role nvidia_driver", "(did you mean nvidia_driver_version?)"),
    ),
    Case(
        "tensorflow_patch_above_matrix",
        stacks({"tensorflow": "2.12.9"}),
        (
            "TensorFlow 2.12.9 is not in the version matrix: the newest 2.12 release it knows is 2.12.1",
            "which takes 2.12.1",
        ),
    ),
    # A copy of the example fleet as it comes: its overlay pins the driver and cuDNN with a placeholder.
    Case(
        "example_overlay_placeholder",
        {"gpu_preflight_manifest_overlays": [str(STANDINS / "artifacts.yml"), str(EXAMPLE_OVERLAY)]},
        (
            "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz has the placeholder "
            f"'replace-with-the-sha256-of-your-file' as its sha256 in {EXAMPLE_OVERLAY}",
            "`sha256sum cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz` prints it",
        ),
    ),
    Case(
        "pci_folder_missing",
        {"gpu_preflight_pci_devices_path": "/nonexistent/pci-devices"},
        (
            "/nonexistent/pci-devices does not exist (gpu_preflight_pci_devices_path)",
            "Set gpu_preflight_pci_devices_path to /sys/bus/pci/devices",
        ),
    ),
    # The altered wheel's case after its old advice ("remove the others"): the lock's wheels without six.
    Case(
        "wheelhouse_incomplete_after_advice",
        {"tf_venv_wheelhouse": "{{ gpu_artifacts_controller_dir | dirname }}/wheelhouse-incomplete"},
        (
            "(tf_venv_wheelhouse) does not hold the wheels of the lock tensorflow-2.12.1-py3.11.txt for CPython 3.11",
            "no locked wheel of six==1.17.0",
            "pip download --dest",
            "Nothing was pushed to the host",
        ),
    ),
    Case(
        "health_kernel_log_relative",
        {"gpu_health_kernel_log": "kern.log"},
        ("gpu_health_kernel_log is kern.log", "the absolute path of a kernel log file", "Fix it in the inventory"),
    ),
    # A MIG profile of the A100 40GB on the sandbox's A100 80GB GPUs (known by their PCI IDs before any driver).
    Case(
        "mig_profile_unknown",
        {"gpu_mig_enabled": True, "gpu_mig_layout": [{"gpus": "all", "profiles": ["3g.20gb"]}]},
        ("GPU 0 (PCI device 10de:20b2) has no MIG profile 3g.20gb", "3g.40gb", "Fix gpu_mig_layout"),
    ),
    # A CDI specification folder that is a file on the host (every container has /etc/hostname).
    Case(
        "cdi_dir_is_a_file",
        {"gpu_containers_enabled": True, "gpu_containers_cdi_dir": "/etc/hostname"},
        ("gpu_containers_cdi_dir /etc/hostname is a file", "not a folder of CDI", "Move the file away"),
    ),
    # A GRES type with a space: slurm.conf reads a GRES as gpu:<type>:<count>, one word.
    Case(
        "slurm_gres_type_with_a_space",
        {"gpu_slurm_enabled": True, "gpu_slurm_gres_type": "a100 80gb"},
        (
            "gpu_slurm_gres_type is 'a100 80gb': a GRES type is one word of slurm.conf",
            "Fix: set gpu_slurm_gres_type to a name such as 'a100'",
        ),
    ),
    # A stack of TensorFlow's own install path (CUDA from NVIDIA's wheels) on a release whose wheels were not found.
    Case(
        "wheels_release_refused",
        {"gpu_preflight_stacks": [TF, {**WHEELS, "tensorflow": "2.16.1"}]},
        ("TensorFlow 2.16.1 with cuda_source: wheels", "tensorflow/tensorflow#63362", "Pin TensorFlow 2.16.2"),
    ),
    # The sandbox's driver 520.61.05 is below CUDA 12's minor-version-compatibility floor.
    Case(
        "wheels_driver_below_the_floor",
        {"gpu_preflight_stacks": [TF, WHEELS]},
        ("CUDA 12 wheels of TensorFlow 2.18 (CUDA 12.5) need driver >= 525.60.13", "Raise nvidia_driver_version"),
    ),
    # Debian's own driver packages on a host whose sources give bookworm only main (the sandbox image's).
    Case(
        "distribution_sources_without_non_free",
        {"nvidia_driver_method": "distribution", "nvidia_driver_version": "535.261.03"},
        (
            "The apt sources of bad-distribution_sources_without_non_free give bookworm the components main",
            "need contrib non-free non-free-firmware as well",
            "set nvidia_driver_distribution_sources_manage: true",
        ),
    ),
]


def _container_setup(name: str, kind: str) -> None:
    script = {
        # A folder of data where a stack's venv should go, and a user without sudo.
        "main": "mkdir -p /opt/datasets && echo x > /opt/datasets/train.csv && useradd -m deploy",
        # An older Debian: the OS facts come from /etc/os-release.
        "os": "sed -i -e 's/^VERSION_ID=.*/VERSION_ID=\"11\"/' -e 's/bookworm/bullseye/g' /etc/os-release "
        "&& rm -f /etc/debian_version && echo 11.9 > /etc/debian_version",
    }[kind]
    subprocess.run(["podman", "exec", name, "sh", "-c", script], check=True, capture_output=True)


def _artifacts(tmp: Path) -> tuple[Path, Path]:
    """The stand-ins plus the cases' bad files, and an overlay manifest that pins them; beside them, a
    wheelhouse with the altered wheel."""
    wheelhouse = tmp / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / WHEEL).write_bytes(ALTERED_WHEEL)
    _incomplete_wheelhouse(tmp / "wheelhouse-incomplete")
    folder = tmp / "artifacts"
    # Hard links where the file system allows (NVIDIA's real files are gigabytes; nothing here writes to them).
    shutil.copytree(STANDINS, folder, symlinks=True, copy_function=link_or_copy)
    driver = (folder / "NVIDIA-Linux-x86_64-520.61.05.run").read_bytes()
    (folder / FOLDER).mkdir()
    (folder / PAGE).write_bytes(ERROR_PAGE)
    (folder / SHORT).write_bytes(driver[:1000])
    (folder / TAMPERED).write_bytes(driver + b"\n")
    cudnn = {"component": "cudnn", "cuda_major": 11, "url": None}
    runfile = {"component": "nvidia_driver", "sha256": _sha256(driver), "size_bytes": len(driver), "url": None}
    entries = {
        FOLDER: {**cudnn, "version": "8.7.0.84", "sha256": "0" * 64},
        PAGE: {**cudnn, "version": "8.9.7.29", "sha256": _sha256(ERROR_PAGE), "size_bytes": len(ERROR_PAGE)},
        ABSENT: {**cudnn, "version": "8.8.1.3", "sha256": "1" * 64},
        UNNAMED: {**cudnn, "version": "8.9.2.26", "sha256": "2" * 64},
        SHORT: {**runfile, "version": "525.147.05"},
        TAMPERED: {**runfile, "version": "530.30.02"},
    }
    overlay = tmp / "bad-artifacts.yml"
    overlay.write_text(yaml.safe_dump({"artifacts": entries}))
    return folder, overlay


def _incomplete_wheelhouse(folder: Path) -> None:
    """The session wheelhouse's wheels of the sandbox's lock, all but six's (the altered wheel removed)."""
    folder.mkdir()
    pins = lock_hashes((ROOT / "data/locks/tensorflow-2.12.1-py3.11.txt").read_text())
    for wheel in WHEELHOUSE.glob("*.whl") if WHEELHOUSE.is_dir() else []:
        name, version = wheel.name.split("-")[:2]
        if name.lower() != "six" and pins.get(normalize_name(name), ("",))[0] == version:
            link_or_copy(str(wheel), str(folder / wheel.name))


def _listing(name: str) -> list[str]:
    """Every path under the listed folders with its type, size and modification time."""
    out = subprocess.run(
        ["podman", "exec", name, "find", *LISTED, "-xdev", "-printf", r"%p %y %s %T@\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(out.splitlines())


def _failures(output: str) -> dict[str, list[tuple[str, str]]]:
    """host -> [(play, failure text)] from the default callback's output."""
    found: dict[str, list[tuple[str, str]]] = {}
    play, current = "", None
    for line in output.splitlines():
        if line.startswith("PLAY ["):
            play = line[6 : line.rfind("]")]
        head = re.match(r"^(fatal|failed): \[([^\]]+)\]", line)
        if head:
            current = found.setdefault(head.group(2), [])
            current.append((play, line))
        elif re.match(r"^(TASK|PLAY|RUNNING|ok:|changed:|skipping:|included:|\[ERROR\]|\[WARNING\])", line):
            current = None
        elif current is not None:
            current[-1] = (current[-1][0], current[-1][1] + "\n" + line)
    return found


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """Start the containers, write the inventory, take the listings, run site.yml once."""
    tmp = tmp_path_factory.mktemp("bad-input-suite")
    containers = {
        "main": start_container("gpu-badsuite", f"--tmpfs={SMALL_TMPFS}:rw,exec,size=4k"),
        "os": start_container("gpu-badsuite-os"),
        "healthy": start_converged("gpu-badsuite-ok"),
    }
    try:
        for kind in ("main", "os"):
            _container_setup(containers[kind], kind)
        folder, overlay = _artifacts(tmp)
        # Host variables, so that a case's own setting of these wins.
        artifacts = {
            "gpu_artifacts_controller_dir": str(folder),
            "gpu_preflight_manifest_overlays": [str(STANDINS / "artifacts.yml"), str(overlay)],
        }
        hosts = {
            f"bad-{case.id}": {"ansible_host": containers[case.container], **artifacts, **case.vars} for case in CASES
        }
        hosts[containers["healthy"]] = artifacts
        inventory = tmp / "inventory"
        inventory.mkdir()
        (inventory / "group_vars").symlink_to(ROOT / "inventories/sandbox/group_vars")
        group = {"gpu_hosts": {"hosts": hosts, "vars": {"ansible_connection": "podman_pipelined"}}}
        (inventory / "hosts.yml").write_text(yaml.safe_dump(group))
        before = {kind: _listing(name) for kind, name in containers.items() if kind != "healthy"}
        report = tmp / "reports"
        out = site(inventory, "-e", f"gpu_verify_report_dir={report}", timeout=2400)
        # Kept beside the build outputs: pytest's own temporary folders are rotated away.
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(out.stdout + out.stderr)
        after = {kind: _listing(name) for kind, name in containers.items() if kind != "healthy"}
        yield {
            "out": out,
            "before": before,
            "after": after,
            "healthy": containers["healthy"],
            "report": report,
            "output_file": OUTPUT,
        }
    finally:
        for name in containers.values():
            stop_container(name)


def _verdict(case: Case, run: dict) -> list[str]:
    """What is wrong with one case's outcome; empty when it passed."""
    failures = _failures(run["out"].stdout).get(f"bad-{case.id}", [])
    wrong = []
    if not failures:
        wrong.append("the host did not fail")
    elif failures[0][0] != PREFLIGHT_PLAY:
        wrong.append(f"it failed in play {failures[0][0]!r}, not in preflight")
    text = "\n".join(text for _, text in failures)
    wrong += [f"no {phrase!r} in its message" for phrase in case.expect if phrase not in text]
    wrong += [
        f"{secret!r} in the run's output" for secret in case.forbid if secret in run["out"].stdout + run["out"].stderr
    ]
    if run["before"][case.container] != run["after"][case.container]:
        changed = sorted(set(run["after"][case.container]) ^ set(run["before"][case.container]))
        wrong.append(f"{case.container} container changed: {changed[:5]}")
    return wrong


def test_every_bad_input_stops_its_host_before_any_change(suite_run, capsys):
    verdicts = {case.id: _verdict(case, suite_run) for case in CASES}
    with capsys.disabled():
        print(f"\n{'case':34} result")
        for case_id, wrong in verdicts.items():
            print(f"{case_id:34} {'PASS' if not wrong else 'FAIL: ' + '; '.join(wrong)}")
    failed = {case_id: wrong for case_id, wrong in verdicts.items() if wrong}
    assert not failed, json.dumps(failed, indent=1) + f"\nwhole output: {suite_run['output_file']}"


def test_the_healthy_host_in_the_same_run_converges_and_verifies(suite_run):
    healthy = suite_run["healthy"]
    recap = re.search(
        rf"^{re.escape(healthy)}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0",
        suite_run["out"].stdout,
        re.MULTILINE,
    )
    assert recap, suite_run["out"].stdout[-3000:]
    report = json.loads(latest_report(suite_run["report"], "inventory").read_text())
    hosts = report["hosts"]
    assert hosts[healthy]["status"] == "PASS", hosts[healthy]
    assert all(hosts[f"bad-{case.id}"]["status"] == "FAIL" for case in CASES)
