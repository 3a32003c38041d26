# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Whether an installer may still be in the host's artifact cache, for the roles that remove it there after
a verified install (cuda_toolkit's runfiles, cudnn's archives)."""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean


def may_hold(tail: str, inputs: dict) -> bool:
    """Whether the cache may hold the file whose path ends with ``tail`` (so its removal is to be tried): never
    when the cache is kept (``keep_cache``); else when gpu_preflight found it there (``cache_files``,
    gpu_preflight_host_cache_files) or what the cache holds is unknown (``cache_files`` missing or None)."""
    if boolean(inputs.get("keep_cache", False), strict=False):
        return False
    files = inputs.get("cache_files")
    if files is None:
        return True
    return any(str(path).endswith(tail) for path in files)
