"""cuda_toolkit's default symlink as tasks/configure.yml leaves it (its defaults and vars in a real ansible-playbook
run against this machine, the link in a temporary folder): a link to the default stack's toolkit, none where the
default stack's CUDA comes from NVIDIA's wheels, and back again when the default is a runfile stack once more."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
ROLE = ROOT / "roles" / "cuda_toolkit"

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars_files:
    - {defaults}
    - {vars_file}
    - {settings}
  tasks:
    - name: Converge the default symlink for each default stack in turn
      ansible.builtin.include_tasks: {tasks}
      vars:
        gpu_preflight_resolved_default: "{{{{ item.stack }}}}"
        __cuda_toolkit_link_unchanged: false
      loop: "{{{{ defaults }}}}"
      loop_control:
        label: "{{{{ item.name }}}}"

    - name: Look at the link after the last one
      ansible.builtin.stat:
        path: "{{{{ cuda_toolkit_default_symlink }}}}"
      register: last

    - name: Write down what each run did and what is left
      ansible.builtin.copy:
        content: >-
          {{{{ {{'left': last.stat.lnk_source | default(none), 'exists': last.stat.exists,
                 'last_changed': __cuda_toolkit_plan_parts.link_changed | bool}} | to_json }}}}
        dest: {out}/left.json
        mode: "0644"
"""


def converge(tmp_path: Path, stacks: list[dict]) -> dict:
    out = tmp_path / "out"
    out.mkdir()
    settings = {"cuda_toolkit_default_symlink": str(tmp_path / "cuda"), "defaults": stacks}
    (tmp_path / "settings.yml").write_text(json.dumps(settings))
    playbook = tmp_path / "configure.yml"
    playbook.write_text(
        textwrap.dedent(
            PLAYBOOK.format(
                defaults=ROLE / "defaults" / "main.yml",
                vars_file=ROLE / "vars" / "main.yml",
                settings=tmp_path / "settings.yml",
                tasks=ROLE / "tasks" / "configure.yml",
                out=out,
            )
        )
    )
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return {"recap": done.stdout, **json.loads((out / "left.json").read_text())}


def stack(name: str, source: str, root: str | None) -> dict:
    return {"name": name, "stack": {"name": name, "cuda_toolkit": {"source": source, "root": root}}}


def test_a_switch_to_a_wheels_default_removes_our_link_and_a_switch_back_makes_it_again(tmp_path):
    toolkit = tmp_path / "cuda-11.8"
    toolkit.mkdir()
    runfile, wheels = stack("tf2.12", "runfile", str(toolkit)), stack("tf2.18", "wheels", None)
    (tmp_path / "switched").mkdir()
    switched = converge(tmp_path / "switched", [runfile, wheels])
    assert switched["exists"] is False and switched["last_changed"] is True, switched["recap"][-2000:]
    (tmp_path / "back").mkdir()
    back = converge(tmp_path / "back", [runfile, wheels, runfile])
    assert back["left"] == str(toolkit), back["recap"][-2000:]


def test_a_wheels_default_on_a_host_without_the_link_changes_nothing(tmp_path):
    left = converge(tmp_path, [stack("tf2.18", "wheels", None)])
    assert left["exists"] is False and left["last_changed"] is False, left["recap"][-2000:]


def test_a_wheels_default_never_removes_a_folder_in_the_links_place(tmp_path):
    """Only a link is removed: a folder where the link goes (someone's own CUDA) keeps all in it."""
    folder = tmp_path / "cuda"
    folder.mkdir()
    (folder / "version.json").write_text("{}")
    left = converge(tmp_path, [stack("tf2.18", "wheels", None)])
    assert (folder / "version.json").exists() and left["last_changed"] is False, left["recap"][-2000:]
