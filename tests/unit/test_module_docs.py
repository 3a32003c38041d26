"""Custom modules document themselves: ansible-doc renders them with the project's ansible.cfg."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ansible_doc_renders_nvidia_gpu_facts():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOME=str(ROOT / ".ansible"))
    out = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-t", "module", "gpu_fleet.tf_hosts.nvidia_gpu_facts"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for text in ("nvidia_gpu_facts", "nvidia_smi_path", "lspci_path", "RETURN VALUES", "nvswitch_present"):
        assert text in out.stdout, text
