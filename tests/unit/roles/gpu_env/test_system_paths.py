"""gpu_env's files as tasks/configure.yml writes them (its defaults, vars and templates in a real ansible-playbook
run against this machine, the files in a temporary folder) for the served default stack: a runfile toolkit puts
itself on the system library path, PATH and sudo's secure_path; a stack whose CUDA comes from NVIDIA's wheels puts
nothing there, and /usr/local/cuda goes (the value tasks/serve.yml's link tasks read). A switch from the runfile
default to the wheels default and back rewrites the same files, the library path's change notifying ldconfig."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]
ROLE = ROOT / "roles" / "gpu_env"
RUNFILE = {"name": "tf2.12", "cuda_toolkit": {"source": "runfile", "root": "/usr/local/cuda-11.8"}}
SITE = "/opt/tensorflow/2.18/lib/python3.11/site-packages"
WHEELS = {
    "name": "tf2.18",
    "cuda_toolkit": {"source": "wheels", "root": None, "library_dirs": [f"{SITE}/nvidia/cuda_runtime/lib"]},
}

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  # vars_files win over play vars: the settings of the test come last.
  vars_files:
    - {defaults}
    - {vars_file}
    - {settings}
  tasks:
    - name: Write the environment files
      ansible.builtin.import_tasks: {tasks}/configure.yml
    - name: Render the sudoers drop-in (this machine has no /etc/sudoers.d, where configure writes it)
      ansible.builtin.template:
        src: sudoers.j2
        dest: {out}/sudoers
        mode: "0644"
    - name: Write down what the role's tasks read
      ansible.builtin.copy:
        content: >-
          {{{{ {{'home': __gpu_env_system.home, 'cache_lacks': __gpu_env_cache_lacks | bool,
                 'plan': gpu_env_plan.files.text}} | to_json }}}}
        dest: {out}/read.json
        mode: "0644"
  handlers:
    - name: Note that the loader cache would be refreshed
      ansible.builtin.file:
        path: {out}/ldconfig-notified
        state: touch
        mode: "0644"
      listen: gpu_env ldconfig
"""


def converge(tmp_path: Path, stack: dict) -> dict:
    """Runs configure.yml for ``stack`` as the served default; returns the files and what the tasks read."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "ldconfig-notified").unlink(missing_ok=True)
    settings = {
        "gpu_preflight_resolved_default": stack,
        "gpu_env_ld_conf_path": str(out / "gpu-env.conf"),
        "gpu_env_profile_path": str(out / "gpu-env.sh"),
        "gpu_env_sudoers_path": str(out / "gpu-env-sudoers"),
        "__gpu_env_secure_path_base": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    (tmp_path / "settings.yml").write_text(json.dumps(settings))
    playbook = tmp_path / "configure.yml"
    # The role's templates where the play looks for them (vars/main.yml renders them through the template lookup).
    if not (tmp_path / "templates").exists():
        (tmp_path / "templates").symlink_to(ROLE / "templates")
    playbook.write_text(
        textwrap.dedent(
            PLAYBOOK.format(
                defaults=ROLE / "defaults" / "main.yml",
                vars_file=ROLE / "vars" / "main.yml",
                settings=tmp_path / "settings.yml",
                tasks=ROLE / "tasks",
                out=out,
            )
        )
    )
    done = localhost_playbook(playbook)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return {
        "conf": (out / "gpu-env.conf").read_text(),
        "folders": [line for line in (out / "gpu-env.conf").read_text().splitlines() if not line.startswith("#")],
        "login": login_shell(out / "gpu-env.sh"),
        "sudoers": [line for line in (out / "sudoers").read_text().splitlines() if not line.startswith("#")],
        "read": json.loads((out / "read.json").read_text()),
        "ldconfig": (out / "ldconfig-notified").exists(),
    }


def login_shell(profile: Path) -> tuple[str, str]:
    """CUDA_HOME and PATH of a POSIX shell that read the profile script, from a bare environment."""
    done = subprocess.run(
        ["sh", "-c", f'. {profile}; printf "%s|%s" "${{CUDA_HOME:-unset}}" "$PATH"'],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    cuda_home, path = done.stdout.split("|")
    return cuda_home, path


@pytest.fixture(scope="module")
def switched(tmp_path_factory) -> list[dict]:
    """The files after a runfile default, a switch to the wheels default, a second run of it, and a switch back."""
    folder = tmp_path_factory.mktemp("gpu_env")
    return [converge(folder, stack) for stack in (RUNFILE, WHEELS, WHEELS, RUNFILE)]


def test_a_runfile_default_puts_its_toolkit_on_every_system_path(switched):
    runfile = switched[0]
    assert runfile["folders"] == ["/usr/local/cuda-11.8/lib64"]
    assert runfile["login"] == ("/usr/local/cuda-11.8", "/usr/local/cuda-11.8/bin:/usr/bin:/bin")
    assert runfile["sudoers"] == ['Defaults secure_path="/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/cuda-11.8/bin"']
    assert runfile["read"]["home"] == "/usr/local/cuda-11.8"  # /usr/local/cuda's target (tasks/serve.yml)
    assert runfile["read"]["cache_lacks"] is True  # this machine's loader cache has no CUDA 11.8


def test_a_wheels_default_leaves_no_cuda_on_any_system_path(switched):
    wheels, again = switched[1:3]
    assert wheels["folders"] == [] and SITE not in wheels["conf"]
    assert wheels["login"] == ("unset", "/usr/bin:/bin")
    assert wheels["sudoers"] == []
    assert not wheels["read"]["home"] and wheels["read"]["cache_lacks"] is False  # /usr/local/cuda goes (serve.yml)
    assert wheels["ldconfig"], "the toolkit's lib64 left the library path: the cache must be refreshed"
    # A second run changes nothing and says why the host has no system CUDA.
    assert not again["ldconfig"] and again["conf"] == wheels["conf"]
    assert (
        again["read"]["plan"] == "no system CUDA: the default stack tf2.18 takes CUDA from NVIDIA's wheels in its venv"
    )


def test_a_switch_back_to_the_runfile_default_writes_what_it_wrote_first(switched):
    first, back = switched[0], switched[-1]
    assert back == first and back["ldconfig"]
