"""An upgrade in place from the previous release, as an administrator does it: the hosts were converged
by the previous release (tests/previous_release.py pins it), and the current ``site.yml`` runs over
them with the same inventory.

One run of the current ``site.yml`` over two hosts with the sandbox inventory of the tests of the
roles' logic (tests/fixtures/inventory/small: the previous release's sandbox variables, the small
stand-ins): one from the image of a host the previous release converged with its own stand-ins and
inventory, one fresh from the base image, the reference for what this release makes of a host. The
run ends with rc 0 and both hosts PASS in the fleet report, and a second run changes nothing on either.
Then the upgraded host has no leftovers: no path (with its type and link target) that the fresh host
lacks, and none that the fresh host has and it lacks, but for what differs between any two hosts
(``PER_HOST``). The driver, CUDA and cuDNN are not installed again (the same versions), so the previous
release's stand-ins stay, as NVIDIA's files of those versions would: its ``nvidia-smi`` knows none of
the health check's ECC and clock fields, and the health check skips those two checks, naming the
fields. Should a later pin's stand-ins lay out other files than the current ones, the listing shows
them here.

About 3 minutes (191 s measured on a busy 2-core machine); the previous release's image is built once
per machine (444 s measured the first time).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from ansible_run import failures, latest_report
from previous_release import RELEASE, ensure
from sandbox_hosts import site, start_container, stop_container
from snapshots import SMALL_GROUP_VARS

pytestmark = pytest.mark.integration

RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)
# The whole file system but the kernel's and the session's wheelhouse, each path with its type and link
# target.
LISTING = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /srv/test-wheelhouse \\) -prune "
    "-o -printf '%p\\t%y\\t%l\\n'"
)
# What differs between any two hosts by design: Ansible's remote temp folders, logs, apt's cache and the
# bytecode Python writes beside what it imports (the temp folder's is not: see the gpu_verify handler).
PER_HOST = re.compile(r"^/root/\.ansible|^/var/log/|^/var/cache/apt/|^/(?!tmp/).*/__pycache__(/|$)")


def listing(host: str) -> dict[str, str]:
    found = subprocess.run(["podman", "exec", host, "sh", "-c", LISTING], capture_output=True, text=True, check=True)
    entries = dict(line.split("\t", 1) for line in found.stdout.splitlines() if "\t" in line)
    return {path: kind for path, kind in entries.items() if not PER_HOST.search(path)}


def differences(upgraded: dict[str, str], fresh: dict[str, str]) -> tuple[list[str], list[str]]:
    """(left over on the upgraded host, missing from it): paths whose presence or type and target differ."""
    left = sorted(f"{path}\t{kind}" for path, kind in upgraded.items() if fresh.get(path) != kind)
    missing = sorted(f"{path}\t{kind}" for path, kind in fresh.items() if upgraded.get(path) != kind)
    return left, missing


def recap(stdout: str) -> dict[str, tuple[int, int, int]]:
    return {
        host: (int(changed), int(unreachable), int(failed))
        for host, changed, unreachable, failed in RECAP.findall(stdout)
    }


def two_hosts(folder: Path, upgraded: str, fresh: str) -> Path:
    folder.mkdir(parents=True)
    hosts = {host: {"ansible_connection": "podman_pipelined"} for host in (upgraded, fresh)}
    (folder / "hosts.yml").write_text(json.dumps({"gpu_hosts": {"hosts": hosts}}))
    (folder / "group_vars").symlink_to(SMALL_GROUP_VARS)
    return folder


def test_the_current_site_yml_upgrades_a_host_of_the_previous_release(tmp_path):
    image = ensure()
    upgraded, fresh = start_container("gpu-upgrade", image=image), start_container("gpu-upgrade-fresh")
    try:
        inventory = two_hosts(tmp_path / "inventory", upgraded, fresh)
        reports = tmp_path / "reports"
        first = site(inventory, "-e", f"gpu_verify_report_dir={reports}", timeout=1800)
        written = latest_report(reports, "inventory")
        report = json.loads(written.read_text()) if written.exists() else {"hosts": {}}
        second = site(inventory, "-e", f"gpu_verify_report_dir={reports}", timeout=1800)
        left, missing = differences(listing(upgraded), listing(fresh))
    finally:
        stop_container(upgraded)
        stop_container(fresh)
    assert first.returncode == 0, f"site.yml over release {RELEASE.version}'s host:\n{failures(first.stdout)}"
    statuses = {host: report["hosts"][host]["status"] for host in (upgraded, fresh)}
    assert statuses == dict.fromkeys((upgraded, fresh), "PASS"), report["hosts"]
    assert report["hosts"][upgraded]["health"]["status"] == "healthy", report["hosts"][upgraded]["health"]
    assert second.returncode == 0, failures(second.stdout)
    assert recap(second.stdout) == dict.fromkeys((upgraded, fresh), (0, 0, 0)), second.stdout[-3000:]
    assert left == [], f"left over from release {RELEASE.version} (absent on a fresh host):\n" + "\n".join(left[:60])
    assert missing == [], "on a fresh host, not on the upgraded one:\n" + "\n".join(missing[:60])
