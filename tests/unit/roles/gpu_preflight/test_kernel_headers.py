"""gpu_preflight's kernel headers per OS family as the check reads them: vars/main.yml's package name and
package-manager query, and whether the query's answer says the package can be installed, in a real
ansible-playbook run."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
KERNEL = "6.1.0-9-amd64"

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars_files:
    - {vars_file}
  vars:
    ansible_facts: {{os_family: {family}, kernel: {kernel}}}
    __gpu_preflight_headers_query: {query}
  tasks:
    - name: Show the headers
      ansible.builtin.debug:
        msg: "HEADERS={{{{ {{'package': __gpu_preflight_headers.package, 'probe': __gpu_preflight_headers.probe,
               'installable': __gpu_preflight_headers_installable | bool}} | to_json | b64encode }}}}"
"""

APT_POLICY = "linux-headers-{kernel}:\n  Installed: (none)\n  Candidate: {candidate}\n  Version table:\n"


def _headers(tmp_path: Path, family: str, query: dict) -> dict:
    playbook = tmp_path / "headers.yml"
    vars_file = ROOT / "roles/gpu_preflight/vars/main.yml"
    playbook.write_text(PLAYBOOK.format(vars_file=vars_file, family=family, kernel=KERNEL, query=json.dumps(query)))
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(base64.b64decode(re.search(r"HEADERS=([A-Za-z0-9+/=]+)", done.stdout)[1]))


@pytest.mark.parametrize(
    ("candidate", "installable"),
    [("6.1.52-1", True), ("(none)", False)],
)
def test_debian_asks_apt_cache_policy_and_reads_its_candidate(tmp_path, candidate, installable):
    query = {"rc": 0, "stdout": APT_POLICY.format(kernel=KERNEL, candidate=candidate)}
    headers = _headers(tmp_path, "Debian", query)
    assert headers == {
        "package": f"linux-headers-{KERNEL}",
        "probe": ["apt-cache", "policy", f"linux-headers-{KERNEL}"],
        "installable": installable,
    }


def test_debian_without_a_candidate_line_cannot_install(tmp_path):
    # apt-cache policy prints nothing for a name no list knows, and exits 0.
    assert _headers(tmp_path, "Debian", {"rc": 0, "stdout": ""})["installable"] is False


@pytest.mark.parametrize(("rc", "installable"), [(0, True), (1, False)])
def test_redhat_asks_dnf_for_kernel_devel_and_reads_its_exit_code(tmp_path, rc, installable):
    headers = _headers(tmp_path, "RedHat", {"rc": rc, "stdout": f"kernel-devel.x86_64  {KERNEL}" if rc == 0 else ""})
    assert headers["package"] == f"kernel-devel-{KERNEL}"
    assert headers["probe"][:4] == ["dnf", "-q", "list", "--available"]
    assert headers["installable"] is installable


@pytest.mark.parametrize("family", ["Debian", "RedHat"])
def test_a_skipped_query_reads_as_not_installable(tmp_path, family):
    assert _headers(tmp_path, family, {"skipped": True, "changed": False})["installable"] is False


def test_an_os_family_without_an_entry_is_not_asked(tmp_path):
    headers = _headers(tmp_path, "Archlinux", {"skipped": True})
    assert headers == {"package": f"the headers of kernel {KERNEL}", "probe": None, "installable": False}
