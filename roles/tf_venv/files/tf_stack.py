#!/usr/bin/env python3
"""tf-stack: list the TensorFlow stacks of this host, run a command in one, print its environment.

Installed by the Ansible role gpu_fleet.tf_hosts.tf_venv twice, from this one file: as the command
``tf-stack`` and, in each stack's venv, as the module ``_tf_stack`` that the venv's
``tf_stack.pth`` imports. Python runs ``import`` lines of ``.pth`` files in site-packages at start
(Python documentation, "site — Site-specific configuration hook"), so :func:`bind` runs in every
process of the venv's interpreter: an activated shell, ``<venv>/bin/python`` called directly,
``sudo``, cron, a systemd unit, a Jupyter kernel.

:func:`bind` puts the stack's library folder first on ``LD_LIBRARY_PATH``. The dynamic loader reads
that variable once, when the process starts (ld.so(8)), so when it was missing the interpreter
re-executes itself once with the same arguments; from then on every ``dlopen`` of a soname such as
``libcudart.so.11.0`` or ``libcudnn.so.8`` finds the stack's own file before the system's loader
cache (``/etc/ld.so.conf.d``, which serves the default stack). Only the standard library is used,
and importing this module imports nothing but ``os`` and ``sys``.
"""

import os
import sys

ENV_FILE = "tf-stack.env"  # in each venv; /etc/tf-stacks/<name>.env links to it
REGISTRY = os.environ.get("TF_STACK_REGISTRY", "/etc/tf-stacks")
PATH_LISTS = ("LD_LIBRARY_PATH", "PATH")  # prepended to what the process has; other keys are set
XLA_DATA_DIR = "--xla_gpu_cuda_data_dir"
REEXEC = "TF_STACK_REEXEC"  # the LD_LIBRARY_PATH the interpreter was last re-executed with


def read_env(path):
    """``{KEY: value}`` of an environment file (``KEY=value`` lines, ``#`` comments): the format of
    systemd.exec(5) ``EnvironmentFile=`` without quotes, and of POSIX ``set -a; . FILE``."""
    values = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                values[key.strip()] = value.strip()
    return values


def _prepend(first, current):
    """``first`` (a ``:`` list) ahead of ``current``, without repeating an entry."""
    head = [entry for entry in first.split(":") if entry]
    return ":".join(head + [entry for entry in current.split(":") if entry and entry not in head])


def _xla_flags(value, current, old_home):
    """``current`` XLA_FLAGS with the stack's CUDA data folder (``value``): added when there is none,
    put in place of another stack's (a CUDA toolkit tree, or the previous ``CUDA_HOME``); a folder
    the caller chose otherwise stays."""
    flags = current.split()
    theirs = [flag for flag in flags if flag.startswith(XLA_DATA_DIR + "=")]
    if not theirs:
        return " ".join(flags + [value])
    folder = theirs[0].split("=", 1)[1]
    if folder.startswith("/usr/local/cuda") or (old_home and folder == old_home):
        return " ".join(value if flag in theirs else flag for flag in flags)
    return current


def merged(stack, environ):
    """The environment ``environ`` gets inside ``stack`` (its file's values): path lists prepended,
    XLA's CUDA data folder set (:func:`_xla_flags`), every other key set."""
    result = dict(environ)
    for key, value in stack.items():
        if key in PATH_LISTS:
            result[key] = _prepend(value, environ.get(key, ""))
        elif key == "XLA_FLAGS":
            result[key] = _xla_flags(value, environ.get(key, ""), environ.get("CUDA_HOME", ""))
        else:
            result[key] = value
    return result


def _say(text):
    if sys.stderr is not None:
        sys.stderr.write("tf_stack: " + text + "\n")


def bind(prefix=None, environ=None, execv=None):
    """Bind the running interpreter (venv ``prefix``) to its stack; re-execute it once when the
    loader must see a new ``LD_LIBRARY_PATH``. Does nothing when ``TF_STACK_BIND=0``, without a
    stack file, or when the interpreter is not a plain ``python`` (then it cannot be run again).
    Never stops the interpreter: a problem is one line on standard error."""
    environ = os.environ if environ is None else environ
    if environ.get("TF_STACK_BIND") == "0":
        return
    try:
        _bind(prefix or sys.prefix, environ, execv or os.execv)
    except Exception as error:  # pylint: disable=broad-exception-caught  # it runs at every interpreter start
        _say(f"not bound to its stack ({type(error).__name__}: {error}); set TF_STACK_BIND=0 to silence")


def _bind(prefix, environ, execv):
    try:
        stack = read_env(os.path.join(prefix, ENV_FILE))
    except OSError:
        return
    stack.pop("PATH", None)  # a process keeps its own PATH; `tf-stack run` sets the stack's
    wanted = merged(stack, environ)
    library_path = wanted.get("LD_LIBRARY_PATH", "")
    rerun = library_path != environ.get("LD_LIBRARY_PATH", "")
    if rerun and environ.get(REEXEC) == library_path:
        # Set before the last exec and gone again: the loader runs this interpreter in secure-execution
        # mode (file capabilities, setuid, an SELinux transition) and removes LD_LIBRARY_PATH (ld.so(8)).
        _say(
            f"the loader ignores LD_LIBRARY_PATH for {sys.executable} (secure-execution mode, ld.so(8)); "
            "it loads the default stack's libraries"
        )
        rerun = False
    environ.update(wanted)
    argv = _command_line()
    if rerun and argv and os.path.basename(sys.executable).startswith("python"):
        environ[REEXEC] = library_path
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        execv(sys.executable, [sys.executable] + argv[1:])


def _command_line():
    """This interpreter's own arguments: ``sys.orig_argv`` (Python 3.10+), else the kernel's copy
    (proc(5), ``/proc/[pid]/cmdline``); None when neither can be read."""
    if hasattr(sys, "orig_argv"):
        return list(sys.orig_argv)
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            return [os.fsdecode(part) for part in handle.read().split(b"\0")[:-1]]
    except OSError:
        return None


# --- the command ---------------------------------------------------------------------------------

HELP = """\
NAME
    tf-stack - the TensorFlow stacks of this host: list, run, environment, probe

SYNOPSIS
    tf-stack list [--json]
    tf-stack run STACK -- COMMAND [ARGUMENT...]
    tf-stack env STACK
    tf-stack probe STACK

DESCRIPTION
    Each stack is a virtual environment with one TensorFlow, bound to one CUDA toolkit
    (/usr/local/cuda-X.Y) and the cuDNN installed into it, or to NVIDIA's CUDA and cuDNN wheels
    inside the venv (tensorflow[and-cuda]). The Ansible role gpu_fleet.tf_hosts.tf_venv writes
    them; this command only reads.

    A stack's own Python (<venv>/bin/python) finds its stack's libraries in any context, without
    this command. Use `run` for other programs (a shell script, nvcc) and `env` for services.

COMMANDS
    list    One line per stack: name, TensorFlow, Python, CUDA, cuDNN, venv, health. `*` marks the
            default stack (the one /usr/local/cuda, PATH and /etc/ld.so.conf.d serve; none of them
            where its CUDA comes from wheels). Health is `ok`, or what is missing: the venv's
            interpreter, libcudart or libcudnn in the stack's library folders, or a dependency
            lock that was not installed in full.
    run     Runs COMMAND with the stack's environment: its venv's bin (and the toolkit's bin) first
            on PATH, its library folders (the toolkit's lib64, or the venv's nvidia/*/lib) first on
            LD_LIBRARY_PATH, ahead of what the caller had, CUDA_HOME (a toolkit's) and XLA_FLAGS set.
    env     Prints that environment as `export` lines: eval "$(tf-stack env tf2.18)".
    probe   Loads libcudart and libcudnn the way TensorFlow does (by soname, in the stack's
            Python) and prints cudaRuntimeGetVersion, cudnnGetVersion and the files loaded
            (libcudart.so.11.8.89: the runtime's release). Without a usable GPU the runtime gives
            no version: cudaRuntimeGetVersion is null and cudaRuntimeGetVersion_error says why,
            e.g. "100 (cudaErrorNoDevice)"; that is no failure of the stack.

FILES
    /etc/tf-stacks/NAME.env     the stack's environment (links to <venv>/tf-stack.env); usable as
                                a systemd unit's EnvironmentFile=
    /etc/tf-stacks/default      link to the default stack's file
    <venv>/tf_stack.pth         binds the venv's Python (TF_STACK_BIND=0 turns it off)

EXIT STATUS
    0 success; 1 a stack is unhealthy (list) or a library does not load (probe); 2 unknown stack
    or bad usage; run exits with COMMAND's status (127 when COMMAND is not found).

EXAMPLES
    tf-stack list
    tf-stack run tf2.18 -- python train.py
    sudo -u alice tf-stack run tf2.12 -- python -c 'import tensorflow as tf; print(tf.__version__)'
    systemd unit: EnvironmentFile=/etc/tf-stacks/tf2.18.env
                  ExecStart=/opt/tensorflow/2.18/bin/python /srv/serve.py
"""

PROBE = """
import ctypes, ctypes.util, json, os
def load(name):
    try:
        return ctypes.CDLL(name)
    except OSError as error:
        return str(error)
cudart, cudnn = load(os.environ["TF_STACK_CUDART"]), load(os.environ["TF_STACK_CUDNN_SONAME"])
found = {}
if not isinstance(cudart, str):
    version = ctypes.c_int()
    status = cudart.cudaRuntimeGetVersion(ctypes.byref(version))
    found["cudaRuntimeGetVersion"] = version.value if status == 0 else None
    if status:
        # No GPU or no driver: the runtime says why in its own words (cudaGetErrorName).
        name = getattr(cudart, "cudaGetErrorName", None)
        if name is not None:
            name.restype = ctypes.c_char_p
        found["cudaRuntimeGetVersion_error"] = "%d (%s)" % (status, name(status).decode() if name else "error")
if not isinstance(cudnn, str):
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    found["cudnnGetVersion"] = cudnn.cudnnGetVersion()
found["errors"] = [e for e in (cudart, cudnn) if isinstance(e, str)]
found["files"] = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcud" in l})
print(json.dumps(found))
"""


def stacks(registry=None):
    """``{name: values}`` of every ``<registry>/<name>.env``, sorted by name."""
    folder = registry or REGISTRY
    try:
        names = sorted(entry[: -len(".env")] for entry in os.listdir(folder) if entry.endswith(".env"))
    except OSError:
        return {}
    found = {}
    for name in names:
        try:
            found[name] = read_env(os.path.join(folder, name + ".env"))
        except OSError:
            found[name] = {"TF_STACK": name}
    return found


def default_name(registry=None):
    """The stack ``<registry>/default`` links to (``<name>.env``); "" when there is none."""
    try:
        target = os.path.basename(os.readlink(os.path.join(registry or REGISTRY, "default")))
    except OSError:
        return ""
    return target[: -len(".env")] if target.endswith(".env") else ""


def health(values):
    """``ok``, or each thing of the stack that is missing or incomplete. The stack's libraries are looked for
    in its library folders (``LD_LIBRARY_PATH``): a toolkit's ``lib64``, or the venv's ``nvidia/*/lib`` folders
    where the stack's CUDA comes from NVIDIA's wheels."""
    venv = values.get("TF_STACK_VENV", "")
    folders = [folder for folder in values.get("LD_LIBRARY_PATH", "").split(":") if folder.startswith("/")]
    if not (venv.startswith("/") and folders):
        return "environment file unreadable or incomplete (no TF_STACK_VENV or LD_LIBRARY_PATH)"
    where = folders[0] if len(folders) == 1 else os.path.commonpath(folders) + "/*"
    problems = []
    if not os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        problems.append("no interpreter in " + venv)
    for soname in (values.get("TF_STACK_CUDART", ""), values.get("TF_STACK_CUDNN_SONAME", "")):
        if not any(os.path.exists(os.path.join(folder, soname)) for folder in folders):
            problems.append(soname + " missing in " + where)
    problems += _lock_problem(venv)
    return "; ".join(problems) or "ok"


def _lock_problem(venv):
    """A venv that has a lock must record it as installed in full (tf_venv writes the record last)."""
    import hashlib

    try:
        with open(os.path.join(venv, "tf-lock.txt"), "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return []
    try:
        with open(os.path.join(venv, "tf-lock.sha256"), encoding="utf-8") as handle:
            recorded = handle.read().split()[:1]
    except OSError:
        recorded = []
    return [] if recorded == [digest] else ["lock not installed in full"]


COLUMNS = ("TF_STACK_TENSORFLOW", "TF_STACK_PYTHON", "TF_STACK_CUDA", "TF_STACK_CUDNN", "TF_STACK_VENV")
HEADER = ("STACK", "TENSORFLOW", "PYTHON", "CUDA", "CUDNN", "VENV", "HEALTH")


def _list(args, known):
    rows = [(name, *[values.get(key, "?") for key in COLUMNS], health(values)) for name, values in known.items()]
    if args.json:
        import json

        stacks = [dict(values, TF_STACK_HEALTH=row[-1]) for values, row in zip(known.values(), rows)]
        print(json.dumps({"default": default_name(), "stacks": stacks}, indent=1))
    else:
        default = default_name()
        widths = [max(len(str(cell)) for cell in column) for column in zip(HEADER, *rows)]
        for mark, row in [("", HEADER)] + [("*" if row[0] == default else "", row) for row in rows]:
            print(mark.ljust(2) + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 1 if any(row[-1] != "ok" for row in rows) else 0


def _environment(values):
    """The environment of ``tf-stack run``: this process's, with the stack's merged in."""
    return merged(values, dict(os.environ))


def _run(args, values):
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("tf-stack run: no COMMAND; tf-stack run STACK -- COMMAND [ARGUMENT...]", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, _environment(values))
    except OSError as error:
        print(f"tf-stack run: {command[0]}: {error.strerror}", file=sys.stderr)
        return 127


def _env(args, values):
    import shlex

    environment = _environment(values)
    for key in sorted(values):
        print(f"export {key}={shlex.quote(environment[key])}")
    return 0


def _probe(args, values):
    import json
    import subprocess

    if not values.get("TF_STACK_VENV", "").startswith("/"):
        print(f"tf-stack probe: {args.stack}: {health(values)}", file=sys.stderr)
        return 1
    python = os.path.join(values["TF_STACK_VENV"], "bin", "python")
    try:
        done = subprocess.run(
            [python, "-c", PROBE], env=_environment(values), capture_output=True, text=True, check=False
        )
    except OSError as error:
        print(f"tf-stack probe: {python}: {error.strerror}", file=sys.stderr)
        return 1
    if done.returncode != 0:
        print(done.stderr.strip(), file=sys.stderr)
        return 1
    found = json.loads(done.stdout)
    print(json.dumps(dict(found, stack=args.stack, cuda_home=values.get("CUDA_HOME")), indent=1))
    return 1 if found["errors"] else 0


def _own_arguments(argv):
    """tf-stack's own arguments: those before ``--`` and, for ``run``, before the command after the
    stack (``tf-stack run tf2.12 python3 -h`` asks python3 for its help)."""
    ours = argv[: argv.index("--")] if "--" in argv else argv
    if ours[:1] == ["run"]:
        words = [number for number, word in enumerate(ours) if not word.startswith("-")]
        ours = ours[: words[2]] if len(words) > 2 else ours
    return ours


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(
        prog="tf-stack",
        usage=HELP.split("\n\n")[1].split("\n", 1)[1],
        add_help=False,
    )
    commands = parser.add_subparsers(dest="action", required=True)
    commands.add_parser("list", add_help=False).add_argument("--json", action="store_true")
    for action in ("run", "env", "probe"):
        sub = commands.add_parser(action, add_help=False)
        sub.add_argument("stack")
        if action == "run":
            sub.add_argument("command", nargs=argparse.REMAINDER)
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(_own_arguments(argv)):
        print(HELP, end="")
        return 0
    args = parser.parse_args(argv)
    known = stacks()
    if args.action == "list":
        return _list(args, known)
    if args.stack not in known:
        names = ", ".join(known) or f"none (no {REGISTRY}/*.env)"
        print(f"tf-stack: no stack {args.stack!r}; this host has: {names}", file=sys.stderr)
        return 2
    return {"run": _run, "env": _env, "probe": _probe}[args.action](args, known[args.stack])


if __name__ == "__main__":
    sys.exit(main())
