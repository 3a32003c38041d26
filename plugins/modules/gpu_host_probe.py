#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Ansible module gpu_host_probe: the state of many paths on the host in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_host_probe
short_description: Probe many paths and commands on the host in one round trip, read-only
description:
  - Looks at every path of O(stat), reads every file of O(read), hashes every file of O(checksum) and
    lists what each pattern of O(glob) matches, in one module run. A role's probe of a converged host is
    then one task, not one C(ansible.builtin.stat) or C(ansible.builtin.slurp) per path; on a podman or
    ssh connection each task is a round trip of a second or more.
  - Runs each command of O(run) and returns its exit code and output, so a probe's read-only commands (a
    program's version, C(findmnt), C(nvidia-smi --query-compute-apps)) share that round trip.
  - Changes nothing on the host (the commands of O(run) must only read). A path that is missing or cannot
    be read, or a command that fails or is not installed, is reported, never an error.
version_added: "0.13.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  stat:
    description:
      - Absolute paths to look at, without following a final symbolic link (like C(ansible.builtin.stat)
        with C(follow=false)).
    type: list
    elements: str
    default: []
  read:
    description:
      - Absolute paths of small text files to read (at most O(max_bytes) each), such as completion
        records and version files.
    type: list
    elements: str
    default: []
  checksum:
    description:
      - Absolute paths of files to hash with O(checksum_algorithm); links are followed.
    type: list
    elements: str
    default: []
  checksum_algorithm:
    description:
      - The hash of O(checksum). V(sha1) is the checksum of C(ansible.builtin.stat) and C(ansible.builtin.copy);
        V(sha256) is the one the artifact manifest pins NVIDIA's files with.
    type: str
    choices: [sha1, sha256]
    default: sha1
    version_added: "0.19.0"
  glob:
    description:
      - Absolute shell patterns (Python's C(glob), not recursive); each gives the sorted paths it matches,
        links included whether or not they resolve.
    type: list
    elements: str
    default: []
  run:
    description:
      - Read-only commands to run, keyed by a name of the caller's choice; each an argv list (no shell). A
        program that is not installed gives C(rc) 127.
    type: dict
    default: {}
  max_bytes:
    description:
      - The most bytes read from each file of O(read); a longer file is reported as too big.
    type: int
    default: 1048576
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: ansible.builtin.stat
  - module: ansible.builtin.slurp
"""

EXAMPLES = r"""
- name: Look at the driver's files in one round trip
  gpu_fleet.tf_hosts.gpu_host_probe:
    stat:
      - /usr/lib/x86_64-linux-gnu/libcuda.so.1
      - /usr/bin/nvidia-uninstall
    read:
      - /var/lib/gpu_fleet/nvidia_driver.done
  register: driver_state

- name: Say whether the uninstaller is there
  ansible.builtin.debug:
    msg: "{{ driver_state.stat['/usr/bin/nvidia-uninstall'].exists }}"
"""

RETURN = r"""
stat:
  description:
    - One entry per path of O(stat), keyed by the path as given.
    - C(exists), C(isdir), C(isreg), C(islnk) (booleans, of the path itself) and C(target_exists) (whether
      what the path finally points at, through every link, exists; false for a dangling link); where the
      path exists also, for a link, C(lnk_target) (its target as written) and C(lnk_source) (the final
      path it resolves to), as C(ansible.builtin.stat) names them; C(mode) (octal string
      such as C(0755)), C(uid), C(gid), C(owner) and C(group) (names; the number where none is known),
      C(size) and C(mtime).
  returned: always
  type: dict
  sample: {"/usr/local/cuda": {"exists": true, "islnk": true, "isdir": false, "isreg": false, "target_exists": true,
           "lnk_target": "/usr/local/cuda-11.8", "lnk_source": "/usr/local/cuda-11.8", "mode": "0777", "uid": 0, "gid": 0, "owner": "root",
           "group": "root", "size": 20,
           "mtime": 1764633600.0}}
read:
  description:
    - One entry per path of O(read), keyed by the path as given; the file's text (UTF-8, undecodable
      bytes replaced), or null where the file is missing, is not a regular file, cannot be read or is
      longer than O(max_bytes).
  returned: always
  type: dict
  sample: {"/var/lib/gpu_fleet/nvidia_driver.done": "520.61.05 runfile\n"}
checksum:
  description:
    - One entry per path of O(checksum), keyed by the path as given; its hash (O(checksum_algorithm)), or null
      where it is not a file or cannot be read.
  returned: always
  type: dict
  sample: {"/etc/profile.d/gpu-env.sh": "5d41402abc4b2a76b9719d911017c592ae7b0f2a"}
glob:
  description:
    - One entry per pattern of O(glob), keyed by the pattern as given; the sorted list of matching paths.
  returned: always
  type: dict
  sample: {"/usr/local/cuda-11.8/lib64/libcudnn*.so.8.*": ["/usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0"]}
run:
  description:
    - One entry per command of O(run), keyed by its name; C(rc), C(stdout) and C(stderr).
  returned: always
  type: dict
  sample: {"findmnt": {"rc": 0, "stdout": "{\"filesystems\": []}\n", "stderr": ""}}
"""

import glob  # noqa: E402  (imports follow the documentation blocks, as ansible-test validate-modules requires)
import grp  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import stat as stat_module  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _name(lookup, number: int) -> str:
    """The user or group name of a number (pwd.getpwuid, grp.getgrgid), else the number as text."""
    try:
        return lookup(number)[0]
    except KeyError:
        return str(number)


def file_checksum(path: str, algorithm: str = "sha1") -> str | None:
    """The file's hash (links followed), or None when it is not a file or cannot be read."""
    try:
        return digest(path, algorithm) if os.path.isfile(path) else None
    except OSError:
        return None


def path_stat(path: str) -> dict:
    """What ansible.builtin.stat (follow=false) would say of the path, in short."""
    try:
        found = os.lstat(path)
    except OSError:
        return {"exists": False, "isdir": False, "isreg": False, "islnk": False, "target_exists": False}
    mode = found.st_mode
    result = {
        "exists": True,
        "isdir": stat_module.S_ISDIR(mode),
        "isreg": stat_module.S_ISREG(mode),
        "islnk": stat_module.S_ISLNK(mode),
        "target_exists": os.path.exists(path),
        "mode": f"{stat_module.S_IMODE(mode):04o}",
        "uid": found.st_uid,
        "gid": found.st_gid,
        "owner": _name(pwd.getpwuid, found.st_uid),
        "group": _name(grp.getgrgid, found.st_gid),
        "size": found.st_size,
        "mtime": found.st_mtime,
    }
    if result["islnk"]:
        result["lnk_target"] = os.readlink(path)
        result["lnk_source"] = os.path.realpath(path)
    return result


def read_text(path: str, max_bytes: int) -> str | None:
    """The file's text, or None when it is missing, not a regular file, unreadable or too long."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError:
        return None
    return None if len(data) > max_bytes else data.decode("utf-8", errors="replace")


def digest(path: str, algorithm: str) -> str:
    # SHA-1 is the checksum ansible.builtin.copy compares, not a security use.
    hashed = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hashed.update(block)
    return hashed.hexdigest()


def run_command(module: AnsibleModule, argv: list[str]) -> dict:
    """``{rc, stdout, stderr}`` of one command, without a shell; rc 127 when it cannot be started (where
    AnsibleModule.run_command would fail the whole module, and the other commands' answers with it)."""
    try:
        rc, stdout, stderr = module.run_command(argv, errors="surrogate_then_replace", handle_exceptions=False)
    except OSError as error:
        return {"rc": 127, "stdout": "", "stderr": f"{argv[0]}: {error.strerror}"}
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def host_state(module: AnsibleModule) -> dict:
    """The module's result for its parameters (stat, read, checksum and its algorithm, glob, run, max_bytes)."""
    params = module.params
    return {
        "run": {name: run_command(module, [str(arg) for arg in argv]) for name, argv in params["run"].items()},
        "stat": {path: path_stat(path) for path in params["stat"]},
        "read": {path: read_text(path, params["max_bytes"]) for path in params["read"]},
        "checksum": {path: file_checksum(path, params["checksum_algorithm"]) for path in params["checksum"]},
        "glob": {pattern: sorted(glob.glob(pattern)) for pattern in params["glob"]},
    }


ARGUMENT_SPEC = {
    "stat": {"type": "list", "elements": "str", "default": []},
    "read": {"type": "list", "elements": "str", "default": []},
    "checksum": {"type": "list", "elements": "str", "default": []},
    "checksum_algorithm": {"type": "str", "choices": ["sha1", "sha256"], "default": "sha1"},
    "glob": {"type": "list", "elements": "str", "default": []},
    "run": {"type": "dict", "default": {}},
    "max_bytes": {"type": "int", "default": 1048576},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    relative = [p for key in ("stat", "read", "checksum", "glob") for p in params[key] if not os.path.isabs(p)]
    if relative:
        module.fail_json(msg=f"gpu_host_probe takes absolute paths only; got {', '.join(relative)}.")
    bad = sorted(name for name, argv in params["run"].items() if not isinstance(argv, list) or not argv)
    if bad:
        module.fail_json(msg=f"gpu_host_probe: each command of run is a non-empty argv list; not {', '.join(bad)}.")
    module.exit_json(changed=False, **host_state(module))


if __name__ == "__main__":
    main()
