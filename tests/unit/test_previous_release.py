"""tests/previous_release.py: the pin of the release the upgrade test starts from, and its image's key.

The pinned commit must be in the clone and carry the pinned version in its galaxy.yml (a release's
commit sets it: docs/releasing.md); this clone's galaxy.yml is that version or a later one. The key
moves with the commit, the base image and the recipe, so a moved pin never finds the old image.
"""

from __future__ import annotations

import subprocess

import previous_release
import yaml
from helpers import ROOT

BASE = "sha256:" + "0" * 64


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in yaml.safe_load(text)["version"].split("."))


def test_the_pinned_commit_is_the_pinned_release():
    release = previous_release.RELEASE
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{release.commit}:galaxy.yml"], capture_output=True, text=True
    )
    assert shown.returncode == 0, f"the clone lacks {release.commit} (`git fetch --unshallow`): {shown.stderr}"
    assert len(release.commit) == 40
    assert version(shown.stdout) == tuple(int(part) for part in release.version.split("."))
    assert version((ROOT / "galaxy.yml").read_text()) >= version(shown.stdout)


def test_the_key_moves_with_the_commit_the_base_image_and_the_recipe(monkeypatch):
    release = previous_release.RELEASE
    first = previous_release.key(release, base_id=BASE)
    assert previous_release.key(release, base_id=BASE) == first
    moved = previous_release.Release(version="0.19.0", commit="1" * 40)
    assert previous_release.key(moved, base_id=BASE) != first
    assert previous_release.key(release, base_id="sha256:" + "1" * 64) != first
    monkeypatch.setitem(previous_release.RECIPE, "standins", [])
    assert previous_release.key(release, base_id=BASE) != first
    assert previous_release.image_name(release, first).endswith(f":release-{release.version}-{first[:16]}")
