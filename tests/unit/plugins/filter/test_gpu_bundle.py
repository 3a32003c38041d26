"""gpu_bundle's filter: pip download's command line for the hosts' Python and platform."""

from __future__ import annotations

from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_bundle import gpu_bundle_pip_download

SETTINGS = {"python": "/usr/bin/python3", "dest": "/srv/bundle/wheels", "python_version": "3.11", "platform": "x"}


def test_a_lock_is_downloaded_for_the_hosts_python_and_platform_as_binary_wheels():
    assert gpu_bundle_pip_download(SETTINGS, ["--require-hashes", "--no-deps", "-r", "/locks/tf.txt"]) == [
        "/usr/bin/python3", "-m", "pip", "download", "--dest", "/srv/bundle/wheels", "--only-binary=:all:",
        "--implementation", "cp", "--python-version", "3.11", "--platform", "x", "--progress-bar", "off",
        "--require-hashes", "--no-deps", "-r", "/locks/tf.txt",
    ]  # fmt: skip


def test_further_packages_come_last():
    assert gpu_bundle_pip_download(SETTINGS, ["jupyterlab==4.2.5"])[-3:] == [
        "--progress-bar",
        "off",
        "jupyterlab==4.2.5",
    ]
