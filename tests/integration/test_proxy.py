"""Hosts behind an HTTP proxy: one run of site.yml through a real proxy (Debian's tinyproxy), with credentials.

The proxy runs in a container of its own, on the default podman network and on an internal one
(``podman network create --internal``: no route out). The host, started from the ``converged``
snapshot (tests/snapshots.py) with a lock pin removed from its venv and pip's cache emptied, is only
on the internal network: the proxy is its one way out, so pip can only have reached PyPI through it.
The controller fetches NVIDIA's driver runfile (a stand-in) from a mirror served by this test, also
through the proxy; it holds NVIDIA's real CUDA runfile and cuDNN archive already. One inventory setting, ``gpu_preflight_proxy`` with ``user:password@``, reaches the host's
tasks; the controller's downloads take ``gpu_artifacts_proxy`` (the proxy's address on the other network).

The same run has a second inventory host on the same container whose proxy is a port nothing listens
on: it stops in preflight (the index try), naming the proxy with its password masked.

Proved: preflight's index try, pip's install (CONNECT pypi.org and files.pythonhosted.org from the
host's address) and the controller's artifact download (GET of the file) are in the proxy's access
log; the mirror saw only the proxy; the host has no direct route; the good host converges and verifies;
the password is in no output, report or host file. About 100 s on an idle 2-core machine.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import threading
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import retry
import yaml
from ansible_run import latest_report
from sandbox_hosts import IMAGE, ROOT, STANDINS, link_or_copy, site, start_container, stop_container
from snapshots import ensure

pytestmark = pytest.mark.integration

USER = "fleet"
SECRET = "pr0xy-S3cret"
PORT = 3128
VENV = "/opt/tensorflow/2.12"
# A pin of the sandbox stack's lock (data/locks/tensorflow-2.12.1-py3.11.txt) that is a small wheel.
REMOVED = "six"
OUTPUT = ROOT / "build" / "test-output" / "proxy.log"
PREFLIGHT_PLAY = "Check the pinned stacks, the hosts and the artifacts before any change"
# No Allow line: every client may connect (tinyproxy.conf(5)); no ConnectPort line: CONNECT to any port.
# BasicAuth: the credentials the proxy URL carries. LogLevel Info logs each client and request line.
CONF = f"""User tinyproxy
Group tinyproxy
Port {PORT}
Listen 0.0.0.0
Timeout 120
LogFile "/var/log/tinyproxy/tinyproxy.log"
LogLevel Info
PidFile "/run/tinyproxy/tinyproxy.pid"
MaxClients 50
BasicAuth {USER} {SECRET}
"""


def podman(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, check=check)


def addresses(container: str) -> dict[str, str]:
    """Network name -> the container's IPv4 address there."""
    found = podman("inspect", container, "--format", "{{json .NetworkSettings.Networks}}").stdout
    return {name: net["IPAddress"] for name, net in json.loads(found).items()}


def start_proxy(name: str, network: str) -> None:
    podman("run", "-d", "--name", name, "--runtime=runc", "--init", "--ulimit", "nofile=1024:1024",
           "--ulimit", "nproc=4096:4096", "--network", "podman", "--network", network, IMAGE, "sleep", "infinity")  # fmt: skip
    retry.apt_install(name, "tinyproxy", timeout=300)
    script = (
        "mkdir -p /run/tinyproxy && chown tinyproxy:tinyproxy /run/tinyproxy /var/log/tinyproxy"
        " && cat > /etc/tinyproxy/test.conf && tinyproxy -c /etc/tinyproxy/test.conf"
    )
    retry.in_container(name, script, input=CONF, tries=1, timeout=60)


def proxy_requests(log: str) -> list[tuple[str, str]]:
    """(client address, request line) of every connection in tinyproxy's log, whose CONNECT-level lines
    read ``Connect (file descriptor N): <client>`` and then ``Request (file descriptor N): <line>``; the
    line is empty for a connection that sent no request (preflight's index try only connects)."""
    found: list[list[str]] = []
    open_by_fd: dict[str, list[str]] = {}
    for kind, fd, text in re.findall(r"(Connect|Request) \(file descriptor (\d+)\): (.*)", log):
        if kind == "Connect":
            open_by_fd[fd] = [text.strip(), ""]
            found.append(open_by_fd[fd])
        elif fd in open_by_fd:
            open_by_fd[fd][1] = text.strip()
    return [(client, line) for client, line in found]


class Mirror:
    """An HTTP mirror of NVIDIA's files (the stand-ins) that remembers who asked for what."""

    def __init__(self, folder, address: str):
        self.seen: list[tuple[str, str]] = []
        mirror = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, format, *args):
                mirror.seen.append((self.client_address[0], self.path))

        self.server = ThreadingHTTPServer((address, 0), functools.partial(Handler, directory=str(folder)))
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def proxied_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy")
    token = uuid.uuid4().hex[:8]
    network, proxy = f"gpu-proxy-net-{token}", f"gpu-proxy-tinyproxy-{token}"
    podman("network", "create", "--internal", network)
    host = mirror = None
    try:
        start_proxy(proxy, network)
        proxy_ips = addresses(proxy)
        gateway = json.loads(podman("network", "inspect", "podman").stdout)[0]["subnets"][0]["gateway"]
        files = tmp / "mirror"
        files.mkdir()
        (tmp / "nvidia").mkdir()
        # The controller holds the CUDA runfile and the cuDNN archive already (hard links of NVIDIA's real
        # files: gigabytes through tinyproxy would prove nothing more) and downloads the driver's through it.
        artifacts_of = list(yaml.safe_load((STANDINS / "artifacts.yml").read_text())["artifacts"])
        needed = [name for name in artifacts_of if name.startswith("NVIDIA-Linux-")]
        for name in artifacts_of:
            link_or_copy(str(STANDINS / name), str((files if name in needed else tmp / "nvidia") / name))
        mirror = Mirror(files, gateway)
        image = os.environ.get("GPU_SNAPSHOT_CONVERGED") or ensure("converged")
        host = start_container("gpu-proxy", f"--network={network}", image=image, wheelhouse=False)
        host_ip = addresses(host)[network]
        # pip must fetch one wheel again, and cannot take it (or the index page) from its cache.
        podman(
            "exec", host, "sh", "-c", f"{VENV}/bin/python -m pip uninstall -q -y {REMOVED} && rm -rf /root/.cache/pip"
        )
        direct = podman("exec", host, "python3", "-c", "import socket; socket.create_connection(('pypi.org', 443), 5)",
                        check=False)  # fmt: skip

        good = f"http://{USER}:{SECRET}@{proxy_ips[network]}:{PORT}"
        controller_side = {"url": f"http://{USER}:{SECRET}@{proxy_ips['podman']}:{PORT}"}
        artifacts = {
            "gpu_artifacts_controller_dir": str(tmp / "nvidia"),
            "gpu_artifacts_mirror_url": mirror.url,
            "gpu_artifacts_proxy": controller_side,
        }
        hosts = {
            host: {"gpu_preflight_proxy": {"url": good, "no_proxy": ["localhost"]}, **artifacts},
            "wrong-proxy": {
                "ansible_host": host,
                "gpu_preflight_proxy": {"url": f"http://{USER}:{SECRET}@{proxy_ips[network]}:1"},
                **artifacts,
            },
        }
        inventory = tmp / "inventory"
        inventory.mkdir()
        (inventory / "group_vars").symlink_to(ROOT / "inventories/sandbox/group_vars")
        group = {"gpu_hosts": {"hosts": hosts, "vars": {"ansible_connection": "podman_pipelined"}}}
        (inventory / "hosts.yml").write_text(yaml.safe_dump(group, sort_keys=False))
        reports = tmp / "reports"
        out = site(inventory, "-e", f"gpu_verify_report_dir={reports}", timeout=600)
        log = podman("exec", proxy, "cat", "/var/log/tinyproxy/tinyproxy.log").stdout
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(out.stdout + out.stderr + "\n--- tinyproxy.log\n" + log)
        installed = podman("exec", host, f"{VENV}/bin/python", "-c", f"import {REMOVED}", check=False)
        leaked = podman("exec", host, "grep", "-rlF", SECRET, "/etc", f"{VENV}/pip.conf", "/root", check=False)
        yield {
            "out": out,
            "host": host,
            "host_ip": host_ip,
            "requests": proxy_requests(log),
            "mirror": mirror,
            "needed": needed,
            "proxy_ips": proxy_ips,
            "direct": direct,
            "installed": installed,
            "leaked": leaked,
            "reports": reports,
        }
    finally:
        if mirror:
            mirror.close()
        for name in (host, proxy):
            if name:
                stop_container(name)
        podman("network", "rm", "-f", network, check=False)


def test_the_host_has_no_way_out_but_the_proxy(proxied_run):
    assert proxied_run["direct"].returncode != 0, "the host reached pypi.org directly"
    assert "unreachable" in proxied_run["direct"].stderr or "resolution" in proxied_run["direct"].stderr


def test_the_host_converges_and_verifies_through_the_proxy(proxied_run):
    out, host = proxied_run["out"], proxied_run["host"]
    assert re.search(rf"^{re.escape(host)}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", out.stdout, re.M), (
        out.stdout[-3000:]
    )
    assert proxied_run["installed"].returncode == 0, f"pip did not install {REMOVED} again"
    report = json.loads(latest_report(proxied_run["reports"], "inventory").read_text())
    assert report["hosts"][host]["status"] == "PASS", report["hosts"][host]


def test_the_hosts_requests_went_through_the_proxy(proxied_run, capsys):
    with capsys.disabled():
        print("\nthe proxy's log (client, request):")
        for client, line in proxied_run["requests"]:
            print(f"  {client:15} {line or '(connected, no request: the index try)'}")
    mine = [line for client, line in proxied_run["requests"] if client == proxied_run["host_ip"]]
    # Preflight's index try (one connection per inventory host, no request line), then pip: the index
    # page and the wheel of the pin removed.
    assert mine.count("") >= 1, proxied_run["requests"]
    assert any(line.startswith("CONNECT pypi.org:443 ") for line in mine), proxied_run["requests"]
    assert any(line.startswith("CONNECT files.pythonhosted.org:443 ") for line in mine), proxied_run["requests"]
    assert all(line.startswith("CONNECT ") for line in mine if line), mine


def test_the_controllers_downloads_went_through_the_proxy(proxied_run):
    mirror = proxied_run["mirror"]
    got = {line.split()[1] for _, line in proxied_run["requests"] if line.startswith("GET ")}
    assert {f"{mirror.url}/{name}" for name in proxied_run["needed"]} <= got, proxied_run["requests"]
    assert {path.lstrip("/") for _, path in mirror.seen} >= set(proxied_run["needed"]), mirror.seen
    assert {client for client, _ in mirror.seen} == {proxied_run["proxy_ips"]["podman"]}, mirror.seen


def test_a_proxy_that_does_not_answer_stops_preflight_with_the_password_masked(proxied_run):
    out = proxied_run["out"].stdout
    assert re.search(r"^wrong-proxy\s+: .*failed=1", out, re.M), out[-3000:]
    failure = out[out.index("fatal: [wrong-proxy]") :].split("\n\n")[0]
    assert PREFLIGHT_PLAY in out[: out.index("fatal: [wrong-proxy]")].rsplit("PLAY [", 1)[1]
    ip = proxied_run["proxy_ips"][next(n for n in proxied_run["proxy_ips"] if n != "podman")]
    assert f"through the proxy http://{USER}:****@{ip}:1" in failure, failure
    assert "tf_venv_proxy, by default gpu_preflight_proxy" in failure, failure


def test_the_password_is_in_no_output_report_or_host_file(proxied_run):
    out = proxied_run["out"]
    assert SECRET not in out.stdout + out.stderr
    for path in proxied_run["reports"].rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    assert proxied_run["leaked"].stdout == "", proxied_run["leaked"].stdout
