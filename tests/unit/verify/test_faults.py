"""Diagnoses of the field's faults (pure parts): loader path order, login-only library paths,
mixed CUDA majors, the driver/library mismatch, and the stand-ins that reproduce them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "files" / "verify"))

import gpu_count
import gpu_parsers
import libraries
from gpu_count import CommandResult

LSPCI = ROOT / "tests" / "fixtures" / "nvidia" / "lspci.py"
GPUS = ROOT / "tests" / "fixtures" / "nvidia" / "gpus"


# --- loader search order and a runtime of another major first -------------------------------


def test_search_order_is_ld_library_path_then_conf_files_then_trusted_dirs():
    conf = {"00-cuda-12.2.conf": ["/usr/local/cuda-12.2/lib64"], "gpu-env.conf": ["/usr/local/cuda-11.8/lib64/"]}
    order = libraries.loader_search_order("/opt/a::/opt/b", conf)
    assert order[:4] == [
        ("/opt/a", "LD_LIBRARY_PATH"),
        ("/opt/b", "LD_LIBRARY_PATH"),
        ("/usr/local/cuda-12.2/lib64", "/etc/ld.so.conf.d/00-cuda-12.2.conf"),
        ("/usr/local/cuda-11.8/lib64", "/etc/ld.so.conf.d/gpu-env.conf"),
    ]
    assert order[-1] == ("/usr/lib", "default path")
    assert len({folder for folder, _ in order}) == len(order)


FOLDERS = {
    "/usr/local/cuda-12.2/lib64": ["libcudart.so", "libcudart.so.12", "libcudart.so.12.2.140"],
    "/usr/local/cuda-11.8/lib64": ["libcudart.so.11.0", "libcudart.so.11.8.89", "libcudnn.so.8"],
}


def _listdir(folder: str) -> list[str]:
    if folder not in FOLDERS:
        raise FileNotFoundError(folder)
    return FOLDERS[folder]


def test_cuda12_runtime_before_the_pinned_toolkit_is_named_with_its_source():
    order = [
        ("/usr/local/cuda-12.2/lib64", "/etc/ld.so.conf.d/00-cuda-12.2.conf"),
        ("/usr/local/cuda-11.8/lib64", "/etc/ld.so.conf.d/gpu-env.conf"),
    ]
    (found,) = libraries.runtime_shadow_problems("11.8", order, _listdir)
    assert found["check"] == "libcudart"
    assert found["cause"].startswith(
        "CUDA 12 runtime /usr/local/cuda-12.2/lib64/libcudart.so.12 (from /etc/ld.so.conf.d/00-cuda-12.2.conf) "
        "comes before the pinned CUDA 11.8 (libcudart.so.11.0) on the library path"
    )
    assert found["fix"].startswith("Remove /usr/local/cuda-12.2/lib64 from /etc/ld.so.conf.d/00-cuda-12.2.conf")


def test_another_toolkit_after_the_pinned_one_is_fine():
    order = [
        ("/usr/local/cuda-11.8/lib64", "/etc/ld.so.conf.d/gpu-env.conf"),
        ("/usr/local/cuda-12.2/lib64", "/etc/ld.so.conf.d/zz-cuda-12.2.conf"),
    ]
    assert libraries.runtime_shadow_problems("11.8", order, _listdir) == []


def test_no_shadow_check_without_the_pinned_runtime_on_the_path_or_without_a_pin():
    order = [("/usr/local/cuda-12.2/lib64", "LD_LIBRARY_PATH")]
    assert libraries.runtime_shadow_problems("11.8", order, _listdir) == []
    assert libraries.runtime_shadow_problems(None, order, _listdir) == []


@pytest.mark.parametrize(
    "name, major",
    [("libcudart.so.11.0", 11), ("libcudart.so.12.2.140", 12), ("/x/libcublas.so.12", 12), ("libcudart.so", None)],
)
def test_soname_major(name, major):
    assert libraries.soname_major(name) == major


# --- CUDA 11 and CUDA 12 in one process ------------------------------------------------------

MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudart.so.11.8.89
7f0000002000-7f0000003000 r-xp 00000000 08:01 2 /opt/tf/lib/python3.10/site-packages/nvidia/cublas/lib/libcublas.so.12
7f0000004000-7f0000005000 r-xp 00000000 08:01 3 /opt/tf/lib/python3.10/site-packages/nvidia/cublas/lib/libcublasLt.so.12
"""


def test_two_cuda_majors_in_one_process_fail_and_list_the_files():
    paths = libraries.cuda_library_paths(MAPS)
    assert len(paths) == 3
    (found,) = libraries.mixed_cuda_major_problems(paths)
    assert found["check"] == "libraries"
    assert "CUDA libraries of 2 major versions are loaded in one process" in found["cause"]
    assert "CUDA 11: /usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudart.so.11.8.89" in found["cause"]
    assert "libcublas.so.12" in found["cause"]


def test_one_cuda_major_in_a_process_is_fine():
    assert libraries.mixed_cuda_major_problems(libraries.cuda_library_paths(MAPS.splitlines()[0])) == []


def test_the_driver_and_cudnn_files_are_not_cuda_majors():
    """TensorFlow's GPU build maps the driver's libcuda.so.520.61.05 beside the CUDA 11.8 runtime (the
    sandbox's report, before this rule, said "CUDA 520"); cuDNN's file carries cuDNN's version."""
    paths = [
        "/usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudart.so.11.8.89",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05",
        "/usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudnn.so.8.6.0",
        "/usr/local/cuda-11.8/targets/x86_64-linux/lib/libcublas.so.11.11.3.6",
    ]
    assert libraries.mixed_cuda_major_problems(paths) == []
    (found,) = libraries.mixed_cuda_major_problems([*paths, "/opt/tf/nvidia/cublas/lib/libcublasLt.so.12"])
    assert "CUDA 11:" in found["cause"] and "CUDA 12: /opt/tf/nvidia/cublas/lib/libcublasLt.so.12" in found["cause"]
    assert "CUDA 520" not in found["cause"] and "CUDA 8" not in found["cause"]


def test_mapped_library_versions_include_cublas_from_its_file_name():
    maps = "7f00-7f01 r-xp 0 08:01 1 /usr/local/cuda-11.8/lib64/libcublas.so.11.11.3.6\n"
    found = libraries.mapped_library_versions(maps)
    assert found["libcublas"] == [
        {
            "path": "/usr/local/cuda-11.8/lib64/libcublas.so.11.11.3.6",
            "raw": None,
            "version": "11.11.3.6",
            "error": None,
        }
    ]


# --- installed, but only login shells find it -----------------------------------------------


def test_login_only_library_path_names_the_profile_file_and_the_fix(tmp_path):
    lib64 = tmp_path / "cuda-11.8" / "lib64"
    lib64.mkdir(parents=True)
    (lib64 / "libcudart.so.11.0").write_bytes(b"")
    profile = tmp_path / "cuda-ld.sh"
    profile.write_text(f"export LD_LIBRARY_PATH={lib64}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n")
    (tmp_path / "other.sh").write_text("export PATH=/usr/local/bin:$PATH\n")
    found = libraries.find_off_path("libcudart.so.11.0", ["/nonexistent", str(lib64)])
    assert found == str(lib64 / "libcudart.so.11.0")
    login = libraries.login_only_mentions(str(lib64), [str(tmp_path / "*.sh")])
    assert login == [str(profile)]
    result = libraries.load_failure_problem("libcudart", "libcudart.so.11.0", "not found", None, {}, found, login)
    assert (
        f"It is installed at {found}, but {lib64} is not on the loader path: only {profile} add it" in (result["cause"])
    )
    assert "services, cron, sudo and Ansible commands do not" in result["cause"]
    assert result["fix"].startswith(f"List {lib64} in a file under /etc/ld.so.conf.d/")


def test_a_library_that_is_nowhere_keeps_the_install_fix():
    assert libraries.find_off_path("libcudnn.so.8", ["/nonexistent"]) is None
    result = libraries.load_failure_problem("libcudnn", "libcudnn.so.8", "not found", None, {})
    assert "It is installed" not in result["cause"]
    assert result["fix"].startswith("Install the library (cuda_toolkit/cudnn roles)")


def test_cudnn_older_minor_than_the_build_quotes_tensorflows_refusal():
    record = {"ok": True, "soname": "libcudnn.so.8", "path": "/x/libcudnn.so.8.5.0", "version": "8.5.0"}
    (found,) = libraries.compare_cudnn(record, "8.6")
    assert "is 8.5.0, the stack pins 8.6 (loaded vs built)" in found["cause"]
    assert "Loaded runtime CuDNN library: 8.5.0 but source was compiled with: 8.6" in found["cause"]


# --- the driver/library version mismatch ------------------------------------------------------

PROC_VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.65.01  Wed Jul 20 14:00:58 UTC 2022\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
PROC_VERSION_OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build\n"


def test_module_version_closed_and_open_modules(tmp_path):
    assert gpu_parsers.parse_proc_driver_version(PROC_VERSION) == "515.65.01"
    assert gpu_parsers.parse_proc_driver_version(PROC_VERSION_OPEN) == "535.104.05"
    assert gpu_parsers.parse_proc_driver_version("") is None
    path = tmp_path / "version"
    path.write_text(PROC_VERSION)
    assert gpu_count.loaded_module_version(str(path)) == "515.65.01"
    assert gpu_count.loaded_module_version(str(tmp_path / "missing")) is None


def test_nvidia_smi_mismatch_says_reboot_and_names_both_versions():
    out = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 520.61\n"
    doc = gpu_count.evaluate(2, CommandResult(18, out, "", None), module_version="515.65.01")
    (found,) = doc["problems"]
    assert found["check"] == "driver"
    assert found["cause"].startswith(
        "Driver/library version mismatch: the loaded kernel module is 515.65.01, the user-space driver (NVML, "
        "libcuda) is 520.61"
    )
    assert found["fix"].startswith("Reboot")
    assert doc["ok"] is False


def test_a_loaded_module_that_differs_from_a_working_nvidia_smi_is_a_mismatch():
    csv = "0, NVIDIA A100-SXM4-80GB, GPU-1, 00000000:07:00.0, 81920, 520.61.05\n"
    doc = gpu_count.evaluate(1, CommandResult(0, csv, "", None), module_version="515.65.01")
    assert [p["check"] for p in doc["problems"]] == ["driver"]
    assert gpu_count.evaluate(1, CommandResult(0, csv, "", None), module_version="520.61.05")["ok"] is True


def test_standin_nvidia_smi_reproduces_the_mismatch(nvidia_smi_standin, tmp_path):
    description = json.loads((GPUS / "2xA100-SXM4-80GB.json").read_text())
    description["kernel_module_version"] = "515.65.01"
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(description))
    proc = nvidia_smi_standin.run("-L", description=path)
    assert proc.returncode == 18
    assert proc.stdout.splitlines() == [
        "Failed to initialize NVML: Driver/library version mismatch",
        "NVML library version: 520.61",
    ]
    description["kernel_module_version"] = "520.61.05"
    path.write_text(json.dumps(description))
    assert nvidia_smi_standin.run("-L", description=path).returncode == 0


# --- the lspci stand-in -------------------------------------------------------------------------


def _lspci(*args: str, description: Path) -> subprocess.CompletedProcess:
    env = {"NVIDIA_STANDIN_GPUS": str(description), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(LSPCI), *args], capture_output=True, text=True, env=env)


def test_lspci_standin_lists_a_gpu_that_fell_off_the_bus():
    proc = _lspci("-D", "-n", "-d", "10de:", description=GPUS / "2xA100-one-missing.json")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        "0000:07:00.0 0302: 10de:20b2 (rev a1)",
        "0000:0f:00.0 0302: 10de:20b2 (rev a1)",
    ]
    assert [gpu["pci_bus_id"] for gpu in gpu_parsers.parse_lspci(proc.stdout)] == ["0000:07:00.0", "0000:0f:00.0"]


def test_lspci_standin_other_vendor_no_description_and_bad_option(tmp_path):
    assert _lspci("-D", "-n", "-d", "8086:", description=GPUS / "2xA100-one-missing.json").stdout == ""
    assert _lspci("-D", "-n", description=tmp_path / "none.json").stdout == ""
    bad = _lspci("-x", description=GPUS / "2xA100-one-missing.json")
    assert bad.returncode == 1 and "invalid option" in bad.stderr


def test_gpu_count_names_the_missing_bus_id_with_both_standins(nvidia_smi_standin):
    description = GPUS / "2xA100-one-missing.json"
    smi = nvidia_smi_standin.run(*gpu_count.build_command("nvidia-smi")[1:], description=description)
    pci = [
        gpu["pci_bus_id"]
        for gpu in gpu_parsers.parse_lspci(_lspci("-D", "-n", "-d", "10de:", description=description).stdout)
    ]
    doc = gpu_count.evaluate(2, CommandResult(smi.returncode, smi.stdout, smi.stderr, None), pci_bus_ids=pci)
    (found,) = doc["problems"]
    assert found["cause"] == (
        "Expected 2 GPUs, nvidia-smi sees 1 (1 missing); on the PCI bus but not in nvidia-smi: 0000:0f:00.0."
    )


# --- out of memory: who holds the GPUs ------------------------------------------------------


def test_busy_gpus_names_pids_per_gpu(nvidia_smi_standin, tmp_path):
    description = json.loads((GPUS / "2xA100-SXM4-80GB.json").read_text())
    uuid1 = description["gpus"][1]["uuid"]
    description["compute_apps"] = [
        {"pid": 4242, "process_name": "python3", "gpu_uuid": uuid1, "used_memory_mib": 79000}
    ]
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(description))
    smi = nvidia_smi_standin.run(
        "--query-compute-apps=pid,process_name,gpu_uuid,used_memory", "--format=csv,noheader,nounits", description=path
    )
    devices = [{"index": i, "uuid": g["uuid"]} for i, g in enumerate(description["gpus"])]
    assert gpu_count.busy_gpus_text(smi.stdout, devices) == "GPU 1: PID 4242 python3 (79000 MiB)"
    assert gpu_count.busy_gpus_text("", devices) is None


def test_out_of_memory_problem_gets_the_busy_gpus_and_memory_growth():
    import gpu_verify

    oom = {"check": "fit", "cause": "Out of GPU memory during the fit (ResourceExhaustedError: OOM).", "fix": "x"}
    other = {"check": "fit", "cause": "Loss is not finite.", "fix": "y"}
    (explained, untouched) = gpu_verify.explain_oom([oom, other], "GPU 1: PID 4242 python3 (79000 MiB)")
    assert explained["cause"].endswith("Other processes hold GPU memory: GPU 1: PID 4242 python3 (79000 MiB).")
    assert "set_memory_growth" in explained["fix"]
    assert untouched == other
    (alone,) = gpu_verify.explain_oom([oom], None)
    assert alone["cause"].endswith("No other process holds GPU memory.") and alone["fix"] == "X"


def test_unreachable_worker_quotes_the_aborted_collective_and_the_task():
    import fit

    message = (
        "Graph execution error:\n\nDetected at node 'CollectiveReduceV2' defined at (most recent call last):\n"
        '    File "/opt/gpu-verify/fit.py", line 668, in <module>\n'
        "Node: 'CollectiveReduceV2'\n"
        "Collective ops is aborted by: failed to connect to all addresses\n"
        "Additional GRPC error information from remote target /job:worker/replica:0/task:1:\n"
        ':{"created":"@1795980846.893561605","description":"Failed to pick subchannel"}\n'
    )
    cause, fix = fit.classify_exception("UnavailableError", message)
    assert cause == (
        "A worker of the multi-worker cluster could not be reached or stopped answering (UnavailableError: "
        "Collective ops is aborted by: failed to connect to all addresses; gRPC error from worker task 1 "
        "(/job:worker/replica:0/task:1))."
    )
    assert "gpu_verify_multiworker_port" in fix


def test_nonfinite_fix_names_the_learning_rate_first_when_it_was_raised():
    import fit

    assert fit.nonfinite_fix(1e30, False).startswith(
        "the learning rate 1e+30 is above the default 0.01 (gpu_verify_fit_learning_rate)"
    )
    assert fit.nonfinite_fix(0.01, True).startswith("float16 overflowed under mixed_float16")
    assert fit.nonfinite_fix(0.01, False).startswith("the device computes garbage")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_time_limits_and_rates_must_be_finite_and_positive(value):
    import argparse

    from verify_common import positive_float

    with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number > 0"):
        positive_float(value)
