"""The previous release's converged host, built once per machine: where the upgrade test starts.

An administrator upgrades in place: the hosts were converged by the previous release, and the new
release's ``site.yml`` runs over them with the same inventory. This module makes such a host: the
previous release's tree (``git archive`` of its commit, ``RELEASE`` below), its own stand-ins (its
own ``tests/fixtures/nvidia/build_standins.py``, as its ``make standins`` built them) and its own
sandbox inventory, converging a fresh sandbox container with its own ``site.yml`` (rc 0, the host PASS
in its report); the container is committed as a podman image (``podman commit``, as tests/snapshots.py
keeps its states), so a machine pays for the old converge once.

The image's tag holds a key over the release's commit, the base image's id and the recipe below
(``RECIPE``): a new release pin, a new base image or a new recipe gives a new image, and the older
ones are removed when it is built (not with GPU_FLEET_SNAPSHOT_PRUNE=0). The builders wait for each
other on a lock in the machine's test cache, across clones. ``python tests/snapshots.py clean``
removes the image with the snapshots (the same repository).

Usage: python tests/previous_release.py image   ensure the image, print its name
       python tests/previous_release.py key     print the key only (builds nothing)
Exit codes: 0 done; 1 the build failed (the step and the output's tail on stderr); 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvidia"))

from ansible_run import ANSIBLE_PLAYBOOK, latest_report
from nvidia_files import locked
from snapshots import BASE_IMAGE, LABEL, LOCKS, REPOSITORY, SnapshotError, exists, image_id, podman, start_host


@dataclass(frozen=True)
class Release:
    version: str  # galaxy.yml's version at ``commit`` (a unit test checks it)
    commit: str  # the full commit id, so that a tag moved or missing changes nothing


# The previous release, the one administrators upgrade from. At each release, once the release's
# commit (the one that sets galaxy.yml's version) is made, move this pin to it: the upgrade test then
# starts from the release just made (docs/releasing.md, docs/testing.md "Upgrading in place").
RELEASE = Release(version="0.18.0", commit="0cced9698873f23ec041390eb9c538ed147eaf1e")

# How the previous release's host is made, as its own `make standins` and sandbox did: its stand-ins
# without the apt packages that only its Molecule driver_package scenario used, and its sandbox
# inventory's variables. A change here gives a new image.
RECIPE = {
    "standins": ["--debs", "none"],
    "connection": "gpu_fleet.tf_hosts.podman_pipelined",
    "group_vars": "inventories/sandbox/group_vars",
}


def key(release: Release = RELEASE, base_id: str | None = None) -> str:
    definition = {"release": release.commit, "base": base_id or image_id(BASE_IMAGE), "recipe": RECIPE}
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


def image_name(release: Release, release_key: str) -> str:
    return f"{REPOSITORY}:release-{release.version}-{release_key[:16]}"


def ensure(release: Release = RELEASE) -> str:
    """The image of a host converged by ``release``, built first when no image has its key."""
    image = image_name(release, key(release))
    if exists(image):
        return image
    with locked(LOCKS, "previous-release"):
        if not exists(image):
            _build(release, image)
            _prune(keep=image)
    return image


def export_tree(release: Release, dest: Path) -> Path:
    """The release's files at ``dest`` (``git archive``: no work tree registered in the clone)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", release.commit], capture_output=True)
    if archive.returncode != 0:
        raise SnapshotError(
            f"this clone lacks release {release.version}'s commit {release.commit[:12]} "
            f"({archive.stderr.decode().strip()}): fetch the full history (`git fetch --unshallow`)"
        )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def converge(tree: Path, host: str, work: Path) -> None:
    """The release's own stand-ins, inventory and ``site.yml`` on ``host``: rc 0 and the host PASS."""
    standins = [
        sys.executable,
        str(tree / "tests/fixtures/nvidia/build_standins.py"),
        "--out",
        str(tree / "build/standins"),
    ]
    built = subprocess.run([*standins, *RECIPE["standins"]], capture_output=True, text=True)
    if built.returncode != 0:
        raise SnapshotError(f"the release's build_standins.py failed:\n{built.stderr[-3000:]}")
    inventory = work / "inventory"
    inventory.mkdir()
    hosts = {"gpu_hosts": {"hosts": {host: {"ansible_connection": RECIPE["connection"]}}}}
    (inventory / "hosts.yml").write_text(json.dumps(hosts))
    (inventory / "group_vars").symlink_to(tree / RECIPE["group_vars"])
    env = dict(os.environ, ANSIBLE_CONFIG=str(tree / "ansible.cfg"), ANSIBLE_HOME=str(work / ".ansible"))
    env.update(ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_FORCE_COLOR="0")
    reports = work / "reports"
    argv = [ANSIBLE_PLAYBOOK, str(tree / "site.yml"), "-i", str(inventory), "-e", f"gpu_verify_report_dir={reports}"]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tree, timeout=1800)
    if run.returncode != 0:
        raise SnapshotError(f"the release's site.yml failed on {host} (rc {run.returncode}):\n{run.stdout[-4000:]}")
    status = json.loads(latest_report(reports, "inventory").read_text())["hosts"][host]
    if status["status"] != "PASS":
        raise SnapshotError(f"{host} converged by the release but did not verify: {status}")


def _build(release: Release, image: str) -> None:
    host = f"gpu-release-{release.version.replace('.', '-')}-{uuid.uuid4().hex[:6]}"
    print(f"previous release {release.version}: building {image} on {host}", file=sys.stderr, flush=True)
    start_host(host, BASE_IMAGE)
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-release-") as tmp:
            tree = export_tree(release, Path(tmp) / "tree")
            converge(tree, host, Path(tmp))
        committed = podman("commit", "--change", f"LABEL {LABEL}=release-{release.commit}", host, image, check=False)
        if committed.returncode != 0:
            raise SnapshotError(f"podman commit {host} {image} failed: {committed.stderr.strip()}")
    finally:
        podman("rm", "-f", "-t", "1", host, check=False)


def _prune(keep: str) -> None:
    """Remove the images of older pins or recipes (GPU_FLEET_SNAPSHOT_PRUNE=0 keeps them)."""
    if os.environ.get("GPU_FLEET_SNAPSHOT_PRUNE", "1") == "0":
        return
    listed = podman("images", "--filter", f"reference={REPOSITORY}", "--format", "{{.Repository}}:{{.Tag}}")
    for image in listed.stdout.split():
        if image != keep and image.startswith(f"{REPOSITORY}:release-"):
            podman("rmi", "-f", image, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["image", "key"])
    args = parser.parse_args(argv)
    try:
        print(ensure() if args.command == "image" else key())
    except SnapshotError as exc:
        print(f"previous release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
