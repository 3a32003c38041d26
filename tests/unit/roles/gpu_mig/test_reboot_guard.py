"""gpu_mig's reboot for a pending MIG mode, in a real ansible-playbook run over a local connection against the
nvidia-smi stand-in (tests/fixtures/nvidia): the role never reboots the control node, it stops with the fix."""

from __future__ import annotations

import json
import shutil

from helpers import NVIDIA_FIXTURES, localhost_playbook

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars:
    gpu_mig_enabled: true
    gpu_mig_reboot_allowed: true
    gpu_mig_nvidia_smi: {smi}
    gpu_mig_layout: [{{gpus: [0], profiles: [7g.80gb]}}]
  roles:
    - gpu_fleet.tf_hosts.gpu_mig
"""


def test_a_pending_mode_over_a_local_connection_stops_instead_of_rebooting(tmp_path, nvidia_smi_standin):
    description = tmp_path / "gpus.json"
    shutil.copy(NVIDIA_FIXTURES / "gpus" / "2xH100-SXM5-80GB.json", description)
    data = json.loads(description.read_text())
    data["gpus"][0]["mig_needs_reset"] = True
    description.write_text(json.dumps(data))
    playbook = tmp_path / "mig.yml"
    playbook.write_text(PLAYBOOK.format(smi=nvidia_smi_standin.path))
    env = {"NVIDIA_STANDIN_GPUS": str(description), "NVIDIA_STANDIN_MIG_STATE": str(tmp_path / "mig.json")}
    done = localhost_playbook(playbook, env)
    assert done.returncode != 0, done.stdout
    assert "the role does not reboot the control node" in done.stdout, done.stdout[-3000:]
    assert "would reboot the control node" not in done.stdout  # stopped before ansible.builtin.reboot
