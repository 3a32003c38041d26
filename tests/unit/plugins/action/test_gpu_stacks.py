"""gpu_stacks and playbooks/tasks/stacks.yml: the stack model, built from gpu_preflight's inputs and published
once, in real ansible-playbook runs against localhost (the probe and the GPU facts run here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
STACKS = str(ROOT / "playbooks/tasks/stacks.yml")
MODEL = (
    "resolved_stacks",
    "resolved_default",
    "pending_default",
    "held_back",
    "resolved_driver",
    "resolved_absent",
)
TWO = [
    {"name": "tf2.15", "tensorflow": "2.15", "package": "tensorflow-cpu"},
    {"name": "tf2.12", "tensorflow": "2.12", "package": "tensorflow-cpu"},
]


def _pinned(tmp_path: Path) -> str:
    """An overlay manifest that pins every artifact of the collection's manifest (checksums of no real file)."""
    artifacts = yaml.safe_load((ROOT / "data/artifacts.yml").read_text())["artifacts"]
    overlay = tmp_path / "pinned.yml"
    overlay.write_text(yaml.safe_dump({"artifacts": {name: dict(a, sha256="0" * 64) for name, a in artifacts.items()}}))
    return str(overlay)


def _play(tmp_path: Path, variables: dict, tasks: list[dict] | None = None) -> tuple[int, str, dict]:
    """A play that includes stacks.yml (then ``tasks``) and writes what it published to model.json; every
    artifact pinned and a driver new enough for CUDA 12, unless ``variables`` say otherwise."""
    variables = {
        "gpu_preflight_manifest_overlays": [_pinned(tmp_path)],
        "nvidia_driver_version": "535.104.05",
        "gpu_preflight_python": sys.executable,  # a Python 3.11 (this venv's), which every stack here supports
        **variables,
    }
    out = tmp_path / "model.json"
    dump = [f"'gpu_preflight_{name}': gpu_preflight_{name} | default('unset')" for name in MODEL]
    dump.append("'gpu_facts': ansible_facts.gpu_facts | default('unset')")
    content = "{{ {" + ", ".join(dump) + "} | to_json }}"
    write = {"ansible.builtin.copy": {"content": content, "dest": str(out)}}
    include = {"name": "Resolve", "ansible.builtin.include_tasks": STACKS}
    play = {"hosts": "localhost", "gather_facts": True, "vars": variables, "tasks": [include, *(tasks or []), write]}
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    done = localhost_playbook(tmp_path / "play.yml", {"ANSIBLE_HOME": str(tmp_path / ".ansible")})
    model = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, done.stdout + done.stderr, model


def _registry(tmp_path: Path, current: str = "") -> str:
    """A stack registry whose ``default`` link names ``current`` (none: no link)."""
    registry = tmp_path / "registry"
    registry.mkdir()
    if current:
        (registry / "default").symlink_to(f"{current}.env")
    return str(registry)


def test_the_model_is_resolved_on_the_host_and_published(tmp_path):
    rc, out, model = _play(tmp_path, {"gpu_preflight_stacks": TWO, "gpu_preflight_stack_registry": _registry(tmp_path)})
    assert rc == 0, out
    assert [s["name"] for s in model["gpu_preflight_resolved_stacks"]] == ["tf2.15", "tf2.12"]
    assert model["gpu_preflight_resolved_default"]["name"] == "tf2.15"
    assert model["gpu_preflight_pending_default"] is None and model["gpu_preflight_held_back"] == []
    assert model["gpu_preflight_resolved_driver"]["version"]
    # The GPU facts were gathered first (on this machine, from its PCI bus: maybe no GPU at all).
    assert isinstance(model["gpu_facts"], dict) and "gpus" in model["gpu_facts"]


def test_the_host_keeps_serving_its_current_default_until_the_declared_one_verifies(tmp_path):
    variables = {
        "gpu_preflight_stacks": TWO,
        "gpu_preflight_default_stack": "tf2.15",
        "gpu_preflight_stack_registry": _registry(tmp_path, current="tf2.12"),
    }
    rc, out, model = _play(tmp_path, variables)
    assert rc == 0, out
    assert model["gpu_preflight_resolved_default"]["name"] == "tf2.12"
    assert model["gpu_preflight_pending_default"]["name"] == "tf2.15"


def test_a_stack_that_cannot_be_resolved_stops_with_its_fix_and_publishes_nothing(tmp_path):
    stacks = [{"name": "tf2.15", "tensorflow": "2.15", "cudnn": "8.6"}]
    rc, out, model = _play(
        tmp_path, {"gpu_preflight_stacks": stacks, "gpu_preflight_stack_registry": _registry(tmp_path)}
    )
    assert rc != 0
    assert "tf2.15: TensorFlow 2.15 was built with cuDNN 8.9; it refuses cuDNN 8.6" in out
    assert "Pin cuDNN 8.9 for TensorFlow 2.15." in out
    assert model == {}
    # The causes alone: neither the GPU facts gathered nor the resolution bury them.
    assert "pci_count" not in out and "resolution" not in out


def test_the_problems_of_a_stop_read_as_sentences_not_as_a_list(tmp_path):
    stacks = [{"name": "tf2.15", "tensorflow": "2.15", "cudnn": "8.6"}, {"name": "tf2.12", "tensorflow": "2.12.9"}]
    rc, out, _ = _play(tmp_path, {"gpu_preflight_stacks": stacks, "gpu_preflight_stack_registry": _registry(tmp_path)})
    assert rc != 0
    assert "(gpu_preflight_manifest_overlays). tf2.12: TensorFlow 2.12.9 is not in the version matrix" in out
    assert "['tf2.15" not in out


def test_a_missing_matrix_is_named_with_the_variable_to_fix(tmp_path):
    variables = {"gpu_preflight_stacks": TWO, "gpu_preflight_matrix_file": str(tmp_path / "nope.yml")}
    rc, out, _ = _play(tmp_path, variables)
    assert rc != 0
    assert f"{tmp_path / 'nope.yml'} does not exist on the controller. Fix the path in gpu_preflight_matrix_file" in out


def test_an_input_of_the_wrong_type_is_named(tmp_path):
    rc, out, _ = _play(tmp_path, {"gpu_preflight_stacks": "tf2.15"})
    assert rc != 0
    assert "gpu_preflight_stacks" in out and "fix it in the inventory" in out


def test_an_offline_python_leaves_the_host_alone(tmp_path):
    """For air-gap bundles: every stack's Python is the given version, no GPU facts, no probe (no registry)."""
    variables = {
        "gpu_preflight_stacks": TWO,
        "__gpu_stacks_python_version": "3.12",
        "gpu_preflight_stack_registry": "/x",
    }
    rc, out, _ = _play(tmp_path, variables)
    assert rc != 0  # TensorFlow 2.12 has no wheel for Python 3.12
    assert "tf2.12: TensorFlow 2.12 supports Python 3.8-3.11" in out and "is 3.12" in out
    variables["__gpu_stacks_python_version"] = "3.11"
    rc, out, model = _play(tmp_path, variables)
    assert rc == 0, out
    assert model["gpu_facts"] == "unset"
    assert [s["python"]["version"] for s in model["gpu_preflight_resolved_stacks"]] == ["3.11", "3.11"]


def test_held_back_stacks_leave_the_model_and_the_default_stays(tmp_path):
    hold = {
        "name": "Hold back",
        "ansible.builtin.include_tasks": STACKS,
        "vars": {"__gpu_stacks_hold_back": {"tf2.12": "its cuDNN archive has another checksum"}},
    }
    variables = {"gpu_preflight_stacks": TWO, "gpu_preflight_stack_registry": _registry(tmp_path)}
    rc, out, model = _play(tmp_path, variables, [hold])
    assert rc == 0, out
    assert [s["name"] for s in model["gpu_preflight_resolved_stacks"]] == ["tf2.15"]
    assert model["gpu_preflight_held_back"] == [{"name": "tf2.12", "cause": "its cuDNN archive has another checksum"}]
    assert model["gpu_preflight_resolved_default"]["name"] == "tf2.15"
    said = " ".join(out.split())  # a warning, wrapped
    assert "Held back on localhost" in said and "the default stays tf2.15" in said


def test_bad_arguments_are_named(tmp_path):
    task = {"gpu_fleet.tf_hosts.gpu_stacks": {"python_version": "3.11", "hold_back": {}}}
    play = {"hosts": "localhost", "gather_facts": False, "tasks": [task]}
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    done = localhost_playbook(tmp_path / "play.yml", {"ANSIBLE_HOME": str(tmp_path / ".ansible")})
    assert done.returncode != 0
    assert "gpu_stacks: parameters are mutually exclusive: python_version|hold_back" in done.stdout


def test_a_manifest_without_artifacts_is_named(tmp_path):
    empty = tmp_path / "empty.yml"
    empty.write_text("artifact: {}\n")  # the key misspelt
    rc, out, model = _play(tmp_path, {"gpu_preflight_stacks": TWO, "gpu_preflight_manifest_overlays": [str(empty)]})
    assert rc != 0 and model == {}
    assert f"{empty} has no mapping 'artifacts'" in " ".join(out.split())


def test_a_null_input_is_named(tmp_path):
    rc, out, _ = _play(tmp_path, {"gpu_preflight_stacks": TWO, "gpu_preflight_manifest_files": None})
    assert rc != 0
    assert "gpu_preflight_manifest_files is null; leave it out for its default or set it" in " ".join(out.split())


def test_the_distributions_driver_packages_need_no_runfile_in_the_manifest(tmp_path):
    """nvidia_driver_method: distribution is a package method to the stack model: a driver no manifest holds."""
    variables = {
        "gpu_preflight_stacks": TWO[1:],
        "gpu_preflight_stack_registry": _registry(tmp_path),
        "nvidia_driver_version": "535.261.03",
        "nvidia_driver_method": "distribution",
    }
    rc, out, model = _play(tmp_path, variables)
    assert rc == 0, out
    assert model["gpu_preflight_resolved_driver"] == {"version": "535.261.03", "runfile": None}
    (tmp_path / "runfile").mkdir()
    rc, out, _ = _play(tmp_path / "runfile", {**variables, "nvidia_driver_method": "runfile"})
    assert rc != 0 and "535.261.03" in out  # the runfile method needs the driver's runfile in the manifest
