"""GPU containers through CDI (role gpu_containers) on a converged sandbox host, and a real Podman that runs a
container from the specification the role wrote.

The toolkit's four packages come from a test-only signed apt repository in the host, given to the role as a site
mirror with its key (the stand-in nvidia-ctk of tests/fixtures/nvidia_ctk packaged as nvidia-container-toolkit
1.17.8-1, the others empty), so the role runs its repository and package path as with NVIDIA's repository; the
host's GPU device files are stand-in character devices, and a stand-in dockerd makes the role configure Docker.
Shows: preflight stops a CDI folder that is a file; --check writes nothing; the driver phase installs the pinned packages, holds them,
writes /etc/cdi/nvidia.yaml, turns on Docker's CDI feature and leaves Docker running while a container runs (the restart
waits, and is done once none runs); a rerun changes nothing; a new driver user space or other GPU UUIDs regenerate it; playbooks/verify.yml
passes and fails the host when the specification misses a GPU; this machine's Podman runs
`--device nvidia.com/gpu=all` from the copied specification (in a private mount namespace, with the
specification's device files and libraries overlaid) and lists the GPUs' device files and libcuda inside.
About 1.5 to 3 minutes on the 2-core machine, with the load.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from ansible_run import latest_report
from sandbox_hosts import ROOT, sandbox_inventory, site, start_converged, stop_container

pytestmark = pytest.mark.integration

STANDIN = ROOT / "tests/fixtures/nvidia_ctk/nvidia-ctk"
PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
VERSION = "1.17.8-1"
NODES = {"/dev/nvidia0": 0, "/dev/nvidia1": 1, "/dev/nvidiactl": 255}
IMAGE = "localhost/gpu-sandbox-debian:12"
SPEC = "/etc/cdi/nvidia.yaml"
DOCKER_PENDING = "/var/lib/gpu-fleet/gpu-containers-docker-restart"


def _repo(folder: Path) -> Path:
    """A flat apt repository of the four packages (dpkg-deb, dpkg-scanpackages)."""
    repo = folder / "repo"
    repo.mkdir(parents=True)
    for name in PACKAGES:
        tree = folder / name
        (tree / "DEBIAN").mkdir(parents=True)
        (tree / "DEBIAN/control").write_text(
            f"Package: {name}\nVersion: {VERSION}\nArchitecture: amd64\nMaintainer: tests\n"
            f"Description: test fixture standing in for NVIDIA's {name}\n"
        )
        if name == "nvidia-container-toolkit":
            (tree / "usr/bin").mkdir(parents=True)
            shutil.copy(STANDIN, tree / "usr/bin/nvidia-ctk")
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "--build", str(tree), str(repo)], check=True, capture_output=True
        )
    packages = subprocess.run(["dpkg-scanpackages", "."], cwd=repo, check=True, capture_output=True, text=True).stdout
    (repo / "Packages").write_text(packages)
    _sign(folder, repo, packages.encode())
    return repo


def _sign(folder: Path, repo: Path, packages: bytes) -> None:
    """The repository signed as a mirror of NVIDIA's is (an InRelease file; its key as a file on the controller)."""
    home = folder / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--passphrase", "", "--pinentry-mode", "loopback"]
    subprocess.run(
        [*gpg, "--quick-gen-key", "gpu-fleet test repository", "ed25519", "sign", "never"],
        check=True,
        capture_output=True,
    )
    subprocess.run([*gpg, "--armor", "--output", str(folder / "key.asc"), "--export"], check=True, capture_output=True)
    digest = hashlib.sha256(packages).hexdigest()
    (folder / "Release").write_text(
        f"Origin: tests\nSuite: stable\nCodename: stable\nArchitectures: amd64\nDate: Mon, 07 Dec 2026 00:00:00 UTC\n"
        f"SHA256:\n {digest} {len(packages)} Packages\n"
    )
    subprocess.run(
        [*gpg, "--clearsign", "--output", str(repo / "InRelease"), str(folder / "Release")],
        check=True,
        capture_output=True,
    )


def _exec(host: str, script: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", host, "sh", "-c", script], capture_output=True, text=True, check=check)


def _prepare(host: str, repo: Path) -> None:
    """The mirror in the host, the GPUs' stand-in device files, a stand-in dockerd (the role only looks for it) and a
    stand-in docker whose `docker ps -q` prints /srv/docker-ps (a running container's id, at first)."""
    subprocess.run(["podman", "cp", str(repo), f"{host}:/srv/nvidia-ctk-repo"], check=True)
    nodes = " && ".join(f"mknod {path} c 195 {minor}" for path, minor in NODES.items())
    _exec(
        host, f"{nodes} && printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/dockerd && chmod 755 /usr/local/bin/dockerd"
    )
    _exec(
        host, "echo 3f2a9c1d0b7e > /srv/docker-ps && printf '#!/bin/sh\\ncat /srv/docker-ps\\n' > /usr/local/bin/docker"
    )
    _exec(host, "chmod 755 /usr/local/bin/docker")


def _changed(run: subprocess.CompletedProcess) -> int:
    recap = [line for line in run.stdout.splitlines() if "changed=" in line and "ok=" in line]
    return sum(int(line.split("changed=")[1].split()[0]) for line in recap)


# Run in a private mount namespace: overlays on /etc (the specification in /etc/cdi, which this Podman 4.3 reads; it
# has no --cdi-spec-dir), /dev (the GPUs' stand-in device files) and each top folder of the files the specification
# mounts (copied out of the host) are seen by this Podman only, and gone when it ends.
PODMAN = textwrap.dedent(
    """\
    set -e
    t=$1; f=$1/../files
    overlay() {{ mkdir -p "$t/$2/u" "$t/$2/w"; mount -t overlay overlay -o lowerdir="$1",upperdir="$t/$2/u",workdir="$t/$2/w" "$1"; }}
    mount -t tmpfs tmpfs "$t"
    overlay /etc etc; mkdir -p /etc/cdi; cp "$t/../spec.yaml" /etc/cdi/nvidia.yaml
    overlay /dev dev; {nodes}
    for d in $(ls "$f"); do overlay "/$d" "top-$d"; cp -a "$f/$d/." "/$d/"; done
    podman run --rm --runtime=runc --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 --device nvidia.com/gpu=all \\
      {image} sh -c 'ls /dev; ls /usr/lib/x86_64-linux-gnu'
    """
)


def _podman_from_spec(folder: Path, host: str, spec_text: str) -> subprocess.CompletedProcess:
    """This machine's Podman runs a container with every GPU from the host's specification."""
    folder.mkdir()
    (folder / "spec.yaml").write_text(spec_text)
    files = folder / "files"
    spec = yaml.safe_load(spec_text)
    for mount in spec["containerEdits"]["mounts"]:
        target = files / mount["hostPath"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["podman", "cp", f"{host}:{mount['hostPath']}", str(target)], check=True)
    nodes = "; ".join(f"mknod {path} c 195 {minor} 2>/dev/null || true" for path, minor in NODES.items())
    (folder / "t").mkdir()
    script = PODMAN.format(nodes=nodes, image=IMAGE)
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(folder / "t")],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_gpu_containers_cdi(tmp_path):
    repo = _repo(tmp_path / "debs")
    host = start_converged("gpu-cdi", "--cap-add=MKNOD")
    try:
        _prepare(host, repo)
        inventory = sandbox_inventory(tmp_path / "inventory", host)
        mirror = {
            "gpu_containers_enabled": True,
            "gpu_containers_repository_url": "file:/srv/nvidia-ctk-repo",
            "gpu_containers_repository_key": str(tmp_path / "debs/key.asc"),
        }
        on = ["-e", json.dumps(mirror)]
        reports = ["-e", f"gpu_verify_report_dir={tmp_path / 'reports'}"]

        _exec(host, "mkdir -p /srv && touch /srv/cdi-file")
        bad = site(inventory, *on, "-e", "gpu_containers_cdi_dir=/srv/cdi-file", playbook="playbooks/preflight.yml")
        assert bad.returncode != 0
        assert "gpu_containers_cdi_dir /srv/cdi-file is a file" in bad.stdout and "Move the file away" in bad.stdout

        # Check mode on a host without the toolkit: the plan, nothing written.
        checked = site(inventory, *on, "--check", playbook="playbooks/driver.yml")
        assert checked.returncode == 0, checked.stdout[-4000:]
        assert (
            _exec(host, f"ls {SPEC} /etc/apt/sources.list.d/nvidia-container-toolkit.list", check=False).returncode != 0
        )

        first = site(inventory, *on, playbook="playbooks/driver.yml")
        assert first.returncode == 0, first.stdout[-4000:]
        held = _exec(host, "apt-mark showhold; dpkg-query -W nvidia-container-toolkit").stdout
        assert set(PACKAGES) <= set(held.split()) and VERSION in held
        daemon = json.loads(_exec(host, "cat /etc/docker/daemon.json").stdout)
        assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime" and daemon["features"]["cdi"] is True
        # A container runs: Docker is not restarted, and the run says why and what to do.
        assert "Docker was not restarted: containers run there (docker ps -q: 3f2a9c1d0b7e)" in first.stdout
        _exec(host, f"test -f {DOCKER_PENDING}")
        spec = yaml.safe_load(_exec(host, f"cat {SPEC}").stdout)
        assert spec["kind"] == "nvidia.com/gpu"
        assert [d["name"] for d in spec["devices"]][::2] == ["0", "1", "all"]
        assert any("libcuda.so.520.61.05" in m["hostPath"] for m in spec["containerEdits"]["mounts"])

        again = site(inventory, *on, playbook="playbooks/driver.yml", timeout=600)
        assert again.returncode == 0 and _changed(again) == 0, again.stdout[-4000:]

        # A new driver user space (the record says another version): generated again. No container runs now: the
        # waiting Docker restart is done (none here: no systemd in the sandbox) and forgotten.
        _exec(host, "sed -i 's/520.61.05/520.00.00/' /var/lib/gpu-fleet/gpu-containers-cdi.json && : > /srv/docker-ps")
        regenerated = site(inventory, *on, "--tags", "containers", playbook="playbooks/driver.yml")
        assert "the driver changed from 520.00.00 to 520.61.05" in regenerated.stdout, regenerated.stdout[-3000:]
        assert _exec(host, f"test -e {DOCKER_PENDING}", check=False).returncode != 0
        # The GPUs changed (a MIG layout, a replaced GPU: other UUIDs in nvidia-smi -L): generated again.
        _exec(host, "sed -i 's/\"GPU-/\"GPU-0/' /var/lib/gpu-fleet/gpu-containers-cdi.json")
        gpus = site(inventory, *on, "--tags", "containers", playbook="playbooks/driver.yml")
        reason = "Generate the CDI specification (the GPUs or their MIG devices changed)"
        assert reason in gpus.stdout, gpus.stdout[-3000:]

        verified = site(inventory, *on, *reports, playbook="playbooks/verify.yml")
        assert verified.returncode == 0, verified.stdout[-4000:]

        spec_text = _exec(host, f"cat {SPEC}").stdout
        podman = _podman_from_spec(tmp_path / "podman", host, spec_text)
        assert podman.returncode == 0, podman.stderr[-3000:]
        seen = podman.stdout.split()
        assert {"nvidia0", "nvidia1", "nvidiactl", "libcuda.so.520.61.05", "libnvidia-ml.so.520.61.05"} <= set(seen)

        # A GPU the specification lacks: the verification fails the host and says why.
        _exec(host, "mknod /dev/nvidia2 c 195 2")
        failed = site(inventory, *on, *reports, playbook="playbooks/verify.yml")
        assert failed.returncode != 0
        report = json.loads(latest_report(tmp_path / "reports", "inventory").read_text())
        assert report["hosts"][host]["status"] == "FAIL"
        assert "names GPUs 0, 1 (all: True) but the host has 3 GPU device files" in json.dumps(report)
    finally:
        stop_container(host)
