"""Switching the default stack, after test_multi_stack.py, on the same host.

Each step runs the real site.yml with tf2.18 declared the default (the host serves tf2.12):

1. Its cuDNN archive pinned with another sha256 (a manifest overlay): the stack is held back, tf2.12
   stays the default and is verified, and the run fails naming the archive.
2. Its libcudnn swapped on the host for tf2.12's 8.6 one, so that it installs but fails verification:
   no switch, tf2.12 stays the default, the run fails saying so.
3. Its library restored, but another libcudnn.so.9 (cuDNN 9.1.0) first on the system library path:
   it verifies through its binding, takes over, fails the check through the system library path,
   and tf2.12 is put back.
4. That library gone, playbooks/verify.yml alone: it verifies, but verify.yml only reads the host, so
   the pointers still serve tf2.12 and the run and the report name tf2.18 as pending.
5. site.yml: it verifies, becomes the default (/usr/local/cuda, the loader cache,
   /etc/tf-stacks/default) and is checked again through the system library path.

The steps depend on each other and run in this order (pytest keeps a module's order); the host then
serves tf2.18, which side_effect.yml relies on when it removes tf2.12.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import latest_report, run_playbook
from helpers import load_builder

HOST = "molecule-gpu-multi_stack"
OLD, NEW = "tf2.12", "tf2.18"
NEW_CUDNN = "cudnn-linux-x86_64-9.3.0.75_cuda12-archive.tar.xz"
STANDINS = ROOT / "build/standins-multi"
INVENTORY = "inventory"
BACKUP = "/root/libcudnn-tf2.18.saved"
SHADOW = "/opt/shadow-cudnn"  # another cuDNN 9, first in ld.so.conf.d (step 3)
SHADOW_CONF = "/etc/ld.so.conf.d/00-shadow-cudnn.conf"


def podman_exec(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", HOST, *argv], capture_output=True, text=True)


def host_sh(script: str) -> str:
    done = podman_exec("sh", "-ec", script)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """An inventory of the scenario's host with its host_vars, and a report folder."""
    top = tmp_path_factory.mktemp("switch")
    inventory = top / INVENTORY
    inventory.mkdir()
    hosts = {"gpu_hosts": {"hosts": {HOST: {"ansible_connection": "podman_pipelined"}}}}
    (inventory / "hosts.yml").write_text(json.dumps(hosts))
    (inventory / "group_vars").symlink_to(ROOT / "inventories/sandbox/group_vars")
    (inventory / "host_vars").symlink_to(ROOT / "molecule/multi_stack/host_vars")
    return top


def site(workdir: Path, playbook: str = "site.yml", **extra) -> tuple[subprocess.CompletedProcess, dict]:
    """``playbook`` with NEW declared the default (plus ``extra``); the run and its fleet report."""
    variables = {"gpu_preflight_default_stack": NEW, "gpu_verify_report_dir": str(workdir / "reports"), **extra}
    (workdir / "extra.json").write_text(json.dumps(variables))
    run = run_playbook(playbook, workdir / INVENTORY, "-e", f"@{workdir / 'extra.json'}", timeout=900)
    report = latest_report(workdir / "reports", INVENTORY)
    assert report.exists(), run.stdout[-6000:]
    return run, json.loads(report.read_text())["hosts"][HOST]


def served() -> dict:
    """What the host's default pointers serve."""
    return {
        "cuda": host_sh("readlink /usr/local/cuda"),
        "registry": host_sh("readlink /etc/tf-stacks/default"),
        "ld_conf": host_sh("grep -v '^#' /etc/ld.so.conf.d/gpu-env.conf"),
        "cache": sorted(
            {
                line.split("=> ")[-1].rsplit("/", 2)[0]
                for line in host_sh("ldconfig -p").splitlines()
                if "libcudart.so" in line
            }
        ),
    }


OLD_SERVED = {
    "cuda": "/usr/local/cuda-11.8",
    "registry": f"{OLD}.env",
    "ld_conf": "/usr/local/cuda-11.8/lib64",
    "cache": ["/usr/local/cuda-11.8"],
}


def rows(entry: dict) -> dict:
    """The report's rows by stack (a row's ``host`` reads ``<host> (<stack>)``)."""
    return {row["host"].removeprefix(f"{HOST} (").removesuffix(")"): row for row in entry["rows"]}


@pytest.fixture(scope="module")
def bad_checksum(workdir):
    """Step 1: NEW's cuDNN archive pinned with another sha256."""
    manifest = yaml.safe_load((STANDINS / "artifacts.yml").read_text())
    entry = dict(manifest["artifacts"][NEW_CUDNN], sha256="0" * 64)
    overlay = workdir / "bad-checksum.yml"
    overlay.write_text(yaml.safe_dump({"artifacts": {NEW_CUDNN: entry}}))
    overlays = [str(STANDINS / "artifacts.yml"), str(overlay)]
    return site(workdir, gpu_preflight_manifest_overlays=overlays)


def test_a_stack_with_a_bad_checksum_is_held_back_and_the_default_stays(bad_checksum):
    run, entry = bad_checksum
    assert run.returncode != 0
    # A warning (the action gpu_stacks's), which Ansible prints on stderr, wrapped.
    warned = " ".join(run.stderr.split())
    assert f"Held back on {HOST}" in warned and f"the default stays {OLD}" in warned
    assert f"{NEW_CUDNN} has sha256" in run.stdout and "0" * 64 in run.stdout
    assert served() == OLD_SERVED
    by_stack = rows(entry)
    assert entry["status"] == "FAIL" and by_stack[OLD]["status"] == "PASS"
    problem = next(p for p in entry["problems"] if p["stack"] == f"{HOST} ({NEW})")
    assert problem["check"] == "artifacts" and NEW_CUDNN in problem["cause"]


@pytest.fixture(scope="module")
def failed_verification(workdir, bad_checksum):
    """Step 2: NEW's libcudnn replaced by OLD's on the host (it still installs, but is cuDNN 8.6)."""
    host_sh(
        f'new=$(readlink -f /usr/local/cuda-12.5/lib64/libcudnn.so.9); cp -p "$new" {BACKUP};'
        ' cp -f $(readlink -f /usr/local/cuda-11.8/lib64/libcudnn.so.8) "$new"'
    )
    return site(workdir)


def test_a_default_that_fails_verification_is_not_switched_to(failed_verification):
    run, entry = failed_verification
    assert run.returncode != 0
    assert f"The default stays {OLD}: the declared default {NEW} did not pass verification" in run.stdout
    assert f"The default stays {OLD}; {NEW} becomes the default once it verifies. Stack {NEW}" in run.stdout
    assert served() == OLD_SERVED
    by_stack = rows(entry)
    assert by_stack[OLD]["status"] == "PASS" and by_stack[NEW]["status"] != "PASS"
    assert any(note.startswith(f"default stays {OLD}") for note in entry["mode_notes"]), entry["mode_notes"]


@pytest.fixture(scope="module")
def rolled_back(workdir, failed_verification):
    """Step 3: NEW's libcudnn put back; a stand-in cuDNN 9.1.0 in SHADOW, ahead of every toolkit in
    the loader cache (ld.so.conf.d reads 00-shadow-cudnn.conf before gpu-env.conf)."""
    host_sh(f"cp -pf {BACKUP} $(readlink -f /usr/local/cuda-12.5/lib64/libcudnn.so.9); rm -f {BACKUP}")
    builder = load_builder().Builder(workdir / "build", force=True, driver_cuda_override=None)
    shadow = builder.compile_lib(
        "libcudnn.c",
        workdir / "libcudnn.so.9.1.0",
        "libcudnn.so.9",
        {"STANDIN_CUDNN_VERSION": "90100", "STANDIN_CUDART_VERSION": "12050"},
    )
    copied = subprocess.run(["podman", "cp", str(shadow), f"{HOST}:/tmp/libcudnn.so.9.1.0"], capture_output=True)
    assert copied.returncode == 0, copied.stderr
    host_sh(f"mkdir -p {SHADOW} && mv /tmp/libcudnn.so.9.1.0 {SHADOW}/ && echo {SHADOW} > {SHADOW_CONF} && ldconfig")
    return site(workdir)


def test_a_default_that_fails_through_the_system_path_is_switched_back(rolled_back):
    run, entry = rolled_back
    assert run.returncode != 0
    assert f"The default stays {OLD}; {NEW} becomes the default once it verifies. Stack {NEW}" in run.stdout
    assert served() == OLD_SERVED
    by_stack = rows(entry)
    assert by_stack[OLD]["status"] == "PASS" and by_stack[NEW]["status"] != "PASS"
    causes = " ".join(p["cause"] for p in entry["problems"] if p["stack"] == f"{HOST} ({NEW})")
    assert f"{SHADOW}/libcudnn.so.9" in causes, causes
    assert json.loads(host_sh("tf-stack list --json"))["default"] == OLD


@pytest.fixture(scope="module")
def pending(workdir, rolled_back):
    """Step 4: the other cuDNN gone; playbooks/verify.yml alone."""
    host_sh(f"rm -rf {SHADOW} {SHADOW_CONF} && ldconfig")
    return site(workdir, playbook="playbooks/verify.yml")


def test_verify_alone_leaves_a_verified_new_default_pending(pending):
    run, entry = pending
    assert run.returncode == 0, run.stdout[-6000:]
    assert f"The default stays {OLD}: the declared default {NEW} waits for a run of site.yml" in run.stdout
    assert served() == OLD_SERVED
    assert entry["status"] == "PASS", entry["problems"]
    assert not [note for note in entry["mode_notes"] if note.startswith("default stack switched")]
    assert any(
        note.startswith(f"default stays {OLD}: the declared default {NEW} is pending") for note in entry["mode_notes"]
    )
    assert json.loads(host_sh("tf-stack list --json"))["default"] == OLD


@pytest.fixture(scope="module")
def switched(workdir, pending):
    """Step 5: site.yml."""
    return site(workdir)


def test_a_default_that_verifies_takes_over_every_pointer(switched):
    run, entry = switched
    assert run.returncode == 0, run.stdout[-6000:]
    assert f"Default stack switched: {OLD} -> {NEW}" in run.stdout
    assert served() == {
        "cuda": "/usr/local/cuda-12.5",
        "registry": f"{NEW}.env",
        "ld_conf": "/usr/local/cuda-12.5/lib64",
        "cache": ["/usr/local/cuda-12.5"],
    }
    assert entry["status"] == "PASS", entry["problems"]
    assert f"default stack switched: {OLD} -> {NEW} (verified first)" in entry["mode_notes"]
    # The new default was checked again as every process finds it: its binding off, the loader cache.
    libraries = next(doc for doc in entry["results"] if doc.get("stack") == NEW)
    assert libraries["ok"] is True
    listed = json.loads(host_sh("tf-stack list --json"))
    assert listed["default"] == NEW
