"""Debian 13 under the newest ansible-core: a host of the Debian 13 sandbox image (Python 3.13)
converged and verified with TensorFlow 2.20 by ansible-core 2.21 from the built tarball; a second run
changes nothing. The same controller then runs the sandbox's own Debian 12 host (the converged
snapshot) over SSH, Ansible's default connection: PASS, nothing changed.

ansible-core 2.21 needs Python 3.12 or later, which this Debian 12 machine lacks: the controller runs
inside the Debian 13 container (``python3 -m ansible playbook`` from tests/ansible_cores.py's folder,
mounted), against that same container as the host over the local connection. The stack is the
Debian 13 one of data/locks/targets.yml (tensorflow-cpu 2.20.0 on CUDA 12.5 and cuDNN 9.3, the
stand-ins of build/standins-multi), its wheels from the session's wheelhouse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import ansible_cores
import pytest
import retry
import yaml
from sandbox_hosts import ROOT, start_container, start_converged, stop_container
from sandbox_hosts import STANDINS as STANDINS_12

IMAGE = os.environ.get("GPU_SANDBOX_IMAGE_DEBIAN13", "localhost/gpu-sandbox-debian:13")
STANDINS = ROOT / "build" / "standins-multi"
HOST = "debian13"
WORK = "/srv/test"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)
STACK = {"name": "tf2.20", "tensorflow": "2.20", "cuda": "12.5", "cudnn": "9.3", "package": "tensorflow-cpu"}


def _inventory(folder: Path) -> None:
    """The host (this container, local connection) with the sandbox's group_vars and the Debian 13 stack."""
    group_vars = yaml.safe_load((ROOT / "inventories/sandbox/group_vars/gpu_hosts.yml").read_text())
    group_vars.update(
        gpu_preflight_stacks=[STACK],
        nvidia_driver_version="555.42.06",
        gpu_artifacts_controller_dir="/srv/standins",
        gpu_preflight_manifest_overlays=["/srv/standins/artifacts.yml"],
        gpu_verify_report_dir=f"{WORK}/reports",
    )
    (folder / "group_vars").mkdir(parents=True)
    (folder / "group_vars" / "gpu_hosts.yml").write_text(yaml.safe_dump(group_vars))
    host = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    (folder / "hosts.yml").write_text(yaml.safe_dump({"gpu_hosts": {"hosts": {HOST: host}}}))


def _tarball(work: Path) -> Path:
    built = subprocess.run(
        ["ansible-galaxy", "collection", "build", "--output-path", str(work), str(ROOT)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    return next(work.glob("gpu_fleet-tf_hosts-*.tar.gz"))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A Debian 13 container with ansible-core 2.21, the collection's tarball and an inventory mounted."""
    if subprocess.run(["podman", "image", "exists", IMAGE], check=False).returncode != 0:
        subprocess.run([str(ROOT / "tools/build-sandbox-image.sh"), IMAGE], check=True)
    if not (STANDINS / "artifacts.yml").is_file():
        pytest.fail("needs the stand-ins of build/standins-multi: run `make standins` first")
    work = tmp_path_factory.mktemp("debian13")
    _inventory(work / "inventory")
    (work / "reports").mkdir()
    mounts = {
        str(ansible_cores.install(ansible_cores.NEWEST)): f"{ansible_cores.CONTAINER_DIR}:ro",
        str(STANDINS): "/srv/standins:ro",
        str(STANDINS_12): "/srv/standins-12:ro",
        str(work): WORK,
        # The controller's CA bundle is this machine's (the sandbox's tf_venv_pip_ca_bundle, copied into
        # each venv): the snapshot's venvs hold this one.
        "/etc/ssl/certs/ca-certificates.crt": "/etc/ssl/certs/ca-certificates.crt:ro",
    }
    options = [arg for source, target in mounts.items() for arg in ("-v", f"{source}:{target}")]
    name = start_container("gpu-debian13", *options, image=IMAGE)
    tarball = _tarball(work)
    installed = _in(
        name, "galaxy", "collection", "install", "--offline", "-p", f"{WORK}/collections", f"{WORK}/{tarball.name}"
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    yield {"name": name, "work": work}
    stop_container(name)


def _in(name: str, tool: str, *args: str, timeout: int = 1500, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python3 -m ansible <tool> <args>`` in the container, with ansible-core 2.21 and the installed collection
    (no PYTHONPATH: the local connection would pass it on to the host's Python commands)."""
    env = {
        "ANSIBLE_COLLECTIONS_PATH": f"{WORK}/collections",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        **(env or {}),
    }
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    argv = [
        "podman",
        "exec",
        "-w",
        WORK,
        *env_args,
        name,
        *ansible_cores.launch(tool, ansible_cores.CONTAINER_DIR),
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _site(host: dict) -> subprocess.CompletedProcess:
    return _in(host["name"], "playbook", "gpu_fleet.tf_hosts.site", "-i", f"{WORK}/inventory")


def _recap(output: str) -> tuple[int, ...]:
    found = [tuple(int(x) for x in m.groups()[1:]) for m in RECAP.finditer(output) if m.group(1) == HOST]
    assert found, output[-3000:]
    return found[-1]


@pytest.fixture(scope="module")
def converged(host):
    first = _site(host)
    second = _site(host) if first.returncode == 0 else None
    return {"first": first, "second": second, **host}


def test_the_controller_is_ansible_core_2_21_on_python_3_13(host):
    version = _in(host["name"], "playbook", "--version")
    assert version.returncode == 0, version.stderr
    assert re.search(r"core 2\.21\.\d+", version.stdout), version.stdout
    assert re.search(r"python version = 3\.13\.", version.stdout), version.stdout


def test_site_converges_and_verifies_the_debian_13_host(converged):
    first = converged["first"]
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    _ok, changed, unreachable, failed = _recap(first.stdout)
    assert (unreachable, failed) == (0, 0) and changed > 0
    latest = converged["work"] / "reports" / "inventory" / "latest" / "fleet-report.json"
    report = json.loads(latest.read_text())
    entry = report["hosts"][HOST]
    assert entry["status"] == "PASS", json.dumps(entry, indent=1)[:3000]
    text = json.dumps(entry)
    assert "2.20.0" in text and "12.5" in text and "9.3" in text, text[:3000]


def test_a_second_run_changes_nothing(converged):
    second = converged["second"]
    assert second is not None, "the first run failed"
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-2000:]
    assert _recap(second.stdout)[1:] == (0, 0, 0), second.stdout[-6000:]


def test_the_venv_runs_python_3_13(converged):
    probe = subprocess.run(
        ["podman", "exec", converged["name"], "sh", "-c", "/opt/tensorflow/2.20/bin/python -c 'import sys; print(sys.version)'"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert probe.returncode == 0 and probe.stdout.startswith("3.13."), probe.stdout + probe.stderr


def _sh(name: str, script: str, data: str | None = None) -> str:
    done = subprocess.run(
        ["podman", "exec", "-i", name, "sh", "-c", script], input=data, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{script}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def over_ssh(host):
    """The sandbox's Debian 12 host from the converged snapshot, with sshd (Debian's openssh-server), and an
    inventory that reaches it from the Debian 13 controller over SSH with a key of the test's own."""
    name = start_converged("gpu-ssh12")
    retry.apt_install(host["name"], "openssh-client")
    retry.apt_install(name, "openssh-server")
    _sh(name, "mkdir -p /run/sshd /root/.ssh")
    _sh(host["name"], f"ssh-keygen -q -t ed25519 -N '' -f {WORK}/id_ed25519")
    _sh(
        name,
        "cat >/root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys",
        (host["work"] / "id_ed25519.pub").read_text(),
    )
    _sh(name, "/usr/sbin/sshd")
    address = subprocess.run(
        ["podman", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", name], capture_output=True, text=True, check=True
    ).stdout.strip()
    folder = host["work"] / "inventory-ssh"
    group_vars = yaml.safe_load((ROOT / "inventories/sandbox/group_vars/gpu_hosts.yml").read_text())
    group_vars.update(
        gpu_artifacts_controller_dir="/srv/standins-12",
        gpu_preflight_manifest_overlays=["/srv/standins-12/artifacts.yml"],
        gpu_verify_report_dir=f"{WORK}/reports-ssh",
    )
    (folder / "group_vars").mkdir(parents=True)
    (folder / "group_vars" / "gpu_hosts.yml").write_text(yaml.safe_dump(group_vars))
    ssh = {"ansible_host": address, "ansible_user": "root", "ansible_ssh_private_key_file": f"{WORK}/id_ed25519"}
    (folder / "hosts.yml").write_text(yaml.safe_dump({"gpu_hosts": {"hosts": {"sandbox12": ssh}}}))
    run = _in(
        host["name"],
        "playbook",
        "gpu_fleet.tf_hosts.site",
        "-i",
        f"{WORK}/inventory-ssh",
        env={"ANSIBLE_HOST_KEY_CHECKING": "False"},
    )
    yield {"run": run, "work": host["work"]}
    stop_container(name)


def test_the_sandbox_host_over_ssh_passes_and_nothing_changes(over_ssh):
    run = over_ssh["run"]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    found = [m.groups()[1:] for m in RECAP.finditer(run.stdout) if m.group(1) == "sandbox12"]
    assert found and found[-1][1:] == ("0", "0", "0"), run.stdout[-6000:]
    report = json.loads(
        (over_ssh["work"] / "reports-ssh" / "inventory-ssh" / "latest" / "fleet-report.json").read_text()
    )
    assert report["hosts"]["sandbox12"]["status"] == "PASS", json.dumps(report["hosts"]["sandbox12"])[:3000]
