# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Callback plugin: load the Jinja2 and lookup plugins once, in the controller's main process."""

from __future__ import annotations

DOCUMENTATION = r"""
name: preload
author: gpu-fleet maintainers (!UNKNOWN)
version_added: "0.19.0"
type: aggregate
short_description: Load the filter, test and lookup plugins once per run instead of once per task
description:
  - Ansible runs each task in a worker process forked from its main process (Ansible documentation,
    Controlling playbook execution, section Setting the number of forks). A worker that templates a filter,
    test or lookup the main process has not loaded yet imports it again, and throws it away when the
    task ends.
  - At the start of each playbook this callback loads Ansible's own filters and tests and this collection's
    filters, tests and lookups in the main process, so that every worker inherits them loaded.
  - It changes nothing else and prints nothing unless a plugin cannot be loaded (a warning; the run goes on
    and that plugin is loaded by each task as before). On the sandbox host a no-op C(site.yml) takes
    about 2 s less controller CPU (C(make bench) prints the figure).
requirements:
  - Enabled in C(ansible.cfg) (C(callbacks_enabled = gpu_fleet.tf_hosts.preload) under C([defaults])) or
    with C(ANSIBLE_CALLBACKS_ENABLED=gpu_fleet.tf_hosts.preload). The project's own C(ansible.cfg)
    enables it.
"""

from pathlib import Path  # noqa: E402  (imports follow the documentation block, as ansible-test validate-modules requires)
from typing import Any  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible.plugins.loader import filter_loader, lookup_loader, test_loader  # noqa: E402

COLLECTION = "gpu_fleet.tf_hosts"
# plugins/callback/preload.py -> the collection's root, in a clone and in an installed copy alike.
ROOT = Path(__file__).resolve().parents[2]


def collection_plugins(root: Path = ROOT) -> list[tuple[Any, str]]:
    """(loader, fully qualified name) of each of the collection's filters, tests and lookups. A filter
    or test is named by its documentation file (one per name, next to the module that defines it); a
    lookup by its module."""
    found = []
    for loader, kind, suffix in (
        (filter_loader, "filter", ".yml"),
        (test_loader, "test", ".yml"),
        (lookup_loader, "lookup", ".py"),
    ):
        for path in sorted((root / "plugins" / kind).glob(f"*{suffix}")):
            if not path.stem.startswith("_"):
                found.append((loader, f"{COLLECTION}.{path.stem}"))
    return found


def preload(root: Path = ROOT) -> list[str]:
    """Load Ansible's own filters and tests and the collection's plugins; the names that failed to load."""
    for loader in (filter_loader, test_loader):
        list(loader.all(class_only=True))
    failed = []
    for loader, name in collection_plugins(root):
        try:
            plugin = loader.get(name)
        except Exception:  # a plugin that cannot load now is loaded by its task, as without this callback
            plugin = None
        if plugin is None:
            failed.append(name)
    return failed


class CallbackModule(CallbackBase):
    """Loads the plugins at the start of each playbook."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpu_fleet.tf_hosts.preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook: Any) -> None:
        failed = preload()
        if failed:
            self._display.warning(
                f"gpu_fleet.tf_hosts.preload could not load {', '.join(failed)}; each task loads them itself"
            )
