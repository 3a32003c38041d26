"""Slurm GRES against Debian 12's real Slurm 22.05 (tests/slurm_sandbox.py builds its images once per machine).

A controller container runs ``slurmctld`` and ``munge``; a GPU host from the converged snapshot runs ``slurmd``
and ``munge``, with stand-in ``/dev/nvidia0`` and ``/dev/nvidia1`` (the host's ``/dev/null`` passed in under
those names, a character device as NVIDIA's are: the stand-in nvidia-smi describes two A100s). slurm.conf names the node with what
gpu_slurm says it has. In order:

- ``playbooks/driver.yml`` with ``gpu_slurm_enabled`` writes gres.conf and the node's line on the controller and
  starts slurmd (the node had no job): the node registers with ``gpu:a100:2``, Slurm taking the two device files;
- while a real ``sbatch --wrap 'sleep ...'`` runs on the node, gres.conf edited by hand is written back, but slurmd
  is left alone (the run says so); then ``playbooks/reprovision.yml`` with the documented Slurm hooks
  (docs/usage.md: ``scontrol update ... state=DRAIN``, ``playbooks/tasks/slurm_drained.yml``, ``state=RESUME``)
  drains through the real scontrol, waits until the job has finished, restarts the slurmd that waited, verifies
  (Slurm shows the GRES) and resumes the node;
- the same rollout after slurm.conf claims four GPUs for the node: verification fails with Slurm's view, and the
  node stays drained with the reason Slurm shows, and slurmd is not restarted (gres.conf did not change).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from sandbox_hosts import ROOT, site, start_container, stop_container
from slurm_sandbox import controller_image, node_image
from snapshots import SANDBOX_GROUP_VARS, ensure

pytestmark = pytest.mark.integration

SLURM_CONF = """ClusterName=gpufleet
SlurmctldHost={controller}
SlurmUser=slurm
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
{node_line} CPUs=1 State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
JOB_SECONDS = 40


def sh(container: str, script: str, check: bool = True) -> str:
    done = subprocess.run(["podman", "exec", container, "sh", "-ec", script], capture_output=True, text=True)
    if check:
        assert done.returncode == 0, f"{script} in {container}: {done.stdout}{done.stderr}"
    return done.stdout


def show_node(controller: str, node: str) -> dict[str, str]:
    found: dict[str, str] = {}
    text = sh(controller, f"scontrol show node {node}")
    for key, value in re.findall(r"([A-Za-z]+)=(.*?)(?=\s+[A-Za-z:/]+=|$)", text, flags=re.M):
        found.setdefault(key, value.strip())
    return found


def write_slurm_conf(controller: str, node: str, node_line: str) -> None:
    conf = SLURM_CONF.format(controller=controller, node=node, node_line=node_line)
    for host in (controller, node):
        subprocess.run(
            ["podman", "exec", "-i", host, "sh", "-c", "cat > /etc/slurm/slurm.conf"], input=conf, text=True, check=True
        )


def inventory(folder: Path, controller: str, node: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    hosts = {
        "gpu_hosts": {"hosts": {node: {"ansible_connection": "podman_pipelined"}}},
        "slurm_controllers": {"hosts": {controller: {"ansible_connection": "podman_pipelined"}}},
    }
    (folder / "hosts.yml").write_text(json.dumps(hosts, indent=1))
    (folder / "group_vars").symlink_to(SANDBOX_GROUP_VARS)
    return folder


def extra_vars(tmp: Path, controller: str) -> list[str]:
    """The run's options: gpu_slurm on, and the Slurm hooks of docs/usage.md run on the controller."""
    options = {
        "gpu_slurm_enabled": True,
        "gpu_slurm_scontrol_host": controller,
        "gpu_slurm_node_lines_dir": str(tmp / "slurm-nodes"),
        "gpu_verify_report_dir": str(tmp / "reports"),
        "gpu_rollout_hook_host": controller,
        "gpu_rollout_drain_command": [
            "scontrol",
            "update",
            "nodename={{ inventory_hostname_short }}",
            "state=DRAIN",
            "reason=gpu_fleet reprovision",
        ],
        "gpu_rollout_undrain_command": [
            "scontrol",
            "update",
            "nodename={{ inventory_hostname_short }}",
            "state=RESUME",
        ],
        "gpu_rollout_drain_tasks": str(ROOT / "playbooks/tasks/slurm_drained.yml"),
        "gpu_rollout_drain_poll": 3,
    }
    path = tmp / "slurm-vars.json"
    path.write_text(json.dumps(options))
    return ["-e", f"@{path}"]


def until(check, what: str, seconds: int = 60):
    for _ in range(seconds):
        found = check()
        if found:
            return found
        time.sleep(1)
    pytest.fail(f"gave up waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slurm")
    converged = node_image(os.environ.get("GPU_SNAPSHOT_CONVERGED") or ensure("converged"))
    network = f"gpu-slurm-net-{uuid.uuid4().hex[:8]}"
    subprocess.run(["podman", "network", "create", network], check=True, capture_output=True)
    started: list[str] = []
    try:
        controller = start_container("gpu-slurmctl", f"--network={network}", image=controller_image(), wheelhouse=False)
        started.append(controller)
        # Stand-in GPU device files: the host's /dev/null (a character device) at /dev/nvidia0 and /dev/nvidia1.
        devices = ("--device=/dev/null:/dev/nvidia0", "--device=/dev/null:/dev/nvidia1")
        node = start_container("gpu-slurm-node", f"--network={network}", *devices, image=converged)
        started.append(node)
        key = subprocess.run(
            ["podman", "exec", controller, "cat", "/etc/munge/munge.key"], capture_output=True, check=True
        ).stdout
        subprocess.run(["podman", "exec", "-i", node, "sh", "-c", "cat > /etc/munge/munge.key"], input=key, check=True)
        # What slurm.conf holds for the node: what the stand-in GPUs make (asserted against the role's file below).
        write_slurm_conf(controller, node, f"NodeName={node} Gres=gpu:a100:2")
        sh(node, "service munge start")
        sh(controller, "mkdir -p /var/spool/slurmctld && chown slurm: /var/spool/slurmctld && service munge start")
        sh(controller, "service slurmctld start")
        yield {
            "tmp": tmp,
            "controller": controller,
            "node": node,
            "inventory": inventory(tmp / "inventory", controller, node),
        }
    finally:
        for name in started:
            stop_container(name)
        subprocess.run(["podman", "network", "rm", "-f", network], capture_output=True)


def slurmd_pid(node: str) -> str:
    return sh(node, "cat /run/slurmd.pid 2>/dev/null || true").strip()


def test_the_node_registers_with_the_gres_gpu_slurm_writes(cluster):
    controller, node, tmp = cluster["controller"], cluster["node"], cluster["tmp"]
    assert slurmd_pid(node) == ""  # no slurmd yet
    run = site(cluster["inventory"], *extra_vars(tmp, controller), "--tags", "slurm", playbook="playbooks/driver.yml")
    assert run.returncode == 0, run.stdout[-4000:]
    assert sh(node, "cat /etc/slurm/gres.conf").splitlines()[1:] == [
        "Name=gpu Type=a100 File=/dev/nvidia0",
        "Name=gpu Type=a100 File=/dev/nvidia1",
    ]
    assert (tmp / "slurm-nodes" / f"{node}.conf").read_text() == f"NodeName={node} Gres=gpu:a100:2\n"
    seen = until(
        lambda: (s := show_node(controller, node)) and s.get("State", "").startswith("IDLE") and s,
        "the node to register",
    )
    assert seen["Gres"].startswith("gpu:a100:2")
    assert "+" not in seen["State"], seen  # no DRAIN, no INVALID_REG: slurmd found both device files
    assert sh(controller, f"sinfo -h -N -n {node} -o '%G'").strip().startswith("gpu:a100:2")


def test_the_rollout_drains_waits_for_the_job_verifies_and_resumes(cluster):
    controller, node, tmp = cluster["controller"], cluster["node"], cluster["tmp"]
    pid = slurmd_pid(node)
    job = sh(
        controller,
        f"sbatch --parsable -w {node} --gres=gpu:a100:1 -o /tmp/job.out --wrap 'sleep {JOB_SECONDS}; date +%s'",
    ).strip()
    until(lambda: "JobState=RUNNING" in sh(controller, f"scontrol show job {job}"), "the job to run")
    # gres.conf changed by hand while the job runs: the role writes it back, but leaves slurmd alone and says so.
    sh(node, "echo '# by hand' >> /etc/slurm/gres.conf")
    run = site(cluster["inventory"], *extra_vars(tmp, controller), "--tags", "slurm", playbook="playbooks/driver.yml")
    assert run.returncode == 0, run.stdout[-4000:]
    assert f"Slurm shows jobs on {node}, so slurmd was not restarted" in " ".join(run.stdout.split())
    assert slurmd_pid(node) == pid
    run = site(cluster["inventory"], *extra_vars(tmp, controller), playbook="playbooks/reprovision.yml")
    assert run.returncode == 0, run.stdout[-4000:]
    # The wait saw the node still draining (its job ran) before it saw it drained, and only then went on.
    assert re.search(r"FAILED - RETRYING: \[[^]]*\]: Wait until Slurm shows the node drained", run.stdout), run.stdout[
        -4000:
    ]
    job_state = sh(controller, f"scontrol show job {job}")
    assert "JobState=COMPLETED" in job_state and "ExitCode=0:0" in job_state
    # The restart that waited was done once the node was drained.
    assert slurmd_pid(node) not in ("", pid)
    assert sh(node, "ls /etc/slurm/").split() == ["gres.conf", "plugstack.conf", "plugstack.conf.d", "slurm.conf"]
    seen = show_node(controller, node)
    # Resumed: no DRAIN flag left (a busy test machine may add a passing NOT_RESPONDING to a ping).
    assert seen["State"].split("+")[0] == "IDLE" and "DRAIN" not in seen["State"], seen


def test_a_node_slurm_sees_wrong_stays_drained_with_its_reason(cluster):
    controller, node, tmp = cluster["controller"], cluster["node"], cluster["tmp"]
    write_slurm_conf(controller, node, f"NodeName={node} Gres=gpu:a100:4")
    sh(controller, "service slurmctld restart")  # a node's Gres in slurm.conf is read when slurmctld starts
    until(lambda: sh(controller, f"scontrol show node {node}", check=False), "slurmctld to answer")
    pid = slurmd_pid(node)
    run = site(cluster["inventory"], *extra_vars(tmp, controller), playbook="playbooks/reprovision.yml")
    assert run.returncode != 0
    assert slurmd_pid(node) == pid  # gres.conf as it was: the rerun restarted nothing
    output = " ".join(run.stdout.split())
    assert "the host has gpu:a100:2" in output or "Slurm refused the node" in output, output[-4000:]
    seen = show_node(controller, node)
    assert "DRAIN" in seen["State"], seen
    assert seen.get("Reason"), seen  # Slurm says why
