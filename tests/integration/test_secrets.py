"""Mirror credentials stay secret in a -vvv run, and the run leaves nothing world-writable.

A fresh sandbox host fetches its NVIDIA artifacts from a loopback mirror that demands HTTP basic
auth (tests/fixtures/mirror/counting_mirror.py) into an empty controller folder. The user name and
the password are unique strings given in a vars file, as they would come from Ansible Vault. Only
the artifact fetch and the verify phase (which writes the fleet report) run: there is no
TensorFlow venv, so verification fails, but the report is written and must hold neither string,
nor may the run's output at -vvv. A second run gives the credentials inside the mirror URL,
with the mirror unreachable: the error names the URL without them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid

from ansible_run import latest_report
from sandbox_hosts import ROOT, SMALL_STANDINS, site

sys.path.insert(0, str(ROOT / "tests/fixtures/mirror"))

from counting_mirror import CountingMirror

FILES = [
    "NVIDIA-Linux-x86_64-520.61.05.run",
    "cuda_11.8.0_520.61.05_linux.run",
    "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz",
]
# Folders the roles write to on a host; the base image's own world-writable paths (/tmp) are not theirs.
WRITTEN = ["/usr/local", "/opt", "/etc", "/var/cache"]


def leaks(secrets: list[str], texts: dict[str, str]) -> list[str]:
    return [f"{secret!r} in {where}" for where, text in texts.items() for secret in secrets if secret in text]


def test_mirror_credentials_never_show_and_nothing_is_world_writable(fresh_host, tmp_path):
    name, inventory = fresh_host
    user, password = f"user-{uuid.uuid4().hex}", f"pass-{uuid.uuid4().hex}"
    secrets = tmp_path / "vault.yml"
    secrets.write_text(f"gpu_artifacts_mirror_username: {user}\ngpu_artifacts_mirror_password: {password}\n")
    controller, reports = tmp_path / "controller", tmp_path / "reports"
    controller.mkdir()
    with CountingMirror(SMALL_STANDINS, credentials=(user, password)) as mirror:
        run = site(
            inventory,
            "-vvv",
            "--tags",
            "gpu_artifacts,verify",
            "-e",
            f"@{secrets}",
            "-e",
            f"gpu_artifacts_mirror_url={mirror.url}",
            "-e",
            f"gpu_artifacts_controller_dir={controller}",
            "-e",
            f"gpu_verify_report_dir={reports}",
        )
    assert dict(mirror.counts) == dict.fromkeys(FILES, 1), run.stdout[-4000:]
    assert not mirror.refused, "the mirror refused a request: the credentials did not reach it"
    assert latest_report(reports, "inventory").exists(), run.stdout[-4000:]
    # Without a venv, verification fails; the failure must be that one and not a crash.
    assert "failed verification" in run.stdout, run.stdout[-4000:]
    texts = {"stdout": run.stdout, "stderr": run.stderr}
    texts.update({str(p): p.read_text(errors="replace") for p in reports.rglob("*") if p.is_file()})
    assert not leaks([user, password], texts)

    found = subprocess.run(
        ["podman", "exec", name, "find", *WRITTEN, "-xdev", "-perm", "-0002", "!", "-type", "l"],
        capture_output=True,
        text=True,
    )
    assert found.stdout == "", f"world-writable after the run:\n{found.stdout}"


def test_credentials_in_the_mirror_url_stay_out_of_the_error(fresh_host, tmp_path):
    _name, inventory = fresh_host
    user, password = f"user-{uuid.uuid4().hex}", f"pass-{uuid.uuid4().hex}"
    # One file missing, so the unreachable mirror costs one file's retries, not three.
    controller = tmp_path / "controller"
    shutil.copytree(SMALL_STANDINS, controller)
    (controller / FILES[0]).unlink()
    run = site(
        inventory,
        "-vvv",
        "--tags",
        "gpu_artifacts",
        "-e",
        f"gpu_artifacts_mirror_url=http://{user}:{password}@127.0.0.1:9/nvidia/",
        "-e",
        f"gpu_artifacts_controller_dir={controller}",
        playbook="playbooks/preflight.yml",
    )
    assert run.returncode != 0
    assert f"Could not fetch {FILES[0]} from http://127.0.0.1:9/nvidia/{FILES[0]}:" in run.stdout, run.stdout[-4000:]
    assert not leaks([user, password], {"stdout": run.stdout, "stderr": run.stderr})


def test_the_leak_check_finds_a_secret():
    assert leaks(["s3cret"], {"stdout": "url_password=s3cret", "report": "clean"}) == ["'s3cret' in stdout"]
