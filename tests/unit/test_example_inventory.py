"""The example fleet inventory parses cleanly: only hosts and groups, no stray files read as inventory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_INVENTORY = str(Path(sys.executable).with_name("ansible-inventory"))


def _inventory(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(
        [ANSIBLE_INVENTORY, "-i", str(ROOT / "inventories/gpu_hosts"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )


def _groups_in(tree: dict) -> set[str]:
    groups = set()
    for name, body in (tree or {}).items():
        groups.add(name)
        groups |= _groups_in((body or {}).get("children"))
    return groups


def test_example_inventory_has_only_its_own_groups_and_no_warnings():
    run = _inventory("--list")
    assert run.returncode == 0, run.stderr
    assert "WARNING" not in run.stderr.upper(), run.stderr
    groups = {name for name in json.loads(run.stdout) if name not in ("_meta", "all", "ungrouped")}
    assert groups == _groups_in(yaml.safe_load((ROOT / "inventories/gpu_hosts/hosts.yml").read_text()))


def test_example_overlay_manifest_resolves_to_a_file_outside_the_inventory():
    host = next(iter(json.loads(_inventory("--list").stdout)["_meta"]["hostvars"]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [str(Path(sys.executable).with_name("ansible")), host, "-i", str(ROOT / "inventories/gpu_hosts")]
    run = subprocess.run(
        [*argv, "-m", "ansible.builtin.debug", "-a", "var=gpu_preflight_manifest_overlays", "-o"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    overlays = json.loads(run.stdout.split("=>", 1)[1])["gpu_preflight_manifest_overlays"]
    for overlay in overlays:
        path = Path(overlay).resolve()
        assert path.is_file(), overlay
        assert ROOT / "inventories" not in path.parents, f"{path} would be read as inventory"


def test_sandbox_finds_the_stand_ins_from_a_playbook_in_any_folder(tmp_path):
    """The sandbox's stand-in paths do not depend on where the playbook lives (a user's own playbook
    outside playbooks/ once looked for them next to itself)."""
    playbook = tmp_path / "elsewhere" / "mine.yml"
    playbook.parent.mkdir()
    playbook.write_text(
        "- hosts: gpu_hosts\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        '        msg: "{{ [gpu_artifacts_controller_dir] + gpu_preflight_manifest_overlays }}"\n'
        "      delegate_to: localhost\n"
    )
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_STDOUT_CALLBACK="json"
    )
    run = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            "-i",
            str(ROOT / "inventories/sandbox"),
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(run.stdout)["plays"][0]["tasks"][0]["hosts"]["gpu-sandbox"]
    paths = [os.path.realpath(path) for path in result["msg"]]
    assert paths == [str(ROOT / "build/standins"), str(ROOT / "build/standins/artifacts.yml")]
