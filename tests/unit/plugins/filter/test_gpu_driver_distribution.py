"""nvidia_driver's distribution method: the data of vars/distribution.yml through gpu_driver_packages, the apt
sources it needs, the archive's exact version of the pin, and the one line about DKMS."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

# tests/conftest.py puts ROOT/collections on sys.path.
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_driver
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_driver_distribution as distro

ROOT = Path(__file__).resolve().parents[4]
SETS = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/distribution.yml").read_text())[
    "__nvidia_driver_distribution_sets"
]
DEBIAN = ["contrib", "non-free", "non-free-firmware"]
SAME_SOURCE = [
    "libcuda1",
    "libnvidia-ml1",
    "nvidia-smi",
    "libnvidia-cfg1",
    "nvidia-alternative",
    "nvidia-legacy-check",
    "libnvidia-ptxjitcompiler1",
    "libnvidia-pkcs11-openssl3",
]
KERNEL = ["nvidia-kernel-dkms", "nvidia-kernel-support", "firmware-nvidia-gsp"]
# apt-cache madison libcuda1 on a Debian 12 host with bookworm-security's non-free (Packages indexes, 2026-12-08).
MADISON = [
    "  libcuda1 | 535.309.01-0+deb12u1 | http://security.debian.org/debian-security bookworm-security/non-free "
    "amd64 Packages",
    "  libcuda1 | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages",
]


def packages(os_key: str = "Debian-12", revision: str = "*", **options) -> dict:
    return gpu_driver.gpu_driver_packages(
        SETS, os_key, options.pop("version", "535.261.03"), True, options.pop("kernel_open", False), False, revision
    )


# --- the data: names per OS, the pin, the holds -------------------------------------------------------------------


def test_every_distribution_set_names_its_components_dkms_module_and_libcuda() -> None:
    assert sorted(SETS) == ["Debian-12", "Debian-13", "Ubuntu-22", "Ubuntu-24"]
    for key, package_set in SETS.items():
        assert package_set["components"] and package_set["components_why"], key
        assert set(package_set["dkms_module"]) == {"proprietary", "open"}, key
        assert "{version}" in package_set["libcuda"] and package_set["version"] == "{version}-{revision}", key
        assert "nvidia-driver" not in package_set["userspace"], key  # the metapackage pulls in Xorg


def test_os_key_takes_the_keys_of_the_distribution_sets() -> None:
    trixie = {"distribution": "Debian", "distribution_major_version": "13"}
    assert gpu_driver.gpu_driver_os_key(trixie, SETS) == "Debian-13"
    assert gpu_driver.gpu_driver_os_key(trixie) is None  # NVIDIA's repository sets have no Debian 13
    assert gpu_driver.gpu_driver_os_key({"distribution": "Debian", "distribution_major_version": "11"}, SETS) is None


def test_debian_12_pins_every_package_of_the_driver_source_at_the_archive_revision() -> None:
    result = packages(revision="1")
    assert result["install"] == [
        *(f"{name}=535.261.03-1" for name in SAME_SOURCE),
        "nvidia-persistenced",  # its own source and version (535.171.04-1~deb12u1): the archive's, held
        *(f"{name}=535.261.03-1" for name in KERNEL),
    ]
    assert result["kernel_install"] == [f"{name}=535.261.03-1" for name in KERNEL]
    assert result["hold"] == [*SAME_SOURCE, "nvidia-persistenced", *KERNEL]
    assert result["dkms_module"] == "nvidia-current"
    assert result["libcuda"] == "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.261.03"
    assert result["dry_run_command"][-len(result["install"]) :] == result["install"]
    assert result["fabricmanager_service"] is None


def test_the_open_modules_take_their_own_packages() -> None:
    result = packages(kernel_open=True, revision="1")
    assert result["kernel_install"][:2] == [
        "nvidia-open-kernel-dkms=535.261.03-1",
        "nvidia-open-kernel-support=535.261.03-1",
    ]
    assert result["dkms_module"] == "nvidia-current-open"


def test_ubuntu_rows_give_branch_named_packages_at_ubuntus_revision() -> None:
    result = packages("Ubuntu-22", version="535.183.01", revision="0ubuntu0.22.04.1")
    assert result["install"][0] == "libnvidia-compute-535=535.183.01-0ubuntu0.22.04.1"
    assert result["kernel_install"] == ["nvidia-dkms-535=535.183.01-0ubuntu0.22.04.1"]


def test_before_the_revision_is_read_any_revision_of_the_pin_counts_as_installed() -> None:
    unresolved = packages()
    installed = {name: [{"version": "535.261.03-1"}] for name in [*SAME_SOURCE, *KERNEL]}
    installed["nvidia-persistenced"] = [{"version": "535.171.04-1~deb12u1"}]
    assert gpu_driver.gpu_driver_missing_packages(unresolved, installed) == []
    installed["nvidia-smi"] = [{"version": "535.309.01-0+deb12u1"}]
    assert gpu_driver.gpu_driver_missing_packages(unresolved, installed) == ["nvidia-smi=535.261.03-*"]
    del installed["nvidia-persistenced"]
    assert "nvidia-persistenced" in gpu_driver.gpu_driver_missing_packages(unresolved, installed)


def test_found_reads_the_distribution_libcuda_and_packages() -> None:
    libcuda = "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.261.03"
    look = {"stat": {libcuda: {"exists": True}}, "read": {"/done": "535.261.03\ndistribution\n"}}
    decided = {"method": "distribution", "switch_from": None, "recorded_version": "535.261.03"}
    inputs = {
        "decided": decided,
        "version": "535.261.03",
        "libdir": "/usr/lib/x86_64-linux-gnu",
        "libcuda": libcuda,
        "done_file": "/done",
        "proc_version": "/proc/driver/nvidia/version",
        "manage_kernel": False,
        "reboot_allowed": False,
        "packages": packages(),
        "installed_packages": {name: [{"version": "535.261.03-1"}] for name in [*SAME_SOURCE, *KERNEL]},
    }
    assert not gpu_driver.gpu_driver_found(look, inputs)["installed"]  # nvidia-persistenced is missing
    inputs["installed_packages"]["nvidia-persistenced"] = [{"version": "535.171.04-1~deb12u1"}]
    assert gpu_driver.gpu_driver_found(look, inputs)["installed"]
    assert not gpu_driver.gpu_driver_found(look, {**inputs, "libcuda": None})["installed"]  # the libdir's is not there


def test_problems_leave_the_distribution_methods_fabric_manager_to_its_own_check() -> None:
    inputs = {"method": "distribution", "fabricmanager": True, "host": "gpu1", "version": "535.261.03"}
    assert gpu_driver.gpu_driver_problems(inputs) == []


# --- the apt sources ---------------------------------------------------------------------------------------------

SOURCES = [
    "/etc/apt/sources.list:# deb http://deb.debian.org/debian bookworm main contrib non-free",
    "/etc/apt/sources.list:deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] http://deb.debian.org/debian/ "
    "bookworm main",
    "/etc/apt/sources.list:deb-src http://deb.debian.org/debian bookworm main contrib non-free",
    "/etc/apt/sources.list:",
    "/etc/apt/sources.list.d/security.list:deb http://security.debian.org/debian-security bookworm-security non-free",
    "/etc/apt/sources.list.d/debian.sources:Types: deb",
    "/etc/apt/sources.list.d/debian.sources:URIs: http://mirror.example/debian",
    "/etc/apt/sources.list.d/debian.sources:Suites: bookworm bookworm-updates",
    "/etc/apt/sources.list.d/debian.sources:Components: main",
    "/etc/apt/sources.list.d/debian.sources:  non-free-firmware",
    "/etc/apt/sources.list.d/debian.sources:",
    "/etc/apt/sources.list.d/debian.sources:Types: deb",
    "/etc/apt/sources.list.d/debian.sources:Enabled: no",
    "/etc/apt/sources.list.d/debian.sources:URIs: http://off.example/debian",
    "/etc/apt/sources.list.d/debian.sources:Suites: bookworm",
    "/etc/apt/sources.list.d/debian.sources:Components: contrib",
    "/etc/apt/sources.list.d/old.list.save:deb http://deb.debian.org/debian bookworm contrib",
    "/etc/apt/sources.list.d/gpu-fleet-nvidia-driver-distribution.list:deb http://deb.debian.org/debian bookworm "
    "contrib non-free",
]


def test_components_are_read_from_both_formats_without_comments_sources_disabled_or_the_roles_file() -> None:
    assert distro.gpu_driver_apt_components(SOURCES, "bookworm") == {
        "components": ["main", "non-free-firmware"],
        "sites": ["http://deb.debian.org/debian", "http://mirror.example/debian"],
        # The first site's options, which a managed line of the same mirror must repeat (apt refuses two
        # entries of one mirror and suite whose Signed-By differ).
        "options": "[arch=amd64 signed-by=/usr/share/keyrings/debian.gpg]",
    }
    assert distro.gpu_driver_apt_components(SOURCES, "bookworm", "")["components"] == [
        "contrib",
        "main",
        "non-free",
        "non-free-firmware",
    ]
    assert distro.gpu_driver_apt_components(SOURCES, "trixie") == {"components": [], "sites": [], "options": ""}


def problem(found: dict, **over) -> str:
    inputs = {
        "os_key": "Debian-12",
        "distribution": "Debian",
        "major_version": "12",
        "host": "gpu1",
        "version": "535.261.03",
        "suite": "bookworm",
        "needed": DEBIAN,
        "found": found,
        "where": "libcuda1 is in non-free",
        "manage": False,
        "fabricmanager": False,
    }
    return distro.gpu_driver_distribution_problem({**inputs, **over})


def test_sources_without_the_components_stop_with_the_line_to_write() -> None:
    found = {"components": ["main"], "sites": ["http://deb.debian.org/debian"]}
    assert problem(found) == (
        "The apt sources of gpu1 give bookworm the components main, but Debian's NVIDIA driver packages need "
        "contrib non-free non-free-firmware as well (libcuda1 is in non-free). Add contrib non-free non-free-firmware "
        "to the bookworm line of the host's sources (for example `deb http://deb.debian.org/debian bookworm main "
        "contrib non-free non-free-firmware` in /etc/apt/sources.list), or set nvidia_driver_distribution_sources_manage: "
        "true to let the role add them in /etc/apt/sources.list.d/gpu-fleet-nvidia-driver-distribution.list. Nothing "
        "was changed."
    )
    assert problem(found, manage=True) == ""
    assert problem({"components": ["main", *DEBIAN], "sites": ["http://x"]}) == ""


def test_other_stops_an_unknown_os_nvswitches_and_a_release_without_a_line() -> None:
    assert problem({}, os_key=None, major_version="11").startswith(
        "The distribution's NVIDIA driver packages are not known for Debian 11"
    )
    assert "does not package it" in problem({}, fabricmanager=True)
    assert problem({"components": [], "sites": []}, manage=True).startswith(
        "The apt sources of gpu1 have no line for bookworm"
    )


def test_the_managed_line_adds_only_what_the_hosts_own_lines_lack() -> None:
    found = distro.gpu_driver_apt_components(SOURCES, "bookworm")
    assert distro.gpu_driver_distribution_sources(found, "bookworm", DEBIAN) == (
        "deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] http://deb.debian.org/debian bookworm contrib "
        "non-free\n"
    )
    everything = {"components": ["main", *DEBIAN], "sites": ["http://deb.debian.org/debian"]}
    assert distro.gpu_driver_distribution_sources(everything, "bookworm", DEBIAN) == ""


# --- the archive's version, DKMS ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "found", "revision"),
    [("535.261.03", "535.261.03-1", "1"), ("535.309.01", "535.309.01-0+deb12u1", "0+deb12u1")],
)
def test_the_archive_version_of_the_pin_is_read_not_guessed(version: str, found: str, revision: str) -> None:
    result = distro.gpu_driver_archive_version(MADISON, version)
    assert (result["version"], result["revision"], result["problem"]) == (found, revision, "")


def test_a_pin_the_archive_lacks_stops_with_what_it_has() -> None:
    result = distro.gpu_driver_archive_version(MADISON, "535.261", "gpu1")
    assert result["problem"] == (
        "The archive in the apt sources of gpu1 has no libcuda1 535.261 (it offers 535.309.01-0+deb12u1, "
        "535.261.03-1). Pin nvidia_driver_version to one of those upstream versions, or point the sources at a "
        "mirror that still has 535.261 (such as snapshot.debian.org). Nothing was changed on the driver."
    )
    assert "it offers none" in distro.gpu_driver_archive_version([], "535.261.03")["problem"]


DKMS = {"module": "nvidia-current", "version": "535.261.03", "kernel": "6.1.0-28-amd64", "headers": True}


def test_dkms_installed_for_the_running_kernel_says_nothing() -> None:
    status = {"rc": 0, "stdout": "nvidia-current/535.261.03, 6.1.0-28-amd64, x86_64: installed\n"}
    assert distro.gpu_driver_dkms_state(status, DKMS) == ""
    other_kernel = {"rc": 0, "stdout": "nvidia-current/535.261.03, 6.1.0-18-amd64, x86_64: installed\n"}
    assert distro.gpu_driver_dkms_state(other_kernel, DKMS) != ""


def test_dkms_without_headers_is_one_line_with_the_fix() -> None:
    """What Debian's DKMS hook leaves in a container (no /lib/modules/<kernel>/build): the module added only."""
    line = distro.gpu_driver_dkms_state(
        {"rc": 0, "stdout": "nvidia-current/535.261.03: added\n"}, {**DKMS, "kernel": "6.18.44", "headers": False}
    )
    assert "\n" not in line
    assert line == (
        "DKMS has not built the NVIDIA kernel module nvidia-current/535.261.03 for the running kernel 6.18.44 (dkms "
        "status: added; no build tree at /lib/modules/6.18.44/build); the driver's user space is installed, and the "
        'verification will say "NVIDIA kernel module not loaded". Install linux-headers-6.18.44 and run `dkms '
        "autoinstall -k 6.18.44` (or boot a kernel whose headers are installed); in a container, load the module on "
        "the container's host instead."
    )


def test_a_failed_build_names_its_log() -> None:
    line = distro.gpu_driver_dkms_state({"rc": 0, "stdout": "nvidia-current/535.261.03, 6.1.0-28-amd64: built\n"}, DKMS)
    assert "(dkms status: built; see /var/lib/dkms/nvidia-current/535.261.03/build/make.log)" in line
    assert "`dpkg --configure -a`" in line
    assert "dkms status lists no such module" in distro.gpu_driver_dkms_state({"rc": 0, "stdout": ""}, DKMS)


def test_the_filters_are_registered() -> None:
    assert sorted(distro.FilterModule().filters()) == [
        "gpu_driver_apt_components",
        "gpu_driver_archive_version",
        "gpu_driver_distribution_problem",
        "gpu_driver_distribution_sources",
        "gpu_driver_dkms_state",
    ]


def test_the_stops_of_the_install_say_apts_words_and_the_hosts_state() -> None:
    fields = {"packages": "libcuda1=535.261.03-1", "error": "libcuda1 : Depends: nvidia-alternative (= 535.261.03-1)"}
    assert gpu_driver.gpu_driver_message("distribution_uninstallable", fields) == (
        "The distribution's driver packages libcuda1=535.261.03-1 cannot be installed here: libcuda1 : Depends: "
        "nvidia-alternative (= 535.261.03-1). Fix what apt names (a component the sources lack, a held or conflicting "
        "package), or pin a version the archive has. Nothing was changed on the driver."
    )
    fields = {"host": "gpu1", "method": "distribution", "error": "Failed to fetch"}
    assert gpu_driver.gpu_driver_message("packages_failed_after_runfile", fields) == (
        "The runfile driver was uninstalled, then the distribution method's packages failed to install (Failed to "
        "fetch): gpu1 has no NVIDIA driver now, and nothing records one as installed. Fix what the package manager "
        "names and rerun: the packages are installed again, no runfile needed (`dpkg --audit` lists a half-installed "
        "package). To go back instead, set nvidia_driver_method: runfile and rerun."
    )


def test_a_deb822_signed_by_is_repeated_on_the_managed_line() -> None:
    lines = [
        "/etc/apt/sources.list.d/debian.sources:Types: deb",
        "/etc/apt/sources.list.d/debian.sources:URIs: http://deb.debian.org/debian",
        "/etc/apt/sources.list.d/debian.sources:Suites: bookworm",
        "/etc/apt/sources.list.d/debian.sources:Components: main",
        "/etc/apt/sources.list.d/debian.sources:Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg",
    ]
    found = distro.gpu_driver_apt_components(lines, "bookworm")
    assert distro.gpu_driver_distribution_sources(found, "bookworm", DEBIAN).startswith(
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm "
    )
