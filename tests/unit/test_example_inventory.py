"""The example fleet inventory parses cleanly: only hosts and groups, no stray files read as inventory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_stack import resolve_stacks

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


def test_the_example_overlays_placeholders_are_named_as_placeholders_in_that_file():
    """A copy of the example fleet as it comes: its overlay holds the placeholder, which preflight names as one, with
    the file to fill in, rather than a checksum mismatch of a file that is fine."""
    pins = yaml.safe_load((ROOT / "inventories/gpu_hosts/group_vars/gpu_hosts.yml").read_text())
    overlay = ROOT / "manifests/gpu_hosts-artifacts-local.yml"
    manifest = {}
    for path in (ROOT / "data/artifacts.yml", overlay):
        for name, entry in yaml.safe_load(path.read_text())["artifacts"].items():
            manifest[name] = dict(entry, manifest=str(path))
    host = {
        "python_versions": {"/usr/bin/python3": "3.11.2"},
        "default_python": "/usr/bin/python3",
        "driver_version": pins["nvidia_driver_version"],
        "driver_install": True,
        "driver_method": pins["nvidia_driver_method"],
    }
    matrix = yaml.safe_load((ROOT / "data/version_matrix.yml").read_text())
    resolved = resolve_stacks(pins["gpu_preflight_stacks"], matrix, manifest, host)
    assert resolved["messages"] == [
        "tf2.12: cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz has the placeholder "
        f"'replace-with-the-sha256-of-your-file' as its sha256 in {overlay}, not a sha256 (64 hexadecimal digits). "
        "Put the sha256 of the file you downloaded from NVIDIA and checked (`sha256sum "
        "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz` prints it) in its place there; unpinned files are never "
        "installed."
    ]
