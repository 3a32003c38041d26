"""lookup artifact_sha256: digests of controller files, remembered while each file is unchanged."""

from __future__ import annotations

import hashlib
import json

import pytest
from ansible.errors import AnsibleLookupError
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup import artifact_sha256

CACHE = ".gpu-artifacts-sha256.json"


@pytest.fixture
def reads(monkeypatch):
    """The files actually read, in order."""
    seen: list[str] = []
    real = artifact_sha256.sha256_of

    def counting(path: str) -> str:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(artifact_sha256, "sha256_of", counting)
    return seen


def test_digest_existence_and_a_folder(tmp_path):
    runfile = tmp_path / "cuda_11.8.0_520.61.05_linux.run"
    runfile.write_bytes(b"#!/bin/sh\n")
    (tmp_path / "sub").mkdir()
    found = artifact_sha256.checksums([str(runfile), str(tmp_path / "gone.run"), str(tmp_path / "sub")], CACHE, True)
    assert found == [
        {"path": str(runfile), "exists": True, "checksum": hashlib.sha256(b"#!/bin/sh\n").hexdigest()},
        {"path": str(tmp_path / "gone.run"), "exists": False, "checksum": None},
        {"path": str(tmp_path / "sub"), "exists": True, "checksum": None},
    ]


def test_an_unchanged_file_is_read_once_and_a_rewritten_one_again(tmp_path, reads):
    runfile = tmp_path / "a.run"
    runfile.write_bytes(b"one")
    first = artifact_sha256.checksums([str(runfile)], CACHE, True)
    again = artifact_sha256.checksums([str(runfile)], CACHE, True)
    assert first == again and reads == [str(runfile)]
    assert set(json.loads((tmp_path / CACHE).read_text())) == {"a.run"}
    # Same size, rewritten in place: the change time moves, so the file is read again.
    runfile.write_bytes(b"two")
    changed = artifact_sha256.checksums([str(runfile)], CACHE, True)
    assert changed[0]["checksum"] == hashlib.sha256(b"two").hexdigest() and len(reads) == 2


def test_a_cache_entry_that_does_not_match_the_file_is_not_trusted(tmp_path):
    runfile = tmp_path / "a.run"
    runfile.write_bytes(b"real")
    (tmp_path / CACHE).write_text(json.dumps({"a.run": {"identity": [4, 0, 0, 0], "sha256": "0" * 64}}))
    assert artifact_sha256.checksums([str(runfile)], CACHE, True)[0]["checksum"] == hashlib.sha256(b"real").hexdigest()
    (tmp_path / CACHE).write_text("not json")
    assert artifact_sha256.checksums([str(runfile)], CACHE, True)[0]["checksum"] == hashlib.sha256(b"real").hexdigest()


def test_check_mode_and_a_folder_that_cannot_be_written_keep_no_cache(tmp_path, monkeypatch):
    runfile = tmp_path / "a.run"
    runfile.write_bytes(b"x")
    lookup = artifact_sha256.LookupModule()
    found = lookup.run([[str(runfile)]], variables={"ansible_check_mode": True})
    assert found[0]["checksum"] == hashlib.sha256(b"x").hexdigest()
    assert not (tmp_path / CACHE).exists()

    def refuse(*_args, **_kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(artifact_sha256.os, "replace", refuse)
    assert artifact_sha256.checksums([str(runfile)], CACHE, True)[0]["exists"]
    assert not (tmp_path / CACHE).exists()


def test_relative_paths_are_refused_by_name():
    with pytest.raises(AnsibleLookupError, match=r"absolute paths only: build/a\.run"):
        artifact_sha256.LookupModule().run(["build/a.run"], variables={})
