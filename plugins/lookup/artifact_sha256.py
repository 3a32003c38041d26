# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Lookup plugin: the SHA-256 of files on the controller, remembered while each file is unchanged."""

from __future__ import annotations

DOCUMENTATION = r"""
name: artifact_sha256
author: gpu-fleet maintainers (!UNKNOWN)
version_added: "0.15.0"
short_description: SHA-256 of NVIDIA's installers on the controller, hashed again only when a file changed
description:
  - Returns, for each path on the controller, whether it exists and its SHA-256.
  - NVIDIA's CUDA runfiles and cuDNN archives are gigabytes; hashing them on every run would make a no-op
    run on a converged fleet (the nightly drift check) pay for it each time. The digest of each file is kept
    in a cache file in the file's folder, with the file's size, modification time, change time and inode; a
    file whose four values are unchanged is not read again. Any write or rename of the file changes its
    change time, which no tool can set back.
  - The cache is not written in check mode, nor where the folder is not writable (then every run hashes).
options:
  _terms:
    description: Absolute paths of files on the controller.
    type: list
    elements: path
    required: true
  cache_name:
    description: The cache file's name in each file's folder.
    type: str
    default: .gpu-artifacts-sha256.json
"""

EXAMPLES = r"""
- name: Hash the pinned installers on the controller
  ansible.builtin.debug:
    msg: "{{ query('gpu_fleet.tf_hosts.artifact_sha256', '/srv/nvidia/cuda_12.2.2_535.104.05_linux.run') }}"
"""

RETURN = r"""
_raw:
  description: One C({path, exists, checksum}) per term; C(checksum) is V(null) for a missing file or a folder.
  type: list
  elements: dict
"""

import hashlib  # noqa: E402  (imports follow the documentation blocks, as ansible-test validate-modules requires)
import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

CHUNK = 1 << 20
CACHE_NAME = ".gpu-artifacts-sha256.json"


def identity(found: os.stat_result) -> list[int]:
    """What must be unchanged for a remembered digest to hold."""
    return [found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino]


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def load_cache(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            cache = json.load(handle)
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def save_cache(path: str, cache: dict) -> None:
    """Written whole and renamed into place; a folder that cannot be written keeps no cache."""
    try:
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".sha256-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(cache, handle, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        return


def checksums(paths: list[str], cache_name: str, remember: bool) -> list[dict]:
    """``{path, exists, checksum}`` per path, each file read only when the cache does not hold it."""
    caches: dict[str, dict] = {}
    dirty: set[str] = set()
    out = []
    for path in paths:
        cache_path = os.path.join(os.path.dirname(path), cache_name)
        cache = caches.setdefault(cache_path, load_cache(cache_path))
        try:
            found = os.stat(path)
        except FileNotFoundError:
            out.append({"path": path, "exists": False, "checksum": None})
            continue
        if not stat.S_ISREG(found.st_mode):
            out.append({"path": path, "exists": True, "checksum": None})
            continue
        name = os.path.basename(path)
        entry = cache.get(name)
        if not (isinstance(entry, dict) and entry.get("identity") == identity(found)):
            entry = {"identity": identity(found), "sha256": sha256_of(path)}
            cache[name] = entry
            dirty.add(cache_path)
        out.append({"path": path, "exists": True, "checksum": entry["sha256"]})
    for cache_path in dirty if remember else ():
        save_cache(cache_path, caches[cache_path])
    return out


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = sorted(set(kwargs) - {"cache_name"})
        if unknown:
            raise AnsibleLookupError(f"artifact_sha256: unknown options {', '.join(unknown)}")
        paths = [str(p) for term in terms for p in (term if isinstance(term, list) else [term])]
        relative = [p for p in paths if not os.path.isabs(p)]
        if relative:
            raise AnsibleLookupError(f"artifact_sha256 takes absolute paths only: {', '.join(relative)}")
        remember = not (variables or {}).get("ansible_check_mode", False)
        return checksums(paths, kwargs.get("cache_name", CACHE_NAME), remember)
