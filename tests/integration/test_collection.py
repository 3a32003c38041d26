"""The collection as users get it: built and installed, run by FQCN from an unrelated folder; then,
on the host it converged, every phase tag and every role tag of the clone's site.yml alone.

Installed and run under the oldest ansible-core the collection supports (meta/runtime.yml; 2.16, what
Automation Platform 2.5 ships), from tests/ansible_cores.py's folder; the newest runs in
tests/integration/test_debian13.py.

One fresh sandbox container serves the whole module: the installed collection's site converges
it, a user's own playbook that applies the roles by FQCN re-checks it (nothing changes), and the
tag runs reuse it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import ansible_cores
import pytest
import yaml
from ansible_run import latest_report
from sandbox_hosts import ROOT, SMALL_STANDINS, site, small_inventory, start_container, stop_container
from snapshots import SMALL_GROUP_VARS

FQCN = "gpu_fleet.tf_hosts"
BIN = Path(sys.executable).parent
CORE = ansible_cores.OLDEST
ROLE_TASK = re.compile(r"^TASK \[" + re.escape(FQCN) + r"\.(\w+) : (?!Validating arguments)(.*?)\]", re.MULTILINE)
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)

# What each tag may run. The resolution of the stacks (gpu_preflight's `stacks` entry point) runs
# with any tag; the installers push and remove their NVIDIA files themselves (action gpu_artifact).
STACKS = "gpu_preflight"
PHASES = {
    "preflight": {
        "gpu_preflight",
        "gpu_artifacts",
        "gpu_verify",
        "gpu_health",
        "nvidia_driver",
        "cuda_toolkit",
        "tf_venv",
    },
    "driver": {"nvidia_driver", STACKS},
    "cuda": {"cuda_toolkit", "cudnn", "gpu_env", STACKS},
    "tensorflow": {"tf_venv", STACKS},
    "verify": {"gpu_verify", "gpu_health", STACKS},
}
ROLE_TAGS = {
    "gpu_preflight": {"gpu_preflight", "gpu_artifacts"},
    "gpu_artifacts": {"gpu_artifacts", STACKS},
    "nvidia_driver": {"nvidia_driver", STACKS},
    "cuda_toolkit": {"cuda_toolkit", STACKS},
    "cudnn": {"cudnn", STACKS},
    "gpu_env": {"gpu_env", STACKS},
    "tf_venv": {"tf_venv", STACKS},
    "gpu_verify": {"gpu_verify", STACKS},
    "gpu_health": {"gpu_health", STACKS},
}
OWN = {
    "preflight": {"gpu_preflight"},
    "driver": {"nvidia_driver"},
    "cuda": {"cuda_toolkit", "cudnn", "gpu_env"},
    "tensorflow": {"tf_venv"},
    "verify": {"gpu_verify", "gpu_health"},
}
# Tasks of gpu_preflight's full host check: they run only under its own tags.
HOST_CHECK_TASKS = (
    "Look at the mounts, installers, GPU processes and what is installed",
    "Stop this host before any change, with every problem found",
)


def _ansible(tool: str) -> list[str]:
    """``ansible-<tool>`` of the oldest supported ansible-core, run by this Python 3.11."""
    return ansible_cores.launch(tool, str(ansible_cores.install(CORE)), python=sys.executable)


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _recap(output: str) -> dict[str, tuple[int, ...]]:
    return {m.group(1): tuple(int(x) for x in m.groups()[1:]) for m in RECAP.finditer(output)}


def _report_status(report_dir: Path, host: str) -> str | None:
    report = json.loads(latest_report(report_dir, "inventory").read_text())
    return (report["hosts"].get(host) or {}).get("status")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Build the collection, install it into a temporary folder; returns the paths and a clean
    environment (no project ansible.cfg)."""
    work = tmp_path_factory.mktemp("collection")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_HOME=str(work / "ansible-home"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="False")
    # The sandbox host's connection, podman_pipelined, is the clone's and not in the tarball: a user's
    # inventory would name containers.podman.podman instead.
    env["ANSIBLE_CONNECTION_PLUGINS"] = str(ROOT / "tests/plugins/connection")
    built = _run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work), str(ROOT)], work, env)
    assert built.returncode == 0, built.stdout + built.stderr
    tarball = next(work.glob("gpu_fleet-tf_hosts-*.tar.gz"))
    target = work / "collections"
    done = _run([*_ansible("galaxy"), "collection", "install", "--offline", "-p", str(target), str(tarball)], work, env)
    assert done.returncode == 0, done.stdout + done.stderr
    env["ANSIBLE_COLLECTIONS_PATH"] = str(target)
    return {"work": work, "tarball": tarball, "env": env}


def test_the_tarball_leaves_out_tests_molecule_and_build_outputs(installed):
    with tarfile.open(installed["tarball"]) as archive:
        tops = {name.split("/")[0] for name in archive.getnames()}
    assert {"roles", "playbooks", "plugins", "data", "files", "meta", "site.yml", "MANIFEST.json"} <= tops
    assert not tops & {"tests", "molecule", "build", "reports", "collections", ".venv", "tools", ".git"}


def test_the_installed_collection_runs_under_the_oldest_supported_ansible_core(installed):
    version = _run([*_ansible("playbook"), "--version"], installed["work"], installed["env"])
    assert version.returncode == 0, version.stderr
    assert re.search(r"core " + re.escape(CORE) + r"\.\d+", version.stdout), version.stdout


@pytest.fixture(scope="module")
def converged(installed):
    """A fresh sandbox host converged by ``ansible-playbook gpu_fleet.tf_hosts.site`` run from a
    folder with no ansible.cfg, against an inventory of the user's own."""
    name = start_container("gpu-collection")
    work = installed["work"]
    inventory = work / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(
        f"gpu_hosts:\n  hosts:\n    {name}:\n      ansible_connection: podman_pipelined\n"
    )
    # The sandbox's variables with the small stand-ins' (tests/fixtures/inventory/small), the paths
    # written out: this inventory is the user's own, outside the clone.
    group_vars = {}
    for part in sorted((SMALL_GROUP_VARS / "gpu_hosts").glob("*.yml")):
        group_vars.update(yaml.safe_load(part.read_text()))
    group_vars.update(
        gpu_artifacts_controller_dir=str(SMALL_STANDINS),
        gpu_preflight_manifest_overlays=[str(SMALL_STANDINS / "artifacts.yml")],
        gpu_verify_report_dir=str(work / "reports"),
    )
    (inventory / "group_vars" / "gpu_hosts.yml").write_text(yaml.safe_dump(group_vars))
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    run = _run([*_ansible("playbook"), f"{FQCN}.site", "-i", str(inventory)], elsewhere, installed["env"])
    yield {"name": name, "inventory": inventory, "run": run, "elsewhere": elsewhere}
    stop_container(name)


def test_installed_site_converges_a_fresh_host_by_fqcn(converged):
    run = converged["run"]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert _report_status(converged["inventory"].parent / "reports", converged["name"]) == "PASS"


def test_a_users_own_playbook_applies_the_roles_by_fqcn(converged, installed):
    playbook = converged["elsewhere"] / "my-gpu-hosts.yml"
    roles = [
        "gpu_preflight",
        "gpu_artifacts",
        "nvidia_driver",
        "cuda_toolkit",
        "cudnn",
        "gpu_env",
        "tf_venv",
        "gpu_health",
        "gpu_verify",
    ]
    # As docs/usage.md shows: the stack model first, from the installed collection's playbooks/tasks/stacks.yml.
    stacks = {
        "name": "Resolve the pinned stacks",
        "ansible.builtin.include_tasks": {
            "file": f"{{{{ lookup('{FQCN}.collection_path', 'playbooks/tasks/stacks.yml') }}}}",
            "apply": {"tags": ["always"]},
        },
        "tags": ["always"],
    }
    play = [
        {
            "name": "My GPU hosts",
            "hosts": "gpu_hosts",
            "become": True,
            "pre_tasks": [stacks],
            "roles": [f"{FQCN}.{r}" for r in roles],
        }
    ]
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    run = _run(
        [*_ansible("playbook"), str(playbook), "-i", str(converged["inventory"])],
        converged["elsewhere"],
        installed["env"],
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert _recap(run.stdout)[converged["name"]][1] == 0, "a converged host changed"
    assert _report_status(converged["inventory"].parent / "reports", converged["name"]) == "PASS"


@pytest.mark.parametrize("tag", [*PHASES, *ROLE_TAGS])
def test_each_tag_runs_alone_on_a_provisioned_host(converged, tag, tmp_path):
    assert converged["run"].returncode == 0, "the host was not converged"
    inventory = small_inventory(tmp_path / "inventory", converged["name"])
    run = site(inventory, "--tags", tag, "-e", f"gpu_verify_report_dir={tmp_path / 'reports'}")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert _recap(run.stdout)[converged["name"]][1] == 0, "a tag run changed a converged host"
    seen = {role for role, _ in ROLE_TASK.findall(run.stdout)}
    allowed = PHASES.get(tag) or ROLE_TAGS[tag]
    assert seen <= allowed, f"--tags {tag} ran tasks of {sorted(seen - allowed)}"
    own = OWN.get(tag, {tag})
    assert own <= seen, f"--tags {tag} ran no task of {sorted(own - seen)}"
    if tag not in ("preflight", "gpu_preflight"):
        assert not [t for t in HOST_CHECK_TASKS if t in run.stdout], "the full host check ran outside its tags"


BUSY = """
import json
path = "/etc/nvidia-standin/gpus.json"
data = json.load(open(path))
data["compute_apps"] = [{"pid": 4242, "process_name": "python3", "gpu_uuid": data["gpus"][0]["uuid"],
                         "used_memory_mib": 1024}]
json.dump(data, open(path, "w"))
"""


def test_the_driver_is_not_reinstalled_under_running_jobs(converged, tmp_path):
    """A driver install that lost its completion record is reinstalled, but never under a running
    job: the host stops before the driver is touched and names the process. Runs last (it leaves
    the host with a job until it puts things back)."""
    assert converged["run"].returncode == 0, "the host was not converged"
    name = converged["name"]
    record = "/var/lib/gpu_fleet/nvidia_driver.done"
    version = subprocess.run(
        ["podman", "exec", name, "cat", record], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["podman", "exec", name, "cp", "/etc/nvidia-standin/gpus.json", "/root/gpus.json.saved"], check=True)
    subprocess.run(["podman", "exec", name, "sh", "-c", f"rm {record} && python3 -c '{BUSY}'"], check=True)
    inventory = small_inventory(tmp_path / "inventory", converged["name"])
    try:
        run = site(inventory, "--tags", "nvidia_driver")
        assert run.returncode != 0
        assert "The driver would be (re)installed while GPUs run compute processes: python3 pid 4242." in run.stdout
        assert "Drain the host (stop those jobs) and rerun" in run.stdout
        assert "TASK [gpu_fleet.tf_hosts.nvidia_driver : Run NVIDIA's driver installer]" not in run.stdout
    finally:
        subprocess.run(
            [
                "podman",
                "exec",
                name,
                "sh",
                "-c",
                # The record has two lines (version, method): printf keeps them as they were.
                f"mv /root/gpus.json.saved /etc/nvidia-standin/gpus.json && printf '%s\\n' {shlex.quote(version)} > {record}",
            ],
            check=True,
        )
