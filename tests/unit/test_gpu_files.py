"""gpu_files (action plugin): its argument checks and the decision which files need Ansible's copy."""

from __future__ import annotations

import hashlib

from ansible_collections.gpu_fleet.tf_hosts.plugins.action import gpu_files

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

    def __init__(self, fail: str = ""):  # no Ansible task or connection: only _write runs
        self.calls: list[tuple[str, str]] = []
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


def test_a_missing_folder_is_made_once_before_its_first_file_and_current_files_are_left_alone():
    files = [ITEM | {"dest": f"/opt/gpu-verify/{name}"} for name in ("fit.py", "gpu_count.py")] + [ITEM]
    wanted = {item["dest"]: SHA1 for item in files}
    state = {
        "stat": {
            "/opt/gpu-verify/fit.py": {"exists": False},
            "/opt/gpu-verify/gpu_count.py": {"exists": False},
            ITEM["dest"]: CURRENT,
            "/opt/gpu-verify": {"exists": False},
        },
        "checksum": {"/opt/gpu-verify/fit.py": None, "/opt/gpu-verify/gpu_count.py": None, ITEM["dest"]: SHA1},
    }
    action = Recorder()
    written, failed = action._write(files, wanted, state, {})
    assert failed is None
    assert action.calls == [
        ("folder", "/opt/gpu-verify"),
        ("copy", "/opt/gpu-verify/fit.py"),
        ("copy", "/opt/gpu-verify/gpu_count.py"),
    ]
    assert sorted(written) == ["/opt/gpu-verify", "/opt/gpu-verify/fit.py", "/opt/gpu-verify/gpu_count.py"]


def test_a_folder_that_cannot_be_made_stops_the_writes_naming_the_file():
    files = [ITEM | {"dest": "/opt/gpu-verify/fit.py"}]
    state = {
        "stat": {"/opt/gpu-verify/fit.py": {"exists": False}, "/opt/gpu-verify": {"exists": False}},
        "checksum": {"/opt/gpu-verify/fit.py": None},
    }
    action = Recorder(fail="/opt/gpu-verify")
    _written, failed = action._write(files, {"/opt/gpu-verify/fit.py": SHA1}, state, {})
    assert failed["failed"] and failed["msg"] == "gpu_files: /opt/gpu-verify/fit.py: Permission denied"
    assert action.calls == [("folder", "/opt/gpu-verify")]


def test_a_link_into_a_missing_registry_makes_the_folder_and_then_the_link_not_a_copy():
    files = [ITEM, LINK | {"dest": "/etc/tf-stacks/tf2.12.env", "link": "/opt/tf/tf-stack.env"}]
    state = {
        "stat": {ITEM["dest"]: CURRENT, files[1]["dest"]: {"exists": False}, "/etc/tf-stacks": {"exists": False}},
        "checksum": {ITEM["dest"]: SHA1},
    }
    action = Recorder()
    written, failed = action._write(files, {ITEM["dest"]: SHA1, files[1]["dest"]: ""}, state, {})
    assert failed is None
    assert action.calls == [("folder", "/etc/tf-stacks"), ("link", "/etc/tf-stacks/tf2.12.env")]
    assert sorted(written) == ["/etc/tf-stacks", "/etc/tf-stacks/tf2.12.env"]
