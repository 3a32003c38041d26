"""gpu_artifact: the action's decisions and host calls against a recorded host (what each case costs in
round trips), then the whole action in real ansible-playbook runs on this machine."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.gpu_fleet.tf_hosts.plugins.action import gpu_artifact
from helpers import localhost_playbook

PIN = hashlib.sha256(b"runfile\n").hexdigest()
ARTIFACT = {"file": "cuda_11.8.0_520.61.05_linux.run", "sha256": PIN, "size_bytes": None, "url": ""}
FOLDER = "/var/cache/gpu-artifacts/cuda_toolkit/11.8.0"
PATH = f"{FOLDER}/{ARTIFACT['file']}"
PINNED = {"sha256": PIN, "mode": "0600", "owner": "root", "group": "root"}
SETTINGS = {"controller_dir": "/srv/nvidia", "host_cache_dir": "/var/cache/gpu-artifacts"}


def test_the_cache_path_is_spelled_as_preflight_lists_the_cache():
    assert gpu_artifact.cache_path("/var/cache/gpu-artifacts/", "cuda_toolkit/11.8.0", ARTIFACT["file"]) == PATH


@pytest.mark.parametrize(
    ("keep_cache", "cache_files", "pushed", "removed"),
    [
        (False, None, "", True),  # what the cache holds is unknown (preflight did not look): remove
        (False, [PATH], "", True),  # preflight found it (an earlier run stopped after its push)
        (False, [], PATH, True),  # pushed in this run
        (False, [], "", False),  # a converged host's empty cache: no round trip
        (False, [f"{FOLDER}/other.run"], f"{FOLDER}/other.run", False),  # another toolkit's runfile
        (True, None, PATH, False),  # kept whatever else is known
        (True, [PATH], "", False),
    ],
)
def test_the_removal_rule(keep_cache, cache_files, pushed, removed):
    assert gpu_artifact.removal_needed(PATH, keep_cache, cache_files, pushed) is removed


def test_the_host_copy_needs_a_push_unless_it_is_the_pinned_file():
    found = {"isreg": True, "mode": "0600", "owner": "root", "group": "root"}
    assert gpu_artifact.file_need(found, PIN, PIN) == ""
    assert gpu_artifact.file_need(found, PIN.upper(), PIN) == ""
    assert gpu_artifact.file_need(found | {"mode": "0644"}, PIN, PIN) == "attributes"
    assert gpu_artifact.file_need(found | {"owner": "nobody"}, PIN, PIN) == "attributes"
    assert gpu_artifact.file_need(found, "0" * 64, PIN) == "push"
    assert gpu_artifact.file_need({"exists": False, "isreg": False}, None, PIN) == "push"
    assert gpu_artifact.file_need(found | {"isreg": False, "islnk": True}, PIN, PIN) == "push"


def test_bad_arguments_are_named_each():
    assert gpu_artifact.argument_errors({"artifact": ARTIFACT, "subdir": "cuda_toolkit/11.8.0"}) == []
    errors = gpu_artifact.argument_errors(
        {"artifact": ARTIFACT, "subdir": "../etc", "state": "gone", "src": "x", "cache_files": "a"}
    )
    assert errors == [
        "unknown option src",
        "state must be present or absent, not 'gone'",
        "subdir must be a relative folder such as cuda_toolkit/11.8.0",
        "cache_files must be a list of paths",
    ]
    assert gpu_artifact.argument_errors({"artifact": ARTIFACT | {"sha256": None}, "subdir": "a/1"}) == [
        "cuda_11.8.0_520.61.05_linux.run: artifact.sha256 must be the pinned sha256 (64 hex digits)"
    ]
    # Removing needs only the name.
    assert gpu_artifact.argument_errors({"artifact": {"file": "a.run"}, "subdir": "a/1", "state": "absent"}) == []
    assert gpu_artifact.argument_errors({"artifact": {"file": "../a.run"}, "subdir": "/abs"}) == [
        "artifact must be a manifest record with the file's name (file) and its sha256",
        "subdir must be a relative folder such as cuda_toolkit/11.8.0",
    ]


def test_the_damage_message_names_the_file_both_checksums_the_cause_and_the_fix():
    text = gpu_artifact.damaged(PATH, "ab" * 32, PIN, removed=True)
    assert text == (
        f"{ARTIFACT['file']} on the host has sha256 {'ab' * 32}, expected {PIN}: the copy was damaged in transit "
        "or on disk. Check the host's disk and rerun; the corrupt copy was removed."
    )
    assert f"remove {PATH} and rerun; this run could not." in gpu_artifact.damaged(PATH, None, PIN, removed=False)


class Host(gpu_artifact.ActionModule):
    """The action's steps against a host recorded as files and folders; each module call or copy is one
    entry of ``calls`` (a round trip, the copy's own two and the transfer counted as one)."""

    def __init__(self, files=None, folders=None, check_mode=False, arrives=PIN, **args):
        self._task = SimpleNamespace(args={"artifact": ARTIFACT, "subdir": "cuda_toolkit/11.8.0"} | args)
        self._task.check_mode = check_mode
        self.files = {path: dict(entry) for path, entry in (files or {}).items()}
        self.folders = dict(folders or {})
        self.arrives = arrives  # the sha256 of what a push leaves on the host
        self.calls: list[tuple] = []

    def _stat(self, path):
        if path in self.folders:
            return {"exists": True, "isdir": True, "isreg": False, "mode": self.folders[path]} | {
                "owner": "root",
                "group": "root",
            }
        entry = self.files.get(path)
        return {"exists": bool(entry), "isdir": False, "isreg": bool(entry)} | (entry or {})

    def _module(self, name, args, task_vars):
        if name == gpu_artifact.STATE_MODULE:
            self.calls.append(("look", *args["stat"], *args["checksum"]))
            assert args["checksum_algorithm"] == "sha256"
            return {
                "stat": {path: self._stat(path) for path in args["stat"]},
                "checksum": {path: (self.files.get(path) or {}).get("sha256") for path in args["checksum"]},
            }
        assert name == "ansible.legacy.file"
        self.calls.append((args["state"], args["path"]))
        if self._task.check_mode:
            return {"changed": True}
        if args["state"] == "directory":
            self.folders[args["path"]] = args["mode"]
        elif args["state"] == "file":
            self.files[args["path"]].update(mode=args["mode"], owner="root", group="root")
        elif self.files.pop(args["path"], None) is None:
            return {"changed": False}
        return {"changed": True}

    def _run_action(self, name, args, task_vars):
        assert name == "ansible.legacy.copy" and (args["owner"], args["group"], args["mode"]) == (
            "root",
            "root",
            "0600",
        )
        self.calls.append(("copy", args["src"], args["dest"]))
        if not self._task.check_mode:
            self.files[args["dest"]] = {"sha256": self.arrives, "mode": "0600", "owner": "root", "group": "root"}
        return {"changed": True}


@pytest.fixture(autouse=True)
def pinned_controller_copy(monkeypatch):
    """The recorded host's tests: the controller's copy is the pinned file (its own tests are below)."""
    monkeypatch.setattr(
        gpu_artifact, "checksums", lambda paths, *_, **__: [{"path": p, "exists": True, "checksum": PIN} for p in paths]
    )


def test_the_controller_copy_is_named_when_missing_or_not_the_pinned_file(tmp_path, monkeypatch):
    monkeypatch.undo()
    src = tmp_path / "x.run"
    missing = gpu_artifact.controller_copy_problem(str(src), PIN)
    assert missing.startswith(f"{src} is not on the controller, so it cannot be pushed to the host.")
    assert "gpu_artifacts_controller_dir" in missing and "--tags gpu_artifacts" in missing
    src.write_bytes(b"runfile\n")
    assert gpu_artifact.controller_copy_problem(str(src), PIN) == ""
    assert (tmp_path / gpu_artifact.SHA256_CACHE).is_file(), "the next host's push reads the cache"
    wrong = gpu_artifact.controller_copy_problem(str(src), "0" * 64)
    assert wrong.startswith(f"{src} on the controller has sha256 {PIN}, but its pin is {'0' * 64}")
    assert "Nothing was pushed" in wrong and "host" not in wrong.split(":")[0]


def test_a_push_of_a_bad_controller_copy_stops_before_the_host_is_touched(monkeypatch):
    monkeypatch.setattr(
        gpu_artifact, "checksums", lambda paths, *_, **__: [{"path": paths[0], "exists": False, "checksum": None}]
    )
    host = Host(folders={FOLDER: "0700"}, **SETTINGS)
    done = host._present(PATH, {})
    assert done["failed"] and "is not on the controller" in done["msg"]
    assert host.calls == [("look", FOLDER, PATH, PATH)]


def test_a_converged_cache_costs_one_round_trip_and_changes_nothing():
    host = Host(files={PATH: PINNED}, folders={FOLDER: "0700"})
    assert host._present(PATH, SETTINGS) == {"changed": False}
    assert host.calls == [("look", FOLDER, PATH, PATH)]


def test_a_missing_file_is_pushed_into_a_new_folder_and_hashed_there():
    host = Host(**SETTINGS)
    done = host._present(PATH, {})
    assert done == {"changed": True}
    assert host.calls == [
        ("look", FOLDER, PATH, PATH),
        ("directory", FOLDER),
        ("copy", f"/srv/nvidia/{ARTIFACT['file']}", PATH),
        ("look", PATH),
    ]
    assert host.files[PATH] == PINNED and host.folders[FOLDER] == "0700"


def test_another_file_in_the_cache_is_replaced_and_a_loose_mode_only_fixed():
    host = Host(files={PATH: PINNED | {"sha256": "0" * 64}}, folders={FOLDER: "0700"}, **SETTINGS)
    assert host._present(PATH, {})["changed"]
    assert [call[0] for call in host.calls] == ["look", "copy", "look"]
    loose = Host(files={PATH: PINNED | {"mode": "0644"}}, folders={FOLDER: "0755"})
    assert loose._present(PATH, {})["changed"]
    assert loose.calls == [("look", FOLDER, PATH, PATH), ("directory", FOLDER), ("file", PATH)]


def test_a_copy_damaged_after_the_push_is_removed_and_the_task_fails_saying_why():
    host = Host(folders={FOLDER: "0700"}, arrives="ab" * 32, **SETTINGS)
    done = host._present(PATH, {})
    assert done["failed"] and done["changed"]
    assert done["msg"] == gpu_artifact.damaged(PATH, "ab" * 32, PIN, removed=True)
    assert host.calls[-2:] == [("look", PATH), ("absent", PATH)]
    assert PATH not in host.files


def test_check_mode_says_what_would_change_and_hashes_nothing_after_the_push():
    host = Host(check_mode=True, **SETTINGS)
    assert host._present(PATH, {}) == {"changed": True}
    assert [call[0] for call in host.calls] == ["look", "directory", "copy"]
    assert host.files == {} and host.folders == {}
    converged = Host(files={PATH: PINNED}, folders={FOLDER: "0700"}, check_mode=True)
    assert converged._present(PATH, {}) == {"changed": False}


@pytest.mark.parametrize(
    ("args", "calls"),
    [
        ({"keep_cache": False, "cache_files": []}, []),
        ({"keep_cache": False, "cache_files": [], "pushed": PATH}, [("absent", PATH)]),
        ({"keep_cache": False, "cache_files": [PATH]}, [("absent", PATH)]),
        ({"keep_cache": False}, [("absent", PATH)]),
        ({"keep_cache": True, "pushed": PATH}, []),
        ({"keep_cache": "yes", "cache_files": [PATH]}, []),
    ],
    ids=["empty-cache", "pushed", "found", "unknown", "kept", "kept-as-text"],
)
def test_absent_removes_only_what_can_be_there(args, calls):
    host = Host(files={PATH: PINNED}, state="absent", **args)
    done = host._absent(PATH, {})
    assert host.calls == calls
    assert done["changed"] is bool(calls)
    assert (PATH in host.files) is not bool(calls)


def test_left_out_settings_are_gpu_artifacts_inputs_then_their_documented_defaults():
    host = Host()
    # As Ansible's templar: strings templated, other values as they are.
    host._templar = SimpleNamespace(
        template=lambda value: value.replace("{{ base }}", "/srv") if isinstance(value, str) else value
    )
    assert host._setting("host_cache_dir", {}) == "/var/cache/gpu-artifacts"
    assert host._setting("keep_cache", {}) is False
    assert host._setting("host_cache_dir", {"gpu_artifacts_host_cache_dir": "{{ base }}/cache"}) == "/srv/cache"
    assert Host(keep_cache=True)._setting("keep_cache", {"gpu_artifacts_keep_cache": False}) is True
    with pytest.raises(AnsibleActionFail, match="gpu_artifacts_controller_dir is not set for this host"):
        host._setting("controller_dir", {})


# --- the action in real runs: ansible-playbook on this machine ---------------------------------------

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars:
    base: {base}
    gpu_artifacts_controller_dir: "{{{{ base }}}}/controller"
    gpu_artifacts_host_cache_dir: "{{{{ base }}}}/cache"
    artifact: {{file: x.run, sha256: "{sha256}"}}
  tasks:
    - name: Would push
      gpu_fleet.tf_hosts.gpu_artifact: {{artifact: "{{{{ artifact }}}}", subdir: cuda_toolkit/1}}
      check_mode: true
      register: would
    - name: Push
      gpu_fleet.tf_hosts.gpu_artifact: {{artifact: "{{{{ artifact }}}}", subdir: cuda_toolkit/1}}
      register: pushed
    - name: Push again
      gpu_fleet.tf_hosts.gpu_artifact: {{artifact: "{{{{ artifact }}}}", subdir: cuda_toolkit/1}}
      register: again
    - name: Keep what preflight did not find
      gpu_fleet.tf_hosts.gpu_artifact: {{artifact: "{{{{ artifact }}}}", subdir: cuda_toolkit/1, state: absent,
                                        cache_files: []}}
    - name: Keep a cache that is kept
      gpu_fleet.tf_hosts.gpu_artifact: {{artifact: "{{{{ artifact }}}}", subdir: cuda_toolkit/1, state: absent,
                                        pushed: "{{{{ pushed.path }}}}", keep_cache: true}}
    - name: Show the results
      ansible.builtin.debug: {{msg: "WOULD={{{{ would.changed }}}} PUSHED={{{{ pushed.changed }}}} AGAIN={{{{ again.changed }}}} PATH={{{{ pushed.path }}}}"}}
    - name: Remove what was pushed
      gpu_fleet.tf_hosts.gpu_artifact: {{artifact: "{{{{ artifact }}}}", subdir: cuda_toolkit/1, state: absent,
                                        cache_files: [], pushed: "{{{{ pushed.path }}}}"}}
      register: removed
    - name: Show the removal
      ansible.builtin.debug: {{msg: "REMOVED={{{{ removed.changed }}}}"}}
"""


def _run(tmp_path: Path, sha256: str) -> tuple:
    (tmp_path / "controller").mkdir()
    (tmp_path / "controller" / "x.run").write_bytes(b"runfile\n")
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(base=tmp_path, sha256=sha256))
    return localhost_playbook(playbook), tmp_path / "cache" / "cuda_toolkit" / "1"


@pytest.mark.skipif(os.geteuid() != 0, reason="the cache is root's: run as root, as the test hosts are")
def test_a_real_run_pushes_once_keeps_what_it_should_and_removes_the_rest(tmp_path):
    run, folder = _run(tmp_path, PIN)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"WOULD=True PUSHED=True AGAIN=False PATH={folder}/x.run" in run.stdout
    assert "REMOVED=True" in run.stdout
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and list(folder.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the cache is root's: run as root, as the test hosts are")
def test_a_real_run_whose_controller_copy_is_not_the_pinned_file_pushes_nothing_and_fails(tmp_path):
    run, folder = _run(tmp_path, "0" * 64)
    assert run.returncode != 0
    # The controller's copy is checked before the push: here it is the one not matching its pin.
    assert f"x.run on the controller has sha256 {PIN}, but its pin is {'0' * 64}" in run.stdout
    assert "Nothing was pushed." in run.stdout
    # The first task (check mode) already stops there: not even the cache folder is made.
    assert "Would push" in run.stdout and not folder.exists()
