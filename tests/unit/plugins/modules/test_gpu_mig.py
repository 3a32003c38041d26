"""gpu_mig against the nvidia-smi stand-in (tests/fixtures/nvidia) with two H100 80GB GPUs: a layout is applied
once (a second run changes nothing), a changed layout waits for idle GPUs, an unknown profile or one that does
not fit is refused before any change, and state verified counts the MIG devices."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpu_fleet.tf_hosts.plugins.modules import gpu_mig
from helpers import NVIDIA_FIXTURES, ROOT

MODELS = yaml.safe_load((ROOT / "data" / "mig_profiles.yml").read_text())["models"]
H100 = NVIDIA_FIXTURES / "gpus" / "2xH100-SXM5-80GB.json"


@pytest.fixture
def host(tmp_path, monkeypatch, nvidia_smi_standin):
    """A description of its own (compute apps may be added) and an empty MIG state."""
    description = tmp_path / "gpus.json"
    shutil.copy(H100, description)
    monkeypatch.setenv("NVIDIA_STANDIN_GPUS", str(description))
    monkeypatch.setenv("NVIDIA_STANDIN_MIG_STATE", str(tmp_path / "mig.json"))
    return {"description": description, "smi": str(nvidia_smi_standin.path), "run": nvidia_smi_standin}


def run(host, capsys, layout, state="applied", check_mode=False):
    """gpu_mig's result (main() through AnsibleModule) for the layout."""
    args = {
        "layout": layout,
        "models": MODELS,
        "state": state,
        "nvidia_smi": host["smi"],
        "_ansible_check_mode": check_mode,
    }
    with patch_module_args(args), pytest.raises(SystemExit):
        gpu_mig.main()
    return json.loads(capsys.readouterr().out)


def mig_lines(host):
    listing = host["run"].run("-L", description=host["description"]).stdout
    return [line.split()[1] for line in listing.splitlines() if line.startswith("  MIG ")]


def test_a_layout_is_applied_once_and_a_second_run_changes_nothing(host, capsys):
    layout = [{"gpus": [0], "profiles": ["3g.40gb", "3g.40gb"]}, {"gpus": [1], "profiles": ["4g.40gb", "1g.10gb"]}]
    first = run(host, capsys, layout)
    assert (first["changed"], first["changed_gpus"], first["devices"], first["pending"]) == (True, [0, 1], 4, [])
    assert sorted(mig_lines(host)) == ["1g.10gb", "3g.40gb", "3g.40gb", "4g.40gb"]
    second = run(host, capsys, layout)
    assert (second["changed"], second["differences"]) == (False, {})
    assert run(host, capsys, layout, state="verified")["differences"] == {}


def test_a_changed_layout_waits_for_idle_gpus(host, capsys):
    run(host, capsys, [{"gpus": "all", "profiles": ["7g.80gb"]}])
    data = json.loads(host["description"].read_text())
    data["compute_apps"] = [{"pid": 4242, "process_name": "python3", "gpu_uuid": data["gpus"][1]["uuid"]}]
    host["description"].write_text(json.dumps(data))
    busy = run(host, capsys, [{"gpus": "all", "profiles": ["3g.40gb", "3g.40gb"]}])
    assert busy["failed"] and "pid 4242 (python3) on GPU 1" in busy["msg"] and "nothing was changed" in busy["msg"]
    assert mig_lines(host) == ["7g.80gb", "7g.80gb"]  # GPU 0 untouched too
    data["compute_apps"] = []
    host["description"].write_text(json.dumps(data))
    done = run(host, capsys, [{"gpus": "all", "profiles": ["3g.40gb", "3g.40gb"]}])
    assert done["changed"] and mig_lines(host) == ["3g.40gb"] * 4


def test_mig_off_and_a_gpu_left_out_is_left_alone(host, capsys):
    run(host, capsys, [{"gpus": [0, 1], "profiles": ["2g.20gb"]}])
    off = run(host, capsys, [{"gpus": [0], "profiles": []}])
    assert off["changed_gpus"] == [0] and mig_lines(host) == ["2g.20gb"]
    modes = host["run"].run("--query-gpu=mig.mode.current", "--format=csv,noheader", description=host["description"])
    assert modes.stdout.split() == ["Disabled", "Enabled"]


@pytest.mark.parametrize(
    ("profiles", "said"),
    [
        (["3g.20gb"], "has no MIG profile 3g.20gb"),  # an A100 40GB profile
        (["3g.40gb", "3g.40gb", "3g.40gb"], "do not fit on GPU 0"),
        (["4g.40gb", "4g.40gb"], "2 x 4g.40gb (at most 1)"),
    ],
)
def test_a_layout_the_model_cannot_take_is_refused_before_any_change(host, capsys, profiles, said):
    result = run(host, capsys, [{"gpus": [0], "profiles": profiles}])
    assert result["failed"] and said in result["msg"] and "Fix gpu_mig_layout" in result["msg"]
    assert not (host["description"].parent / "mig.json").exists()


def test_checked_with_the_gpu_facts_runs_no_command(capsys):
    args = {"layout": [{"gpus": "all", "profiles": ["1g.10gb"]}], "models": MODELS, "state": "checked",
            "gpus": [{"index": 0, "name": "NVIDIA GeForce GTX 980"}], "nvidia_smi": "/nonexistent"}  # fmt: skip
    with patch_module_args(args), pytest.raises(SystemExit):
        gpu_mig.main()
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] and "has no MIG profiles" in result["msg"]


def test_verified_names_each_gpu_that_differs(host, capsys):
    run(host, capsys, [{"gpus": [0], "profiles": ["7g.80gb"]}])
    result = run(
        host, capsys, [{"gpus": [0, 1], "profiles": ["7g.80gb"]}, {"gpus": [5], "profiles": []}], state="verified"
    )
    assert result["differences"] == {"1": "MIG mode is Disabled; the layout asks for 7g.80gb"}
    assert result["problems"] == ["gpu_mig_layout[1] names GPU 5; the host has GPUs [0, 1]."]
    assert not result["changed"]


def test_check_mode_changes_nothing(host, capsys):
    result = run(host, capsys, [{"gpus": [0], "profiles": ["7g.80gb"]}], check_mode=True)
    assert result["changed"] and mig_lines(host) == []


def test_checked_before_a_driver_knows_the_gpus_by_their_pci_ids(capsys):
    bus = [
        {"pci_bus_id": "0000:07:00.0", "device_id": "10de:20b2"},
        {"pci_bus_id": "0000:0f:00.0", "device_id": "10de:2204"},
    ]
    args = {"layout": [{"gpus": [0], "profiles": ["3g.40gb"]}], "models": MODELS, "state": "checked", "gpus": bus}
    with patch_module_args(args), pytest.raises(SystemExit):
        gpu_mig.main()
    assert not json.loads(capsys.readouterr().out).get("failed")  # 10de:20b2 is an A100 80GB
    args["layout"] = [{"gpus": [1], "profiles": ["3g.40gb"]}]
    with patch_module_args(args), pytest.raises(SystemExit):
        gpu_mig.main()
    assert "GPU 1 (PCI device 10de:2204) has no MIG profiles" in json.loads(capsys.readouterr().out)["msg"]


def test_a_mode_change_that_waits_for_a_reset_is_pending_and_creates_nothing(host, capsys):
    data = json.loads(host["description"].read_text())
    data["gpus"][0]["mig_needs_reset"] = True
    host["description"].write_text(json.dumps(data))
    result = run(host, capsys, [{"gpus": "all", "profiles": ["7g.80gb"]}])
    assert (result["changed"], result["changed_gpus"], result["pending"]) == (True, [0, 1], [0])
    assert mig_lines(host) == ["7g.80gb"]  # GPU 1 only; GPU 0 waits for its reset


def describe(host, gpu: int, **fields):
    """Add fields to one GPU of the host's description (or, with gpu -1, to the description itself)."""
    data = json.loads(host["description"].read_text())
    (data if gpu < 0 else data["gpus"][gpu]).update(fields)
    host["description"].write_text(json.dumps(data))
    return data


def test_instances_a_monitoring_agent_holds_stop_the_change_naming_it(host, capsys):
    run(host, capsys, [{"gpus": [0], "profiles": ["7g.80gb"]}])
    describe(host, 0, mig_held_by="nv-hostengine")
    held = run(host, capsys, [{"gpus": [0], "profiles": ["3g.40gb", "3g.40gb"]}])
    assert held["failed"] and "GPU 0 still has 1 GPU instances after destroying them" in held["msg"]
    assert "In use by another client" in held["msg"] and "DCGM" in held["msg"] and "nvsm" in held["msg"]
    assert mig_lines(host) == ["7g.80gb"]  # no -cgi on top of what is left


def test_a_compute_application_on_a_mig_device_keeps_its_gpu_busy(host, capsys):
    run(host, capsys, [{"gpus": "all", "profiles": ["7g.80gb"]}])
    listing = host["run"].run("-L", description=host["description"]).stdout
    mig_uuid = [line.split("UUID: ")[1].rstrip(")") for line in listing.splitlines() if "MIG-" in line][1]
    describe(host, -1, compute_apps=[{"pid": 77, "process_name": "python3", "gpu_uuid": mig_uuid}])
    busy = run(host, capsys, [{"gpus": "all", "profiles": ["3g.40gb"]}])
    assert busy["failed"] and "pid 77 (python3) on GPU 1" in busy["msg"]
    assert mig_lines(host) == ["7g.80gb", "7g.80gb"]


def test_a_layout_the_gpu_refuses_puts_its_previous_devices_back(host, capsys):
    run(host, capsys, [{"gpus": [0], "profiles": ["3g.40gb", "2g.20gb"]}])
    describe(host, 0, mig_refused_profiles=["1g.10gb"])  # refused after 4g.40gb was created
    refused = run(host, capsys, [{"gpus": [0], "profiles": ["4g.40gb", "1g.10gb"]}])
    assert refused["failed"] and "-cgi 4g.40gb,1g.10gb -C failed" in refused["msg"]
    assert "Its previous MIG devices (3g.40gb, 2g.20gb) were created again" in refused["msg"]
    assert sorted(mig_lines(host)) == ["2g.20gb", "3g.40gb"]


def test_a_refused_layout_on_a_gpu_without_devices_before_says_so(host, capsys):
    describe(host, 1, mig_refused_profiles=["7g.80gb"])
    refused = run(host, capsys, [{"gpus": [1], "profiles": ["7g.80gb"]}])
    assert refused["failed"] and "GPU 1 had no MIG devices before" in refused["msg"]
