"""gpu_host_probe: what it says of real files, links and folders in a temporary tree, and the module's
argument handling through AnsibleModule."""

from __future__ import annotations

import hashlib
import json
import os
import pwd

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpu_fleet.tf_hosts.plugins.modules import gpu_host_probe


def state(**params):
    """gpu_host_probe's result for these parameters, the others empty (through AnsibleModule, whose
    run_command runs the commands)."""
    with patch_module_args({"max_bytes": 1024} | params):
        module = AnsibleModule(argument_spec=gpu_host_probe.ARGUMENT_SPEC, supports_check_mode=True)
    return gpu_host_probe.host_state(module)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / "libcudnn.so.8.6.0").write_bytes(b"\x7fELF")
    (tmp_path / "lib64" / "libcudnn.so.8").symlink_to("libcudnn.so.8.6.0")
    (tmp_path / "lib64" / "libcudnn_ops.so.8.5.0").write_bytes(b"old")
    (tmp_path / "lib64" / "dangling.so").symlink_to("gone.so")
    (tmp_path / "done").write_text("520.61.05 runfile\n")
    (tmp_path / "big").write_bytes(b"x" * 33)
    os.chmod(tmp_path / "done", 0o640)
    return tmp_path


def test_stat_tells_files_links_dangling_links_and_missing_paths(tree):
    lib = str(tree / "lib64")
    found = state(stat=[f"{lib}/libcudnn.so.8", f"{lib}/dangling.so", f"{lib}/nothing", str(tree / "done")])["stat"]
    link = found[f"{lib}/libcudnn.so.8"]
    assert link["exists"] and link["islnk"] and not link["isreg"] and link["target_exists"]
    assert link["lnk_target"] == "libcudnn.so.8.6.0"
    assert link["lnk_source"] == os.path.realpath(f"{lib}/libcudnn.so.8.6.0")
    dangling = found[f"{lib}/dangling.so"]
    assert dangling["exists"] and dangling["islnk"] and not dangling["target_exists"]
    assert found[f"{lib}/nothing"] == {
        "exists": False,
        "isdir": False,
        "isreg": False,
        "islnk": False,
        "target_exists": False,
    }
    done = found[str(tree / "done")]
    assert done["isreg"] and done["mode"] == "0640" and done["owner"] == pwd.getpwuid(os.getuid()).pw_name


def test_checksum_is_the_sha1_of_files_and_none_for_the_rest(tree):
    paths = [str(tree / "done"), str(tree / "lib64" / "libcudnn.so.8"), str(tree / "lib64"), str(tree / "nothing")]
    found = state(checksum=paths)["checksum"]
    assert found == {
        paths[0]: hashlib.sha1(b"520.61.05 runfile\n").hexdigest(),
        paths[1]: hashlib.sha1(b"\x7fELF").hexdigest(),
        paths[2]: None,
        paths[3]: None,
    }


def test_checksum_algorithm_sha256_gives_the_digest_a_manifest_pins(tree):
    paths = [str(tree / "done"), str(tree / "nothing")]
    found = state(checksum=paths, checksum_algorithm="sha256")["checksum"]
    assert found == {paths[0]: hashlib.sha256(b"520.61.05 runfile\n").hexdigest(), paths[1]: None}


def test_read_gives_text_or_none_for_missing_folders_and_too_long_files(tree):
    paths = [str(tree / "done"), str(tree / "missing"), str(tree / "lib64"), str(tree / "big")]
    found = state(read=paths, max_bytes=32)["read"]
    assert found == {paths[0]: "520.61.05 runfile\n", paths[1]: None, paths[2]: None, paths[3]: None}


def test_glob_lists_matches_sorted_with_dangling_links(tree):
    pattern = str(tree / "lib64" / "*.so*")
    found = state(glob=[pattern])
    names = [os.path.basename(p) for p in found["glob"][pattern]]
    assert names == ["dangling.so", "libcudnn.so.8", "libcudnn.so.8.6.0", "libcudnn_ops.so.8.5.0"]


def run_module(capsys, **args):
    with patch_module_args(args), pytest.raises(SystemExit) as done:
        gpu_host_probe.main()
    return done.value.code, json.loads(capsys.readouterr().out)


def test_the_module_reports_unchanged_and_refuses_relative_paths(tree, capsys):
    code, result = run_module(capsys, read=[str(tree / "done")], _ansible_check_mode=True)
    assert code == 0 and result["changed"] is False and result["read"][str(tree / "done")].startswith("520")
    code, result = run_module(capsys, stat=["relative/path"])
    assert code == 1 and "absolute paths only" in result["msg"] and "relative/path" in result["msg"]


def test_run_gives_each_commands_exit_code_and_output_and_127_for_a_missing_program(tmp_path):
    script = tmp_path / "versions"
    script.write_text("#!/bin/sh\necho 3.11.2\necho warn >&2\nexit 3\n")
    script.chmod(0o755)
    result = state(run={"python": [str(script)], "gone": [str(tmp_path / "no-such-program"), "-V"]})
    assert result["run"]["python"] == {"rc": 3, "stdout": "3.11.2\n", "stderr": "warn\n"}
    assert result["run"]["gone"]["rc"] == 127 and "no-such-program" in result["run"]["gone"]["stderr"]


def test_the_module_refuses_a_command_that_is_not_an_argv_list(capsys):
    code, result = run_module(capsys, run={"findmnt": "findmnt --json", "empty": []})
    assert code == 1 and "non-empty argv list; not empty, findmnt" in result["msg"]


def test_the_old_name_still_runs_the_module_with_a_deprecation_warning(tmp_path):
    from helpers import localhost_playbook

    playbook = tmp_path / "old.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Old name\n      gpu_fleet.tf_hosts.gpu_host_state: {stat: [/]}\n      register: looked\n"
        "    - name: Show\n      ansible.builtin.debug: {msg: \"ISDIR={{ looked.stat['/'].isdir }}\"}\n"
    )
    run = localhost_playbook(playbook)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ISDIR=True" in run.stdout
    assert "gpu_host_state is renamed gpu_host_probe" in run.stdout + run.stderr
