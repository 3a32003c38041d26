"""gpu_files: the action's argument checks and its decision which files to write and how; the host's
module writing them in a temporary tree."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import stat
from types import SimpleNamespace

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpu_fleet.tf_hosts.plugins.action import gpu_files
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_files as gpu_files_filter
from ansible_collections.gpu_fleet.tf_hosts.plugins.modules import gpu_files as gpu_files_module

SHA1 = hashlib.sha1(b"PATH=/usr/local/cuda/bin:$PATH\n").hexdigest()
ITEM = {"dest": "/etc/profile.d/gpu-env.sh", "content": "PATH=/usr/local/cuda/bin:$PATH\n", "mode": "0644"}
CURRENT = {"isreg": True, "mode": "0644", "owner": "root", "group": "root"}


def test_a_current_file_needs_no_copy():
    assert not gpu_files.stale(ITEM, SHA1, CURRENT, SHA1)


def test_other_content_mode_owner_or_a_missing_file_need_the_copy():
    assert gpu_files.stale(ITEM, SHA1, CURRENT, "0" * 40)
    assert gpu_files.stale(ITEM, SHA1, CURRENT | {"mode": "0666"}, SHA1)
    assert gpu_files.stale(ITEM, SHA1, CURRENT | {"owner": "nobody"}, SHA1)
    assert gpu_files.stale(ITEM, SHA1, CURRENT | {"group": "staff"}, SHA1)
    assert gpu_files.stale(ITEM, SHA1, {"exists": False, "isreg": False}, None)
    # A link where the file should be is replaced by the file, as ansible.builtin.copy does.
    assert gpu_files.stale(ITEM, SHA1, CURRENT | {"isreg": False, "islnk": True}, SHA1)


def test_owner_group_and_a_short_mode_are_compared_as_given():
    item = ITEM | {"owner": "jupyter", "group": "jupyter", "mode": "644"}
    assert not gpu_files.stale(item, SHA1, CURRENT | {"owner": "jupyter", "group": "jupyter"}, SHA1)


def test_bad_arguments_are_named_each():
    assert gpu_files.item_errors([ITEM, ITEM | {"src": "x"}]) == [
        "/etc/profile.d/gpu-env.sh: give exactly one of content, src and link"
    ]
    errors = gpu_files.item_errors(
        [{"dest": "relative", "content": "", "mode": 644, "recurse": True}, "not a dict", {"mode": "0644"}]
    )
    assert errors == [
        "relative: unknown keys recurse",
        "relative: dest must be an absolute path",
        "relative: mode must be a quoted octal string such as '0644'",
        "files item 2 is not a dict",
        "item 3: dest must be an absolute path",
        "item 3: give exactly one of content, src and link",
    ]
    assert gpu_files.item_errors("a string") == [
        "files must be a list of {dest, content or src or link, mode, owner, group, validate}"
    ]
    assert gpu_files.item_errors([ITEM | {"mode": "u=rw"}]) == [
        "/etc/profile.d/gpu-env.sh: mode must be a quoted octal string such as '0644'"
    ]
    assert gpu_files.item_errors([ITEM]) == []
    # A link needs no mode, and takes no content besides.
    assert gpu_files.item_errors([LINK]) == []
    assert gpu_files.item_errors([LINK | {"content": ""}]) == [
        "/etc/tf-stacks/default: give exactly one of content, src and link"
    ]


LINK = {"dest": "/etc/tf-stacks/default", "link": "tf2.12.env"}


def test_a_link_is_current_only_as_a_link_with_its_target_as_written():
    found = {"exists": True, "islnk": True, "isreg": False, "lnk_target": "tf2.12.env"}
    assert not gpu_files.stale(LINK, "", found, None)
    assert gpu_files.stale(LINK, "", found | {"lnk_target": "tf2.18.env"}, None)
    # The same final file through another spelling is re-pointed: preflight reads the name back.
    assert gpu_files.stale(LINK, "", found | {"lnk_target": "/etc/tf-stacks/tf2.12.env"}, None)
    assert gpu_files.stale(LINK, "", {"exists": True, "islnk": False, "isreg": True}, "0" * 40)
    assert gpu_files.stale(LINK, "", {"exists": False, "islnk": False}, None)


class Recorder(gpu_files.ActionModule):
    """The action's write loop with the host's modules replaced by a record of the calls."""

    def __init__(self, fail: str = "", check_mode: bool = False, diff: bool = False):
        # No Ansible connection: only _write runs; the task says only whether check or diff mode is on.
        self._task = SimpleNamespace(check_mode=check_mode, diff=diff)
        self.calls: list[tuple] = []
        self.fail = fail

    def _make_folder(self, folder, task_vars):
        self.calls.append(("folder", folder))
        return {"changed": True, "failed": folder == self.fail, "msg": "Permission denied"}

    def _copy(self, item, task_vars):
        self.calls.append(("copy", item["dest"]))
        return {"changed": True}

    def _link(self, item, task_vars):
        self.calls.append(("link", item["dest"]))
        return {"changed": True}

    def _execute_module(self, module_name, module_args, task_vars):
        assert module_name == "gpu_fleet.tf_hosts.gpu_files"
        self.calls.append(("batch", module_args["files"]))
        if self.fail:
            return {"failed": True, "msg": f"{self.fail}: Permission denied", "files": {}, "invocation": {}}
        return {"changed": True, "files": {item["dest"]: {"changed": True} for item in module_args["files"]}}


def contents(files):
    return {item["dest"]: (item.get("content") or item.get("link", "")).encode() for item in files}


def missing(*paths):
    return {path: {"exists": False} for path in paths}


SCRIPTS = [ITEM | {"dest": f"/opt/gpu-verify/{name}"} for name in ("fit.py", "gpu_count.py")]


def test_the_stale_files_go_to_the_host_in_one_batch_in_order_and_current_files_are_left_alone():
    files = [SCRIPTS[0], ITEM, SCRIPTS[1]]
    state = {
        "stat": missing(*(item["dest"] for item in SCRIPTS), "/opt/gpu-verify") | {ITEM["dest"]: CURRENT},
        "checksum": {ITEM["dest"]: SHA1},
    }
    action = Recorder()
    written, failed = action._write(files, contents(files), state, {})
    assert failed is None
    sent = {"content": ITEM["content"], "mode": "0644", "owner": "root", "group": "root"}
    assert action.calls == [("batch", [sent | {"dest": item["dest"]} for item in SCRIPTS])]
    assert sorted(written) == [item["dest"] for item in SCRIPTS]


def test_a_file_with_a_validate_command_goes_through_copy_after_the_files_before_it():
    sudoers = ITEM | {"dest": "/etc/sudoers.d/gpu-env", "mode": "0440", "validate": "visudo -cf %s"}
    files = [SCRIPTS[0], sudoers, SCRIPTS[1]]
    state = {"stat": missing(*(item["dest"] for item in files)) | missing("/opt/gpu-verify"), "checksum": {}}
    state["stat"]["/etc/sudoers.d"] = {"exists": True}
    action = Recorder()
    _written, failed = action._write(files, contents(files), state, {})
    assert failed is None
    assert [(call[0], call[1] if call[0] != "batch" else [i["dest"] for i in call[1]]) for call in action.calls] == [
        ("batch", ["/opt/gpu-verify/fit.py"]),
        ("copy", "/etc/sudoers.d/gpu-env"),
        ("batch", ["/opt/gpu-verify/gpu_count.py"]),
    ]


def test_check_and_diff_mode_write_each_file_with_copy_as_before():
    for mode in ({"check_mode": True}, {"diff": True}):
        state = {"stat": missing(*(item["dest"] for item in SCRIPTS), "/opt/gpu-verify"), "checksum": {}}
        action = Recorder(**mode)
        _written, failed = action._write(SCRIPTS, contents(SCRIPTS), state, {})
        assert failed is None
        assert action.calls == [
            ("folder", "/opt/gpu-verify"),
            ("copy", "/opt/gpu-verify/fit.py"),
            ("copy", "/opt/gpu-verify/gpu_count.py"),
        ]


def test_bytes_that_are_not_text_go_through_copy():
    item = ITEM | {"dest": "/opt/x/blob.bin"}
    state = {"stat": missing("/opt/x/blob.bin") | {"/opt/x": {"exists": True}}, "checksum": {}}
    action = Recorder()
    action._write([item], {item["dest"]: b"\xff\xfe"}, state, {})
    assert action.calls == [("copy", "/opt/x/blob.bin")]


def test_a_batch_the_host_cannot_write_stops_with_the_file_named():
    action = Recorder(fail="/opt/gpu-verify/fit.py")
    state = {"stat": missing(*(item["dest"] for item in SCRIPTS), "/opt/gpu-verify"), "checksum": {}}
    written, failed = action._write(SCRIPTS, contents(SCRIPTS), state, {})
    assert failed["failed"] and failed["msg"] == "gpu_files: /opt/gpu-verify/fit.py: Permission denied"
    # The module's arguments (the files' contents) are not passed on.
    assert "invocation" not in failed
    assert written == {}


def test_a_folder_that_cannot_be_made_for_copy_stops_the_writes_naming_the_file():
    files = [ITEM | {"dest": "/opt/gpu-verify/fit.py"}]
    state = {"stat": missing("/opt/gpu-verify/fit.py", "/opt/gpu-verify"), "checksum": {}}
    action = Recorder(fail="/opt/gpu-verify", check_mode=True)
    _written, failed = action._write(files, contents(files), state, {})
    assert failed["failed"] and failed["msg"] == "gpu_files: /opt/gpu-verify/fit.py: Permission denied"
    assert action.calls == [("folder", "/opt/gpu-verify")]


def test_a_link_is_sent_with_its_target_and_no_mode():
    files = [ITEM, LINK | {"dest": "/etc/tf-stacks/tf2.12.env", "link": "/opt/tf/tf-stack.env"}]
    state = {
        "stat": {ITEM["dest"]: CURRENT} | missing(files[1]["dest"], "/etc/tf-stacks"),
        "checksum": {ITEM["dest"]: SHA1},
    }
    action = Recorder()
    written, failed = action._write(files, contents(files), state, {})
    assert failed is None
    link = {"dest": "/etc/tf-stacks/tf2.12.env", "link": "/opt/tf/tf-stack.env", "owner": "root", "group": "root"}
    assert action.calls == [("batch", [link])]
    assert sorted(written) == ["/etc/tf-stacks/tf2.12.env"]


# The host side: the module gpu_files writes what the action sends, in a temporary tree (as root here,
# as on a host; owner and group default to root).
def run_module(capsys, files, **params):
    with patch_module_args({"files": files} | params), pytest.raises(SystemExit) as done:
        gpu_files_module.main()
    return done.value.code, json.loads(capsys.readouterr().out)


def test_the_module_writes_new_files_into_new_folders_with_their_mode(tmp_path, capsys):
    dest = tmp_path / "opt" / "gpu-verify" / "fit.py"
    code, result = run_module(capsys, [{"dest": str(dest), "content": "print(1)\n", "mode": "0640"}])
    assert code == 0 and result["changed"] and result["files"] == {str(dest): {"changed": True}}
    assert dest.read_text() == "print(1)\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert (
        stat.S_IMODE(dest.parent.stat().st_mode) == 0o755 and stat.S_IMODE(dest.parent.parent.stat().st_mode) == 0o755
    )
    assert dest.stat().st_uid == pwd.getpwnam("root").pw_uid
    # No temporary file is left beside it.
    assert [path.name for path in dest.parent.iterdir()] == ["fit.py"]


def test_the_module_replaces_a_file_or_a_link_in_place_in_the_given_order(tmp_path, capsys):
    (tmp_path / "env").write_text("old\n")
    os.chmod(tmp_path / "env", 0o600)
    (tmp_path / "default").symlink_to("tf2.18.env")
    (tmp_path / "profile.sh").symlink_to("elsewhere")
    files = [
        {"dest": str(tmp_path / "env"), "content": "CUDA_HOME=/usr/local/cuda-11.8\n", "mode": "0644"},
        {"dest": str(tmp_path / "default"), "link": "tf2.12.env"},
        {"dest": str(tmp_path / "profile.sh"), "content": "export A=1\n", "mode": "0644"},
    ]
    code, _result = run_module(capsys, files)
    assert code == 0
    assert (tmp_path / "env").read_text().startswith("CUDA_HOME") and stat.S_IMODE(
        (tmp_path / "env").stat().st_mode
    ) == 0o644
    assert os.readlink(tmp_path / "default") == "tf2.12.env"
    assert not (tmp_path / "profile.sh").is_symlink() and (tmp_path / "profile.sh").read_text() == "export A=1\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["default", "env", "profile.sh"]


def test_the_module_will_not_put_a_link_over_a_folder_and_names_it(tmp_path, capsys):
    (tmp_path / "cuda").mkdir()
    code, result = run_module(capsys, [{"dest": str(tmp_path / "cuda"), "link": "cuda-11.8"}])
    assert code == 1 and result["msg"].startswith(f"{tmp_path / 'cuda'}: it is a folder")
    assert (tmp_path / "cuda").is_dir() and not (tmp_path / "cuda").is_symlink()


def test_the_module_in_check_mode_writes_nothing(tmp_path, capsys):
    dest = tmp_path / "new" / "file"
    code, result = run_module(capsys, [{"dest": str(dest), "content": "x", "mode": "0644"}], _ansible_check_mode=True)
    assert code == 0 and result["changed"] and not (tmp_path / "new").exists()


def test_an_owner_the_host_lacks_stops_before_the_file_is_written_and_names_it(tmp_path, capsys):
    (tmp_path / "pip.conf").write_text("old\n")
    files = [
        {"dest": str(tmp_path / "env"), "content": "A=1\n", "mode": "0644"},
        {"dest": str(tmp_path / "pip.conf"), "content": "[global]\n", "mode": "0600", "owner": "nosuchuser"},
    ]
    code, result = run_module(capsys, files)
    assert code == 1 and result["msg"] == f"{tmp_path / 'pip.conf'}: no user 'nosuchuser' or group 'root' on the host"
    # The file before it was written and is reported; the failing one is untouched, no temporary is left.
    assert result["changed"] and result["files"] == {str(tmp_path / "env"): {"changed": True}}
    assert (tmp_path / "pip.conf").read_text() == "old\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["env", "pip.conf"]


def test_a_replaced_file_keeps_no_old_attributes_and_a_bad_mode_is_named(tmp_path, capsys):
    (tmp_path / "pip.conf").write_text("old\n")
    os.chmod(tmp_path / "pip.conf", 0o666)
    code, _result = run_module(capsys, [{"dest": str(tmp_path / "pip.conf"), "content": "new\n", "mode": "0600"}])
    assert code == 0 and stat.S_IMODE((tmp_path / "pip.conf").stat().st_mode) == 0o600
    code, result = run_module(capsys, [{"dest": str(tmp_path / "x"), "content": "", "mode": "u=rw"}])
    assert code == 1 and "mode 'u=rw' is not an octal mode" in result["msg"] and not (tmp_path / "x").exists()


def test_the_look_a_role_adds_is_what_the_action_would_look_at():
    link = {"dest": "/etc/tf-stacks/default", "link": "tf2.12.env"}
    folder_item = {"dest": "/opt/gpu-verify", "content": "", "mode": "0755"}
    look = gpu_files_filter.gpu_files_look([SCRIPTS[0], link, folder_item])
    # The dests, then the folders of the dests that are not dests themselves, sorted.
    dests = ["/opt/gpu-verify/fit.py", "/etc/tf-stacks/default", "/opt/gpu-verify"]
    assert look["stat"] == [*dests, "/etc/tf-stacks", "/opt"]
    assert look["checksum"] == ["/opt/gpu-verify/fit.py", "/opt/gpu-verify"]  # not the link


def test_a_role_s_look_stands_for_the_action_s_only_when_it_holds_every_path():
    wanted = gpu_files_filter.gpu_files_look([ITEM])
    looked = {"stat": {ITEM["dest"]: CURRENT, "/etc/profile.d": {"exists": True}}, "checksum": {ITEM["dest"]: SHA1}}
    assert gpu_files.covered(looked, wanted) is True
    assert gpu_files.covered(looked | {"checksum": {}}, wanted) is False  # a file not hashed
    assert gpu_files.covered(looked | {"stat": {ITEM["dest"]: CURRENT}}, wanted) is False  # its folder not looked at
    assert gpu_files.covered(looked | {"failed": True}, wanted) is False
    assert gpu_files.covered({"skipped": True}, wanted) is False  # a look that did not run
    assert gpu_files.covered(None, wanted) is False


def test_files_new_on_every_run_are_all_written_in_one_batch_without_a_look():
    state = gpu_files.unlooked(gpu_files_filter.gpu_files_look(SCRIPTS))
    action = Recorder()
    written, failed = action._write(SCRIPTS, contents(SCRIPTS), state, {})
    assert failed is None and sorted(written) == [item["dest"] for item in SCRIPTS]
    assert [call[0] for call in action.calls] == ["batch"]
