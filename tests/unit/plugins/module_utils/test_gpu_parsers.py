"""gpu_parsers: the meaning and fix of nvidia-smi's exit status 9, shared by the preflight module, the
verification and the health check, and the fields the project queries against the real nvidia-smi 535.261.03
(tests/fixtures/nvidia_smi/real-535.261.03-no-module/, see the README beside it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils import gpu_parsers

ROOT = Path(__file__).resolve().parents[4]
REAL = ROOT / "tests" / "fixtures" / "nvidia_smi" / "real-535.261.03-no-module"
CAPTURES = json.loads((REAL / "commands.json").read_text(encoding="utf-8"))["commands"]
NO_MODULE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
NO_LIBRARY = (
    "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display "
    "Driver is properly installed and present in your system.\n"
    "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n"
)
HOST_FIRST = (
    "On a host, load the NVIDIA kernel module (`modprobe nvidia`, see `dmesg | grep -i nvrm`) or reboot after a "
    "driver install or upgrade, and check that nouveau is blacklisted and Secure Boot accepts the module; in a "
    "container the module belongs to the host's kernel, so load it on the host and pass the GPUs into the container "
    "(NVIDIA Container Toolkit: CDI `--device nvidia.com/gpu=all`, or the `/dev/nvidia*` device files)."
)
CONTAINER_FIRST = (
    "In a container the NVIDIA kernel module belongs to the host's kernel, so load it on the host and pass the GPUs "
    "into the container (NVIDIA Container Toolkit: CDI `--device nvidia.com/gpu=all`, or the `/dev/nvidia*` device "
    "files); on a host, load the module (`modprobe nvidia`, see `dmesg | grep -i nvrm`) or reboot after a driver "
    "install or upgrade, and check that nouveau is blacklisted and Secure Boot accepts the module."
)
# --query-gpu=... / --query-compute-apps=... written out in the project's code and role data.
LITERAL_QUERY = re.compile(r"--query-(gpu|compute-apps)=([a-z][a-z0-9_.,]*[a-z0-9_])")
PROJECT_SOURCES = ("plugins", "files", "roles")


def real(file: str) -> str:
    return (REAL / file).read_text(encoding="utf-8")


def help_fields(file: str) -> set[str]:
    """The property names of a ``--help-query-*`` text: the quoted names that open a line (``"a" or "b"``)."""
    return {name for line in real(file).splitlines() if line.startswith('"') for name in re.findall(r'"([^"]+)"', line)}


def test_exit_9_means_the_kernel_module_is_not_loaded() -> None:
    assert gpu_parsers.NVIDIA_SMI_MODULE_NOT_LOADED_RC == 9
    assert gpu_parsers.MODULE_NOT_LOADED == "NVIDIA kernel module not loaded"


def test_the_fix_fits_a_host_and_a_container_in_one_sentence() -> None:
    assert gpu_parsers.module_not_loaded_fix() == gpu_parsers.module_not_loaded_fix(False) == HOST_FIRST
    assert gpu_parsers.module_not_loaded_fix(True) == CONTAINER_FIRST
    for fix in (HOST_FIRST, CONTAINER_FIRST):
        assert fix.count(". ") == 0 and fix.endswith(".")


def test_in_container_looks_for_the_engines_marker_files(tmp_path: Path) -> None:
    podman, docker = tmp_path / "run" / ".containerenv", tmp_path / ".dockerenv"
    markers = [str(podman), str(docker)]
    assert gpu_parsers.in_container(markers) is False
    docker.write_text("", encoding="utf-8")
    assert gpu_parsers.in_container(markers) is True
    assert gpu_parsers.in_container([str(podman)]) is False
    assert gpu_parsers.in_container([]) is False
    assert gpu_parsers.CONTAINER_MARKERS == ("/run/.containerenv", "/.dockerenv")


# --- the real capture -------------------------------------------------------------------------------------------


def test_the_capture_asks_what_the_project_asks() -> None:
    """commands.json holds the project's own query lines: when a field list changes, capture again
    (tests/fixtures/nvidia_smi/capture.py)."""
    fmt = "--format=csv,noheader,nounits"
    assert CAPTURES["query-gpu.txt"]["argv"] == ["nvidia-smi", "--query-gpu=" + ",".join(gpu_parsers.QUERY_FIELDS), fmt]
    health = "--query-gpu=" + ",".join(gpu_parsers.HEALTH_FIELDS)
    assert CAPTURES["query-gpu-health.txt"]["argv"] == ["nvidia-smi", health, fmt]
    apps = "--query-compute-apps=" + ",".join(gpu_parsers.COMPUTE_APPS_FIELDS)
    assert CAPTURES["query-compute-apps.txt"]["argv"] == ["nvidia-smi", apps, fmt]
    for file in CAPTURES:
        assert (REAL / file).is_file(), file


@pytest.mark.parametrize("file", sorted(file for file in CAPTURES if "/" not in file))
def test_without_the_module_every_command_answers_exit_9(file: str) -> None:
    """535 initialises NVML before anything else, even for --version and --help-query-gpu."""
    assert (CAPTURES[file]["rc"], real(file), CAPTURES[file]["stderr"]) == (9, NO_MODULE, None)


@pytest.mark.parametrize("file", sorted(file for file in CAPTURES if file.startswith("no-libnvidia-ml/")))
def test_without_libnvidia_ml_every_command_answers_exit_12(file: str) -> None:
    assert (CAPTURES[file]["rc"], real(file), CAPTURES[file]["stderr"]) == (12, NO_LIBRARY, None)


def project_query_fields() -> dict[str, set[str]]:
    """Every field the project asks nvidia-smi for: the lists in gpu_parsers (the module, the health check,
    the verification's samples; gpu_count asks a part of QUERY_FIELDS) and each query written out in the
    code and role data (busy guards, the rollout's drain), by switch."""
    fields = {
        "gpu": {
            *gpu_parsers.QUERY_FIELDS,
            *gpu_parsers.HEALTH_FIELDS,
            *gpu_parsers.HEALTH_FIELDS_THROTTLE_NAMES,
            *gpu_parsers.SAMPLE_FIELDS,
        },
        "compute-apps": set(gpu_parsers.COMPUTE_APPS_FIELDS),
    }
    for folder in PROJECT_SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".yml", ".yaml", ".j2") and path.is_file():
                for switch, names in LITERAL_QUERY.findall(path.read_text(encoding="utf-8", errors="replace")):
                    fields[switch].update(name for name in names.split(",") if name)
    return fields


QUERIED = project_query_fields()
# In 535.261.03 the binary's field table has these two (names and descriptions are among its strings), but
# --help-query-gpu does not list them; the help of 580.173.02, 590.48.01, 595 and 610 does (public captures in
# utkuozdemir/nvidia_gpu_exporter, internal/captures/; none of 550 to 575 there). Whether 535 answers them needs
# a GPU to tell.
NOT_IN_535_HELP = {"remapped_rows.pending", "remapped_rows.failure"}


@pytest.mark.parametrize(
    "field",
    [
        pytest.param(
            field,
            marks=pytest.mark.xfail(
                strict=True, reason="missing from 535.261.03's --help-query-gpu; 580.173.02's lists it"
            ),
        )
        if field in NOT_IN_535_HELP
        else field
        for field in sorted(QUERIED["gpu"])
    ],
)
def test_each_queried_gpu_field_is_in_the_535_help(field: str) -> None:
    assert field in help_fields("nvml-init-forced/help-query-gpu.txt")


@pytest.mark.parametrize("field", sorted(QUERIED["compute-apps"]))
def test_each_queried_compute_apps_field_is_in_the_535_help(field: str) -> None:
    """Compute-app fields are listed by --help-query-compute-apps (``"process_name" or "name"``,
    ``"used_gpu_memory" or "used_memory"``), not by --help-query-gpu."""
    assert field in help_fields("nvml-init-forced/help-query-compute-apps.txt")


def test_the_scan_finds_the_queries_written_out() -> None:
    """The role data spells the compute-apps query out (nvidia_driver's busy guard, gpu_rollout, preflight)."""
    assert QUERIED["compute-apps"] == set(gpu_parsers.COMPUTE_APPS_FIELDS)
    assert {"index", "utilization.gpu", "memory.used", "compute_cap"} <= QUERIED["gpu"]
