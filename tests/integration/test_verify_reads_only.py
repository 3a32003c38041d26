"""playbooks/verify.yml only reads a converged host: a listing of the folders a provisioning run
writes (names, types, sizes, modification times, modes, owners, link targets) is the same before and
after it. Left out: what verification writes by design, gpu_health's state and textfile metrics
(its baseline and the verification's metrics), and Ansible's own remote temp folders.

About 45 s on an idle 2-core machine (one verification with its MirroredStrategy fit).
"""

from __future__ import annotations

import json
import subprocess

import pytest
from ansible_run import latest_report
from sandbox_hosts import sandbox_inventory, site, start_converged, stop_container

pytestmark = pytest.mark.integration

FOLDERS = ["/usr/local", "/etc", "/opt", "/var/lib", "/usr/lib", "/root"]
# gpu_health_state_dir and gpu_health_textfile_dir (the sandbox's defaults); Ansible's remote temp
# and async folders (the fit runs as an async job).
WRITTEN_BY_DESIGN = (
    "/var/lib/gpu-health",
    "/var/lib/prometheus/node-exporter",
    "/root/.ansible",
    "/root/.ansible_async",
)
LISTING = "find {folders} -xdev -printf '%p\\t%y\\t%s\\t%T@\\t%m\\t%u:%g\\t%l\\n'"
# Bytecode Python writes beside what it imports from /tmp (TensorFlow's autograph compiles the fit's
# functions into modules there): one more left behind by every verification would grow without end.
BYTECODE = "find /tmp /var/tmp -xdev -name '*.pyc' 2>/dev/null"


def listing(host: str) -> list[str]:
    command = LISTING.format(folders=" ".join(FOLDERS))
    found = subprocess.run(["podman", "exec", host, "sh", "-c", command], capture_output=True, text=True, check=True)
    return sorted(line for line in found.stdout.splitlines() if not line.split("\t")[0].startswith(WRITTEN_BY_DESIGN))


def bytecode(host: str) -> list[str]:
    found = subprocess.run(["podman", "exec", host, "sh", "-c", BYTECODE], capture_output=True, text=True)
    return sorted(found.stdout.split())


def test_verify_changes_nothing_on_a_converged_host(tmp_path):
    host = start_converged("gpu-verify-reads")
    try:
        inventory = sandbox_inventory(tmp_path / "inventory", host)
        before, pyc_before = listing(host), bytecode(host)
        run = site(inventory, "-e", f"gpu_verify_report_dir={tmp_path / 'reports'}", playbook="playbooks/verify.yml")
        after, pyc_after = listing(host), bytecode(host)
    finally:
        stop_container(host)
    assert run.returncode == 0, run.stdout[-3000:]
    report = json.loads(latest_report(tmp_path / "reports", "inventory").read_text())
    assert report["hosts"][host]["status"] == "PASS"
    assert len(before) > 1000, "the listing reads the host's folders"
    changed = sorted(set(before) ^ set(after))
    assert changed == [], "verify.yml changed the host:\n" + "\n".join(changed[:40])
    assert pyc_after == pyc_before, "verify.yml left bytecode in the temp folders: " + ", ".join(pyc_after[:10])
