"""Helpers the tests share (imported by name: a test never imports ``conftest``, which pytest loads
once per folder): the project root, the NVIDIA stand-in builder and the nvidia-smi stand-in."""

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


def tf_python() -> str:
    """The interpreter from GPU_VERIFY_TF_PYTHON, or skip when it is unset or lacks tensorflow."""
    python = os.environ.get("GPU_VERIFY_TF_PYTHON")
    if not python:
        pytest.skip("set GPU_VERIFY_TF_PYTHON to a python that has tensorflow to run the real fit")
    probe = subprocess.run(
        [python, "-c", "import tensorflow"],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    if probe.returncode != 0:
        pytest.skip(f"{python} cannot import tensorflow: {probe.stderr.strip()[-200:]}")
    return python


def _localhost_argv(playbook: Path, env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
    environ = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", **(env or {}))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    return argv + ["-e", f"ansible_python_interpreter={sys.executable}", str(playbook)], environ


def localhost_playbook(playbook: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``playbook`` with this venv's ansible-playbook against localhost (local connection, this
    interpreter) under the project's ansible.cfg; ``env`` adds to the environment."""
    argv, environ = _localhost_argv(playbook, env)
    return subprocess.run(argv, capture_output=True, text=True, env=environ, cwd=ROOT, timeout=120)


def localhost_playbook_started(playbook: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """As :func:`localhost_playbook`, started: its output (stdout and stderr together) read line by line as it
    comes, for a test that acts on what the run says while it runs."""
    argv, environ = _localhost_argv(playbook, env)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ, cwd=ROOT)
