# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Action plugin gpu_files: several small files written with one round trip when they are current.

A ``copy`` or ``template`` task costs two round trips even when nothing changes (a stat, then the file
module for owner and mode). This action hashes every file's wanted content on the controller, looks at
all of them on the host with gpu_host_probe (one round trip), and writes only the files that differ:
with the module gpu_files, all in one more round trip (each file through a temporary file and one
rename, as ``copy`` does); with Ansible's own ``copy`` action where that is needed (a validate
command, check or diff mode). A role that has just looked at the host anyway hands that look over
(``looked``, with what the filter gpu_files_look names): then a host whose files are current costs no round
trip at all. Documentation: plugins/modules/gpu_files.py.
"""

from __future__ import annotations

import copy
import hashlib
import posixpath
import re
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_files import gpu_files_look
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.action_runner import ActionRunner

STATE_MODULE = "gpu_fleet.tf_hosts.gpu_host_probe"
MODULE = "gpu_fleet.tf_hosts.gpu_files"
ITEM_KEYS = {"dest", "content", "src", "link", "mode", "owner", "group", "validate"}
SOURCES = ("content", "src", "link")


def item_errors(files: Any) -> list[str]:
    """What is wrong with the ``files`` argument, one message per problem."""
    if not isinstance(files, list):
        return ["files must be a list of {dest, content or src or link, mode, owner, group, validate}"]
    errors = []
    for number, item in enumerate(files, 1):
        if not isinstance(item, dict):
            errors.append(f"files item {number} is not a dict")
            continue
        name = item.get("dest", f"item {number}")
        unknown = sorted(set(item) - ITEM_KEYS)
        if unknown:
            errors.append(f"{name}: unknown keys {', '.join(unknown)}")
        if not str(item.get("dest", "")).startswith("/"):
            errors.append(f"{name}: dest must be an absolute path")
        if sum(key in item for key in SOURCES) != 1:
            errors.append(f"{name}: give exactly one of content, src and link")
        mode = item.get("mode")
        if "link" not in item and not (isinstance(mode, str) and re.fullmatch(r"[0-7]{3,4}", mode)):
            errors.append(f"{name}: mode must be a quoted octal string such as '0644'")
    return errors


def sha1(content: bytes) -> str:
    return hashlib.sha1(content).hexdigest()


def batch_item(item: dict, content: bytes) -> dict:
    """What the host's module gpu_files needs of an item: its path, its text or link, owner and mode."""
    written = {"link": item["link"]} if "link" in item else {"content": content.decode("utf-8"), "mode": item["mode"]}
    return {"dest": item["dest"], "owner": item.get("owner", "root"), "group": item.get("group", "root")} | written


def covered(looked: Any, wanted: dict[str, list[str]]) -> bool:
    """Whether a gpu_host_probe result holds the stat of every path and the SHA-1 of every file the action
    would look at itself (the look the filter gpu_files_look names)."""
    if not isinstance(looked, dict) or looked.get("failed") or looked.get("skipped"):
        return False
    stats, sums = looked.get("stat") or {}, looked.get("checksum") or {}
    return all(path in stats for path in wanted["stat"]) and all(path in sums for path in wanted["checksum"])


def unlooked(wanted: dict[str, list[str]]) -> dict:
    """The state of files not looked at: none there, so that every one is written."""
    return {"stat": {path: {"exists": False} for path in wanted["stat"]}, "checksum": {}}


def stale(item: dict, wanted_sha1: str, found: dict, checksum: str | None) -> bool:
    """Whether the host's file (gpu_host_probe's stat entry and checksum) differs from the item; a
    link item's path must be a symbolic link with that target, as written."""
    if "link" in item:
        return not (found.get("islnk") and found.get("lnk_target") == item["link"])
    return not (
        found.get("isreg")
        and checksum == wanted_sha1
        and found.get("mode") == item["mode"].zfill(4)
        and found.get("owner") == item.get("owner", "root")
        and found.get("group") == item.get("group", "root")
    )


class ActionModule(ActionRunner):
    # No temporary folder of its own: the state module runs pipelined, and copy makes one when it writes.
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_diff = True

    def _wanted(self, item: dict) -> bytes:
        if "link" in item:
            return to_bytes(item["link"], errors="surrogate_or_strict")
        if "content" in item:
            return to_bytes(item["content"], errors="surrogate_or_strict")
        try:
            with open(self._find_needle("files", item["src"]), "rb") as handle:
                return handle.read()
        except OSError as error:
            raise AnsibleActionFail(f"gpu_files: {item['dest']}: cannot read src {item['src']}: {error}") from error

    def _execute_module(self, *args, **kwargs):
        """Each module run on the host, counted (the result's ``module_runs``)."""
        self._module_runs = getattr(self, "_module_runs", 0) + 1
        return super()._execute_module(*args, **kwargs)

    def _copy(self, item: dict, task_vars: dict) -> dict:
        """Ansible's copy action for one item, with this task's check and diff modes (counted once, as bench
        counts a copy, though it may look and then write)."""
        self._module_runs = getattr(self, "_module_runs", 0) + 1
        return self._run_action("ansible.legacy.copy", {"owner": "root", "group": "root", **item}, task_vars)

    def _link(self, item: dict, task_vars: dict) -> dict:
        """Ansible's file module makes or re-points the symbolic link (replacing a file there)."""
        args = {"src": item["link"], "dest": item["dest"], "state": "link", "force": True}
        return self._execute_module(module_name="ansible.legacy.file", module_args=args, task_vars=task_vars)

    def _make_folder(self, folder: str, task_vars: dict) -> dict:
        """A missing destination folder, made root's 0755 (Ansible's copy makes none for one file)."""
        args = {"path": folder, "state": "directory", "owner": "root", "group": "root", "mode": "0755"}
        return self._execute_module(module_name="ansible.legacy.file", module_args=args, task_vars=task_vars)

    def _batchable(self, item: dict, content: bytes) -> bool:
        """Whether the host's module can write the item among others in one round trip: not with a
        validate command, in check or diff mode (Ansible's copy does those), or for bytes that are not
        text."""
        if "validate" in item or self._task.check_mode or self._task.diff:
            return False
        try:
            content.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    def _flush(self, batch: list, written: dict, task_vars: dict) -> dict | None:
        """The module gpu_files writes the batch on the host in order, in one round trip; the failed
        result (the module names the file), if any."""
        if not batch:
            return None
        done = self._execute_module(module_name=MODULE, module_args={"files": batch}, task_vars=task_vars)
        if done.get("failed"):
            written.update(done.get("files") or {})
            # Without the module's invocation: its arguments hold the files' contents (pip.conf may hold
            # an index URL's credentials).
            failed = {key: value for key, value in done.items() if key != "invocation"}
            return failed | {"msg": f"gpu_files: {done.get('msg', 'the write failed')}"}
        written.update({path: {"changed": True} for path in done.get("files", {})})
        return None

    def _write_one(self, item: dict, state: dict, written: dict, task_vars: dict) -> dict | None:
        """Ansible's copy or file for one item (its folder made first); the failed result, if any."""
        dest = item["dest"]
        folder = posixpath.dirname(dest)
        if not state["stat"][folder]["exists"]:
            written[folder] = self._make_folder(folder, task_vars)
            state["stat"][folder]["exists"] = True
        if not written.get(folder, {}).get("failed"):
            written[dest] = self._link(item, task_vars) if "link" in item else self._copy(item, task_vars)
        failed = next((done for done in (written.get(folder), written.get(dest)) if done and done.get("failed")), None)
        # The module's own result (a validate command's stdout and stderr) with the file named.
        return failed and failed | {"msg": f"gpu_files: {dest}: {failed.get('msg', 'the write failed')}"}

    def _write(self, files: list, contents: dict, state: dict, task_vars: dict) -> tuple[dict, dict | None]:
        """Each stale file's write result (and each folder made) by path, and the failed result that
        stopped the writes, if any. Consecutive stale files go to the host in one batch; an item only
        Ansible's copy can write sends the batch first, so the files are written in the given order."""
        written: dict[str, dict] = {}
        batch: list[dict] = []
        for item in files:
            dest = item["dest"]
            if not stale(item, sha1(contents[dest]), state["stat"][dest], state["checksum"].get(dest)):
                continue
            if self._batchable(item, contents[dest]):
                batch.append(batch_item(item, contents[dest]))
                continue
            failed = self._flush(batch, written, task_vars) or self._write_one(item, state, written, task_vars)
            batch = []
            if failed:
                return written, failed
        return written, self._flush(batch, written, task_vars)

    def _look(self, wanted: dict[str, list[str]], task_vars: dict) -> dict:
        """The host's files and folders, looked at in one round trip (gpu_host_probe)."""
        return self._execute_module(module_name=STATE_MODULE, module_args=wanted, task_vars=task_vars)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        files = self._task.args.get("files")
        options = {"files", "looked", "new_every_run"}
        errors = item_errors(files) + [f"unknown option {key}" for key in set(self._task.args) - options]
        if errors:
            raise AnsibleActionFail("gpu_files: " + "; ".join(errors))
        contents = {item["dest"]: self._wanted(item) for item in files}
        wanted = gpu_files_look(files)
        looked = self._task.args.get("looked")
        # The role's own look of this play (copied: the writes below mark a folder they make); none at all for
        # files that differ on every run, where the host's module can write them all in one batch.
        if self._task.args.get("new_every_run") and all(self._batchable(i, contents[i["dest"]]) for i in files):
            state = unlooked(wanted)
        else:
            state = copy.deepcopy(looked) if covered(looked, wanted) else self._look(wanted, task_vars)
        if state.get("failed"):
            return state
        written, failed = self._write(files, contents, state, task_vars)
        if failed:
            self._remove_tmp_path(self._connection._shell.tmpdir)
            return failed
        result["changed"] = any(done.get("changed") for done in written.values())
        result["module_runs"] = getattr(self, "_module_runs", 0)
        result["files"] = {dest: {"changed": bool(written.get(dest, {}).get("changed"))} for dest in contents}
        diffs = [done["diff"] for done in written.values() if done.get("diff")]
        if diffs:
            result["diff"] = [d for diff in diffs for d in (diff if isinstance(diff, list) else [diff])]
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
