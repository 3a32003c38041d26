"""Stacks side by side (roles/tf_venv/files/tf_stack.py and plugins/filter/gpu_tf_stack.py): the
environment file of a stack, the binding of each venv's interpreter to its own libraries, and the
host command ``tf-stack``.

The binding test builds two stacks from the stand-ins that share sonames the way NVIDIA's do:
CUDA 11.8 with cuDNN 8.6 built for CUDA 11, and CUDA 12.2 with cuDNN 8.9 built for CUDA 12, both
``libcudnn.so.8`` (and ``libcudnn_ops_infer.so.8``). Each gets a real venv holding the role's
``tf_stack.pth``; a probe loads the libraries by soname, as TensorFlow does."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_tf_stack import gpu_tf_kernel_spec, gpu_tf_stack_env
from helpers import ROOT, load_builder

TF_STACK_FILE = ROOT / "roles" / "tf_venv" / "files" / "tf_stack.py"
PTH_LINE = "import _tf_stack; _tf_stack.bind()\n"  # what roles/tf_venv/tasks/bind.yml writes


def load_tf_stack():
    spec = importlib.util.spec_from_file_location("tf_stack_under_test", TF_STACK_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tf_stack = load_tf_stack()


def resolved(name: str, venv: Path, cuda: str, root: Path, cudnn: str) -> dict:
    """A stack as gpu_stacks_resolve returns it (the fields the filters read)."""
    major = int(cuda.split(".")[0])
    return {
        "name": name,
        "venv": str(venv),
        "tensorflow": {"version": "2.12.1" if major == 11 else "2.15.1", "package": "tensorflow"},
        "python": {"version": f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"},
        "cuda_toolkit": {
            "version": cuda,
            "series": ".".join(cuda.split(".")[:2]),
            "root": str(root),
            "cudart_soname": "libcudart.so.11.0" if major == 11 else f"libcudart.so.{major}",
        },
        "cudnn": {"version": cudnn, "series": ".".join(cudnn.split(".")[:2]), "major": int(cudnn.split(".")[0])},
    }


# --- the environment file and the kernel spec -----------------------------------------------------


def test_stack_env_binds_the_toolkit_lib64_and_names_every_version():
    stack = resolved("tf2.12", Path("/opt/tensorflow/2.12"), "11.8.0", Path("/usr/local/cuda-11.8"), "8.6.0.163")
    env = gpu_tf_stack_env(stack, "tensorflow-cpu")
    assert env["LD_LIBRARY_PATH"] == "/usr/local/cuda-11.8/lib64"
    assert env["CUDA_HOME"] == "/usr/local/cuda-11.8"
    assert env["XLA_FLAGS"] == "--xla_gpu_cuda_data_dir=/usr/local/cuda-11.8"
    assert env["PATH"].startswith("/opt/tensorflow/2.12/bin:/usr/local/cuda-11.8/bin:")
    assert (env["TF_STACK_CUDART"], env["TF_STACK_CUDNN_SONAME"]) == ("libcudart.so.11.0", "libcudnn.so.8")
    assert (env["TF_STACK_TENSORFLOW"], env["TF_STACK_CUDA"], env["TF_STACK_CUDNN"]) == (
        "2.12.1",
        "11.8.0",
        "8.6.0.163",
    )
    assert env["TF_STACK_PACKAGE"] == "tensorflow"  # the stack's own package wins over the default


def test_stack_env_refuses_values_that_systemd_and_sh_would_read_differently():
    stack = resolved("tf 2.12", Path("/opt/tf stacks/2.12"), "11.8.0", Path("/usr/local/cuda-11.8"), "8.6.0.163")
    with pytest.raises(AnsibleFilterError, match=r"TF_STACK, TF_STACK_VENV.*would hold a space"):
        gpu_tf_stack_env(stack)


def test_stack_env_of_an_unresolved_stack_names_what_is_missing():
    with pytest.raises(AnsibleFilterError, match=r"not a resolved stack.*cuda_toolkit"):
        gpu_tf_stack_env({"name": "tf2.12", "venv": "/opt/x"})


def test_kernel_spec_runs_the_venv_python_through_tf_stack_run():
    stack = resolved("tf2.18", Path("/opt/tensorflow/2.18"), "12.5.1", Path("/usr/local/cuda-12.5"), "9.3.0.75")
    spec = gpu_tf_kernel_spec(stack, "/usr/local/bin/tf-stack")
    assert spec["argv"][:7] == [
        "/usr/local/bin/tf-stack",
        "run",
        "tf2.18",
        "--",
        "/opt/tensorflow/2.18/bin/python",
        "-m",
        "ipykernel_launcher",
    ]
    assert "{connection_file}" in spec["argv"]
    assert spec["display_name"] == "TensorFlow 2.15.1 (tf2.18: CUDA 12.5, cuDNN 9.3)"
    assert "env" not in spec  # Jupyter would replace the user's LD_LIBRARY_PATH with it


# --- bind(): when the interpreter runs itself again ------------------------------------------------


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    (tmp_path / "tf-stack.env").write_text(
        "# comment\nTF_STACK=tf2.12\nLD_LIBRARY_PATH=/usr/local/cuda-11.8/lib64\n"
        "XLA_FLAGS=--xla_gpu_cuda_data_dir=/usr/local/cuda-11.8\nPATH=/opt/x/bin:/usr/bin\n"
    )
    return tmp_path


def bind_calls(prefix: Path, environ: dict) -> list:
    calls: list = []
    tf_stack.bind(str(prefix), environ, lambda path, argv: calls.append((path, argv)))
    return calls


def test_bind_runs_again_with_the_stack_first_when_the_loader_path_lacks_it(env_file):
    environ = {"LD_LIBRARY_PATH": "/usr/local/cuda-12.2/lib64", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    calls = bind_calls(env_file, environ)
    assert len(calls) == 1 and calls[0][0] == sys.executable
    assert environ["LD_LIBRARY_PATH"] == "/usr/local/cuda-11.8/lib64:/usr/local/cuda-12.2/lib64"
    assert environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_cuda_data_dir=/usr/local/cuda-11.8"
    assert environ["TF_STACK"] == "tf2.12" and "PATH" not in environ  # a process keeps its own PATH


def test_bind_does_not_run_again_once_bound(env_file):
    environ = {"LD_LIBRARY_PATH": "/usr/local/cuda-11.8/lib64:/other", "XLA_FLAGS": "--xla_gpu_cuda_data_dir=/mine"}
    assert bind_calls(env_file, environ) == []
    assert environ["XLA_FLAGS"] == "--xla_gpu_cuda_data_dir=/mine"  # the caller's choice stays


def test_bind_runs_again_only_once_when_the_loader_drops_the_path(env_file, capsys):
    """Secure-execution mode (file capabilities, setuid) removes LD_LIBRARY_PATH at every exec."""
    environ = {"TF_STACK_REEXEC": "/usr/local/cuda-11.8/lib64"}
    assert bind_calls(env_file, environ) == []
    assert "secure-execution mode" in capsys.readouterr().err


def test_bind_replaces_another_stacks_xla_folder_but_keeps_the_callers(env_file):
    other = {"CUDA_HOME": "/usr/local/cuda-12.3", "XLA_FLAGS": "--xla_gpu_cuda_data_dir=/usr/local/cuda-12.3 --x=1"}
    bind_calls(env_file, other)
    assert other["XLA_FLAGS"] == "--xla_gpu_cuda_data_dir=/usr/local/cuda-11.8 --x=1"
    assert other["CUDA_HOME"] == "/usr/local/cuda-12.3"  # the file of this fixture names none


def test_a_broken_environment_file_is_one_line_on_stderr_not_a_traceback(tmp_path, capsys):
    (tmp_path / "tf-stack.env").write_bytes(b"TF_STACK=\xff\n")
    environ: dict = {}
    assert bind_calls(tmp_path, environ) == [] and environ == {}
    assert capsys.readouterr().err.startswith("tf_stack: not bound to its stack (UnicodeDecodeError")


@pytest.mark.parametrize(
    ("environ", "folder"),
    [({"TF_STACK_BIND": "0"}, "stack"), ({}, "no-stack-file")],
    ids=["turned-off", "no-environment-file"],
)
def test_bind_leaves_the_process_alone(env_file, environ, folder):
    prefix = env_file if folder == "stack" else env_file / "elsewhere"
    before = dict(environ)
    assert bind_calls(prefix, environ) == [] and environ == before


# --- two stacks sharing sonames: each venv loads its own ------------------------------------------

# The runtime is named by the file the process mapped (libcudart.so.<release>): its version call
# starts the driver first and, without a GPU, answers cudaErrorNoDevice or cudaErrorInsufficientDriver
# and no version, as NVIDIA's runtime does (tests/unit/verify/test_real_libraries.py).
PROBE = (
    "import ctypes, json, os\n"
    "rt = ctypes.CDLL('{cudart}')\n"
    "dnn = ctypes.CDLL('libcudnn.so.8'); dnn.cudnnGetVersion.restype = ctypes.c_size_t\n"
    "ctypes.CDLL('libcudnn_ops_infer.so.8')\n"
    "maps = sorted({{l.split()[-1] for l in open('/proc/self/maps') if 'libcud' in l}})\n"
    "cudart = [os.path.basename(m) for m in maps if os.path.basename(m).startswith('libcudart.so.')]\n"
    "print(json.dumps({{'cudart': cudart, 'cudnn': dnn.cudnnGetVersion(), 'files': maps}}))\n"
)
STACKS = {  # name: (CUDA, its nvcc version, cuDNN, cudart soname, CUDART_VERSION, cudnnGetVersion)
    "tf2.12": ("11.8.0", "11.8.89", "8.6.0.163", "libcudart.so.11.0", 11080, 8600),
    "tf2.15": ("12.2.2", "12.2.140", "8.9.4.25", "libcudart.so.12", 12020, 8904),
}


def build_toolkit(builder, root: Path, cuda: str, nvcc: str, cudnn: str, soname: str, runtime: int) -> None:
    """root/lib64 as the cuda_toolkit and cudnn roles leave it: libcudart and cuDNN (with one of its
    sub-libraries), real files with their soname links."""
    lib = root / "lib64"
    builder.compile_lib("libcudart.c", lib / f"libcudart.so.{nvcc}", soname, {"STANDIN_CUDART_VERSION": str(runtime)})
    (lib / soname).symlink_to(f"libcudart.so.{nvcc}")
    major, minor, patch = (int(part) for part in cudnn.split(".")[:3])
    defines = {"STANDIN_CUDNN_VERSION": str(major * 1000 + minor * 100 + patch), "STANDIN_CUDART_VERSION": str(runtime)}
    for base, extra in (("libcudnn", {}), ("libcudnn_ops_infer", {"STANDIN_CUDNN_COMPONENT": "1"})):
        real = f"{base}.so.{major}.{minor}.{patch}"
        builder.compile_lib("libcudnn.c", lib / real, f"{base}.so.{major}", defines | extra)
        (lib / f"{base}.so.{major}").symlink_to(real)


@pytest.fixture(scope="module")
def two_stacks(tmp_path_factory) -> dict:
    """Two toolkits, two venvs bound as tf_venv binds them, and a registry listing both."""
    base = tmp_path_factory.mktemp("stacks")
    standins = load_builder()
    builder = standins.Builder(base / "build", force=True, driver_cuda_override=None)
    registry = base / "etc-tf-stacks"
    registry.mkdir()
    made = {}
    for name, (cuda, nvcc, cudnn, soname, runtime, _) in STACKS.items():
        root, venv = base / f"cuda-{cuda[:4]}", base / "venvs" / name
        build_toolkit(builder, root, cuda, nvcc, cudnn, soname, runtime)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        stack = resolved(name, venv, cuda, root, cudnn)
        site = Path(
            subprocess.run(
                [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        (site / "_tf_stack.py").write_bytes(TF_STACK_FILE.read_bytes())
        (site / "tf_stack.pth").write_text(PTH_LINE)
        env = gpu_tf_stack_env(stack)
        (venv / "tf-stack.env").write_text("".join(f"{key}={value}\n" for key, value in env.items()))
        (registry / f"{name}.env").symlink_to(venv / "tf-stack.env")
        made[name] = {"venv": venv, "root": root, "env": env}
    (registry / "default").symlink_to("tf2.12.env")
    return {"stacks": made, "registry": registry}


def probe(python: Path | str, cudart: str, env: dict, *wrapper: str) -> dict:
    done = subprocess.run(
        [*wrapper, str(python), "-c", PROBE.format(cudart=cudart)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_own_stack(found: dict, name: str, two_stacks: dict) -> None:
    _, nvcc, _, _, _, cudnn = STACKS[name]
    root = two_stacks["stacks"][name]["root"]
    assert (found["cudart"], found["cudnn"]) == ([f"libcudart.so.{nvcc}"], cudnn), found
    assert found["files"] and all(path.startswith(f"{root}/lib64/") for path in found["files"]), found["files"]
    assert any("libcudnn_ops_infer" in path for path in found["files"]), "cuDNN's sub-library came from elsewhere"


CONTEXTS = {
    # A process that inherited the other stack's library path: the worst case for the loader.
    "direct-call-under-the-other-stack": lambda other: {"LD_LIBRARY_PATH": f"{other}/lib64", "PATH": "/usr/bin:/bin"},
    # cron and `sudo` (env_reset) start from an almost empty environment.
    "empty-environment-like-cron": lambda other: {},
}


@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("name", sorted(STACKS))
def test_each_venv_loads_its_own_stack(two_stacks, name, context):
    other = next(made["root"] for key, made in two_stacks["stacks"].items() if key != name)
    python = two_stacks["stacks"][name]["venv"] / "bin" / "python"
    assert_own_stack(probe(python, STACKS[name][3], CONTEXTS[context](other)), name, two_stacks)


def _kernel_wrapper(two_stacks, name: str) -> tuple[list[str], str]:
    """The kernel spec's command up to the interpreter (tf-stack run STACK --), and the interpreter."""
    made = two_stacks["stacks"][name]
    spec = gpu_tf_kernel_spec(resolved(name, made["venv"], "12.2.2", made["root"], "8.9.4.25"), str(TF_STACK_FILE))
    python = spec["argv"].index("-m") - 1
    return [sys.executable, *spec["argv"][:python]], spec["argv"][python]


@pytest.mark.parametrize("bind", ["1", "0"], ids=["venv-bound", "binding-off"])
def test_a_jupyter_kernel_starts_with_its_stack_and_keeps_the_users_library_path(two_stacks, bind):
    """Started as Jupyter starts it (the spec's argv, the server's environment), with or without the
    venv's own binding: the stack's libraries load, and the user's LD_LIBRARY_PATH stays after them."""
    wrapper, python = _kernel_wrapper(two_stacks, "tf2.15")
    other = two_stacks["stacks"]["tf2.12"]["root"]
    user = {
        "LD_LIBRARY_PATH": f"{other}/lib64:/opt/site/lib",
        "PATH": "/usr/bin:/bin",
        "TF_STACK_REGISTRY": str(two_stacks["registry"]),
        "TF_STACK_BIND": bind,
    }
    assert_own_stack(probe(python, "libcudart.so.12", user, *wrapper), "tf2.15", two_stacks)
    seen = subprocess.run(
        [*wrapper, python, "-c", "import os; print(os.environ['LD_LIBRARY_PATH'])"],
        env=user,
        capture_output=True,
        text=True,
    )
    assert seen.returncode == 0, seen.stderr
    root = two_stacks["stacks"]["tf2.15"]["root"]
    assert seen.stdout.strip().split(":") == [f"{root}/lib64", f"{other}/lib64", "/opt/site/lib"]


def test_turning_the_binding_off_shows_it_is_what_chooses(two_stacks):
    """Without the binding the inherited library path decides: tf2.12's venv loads the libcudnn.so.8
    that CUDA 12's cuDNN 8.9 provides, the classic mix this binding exists to prevent."""
    other = two_stacks["stacks"]["tf2.15"]["root"]
    python = two_stacks["stacks"]["tf2.12"]["venv"] / "bin" / "python"
    code = "import ctypes; d = ctypes.CDLL('libcudnn.so.8'); d.cudnnGetVersion.restype = ctypes.c_size_t; print(d.cudnnGetVersion())"
    versions = [
        subprocess.run(
            [python, "-c", code], env={"LD_LIBRARY_PATH": f"{other}/lib64", **bind}, capture_output=True, text=True
        ).stdout.strip()
        for bind in ({"TF_STACK_BIND": "0"}, {})
    ]
    assert versions == ["8904", "8600"]


# --- the command ----------------------------------------------------------------------------------


def tf_stack_cli(two_stacks, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {"PATH": "/usr/bin:/bin", "TF_STACK_REGISTRY": str(two_stacks["registry"]), **(env or {})}
    return subprocess.run([sys.executable, str(TF_STACK_FILE), *args], env=environ, capture_output=True, text=True)


def test_list_shows_each_stack_its_versions_the_default_and_health(two_stacks):
    done = tf_stack_cli(two_stacks, "list")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["STACK", "TENSORFLOW", "PYTHON", "CUDA", "CUDNN", "VENV", "HEALTH"]
    python = resolved("x", Path("/"), "12.2.2", Path("/"), "8.9.4.25")["python"]["version"]
    venv = str(two_stacks["stacks"]["tf2.15"]["venv"])
    assert lines[1].split()[:2] == ["*", "tf2.12"]
    assert lines[2].split() == ["tf2.15", "2.15.1", python, "12.2.2", "8.9.4.25", venv, "ok"]
    assert all(line.endswith(" ok") for line in lines[1:])
    listed = json.loads(tf_stack_cli(two_stacks, "list", "--json").stdout)
    assert listed["default"] == "tf2.12"
    assert [(row["TF_STACK"], row["TF_STACK_CUDNN"], row["TF_STACK_HEALTH"]) for row in listed["stacks"]] == [
        ("tf2.12", "8.6.0.163", "ok"),
        ("tf2.15", "8.9.4.25", "ok"),
    ]


def test_list_names_what_is_broken_and_exits_1(two_stacks, tmp_path):
    broken = tmp_path / "registry"
    broken.mkdir()
    made = two_stacks["stacks"]["tf2.12"]
    text = (made["venv"] / "tf-stack.env").read_text().replace(str(made["root"]), str(tmp_path / "gone"))
    (broken / "tf2.12.env").write_text(text)
    done = tf_stack_cli(two_stacks, "list", "--json", env={"TF_STACK_REGISTRY": str(broken)})
    assert done.returncode == 1
    health = json.loads(done.stdout)["stacks"][0]["TF_STACK_HEALTH"]
    assert f"libcudart.so.11.0 missing in {tmp_path}/gone/lib64" in health and "libcudnn.so.8 missing" in health


def test_an_unreadable_stack_is_unhealthy_and_not_probed(two_stacks, tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "gone.env").symlink_to(tmp_path / "nowhere.env")
    env = {"TF_STACK_REGISTRY": str(registry)}
    listed = json.loads(tf_stack_cli(two_stacks, "list", "--json", env=env).stdout)
    assert listed["stacks"][0]["TF_STACK_HEALTH"].startswith("environment file unreadable")
    probed = tf_stack_cli(two_stacks, "probe", "gone", env=env)
    assert probed.returncode == 1 and "environment file unreadable" in probed.stderr


def test_run_puts_the_stack_first_for_any_program(two_stacks):
    done = tf_stack_cli(
        two_stacks, "run", "tf2.15", "--", "sh", "-c", 'echo "$LD_LIBRARY_PATH|$CUDA_HOME|$(command -v python)"'
    )
    made = two_stacks["stacks"]["tf2.15"]
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{made['root']}/lib64|{made['root']}|{made['venv']}/bin/python"


def test_run_python_in_a_stack_loads_that_stack(two_stacks):
    done = tf_stack_cli(two_stacks, "run", "tf2.15", "--", "python", "-c", PROBE.format(cudart="libcudart.so.12"))
    assert done.returncode == 0, done.stderr
    assert_own_stack(json.loads(done.stdout), "tf2.15", two_stacks)


def test_run_without_the_separator_passes_the_commands_own_help_option_on(two_stacks):
    done = tf_stack_cli(two_stacks, "run", "tf2.15", "sh", "-c", 'echo "$CUDA_HOME $1"', "sh", "-h")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{two_stacks['stacks']['tf2.15']['root']} -h"
    # Before the command, -h is tf-stack's own.
    assert "SYNOPSIS" in tf_stack_cli(two_stacks, "run", "-h", "tf2.15", "true").stdout


def test_env_prints_export_lines_a_shell_can_eval(two_stacks):
    done = tf_stack_cli(two_stacks, "env", "tf2.12")
    shell = subprocess.run(["sh", "-c", f'{done.stdout}\necho "$TF_STACK $CUDA_HOME"'], capture_output=True, text=True)
    assert shell.stdout.strip() == f"tf2.12 {two_stacks['stacks']['tf2.12']['root']}"


def test_probe_prints_versions_and_the_files_loaded(two_stacks):
    done = tf_stack_cli(two_stacks, "probe", "tf2.12")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # cudaRuntimeGetVersion is there, but without a GPU the runtime gives no version (see PROBE).
    assert "cudaRuntimeGetVersion" in found and (found["cudnnGetVersion"], found["errors"]) == (8600, [])
    assert all(path.startswith(str(two_stacks["stacks"]["tf2.12"]["root"])) for path in found["files"])
    assert any(path.endswith("/libcudart.so.11.8.89") for path in found["files"]), found["files"]


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["run", "tf9.9", "--", "true"], 2, "no stack 'tf9.9'; this host has: tf2.12, tf2.15"),
        (["run", "tf2.12", "--"], 2, "no COMMAND"),
        (["run", "tf2.12", "--", "no-such-program-here"], 127, "no-such-program-here: No such file"),
    ],
)
def test_bad_use_says_why_with_its_exit_status(two_stacks, args, status, message):
    done = tf_stack_cli(two_stacks, *args)
    assert done.returncode == status and message in done.stderr, (done.returncode, done.stderr)


def test_help_reads_like_a_manual_page(two_stacks):
    done = tf_stack_cli(two_stacks, "--help")
    for section in ("NAME", "SYNOPSIS", "COMMANDS", "FILES", "EXIT STATUS", "EXAMPLES"):
        assert f"\n{section}\n" in f"\n{done.stdout}", section
    assert done.returncode == 0


def test_importing_the_module_imports_only_os_and_sys():
    """It runs at every start of every venv's interpreter: nothing heavy at import."""
    code = (
        f"import os, sys; before = set(sys.modules); sys.path.insert(0, {str(TF_STACK_FILE.parent)!r}); "
        "import tf_stack; print(sorted(set(sys.modules) - before - {'tf_stack'}))"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.replace("'", '"')) == []


def test_read_env_takes_the_files_format(tmp_path):
    path = tmp_path / "x.env"
    path.write_text("# c\n\nA=1\n B = two=2 \nnot a pair\n")
    assert tf_stack.read_env(path) == {"A": "1", "B": "two=2"}


# --- a stack whose CUDA comes from NVIDIA's wheels (tensorflow[and-cuda]) ---------------------------

# The nvidia-*-cu12 wheels' folders under site-packages, in the order of the resolved record's library_dirs.
WHEEL_FOLDERS = (
    "cuda_runtime", "cublas", "cudnn", "cufft", "curand", "cusolver", "cusparse", "nccl", "nvjitlink", "cuda_cupti",
    "cuda_nvrtc",
)  # fmt: skip


def wheels_resolved(name: str, venv: Path, site: Path) -> dict:
    """A stack whose CUDA comes from NVIDIA's wheels, as gpu_stacks_resolve returns it (the fields the filters read)."""
    return {
        "name": name,
        "venv": str(venv),
        "tensorflow": {"version": "2.18.1", "series": "2.18", "package": "tensorflow[and-cuda]"},
        "python": {"version": "3.11.2"},
        "cuda_toolkit": {
            "source": "wheels",
            "version": "12.5",
            "series": "12.5",
            "root": None,
            "nvcc_version": None,
            "cudart_soname": "libcudart.so.12",
            "min_driver": "525.60.13",
            "runfile": None,
            "site_packages": str(site),
            "library_dirs": [f"{site}/nvidia/{folder}/lib" for folder in WHEEL_FOLDERS],
        },
        "cudnn": {"source": "wheels", "version": "9.3", "short": "9.3", "series": "9.3", "major": 9, "archive": None},
    }


def test_a_wheels_stack_env_binds_the_venvs_nvidia_folders_and_names_no_system_cuda():
    site = "/opt/tensorflow/2.18/lib/python3.11/site-packages"
    env = gpu_tf_stack_env(wheels_resolved("tf2.18", Path("/opt/tensorflow/2.18"), Path(site)))
    assert "CUDA_HOME" not in env
    assert env["LD_LIBRARY_PATH"].split(":") == [f"{site}/nvidia/{folder}/lib" for folder in WHEEL_FOLDERS]
    assert env["XLA_FLAGS"] == f"--xla_gpu_cuda_data_dir={site}/nvidia/cuda_nvcc"
    assert env["PATH"] == "/opt/tensorflow/2.18/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert "cuda" not in env["PATH"]
    assert (env["TF_STACK_CUDA"], env["TF_STACK_CUDNN"], env["TF_STACK_CUDART"], env["TF_STACK_CUDNN_SONAME"]) == (
        "12.5",
        "9.3",
        "libcudart.so.12",
        "libcudnn.so.9",
    )
    assert env["TF_STACK_PACKAGE"] == "tensorflow[and-cuda]"


def test_a_wheels_stacks_kernel_says_its_cuda_comes_from_wheels():
    stack = wheels_resolved("tf2.18", Path("/opt/tensorflow/2.18"), Path("/opt/tensorflow/2.18/site"))
    spec = gpu_tf_kernel_spec(stack, "/usr/local/bin/tf-stack")
    assert spec["display_name"] == "TensorFlow 2.18.1 (tf2.18: CUDA 12.5 wheels, cuDNN 9.3)"
    assert spec["argv"][:4] == ["/usr/local/bin/tf-stack", "run", "tf2.18", "--"] and "env" not in spec


WHEELS_PROBE = (
    "import ctypes, json\n"
    "rt = ctypes.CDLL('libcudart.so.12')\n"
    "dnn = ctypes.CDLL('libcudnn.so.9'); dnn.cudnnGetVersion.restype = ctypes.c_size_t\n"
    "maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcud' in l})\n"
    "print(json.dumps({'cudnn': dnn.cudnnGetVersion(), 'files': maps}))\n"
)


@pytest.fixture(scope="module")
def wheels_host(tmp_path_factory) -> dict:
    """A venv holding NVIDIA's wheel layout (libcudart.so.12 and cuDNN 9.3 as the wheels ship them: the soname
    files themselves), bound as tf_venv binds it, listed in a registry; and a system CUDA 12 folder with the same
    sonames (another cuDNN 9), the kind a user puts on LD_LIBRARY_PATH."""
    base = tmp_path_factory.mktemp("wheels")
    builder = load_builder().Builder(base / "build", force=True, driver_cuda_override=None)
    venv = base / "venvs" / "tf2.18"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    system = base / "system-cuda" / "lib64"
    for folder, cudnn in ((site / "nvidia" / "cudnn" / "lib", 90300), (system, 90100)):
        defines = {"STANDIN_CUDNN_VERSION": str(cudnn), "STANDIN_CUDART_VERSION": "12050"}
        builder.compile_lib("libcudnn.c", folder / "libcudnn.so.9", "libcudnn.so.9", defines)
    for folder in (site / "nvidia" / "cuda_runtime" / "lib", system):
        builder.compile_lib(
            "libcudart.c", folder / "libcudart.so.12", "libcudart.so.12", {"STANDIN_CUDART_VERSION": "12050"}
        )
    (site / "_tf_stack.py").write_bytes(TF_STACK_FILE.read_bytes())
    (site / "tf_stack.pth").write_text(PTH_LINE)
    env = gpu_tf_stack_env(wheels_resolved("tf2.18", venv, site))
    (venv / "tf-stack.env").write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    registry = base / "etc-tf-stacks"
    registry.mkdir()
    (registry / "tf2.18.env").symlink_to(venv / "tf-stack.env")
    return {"venv": venv, "site": site, "system": system, "registry": registry, "env": env}


def assert_wheels_loaded(found: dict, wheels_host: dict) -> None:
    assert found["cudnn"] == 90300, found
    assert [Path(path).parent for path in found["files"]] == [
        wheels_host["site"] / "nvidia" / "cuda_runtime" / "lib",
        wheels_host["site"] / "nvidia" / "cudnn" / "lib",
    ], found["files"]


def test_tf_stack_run_puts_the_wheels_ahead_of_the_users_system_cuda(wheels_host):
    user = {"LD_LIBRARY_PATH": f"{wheels_host['system']}:/opt/site/lib", "TF_STACK_BIND": "0"}
    run = ["run", "tf2.18", "--"]
    done = tf_stack_cli({"registry": wheels_host["registry"]}, *run, "python", "-c", WHEELS_PROBE, env=user)
    assert done.returncode == 0, done.stderr
    assert_wheels_loaded(json.loads(done.stdout), wheels_host)
    seen = tf_stack_cli({"registry": wheels_host["registry"]}, *run, "sh", "-c", 'echo "$LD_LIBRARY_PATH"', env=user)
    assert seen.stdout.strip().split(":") == wheels_host["env"]["LD_LIBRARY_PATH"].split(":") + [
        str(wheels_host["system"]),
        "/opt/site/lib",
    ]


def test_the_wheels_venvs_own_python_loads_the_wheels_under_a_system_cuda(wheels_host):
    python = wheels_host["venv"] / "bin" / "python"
    found = probe_code(python, WHEELS_PROBE, {"LD_LIBRARY_PATH": str(wheels_host["system"])})
    assert_wheels_loaded(found, wheels_host)


def test_tf_stack_list_finds_a_wheels_stacks_libraries_in_its_venv(wheels_host, tmp_path):
    done = tf_stack_cli({"registry": wheels_host["registry"]}, "list", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [row["TF_STACK_HEALTH"] for row in json.loads(done.stdout)["stacks"]] == ["ok"]
    (tmp_path / "tf2.18.env").write_text(
        (wheels_host["venv"] / "tf-stack.env").read_text().replace("nvidia/cudnn/lib", "nvidia/gone/lib")
    )
    broken = tf_stack_cli({"registry": tmp_path}, "list", "--json")
    health = json.loads(broken.stdout)["stacks"][0]["TF_STACK_HEALTH"]
    assert broken.returncode == 1 and health == f"libcudnn.so.9 missing in {wheels_host['site']}/nvidia/*"


def probe_code(python: Path, code: str, env: dict) -> dict:
    done = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
