# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Where a line meant for the person watching a run goes: stdout under a stdout callback that prints for people,
stderr under any other.

Ansible gives standard output to one plugin, the stdout callback ("You can only have one plugin be the main
manager of your console output": Ansible documentation, "Callback plugins", section "Setting a callback plugin
for ansible-playbook", https://docs.ansible.com/ansible/latest/plugins/callback.html). Under a machine-readable
one (``ansible.posix.json``, whose standard output is one JSON document; ``ansible.posix.jsonl``; AWX's and
ansible-runner's ``awx_display``, whose output is its event stream) a line that a plugin prints there itself
breaks what scripts, CI and AWX parse. So the collection's own lines (the fleet report's table, the wait for a
run lock, a long step's progress) go to stdout only under the stdout callbacks listed below, which print for
people; under any other, known or not, they go to stderr, where a person still sees them. What a script needs
of them is in the task's result as well, which every stdout callback shows or serializes its own way.
"""

from __future__ import annotations

from ansible import constants as C

# The stdout callbacks that print for people, by short and full name (the stdout callbacks of ansible-core,
# ansible.posix and community.general in Ansible's "Index of all Stdout Callback Plugins",
# https://docs.ansible.com/ansible/latest/collections/callback_index_stdout.html, less the JSON ones and null).
HUMAN_STDOUT_CALLBACKS = frozenset(
    name
    for collection, names in (
        ("ansible.builtin", ("default", "minimal", "oneline")),
        ("ansible.posix", ("debug",)),
        (
            "community.general",
            (
                "counter_enabled",
                "default_without_diff",
                "dense",
                "diy",
                "selective",
                "tasks_only",
                "timestamp",
                "unixy",
                "yaml",
            ),
        ),
    )
    for short in names
    for name in (short, f"{collection}.{short}")
)


def stdout_callback() -> str:
    """The run's stdout callback as configured (``stdout_callback`` in ansible.cfg, ``ANSIBLE_STDOUT_CALLBACK``)."""
    return str(C.DEFAULT_STDOUT_CALLBACK or "default")


def to_stderr(callback: str | None = None) -> bool:
    """Whether a line for people goes to stderr under ``callback`` (default: the run's stdout callback)."""
    return (callback or stdout_callback()) not in HUMAN_STDOUT_CALLBACKS
