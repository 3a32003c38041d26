# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Connection plugin for the clone's sandbox: podman containers, one ``podman exec -i`` per module."""

from __future__ import annotations

DOCUMENTATION = r"""
name: podman_pipelined
author: gpu-fleet maintainers (@gpu-fleet)
short_description: Run tasks in a local podman container, one podman exec per module
description:
  - Runs each task in an existing, running podman container on the controller. With pipelining on,
    a module goes to Python's standard input in one C(podman exec -i) call; the
    C(containers.podman.podman) connection, which has no pipelining, needs five C(podman exec) calls
    for it (home folder, temporary folder, chmod, the module, clean-up). Measured on a 2-core machine,
    twenty modules against one container took 8.6 s instead of 21.8 s.
  - Files go in and out through the container's root file system as C(podman mount) shows it to the
    controller (rootful podman), symbolic links followed inside the container's root. Through
    C(podman cp) instead, followed by a C(chown) to O(remote_user) for an upload, go files where that
    mount fails or is empty (rootless podman), files on another mount of the container (a volume, a
    tmpfs, the C(/etc/hosts) and C(/etc/hostname) that podman mounts; C(/proc/<pid>/mountinfo) of the
    container's first process lists them), and every upload when O(remote_user) is set.
  - A container that does not exist or is not running makes the host unreachable (podman's own exit
    status 125), with podman's message.
  - Part of the clone's tests, not of the C(gpu_fleet.tf_hosts) collection. The clone's C(ansible.cfg)
    finds it in C(tests/plugins/connection) under the short name C(podman_pipelined). It is used by the
    sandbox inventory, the Molecule scenarios and the tests; an inventory of one's own should use
    C(containers.podman.podman).
requirements:
  - podman on the controller.
  - Pipelining on (C(pipelining = True) in C(ansible.cfg), which the clone's C(ansible.cfg) sets);
    without it, modules run through files in the container, as with C(containers.podman.podman).
options:
  remote_addr:
    description:
      - The name or ID of the container. Ansible's address of the host is taken (C(ansible_host), else
        the inventory name; under C(delegate_to), the delegated host's).
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
  remote_user:
    description:
      - User (name or UID) that runs commands inside the container (C(podman exec --user)). Unset, the
        container's own user.
    ini:
      - section: defaults
        key: remote_user
    env:
      - name: ANSIBLE_REMOTE_USER
    vars:
      - name: ansible_user
  podman_extra_args:
    description:
      - Arguments added to every podman command line, before the subcommand (split as a shell would).
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

import os
import re
import shlex
import shutil
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible.utils.display import Display

display = Display()

# podman-exec(1), EXIT STATUS: "125 The error is with Podman itself" (no such container, container not
# running); 126 and 127 are the command's. With pipelining, it would otherwise read as a module failure.
PODMAN_OWN_ERROR = 125
# Symbolic links followed inside the container's root before the path counts as unresolvable (Linux's
# own limit), so a loop falls back to `podman cp` instead of spinning.
MAX_SYMLINKS = 40
# The container's mounts as its first process sees them (proc(5)); fields are space-separated, with
# space, tab, newline and backslash written as octal escapes.
MOUNTINFO = "/proc/{pid}/mountinfo"
MOUNTINFO_ESCAPE = re.compile(rb"\\([0-7]{3})")


class Connection(ConnectionBase):
    """Commands through ``podman exec`` (``-i`` when Ansible sends input), files through the
    container's mount point or ``podman cp``."""

    transport = "podman_pipelined"
    has_pipelining = True

    def __init__(self, *args, **kwargs):
        # ansible-core 2.16-2.18 pass new_stdin and shell positionally, 2.19+ only by keyword.
        super().__init__(*args, **kwargs)
        self.user = self._play_context.remote_user
        # Ansible's address of the host, under delegate_to the delegated host's; the remote_addr option's
        # inventory_hostname would stay the original host's there.
        self._container = self._play_context.remote_addr
        # None: not asked yet; b"": podman mount failed or gave an empty folder (podman cp instead).
        self._mount_point: bytes | None = None
        # The container's other mount points (volumes, tmpfs, podman's /etc/hosts): not in that folder.
        self._other_mounts: set[bytes] = set()

    def _connect(self):
        if not self._connected:
            display.vvv(
                f"ESTABLISH PODMAN CONNECTION FOR USER: {self.user or '(container default)'}", host=self._container
            )
            self._connected = True
        return self

    def _podman(self, args: list[str], in_data: bytes | None = None) -> tuple[int, bytes, bytes]:
        """Run podman with the extra arguments and ``args``; returns its exit status, stdout, stderr."""
        executable = self.get_option("podman_executable")
        program = shutil.which(executable)
        if not program:
            raise AnsibleError(
                f"podman program {executable} not found on the controller: install podman, or set "
                "ansible_podman_executable to its path"
            )
        extra = shlex.split(to_text(self.get_option("podman_extra_args") or "", errors="surrogate_or_strict"))
        argv = [program, *extra, *args]
        display.vvv(f"RUN {argv}", host=self._container)
        done = subprocess.run(
            [to_bytes(arg, errors="surrogate_or_strict") for arg in argv],
            input=in_data,
            stdin=None if in_data is not None else subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
        display.vvvvv(f"RC {done.returncode} STDOUT {done.stdout!r} STDERR {done.stderr!r}", host=self._container)
        return done.returncode, done.stdout, done.stderr

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        """Run ``cmd`` in the container; ``in_data`` (a pipelined module) goes to its standard input."""
        args = ["exec", "-i"] if in_data is not None else ["exec"]
        if self.user:
            args += ["--user", self.user]
        args.append(self._container)
        args += shlex.split(to_text(cmd, errors="surrogate_or_strict"))
        rc, stdout, stderr = self._podman(args, in_data)
        if rc == PODMAN_OWN_ERROR:
            raise AnsibleConnectionFailure(
                f"podman could not run a command in container {self._container}: "
                f"{to_text(stderr, errors='surrogate_or_replace').strip()}"
            )
        return rc, stdout, stderr

    def _mounted_root(self) -> bytes:
        """The container's root file system as the controller sees it, or b"" where it cannot."""
        if self._mount_point is None:
            self._mount_point, self._other_mounts = self._ask_mounts()
        return self._mount_point

    def _ask_mounts(self) -> tuple[bytes, set[bytes]]:
        """``podman mount``'s folder and the container's other mount points; b"" where either
        cannot be had."""
        rc, stdout, stderr = self._podman(["mount", self._container])
        root = stdout.strip()
        if rc != 0:
            display.vvvv(f"podman mount failed, using podman cp: {to_text(stderr).strip()}", host=self._container)
            return b"", set()
        if not root or not os.path.isdir(root) or not os.listdir(root):
            # Rootless podman prints a folder that only its own user namespace sees filled.
            display.vvvv(f"podman mount gave an empty folder {root!r}, using podman cp", host=self._container)
            return b"", set()
        rc, stdout, stderr = self._podman(["inspect", "--format", "{{.State.Pid}}", self._container])
        try:
            with open(MOUNTINFO.format(pid=int(stdout)), "rb") as mountinfo:
                points = {line.split(b" ")[4] for line in mountinfo}
        except (ValueError, OSError, IndexError) as exc:
            display.vvvv(
                f"the container's mounts are unknown ({exc}; {stderr!r}), using podman cp", host=self._container
            )
            return b"", set()
        points = {MOUNTINFO_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), point) for point in points}
        return root, points - {b"/"}

    def _host_path(self, path: str) -> bytes | None:
        """``path`` of the container under its mount point, symbolic links followed within the
        container's root (an absolute link target never leaves it for the controller's own files);
        None where there is no usable mount point, the path is relative or loops, or it reaches another
        mount of the container."""
        root = self._mounted_root()
        if not root or not path.startswith("/"):
            return None
        pending = [part for part in to_bytes(path, errors="surrogate_or_strict").split(b"/") if part not in (b"", b".")]
        parts: list[bytes] = []
        links = 0
        while pending:
            part = pending.pop(0)
            if part == b"..":
                if parts:
                    parts.pop()
                continue
            if b"/" + b"/".join([*parts, part]) in self._other_mounts:
                return None
            candidate = os.path.join(root, *parts, part)
            if not os.path.islink(candidate):
                parts.append(part)
                continue
            links += 1
            if links > MAX_SYMLINKS:
                return None
            target = os.readlink(candidate)
            if target.startswith(b"/"):
                parts = []
            pending[:0] = [piece for piece in target.split(b"/") if piece not in (b"", b".")]
        return os.path.join(root, *parts)

    def _copy(self, source: str, destination: str, what: str) -> None:
        """``podman cp``. Older podman releases pause the container to copy into it, which fails
        where it cannot be paused: a failed copy is tried once more without the pause."""
        rc, _stdout, stderr = self._podman(["cp", source, destination])
        if rc != 0:
            rc, _stdout, stderr = self._podman(["cp", "--pause=false", source, destination])
        if rc != 0:
            raise AnsibleError(
                f"podman cp could not {what} container {self._container}: "
                f"{to_text(stderr, errors='surrogate_or_replace').strip()}"
            )

    @ensure_connect
    def put_file(self, in_path, out_path):
        """Copy the controller's ``in_path`` to ``out_path`` in the container."""
        display.vvv(f"PUT {in_path} TO {out_path}", host=self._container)
        if not os.path.exists(to_bytes(in_path, errors="surrogate_or_strict")):
            raise AnsibleFileNotFound(f"file or module does not exist: {in_path}")
        # Through the mount point a file belongs to root: for another user, podman cp and chown.
        target = None if self.user else self._host_path(out_path)
        if target is not None:
            try:
                shutil.copyfile(to_bytes(in_path, errors="surrogate_or_strict"), target)
            except OSError as exc:
                raise AnsibleError(
                    f"could not copy {in_path} to {out_path} in container {self._container}: {exc}"
                ) from exc
            return
        self._copy(in_path, f"{self._container}:{out_path}", f"copy {in_path} to {out_path} in")
        if self.user:
            rc, _stdout, stderr = self._podman(["exec", self._container, "chown", self.user, out_path])
            if rc != 0:
                raise AnsibleError(
                    f"could not give {out_path} to user {self.user} in container {self._container}: "
                    f"{to_text(stderr, errors='surrogate_or_replace').strip()}"
                )

    @ensure_connect
    def fetch_file(self, in_path, out_path):
        """Copy ``in_path`` of the container to the controller's ``out_path``."""
        display.vvv(f"FETCH {in_path} TO {out_path}", host=self._container)
        source = self._host_path(in_path)
        if source is not None:
            try:
                shutil.copyfile(source, to_bytes(out_path, errors="surrogate_or_strict"))
            except FileNotFoundError as exc:
                raise AnsibleFileNotFound(f"{in_path} does not exist in container {self._container}") from exc
            except OSError as exc:
                raise AnsibleError(f"could not fetch {in_path} from container {self._container}: {exc}") from exc
            return
        self._copy(f"{self._container}:{in_path}", out_path, f"fetch {in_path} to {out_path} from")

    def reset(self):
        """Nothing persists between commands; the mount point is asked again."""
        self.close()

    def close(self):
        """The container stays mounted (it is while it runs, podman mount or not)."""
        self._mount_point = None
        self._other_mounts = set()
        self._connected = False
