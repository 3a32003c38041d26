"""plugin_utils/host_cache.py: when cuda_toolkit and cudnn try to remove an installer from the host cache."""

from __future__ import annotations

import pytest
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.host_cache import may_hold

TAIL = "/cudnn/8.6.0.163/cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ({"keep_cache": True, "cache_files": None}, False),
        ({"keep_cache": "yes", "cache_files": ["/var/cache/gpu-fleet" + TAIL]}, False),
        ({"cache_files": None}, True),
        ({}, True),
        ({"keep_cache": False, "cache_files": []}, False),
        ({"keep_cache": False, "cache_files": ["/var/cache/gpu-fleet" + TAIL]}, True),
        ({"keep_cache": False, "cache_files": ["/var/cache/gpu-fleet/cudnn/9.1.0/other.tar.xz"]}, False),
    ],
)
def test_the_cache_may_hold_the_file_unless_kept_or_known_not_to(inputs, expected):
    assert may_hold(TAIL, inputs) is expected
