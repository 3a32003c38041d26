"""The driver filters: the loaded kernel module's version (nvidia_driver's configure.yml), and the package
method's decisions - which package set a host takes, the exact packages it installs and holds, and
packages or runfile."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

# tests/conftest.py puts ROOT/collections on sys.path, so the filter imports its parser by collection path.
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_driver

ROOT = Path(__file__).resolve().parents[4]
PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  520.61.05  Thu Sep 29 05:30:25 UTC 2022\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  (dvs-builder@x)\n"


def ansible_env() -> dict[str, str]:
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOME=str(ROOT / ".ansible"))


def render(expression: str, *extra_vars: str) -> object:
    """``expression`` as Ansible renders it (``ansible localhost -m debug``, the collection found by its
    FQCN), with ``-e`` for each of ``extra_vars``."""
    out = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible")),
            "localhost",
            "-m",
            "ansible.builtin.debug",
            "-a",
            f"msg={expression}",
            *[arg for extra in extra_vars for arg in ("-e", extra)],
        ],
        capture_output=True,
        text=True,
        env=dict(ansible_env(), ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1"),
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["msg"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [(PROPRIETARY, "520.61.05"), (OPEN_MODULE, "535.104.05"), ("", None), (None, None), ("GCC version: 12\n", None)],
)
def test_filter_returns_the_module_version(text: str | None, expected: str | None) -> None:
    assert gpu_driver.gpu_driver_module_version(text) == expected


def test_filters_are_registered() -> None:
    filters = gpu_driver.FilterModule().filters()
    assert filters == {
        "gpu_driver_module_version": gpu_driver.gpu_driver_module_version,
        "gpu_driver_os_key": gpu_driver.gpu_driver_os_key,
        "gpu_driver_packages": gpu_driver.gpu_driver_packages,
        "gpu_driver_missing_packages": gpu_driver.gpu_driver_missing_packages,
        "gpu_driver_method": gpu_driver.gpu_driver_method,
        "gpu_driver_repository": gpu_driver.gpu_driver_repository,
        "gpu_driver_message": gpu_driver.gpu_driver_message,
        "gpu_driver_package_problem": gpu_driver.gpu_driver_package_problem,
        "gpu_driver_sources_problem": gpu_driver.gpu_driver_sources_problem,
        "gpu_driver_hold_failures": gpu_driver.gpu_driver_hold_failures,
        "gpu_driver_found": gpu_driver.gpu_driver_found,
        "gpu_driver_problems": gpu_driver.gpu_driver_problems,
    }


def test_a_version_that_only_starts_the_same_is_not_the_loaded_one() -> None:
    # The old check was a substring test: "520.61.0" in the text of a 520.61.05 module was True.
    assert gpu_driver.gpu_driver_module_version(PROPRIETARY) != "520.61.0"


def test_configure_yml_expression_through_ansible() -> None:
    """The role's when: condition, rendered by Ansible with the filter found by its FQCN."""
    expression = (
        "{{ [(proc | b64encode | b64decode | gpu_fleet.tf_hosts.gpu_driver_module_version) != '520.61.05',"
        " (proc | b64encode | b64decode | gpu_fleet.tf_hosts.gpu_driver_module_version) != '520.61.0'] }}"
    )
    assert render(expression, json.dumps({"proc": PROPRIETARY})) == [False, True]


# --- package sets: what each supported OS gets ----------------------------------------------------------

SETS = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/packages.yml").read_text())["__nvidia_driver_package_sets"]
# Setup facts as ansible.builtin.setup reports them (the keys the filter reads, and os_family).
DEBIAN_12 = {
    "distribution": "Debian",
    "distribution_major_version": "12",
    "distribution_version": "12.7",
    "os_family": "Debian",
}
UBUNTU_2204 = {
    "distribution": "Ubuntu",
    "distribution_major_version": "22",
    "distribution_version": "22.04",
    "os_family": "Debian",
}
UBUNTU_2404 = {
    "distribution": "Ubuntu",
    "distribution_major_version": "24",
    "distribution_version": "24.04",
    "os_family": "Debian",
}
ROCKY_9 = {
    "distribution": "Rocky",
    "distribution_major_version": "9",
    "distribution_version": "9.4",
    "os_family": "RedHat",
}
ALMA_9 = {
    "distribution": "AlmaLinux",
    "distribution_major_version": "9",
    "distribution_version": "9.4",
    "os_family": "RedHat",
}
RHEL_9 = {
    "distribution": "RedHat",
    "distribution_major_version": "9",
    "distribution_version": "9.4",
    "os_family": "RedHat",
}
VERSION = "535.104.05"


def packages(facts: dict, version: str = VERSION, **options) -> dict:
    """What the package method installs on a host with these facts (kernel modules unless told)."""
    options.setdefault("kernel_modules", True)
    return gpu_driver.gpu_driver_packages(SETS, gpu_driver.gpu_driver_os_key(facts), version, **options)


@pytest.mark.parametrize(
    ("facts", "key"),
    [
        (DEBIAN_12, "Debian-12"),
        (UBUNTU_2204, "Ubuntu-22"),
        (UBUNTU_2404, "Ubuntu-24"),
        (RHEL_9, "RedHat-9"),
        (ROCKY_9, "RedHat-9"),
        (ALMA_9, "RedHat-9"),
        (dict(DEBIAN_12, distribution_major_version="11"), None),
        (dict(UBUNTU_2204, distribution_major_version="20"), None),
        (dict(ROCKY_9, distribution_major_version="8"), None),
        ({"distribution": "Fedora", "distribution_major_version": "40", "os_family": "RedHat"}, None),
        ({"distribution": "CentOS", "distribution_major_version": "9", "os_family": "RedHat"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_os_key(facts, key) -> None:
    assert gpu_driver.gpu_driver_os_key(facts) == key


def test_every_os_key_has_a_package_set_and_every_set_an_os_key() -> None:
    assert sorted(SETS) == sorted(gpu_driver.OS_KEYS)


def test_debian_12_gets_the_compute_only_packages_at_the_exact_version() -> None:
    """The names the stand-in .debs carry (tests/fixtures/nvidia): user space, then the kernel modules."""
    result = packages(DEBIAN_12, kernel_open=True)
    assert result["manager"] == "apt" and result["branch"] == "535"
    assert result["install"] == [
        "nvidia-driver-cuda=535.104.05-1",
        "libcuda1=535.104.05-1",
        "libnvidia-ml1=535.104.05-1",
        "nvidia-smi=535.104.05-1",
        "nvidia-kernel-open-dkms=535.104.05-1",
    ]
    assert result["names"] == [
        "nvidia-driver-cuda",
        "libcuda1",
        "libnvidia-ml1",
        "nvidia-smi",
        "nvidia-kernel-open-dkms",
    ]
    assert result["hold"] == result["names"]
    assert (result["hold_method"], result["hold_requires"]) == ("dpkg_selections", [])
    assert (result["kernel_modules"], result["module_stream"], result["fabricmanager_service"]) == ("open", None, None)
    assert result["repository"]["url"] == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    assert result["repository"]["key_file"] == "3bf863cc.pub"
    # Exactly the held packages, nothing that merely shares a prefix (nvidia-container-toolkit).
    blacklist = [re.compile(pattern) for pattern in result["unattended_upgrades_blacklist"]]
    assert [name for name in result["names"] if not any(p.match(name) for p in blacklist)] == []
    assert not any(p.match(other) for p in blacklist for other in ("nvidia-container-toolkit", "libcuda1-dbg"))
    assert result["dry_run_command"][:3] == ["apt-get", "install", "--simulate"]
    assert result["dry_run_command"][-len(result["install"]) :] == result["install"]


def test_debian_12_proprietary_modules_and_fabric_manager() -> None:
    result = packages(DEBIAN_12, kernel_open=False, fabricmanager=True)
    assert result["install"][-2:] == ["nvidia-kernel-dkms=535.104.05-1", "nvidia-fabricmanager-535=535.104.05-1"]
    assert "nvidia-kernel-open-dkms" not in result["names"]
    assert result["hold"][-2:] == ["nvidia-kernel-dkms", "nvidia-fabricmanager-535"]
    assert (result["kernel_modules"], result["fabricmanager_service"]) == ("proprietary", "nvidia-fabricmanager")


@pytest.mark.parametrize("facts", [DEBIAN_12, UBUNTU_2204, UBUNTU_2404, ROCKY_9])
def test_a_container_gets_no_kernel_packages(facts) -> None:
    with_kernel = packages(facts, kernel_open=True)
    container = packages(facts, kernel_modules=False, kernel_open=True)
    kernel_names = set(SETS[with_kernel["os_key"]]["kernel"]["open"]) | set(
        SETS[with_kernel["os_key"]]["kernel"]["proprietary"]
    )
    assert container["kernel_modules"] is None
    assert not {name.format(branch="535") for name in kernel_names} & set(container["names"])
    assert container["names"] == with_kernel["names"][:-1]  # the same user space, without the one module package
    assert container["hold"] == container["names"]


@pytest.mark.parametrize(("facts", "repo"), [(UBUNTU_2204, "ubuntu2204"), (UBUNTU_2404, "ubuntu2404")])
def test_ubuntu_gets_branch_named_packages_versioned_0ubuntu1(facts, repo) -> None:
    result = packages(facts, version="550.54.15", kernel_open=True, fabricmanager=True)
    assert result["install"] == [
        "libnvidia-compute-550=550.54.15-0ubuntu1",
        "nvidia-utils-550=550.54.15-0ubuntu1",
        "nvidia-compute-utils-550=550.54.15-0ubuntu1",
        "nvidia-dkms-550-open=550.54.15-0ubuntu1",
        # NVIDIA's Ubuntu repositories version the fabric manager X.Y.Z-1, unlike the driver packages.
        "nvidia-fabricmanager-550=550.54.15-1",
    ]
    assert result["hold"] == [spec.split("=")[0] for spec in result["install"]]
    assert result["fabricmanager_service"] == "nvidia-fabricmanager"
    assert result["repository"]["url"] == f"https://developer.download.nvidia.com/compute/cuda/repos/{repo}/x86_64/"
    assert packages(facts, version="550.54.15")["install"][-1] == "nvidia-dkms-550=550.54.15-0ubuntu1"


def test_rocky_9_gets_rhel_packages_with_dnf_specs_stream_and_versionlock() -> None:
    result = packages(ROCKY_9, version="570.124.06", kernel_open=True, fabricmanager=True)
    assert (result["os_key"], result["manager"]) == ("RedHat-9", "dnf")
    assert result["install"] == [
        "nvidia-driver-cuda-570.124.06",
        "nvidia-driver-cuda-libs-570.124.06",
        "kmod-nvidia-open-dkms-570.124.06",
        "nvidia-fabric-manager-570.124.06",
    ]
    assert result["hold"] == [
        "nvidia-driver-cuda",
        "nvidia-driver-cuda-libs",
        "kmod-nvidia-open-dkms",
        "nvidia-fabric-manager",
    ]
    assert (result["hold_method"], result["hold_requires"]) == ("versionlock", ["python3-dnf-plugin-versionlock"])
    assert result["module_stream"] == "nvidia-driver:570-open"
    assert result["unattended_upgrades_blacklist"] == []
    assert result["repository"]["key_file"] == "D42D0685.pub"
    proprietary = packages(ROCKY_9, version="570.124.06")
    assert proprietary["install"][-1] == "kmod-nvidia-latest-dkms-570.124.06"
    assert proprietary["module_stream"] == "nvidia-driver:570-dkms"
    assert proprietary["fabricmanager_service"] is None


def test_a_two_part_driver_version_is_a_release_too() -> None:
    assert packages(DEBIAN_12, version="515.76")["install"][0] == "nvidia-driver-cuda=515.76-1"


def test_boolean_options_may_come_as_ansible_strings() -> None:
    assert packages(DEBIAN_12, kernel_modules="false", kernel_open="yes") == packages(
        DEBIAN_12, kernel_modules=False, kernel_open=True
    )


# --- what a host still lacks (package_facts) -------------------------------------------------------------


def test_missing_packages_are_those_absent_or_at_another_version() -> None:
    wanted = packages(DEBIAN_12, kernel_open=True)
    installed = {
        "nvidia-driver-cuda": [{"version": "535.104.05-1", "source": "apt"}],
        "libcuda1": [{"version": "550.54.15-1", "source": "apt"}],  # another driver
        "nvidia-smi": [{"version": "1:535.104.05-1", "source": "apt"}],  # an epoch counts as the same version
        "nvidia-kernel-dkms": [{"version": "535.104.05-1", "source": "apt"}],  # the other module kind
    }
    assert gpu_driver.gpu_driver_missing_packages(wanted, installed) == [
        "libcuda1=535.104.05-1",
        "libnvidia-ml1=535.104.05-1",
        "nvidia-kernel-open-dkms=535.104.05-1",
    ]
    everything = {name: [{"version": version}] for name, version in wanted["versions"].items()}
    assert gpu_driver.gpu_driver_missing_packages(wanted, everything) == []
    assert gpu_driver.gpu_driver_missing_packages(wanted, None) == wanted["install"]


def test_missing_rpm_packages_compare_the_version_without_release_and_epoch() -> None:
    wanted = packages(ROCKY_9, version="570.124.06", kernel_open=True)
    rpm = {"version": "570.124.06", "release": "1.el9", "epoch": 3, "source": "rpm"}
    installed = {"nvidia-driver-cuda": [rpm], "nvidia-driver-cuda-libs": [dict(rpm, version="570.86.15")]}
    assert gpu_driver.gpu_driver_missing_packages(wanted, installed) == [
        "nvidia-driver-cuda-libs-570.124.06",
        "kmod-nvidia-open-dkms-570.124.06",
    ]


# --- package method errors: cause and fix ---------------------------------------------------------------


@pytest.mark.parametrize("os_key", [None, "Debian-11"])
def test_an_os_without_a_package_set_names_the_sets_and_the_runfile(os_key) -> None:
    with pytest.raises(AnsibleFilterError) as error:
        gpu_driver.gpu_driver_packages(SETS, os_key, VERSION, True)
    assert str(error.value) == (
        f"No driver package set for OS key {os_key!r} (sets: Debian-12, RedHat-9, Ubuntu-22, Ubuntu-24), so the driver "
        "cannot be installed from packages on this host; install it from NVIDIA's runfile (nvidia_driver_method: "
        "runfile), or add a set for this OS to nvidia_driver's vars/packages.yml."
    )


@pytest.mark.parametrize("version", ["latest", "535", "535.104.05.1", "r535.104.05", " 535.104.05", "", None])
def test_a_version_that_is_no_driver_release_is_refused(version) -> None:
    with pytest.raises(AnsibleFilterError) as error:
        gpu_driver.gpu_driver_packages(SETS, "Debian-12", version, True)
    assert str(error.value) == (
        f"Driver version {version!r} is not a release as NVIDIA writes it (X.Y or X.Y.Z, such as 520.61.05), so no "
        "package version can be formed from it; set nvidia_driver_version to such a release."
    )


def test_ubuntu_refuses_a_branch_newer_than_its_package_names() -> None:
    assert packages(UBUNTU_2404, version="580.65.06")["branch"] == "580"
    with pytest.raises(AnsibleFilterError) as error:
        packages(UBUNTU_2404, version="590.44.01")
    assert str(error.value) == (
        "Driver 590.44.01 is of branch 590, but the Ubuntu-24 package names in nvidia_driver's vars/packages.yml hold "
        "only up to branch 589; pin a driver of branch 589 or older, or install this one from NVIDIA's runfile "
        "(nvidia_driver_method: runfile)."
    )
    assert packages(DEBIAN_12, version="590.44.01")["branch"] == "590"  # Debian's names carry no branch


def test_an_incomplete_set_names_what_it_lacks() -> None:
    broken = {"Debian-12": {key: value for key, value in SETS["Debian-12"].items() if key not in ("hold", "kernel")}}
    with pytest.raises(AnsibleFilterError, match=r"^The driver package set Debian-12 lacks kernel, hold .*complete it"):
        gpu_driver.gpu_driver_packages(broken, "Debian-12", VERSION, True)
    zypper = {"Debian-12": dict(SETS["Debian-12"], manager="zypper")}
    with pytest.raises(AnsibleFilterError, match="lacks a known manager"):
        gpu_driver.gpu_driver_packages(zypper, "Debian-12", VERSION, True)


def test_an_option_that_is_no_boolean_is_named() -> None:
    with pytest.raises(AnsibleFilterError) as error:
        gpu_driver.gpu_driver_packages(SETS, "Debian-12", VERSION, "auto")
    assert str(error.value) == "kernel_modules is 'auto', not a boolean; pass true or false."


# --- packages or runfile ---------------------------------------------------------------------------------

RECORD_0_10 = "520.61.05\n"  # written by 0.10.0: the version only, a runfile install
RECORD_RUNFILE = "535.104.05\nrunfile\n"
RECORD_PACKAGE = "535.104.05\npackage\n"


@pytest.mark.parametrize(
    ("requested", "record", "uninstaller", "method", "switch_from"),
    [
        # auto keeps what the host has, and takes packages on a host without a driver
        ("auto", None, False, "package", None),
        ("auto", "", False, "package", None),
        ("auto", RECORD_0_10, True, "runfile", None),
        ("auto", RECORD_0_10, False, "runfile", None),
        ("auto", RECORD_RUNFILE, True, "runfile", None),
        ("auto", None, True, "runfile", None),  # interrupted runfile install: record removed, uninstaller there
        ("auto", RECORD_PACKAGE, False, "package", None),
        ("auto", RECORD_PACKAGE, True, "runfile", None),  # a runfile installed over the packages by hand
        # package asked for
        ("package", None, False, "package", None),
        ("package", RECORD_PACKAGE, False, "package", None),
        ("package", RECORD_0_10, True, "package", "runfile"),
        ("package", RECORD_RUNFILE, False, "package", "runfile"),
        ("package", None, True, "package", "runfile"),
        # runfile asked for
        ("runfile", None, False, "runfile", None),
        ("runfile", RECORD_0_10, True, "runfile", None),
        ("runfile", RECORD_PACKAGE, False, "runfile", "package"),
        ("RUNFILE", RECORD_PACKAGE, False, "runfile", "package"),
        # the distribution's own packages asked for, and kept by auto once recorded
        ("distribution", RECORD_RUNFILE, True, "distribution", "runfile"),
        ("distribution", "535.261.03\ndistribution\n", False, "distribution", None),
        ("auto", "535.261.03\ndistribution\n", False, "distribution", None),
        ("runfile", "535.261.03\ndistribution\n", False, "runfile", "distribution"),
    ],
)
def test_method_decision(requested, record, uninstaller, method, switch_from) -> None:
    result = gpu_driver.gpu_driver_method(requested, record, uninstaller)
    assert (result["method"], result["switch_from"]) == (method, switch_from)


def test_method_reports_the_host_state_it_decided_from() -> None:
    assert gpu_driver.gpu_driver_method("auto", RECORD_0_10, False) == {
        "method": "runfile",
        "switch_from": None,
        "current": "runfile",
        "recorded_version": "520.61.05",
    }
    assert gpu_driver.gpu_driver_method("runfile", "535.104.05\r\npackage\r\n", False)["current"] == "package"
    assert gpu_driver.gpu_driver_method("auto", None, False)["recorded_version"] is None


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(AnsibleFilterError) as error:
        gpu_driver.gpu_driver_method("deb", "", False)
    assert str(error.value) == (
        "nvidia_driver_method is 'deb'; set it to auto (keep the method the host has), package, runfile or distribution."
    )


def test_a_record_naming_no_method_is_refused() -> None:
    with pytest.raises(AnsibleFilterError) as error:
        gpu_driver.gpu_driver_method("auto", "535.104.05\nrpm\n", False)
    assert str(error.value) == (
        "The driver's completion record /var/lib/gpu_fleet/nvidia_driver.done names the install method 'rpm' on its "
        "second line, none of package, runfile or distribution; remove the record and rerun (the driver is then "
        "installed again)."
    )


def test_package_method_filters_through_ansible() -> None:
    """os key, packages and method as the role calls them: facts, the data file's sets, booleans from Jinja."""
    expression = (
        "{{ [__nvidia_driver_package_sets | gpu_fleet.tf_hosts.gpu_driver_packages("
        "facts | gpu_fleet.tf_hosts.gpu_driver_os_key, '535.104.05', 'no' | bool, true, false),"
        " 'auto' | gpu_fleet.tf_hosts.gpu_driver_method(record, true)] }}"
    )
    rendered, method = render(
        expression,
        "@" + str(ROOT / "roles/nvidia_driver/vars/packages.yml"),
        json.dumps({"facts": ROCKY_9, "record": RECORD_0_10}),
    )
    assert rendered["install"] == ["nvidia-driver-cuda-535.104.05", "nvidia-driver-cuda-libs-535.104.05"]
    assert rendered["kernel_modules"] is None and rendered["module_stream"] == "nvidia-driver:535-open"
    assert (method["method"], method["switch_from"]) == ("runfile", None)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("gpu_driver_module_version", "/proc/driver/nvidia/version"),
        ("gpu_driver_os_key", "Debian-12"),
        ("gpu_driver_packages", "hold"),
        ("gpu_driver_missing_packages", "package_facts"),
        ("gpu_driver_method", "nvidia-uninstall"),
        ("gpu_driver_repository", "signed-by"),
    ],
)
def test_ansible_doc_renders_each_filter(name: str, text: str) -> None:
    out = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-t", "filter", f"gpu_fleet.tf_hosts.{name}"],
        capture_output=True,
        text=True,
        env=ansible_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for expected in (name, text, "RETURN VALUES", "EXAMPLES"):
        assert expected in out.stdout, expected


# --- repository files: what each supported OS gets -------------------------------------------------------

NVIDIA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"


@pytest.mark.parametrize(
    ("facts", "folder", "key"),
    [
        (DEBIAN_12, "debian12", "3bf863cc.pub"),
        (UBUNTU_2204, "ubuntu2204", "3bf863cc.pub"),
        (UBUNTU_2404, "ubuntu2404", "3bf863cc.pub"),
    ],
)
def test_apt_repository_file(facts: dict, folder: str, key: str) -> None:
    repo = gpu_driver.gpu_driver_repository(packages(facts))
    assert repo == {
        "path": "/etc/apt/sources.list.d/gpu-fleet-nvidia-driver.list",
        "content": f"deb [signed-by=/etc/apt/keyrings/gpu-fleet-nvidia-driver.asc] {NVIDIA_REPOS}/{folder}/x86_64/ /\n",
        "key_path": "/etc/apt/keyrings/gpu-fleet-nvidia-driver.asc",
        "key_url": f"{NVIDIA_REPOS}/{folder}/x86_64/{key}",
        "url": f"{NVIDIA_REPOS}/{folder}/x86_64/",
    }


@pytest.mark.parametrize("facts", [RHEL_9, ROCKY_9, ALMA_9])
def test_dnf_repository_file(facts: dict) -> None:
    repo = gpu_driver.gpu_driver_repository(packages(facts))
    assert repo["path"] == "/etc/yum.repos.d/gpu-fleet-nvidia-driver.repo"
    assert repo["content"].splitlines() == [
        "[gpu-fleet-nvidia-driver]",
        "name=NVIDIA CUDA repository (driver packages, gpu_fleet.tf_hosts)",
        f"baseurl={NVIDIA_REPOS}/rhel9/x86_64/",
        "enabled=1",
        "gpgcheck=1",
        "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-gpu-fleet-nvidia-driver",
    ]
    assert repo["key_url"] == f"{NVIDIA_REPOS}/rhel9/x86_64/D42D0685.pub"


def test_a_site_mirror_replaces_nvidias_url() -> None:
    mirror = "https://mirror.example.internal/nvidia/debian12/"
    repo = gpu_driver.gpu_driver_repository(packages(DEBIAN_12), mirror)
    assert repo["content"] == f"deb [signed-by=/etc/apt/keyrings/gpu-fleet-nvidia-driver.asc] {mirror} /\n"


def test_a_binary_keyring_keeps_its_gpg_name() -> None:
    repo = gpu_driver.gpu_driver_repository(packages(DEBIAN_12), "", "/srv/keys/cuda-archive-keyring.gpg")
    assert repo["key_path"] == "/etc/apt/keyrings/gpu-fleet-nvidia-driver.gpg"
    assert "[signed-by=/etc/apt/keyrings/gpu-fleet-nvidia-driver.gpg]" in repo["content"]


@pytest.mark.parametrize("url", ["https://mirror/nvidia debian12/", "https://mirror/[x]/"])
def test_a_mirror_url_that_would_break_the_source_line_is_refused(url: str) -> None:
    with pytest.raises(AnsibleFilterError, match="a space or a bracket"):
        gpu_driver.gpu_driver_repository(packages(DEBIAN_12), url)


def test_auto_stops_on_a_driver_this_role_did_not_install() -> None:
    with pytest.raises(AnsibleFilterError, match="has an NVIDIA driver that this role did not install"):
        gpu_driver.gpu_driver_method("auto", "", False, True)
    # Asked explicitly, or recorded, or from the runfile: the method is known.
    assert gpu_driver.gpu_driver_method("package", "", False, True)["method"] == "package"
    assert gpu_driver.gpu_driver_method("auto", "520.61.05\npackage\n", False, True)["method"] == "package"
    assert gpu_driver.gpu_driver_method("auto", "", True, True)["method"] == "runfile"


def test_repository_needs_a_known_manager_and_a_url() -> None:
    with pytest.raises(AnsibleFilterError, match="package manager 'zypper'"):
        gpu_driver.gpu_driver_repository({"manager": "zypper"})
    with pytest.raises(AnsibleFilterError, match="set nvidia_driver_package_repository_url"):
        gpu_driver.gpu_driver_repository({"manager": "apt", "repository": {}})


# --- hold commands: how each supported OS holds and releases the packages --------------------------------


def test_apt_holds_names_and_says_which_are_new() -> None:
    debian = packages(DEBIAN_12, kernel_modules=False)
    names = ["nvidia-driver-cuda", "libcuda1", "libnvidia-ml1", "nvidia-smi"]
    assert debian["hold_command"] == ["apt-mark", "hold", *names]
    assert debian["release_command"] == ["apt-mark", "unhold", *names]
    # The role holds the names apt-mark does not list as held through Ansible's dpkg_selections.
    assert (debian["hold_method"], debian["held_command"], debian["hold"]) == (
        "dpkg_selections",
        ["apt-mark", "showhold"],
        names,
    )
    assert debian["hold_requires"] == []
    new = re.compile(debian["hold_changed"])
    assert new.search("libcuda1 was already set on hold.\nnvidia-smi set on hold.\n")
    assert not new.search("libcuda1 was already set on hold.\nnvidia-smi was already set on hold.\n")


@pytest.mark.parametrize("facts", [UBUNTU_2204, UBUNTU_2404])
def test_ubuntu_holds_its_own_branch_names(facts: dict) -> None:
    ubuntu = packages(facts, kernel_modules=False)
    assert ubuntu["hold_command"][:2] == ["apt-mark", "hold"]
    assert "libnvidia-compute-535" in ubuntu["hold_command"]


def test_dnf_locks_exact_versions_with_the_versionlock_plugin() -> None:
    rocky = packages(ROCKY_9, kernel_modules=False)
    assert rocky["hold_command"] == [
        "dnf",
        "versionlock",
        "add",
        "nvidia-driver-cuda-535.104.05",
        "nvidia-driver-cuda-libs-535.104.05",
    ]
    assert rocky["release_command"] == ["dnf", "versionlock", "delete", "nvidia-driver-cuda", "nvidia-driver-cuda-libs"]
    assert rocky["hold_requires"] == ["python3-dnf-plugin-versionlock"]
    assert (rocky["hold_method"], rocky["held_command"]) == ("versionlock", None)  # its add says what it locked
    assert re.search(rocky["hold_changed"], "Adding versionlock on: nvidia-driver-cuda-0:535.104.05-1.el9.*")
    assert not re.search(rocky["hold_changed"], "Package already locked in equivalent form: nvidia-driver-cuda")


def test_an_unknown_hold_method_is_refused() -> None:
    sets = {"Debian-12": dict(SETS["Debian-12"], hold="pin")}
    with pytest.raises(AnsibleFilterError, match="hold dpkg_selections or versionlock"):
        gpu_driver.gpu_driver_packages(sets, "Debian-12", VERSION, False)


@pytest.mark.parametrize(
    ("facts", "replaced", "kept"),
    [
        (DEBIAN_12, ["nvidia-fabricmanager-520", "nvidia-kernel-dkms", "libcuda1"], ["nvidia-container-toolkit"]),
        (
            UBUNTU_2204,
            ["nvidia-fabricmanager-470", "libnvidia-compute-525", "nvidia-dkms-550-open"],
            ["nvidia-docker2"],
        ),
        (ROCKY_9, ["nvidia-fabric-manager", "kmod-nvidia-latest-dkms"], ["nvidia-container-toolkit-base"]),
    ],
)
def test_any_branch_pattern_finds_the_earlier_pins_packages_only(facts: dict, replaced: list, kept: list) -> None:
    pattern = re.compile(packages(facts, fabricmanager=True)["any_branch_pattern"])
    assert [name for name in replaced if not pattern.match(name)] == []
    assert [name for name in kept if pattern.match(name)] == []


# The stops of the package method and the install record: texts as the role showed them before they moved here.
PACKAGE_INPUTS = {
    "os_key": "Ubuntu-22",
    "distribution": "Ubuntu",
    "major_version": "22",
    "manage": True,
    "key_download_allowed": False,
    "key": "",
    "key_found": False,
    "key_url": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/3bf863cc.pub",
}
REPO = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64"


def test_package_problem_unknown_os():
    problem = gpu_driver.gpu_driver_package_problem(
        dict(PACKAGE_INPUTS, os_key=None, distribution="Debian", major_version="11")
    )
    assert problem == (
        "The driver packages are not known for Debian 11 (nvidia_driver_method: package). Set nvidia_driver_method: "
        "runfile, or use an OS the role has package data for (Debian 12, Ubuntu 22.04 and 24.04, RHEL/Rocky 9)."
    )


def test_package_problem_without_a_key():
    assert gpu_driver.gpu_driver_package_problem(PACKAGE_INPUTS) == (
        "NVIDIA's package repository needs its signing key and none is configured: set "
        "nvidia_driver_package_repository_key to the key file on the controller (NVIDIA publishes it as "
        f"{REPO}/3bf863cc.pub), or nvidia_driver_package_key_download_allowed: true to let the host download it, or "
        "nvidia_driver_package_repository_manage: false when the host's own repositories (a site mirror) already "
        "carry the driver."
    )


def test_package_problem_names_a_key_file_that_is_not_there():
    problem = gpu_driver.gpu_driver_package_problem(dict(PACKAGE_INPUTS, key="/nonexistent/3bf863cc.pub"))
    assert "signing key and the key file /nonexistent/3bf863cc.pub is not a file on the controller: set " in problem


@pytest.mark.parametrize(
    "over",
    [
        {"key": "/etc/keys/3bf863cc.pub", "key_found": True},
        {"key_download_allowed": "yes"},
        {"manage": "false"},
    ],
)
def test_package_problem_none(over):
    assert gpu_driver.gpu_driver_package_problem(dict(PACKAGE_INPUTS, **over)) == ""


def test_sources_problem_other_source():
    found = {"rc": 0, "stdout_lines": ["/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"], "stderr": ""}
    assert gpu_driver.gpu_driver_sources_problem(found, REPO) == (
        f"{REPO} is already a source in /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list (for example from "
        "NVIDIA's cuda-keyring package); a second source line with another key breaks every apt command. Set "
        "nvidia_driver_package_repository_manage: false to use that source, or remove it and rerun."
    )


def test_sources_problem_unreadable_but_not_a_missing_folder():
    unread = {"rc": 2, "stdout_lines": [], "stderr": "grep: /etc/apt/x.list: Permission denied",
              "stderr_lines": ["grep: /etc/apt/x.list: Permission denied"]}  # fmt: skip
    assert gpu_driver.gpu_driver_sources_problem(unread, REPO) == (
        f"The apt sources could not be searched for other source lines of {REPO} (grep: /etc/apt/x.list: Permission "
        "denied). Make /etc/apt/sources.list and /etc/apt/sources.list.d readable by root, then rerun."
    )
    missing = {"rc": 2, "stdout_lines": [], "stderr": "grep: /etc/apt/sources.list: No such file or directory"}
    assert gpu_driver.gpu_driver_sources_problem(missing, REPO) == ""
    assert gpu_driver.gpu_driver_sources_problem({"rc": 1, "stdout_lines": []}, REPO) == ""


def test_hold_failures_lists_each_failed_step():
    selections = {
        "results": [
            {"item": "nvidia-driver-535", "changed": True},
            {"item": "libnvidia-compute-535", "msg": "dpkg --set-selections failed"},
        ]
    }
    held_now = {"cmd": ["apt-mark", "showhold"], "rc": 100, "stderr": "E: lock"}
    hold = {
        "cmd": ["dnf", "versionlock", "add", "x-535"],
        "rc": 1,
        "stderr_lines": ["No such command", "see dnf --help"],
    }
    assert gpu_driver.gpu_driver_hold_failures(selections, held_now, hold) == [
        "dpkg_selections: dpkg --set-selections failed",
        "apt-mark showhold failed: E: lock",
        "dnf versionlock add x-535 failed (exit 1): No such command; see dnf --help",
    ]


def test_hold_failures_none_from_skipped_steps():
    skipped = {"skipped": True, "changed": False}
    assert gpu_driver.gpu_driver_hold_failures({"results": [], "msg": "No items in the list"}, skipped, skipped) == []


def test_message_libcuda_names_the_install_log():
    fields = {"method": "runfile", "libcuda": "/usr/lib64/libcuda.so.535.104.05", "version": "535.104.05"}
    assert gpu_driver.gpu_driver_message("libcuda_missing", fields) == (
        "The driver install (runfile) finished, but /usr/lib64/libcuda.so.535.104.05 is not there: the installer did "
        "not install driver 535.104.05's libraries. Nothing was recorded as installed. Read the installer's log "
        "(/var/log/nvidia-installer.log), fix what it names, and rerun."
    )
    package = gpu_driver.gpu_driver_message("libcuda_missing", dict(fields, method="package"))
    assert "Read the installer's log (the package manager's output above), fix" in package


def test_message_fabricmanager_runfile():
    assert gpu_driver.gpu_driver_message("fabricmanager_runfile", {"host": "gpu1", "version": "535.104.05"}) == (
        "gpu1 has NVSwitches, which need NVIDIA's fabric manager at the driver's exact version (535.104.05); the role "
        "installs it from NVIDIA's packages only. Set nvidia_driver_method: package, or install the fabric manager "
        "archive yourself and set nvidia_driver_fabricmanager: false."
    )


def test_message_unknown_id_lists_the_known():
    with pytest.raises(AnsibleFilterError, match="no message 'libcuda'; the messages are os_unknown, "):
        gpu_driver.gpu_driver_message("libcuda", {})


# --- the check: one probe read against the pins, and every reason the method cannot start -------------------

LIBDIR = "/usr/lib/x86_64-linux-gnu"
DONE = "/var/lib/gpu_fleet/nvidia_driver.done"
PROC = "/proc/driver/nvidia/version"
RUNFILE = {"method": "runfile", "switch_from": None, "current": "runfile", "recorded_version": "520.61.05"}


def look(record: str | None = "520.61.05\nrunfile\n", pinned_lib: bool = True, link: str = "", proc=None) -> dict:
    """A gpu_host_probe result as tasks/check.yml registers it."""
    read = {DONE: record}
    if proc is not None:
        read[PROC] = proc
    return {
        "stat": {
            f"{LIBDIR}/libcuda.so.520.61.05": {"exists": pinned_lib},
            "/usr/bin/nvidia-uninstall": {"exists": True},
            f"{LIBDIR}/libcuda.so.1": {"exists": bool(link), "lnk_source": link or None},
        },
        "read": read,
    }


def found_inputs(**over) -> dict:
    inputs = {
        "decided": RUNFILE,
        "version": "520.61.05",
        "libdir": LIBDIR,
        "done_file": DONE,
        "proc_version": PROC,
        "manage_kernel": False,
        "reboot_allowed": False,
        "packages": {},
        "installed_packages": {},
    }
    return dict(inputs, **over)


def test_found_a_complete_runfile_install_is_installed_and_plans_nothing():
    found = gpu_driver.gpu_driver_found(look(), found_inputs())
    assert found == {
        "installed": True,
        "found_version": "520.61.05",
        "loaded_version": None,
        "loaded_line": "",
        "reboot_required": False,
        "plan": {"driver": {"change": False, "text": "driver 520.61.05 installed (runfile)"}},
    }


@pytest.mark.parametrize(
    ("probe", "decided"),
    [
        (look(pinned_lib=False), RUNFILE),  # the record outlived the library
        (look(record="515.76\nrunfile\n"), RUNFILE),  # another version recorded
        (look(record="520.61.05\npackage\n"), RUNFILE),  # the other method recorded
        (look(record=None), RUNFILE),  # an install that never finished
    ],
)
def test_found_not_installed_without_a_matching_record_and_library(probe, decided):
    assert gpu_driver.gpu_driver_found(probe, found_inputs(decided=decided))["installed"] is False


def test_found_a_record_of_0_10_means_the_runfile():
    assert gpu_driver.gpu_driver_found(look(record="520.61.05\n"), found_inputs())["installed"] is True


def test_found_packages_must_all_be_at_their_version():
    decided = dict(RUNFILE, method="package", current="package")
    packages = {"manager": "apt", "names": ["libcuda1"], "install": ["libcuda1=520.61.05-1"],
                "versions": {"libcuda1": "520.61.05-1"}}  # fmt: skip
    probe = look(record="520.61.05\npackage\n")
    at = {"libcuda1": [{"version": "520.61.05-1"}]}
    other = {"libcuda1": [{"version": "515.76-1"}]}
    inputs = found_inputs(decided=decided, packages=packages)
    assert gpu_driver.gpu_driver_found(probe, dict(inputs, installed_packages=at))["installed"] is True
    assert gpu_driver.gpu_driver_found(probe, dict(inputs, installed_packages=other))["installed"] is False


def test_found_version_from_libcuda_without_a_record_and_the_plan_names_it():
    probe = look(record=None, pinned_lib=False, link=f"{LIBDIR}/libcuda.so.515.76")
    decided = {"method": "runfile", "switch_from": None, "current": "runfile", "recorded_version": None}
    found = gpu_driver.gpu_driver_found(probe, found_inputs(decided=decided))
    assert found["found_version"] == "515.76"
    assert found["plan"] == {"driver": {"change": True, "text": "driver 515.76 -> 520.61.05 (runfile)"}}


def test_found_a_loaded_module_of_another_version_needs_a_reboot_unless_the_run_may():
    probe = look(proc=OPEN_MODULE)
    found = gpu_driver.gpu_driver_found(probe, found_inputs(manage_kernel=True))
    assert (found["loaded_version"], found["reboot_required"]) == ("535.104.05", True)
    assert found["loaded_line"] == OPEN_MODULE.splitlines()[0]
    assert (
        gpu_driver.gpu_driver_found(probe, found_inputs(manage_kernel=True, reboot_allowed=True))["reboot_required"]
        is False
    )
    assert (
        gpu_driver.gpu_driver_found(look(proc=PROPRIETARY), found_inputs(manage_kernel=True))["reboot_required"]
        is False
    )


def test_problems_none_for_a_runfile_host_without_nvswitches():
    inputs = {"method": "runfile", "package": {}, "fabricmanager": False, "host": "gpu1", "version": "520.61.05",
              "proxy_problem": ""}  # fmt: skip
    assert gpu_driver.gpu_driver_problems(inputs) == []


def test_problems_name_the_package_key_the_fabric_manager_and_the_proxy():
    package = gpu_driver.gpu_driver_problems(
        {"method": "package", "package": PACKAGE_INPUTS, "fabricmanager": True, "proxy_problem": "proxy bad."}
    )
    assert package == [gpu_driver.gpu_driver_package_problem(PACKAGE_INPUTS), "proxy bad."]
    runfile = gpu_driver.gpu_driver_problems(
        {"method": "runfile", "fabricmanager": "true", "host": "gpu1", "version": "535.104.05", "proxy_problem": ""}
    )
    assert runfile == [
        gpu_driver.gpu_driver_message("fabricmanager_runfile", {"host": "gpu1", "version": "535.104.05"})
    ]


def test_messages_of_the_install_word_for_word():
    assert gpu_driver.gpu_driver_message("gpus_busy", {"processes": "python3 pid 4242"}) == (
        "The driver would be (re)installed while GPUs run compute processes: python3 pid 4242. Drain the host (stop "
        "those jobs) and rerun, or set nvidia_driver_allow_busy_gpus: true to go ahead anyway."
    )
    fields = {"packages": "a=1 b=1", "error": "E: x", "url": REPO, "version": "535.104.05"}
    assert gpu_driver.gpu_driver_message("packages_uninstallable", fields) == (
        f"The driver packages a=1 b=1 cannot be installed here: E: x. Check that the repository ({REPO}) has driver "
        "535.104.05 for this OS, or pin a version it has. Nothing was changed on the driver."
    )
    assert gpu_driver.gpu_driver_message("kernel_skipped", {"host": "h", "virtualization": "podman"}) == (
        "Kernel-module steps skipped on h: it is a podman container, whose kernel belongs to its host. Only the "
        "driver's user-space part is installed here."
    )
    assert gpu_driver.gpu_driver_message("reboot_needed", {"version": "535.104.05", "loaded": "NVRM x"}) == (
        "The loaded NVIDIA kernel module is not 535.104.05 (NVRM x). Reboot the host, or set "
        "nvidia_driver_reboot_allowed: true to let the run do it."
    )


@pytest.mark.parametrize(("requested", "record"), [("distribution", "package"), ("package", "distribution")])
def test_a_move_between_nvidias_repository_and_the_distributions_archive_stops_with_the_steps(requested, record):
    text = RECORD_PACKAGE.replace("package", record)
    with pytest.raises(AnsibleFilterError) as raised:
        gpu_driver.gpu_driver_method(requested, text, False)
    assert f"came from the {record} method's packages" in str(raised.value)
    assert f"keep nvidia_driver_method: {record}" in str(raised.value)
