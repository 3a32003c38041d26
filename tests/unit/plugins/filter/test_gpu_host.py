"""Host fitness decisions of gpu_preflight, on stand-in facts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))

import gpu_host

GIB = 1024**3
MOUNTS = [
    {"mount": "/", "options": "rw,relatime", "size_available": 50 * GIB},
    {"mount": "/var/tmp", "options": "rw,nosuid,nodev,noexec", "size_available": 2 * GIB},
    {"mount": "/usr/local", "options": "rw", "size_available": 9 * GIB},
]
A100 = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "pcie_link_width_current": 16, "pcie_link_width_max": 16}


def facts(**over):
    base = {
        "os": {"distribution": "Debian", "major_version": "12", "os_family": "Debian"},
        "supported_os": {"Debian": ["12"], "Ubuntu": ["22.04", "24.04"]},
        "manage_kernel": True,
        "mounts": [{"mount": "/", "options": "rw", "size_available": 50 * GIB}],
        "space": [{"path": "/var/tmp/cuda-installer", "need_bytes": 6 * GIB, "purpose": "CUDA installer scratch"}],
        "exec_paths": [{"path": "/var/tmp/cuda-installer", "purpose": "CUDA installer scratch"}],
        "proc_modules": "ext4 1056768 2 - Live 0x0000000000000000\n",
        "secure_boot": "SecureBoot disabled\n",
        "signing_key": False,
        "kernel": "6.1.0-27-amd64",
        "kernel_headers": True,
        "kernel_headers_package": "linux-headers-6.1.0-27-amd64",
        "gpus": {
            "count": 2,
            "gpus": [A100, dict(A100, index=1)],
            "models": ["NVIDIA A100-SXM4-80GB"],
            "nvlink_pairs": [{"gpus": [0, 1], "links": 12}],
            "nvswitch_present": False,
        },
        "compute_apps": [],
        "driver_change": False,
    }
    base.update(over)
    return base


def checks(result, kind="problems"):
    return [p["check"] for p in result[kind]]


def test_fit_host_passes_without_warnings():
    result = gpu_host.check_host(facts())
    assert result == {"ok": True, "problems": [], "warnings": [], "overridden": []}


def test_unsupported_os():
    result = gpu_host.check_host(facts(os={"distribution": "Debian", "major_version": "11", "os_family": "Debian"}))
    assert result["problems"] == [
        {
            "check": "os",
            "cause": "Debian 11 is not a supported OS (Debian 12, Ubuntu 22.04/24.04).",
            "fix": "Use a supported release, or add it to the role's supported list after testing it.",
        }
    ]


def test_mount_for_picks_longest_mount_point_for_paths_not_created_yet():
    assert gpu_host.mount_for("/var/tmp/cuda-installer", MOUNTS)["mount"] == "/var/tmp"
    assert gpu_host.mount_for("/usr/local/cuda-11.8", MOUNTS)["mount"] == "/usr/local"
    assert gpu_host.mount_for("/opt/tensorflow", MOUNTS)["mount"] == "/"
    assert gpu_host.mount_for("/var/tmpfoo", MOUNTS)["mount"] == "/"


def test_too_little_disk_names_path_mount_free_and_needed():
    result = gpu_host.check_host(facts(mounts=MOUNTS, exec_paths=[]))
    assert result["problems"] == [
        {
            "check": "disk",
            "cause": "/var/tmp/cuda-installer (CUDA installer scratch) is on /var/tmp with 2,048 MiB free; 6,144 MiB is needed.",
            "fix": "Free space on /var/tmp, or point the CUDA installer scratch folder at a larger disk.",
        }
    ]


def test_noexec_tmpdir():
    result = gpu_host.check_host(facts(mounts=MOUNTS, space=[]))
    assert result["problems"] == [
        {
            "check": "noexec",
            "cause": "/var/tmp/cuda-installer (CUDA installer scratch) is on /var/tmp, mounted noexec; NVIDIA's installers "
            "run programs from it.",
            "fix": "Point the CUDA installer scratch folder at a file system mounted with exec.",
        }
    ]


def test_nouveau_loaded():
    result = gpu_host.check_host(facts(proc_modules="nouveau 2306048 0 - Live 0x0\nttm 98304 1 nouveau, Live 0x0\n"))
    assert checks(result) == ["nouveau"]


def test_nouveau_as_dependency_name_only_is_not_loaded():
    assert gpu_host.check_host(facts(proc_modules="drm 1 2 nouveau_helper, Live 0x0\n"))["ok"]


def test_secure_boot_without_key():
    result = gpu_host.check_host(facts(secure_boot="SecureBoot enabled\n"))
    assert checks(result) == ["secure_boot"]
    assert gpu_host.check_host(facts(secure_boot="SecureBoot enabled\n", signing_key=True))["ok"]


def test_missing_kernel_headers():
    result = gpu_host.check_host(facts(kernel_headers=False))
    assert result["problems"][0]["fix"] == (
        "Install linux-headers-6.1.0-27-amd64 or boot a kernel whose headers are available."
    )


def test_kernel_checks_skipped_in_containers():
    result = gpu_host.check_host(
        facts(
            manage_kernel=False,
            kernel_headers=False,
            secure_boot="SecureBoot enabled",
            proc_modules="nouveau 1 0 - Live 0x0\n",
        )
    )
    assert result["ok"]


def test_busy_gpus_only_matter_when_the_driver_changes():
    apps = [{"pid": 4242, "process_name": "python3", "gpu_uuid": "GPU-1", "used_memory_mib": 1000}]
    assert gpu_host.check_host(facts(compute_apps=apps))["ok"]
    result = gpu_host.check_host(facts(compute_apps=apps, driver_change=True))
    assert result["problems"][0]["cause"] == (
        "The driver would change while GPUs run compute processes: python3 (pid 4242)."
    )


RTX = {"name": "NVIDIA GeForce RTX 3090", "pcie_link_width_max": 16}


def rtx_host():
    cards = [dict(RTX, index=i, pcie_link_width_current=w) for i, w in enumerate([16, 8, 16, 8])]
    return {
        "count": 4,
        "gpus": cards,
        "models": ["NVIDIA GeForce RTX 3090"],
        "nvlink_pairs": [],
        "nvswitch_present": False,
    }


def test_rtx3090_x8_passes_with_warnings():
    result = gpu_host.check_host(facts(gpus=rtx_host()))
    assert result["ok"]
    assert checks(result, "warnings") == ["pcie_width", "nvlink"]
    assert "GPU 1 at x8, GPU 3 at x8" in result["warnings"][0]["cause"]


def test_strict_hardware_turns_warnings_into_problems():
    result = gpu_host.check_host(facts(gpus=rtx_host()), {"strict_hardware": True})
    assert checks(result) == ["pcie_width", "nvlink"]


def test_mixed_models_warn():
    gpus = {
        "count": 2,
        "gpus": [A100, {"index": 1, "name": "Tesla V100-SXM2-32GB"}],
        "models": ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"],
        "nvlink_pairs": [],
    }
    assert checks(gpu_host.check_host(facts(gpus=gpus)), "warnings") == ["mixed_models"]


def test_nvswitch_counts_as_nvlink():
    gpus = {
        "count": 8,
        "gpus": [dict(A100, index=i) for i in range(8)],
        "models": ["H100"],
        "nvlink_pairs": [],
        "nvswitch_present": True,
    }
    assert gpu_host.check_host(facts(gpus=gpus))["warnings"] == []


@pytest.mark.parametrize("settings", [{"allow_unsupported": True}, {"skip_checks": ["noexec"]}])
def test_overrides_move_problems_aside(settings):
    result = gpu_host.check_host(facts(mounts=MOUNTS, space=[]), settings)
    assert result["ok"]
    assert checks(result, "overridden") == ["noexec"]


def test_skip_of_other_check_keeps_problem():
    result = gpu_host.check_host(facts(mounts=MOUNTS, space=[]), {"skip_checks": ["disk"]})
    assert checks(result) == ["noexec"]


def test_all_problems_together():
    result = gpu_host.check_host(facts(mounts=MOUNTS, kernel_headers=False, secure_boot="SecureBoot enabled"))
    assert checks(result) == ["disk", "noexec", "secure_boot", "kernel_headers"]


STACK = {
    "venv": "/opt/tensorflow/2.12",
    "cuda_toolkit": {"root": "/usr/local/cuda-11.8", "runfile": {"file": "cuda.run", "size_bytes": 4 * GIB}},
    "cudnn": {"archive": {"file": "cudnn.tar.xz", "size_bytes": None}},
}
DRIVER = {"version": "520.61.05", "runfile": {"file": "NVIDIA.run", "size_bytes": 300 * 1024 * 1024}}
PATHS = {"cache_dir": "/var/cache/gpu-artifacts", "cuda_tmpdir": "/var/tmp/cuda", "driver_tmpdir": "/var/tmp/drv"}


def test_space_needs_for_a_bare_host():
    needs = gpu_host.space_needs([STACK], DRIVER, {}, PATHS)
    assert needs == [
        {
            "path": "/var/cache/gpu-artifacts",
            "need_bytes": 4 * GIB + gpu_host.DEFAULT_RUNFILE_BYTES + 300 * 1024 * 1024,
            "purpose": "artifact cache",
            "variable": "gpu_artifacts_host_cache_dir",
        },
        {
            "path": "/var/tmp/cuda",
            "need_bytes": 4 * GIB,
            "purpose": "CUDA installer scratch",
            "variable": "cuda_toolkit_tmpdir",
        },
        {"path": "/usr/local/cuda-11.8", "need_bytes": 10 * GIB, "purpose": "CUDA toolkits"},
        {
            "path": "/var/tmp/drv",
            "need_bytes": 300 * 1024 * 1024,
            "purpose": "driver installer scratch",
            "variable": "nvidia_driver_tmpdir",
        },
        {
            "path": "/opt/tensorflow/2.12",
            "need_bytes": gpu_host.VENV_BYTES,
            "purpose": "TensorFlow venvs",
            "variable": "the stack's venv",
        },
    ]


def test_driver_from_packages_needs_no_installer_space():
    needs = gpu_host.space_needs([STACK], {"version": "520.61.05", "runfile": None}, {}, PATHS)
    assert [need["purpose"] for need in needs] == [
        "artifact cache",
        "CUDA installer scratch",
        "CUDA toolkits",
        "TensorFlow venvs",
    ]
    assert needs[0]["need_bytes"] == 4 * GIB + gpu_host.DEFAULT_RUNFILE_BYTES


def test_space_needs_nothing_on_a_provisioned_host():
    present = {"cuda_roots": ["/usr/local/cuda-11.8"], "venvs": ["/opt/tensorflow/2.12"], "driver_installed": True}
    assert gpu_host.space_needs([STACK], DRIVER, present, PATHS) == []


def test_space_floor_threshold_applies_to_every_location():
    needs = gpu_host.space_needs([STACK], None, {"cuda_roots": ["/usr/local/cuda-11.8"]}, PATHS, floor_mib=10**7)
    assert needs == [
        {
            "path": "/opt/tensorflow/2.12",
            "need_bytes": 10**7 * 1024 * 1024,
            "purpose": "TensorFlow venvs",
            "variable": "the stack's venv",
        }
    ]


def test_compute_apps_parses_nvidia_smi_rows():
    lines = ["4242, python3, GPU-3f1c2a7e-5b9d-4c11-8e2a-9d0b7c6e4a21, 30512", "", "No running processes found"]
    assert gpu_host.compute_apps(lines) == [
        {
            "pid": 4242,
            "process_name": "python3",
            "gpu_uuid": "GPU-3f1c2a7e-5b9d-4c11-8e2a-9d0b7c6e4a21",
            "used_memory_mib": 30512,
        }
    ]


def test_compute_apps_is_the_shared_parser_on_stdout_lines():
    from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_parsers import parse_compute_apps

    lines = ["4343, /usr/bin/ollama, GPU-fd26179c-de1f-3f6f-f298-383b36269b35, [N/A]", "4242, python3"]
    expected = [
        {
            "pid": 4343,
            "process_name": "/usr/bin/ollama",
            "gpu_uuid": "GPU-fd26179c-de1f-3f6f-f298-383b36269b35",
            "used_memory_mib": None,
        }
    ]
    assert gpu_host.compute_apps(lines) == parse_compute_apps("\n".join(lines)) == expected
    assert gpu_host.compute_apps([]) == []


def test_findmnt_mounts_keeps_tmpfs_and_overlay():
    data = {
        "filesystems": [
            {"target": "/", "options": "rw,relatime,lowerdir=/x", "avail": 79827042304},
            {
                "target": "/var/tmp/cuda-installer",
                "options": "rw,nosuid,noexec,relatime,size=65536k",
                "avail": 67108864,
            },
        ]
    }
    mounts = gpu_host.findmnt_mounts(data)
    assert gpu_host.mount_for("/var/tmp/cuda-installer", mounts) == {
        "mount": "/var/tmp/cuda-installer",
        "options": "rw,nosuid,noexec,relatime,size=65536k",
        "size_available": 67108864,
    }
    assert gpu_host.mount_for("/opt/tensorflow/2.12", mounts)["size_available"] == 79827042304


def test_installer_of_an_interrupted_run_stops_the_host():
    line = "4711 sh /var/cache/gpu-artifacts/cuda_toolkit/11.8.0/cuda_11.8.0_520.61.05_linux.run --silent --toolkit"
    result = gpu_host.check_host(facts(installers=[line]))
    assert result["problems"] == [
        {
            "check": "installer_running",
            "cause": f"An install from an earlier run is still running on the host: {line}.",
            "fix": "Wait for it to finish (or stop it), then rerun; the rerun skips what it completed.",
        }
    ]


def test_unknown_skip_check_is_named_with_a_suggestion():
    result = gpu_host.check_host(facts(), {"skip_checks": ["dsik"]})
    assert not result["ok"]
    assert (
        result["problems"][0]["cause"]
        == "gpu_preflight_skip_checks names an unknown check 'dsik' (did you mean 'disk'?)."
    )


def test_skip_checks_given_as_a_string_on_the_command_line_are_names_split_at_commas():
    # -e gpu_preflight_skip_checks=disk passes the string "disk", not a list: not four letters.
    nouveau = facts(proc_modules="nouveau 2306048 0 - Live 0x0\n")
    assert not gpu_host.check_host(nouveau)["ok"]
    result = gpu_host.check_host(nouveau, {"skip_checks": "disk, nouveau"})
    assert result["ok"] and [p["check"] for p in result["overridden"]] == ["nouveau"]
    assert gpu_host.check_host(facts(), {"skip_checks": "dsik"})["problems"][0]["cause"] == (
        "gpu_preflight_skip_checks names an unknown check 'dsik' (did you mean 'disk'?)."
    )


def test_noexec_fix_names_the_variable():
    exec_paths = [
        {"path": "/var/tmp/cuda-installer", "purpose": "CUDA installer scratch", "variable": "cuda_toolkit_tmpdir"}
    ]
    result = gpu_host.check_host(facts(mounts=MOUNTS, space=[], exec_paths=exec_paths))
    assert result["problems"][0]["fix"] == (
        "Point cuda_toolkit_tmpdir (CUDA installer scratch) at a file system mounted with exec."
    )


def test_every_check_fires_in_order_with_its_exact_messages():
    result = gpu_host.check_host(
        facts(
            os={"distribution": "Rocky", "major_version": "9"},
            mounts=MOUNTS,
            proc_modules="nouveau 1 0 - Live 0x0\n",
            secure_boot="SecureBoot enabled\n",
            kernel_headers=False,
            reboot_allowed=True,
            connection="local",
            installers=["4711 sh cuda.run"],
            compute_apps=[{"pid": 4242, "process_name": "python3"}],
            driver_change=True,
        ),
        {"skip_checks": ["nvlnk", "zzz"]},
    )
    names = (
        "root, os, venv_occupied, disk, noexec, nouveau, secure_boot, kernel_headers, reboot_local, gpus_busy, "
        "installer_running, pci_devices, gpu_count, kernel_module, mixed_models, pcie_width, nvlink"
    )
    skip_fix = f'Use the names {names}, as a list: -e \'{{"gpu_preflight_skip_checks": ["disk"]}}\'.'
    assert result["problems"][3:] == [
        {
            "check": "nouveau",
            "cause": "The nouveau driver is loaded; the NVIDIA kernel module cannot load beside it.",
            "fix": "Let the run blacklist it (nvidia_driver_blacklist_nouveau: true) and reboot, then rerun.",
        },
        {"check": "secure_boot", "cause": SECURE_BOOT_CAUSE, "fix": SECURE_BOOT_FIX},
        {
            "check": "kernel_headers",
            "cause": "No kernel headers for the running kernel 6.1.0-27-amd64 (/lib/modules/<kernel>/build), and none "
            "can be installed.",
            "fix": "Install linux-headers-6.1.0-27-amd64 or boot a kernel whose headers are available.",
        },
        {"check": "reboot_local", "cause": REBOOT_LOCAL_CAUSE, "fix": REBOOT_LOCAL_FIX},
        {
            "check": "installer_running",
            "cause": "An install from an earlier run is still running on the host: 4711 sh cuda.run.",
            "fix": "Wait for it to finish (or stop it), then rerun; the rerun skips what it completed.",
        },
        {
            "check": "gpus_busy",
            "cause": "The driver would change while GPUs run compute processes: python3 (pid 4242).",
            "fix": "Drain the host (stop those jobs) and rerun. To change the driver under them anyway (they lose "
            "their GPUs), skip this check (gpu_preflight_skip_checks: [gpus_busy]) and set "
            "nvidia_driver_allow_busy_gpus: true.",
        },
        {
            "check": "skip_checks",
            "cause": "gpu_preflight_skip_checks names an unknown check 'nvlnk' (did you mean 'nvlink'?).",
            "fix": skip_fix,
        },
        {"check": "skip_checks", "cause": "gpu_preflight_skip_checks names an unknown check 'zzz'.", "fix": skip_fix},
    ]
    assert checks(result)[:3] == ["os", "disk", "noexec"]
    assert result["warnings"] == [] and result["overridden"] == []


def test_hardware_advice_exact_messages():
    cards = [dict(RTX, index=i, pcie_link_width_current=16) for i in range(3)]
    cards[2].update(pcie_link_width_max=8, pcie_link_width_current=4)
    models = ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3080", "NVIDIA GeForce RTX 3090"]
    result = gpu_host.check_host(facts(gpus={"count": 3, "gpus": cards, "models": models, "nvlink_pairs": []}))
    assert result == {
        "ok": True,
        "problems": [],
        "warnings": [
            {
                "check": "mixed_models",
                "cause": "Mixed GPU models: NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 3080, NVIDIA GeForce RTX 3090; "
                "MirroredStrategy runs at the pace of the slowest.",
                "fix": "Group hosts by GPU model or accept the slower replicas.",
            },
            {
                "check": "pcie_width",
                "cause": "PCIe links below x16 on a multi-GPU host: GPU 2 at x4; all-reduce traffic is limited by the "
                "narrowest link.",
                "fix": "Move the cards to x16 slots or check the riser/BIOS lane settings.",
            },
            {
                "check": "nvlink",
                "cause": "3 GPUs without NVLink: gradients cross PCIe, scaling beyond 2 GPUs is usually poor.",
                "fix": "Expect lower scaling efficiency, or use NVLink-connected GPUs.",
            },
        ],
        "overridden": [],
    }


def test_check_table_messages_and_names_agree():
    running_order = (
        "root os venv_occupied disk noexec nouveau secure_boot kernel_headers reboot_local installer_running gpus_busy"
        " pci_devices gpu_count kernel_module mixed_models pcie_width nvlink"
    )
    assert [name for name, _check, _scope in gpu_host.CHECKS] == running_order.split()
    assert {name for name, _check, _scope in gpu_host.CHECKS} == set(gpu_host.HOST_CHECKS)
    # Every check has its message; "<check>/<variant>" messages belong to a check.
    assert {key.split("/")[0] for key in gpu_host.MESSAGES} == set(gpu_host.HOST_CHECKS) | {"skip_checks"}
    assert set(gpu_host.HOST_CHECKS) | {"skip_checks"} <= set(gpu_host.MESSAGES)
    assert sorted(k for k in gpu_host.MESSAGES if "/" in k) == ["kernel_headers/pending_reboot", "secure_boot/pair"]
    assert {scope for _name, _check, scope in gpu_host.CHECKS} == {"host", "kernel", "hardware"}


def test_tasks_not_run_as_root_stop_the_host_with_the_user_named():
    result = gpu_host.check_host(facts(user={"name": "deploy", "uid": 1000}))
    assert checks(result) == ["root"]
    assert result["problems"][0]["cause"].startswith("Tasks run as deploy (uid 1000), not root")
    assert "become: true" in result["problems"][0]["fix"]
    assert gpu_host.check_host(facts(user={"name": "root", "uid": 0}))["ok"]


@pytest.mark.parametrize(
    ("present", "entries", "occupied"),
    [
        (["/opt/tf"], ["/opt/tf/train.csv"], True),  # data where the venv would go
        (["/opt/tf"], ["/opt/tf/pyvenv.cfg", "/opt/tf/bin"], False),  # a venv already
        (["/opt/tf"], [], False),  # an empty folder (a mount point made for it)
        ([], [], False),  # nothing there yet
        (["/opt/tf"], ["/opt/tf/sub/pyvenv.cfg", "/opt/tf/sub"], True),  # a venv one level down is not this one
    ],
)
def test_a_venv_folder_holding_other_files_stops_the_host(present, entries, occupied):
    result = gpu_host.check_host(facts(venvs={"tf2.12": "/opt/tf"}, present=present, venv_entries=entries))
    assert checks(result) == (["venv_occupied"] if occupied else [])
    if occupied:
        assert result["problems"][0]["cause"].startswith(
            "/opt/tf (venv of stack tf2.12) exists and is not a virtual environment (no pyvenv.cfg)"
        )


# --- gpu_count: fewer GPUs than the inventory expects -------------------------------------------------

SYSFS_2 = [
    {"pci_bus_id": "0000:07:00.0", "description": None, "device_id": "10de:20b2"},
    {"pci_bus_id": "0000:0f:00.0", "description": None, "device_id": "10de:20b2"},
]
GPU_COUNT_FIX = (
    "Reseat or power the missing GPUs and check that the BIOS enables their slots (`lspci -nn -d 10de:` lists what "
    "the PCI bus shows), or correct the expected count in the inventory (gpu_verify_expected_gpu_count or "
    "gpu_preflight_expected_gpu_count) if this host has 2."
)


def no_driver(**over):
    """nvidia_gpu_facts of a host without a driver whose PCI bus was read from sysfs."""
    gpus = {"source": "sysfs", "count": 0, "gpus": [], "models": ["10de:20b2"], "nvlink_pairs": []}
    gpus.update(pci_source="sysfs", pci_count=2, pci_gpus=SYSFS_2, pci_devices_path="/sys/bus/pci/devices")
    gpus.update(over)
    return gpus


def test_fewer_gpus_than_expected_before_any_driver_names_the_bus_ids():
    result = gpu_host.check_host(facts(gpus=no_driver(), expected_gpu_count=4))
    assert result["ok"] is False
    assert result["problems"] == [
        {
            "check": "gpu_count",
            "cause": "4 GPUs expected, 2 seen: nvidia-smi gave no list, /sys/bus/pci/devices (gpu_preflight_pci_devices_path) "
            "lists 2 NVIDIA GPUs; "
            "bus IDs seen: 0000:07:00.0, 0000:0f:00.0.",
            "fix": GPU_COUNT_FIX,
        }
    ]


@pytest.mark.parametrize("expected", [None, "", 1, 2, "2"])
def test_enough_gpus_or_no_expectation_passes(expected):
    assert gpu_host.check_host(facts(gpus=no_driver(), expected_gpu_count=expected))["ok"] is True


def test_an_expected_count_that_is_no_number_names_the_variable():
    """The setting is typed raw (its default is gpu_verify's, a template): the filter reads it."""
    with pytest.raises(AnsibleFilterError, match=r"gpu_preflight_expected_gpu_count .* is 'three', not a number"):
        gpu_host.check_host(facts(gpus=no_driver(), expected_gpu_count="three"))


def test_gpu_count_takes_the_larger_of_nvidia_smi_and_the_pci_bus():
    # A GPU fell off the bus: nvidia-smi lists 1, sysfs still shows 2, so 2 are "seen".
    fallen = no_driver(source="nvidia-smi", count=1, gpus=[dict(A100, pci_bus_id="0000:07:00.0")])
    assert gpu_host.check_host(facts(gpus=fallen, expected_gpu_count=2))["ok"] is True
    (problem,) = gpu_host.check_host(facts(gpus=fallen, expected_gpu_count=3))["problems"]
    assert problem["cause"] == (
        "3 GPUs expected, 2 seen: nvidia-smi lists 1, /sys/bus/pci/devices (gpu_preflight_pci_devices_path) lists 2 "
        "NVIDIA GPUs; "
        "bus IDs seen: 0000:07:00.0, 0000:0f:00.0."
    )
    # nvidia-smi lists more than the PCI bus shows (lspci could not see the passed-through GPUs).
    smi_only = no_driver(source="nvidia-smi", count=2, pci_source="lspci", pci_count=0, pci_gpus=[])
    assert gpu_host.check_host(facts(gpus=smi_only, expected_gpu_count=2))["ok"] is True


def test_gpu_count_names_the_folder_it_read_and_its_variable():
    # A mistyped gpu_preflight_pci_devices_path reads as "no GPUs": the cause must say where it looked.
    empty = no_driver(pci_count=0, pci_gpus=[], pci_devices_path="/srv/pci-fixture/devcies")
    (problem,) = gpu_host.check_host(facts(gpus=empty, expected_gpu_count=2))["problems"]
    assert "/srv/pci-fixture/devcies (gpu_preflight_pci_devices_path) lists 0 NVIDIA GPUs" in problem["cause"]
    by_lspci = no_driver(pci_source="lspci", pci_count=1, pci_gpus=SYSFS_2[:1], pci_devices_path="")
    (problem,) = gpu_host.check_host(facts(gpus=by_lspci, expected_gpu_count=2))["problems"]
    assert "lspci shows 1 on the PCI bus" in problem["cause"]


def test_gpu_count_with_nothing_readable_says_so_and_can_be_skipped():
    blind = {"source": "none", "count": 0, "gpus": [], "pci_source": "none", "pci_count": None, "pci_gpus": []}
    result = gpu_host.check_host(facts(gpus=blind, expected_gpu_count=1))
    assert [p["cause"] for p in result["problems"]] == [
        "1 GPUs expected, 0 seen: nvidia-smi gave no list; the PCI bus could not be read; bus IDs seen: none."
    ]
    skipped = gpu_host.check_host(facts(gpus=blind, expected_gpu_count=1), {"skip_checks": ["gpu_count"]})
    assert skipped["ok"] is True
    assert checks(skipped, "overridden") == ["gpu_count"]


NO_SMI = "nvidia-smi is not installed (not on PATH (/usr/bin:/bin) nor in /sbin, /usr/sbin, /usr/local/sbin)"


def test_gpu_count_names_what_each_source_read_and_why_it_gave_nothing():
    blind = {
        "source": "none",
        "count": 0,
        "gpus": [],
        "pci_source": "none",
        "pci_count": None,
        "pci_gpus": [],
        "nvidia_smi_problem": NO_SMI,
        "pci_devices_problem": "/srv/pci does not exist",
        "lspci_path": None,
    }
    [count] = [
        p for p in gpu_host.check_host(facts(gpus=blind, expected_gpu_count=2))["problems"] if p["check"] == "gpu_count"
    ]
    assert count["cause"] == (
        f"2 GPUs expected, 0 seen: {NO_SMI}; the PCI bus could not be read: /srv/pci does not exist "
        "(gpu_preflight_pci_devices_path) and lspci is not installed (pciutils); bus IDs seen: none."
    )
    # No lspci on the host: the fix says to install pciutils before suggesting it.
    assert "(`lspci -nn -d 10de:` (install pciutils first: this host has no lspci) lists what" in count["fix"]
    with_lspci = dict(blind, lspci_path="/usr/bin/lspci", pci_devices_problem=None)
    [count] = gpu_host.check_host(facts(gpus=with_lspci, expected_gpu_count=2))["problems"]
    assert count["cause"].endswith("the PCI bus could not be read: lspci failed; bus IDs seen: none.")
    assert "(`lspci -nn -d 10de:` lists what the PCI bus shows)" in count["fix"]


def test_a_pci_folder_that_gives_nothing_stops_the_host_naming_it_and_its_variable():
    gpus = {"source": "nvidia-smi", "count": 2, "gpus": [], "pci_source": "lspci", "pci_count": 2, "pci_gpus": []}
    result = gpu_host.check_host(facts(gpus=dict(gpus, pci_devices_problem="/srv/pci does not exist")))
    assert result["problems"] == [
        {
            "check": "pci_devices",
            "cause": "/srv/pci does not exist (gpu_preflight_pci_devices_path): the GPU count check reads the GPUs on "
            "the PCI bus there, before any driver can list them; lspci listed them instead.",
            "fix": "Set gpu_preflight_pci_devices_path to /sys/bus/pci/devices (the default; leave it out of the "
            "inventory) or to a folder of the same layout (<bus id>/vendor, device, class).",
        }
    ]
    assert gpu_host.check_host(facts(gpus=gpus))["ok"] is True
    skipped = gpu_host.check_host(
        facts(gpus=dict(gpus, pci_devices_problem="/srv/pci is empty")), {"skip_checks": ["pci_devices"]}
    )
    assert skipped["ok"] is True


# --- secure_boot: a configured signing pair, DKMS's key, or neither ------------------------------------

SECURE_BOOT_CAUSE = (
    "Secure Boot is on and no module signing key is configured (no nvidia_driver_module_signing_key and "
    "nvidia_driver_module_signing_certificate, no DKMS key /var/lib/dkms/mok.pub); the kernel will refuse the "
    "unsigned NVIDIA module."
)
SECURE_BOOT_FIX = (
    "Set nvidia_driver_module_signing_key and nvidia_driver_module_signing_certificate to the private key and "
    "certificate of a Machine Owner Key enrolled on the host (mokutil --import), or turn Secure Boot off."
)
PAIR_FIX = (
    "Set both nvidia_driver_module_signing_key and nvidia_driver_module_signing_certificate to files on the "
    "controller (the private key and certificate of a Machine Owner Key enrolled on the host with mokutil "
    "--import), or turn Secure Boot off."
)
KEY, CERT = "/etc/gpu-fleet/mok.key", "/etc/gpu-fleet/mok.der"


def pair(key="", certificate="", key_found=False, certificate_found=False):
    return {"key": key, "certificate": certificate, "key_found": key_found, "certificate_found": certificate_found}


def test_secure_boot_without_any_key_names_both_ways_out():
    result = gpu_host.check_host(facts(secure_boot="SecureBoot enabled\n", module_signing=pair()))
    assert result["problems"] == [{"check": "secure_boot", "cause": SECURE_BOOT_CAUSE, "fix": SECURE_BOOT_FIX}]


@pytest.mark.parametrize(
    ("secure_boot", "signing", "dkms_key"),
    [
        ("SecureBoot enabled\n", pair(KEY, CERT, True, True), False),  # the configured pair
        ("SecureBoot enabled\n", pair(), True),  # DKMS's own key, today's case
        ("SecureBoot disabled\n", pair(KEY, "", False, False), False),  # off: no signing needed
        (None, pair(), False),  # no mokutil: no Secure Boot to speak of
    ],
)
def test_secure_boot_passes(secure_boot, signing, dkms_key):
    result = gpu_host.check_host(facts(secure_boot=secure_boot, module_signing=signing, signing_key=dkms_key))
    assert result["ok"], result["problems"]


@pytest.mark.parametrize(
    ("signing", "missing"),
    [
        (pair(KEY, "", True, False), "nvidia_driver_module_signing_certificate is not set"),
        (pair("", CERT, False, True), "nvidia_driver_module_signing_key is not set"),
        (
            pair(KEY, CERT, False, True),
            "nvidia_driver_module_signing_key (/etc/gpu-fleet/mok.key) is not a file on the controller",
        ),
        (
            pair(KEY, CERT, False, False),
            "nvidia_driver_module_signing_key (/etc/gpu-fleet/mok.key) is not a file on the controller; "
            "nvidia_driver_module_signing_certificate (/etc/gpu-fleet/mok.der) is not a file on the controller",
        ),
    ],
)
def test_secure_boot_with_an_incomplete_pair_names_what_is_missing(signing, missing):
    # DKMS's key on the host does not stand in for a pair the inventory configured wrongly.
    result = gpu_host.check_host(facts(secure_boot="SecureBoot enabled\n", module_signing=signing, signing_key=True))
    assert result["problems"] == [
        {
            "check": "secure_boot",
            "cause": f"Secure Boot is on and the module signing pair is incomplete: {missing}; without both the "
            "NVIDIA module stays unsigned and the kernel refuses it.",
            "fix": PAIR_FIX,
        }
    ]


# --- kernel_headers: a kernel upgrade waiting for its reboot ------------------------------------------


def test_missing_headers_with_a_newer_kernel_installed_ask_for_a_reboot_into_it():
    installed = ["6.1.0-9-amd64", "6.1.0-27-amd64", "6.1.0-28-amd64"]  # -28 > -27 > -9 by version, not by text
    result = gpu_host.check_host(facts(kernel_headers=False, installed_kernels=installed))
    assert result["problems"] == [
        {
            "check": "kernel_headers",
            "cause": "No kernel headers for the running kernel 6.1.0-27-amd64, and none can be installed: a kernel "
            "upgrade is pending, 6.1.0-28-amd64 is installed but the host still runs 6.1.0-27-amd64.",
            "fix": "Reboot into the new kernel 6.1.0-28-amd64 first, then rerun.",
        }
    ]


@pytest.mark.parametrize(
    ("running", "installed", "newer"),
    [
        ("5.14.0-427.13.1.el9_4.x86_64", ["5.14.0-503.11.1.el9_5.x86_64"], "5.14.0-503.11.1.el9_5.x86_64"),
        ("6.8.0-45-generic", ["6.8.0-100-generic", "6.8.0-51-generic"], "6.8.0-100-generic"),
        ("6.1.0-27-amd64", ["6.1.0-27-amd64", "6.1.0-9-amd64", "5.10.0-32-amd64"], None),  # only older ones
        ("6.1.0-27-amd64", ["extramodules", "6.1.0-27-amd64"], None),  # not a kernel release
        ("6.1.0-27-amd64", [], None),
    ],
)
def test_only_a_newer_kernel_by_version_order_counts_as_pending(running, installed, newer):
    (problem,) = gpu_host.check_host(facts(kernel=running, kernel_headers=False, installed_kernels=installed))[
        "problems"
    ]
    if newer:
        assert problem["fix"] == f"Reboot into the new kernel {newer} first, then rerun."
    else:
        assert problem["fix"] == "Install linux-headers-6.1.0-27-amd64 or boot a kernel whose headers are available."
        assert "pending" not in problem["cause"]


def test_a_newer_kernel_does_not_matter_while_the_headers_are_there():
    assert gpu_host.check_host(facts(kernel_headers=True, installed_kernels=["6.1.0-28-amd64"]))["ok"]


# --- reboot_local: a run cannot reboot the machine it runs on -----------------------------------------

REBOOT_LOCAL_CAUSE = (
    "nvidia_driver_reboot_allowed is true, but this host is managed over a local connection "
    "(ansible_connection: local); a run cannot reboot the machine it runs on."
)
REBOOT_LOCAL_FIX = (
    "Run the play from another controller, or set nvidia_driver_reboot_allowed: false and reboot by hand when the "
    "run asks for it."
)


@pytest.mark.parametrize("connection", ["local", "ansible.builtin.local"])
def test_reboot_allowed_under_a_local_connection_stops_the_host(connection):
    result = gpu_host.check_host(facts(reboot_allowed=True, connection=connection))
    assert result["problems"] == [
        {
            "check": "reboot_local",
            "cause": REBOOT_LOCAL_CAUSE.replace(": local)", f": {connection})"),
            "fix": REBOOT_LOCAL_FIX,
        }
    ]


@pytest.mark.parametrize(
    ("allowed", "connection", "manage_kernel"),
    [
        (False, "local", True),  # the run only asks for a reboot
        (True, "ssh", True),
        (True, "podman_pipelined", True),
        (True, "local", False),  # a container: nvidia_driver never reboots it
    ],
)
def test_reboot_local_passes(allowed, connection, manage_kernel):
    result = gpu_host.check_host(facts(reboot_allowed=allowed, connection=connection, manage_kernel=manage_kernel))
    assert result["ok"], result["problems"]


def test_reboot_local_can_be_skipped_and_is_then_reported():
    result = gpu_host.check_host(facts(reboot_allowed=True, connection="local"), {"skip_checks": ["reboot_local"]})
    assert result["ok"] and checks(result, "overridden") == ["reboot_local"]


# gpu_host_facts: the check's input built from canned probe results, as gpu_preflight registers them.
VENV = "/opt/tensorflow/2.12"
ROOT_1180 = "/usr/local/cuda-11.8"
SETUP = {
    "distribution": "Ubuntu",
    "distribution_major_version": "22",
    "distribution_version": "22.04",
    "user_id": "root",
    "user_uid": "0",
    "kernel": "6.1.0-27-amd64",
    "gpu_facts": {"driver_loaded": True, "driver_version": "520.61.05", "count": 1, "gpus": []},
}
FINDMNT = '{"filesystems": [{"target": "/", "options": "rw", "avail": 53687091200}]}'
APPS = "4242, python3, GPU-3f1c2a7e-5b9d-4c11-8e2a-9d0b7c6e4a21, 30512\n"


def probe_inputs(**over):
    state = {
        "stat": {"/var/lib/dkms/mok.pub": {"exists": True}, "/lib/modules/6.1.0-27-amd64/build": {"exists": True}},
        "read": {"/proc/modules": "nvidia 56508416 0 - Live 0x0\n"},
        "glob": {"/lib/modules/*/": ["/lib/modules/6.1.0-27-amd64/", "/lib/modules/6.8.0-1-amd64/"]},
        "run": {
            "findmnt": {"rc": 0, "stdout": FINDMNT},
            "installers": {"rc": 0, "stdout": "77 /bin/sh ./cuda_11.8.0_linux.run --silent\n"},
            "compute_apps": {"rc": 0, "stdout": APPS},
            "secure_boot": {"rc": 0, "stdout": "SecureBoot enabled\n"},
        },
    }
    present = {
        "stat": {ROOT_1180: {"exists": False}, VENV: {"exists": True}},
        "glob": {VENV + "/*": [VENV + "/data.csv"], VENV + "/.*": [VENV + "/.git"]},
    }
    base = {
        "state": state,
        "present": present,
        "installed_paths": [ROOT_1180, VENV],
        "venv_paths": [VENV],
        "supported_os": {"Ubuntu": ["22.04"]},
        "manage_kernel": True,
        "kernel_build": "/lib/modules/6.1.0-27-amd64/build",
        "dkms_signing_key": "/var/lib/dkms/mok.pub",
        "headers_installable": False,
        "headers_package": "linux-headers-6.1.0-27-amd64",
        "driver_version": "535.104.05",
        "driver_install": "yes",
        "cache_dir": "/var/cache/gpu-artifacts",
        "cuda_tmpdir": "/var/tmp/cuda",
        "driver_tmpdir": "/var/tmp/drv",
        "min_free_mib": 0,
        "module_signing_key": "",
        "module_signing_certificate": "",
        "key_found": False,
        "certificate_found": False,
        "reboot_allowed": False,
        "expected_gpu_count": None,
        "connection": "",
    }
    base.update(over)
    return base


def built(setup=None, **over):
    return gpu_host.host_facts(
        setup or SETUP, {"stacks": [dict(STACK, name="tf212")], "driver": DRIVER}, probe_inputs(**over)
    )


def test_host_facts_reads_the_probes():
    result = built()
    assert result["os"] == {"distribution": "Ubuntu", "major_version": "22", "version": "22.04"}
    assert result["user"] == {"name": "root", "uid": 0}
    assert result["present"] == [VENV]
    assert result["venv_entries"] == [VENV + "/data.csv", VENV + "/.git"]
    assert result["venvs"] == {"tf212": VENV}
    assert result["mounts"] == [{"mount": "/", "options": "rw", "size_available": 50 * GIB}]
    assert result["installed_kernels"] == ["6.1.0-27-amd64", "6.8.0-1-amd64"]
    assert result["signing_key"] is True and result["kernel_headers"] is True
    assert result["secure_boot"] == "SecureBoot enabled\n"
    assert result["installers"] == ["77 /bin/sh ./cuda_11.8.0_linux.run --silent"]
    assert result["connection"] == "ssh"
    assert [p["variable"] for p in result["exec_paths"]] == ["cuda_toolkit_tmpdir", "nvidia_driver_tmpdir"]


def test_host_facts_space_leaves_out_what_is_present():
    purposes = [need["purpose"] for need in built()["space"]]
    # The venv exists; the toolkit and the driver (520 loaded, 535 pinned) do not.
    assert purposes == ["artifact cache", "CUDA installer scratch", "CUDA toolkits", "driver installer scratch"]


def test_host_facts_driver_change_needs_an_install_and_another_loaded_driver():
    assert built()["driver_change"] is True
    assert built(driver_install=False)["driver_change"] is False
    assert built(driver_version="520.61.05")["driver_change"] is False
    unloaded = dict(SETUP, gpu_facts={"driver_loaded": False, "driver_version": None})
    assert built(unloaded)["driver_change"] is False


def test_host_facts_reads_compute_apps_only_from_a_loaded_driver_that_answered():
    assert [app["pid"] for app in built()["compute_apps"]] == [4242]
    unloaded = dict(SETUP, gpu_facts={"driver_loaded": False, "driver_version": None})
    assert built(unloaded)["compute_apps"] == []
    failed = probe_inputs()["state"]
    failed["run"]["compute_apps"] = {"rc": 9, "stdout": APPS}
    assert built(state=failed)["compute_apps"] == []


def test_host_facts_kernel_headers_missing_unless_installable_or_not_probed():
    state = probe_inputs()["state"]
    state["stat"]["/lib/modules/6.1.0-27-amd64/build"] = {"exists": False}
    assert built(state=state)["kernel_headers"] is False
    assert built(state=state, headers_installable=True)["kernel_headers"] is True
    # No kernel probe (no kernel modules on this host): nothing to stop on.
    bare = {"stat": {}, "read": {}, "glob": {}, "run": {"findmnt": {"rc": 0, "stdout": FINDMNT}}}
    result = built(state=bare, manage_kernel=False)
    assert result["kernel_headers"] is True and result["proc_modules"] == "" and result["secure_boot"] is None


def test_host_facts_feed_the_check():
    result = gpu_host.check_host(built(reboot_allowed="true", connection="local"))
    assert checks(result) == ["venv_occupied", "reboot_local", "installer_running", "gpus_busy"]
    assert result["problems"][0]["cause"].startswith(f"{VENV} (venv of stack tf212) exists and is not a virtual")


# nvidia_gpu_facts' error for Debian's real nvidia-smi 535.261.03 on a host without its kernel module
# (tests/fixtures/nvidia_smi/real-535.261.03-no-module/query-gpu.txt, exit 9).
REAL_EXIT_9 = (
    (Path(__file__).resolve().parents[3] / "fixtures/nvidia_smi/real-535.261.03-no-module/query-gpu.txt")
    .read_text()
    .strip()
)


def test_a_driver_whose_kernel_module_is_not_loaded_is_named_and_the_run_goes_on():
    said = f"/usr/bin/nvidia-smi --query-gpu exited 9: {REAL_EXIT_9} NVIDIA kernel module not loaded: on a host, ..."
    gpus = {"count": 0, "module_not_loaded": True, "errors": [said], "pci_count": 2, "pci_source": "sysfs"}
    result = gpu_host.check_host(facts(gpus=gpus, expected_gpu_count=2))
    assert result["ok"] and result["problems"] == []
    (warning,) = [w for w in result["warnings"] if w["check"] == "kernel_module"]
    assert warning["cause"] == said and "NVIDIA kernel module not loaded" in warning["cause"]
    assert "the verification fails" in warning["fix"]
    strict = gpu_host.check_host(facts(gpus=gpus, expected_gpu_count=2), {"strict_hardware": True})
    assert [p["check"] for p in strict["problems"]] == ["kernel_module"]
    loaded = gpu_host.check_host(facts(gpus=dict(gpus, module_not_loaded=False), expected_gpu_count=2))
    assert not [w for w in loaded["warnings"] if w["check"] == "kernel_module"]


WHEELS_STACK = {
    "venv": "/opt/tensorflow/2.18",
    "cuda_toolkit": {"source": "wheels", "root": None, "runfile": None},
    "cudnn": {"source": "wheels", "archive": None},
}


def test_a_wheels_stack_needs_no_toolkit_space_and_a_larger_venv():
    needs = gpu_host.space_needs([WHEELS_STACK], None, {}, PATHS)
    assert needs == [
        {
            "path": "/opt/tensorflow/2.18",
            "need_bytes": gpu_host.VENV_BYTES + gpu_host.CUDA_WHEELS_BYTES,
            "purpose": "TensorFlow venvs",
            "variable": "the stack's venv",
        }
    ]
    beside = gpu_host.space_needs([STACK, WHEELS_STACK], None, {}, PATHS)
    assert [n["path"] for n in beside][:3] == ["/var/cache/gpu-artifacts", "/var/tmp/cuda", "/usr/local/cuda-11.8"]
    assert beside[-1]["need_bytes"] == 2 * gpu_host.VENV_BYTES + gpu_host.CUDA_WHEELS_BYTES
