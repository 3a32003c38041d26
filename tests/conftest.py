"""Shared pytest fixtures: the NVIDIA stand-ins (tests/fixtures/nvidia/README.md)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVIDIA_FIXTURES = ROOT / "tests" / "fixtures" / "nvidia"

# Tests import the host scripts from files/verify; bytecode written there would be pushed to the
# hosts with the scripts by gpu_verify's copy and show up as a change.
sys.dont_write_bytecode = True

# The clone is the collection gpu_fleet.tf_hosts (collections/ansible_collections/gpu_fleet/tf_hosts
# links back to the root), so plugins import each other by their collection path, as Ansible
# loads them.
if str(ROOT / "collections") not in sys.path:
    sys.path.insert(0, str(ROOT / "collections"))


def load_builder() -> ModuleType:
    """Import tests/fixtures/nvidia/build_standins.py as a module."""
    name = "build_standins"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, NVIDIA_FIXTURES / "build_standins.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


@dataclass
class NvidiaSmiStandin:
    """The nvidia-smi stand-in script and a way to point it at a GPU description."""

    path: Path
    gpus_dir: Path

    def env(self, description: str | Path | None) -> dict[str, str]:
        """Environment for a run: description is a file name in gpus_dir, a path, or None (no GPU)."""
        env = dict(os.environ)
        if description is None:
            env["NVIDIA_STANDIN_GPUS"] = str(self.gpus_dir / "does-not-exist.json")
        else:
            path = Path(description)
            env["NVIDIA_STANDIN_GPUS"] = str(path if path.is_absolute() else self.gpus_dir / path)
        return env

    def run(
        self, *args: str, description: str | Path | None = "2xA100-SXM4-80GB.json"
    ) -> subprocess.CompletedProcess[str]:
        """Run ``nvidia-smi <args>`` against description; returns the completed process (text)."""
        return subprocess.run(
            [sys.executable, str(self.path), *args],
            env=self.env(description),
            capture_output=True,
            text=True,
            check=False,
        )


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
