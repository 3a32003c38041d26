"""Test hosts in a known state, built once per content and reused: podman images of converged hosts.

A state (``STATES``) is what the real playbook leaves on a sandbox host with given inventory
variables: ``converged`` is the sandbox inventory's default stack after ``site.yml``. The first test that needs a state builds it: a new container
from the base image, the real ``site.yml`` run against it (it must end with rc 0 and the host PASS in
the fleet report), then ``podman commit``. Later tests start containers from that image in seconds.

The image's tag holds a key: a sha256 over everything that decides the state (the base image's id,
the roles, plugins, files, data, playbooks, ansible.cfg, the sandbox inventory, the state's own
variables, the stand-ins' manifest with their checksums, the controller's pinned requirements and
this file). Any change to those makes a new key, so a stale snapshot is never found; older images of
the same state are removed when a new one is built, and ``clean`` removes them all (``make clean``).

Usage: python tests/snapshots.py image STATE   ensure the snapshot, print its image name
       python tests/snapshots.py key STATE     print the key only (builds nothing)
       python tests/snapshots.py keep STATE HOST
                                               commit the running container HOST, which reached
                                               STATE itself, as the snapshot (unless one has the key)
       python tests/snapshots.py clean         remove every snapshot image
Exit codes: 0 done; 1 the build failed (the playbook's output tail on stderr); 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import latest_report, run_playbook
from wheelhouse import cache_dir, container_options

BASE_IMAGE = os.environ.get("GPU_SANDBOX_IMAGE", "localhost/gpu-sandbox-debian:12")
REPOSITORY = "localhost/gpu-sandbox-snapshot"
LABEL = "io.gpu-fleet.snapshot-key"
# The builders' locks live in the machine's test cache, as the images live in the machine's podman
# storage: clones on one machine that want the same snapshot wait for one build.
LOCKS = cache_dir() / "snapshots"
SANDBOX_GROUP_VARS = ROOT / "inventories" / "sandbox" / "group_vars"
SMALL_GROUP_VARS = ROOT / "tests" / "fixtures" / "inventory" / "small" / "group_vars"
# What decides a converged host, besides the state's own variables and stand-ins.
INPUTS = (
    "roles",
    "plugins",
    "files",
    "data",
    "playbooks",
    "meta",
    "site.yml",
    "ansible.cfg",
    "inventories/sandbox",
    "requirements.txt",
    "tools/sandbox.sh",
    "tests/snapshots.py",
    "tests/ansible_run.py",
)


@dataclass(frozen=True)
class State:
    """A host state: the sandbox inventory's variables plus ``host_vars``, after ``site.yml``."""

    name: str
    standins: str  # the stand-in folder under build/ whose manifest the run uses
    host_vars: dict = field(default_factory=dict)

    def inputs(self) -> tuple[str, ...]:
        return (*INPUTS, f"build/{self.standins}/artifacts.yml")


# More states go here as tests need them (each is built once per content): a state used by one test
# only would cost a commit for nothing in a fresh run.
STATES = {"converged": State("converged", "standins")}


class SnapshotError(RuntimeError):
    """A snapshot could not be built: the message says which step and shows the output's tail."""


def podman(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, check=check)


def image_id(image: str) -> str:
    found = podman("image", "inspect", "--format", "{{.Id}}", image, check=False)
    if found.returncode != 0:
        raise SnapshotError(f"image {image} is not here: build it with `make image` ({found.stderr.strip()})")
    return found.stdout.strip()


def tree_digest(root: Path, paths: tuple[str, ...]) -> str:
    """sha256 over the relative names and contents of every file under ``paths`` (links by target),
    sorted; bytecode and caches are left out. A missing path counts as absent, not as an error."""
    digest = hashlib.sha256()
    for top in paths:
        start = root / top
        files = [start] if start.is_file() or start.is_symlink() else sorted(p for p in start.rglob("*"))
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc" or (path.is_dir() and not path.is_symlink()):
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def key(state: State, root: Path = ROOT, base_id: str | None = None) -> str:
    """The state's key: its definition, the base image's id and the digest of its inputs."""
    base = base_id or image_id(BASE_IMAGE)
    definition = json.dumps({"name": state.name, "host_vars": state.host_vars, "base": base}, sort_keys=True)
    return hashlib.sha256(definition.encode() + tree_digest(root, state.inputs()).encode()).hexdigest()


def image_name(state: State, state_key: str) -> str:
    return f"{REPOSITORY}:{state.name}-{state_key[:16]}"


def start_host(name: str, image: str, *options: str) -> None:
    """Start a sandbox container ``name`` from ``image`` (tools/sandbox.sh, the session's wheelhouse
    mounted: tests/wheelhouse.py)."""
    env = dict(os.environ, GPU_SANDBOX_NAME=name, GPU_SANDBOX_IMAGE=image)
    started = subprocess.run(
        [str(ROOT / "tools/sandbox.sh"), "up", *container_options(), *options], capture_output=True, text=True, env=env
    )
    if started.returncode != 0:
        raise SnapshotError(f"podman could not start {name} from {image}: {started.stderr.strip()}")


def write_inventory(folder: Path, host: str, host_vars: dict, group_vars: Path = SANDBOX_GROUP_VARS) -> Path:
    """An inventory folder: ``host`` (a podman container) in gpu_hosts, with ``group_vars``: the
    sandbox's (NVIDIA's real files, TensorFlow's GPU build), or SMALL_GROUP_VARS for a host of a test
    of the roles' logic (tests/fixtures/inventory/small)."""
    folder.mkdir(parents=True, exist_ok=True)
    hosts = {"gpu_hosts": {"hosts": {host: {"ansible_connection": "podman_pipelined", **host_vars}}}}
    (folder / "hosts.yml").write_text(json.dumps(hosts, indent=1))
    (folder / "group_vars").symlink_to(group_vars)
    return folder


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One builder per state at a time (parallel test runs wait for the first)."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    with open(LOCKS / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def ensure(name: str) -> str:
    """The image of state ``name``, built first when no image has its current key."""
    state = STATES[name]
    state_key = key(state)
    image = image_name(state, state_key)
    if exists(image):
        return image
    with _locked(name):
        if not exists(image):
            _build(state, image, state_key)
            _prune(state, keep=image)
    return image


def _build(state: State, image: str, state_key: str) -> None:
    host = f"gpu-snapshot-{state.name.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    print(
        f"snapshot {state.name}: building {image} on {host} (site.yml from {BASE_IMAGE})", file=sys.stderr, flush=True
    )
    start_host(host, BASE_IMAGE)
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-snapshot-") as tmp:
            inventory = write_inventory(Path(tmp) / "inventory", host, state.host_vars)
            reports = Path(tmp) / "reports"
            run = run_playbook("site.yml", inventory, "-e", f"gpu_verify_report_dir={reports}", timeout=1800)
            if run.returncode != 0:
                raise SnapshotError(f"site.yml failed on {host} (rc {run.returncode}):\n{run.stdout[-4000:]}")
            report = json.loads(latest_report(reports, "inventory").read_text())
            if report["hosts"][host]["status"] != "PASS":
                raise SnapshotError(f"{host} converged but did not verify: {report['hosts'][host]}")
        _commit(state, host, image, state_key)
    finally:
        podman("rm", "-f", "-t", "1", host, check=False)


def _commit(state: State, host: str, image: str, state_key: str) -> None:
    committed = podman("commit", "--change", f"LABEL {LABEL}={state_key}", host, image, check=False)
    if committed.returncode != 0:
        raise SnapshotError(f"podman commit {host} {image} failed: {committed.stderr.strip()}")
    print(f"snapshot {state.name}: {image} committed from {host}", file=sys.stderr, flush=True)


def keep(name: str, host: str) -> str:
    """Commit the running container ``host`` as state ``name``'s snapshot, unless an image has the
    current key already; returns the image. For a test whose own host reached the state the way the
    builder would (site.yml with the state's inventory variables, rc 0, the host PASS): Molecule
    ``default`` keeps its converged host, so that a fresh run converges that state once, not twice."""
    state = STATES[name]
    state_key = key(state)
    image = image_name(state, state_key)
    with _locked(name):
        if not exists(image):
            _commit(state, host, image, state_key)
            _prune(state, keep=image)
    return image


def _images() -> list[str]:
    listed = podman(
        "images", "--filter", f"reference={REPOSITORY}", "--format", "{{.Repository}}:{{.Tag}}", check=False
    )
    return [line for line in listed.stdout.split() if line.startswith(REPOSITORY + ":")]


def _prune(state: State, keep: str) -> None:
    """Remove the state's older images (other keys): they can never be used again. With
    GPU_FLEET_SNAPSHOT_PRUNE=0 they stay, for several work trees testing side by side."""
    if os.environ.get("GPU_FLEET_SNAPSHOT_PRUNE", "1") == "0":
        return
    for image in _images():
        if image != keep and image.split(":", 1)[1].startswith(f"{state.name}-"):
            podman("rmi", "-f", image, check=False)


def clean() -> list[str]:
    """Remove every snapshot image (and containers still using one); returns what was removed."""
    removed = _images()
    for image in removed:
        podman("rmi", "-f", image, check=False)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("image", "key", "keep"):
        sub.add_parser(command).add_argument("state", choices=sorted(STATES))
    sub.choices["keep"].add_argument("host", help="a running container in that state")
    sub.add_parser("clean")
    args = parser.parse_args(argv)
    try:
        if args.command == "image":
            print(ensure(args.state))
        elif args.command == "keep":
            print(keep(args.state, args.host))
        elif args.command == "key":
            print(key(STATES[args.state]))
        else:
            for image in clean():
                print(f"removed {image}")
    except SnapshotError as exc:
        print(f"snapshot: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
