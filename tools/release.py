#!/usr/bin/env python3
"""The collection tarball as it is published, checked by Galaxy's own importer.

Galaxy and Automation Hub run ``galaxy-importer`` (https://github.com/ansible/galaxy-importer) on
every upload; it refuses a collection whose galaxy.yml has no ``repository`` ("Invalid collection
metadata. 'repository' is required"). The project has no public repository yet, so galaxy.yml names
none (a placeholder would send users nowhere) and the release gives it: ``build`` copies the clone's
files (what git tracks or would track, so never build outputs or reports), writes the address into
that copy's galaxy.yml only, builds the tarball with ``ansible-galaxy collection build`` (galaxy.yml's
manifest decides what goes in, as for every build) and runs the importer on it, as Galaxy would:
its metadata, docs (ansible-doc) and ansible-lint checks, with ansible-test left out (Galaxy runs
it only in its own containers). Any error fails the build, and so does any warning (ansible-lint's
findings are warnings on the collection's Galaxy page).

The importer pins its own dependencies (attrs<24, below what this clone's tools use), so it gets a
virtual environment of its own from tests/requirements/galaxy-importer.txt (hashes included), made
once per machine in the test cache (GPU_TEST_CACHE, default ~/.cache/gpu-fleet-tests;
``galaxy-importer/``), under a lock that other clones wait for; pip's passing failures are tried again.

Usage: tools/release.py build --repository URL [--out DIR]   build, check, print the tarball's path
       tools/release.py check TARBALL                         the importer's check of a built tarball
Exit codes: 0 built and accepted; 1 the build failed or the importer refused the tarball (its
output says why); 2 usage (no repository address, or not an http(s) URL).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvidia"))

import retry  # noqa: E402
from nvidia_files import cache_dir, locked  # noqa: E402

LOCK = ROOT / "tests" / "requirements" / "galaxy-importer.txt"
CONFIG = ROOT / "tools" / "galaxy-importer.cfg"
# galaxy-importer's limit for a URL (its schema's MAX_LENGTH_URL).
MAX_URL = 2000


class ReleaseError(RuntimeError):
    """The tarball could not be built, or the importer refused it: the message says why."""


class UsageError(ReleaseError):
    """The release was asked for without what it needs (exit 2)."""


def check_repository(url: str | None, galaxy: dict) -> str | None:
    """The repository address to write (None: galaxy.yml names one already and none was given)."""
    if not url:
        if galaxy.get("repository"):
            return None
        raise UsageError(
            "no repository address: galaxy.yml names none and Galaxy's importer refuses a collection "
            "without one; give the collection's public repository, e.g. "
            "`make release REPOSITORY=https://github.com/<owner>/<repository>`"
        )
    if not url.startswith(("https://", "http://")) or len(url) > MAX_URL or any(c.isspace() for c in url):
        raise UsageError(f"repository {url!r} is not an http(s) URL of at most {MAX_URL} characters")
    return url


def source_files(root: Path = ROOT) -> list[str]:
    """The clone's files that git tracks or would track (not ignored), that exist."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        raise ReleaseError(f"git could not list the clone's files: {listed.stderr.strip()}")
    return sorted({name for name in listed.stdout.split("\0") if name and os.path.lexists(root / name)})


def copy_sources(dest: Path, root: Path = ROOT) -> Path:
    """A copy of the clone's files in ``dest`` (links kept as links)."""
    for name in source_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        source = root / name
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    return dest


def set_repository(galaxy_yml: Path, url: str) -> None:
    """``repository: url`` in ``galaxy_yml`` (replacing a line it has), its other lines untouched."""
    lines = [line for line in galaxy_yml.read_text().splitlines() if not line.startswith("repository:")]
    lines.append(f"repository: {json.dumps(url)}")
    galaxy_yml.write_text("\n".join(lines) + "\n")


def build(url: str | None, out: Path, root: Path = ROOT) -> Path:
    """The release tarball in ``out``, built from a copy of the clone with ``url`` as its repository."""
    galaxy = yaml.safe_load((root / "galaxy.yml").read_text())
    url = check_repository(url, galaxy)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-fleet-release-") as tmp:
        copy = copy_sources(Path(tmp) / "collection", root)
        if url:
            set_repository(copy / "galaxy.yml", url)
        built = subprocess.run(
            ["ansible-galaxy", "collection", "build", "--force", "--output-path", str(out.resolve()), str(copy)],
            capture_output=True, text=True, check=False, cwd=tmp,
        )  # fmt: skip
    if built.returncode != 0:
        raise ReleaseError(f"ansible-galaxy collection build failed:\n{built.stdout}{built.stderr}")
    tarball = out / f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz"
    if not tarball.is_file():
        raise ReleaseError(f"ansible-galaxy collection build did not write {tarball}:\n{built.stdout}")
    return tarball


def importer_venv(lock: Path = LOCK) -> Path:
    """The importer's virtual environment for ``lock``, made once per machine (other clones wait)."""
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    store = cache_dir() / "galaxy-importer"
    venv = store / digest
    with locked(store, digest):
        if (venv / ".installed").is_file():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        retry.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--require-hashes",
             "--only-binary=:all:", "-r", str(lock)],
            what=f"pip install -r {lock.name} (galaxy-importer's venv)",
        )  # fmt: skip
        (venv / ".installed").write_text(lock.name + "\n")
    return venv


def importer_findings(output: str) -> list[str]:
    """The importer's ERROR and WARNING lines (its log's levels; INFO lines carry no prefix)."""
    return [line for line in output.splitlines() if line.startswith(("ERROR:", "WARNING:", "CRITICAL:"))]


def check(tarball: Path) -> str:
    """Run galaxy-importer on ``tarball`` as Galaxy does; returns its output, raises on any finding."""
    venv = importer_venv()
    with tempfile.TemporaryDirectory(prefix="gpu-fleet-importer-") as tmp:
        # A clean Ansible environment, as on Galaxy's servers: not this clone's ansible.cfg or paths.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "GALAXY_IMPORTER_"))}
        env.update(
            PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            HOME=tmp,
            GALAXY_IMPORTER_CONFIG=str(CONFIG),
            GALAXY_IMPORTER_TMP_ROOT_DIR=tmp,
            GALAXY_IMPORTER_ANSIBLE_LOCAL_TMP=f"{tmp}/ansible-tmp",
        )
        ran = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "galaxy_importer.main", str(tarball.resolve())],
            capture_output=True, text=True, check=False, cwd=tmp, env=env,
        )  # fmt: skip
    output = ran.stdout + ran.stderr
    findings = importer_findings(output)
    if ran.returncode != 0 or findings or "Importer processing completed successfully" not in output:
        shown = "\n".join(findings) if findings else output[-4000:]
        raise ReleaseError(f"Galaxy's importer refused {tarball.name} (exit {ran.returncode}):\n{shown}")
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    building = sub.add_parser("build", help="build the release tarball and check it with galaxy-importer")
    building.add_argument("--repository", help="the collection's public repository (galaxy.yml's, if it names one)")
    building.add_argument("--out", type=Path, default=ROOT / "build" / "release", help="the tarball's folder")
    sub.add_parser("check", help="check a built tarball with galaxy-importer").add_argument("tarball", type=Path)
    args = parser.parse_args(argv)
    try:
        tarball = build(args.repository, args.out) if args.command == "build" else args.tarball
        check(tarball)
    except UsageError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    except (ReleaseError, retry.RetryError, subprocess.CalledProcessError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print(f"release: Galaxy's importer (galaxy-importer) accepts {tarball}", file=sys.stderr)
    print(tarball)
    return 0


if __name__ == "__main__":
    sys.exit(main())
