"""The filter gpu_files_into: controller files as the action gpu_files' items, into one host folder."""

from __future__ import annotations

from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_files import gpu_files_into


def test_each_file_goes_into_the_folder_under_its_own_name_in_order():
    assert gpu_files_into(["/c/files/verify/b.py", "/c/plugins/module_utils/a.py"], "/opt/gpu-verify") == [
        {"dest": "/opt/gpu-verify/b.py", "src": "/c/files/verify/b.py", "mode": "0644"},
        {"dest": "/opt/gpu-verify/a.py", "src": "/c/plugins/module_utils/a.py", "mode": "0644"},
    ]


def test_a_mode_of_its_own_and_no_files():
    assert gpu_files_into(["/x/run"], "/opt/t", "0755") == [{"dest": "/opt/t/run", "src": "/x/run", "mode": "0755"}]
    assert gpu_files_into([], "/opt/t") == []
