"""The clone's connection plugin podman_pipelined (tests/plugins/connection/), run against a stand-in
podman (tests/fixtures/podman/podman_standin.py) whose container is a folder: ``podman exec -i`` only
when Ansible pipes a module, podman's own errors (exit 125) as an unreachable host, files through the
container's mount point or ``podman cp``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader, init_plugin_loader
from helpers import ROOT

NAME = "podman_pipelined"
PLUGINS = ROOT / "tests/plugins/connection"
STANDIN = ROOT / "tests/fixtures/podman/podman_standin.py"
MISSING = 'Error: no container with name or ID "gpu-gone" found: no such container'


@pytest.fixture(scope="module", autouse=True)
def _loader() -> None:
    init_plugin_loader()
    connection_loader.add_directory(str(PLUGINS))


class Podman:
    """The stand-in's state folder: its configuration, its container's root and the calls it got."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.root = folder / "root"
        (self.root / "tmp").mkdir(parents=True)
        self.configure()

    def configure(self, **config) -> None:
        (self.folder / "config.json").write_text(json.dumps(config))

    def calls(self) -> list[dict]:
        log = self.folder / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def argvs(self) -> list[list[str]]:
        return [call["argv"] for call in self.calls()]


def mountinfo_line(point: str) -> str:
    """A line of /proc/<pid>/mountinfo (proc(5)) whose mount point is ``point``."""
    escaped = point.replace("\\", "\\134").replace(" ", "\\040")
    return f"36 35 0:31 / {escaped} rw,nosuid,nodev - tmpfs tmpfs rw\n"


# The container's mounts: its root, a volume and the file podman mounts over the image's.
MOUNTS = ["/", "/data", "/etc/hostname", "/mnt/with space"]


@pytest.fixture
def podman(tmp_path, monkeypatch) -> Podman:
    monkeypatch.setenv("PODMAN_STANDIN_DIR", str(tmp_path / "podman"))
    plugin = sys.modules[connection_loader.get(NAME, class_only=True).__module__]
    monkeypatch.setattr(plugin, "MOUNTINFO", str(tmp_path / "mountinfo-{pid}"))
    (tmp_path / "mountinfo-4242").write_text("".join(mountinfo_line(point) for point in MOUNTS))
    return Podman(tmp_path / "podman")


def connect(container: str = "gpu-c1", user: str | None = None, **options):
    """The plugin as the task executor makes it: loaded by its short name, options set from vars."""
    context = PlayContext()
    context.remote_addr = container
    context.remote_user = user
    conn = connection_loader.get(NAME, context, None)
    assert conn is not None, f"{NAME} not found in {PLUGINS}"
    var_options = {"ansible_pipelining": True, "ansible_podman_executable": str(STANDIN)}
    var_options.update(options)
    conn.set_options(var_options=var_options)
    return conn


def test_the_clone_finds_the_plugin_by_its_short_name_and_its_documentation_renders():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOME=str(ROOT / ".ansible"))
    doc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-t", "connection", NAME],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
    )
    assert doc.returncode == 0, doc.stderr
    assert "podman_extra_args" in doc.stdout and "containers.podman.podman" in doc.stdout
    assert "WARNING" not in doc.stderr and "DEPRECATION" not in doc.stderr, doc.stderr


def test_the_plugin_needs_nothing_but_ansible_core():
    source = (PLUGINS / f"{NAME}.py").read_text()
    assert "ansible_collections" not in source and "module_utils._text" not in source


def test_the_plugin_pipelines_when_pipelining_is_on(podman):
    conn = connect()
    assert conn.has_pipelining and conn.is_pipelining_enabled()
    assert not connect(ansible_pipelining=False).is_pipelining_enabled()


def test_a_pipelined_module_goes_to_the_standard_input_of_an_interactive_exec(podman):
    assert connect().exec_command("/usr/bin/python3", in_data=b"module source") == (0, b"out", b"")
    assert podman.calls() == [{"argv": ["exec", "-i", "gpu-c1", "/usr/bin/python3"], "stdin": "module source"}]


def test_a_command_without_input_is_a_plain_exec(podman):
    connect().exec_command("/bin/sh -c 'echo ~'")
    assert podman.calls() == [{"argv": ["exec", "gpu-c1", "/bin/sh", "-c", "echo ~"], "stdin": ""}]


def test_remote_user_and_extra_arguments_are_passed(podman):
    conn = connect(user="deploy", ansible_podman_extra_args="--log-level error")
    conn.exec_command("id", in_data=b"")
    assert podman.argvs() == [["--log-level", "error", "exec", "-i", "--user", "deploy", "gpu-c1", "id"]]


def test_podman_is_found_on_path_by_default(podman, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").symlink_to(STANDIN)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    conn = connect()
    conn.set_options(var_options={"ansible_pipelining": True})
    assert conn.exec_command("true")[0] == 0
    assert podman.argvs() == [["exec", "gpu-c1", "true"]]


def test_a_missing_podman_is_named(podman):
    with pytest.raises(AnsibleError, match=r"podman program /nonexistent/podman not found on the controller"):
        connect(ansible_podman_executable="/nonexistent/podman").exec_command("true")


def test_a_missing_container_makes_the_host_unreachable_with_podmans_message(podman):
    with pytest.raises(AnsibleConnectionFailure) as raised:
        connect("gpu-gone").exec_command("/usr/bin/python3", in_data=b"module")
    assert str(raised.value) == f"podman could not run a command in container gpu-gone: {MISSING}"


def test_the_commands_own_exit_status_is_a_result_not_unreachable(podman):
    podman.configure(exec={"rc": 127, "stdout": "", "stderr": "sh: 1: nvidia-smi: not found"})
    assert connect().exec_command("nvidia-smi") == (127, b"", b"sh: 1: nvidia-smi: not found")


def test_put_file_writes_through_the_mount_point(podman, tmp_path):
    source = tmp_path / "module.py"
    source.write_text("payload")
    conn = connect()
    conn.put_file(str(source), "/tmp/module.py")
    conn.put_file(str(source), "/tmp/again.py")
    assert (podman.root / "tmp/module.py").read_text() == "payload"
    assert (podman.root / "tmp/again.py").read_text() == "payload"
    assert podman.argvs() == [["mount", "gpu-c1"], ["inspect", "--format", "{{.State.Pid}}", "gpu-c1"]]


def test_put_file_follows_links_inside_the_container_not_on_the_controller(podman, tmp_path):
    outside = tmp_path / "controller-file"
    outside.write_text("the controller's")
    (podman.root / "etc").mkdir()
    (podman.root / "tmp/link").symlink_to(outside)  # an absolute target: the container's own path
    (podman.root / "home").symlink_to("etc")
    source = tmp_path / "source"
    source.write_text("payload")
    conn = connect()
    (podman.root / str(outside).lstrip("/")).parent.mkdir(parents=True)
    conn.put_file(str(source), "/tmp/link")
    conn.put_file(str(source), "/home/../home/./file")
    conn.put_file(str(source), "/../tmp/up")  # `..` of the root is the root
    assert outside.read_text() == "the controller's"
    assert (podman.root / "tmp/up").read_text() == "payload" and not (podman.folder / "tmp/up").exists()
    assert (podman.root / str(outside).lstrip("/")).read_text() == "payload"
    assert (podman.root / "etc/file").read_text() == "payload"


@pytest.mark.parametrize("mount", ["fail", "empty"])
def test_put_file_uses_podman_cp_without_a_usable_mount_point(podman, tmp_path, mount):
    podman.configure(mount=mount)
    source = tmp_path / "module.py"
    source.write_text("payload")
    connect().put_file(str(source), "/tmp/module.py")
    assert (podman.root / "tmp/module.py").read_text() == "payload"
    assert podman.argvs() == [["mount", "gpu-c1"], ["cp", str(source), "gpu-c1:/tmp/module.py"]]


def test_put_file_uses_podman_cp_when_the_containers_mounts_are_unknown(podman, tmp_path):
    podman.configure(pid="no such process")
    source = tmp_path / "module.py"
    source.write_text("payload")
    connect().put_file(str(source), "/tmp/module.py")
    assert podman.argvs()[-1] == ["cp", str(source), "gpu-c1:/tmp/module.py"]


@pytest.mark.parametrize(
    "path", ["/data/model.bin", "/data/../data/sub/x", "/etc/hostname", "/mnt/with space/x", "/tmp/to-volume/x"]
)
def test_a_path_on_another_mount_of_the_container_goes_through_podman_cp(podman, tmp_path, path):
    """The mount point shows the image's files, not a volume's, a tmpfs's or podman's /etc/hostname."""
    (podman.root / "tmp/to-volume").symlink_to("../data")
    for folder in ("data/sub", "etc", "mnt/with space"):
        (podman.root / folder).mkdir(parents=True)
    source = tmp_path / "source"
    source.write_text("payload")
    conn = connect()
    conn.put_file(str(source), path)
    conn.fetch_file(path, str(tmp_path / "fetched"))
    assert podman.argvs()[2:] == [
        ["cp", str(source), f"gpu-c1:{path}"],
        ["cp", f"gpu-c1:{path}", str(tmp_path / "fetched")],
    ]


def test_put_file_for_a_remote_user_copies_and_chowns(podman, tmp_path):
    source = tmp_path / "module.py"
    source.write_text("payload")
    connect(user="deploy").put_file(str(source), "/tmp/module.py")
    assert (podman.root / "tmp/module.py").read_text() == "payload"
    assert podman.argvs() == [
        ["cp", str(source), "gpu-c1:/tmp/module.py"],
        ["exec", "gpu-c1", "chown", "deploy", "/tmp/module.py"],
    ]


def test_a_copy_that_needs_the_container_paused_is_tried_without_the_pause(podman, tmp_path):
    podman.configure(mount="fail", cp="pause")
    source = tmp_path / "module.py"
    source.write_text("payload")
    connect().put_file(str(source), "/tmp/module.py")
    assert (podman.root / "tmp/module.py").read_text() == "payload"
    assert podman.argvs()[1:] == [
        ["cp", str(source), "gpu-c1:/tmp/module.py"],
        ["cp", "--pause=false", str(source), "gpu-c1:/tmp/module.py"],
    ]


def test_a_failed_copy_names_the_file_and_podmans_message(podman, tmp_path):
    podman.configure(mount="fail", cp="fail")
    source = tmp_path / "module.py"
    source.write_text("payload")
    with pytest.raises(
        AnsibleError, match=r"podman cp could not copy .*module.py to /tmp/x in container gpu-c1: Error: copying failed"
    ):
        connect().put_file(str(source), "/tmp/x")


def test_put_file_of_a_missing_controller_file_is_file_not_found(podman, tmp_path):
    with pytest.raises(AnsibleFileNotFound):
        connect().put_file(str(tmp_path / "absent"), "/tmp/x")
    assert podman.calls() == []


@pytest.mark.parametrize("mount", ["ok", "fail"])
def test_fetch_file_reads_through_the_mount_point_or_podman_cp(podman, tmp_path, mount):
    podman.configure(mount=mount)
    (podman.root / "tmp/report.json").write_text("{}")
    target = tmp_path / "fetched.json"
    connect().fetch_file("/tmp/report.json", str(target))
    assert target.read_text() == "{}"
    copied = ["cp", "gpu-c1:/tmp/report.json", str(target)]
    assert (copied in podman.argvs()) == (mount == "fail")


def test_fetch_file_of_a_missing_file_is_file_not_found(podman, tmp_path):
    with pytest.raises(AnsibleFileNotFound, match="/tmp/absent does not exist in container gpu-c1"):
        connect().fetch_file("/tmp/absent", str(tmp_path / "x"))


def test_reset_asks_for_the_mount_point_again(podman, tmp_path):
    source = tmp_path / "module.py"
    source.write_text("payload")
    conn = connect()
    conn.put_file(str(source), "/tmp/one")
    conn.reset()
    podman.configure(mount="fail")
    conn.put_file(str(source), "/tmp/two")
    assert [argv[0] for argv in podman.argvs()] == ["mount", "inspect", "mount", "cp"]
