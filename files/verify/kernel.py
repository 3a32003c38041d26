"""A stack's Jupyter kernel, started as Jupyter starts it: from its kernel spec, with one cell run.

tf_venv writes ``<kernel dir>/tf-stack-<stack>/kernel.json`` where the stack's venv holds ipykernel
and it imports; the spec starts the kernel through ``tf-stack run <stack> --``. This check runs in
the stack's venv (its interpreter has ``jupyter_client``, a dependency of ipykernel), starts the
kernel through ``jupyter_client`` from an environment such as a user's (``LD_LIBRARY_PATH`` holding
a folder of the user's own, no ``TF_STACK_*`` variables), and runs one cell that loads the stack's
``libcudart`` and ``libcudnn`` and reports the files mapped, ``LD_LIBRARY_PATH`` and ``sys.prefix``
(Jupyter Client documentation, "Kernel specs" and "Running Code in a kernel": ``KernelManager``,
``BlockingKernelClient.execute_interactive``). Run for a stack::

    python /opt/gpu-verify/kernel.py --stack tf2.12 --cuda-root /usr/local/cuda-11.8 \\
        --cuda 11.8 --cudnn 8.6 --kernel-dir /usr/local/share/jupyter/kernels

gpu_verify.py ``--kernel-dir`` runs the same check (:func:`check`) and puts under ``kernel`` (null
where the venv holds no ipykernel and no spec names its kernel: no kernel is expected)::

    {"name", "spec": path, "started": bool, "seconds", "prefix", "ld_library_path": [...],
     "loaded": {"libcudart": path | null, "libcudnn": path | null}, "ok": bool,
     "problems": [{"check": "kernel", "cause", "fix"}]}

Exit codes: 0 the kernel started and ran its cell with the stack's libraries (or no kernel is
expected), 1 it did not, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from libraries import CUDA_SOURCES, cudart_soname, cudnn_soname, paths_from_maps, soname_stem
from verify_common import print_section, problem, tail
from wheels import is_own

KERNEL_PREFIX = "tf-stack-"  # tf_venv's kernel folder name: tf-stack-<stack>
# A folder of the user's own on LD_LIBRARY_PATH: the kernel must keep it after the stack's.
USER_LIBRARY_DIR = "/opt/gpu-verify-user-libraries"
START_SECONDS = 90.0
RERUN_FIX = (
    "Rerun site.yml (site.yml --tags tf_venv --limit <host>, with the stack's own tf_venv_lock_dir where it has "
    "one): tf_venv writes the kernel spec of stack {stack} into tf_venv_jupyter_kernel_dir; the verification "
    "looks in gpu_verify_jupyter_kernel_dir, the same folder unless set apart"
)
IMPORT_FIX = (
    "Where the venv's lock check failed too, rerun site.yml: tf_venv installs again what drifted from the lock. "
    "Where it passed, ipykernel does not import with the lock's versions: make the lock again with "
    "tools/locks.py (its targets' constraints bound IPython for TensorFlow releases that pin an older "
    "typing-extensions) or add a working release as --extra; a venv whose files were changed by hand is built "
    "again by removing its folder and rerunning site.yml"
)
STALE_FIX = "Rerun site.yml: tf_venv removes the kernel spec of a stack whose lock no longer names ipykernel"
CELL = """
import ctypes, json, os, sys
errors = {}
for key, soname in SONAMES.items():
    try:
        ctypes.CDLL(soname)
    except OSError as error:
        errors[key] = str(error)
with open("/proc/self/maps") as maps:
    mapped = [line for line in maps if "libcudart" in line or "libcudnn" in line]
print(json.dumps({"prefix": sys.prefix, "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
                  "maps": "".join(mapped), "errors": errors}))
"""


def ipykernel_installed() -> bool:
    """Whether this interpreter's environment holds ipykernel (then a kernel spec is expected)."""
    try:
        importlib.metadata.distribution("ipykernel")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def import_error(python: str = sys.executable) -> str | None:
    """The last line of the error ``import ipykernel.kernelapp`` raises in ``python``, or None."""
    done = subprocess.run(
        [python, "-c", "import ipykernel.kernelapp"], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {done.returncode}"


def user_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the kernel starts from: this process's without the stack binding's variables
    (``TF_STACK_*``), with ``LD_LIBRARY_PATH`` a folder of the user's own."""
    source = os.environ if environ is None else environ
    env = {key: value for key, value in source.items() if not key.startswith("TF_STACK_")}
    env["LD_LIBRARY_PATH"] = USER_LIBRARY_DIR
    return env


def run_cell(kernel_dir: str, name: str, code: str, timeout: float = START_SECONDS) -> dict[str, Any]:
    """Start kernel ``name`` from ``kernel_dir`` through jupyter_client, run ``code`` and return the
    JSON document it printed. Raises RuntimeError when it did not start or the cell failed (the
    message says which, with the last line the kernel wrote to its stderr)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernel_dir]))
    with tempfile.TemporaryFile(mode="w+") as stderr:
        manager.start_kernel(env=user_environment(), stderr=stderr)
        try:
            client = manager.client()
            client.start_channels()
            output: list[str] = []
            try:
                client.wait_for_ready(timeout=timeout)
                reply = client.execute_interactive(code, timeout=timeout, output_hook=_collect(output))
            except (RuntimeError, TimeoutError) as error:
                raise RuntimeError(f"{error}{_stderr_tail(stderr)}") from None
            finally:
                client.stop_channels()
        finally:
            manager.shutdown_kernel(now=True)
        if reply["content"].get("status") != "ok":
            raise RuntimeError(f"the cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
        return json.loads("".join(output).strip().splitlines()[-1])


def _collect(output: list[str]) -> Any:
    def hook(message: dict[str, Any]) -> None:
        if message.get("msg_type") == "stream" and message["content"].get("name") == "stdout":
            output.append(message["content"]["text"])

    return hook


def _stderr_tail(stderr: Any) -> str:
    stderr.seek(0)
    lines = [line for line in stderr.read().splitlines() if line.strip()]
    return f"; the kernel said: {tail(lines[-1], 300)}" if lines else ""


def _stack_places(
    cuda_root: str | None, library_dirs: Sequence[str] | None
) -> tuple[str, Callable[[str], bool], Callable[[str], bool]]:
    """The stack's library place as the causes name it, whether a folder of LD_LIBRARY_PATH is the stack's,
    and whether a mapped file is: under ``cuda_root`` (a runfile tree), or in one of the ``library_dirs`` of
    NVIDIA's wheels (the stack's environment file lists them, first, on LD_LIBRARY_PATH)."""
    if library_dirs:
        own = {os.path.realpath(folder) for folder in library_dirs}
        place = f"NVIDIA wheels in {os.path.commonpath(list(library_dirs))}"
        return place, lambda folder: os.path.realpath(folder) in own, lambda path: is_own(path, library_dirs)
    root = os.path.realpath(str(cuda_root)) + os.sep
    return (
        str(cuda_root),
        lambda folder: os.path.realpath(folder).startswith(root),
        lambda path: os.path.realpath(path).startswith(root),
    )


def judge(
    doc: dict[str, Any],
    cuda_root: str | None,
    prefix: str,
    sonames: dict[str, str],
    library_dirs: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The kernel's cell output ``doc`` against the stack: its venv, its libraries from
    ``cuda_root`` (or a wheels stack's ``library_dirs``), the stack's library folder first and the user's
    folder kept on LD_LIBRARY_PATH."""
    place, first_is_own, file_is_own = _stack_places(cuda_root, library_dirs)
    folders = [part for part in doc.get("ld_library_path", "").split(":") if part]
    loaded = {
        key: (paths_from_maps(doc.get("maps", ""), soname_stem(soname)) or [None])[0] for key, soname in sonames.items()
    }
    causes = []
    if os.path.realpath(doc.get("prefix", "")) != os.path.realpath(prefix):
        causes.append(f"the kernel runs in {doc.get('prefix')}, not in the stack's venv {prefix}")
    if not folders or not first_is_own(folders[0]):
        causes.append(f"the kernel's LD_LIBRARY_PATH starts with {folders[:1] or 'nothing'}, not the stack's {place}")
    if USER_LIBRARY_DIR not in folders:
        causes.append(f"the kernel's LD_LIBRARY_PATH lost the user's {USER_LIBRARY_DIR} ({':'.join(folders)})")
    for key, path in loaded.items():
        if path is None:
            causes.append(f"the kernel could not load {sonames[key]}: {doc.get('errors', {}).get(key, 'not mapped')}")
        elif not file_is_own(path):
            causes.append(f"the kernel loaded {path}, not the stack's {sonames[key]} under {place}")
    return {"ld_library_path": folders, "loaded": loaded, "causes": causes}


def stale_spec(name: str, spec: str) -> dict[str, Any] | None:
    """None where the venv holds no ipykernel and no spec names the stack's kernel; a failed section
    where one still does (Jupyter would list a kernel that dies at once)."""
    if not os.path.isfile(spec):
        return None
    cause = f"{spec} lists kernel {name}, but the venv {sys.prefix} holds no ipykernel: the kernel cannot start."
    section = {"name": name, "spec": spec, "started": False, "ld_library_path": [], "loaded": {}, "seconds": 0.0}
    return dict(section, ok=False, problems=[problem("kernel", cause, STALE_FIX)])


def check(
    stack: str,
    kernel_dir: str,
    cuda_root: str | None,
    cuda: str,
    cudnn: str,
    library_dirs: Sequence[str] | None = None,
) -> dict[str, Any] | None:
    """Start stack ``stack``'s kernel and judge its cell (against ``cuda_root``, or a wheels stack's
    ``library_dirs``); None where this venv holds no ipykernel."""
    name = KERNEL_PREFIX + stack
    spec = os.path.join(kernel_dir, name, "kernel.json")
    if not ipykernel_installed():
        return stale_spec(name, spec)
    started = time.monotonic()
    section: dict[str, Any] = {"name": name, "spec": spec, "started": False, "ld_library_path": [], "loaded": {}}
    failure = import_error()
    if failure:
        cause = f"ipykernel is in the venv {sys.prefix} but does not import ({failure}), so {name} cannot start."
        problems = [problem("kernel", cause, IMPORT_FIX)]
    elif not os.path.isfile(spec):
        problems = [
            problem(
                "kernel", f"{spec} is missing, though ipykernel imports in {sys.prefix}.", RERUN_FIX.format(stack=stack)
            )
        ]
    else:
        sonames = {"libcudart": cudart_soname(cuda), "libcudnn": cudnn_soname(cudnn)}
        try:
            doc = run_cell(kernel_dir, name, CELL.replace("SONAMES", repr(sonames)))
        except (RuntimeError, OSError, ValueError, KeyError) as error:
            problems = [
                problem("kernel", f"Kernel {name} ({spec}) did not run a cell: {error}", RERUN_FIX.format(stack=stack))
            ]
        else:
            judged = judge(doc, cuda_root, sys.prefix, sonames, library_dirs)
            section.update(
                started=True, prefix=doc.get("prefix"), **{k: judged[k] for k in ("ld_library_path", "loaded")}
            )
            fix = "Start it as its spec does (tf-stack run); " + RERUN_FIX.format(stack=stack)
            problems = [problem("kernel", f"Kernel {name}: {cause}.", fix) for cause in judged["causes"]]
    section["seconds"] = round(time.monotonic() - started, 3)
    return dict(section, ok=not problems, problems=problems)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        description="Start a stack's Jupyter kernel from its kernel spec and run one cell with the stack's libraries.",
        epilog="Exit codes: 0 it ran (or no kernel is expected: no ipykernel in this venv), 1 it did not, 2 usage error.",
    )
    parser.add_argument("--stack", required=True, help="the stack's name (its kernel is tf-stack-<stack>)")
    parser.add_argument(
        "--cuda-source", choices=CUDA_SOURCES, default="runfile", help="where the stack's CUDA comes from"
    )
    parser.add_argument("--cuda-root", help="the stack's toolkit, e.g. /usr/local/cuda-11.8 (--cuda-source runfile)")
    parser.add_argument(
        "--library-dir",
        action="append",
        default=[],
        help="--cuda-source wheels: a folder of the venv's NVIDIA wheels (<site-packages>/nvidia/<wheel>/lib), once each",
    )
    parser.add_argument("--cuda", required=True, help="the stack's CUDA X.Y (the libcudart soname)")
    parser.add_argument("--cudnn", required=True, help="the stack's cuDNN X.Y (the libcudnn soname)")
    parser.add_argument("--kernel-dir", default="/usr/local/share/jupyter/kernels", help="the kernel specs' folder")
    args = parser.parse_args(argv)
    wheels = args.cuda_source == "wheels"
    if not (args.library_dir if wheels else args.cuda_root) or (wheels and args.cuda_root):
        parser.error("give --cuda-root for --cuda-source runfile, each --library-dir (and no --cuda-root) for wheels")
    section = check(
        args.stack, args.kernel_dir, args.cuda_root, args.cuda, args.cudnn, args.library_dir if wheels else None
    )
    return print_section(section)


if __name__ == "__main__":
    sys.exit(main())
