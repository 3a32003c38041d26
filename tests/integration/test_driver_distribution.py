"""nvidia_driver_method: distribution on a converged host: the runfile driver moves to Debian 12's own packages.

A host of the ``converged`` snapshot (the stand-in runfile driver, with its ``nvidia-uninstall``) whose apt
sources give bookworm ``contrib non-free non-free-firmware``, plus bookworm-security's non-free, where Debian
has a newer 535 (535.309.01-0+deb12u1) than the pinned 535.261.03-1: the hold is what keeps the driver.

1. ``site.yml --check --diff`` shows the move as a plan (``runfile -> distribution``) and changes nothing;
2. ``playbooks/driver.yml`` runs the dry run, the runfile's uninstaller and Debian's packages: installed at
   535.261.03-1 and held (``apt-mark showhold``), ``apt-get -s upgrade`` keeps them back, DKMS's failure to
   build in a container (no headers for the host's kernel) is one line of the run, no maintainer-script dump;
3. a second run changes nothing;
4. the verification names "NVIDIA kernel module not loaded" and reads Debian's libcuda.

apt's downloads go to the machine's test cache (``apt-debian12/``, shared with test_real_driver.py), mounted
as the host's ``/var/cache/apt/archives``: downloaded once per machine. The fixture's own apt commands get
the mirror retries of tests/retry.py; the role's refresh and installs have their own.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import retry
from ansible_run import latest_report
from sandbox_hosts import ROOT, sandbox_inventory, site, start_converged, stop_container
from wheelhouse import cache_dir

pytestmark = pytest.mark.integration

APT_CACHE = cache_dir() / "apt-debian12"
OUTPUT = ROOT / "build" / "test-output" / "driver-distribution"
VERSION = "535.261.03"
DEBIAN_VERSION = "535.261.03-1"  # bookworm/non-free's Packages index
# Every package of Debian's nvidia-graphics-drivers the compute set installs: each at the pin.
PINNED = [
    *("libcuda1", "libnvidia-ml1", "nvidia-smi", "libnvidia-cfg1", "nvidia-alternative", "nvidia-legacy-check"),
    *("libnvidia-ptxjitcompiler1", "libnvidia-pkcs11-openssl3", "nvidia-kernel-dkms", "nvidia-kernel-support"),
    "firmware-nvidia-gsp",
]
HELD = sorted([*PINNED, "nvidia-persistenced"])
NON_FREE = "s/ bookworm main$/ bookworm main contrib non-free non-free-firmware/"
SECURITY = "deb http://security.debian.org/debian-security bookworm-security non-free\n"
EXTRA = ("-e", "nvidia_driver_method=distribution", "-e", f"nvidia_driver_version={VERSION}")
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)
# What a stop before any change must leave as it was: the driver's files, the packages, the sources.
LISTING = "ls -l /usr/bin/nvidia-uninstall /var/lib/gpu_fleet; dpkg -l | grep -i nvidia; cat /etc/apt/sources.list"
DKMS = "DKMS has not built the NVIDIA kernel module nvidia-current/535.261.03 for the running kernel"


def podman_exec(host: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True, check=False)


def recap(stdout: str, host: str) -> tuple[int, int]:
    """(changed, failed) of ``host`` in a playbook's recap."""
    found = {m.group(1): (int(m.group(3)), int(m.group(5))) for m in RECAP.finditer(stdout)}
    return found[host]


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """The converged host after the check run, the move and the rerun: their outputs, and the host."""
    APT_CACHE.mkdir(parents=True, exist_ok=True)
    host = start_converged("gpu-distro", "-v", f"{APT_CACHE}:/var/cache/apt/archives")
    try:
        listing_before = podman_exec(host, "sh", "-c", LISTING).stdout
        inventory = sandbox_inventory(tmp_path_factory.mktemp("distro") / "inventory", host)
        # The snapshot's sources give bookworm only main: preflight stops before any change.
        without = site(inventory, *EXTRA, playbook="playbooks/preflight.yml")
        listing_without = podman_exec(host, "sh", "-c", LISTING).stdout
        assert podman_exec(host, "sed", "-i", NON_FREE, "/etc/apt/sources.list").returncode == 0
        retry.in_container(host, f"printf '{SECURITY}' > /etc/apt/sources.list.d/security.list && apt-get -q update")
        check = site(inventory, "--check", "--diff", *EXTRA)
        uninstaller_after_check = podman_exec(host, "test", "-x", "/usr/bin/nvidia-uninstall").returncode == 0
        first = site(inventory, *EXTRA, playbook="playbooks/driver.yml")
        second = site(inventory, *EXTRA, playbook="playbooks/driver.yml")
        # Kept beside the build outputs for a reader of a failure: pytest's own temporary folders are rotated away.
        OUTPUT.mkdir(parents=True, exist_ok=True)
        for name, run in (("preflight-without", without), ("check", check), ("first", first), ("second", second)):
            (OUTPUT / f"{name}.log").write_text(run.stdout + run.stderr)
        yield {
            "without": without,
            "listing_without": listing_without,
            "listing_before": listing_before,
            "host": host,
            "inventory": inventory,
            "check": check,
            "uninstaller_after_check": uninstaller_after_check,
            "first": first,
            "second": second,
        }
    finally:
        stop_container(host)


def test_sources_without_non_free_stop_preflight_before_any_change(moved):
    without = moved["without"]
    assert without.returncode != 0
    assert (
        f"The apt sources of {moved['host']} give bookworm the components main, but Debian's NVIDIA driver packages "
        "need contrib non-free non-free-firmware as well"
    ) in without.stdout, without.stdout[-3000:]
    assert "nvidia_driver_distribution_sources_manage: true" in without.stdout
    assert moved["listing_without"] == moved["listing_before"]


def test_check_diff_shows_the_move_as_a_plan_and_changes_nothing(moved):
    check = moved["check"]
    assert "runfile -> distribution" in check.stdout, check.stdout[-3000:]
    assert moved["uninstaller_after_check"], "the --check run removed the runfile driver"


def test_the_runfile_moves_to_debians_packages_held_at_the_pinned_version(moved):
    host, first = moved["host"], moved["first"]
    assert recap(first.stdout, host)[1] == 0, first.stdout[-4000:]
    assert podman_exec(host, "test", "-e", "/usr/bin/nvidia-uninstall").returncode != 0
    listed = podman_exec(host, "dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\\n", *PINNED)
    assert listed.returncode == 0, listed.stderr
    # hi: held (dpkg's selection) and installed.
    assert sorted(listed.stdout.split("\n")[:-1]) == sorted(f"{name} {DEBIAN_VERSION} hi " for name in PINNED)
    held = podman_exec(host, "apt-mark", "showhold").stdout.split()
    assert sorted(name for name in held if name in HELD) == HELD, held


def test_an_upgrade_keeps_the_held_driver_back(moved):
    host = moved["host"]
    candidate = podman_exec(host, "apt-cache", "policy", "libcuda1").stdout
    assert "535.309.01" in candidate, candidate  # bookworm-security has a newer 535
    upgrade = podman_exec(host, "apt-get", "-s", "upgrade")
    assert upgrade.returncode == 0, upgrade.stderr
    kept = upgrade.stdout.split("The following packages have been kept back:")[-1]
    assert "libcuda1" in kept and "nvidia-smi" in kept, upgrade.stdout
    assert not re.search(r"^Inst (libcuda1|nvidia-smi|libnvidia-ml1|nvidia-kernel-dkms) ", upgrade.stdout, re.M)


def test_dkms_that_cannot_build_in_a_container_is_one_line(moved):
    first = moved["first"].stdout
    lines = [line for line in first.splitlines() if DKMS in line]
    assert len(lines) == 1, first[-4000:]
    assert "no build tree at /lib/modules/" in lines[0] and "NVIDIA kernel module not loaded" in lines[0]
    assert "Building for" not in first and "post-installation script" not in first
    # Said again by a rerun, which changes nothing: the state is read, not remembered.
    assert len([line for line in moved["second"].stdout.splitlines() if DKMS in line]) == 1


def test_a_second_run_changes_nothing(moved):
    host, second = moved["host"], moved["second"]
    assert recap(second.stdout, host) == (0, 0), second.stdout[-4000:]


def test_the_verification_names_the_kernel_module_and_reads_debians_libcuda(moved, tmp_path):
    host = moved["host"]
    run = site(moved["inventory"], *EXTRA, "-e", f"gpu_verify_report_dir={tmp_path}", playbook="playbooks/verify.yml")
    assert run.returncode != 0
    doc = json.loads(latest_report(tmp_path, "inventory").read_text())["hosts"][host]["results"][0]
    (found,) = [p for p in doc["problems"] if p["check"] == "gpu_count"]
    assert "(NVIDIA kernel module not loaded)" in found["cause"]
    assert doc["libraries"]["libcuda"]["path"] == f"/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.{VERSION}"
