"""gpu_mig's parsers and plans on output modelled on nvidia-smi's documented answers (NVIDIA Multi-Instance GPU User
Guide, "Getting Started with MIG": the MIG lines of ``nvidia-smi -L``, in the newer ``MIG-<uuid>`` and the
R450 ``MIG-GPU-<uuid>/<gi>/<ci>`` forms)."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils import gpu_mig
from helpers import ROOT

MODELS = yaml.safe_load((ROOT / "data" / "mig_profiles.yml").read_text())["models"]

LISTING = """GPU 0: A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 3g.20gb     Device  1: (UUID: MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/1/0)
GPU 1: A100-SXM4-40GB (UUID: GPU-1c3e8a1f-52d0-4b7e-9a61-0f4d2b8e7c01)
"""


def test_the_listing_gives_each_gpus_mig_devices():
    listed = gpu_mig.parse_list(LISTING)
    assert [d["profile"] for d in listed[0]["mig"]] == ["1g.5gb", "3g.20gb"]
    assert listed[0]["mig"][1]["uuid"] == "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/1/0"
    assert listed[1] == {"name": "A100-SXM4-40GB", "uuid": "GPU-1c3e8a1f-52d0-4b7e-9a61-0f4d2b8e7c01", "mig": []}


def test_differences_name_the_mode_and_the_devices():
    listed = gpu_mig.parse_list(LISTING)
    modes = gpu_mig.parse_modes("0, Enabled, Enabled\n1, Disabled, Disabled\n")
    wanted = {0: ["3g.20gb", "1g.5gb"], 1: []}
    assert gpu_mig.differences(wanted, listed, modes) == {}
    assert gpu_mig.differences({0: [], 1: ["7g.40gb"]}, listed, modes) == {
        0: "MIG mode is enabled; the layout asks for it off",
        1: "MIG mode is Disabled; the layout asks for 7g.40gb",
    }


def test_the_biggest_instances_are_created_first():
    assert gpu_mig.creation_order(["1g.10gb", "4g.40gb", "2g.20gb", "1g.10gb"]) == [
        "4g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]


def test_a_layout_that_names_a_gpu_twice_or_a_bad_gpus_value_is_refused():
    _wanted, problems = gpu_mig.desired_layout([{"gpus": [0], "profiles": []}, {"gpus": "all"}, {"gpus": "0"}], [0, 1])
    assert problems == [
        "gpu_mig_layout names GPU 0 twice (entry 1).",
        "gpu_mig_layout[2].gpus is '0', not 'all' or a list of GPU indices.",
    ]


@pytest.mark.parametrize(
    ("gpu", "whole"),
    [
        ({"name": "NVIDIA H200"}, "7g.141gb"),
        ({"name": "NVIDIA H200 NVL"}, "7g.141gb"),
        ({"device_id": "10de:233b"}, "7g.141gb"),  # H200 NVL on the bus
        ({"name": "NVIDIA H100 80GB HBM3"}, "7g.80gb"),
        ({"name": "NVIDIA A100-SXM4-40GB"}, "7g.40gb"),
        # A Grace Hopper superchip's GPU is no H200: the table has no GH200 profiles, so it has none.
        ({"name": "NVIDIA GH200 480GB"}, None),
        ({"name": "NVIDIA GH200 144G HBM3e"}, None),
        ({"device_id": "10de:2342"}, None),
    ],
)
def test_each_model_is_found_by_its_own_name_or_pci_id_only(gpu, whole):
    profiles = gpu_mig.model_profiles(gpu, MODELS)
    assert next((p for p in profiles or [] if p.startswith("7g.")), None) == whole
