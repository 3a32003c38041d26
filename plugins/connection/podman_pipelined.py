# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Connection plugin: containers.podman.podman with pipelining (one ``podman exec -i`` per module)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: podman_pipelined
author: gpu-fleet maintainers (@gpu-fleet)
version_added: "0.11.0"
short_description: Run tasks in a podman container, one podman exec per module
description:
  - The C(containers.podman.podman) connection with pipelining. That plugin runs each module in
    five C(podman exec) calls (home folder, temporary folder, chmod, the module, clean-up); this one
    sends the module to Python's standard input in one C(podman exec -i) call. Measured on a 2-core
    machine, twenty modules against one container took 8.6 s instead of 21.8 s.
  - The containers.podman collection turned pipelining off in 2021 because its C(podman exec) did not
    pass standard input (U(https://github.com/containers/ansible-podman-collections/pull/275)); this
    plugin adds C(-i) whenever Ansible sends input, and changes nothing else (file transfer through
    the container's mount point, C(remote_user), extra arguments are the parent plugin's).
  - A container that does not exist or is not running makes the host unreachable (podman's own
    exit status 125), with podman's message, as the parent plugin does.
  - Used by the clone's sandbox inventory, the Molecule scenarios and the tests. It needs the
    C(containers.podman) collection and is taken only when a host names it in C(ansible_connection).
requirements:
  - The C(containers.podman) collection (any 1.x release with its C(podman) connection plugin).
  - Pipelining on (C(pipelining = True) in C(ansible.cfg)), which the clone's C(ansible.cfg) sets;
    without it this plugin behaves exactly as C(containers.podman.podman).
options:
  remote_addr:
    description:
      - The name or ID of the container.
    default: inventory_hostname
    vars:
      - name: ansible_host
      - name: inventory_hostname
      - name: ansible_podman_host
  remote_user:
    description:
      - User (name or UID) that runs commands inside the container.
    ini:
      - section: defaults
        key: remote_user
    env:
      - name: ANSIBLE_REMOTE_USER
    vars:
      - name: ansible_user
  podman_extra_args:
    description:
      - Arguments added to every podman command line, before the subcommand.
    default: ''
    ini:
      - section: defaults
        key: podman_extra_args
    vars:
      - name: ansible_podman_extra_args
    env:
      - name: ANSIBLE_PODMAN_EXTRA_ARGS
  podman_executable:
    description:
      - The podman program to run (a name on PATH or a path).
    default: podman
    vars:
      - name: ansible_podman_executable
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
  pipelining:
    description:
      - Send modules through standard input instead of files in the container.
    type: bool
    default: false
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
      - section: ssh_connection
        key: pipelining
    env:
      - name: ANSIBLE_PIPELINING
    vars:
      - name: ansible_pipelining
"""

import shlex  # noqa: E402  (imports follow the documentation block, as ansible-test validate-modules requires)

from ansible.errors import AnsibleConnectionFailure, AnsibleError  # noqa: E402
from ansible.module_utils.common.text.converters import to_native  # noqa: E402
from ansible.plugins.connection import ensure_connect  # noqa: E402

# podman-exec(1), EXIT STATUS: "125 The error is with Podman itself" (no such container, container not
# running); 126 and 127 are the command's. Without pipelining, that error surfaced when Ansible made its
# temporary folder and the host was unreachable; with it, it would read as a module failure.
PODMAN_OWN_ERROR = 125

try:
    from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection
except ImportError:  # pragma: no cover - reported when a host uses the plugin
    PodmanConnection = None


if PodmanConnection is None:

    class Connection:  # pylint: disable=too-few-public-methods
        """Stands in when containers.podman is missing, to say so when a host names this plugin."""

        def __init__(self, *args, **kwargs):
            raise AnsibleError(
                "gpu_fleet.tf_hosts.podman_pipelined needs the containers.podman collection: "
                "install it with `ansible-galaxy collection install containers.podman`"
            )

else:

    class Connection(PodmanConnection):  # type: ignore[no-redef]
        """containers.podman.podman, plus ``-i`` on ``podman exec`` when Ansible sends input."""

        transport = "gpu_fleet.tf_hosts.podman_pipelined"
        has_pipelining = True

        @ensure_connect
        def exec_command(self, cmd, in_data=None, sudoable=False):
            # The grandparent's exec_command only logs; the parent's would drop in_data.
            super(PodmanConnection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
            exec_args = ["exec", "-i"] if in_data is not None else ["exec"]
            if self.user:
                exec_args.extend(("--user", self.user))
            rc, stdout, stderr = self._podman(
                exec_args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data
            )
            if rc == PODMAN_OWN_ERROR:
                raise AnsibleConnectionFailure(
                    f"podman could not run a command in container {self._container_id}: "
                    f"{to_native(stderr, errors='surrogate_or_replace').strip()}"
                )
            return rc, stdout, stderr
