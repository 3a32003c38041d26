"""lookup collection_path: collection files, and a role's documented defaults read once per file version."""

from __future__ import annotations

import os

import pytest
from ansible.errors import AnsibleLookupError
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup import collection_path

SPEC = """\
argument_specs:
  main:
    options:
      demo_role_paths: {{type: list, default: {paths}}}
      demo_role_required: {{type: str, required: true}}
"""


def _collection(tmp_path, paths: str):
    spec = tmp_path / "roles" / "demo_role" / "meta" / "argument_specs.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(SPEC.format(paths=paths))
    return spec


def test_the_default_comes_from_the_owning_roles_argument_spec(tmp_path):
    _collection(tmp_path, "[/a, /b]")
    assert collection_path.documented_default("demo_role_paths", str(tmp_path)) == ["/a", "/b"]
    with pytest.raises(AnsibleLookupError, match="role demo_role documents no default for demo_role_required"):
        collection_path.documented_default("demo_role_required", str(tmp_path))
    with pytest.raises(AnsibleLookupError, match="does not start with the name of a role"):
        collection_path.documented_default("other_paths", str(tmp_path))


def test_each_caller_gets_its_own_copy_of_a_default(tmp_path):
    _collection(tmp_path, "[/a]")
    first = collection_path.documented_default("demo_role_paths", str(tmp_path))
    first.append("/changed")
    assert collection_path.documented_default("demo_role_paths", str(tmp_path)) == ["/a"]


def test_a_changed_spec_is_read_again_an_unchanged_one_is_not(tmp_path, monkeypatch):
    spec = _collection(tmp_path, "[/a]")
    opened: list[str] = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    for _ in range(3):
        assert collection_path.documented_default("demo_role_paths", str(tmp_path)) == ["/a"]
    assert opened.count(str(spec)) == 1
    spec.write_text(SPEC.format(paths="[/new]"))
    stat = spec.stat()
    os.utime(spec, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert collection_path.documented_default("demo_role_paths", str(tmp_path)) == ["/new"]
    assert opened.count(str(spec)) == 2


def test_a_collection_file_must_exist_inside_the_collection(tmp_path):
    spec = _collection(tmp_path, "[/a]")
    assert collection_path.collection_file("roles/demo_role/meta/argument_specs.yml", str(tmp_path)) == str(spec)
    with pytest.raises(AnsibleLookupError, match=r"is not a file of the gpu_fleet\.tf_hosts collection"):
        collection_path.collection_file("../outside", str(tmp_path))


def test_the_option_names_of_a_role_are_those_of_every_entry_point(tmp_path):
    spec = _collection(tmp_path, "[]")
    spec.write_text(spec.read_text() + "  check:\n    options:\n      demo_role_only_here: {type: bool}\n")
    (tmp_path / "roles" / "other_role" / "meta").mkdir(parents=True)
    assert collection_path.role_names(str(tmp_path)) == ["demo_role", "other_role"]
    assert collection_path.option_names("demo_role", str(tmp_path)) == {
        "demo_role_paths",
        "demo_role_required",
        "demo_role_only_here",
    }
