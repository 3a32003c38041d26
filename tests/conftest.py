"""Shared pytest fixtures: the NVIDIA stand-ins (tests/fixtures/nvidia/README.md). Helpers that tests
import by name are in tests/helpers.py, tests/sandbox_hosts.py and tests/ansible_run.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Tests import the shared helpers by module name (pytest runs them with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import NVIDIA_FIXTURES, ROOT, NvidiaSmiStandin, load_builder

# Tests import the host scripts from files/verify; bytecode written there would be pushed to the
# hosts with the scripts by gpu_verify's copy and show up as a change.
sys.dont_write_bytecode = True

# The clone is the collection gpu_fleet.tf_hosts (collections/ansible_collections/gpu_fleet/tf_hosts
# links back to the root), so plugins import each other by their collection path, as Ansible
# loads them.
if str(ROOT / "collections") not in sys.path:
    sys.path.insert(0, str(ROOT / "collections"))


@pytest.fixture(scope="session")
def standins_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of built stand-ins (runfiles, cuDNN tar, libs/, artifacts.yml).

    Built once per session into the pytest temp dir with the default versions
    (driver 520.61.05, CUDA 11.8.0, cuDNN 8.6.0.163), so tests never race on a
    shared folder. NVIDIA_STANDINS_DIR=<dir> uses an already built one instead.
    Skips when gcc, makeself or xz are missing.
    """
    prebuilt = os.environ.get("NVIDIA_STANDINS_DIR")
    if prebuilt:
        return Path(prebuilt)
    builder = load_builder()
    out = tmp_path_factory.mktemp("standins")
    cuda = [builder.parse_cuda("11.8.0:520.61.05:11.8.89:11.8.20220929")]
    cudnn = [builder.parse_cudnn("8.6.0.163:11")]
    try:
        builder.build(out, "520.61.05", cuda, cudnn)
    except builder.BuildError as exc:
        pytest.skip(f"cannot build the NVIDIA stand-ins: {exc}")
    return out


@pytest.fixture(scope="session")
def nvidia_smi_standin(tmp_path_factory: pytest.TempPathFactory) -> NvidiaSmiStandin:
    """nvidia-smi stand-in for driver 520.61.05 (CUDA 11.8); needs no build tools.

    Point it at a description with ``.run(..., description="4xRTX3090-PCIe-x8.json")``
    or, for other programs, with the env var NVIDIA_STANDIN_GPUS (``.env(...)``).
    """
    builder = load_builder()
    path = tmp_path_factory.mktemp("nvidia-smi") / "nvidia-smi"
    path.write_text(builder.render_nvidia_smi("520.61.05", 11080), encoding="utf-8")
    path.chmod(0o755)
    return NvidiaSmiStandin(path=path, gpus_dir=NVIDIA_FIXTURES / "gpus")
