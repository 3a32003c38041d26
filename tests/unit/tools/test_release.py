"""tools/release.py: the release tarball carries the repository given at release time (galaxy.yml of
the clone untouched), is built from the clone's own files only, and a refusal of Galaxy's importer
fails the release. The importer's own run on the real tarball is the part ``release:galaxy_importer``."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))

import release

URL = "https://example.com/gpu-fleet/tf_hosts"
GALAXY = "namespace: demo\nname: coll\nversion: 1.0.0\nreadme: README.md\nauthors: [someone]\n# a comment kept\n"


@pytest.fixture
def clone(tmp_path) -> Path:
    """A small collection in a git work tree: a tracked file, an untracked one and an ignored one."""
    root = tmp_path / "clone"
    (root / "build").mkdir(parents=True)
    (root / "galaxy.yml").write_text(GALAXY)
    (root / "README.md").write_text("# demo\n")
    (root / ".gitignore").write_text("/build\n")
    (root / "build" / "stray.txt").write_text("a build output\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "galaxy.yml", ".gitignore"], check=True)
    return root


def manifest(tarball: Path) -> dict:
    with tarfile.open(tarball) as tar:
        return json.load(tar.extractfile("MANIFEST.json"))


def test_the_tarball_carries_the_repository_and_the_clone_stays_as_it_was(clone, tmp_path):
    tarball = release.build(URL, tmp_path / "out", root=clone)
    assert tarball == tmp_path / "out" / "demo-coll-1.0.0.tar.gz"
    assert manifest(tarball)["collection_info"]["repository"] == URL
    assert (clone / "galaxy.yml").read_text() == GALAXY


def test_the_copy_holds_tracked_and_untracked_files_never_ignored_ones(clone, tmp_path):
    names = release.source_files(clone)
    assert "galaxy.yml" in names and "README.md" in names
    assert not any(name.startswith("build/") for name in names)


def test_a_repository_replaces_the_one_galaxy_yml_names(tmp_path):
    galaxy = tmp_path / "galaxy.yml"
    galaxy.write_text(GALAXY + "repository: https://old.example/x\n")
    release.set_repository(galaxy, URL)
    text = galaxy.read_text()
    assert "old.example" not in text and f'repository: "{URL}"' in text and "# a comment kept" in text


def test_without_a_repository_the_release_stops_naming_the_fix(clone, tmp_path):
    with pytest.raises(release.UsageError, match=r"make release REPOSITORY=https://"):
        release.build(None, tmp_path / "out", root=clone)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("url", ["git@github.com:o/r.git", "https://example.com/a b", "https://x/" + "a" * 2000])
def test_a_repository_that_is_no_http_url_is_refused(url):
    with pytest.raises(release.UsageError, match="is not an http"):
        release.check_repository(url, {})


def test_the_importers_errors_and_warnings_are_findings():
    output = (
        "Importing with galaxy-importer 0.4.44\nLoading role tf_venv\n"
        "WARNING: roles/x/tasks/main.yml:3: name[missing]: All tasks should be named.\n"
        "ERROR: The import failed for the following reason: Invalid collection metadata. 'repository' is required\n"
    )
    assert release.importer_findings(output) == output.splitlines()[2:]
    assert release.importer_findings("Importer processing completed successfully\n") == []


def fake_importer(tmp_path, monkeypatch, said: str, rc: int) -> None:
    """An importer venv whose python prints ``said`` and exits ``rc``."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "said.txt").write_text(said)
    (bin_dir / "python").write_text(f"#!/bin/sh\ncat '{tmp_path / 'said.txt'}'\nexit {rc}\n")
    (bin_dir / "python").chmod(0o755)
    monkeypatch.setattr(release, "importer_venv", lambda: tmp_path / "venv")


def test_a_refusal_of_the_importer_fails_the_release_with_its_words(tmp_path, monkeypatch):
    refusal = "ERROR: The import failed for the following reason: Invalid collection metadata. 'repository' is required"
    fake_importer(tmp_path, monkeypatch, refusal + "\n", 1)
    with pytest.raises(release.ReleaseError, match="'repository' is required"):
        release.check(tmp_path / "demo-coll-1.0.0.tar.gz")


def test_a_warning_fails_the_release_even_when_the_importer_completes(tmp_path, monkeypatch):
    said = "WARNING: roles/x/tasks/main.yml:3: no-changed-when\nImporter processing completed successfully\n"
    fake_importer(tmp_path, monkeypatch, said, 0)
    with pytest.raises(release.ReleaseError, match="no-changed-when"):
        release.check(tmp_path / "demo-coll-1.0.0.tar.gz")
    fake_importer(tmp_path / "ok", monkeypatch, "Importer processing completed successfully\n", 0)
    assert "completed successfully" in release.check(tmp_path / "demo-coll-1.0.0.tar.gz")
