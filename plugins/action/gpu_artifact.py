# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Action plugin gpu_artifact: one pinned NVIDIA file in the host's artifact cache, present or absent.

The installers ask for their runfile or archive by name. ``state: present`` looks at the cache folder
and the file on the host in one round trip (the file hashed with sha256 there), and only where the
host's copy is not the pinned file pushes the controller's copy with Ansible's ``copy`` and hashes it
again; a copy that differs from its pin is removed and the task fails. ``state: absent`` removes the
file after a verified install, only where it can be there. The folders and keep_cache default to
gpu_artifacts' inputs as the host has them. Documentation: plugins/modules/gpu_artifact.py.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleLookupError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.artifact_sha256 import checksums
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.action_runner import ActionRunner
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.role_input import role_input

STATE_MODULE = "gpu_fleet.tf_hosts.gpu_host_probe"
OPTIONS = {"artifact", "subdir", "state", "controller_dir", "host_cache_dir", "keep_cache", "cache_files", "pushed"}
# The gpu_artifacts input that an option left out stands for (the same value the role itself reads).
ROLE_INPUTS = {
    "controller_dir": "gpu_artifacts_controller_dir",
    "host_cache_dir": "gpu_artifacts_host_cache_dir",
    "keep_cache": "gpu_artifacts_keep_cache",
}
ROOT_OWNED = {"owner": "root", "group": "root"}
FOLDER_MODE, FILE_MODE = "0700", "0600"


def argument_errors(args: dict) -> list[str]:
    """What is wrong with the task's arguments, one message per problem."""
    errors = [f"unknown option {key}" for key in sorted(set(args) - OPTIONS)]
    state = args.get("state", "present")
    if state not in ("present", "absent"):
        errors.append(f"state must be present or absent, not {state!r}")
    artifact = args.get("artifact")
    if not isinstance(artifact, dict) or not artifact.get("file") or "/" in str(artifact["file"]):
        errors.append("artifact must be a manifest record with the file's name (file) and its sha256")
    elif state == "present" and not re.fullmatch(r"[0-9a-fA-F]{64}", str(artifact.get("sha256") or "")):
        errors.append(f"{artifact['file']}: artifact.sha256 must be the pinned sha256 (64 hex digits)")
    subdir = str(args.get("subdir") or "")
    if not subdir or subdir.startswith("/") or ".." in subdir.split("/"):
        errors.append("subdir must be a relative folder such as cuda_toolkit/11.8.0")
    if args.get("cache_files") is not None and not isinstance(args["cache_files"], list):
        errors.append("cache_files must be a list of paths")
    return errors


def cache_path(host_cache_dir: str, subdir: str, file: str) -> str:
    """``<host_cache_dir>/<subdir>/<file>``, spelled as gpu_preflight's look at the cache lists it."""
    return f"{host_cache_dir.rstrip('/')}/{subdir.strip('/')}/{file}"


def removal_needed(path: str, keep_cache: bool, cache_files: list | None, pushed: str) -> bool:
    """Whether the installer at ``path`` is to be removed after its install: never when the cache is kept;
    else when this run pushed it, when gpu_preflight found it in the cache, or when what the cache holds is
    unknown (``cache_files`` None). A converged host's empty cache then costs no round trip."""
    return not keep_cache and (cache_files is None or path in cache_files or path == pushed)


def root_owned(found: dict, mode: str) -> bool:
    """Whether gpu_host_probe's stat entry is root's with ``mode``."""
    return found.get("mode") == mode and found.get("owner") == "root" and found.get("group") == "root"


def file_need(found: dict, checksum: str | None, sha256: str) -> str:
    """What the host's copy needs: "" when it is the pinned file, root's 0600; "attributes" when only its
    owner or mode differ; "push" when it is missing or another file."""
    if not found.get("isreg") or (checksum or "").lower() != sha256.lower():
        return "push"
    return "" if root_owned(found, FILE_MODE) else "attributes"


def damaged(path: str, got: str | None, expected: str, removed: bool) -> str:
    """The failure when the pushed copy at ``path`` is not the pinned file."""
    fix = "and rerun; the corrupt copy was removed." if removed else f", remove {path} and rerun; this run could not."
    return (
        f"{posixpath.basename(path)} on the host has sha256 {got or 'none (the file is gone)'}, expected {expected}: "
        f"the copy was damaged in transit or on disk. Check the host's disk {fix}"
    )


# The lookup artifact_sha256's cache: a copy gpu_artifacts hashed in this or an earlier run is not read again.
SHA256_CACHE = ".gpu-artifacts-sha256.json"


def controller_copy_problem(src: str, sha256: str, remember: bool = True) -> str:
    """Why the controller's copy at ``src`` cannot be pushed ("" when it is the pinned file): a run of one
    phase or tag has not had gpu_artifacts check it, so a missing or wrong copy is named here, before the
    host is blamed for it. The hash is remembered (not in check mode), so the other hosts' pushes of the
    same file read the cache instead of the file."""
    (found,) = checksums([src], SHA256_CACHE, remember=remember)
    fix = (
        "Run playbooks/preflight.yml (or --tags gpu_artifacts), which fetches and checks NVIDIA's files on the "
        "controller, or point gpu_artifacts_controller_dir at the folder that holds the pinned file."
    )
    if not found["exists"]:
        return f"{src} is not on the controller, so it cannot be pushed to the host. {fix}"
    if (found["checksum"] or "").lower() != sha256:
        return (
            f"{src} on the controller has sha256 {found['checksum']}, but its pin is {sha256}: the controller's copy "
            f"is corrupt or not the pinned file. Nothing was pushed. Download it again, or {fix[0].lower()}{fix[1:]}"
        )
    return ""


def combined(steps: list[dict]) -> dict:
    """One result of the steps run: changed when any changed, their diffs, and the first failure if any
    (without its invocation, which -v would print)."""
    done: dict[str, Any] = {"changed": any(step.get("changed") for step in steps)}
    diffs = [d for step in steps for d in (step["diff"] if isinstance(step.get("diff"), list) else [step.get("diff")])]
    if any(diffs):
        done["diff"] = [d for d in diffs if d]
    failed = next((step for step in steps if step.get("failed")), None)
    if failed:
        done.update({key: value for key, value in failed.items() if key not in ("invocation", "changed", "diff")})
    return done


class ActionModule(ActionRunner):
    # No temporary folder of its own: gpu_host_probe runs pipelined, and copy makes one when it pushes.
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_diff = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        errors = argument_errors(args)
        host_cache_dir = str(self._setting("host_cache_dir", task_vars))
        if not host_cache_dir.startswith("/"):
            errors.append(f"host_cache_dir must be an absolute path, not {host_cache_dir!r}")
        if errors:
            raise AnsibleActionFail("gpu_artifact: " + "; ".join(errors))
        path = cache_path(host_cache_dir, str(args["subdir"]), args["artifact"]["file"])
        present = args.get("state", "present") == "present"
        done = self._present(path, task_vars) if present else self._absent(path, task_vars)
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return {**result, **done, "path": path}

    def _setting(self, name: str, task_vars: dict) -> Any:
        """The option ``name``; left out, gpu_artifacts' input that it stands for, as the host has it (templated
        as a task would see it), else that input's default documented in gpu_artifacts' argument specs."""
        if self._task.args.get(name) is not None:
            return self._task.args[name]
        variable = ROLE_INPUTS[name]
        try:
            return role_input(variable, task_vars, self._templar.template)
        except AnsibleLookupError as error:
            raise AnsibleActionFail(
                f"gpu_artifact: {variable} is not set for this host, so the controller's copy cannot be found. Set "
                f"it in the inventory to the controller's folder of NVIDIA's files, or give the task controller_dir."
            ) from error

    def _module(self, name: str, args: dict, task_vars: dict) -> dict:
        return self._execute_module(module_name=name, module_args=args, task_vars=task_vars)

    def _hash(self, paths: list[str], task_vars: dict, stat: list[str] | None = None) -> dict:
        """One round trip: the sha256 of ``paths`` on the host, and what ``stat`` are there."""
        args = {"stat": stat or [], "checksum": paths, "checksum_algorithm": "sha256"}
        return self._module(STATE_MODULE, args, task_vars)

    def _present(self, path: str, task_vars: dict) -> dict:
        """The cache folder made root's 0700 and the pinned file root's 0600, each only where it differs."""
        artifact = self._task.args["artifact"]
        sha256 = str(artifact["sha256"]).lower()
        folder = posixpath.dirname(path)
        look = self._hash([path], task_vars, stat=[folder, path])
        if look.get("failed"):
            return look
        steps = []
        if not (look["stat"][folder].get("isdir") and root_owned(look["stat"][folder], FOLDER_MODE)):
            folder_args = {"path": folder, "state": "directory", **ROOT_OWNED, "mode": FOLDER_MODE}
            steps.append(self._module("ansible.legacy.file", folder_args, task_vars))
        need = "" if combined(steps).get("failed") else file_need(look["stat"][path], look["checksum"][path], sha256)
        if need == "attributes":
            file_args = {"path": path, "state": "file", **ROOT_OWNED, "mode": FILE_MODE}
            steps.append(self._module("ansible.legacy.file", file_args, task_vars))
        elif need == "push":
            src = os.path.join(str(self._setting("controller_dir", task_vars)), artifact["file"])
            if problem := controller_copy_problem(src, sha256, remember=not self._task.check_mode):
                return {**combined(steps), "failed": True, "msg": problem}
            copy_args = {"src": src, "dest": path, **ROOT_OWNED, "mode": FILE_MODE}
            steps.append(self._run_action("ansible.legacy.copy", copy_args, task_vars))
        done = combined(steps)
        # Check mode pushes nothing, so there is nothing to hash.
        if need == "push" and not done.get("failed") and not self._task.check_mode:
            return self._verify_pushed(path, sha256, done, task_vars)
        return done

    def _verify_pushed(self, path: str, sha256: str, done: dict, task_vars: dict) -> dict:
        """The pushed copy hashed on the host; one that is not the pinned file is removed (the next run pushes
        a fresh one instead of trusting it) and the task fails."""
        look = self._hash([path], task_vars)
        if look.get("failed"):
            return combined([done, look])
        got = look["checksum"][path]
        if (got or "").lower() == sha256:
            return done
        removed = self._module("ansible.legacy.file", {"path": path, "state": "absent"}, task_vars)
        return {**done, "changed": True, "failed": True, "msg": damaged(path, got, sha256, not removed.get("failed"))}

    def _absent(self, path: str, task_vars: dict) -> dict:
        """The file removed from the host cache after its install, where it can be there (``removal_needed``)."""
        args = self._task.args
        keep = boolean(self._setting("keep_cache", task_vars), strict=False)
        if not removal_needed(path, keep, args.get("cache_files"), str(args.get("pushed") or "")):
            why = "the host cache is kept (keep_cache)" if keep else "it was not in the host cache"
            return {"changed": False, "msg": f"Nothing to remove: {why}"}
        removed = self._module("ansible.legacy.file", {"path": path, "state": "absent"}, task_vars)
        return combined([removed])
