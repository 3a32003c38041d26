"""Resolve pinned GPU software stacks against the version matrix and the artifact manifest.

A *stack* is what one TensorFlow virtual environment needs: TensorFlow, the Python interpreter that
runs it, a CUDA toolkit and a cuDNN release, plus the NVIDIA driver underneath (one per host).
Users pin some of these in the inventory (``gpu_preflight_stacks``); everything left out is taken
from the version matrix (``data/version_matrix.yml``, every row with its source) and the artifact
manifest (``data/artifacts.yml`` plus overlays). Every problem is collected, not only the first, and
each one names its cause and a concrete fix. Inputs are checked as they are read: a stack name safe in
file names (:data:`NAME_PATTERN`), versions of the documented forms (:data:`VERSION_FORMS`), absolute
paths, and a venv that is a folder of its own (:data:`SHARED_FOLDERS`, not in a CUDA toolkit tree).

Sources of the rules applied here:

- TensorFlow's Python range and the CUDA X.Y and cuDNN X.Y each wheel was built with: TensorFlow,
  "Tested build configurations", Linux GPU, https://www.tensorflow.org/install/source#gpu
- minimum driver of each CUDA release: CUDA Toolkit release notes, table "CUDA Toolkit and
  Corresponding Driver Versions", https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/
- cuDNN at run time (same major, equal or higher minor): TensorFlow's own check,
  ``IsSourceCompatibleWithCudnnLibrary`` in ``tensorflow/stream_executor/cuda/cudnn_version.cc``
  (called from ``cuda_dnn.cc``, quoted in https://github.com/tensorflow/tensorflow/issues/62626);
  cuDNN releases per CUDA major: cuDNN support matrix,
  https://docs.nvidia.com/deeplearning/cudnn/backend/latest/reference/support-matrix.html

Exposed to Ansible as the filters ``gpu_stacks_resolve``, ``cudnn_header_version`` and
``gpu_tf_requirement``; plain functions for unit tests.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, NamedTuple

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

try:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version
except ImportError as error:  # packaging comes with ansible-core; ansible-test's import check runs without it
    PACKAGING_ERROR: ImportError | None = error
else:
    PACKAGING_ERROR = None

PIN_KEYS = ("name", "tensorflow", "cuda", "cudnn", "cuda_source", "python", "package", "venv", "state")
# Where a stack's CUDA and cuDNN come from: NVIDIA's runfile and cuDNN tar archive into /usr/local/cuda-X.Y
# (the cuda_toolkit and cudnn roles), or NVIDIA's nvidia-*-cu<major> wheels inside the venv, as
# ``pip install tensorflow[and-cuda]`` installs them (TensorFlow, "Install TensorFlow with pip", Linux,
# https://www.tensorflow.org/install/pip#linux): the matrix's ``cuda_wheels`` section.
CUDA_SOURCES = ("runfile", "wheels")
WHEELS_PACKAGE = "tensorflow[and-cuda]"
# The roles that install a toolkit tree and the cuDNN in it (runfile, tar archive): a wheels stack has neither.
TREE_ROLES = ("cuda_toolkit", "cudnn")
# Driver methods that install packages (NVIDIA's repository, the distribution's archive): no runfile is needed.
PACKAGE_METHODS = ("package", "distribution")
STATES = ("present", "absent")
DEFAULT_VENV_ROOT = "/opt/tensorflow"
CUDA_ROOT_PREFIX = "/usr/local/cuda-"
CUDA_LINK = "/usr/local/cuda"  # the default stack's link to its toolkit tree (cuda_toolkit role)
HOST_WIDE = "-"  # the ``stack`` of a problem that belongs to the host, not to one stack
# A sha256 as NVIDIA and sha256sum write it (FIPS 180-4, section 6.2: a 256-bit digest, 64 hexadecimal digits).
SHA256 = re.compile(r"[0-9a-fA-F]{64}")

# A stack name becomes part of file names, config files and JUnit class names: one safe word.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NAME_MAX = 64

# The forms a version pin may take (``fullmatch``); ASCII digits only.
VERSION_FORMS = {
    "tensorflow": re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?"),
    "cuda": re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?"),
    "cudnn": re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+){0,2}"),
    # NVIDIA driver versions: 520.61.05, 535.104.05, 470.57.02 (three parts; R-branch.minor.patch).
    "driver": re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?"),
}

# Folders a venv may not be: ``python -m venv DIR`` writes bin/, lib/, include/ and pyvenv.cfg
# into DIR itself, among what the system (``/usr/bin/python3``), other software or the other
# stacks (the default venv root) keep there. Compared normalised (``/usr/`` is ``/usr``, :func:`_normal_path`).
# Below them is fine (``/opt/tf``, ``/srv/tf``); the CUDA toolkit trees are refused separately.
SHARED_FOLDERS = frozenset(
    (
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib64",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/usr/local",
        "/var",
        DEFAULT_VENV_ROOT,
    )
)

Problem = dict[str, str]


class CudnnLayout(NamedTuple):
    """Where one form of NVIDIA's cuDNN tar archive keeps headers and libraries (``{top}``: the
    archive's name without ``.tar.xz``)."""

    name: str
    pattern: re.Pattern[str]
    form: str
    include: str
    lib: str


# NVIDIA's cuDNN tar archives, told apart by their file name. Older releases (cuDNN 7.x and early
# 8.x) were cudnn-<CUDA X.Y>-linux-x64-v<version>.tgz with a top folder cuda/ holding include/ and
# lib64/; later ones are cudnn-linux-x86_64-<version>_cuda<X[.Y]>-archive.tar.xz with a top folder of
# the same name holding include/ and lib/. NVIDIA cuDNN Installation Guide, "Tar File Installation"
# (https://docs.nvidia.com/deeplearning/cudnn/installation/latest/linux.html; the 8.x guides under
# https://docs.nvidia.com/deeplearning/cudnn/archives/).
CUDNN_LAYOUTS = (
    CudnnLayout(
        "archive",
        re.compile(r"(?P<top>cudnn-linux-x86_64-[0-9.]+_cuda[0-9]+(\.[0-9]+)?-archive)\.tar\.xz"),
        "cudnn-linux-x86_64-<version>_cuda<M>-archive.tar.xz",
        "{top}/include",
        "{top}/lib",
    ),
    CudnnLayout(
        "legacy",
        re.compile(r"cudnn-[0-9]+\.[0-9]+-linux-x64-v[0-9.]+\.tgz"),
        "cudnn-<CUDA X.Y>-linux-x64-v<version>.tgz",
        "cuda/include",
        "cuda/lib64",
    ),
)
CUDNN_LAYOUTS_TEXT = " or ".join(
    f"{layout.form} (unpacks to {layout.include.replace('{top}', '<name>')}/ and "
    f"{layout.lib.replace('{top}', '<name>')}/)"
    for layout in CUDNN_LAYOUTS
)


class Message(NamedTuple):
    """Text of one kind of problem or warning; ``cause`` and ``fix`` are ``str.format`` templates."""

    check: str
    cause: str
    fix: str


# Every problem and warning the resolver reports, by id. ``_problem`` is the only reader.
MESSAGES: dict[str, Message] = {
    # One stack (resolve_stack).
    "tensorflow_pin_invalid": Message(
        "tensorflow",
        "The tensorflow pin {pin!r} is not a version like 2.12 or 2.12.1.",
        'Write it as X.Y or X.Y.Z, in quotes (tensorflow: "2.12"); the version matrix has TensorFlow {known}.',
    ),
    "tensorflow_unknown": Message(
        "tensorflow",
        "TensorFlow {pin} is not in the version matrix, whose newest release is {newest}.",
        "Pin one of TensorFlow {known}{quoted}, or add a row with its sources to data/version_matrix.yml.",
    ),
    "tensorflow_release_unknown": Message(
        "tensorflow",
        "TensorFlow {pin} is not in the version matrix: the newest {series} release it knows is {latest}.",
        'Pin "{latest}" (or "{series}", which takes {latest}). A newer release needs its row\'s latest raised in the '
        "version matrix (gpu_preflight_matrix_file) and its dependency lock made (make locks) first.",
    ),
    "tensorflow_known_bad": Message("tensorflow", "TensorFlow {version}: {note}", ""),
    "cuda_source_invalid": Message(
        "cuda",
        "cuda_source {source!r} is neither runfile nor wheels.",
        "Set cuda_source: runfile (the default: NVIDIA's runfile into /usr/local/cuda-X.Y and cuDNN's tar archive) "
        "or cuda_source: wheels (NVIDIA's CUDA and cuDNN wheels in the venv, pip install tensorflow[and-cuda]).",
    ),
    "wheels_tensorflow_too_old": Message(
        "cuda",
        "TensorFlow {series} has no [and-cuda] extra that brings NVIDIA's CUDA wheels; TensorFlow installs CUDA "
        "from NVIDIA's wheels from {floor} on.",
        "Pin TensorFlow {floor} or later for cuda_source: wheels, or leave cuda_source out to install CUDA from "
        "NVIDIA's runfile.",
    ),
    "wheels_release_refused": Message(
        "tensorflow",
        "TensorFlow {version} with cuda_source: wheels: {note}",
        'Pin TensorFlow {instead} (or its series, "{series}", which takes {latest}).',
    ),
    "package_extras_runfile": Message(
        "cuda",
        "Package {package!r} brings NVIDIA's CUDA wheels into the venv, but the stack's CUDA comes from the runfile "
        "tree; the venv would load a mix of both.",
        "Set cuda_source: wheels for TensorFlow's [and-cuda] extra, or name the package without the extra.",
    ),
    "wheels_matrix_missing": Message(
        "cuda",
        "The version matrix (gpu_preflight_matrix_file) has no cuda_wheels section, which cuda_source: wheels reads (the first "
        "TensorFlow with the [and-cuda] extra, the releases refused, the wheels' library folders).",
        "Copy the cuda_wheels section of the collection's data/version_matrix.yml into your matrix "
        "(gpu_preflight_matrix_file).",
    ),
    "wheels_package": Message(
        "cuda",
        "Package {package!r} has no [and-cuda] extra; only the tensorflow package brings NVIDIA's CUDA wheels.",
        "Leave package out (or set package: tensorflow) for cuda_source: wheels.",
    ),
    "wheels_pin": Message(
        "cuda",
        "cuda_source: wheels takes the {key} TensorFlow {series}'s [and-cuda] extra pins ({built}, its exact release "
        "from the stack's lock); the stack pins {key} {pin}.",
        'Leave {key} out for cuda_source: wheels (or pin {key} "{built}"); another {key} release needs '
        "cuda_source: runfile.",
    ),
    "wheels_driver_too_old": Message(
        "driver",
        "NVIDIA's CUDA {major} wheels of TensorFlow {series} (CUDA {cuda}) need driver >= {min_driver} (CUDA minor "
        "version compatibility); the pinned driver is {driver}.",
        "Raise nvidia_driver_version to >= {min_driver}{alternative}.",
    ),
    "python_unreadable": Message(
        "python",
        "Could not read the version of {path} on the host{detail}.",
        "Install Python {supported} or point the stack's python at it.",
    ),
    "python_unsupported": Message(
        "python",
        "TensorFlow {series} supports Python {supported}; {path} on this host is {found}.",
        "Point the stack's python at a Python {supported} interpreter, or {alternative}.",
    ),
    "cuda_pin_invalid": Message(
        "cuda",
        "The cuda pin {pin!r} is not a version like 11.8 or 11.8.0.",
        'Write it as X.Y or X.Y.Z, in quotes (cuda: "{built}" for TensorFlow {series}), or leave cuda out to '
        "take it from the matrix.",
    ),
    "cuda_other_major": Message(
        "cuda",
        "TensorFlow {series} was built with CUDA {built}; CUDA {pin} is another major release, whose "
        "runtime library TensorFlow does not load.",
        "Pin CUDA {built} for TensorFlow {series}, or leave cuda out to take it from the matrix.",
    ),
    "cuda_other_minor": Message(
        "cuda",
        "TensorFlow {series} was tested with CUDA {built}, not {pinned}.",
        "Pin CUDA {built} unless you have tested {pinned}.",
    ),
    "cuda_runfile_missing": Message(
        "cuda",
        "No CUDA {pin} runfile is in the artifact manifest.",
        "Add its cuda_{pin}*_linux.run entry with a sha256 to an artifact manifest "
        "(gpu_preflight_manifest_overlays), or pin a CUDA release the manifest has: {have}.",
    ),
    "cuda_release_unknown": Message(
        "cuda",
        "CUDA {pin} is not a CUDA release the version matrix knows, and the artifact manifest has no runfile for it.",
        "Pin a CUDA release the manifest has: {have}.",
    ),
    "cuda_min_driver_missing": Message(
        "cuda",
        "CUDA {version} has no minimum-driver row in the version matrix.",
        "Add it to data/version_matrix.yml from NVIDIA's CUDA release notes.",
    ),
    "cudnn_pin_invalid": Message(
        "cudnn",
        "The cudnn pin {pin!r} is not a version like 8.6 or 8.6.0.163.",
        'Write it as X.Y, X.Y.Z or X.Y.Z.B, in quotes (cudnn: "{built}" for TensorFlow {series}), or leave cudnn '
        "out to take it from the matrix.",
    ),
    "cudnn_refused": Message(
        "cudnn",
        "TensorFlow {series} was built with cuDNN {built}; it refuses cuDNN {pinned} (it needs the same "
        "major and an equal or higher minor).",
        "Pin cuDNN {built} for TensorFlow {series}.",
    ),
    "cudnn_archive_missing": Message(
        "cudnn",
        "No cuDNN {pin} archive for CUDA {cuda_major} is in the artifact manifest.",
        "Add its cudnn-linux-x86_64-{pin}*_cuda{cuda_major}-archive.tar.xz (or, for older releases, "
        "cudnn-{cuda_major}.*-linux-x64-v{pin}*.tgz) entry with a sha256 to an artifact manifest "
        "(gpu_preflight_manifest_overlays).",
    ),
    "cudnn_archive_unnamed": Message(
        "cudnn",
        "{file} (in {manifest}) is not named like one of NVIDIA's cuDNN tar archives, so where its headers and "
        "libraries are inside is unknown.",
        "Use NVIDIA's archive under its own name: {layouts}.",
    ),
    "driver_too_old": Message(
        "driver",
        "CUDA {cuda} needs driver >= {min_driver}; the pinned driver is {driver}.",
        "Raise nvidia_driver_version to >= {min_driver}{alternative}.",
    ),
    "compute_capability_too_low": Message(
        "compute_capability",
        "GPU {index} ({gpu}) has compute capability {capability}; the TensorFlow {series} wheel needs >= {floor}.",
        "Pin an older TensorFlow that still ships code for it, or use newer GPUs.",
    ),
    # Any artifact: the check is the component (cuda, cudnn, driver), given by the caller.
    "sha256_missing": Message(
        "",
        "{file} has no sha256 in {manifest}.",
        "Add the sha256 of the file you downloaded to an overlay manifest (gpu_preflight_manifest_overlays); "
        "unpinned files are never installed.",
    ),
    "sha256_not_a_digest": Message(
        "",
        "{file} has {value} as its sha256 in {manifest}, not a sha256 (64 hexadecimal digits).",
        "Put the sha256 of the file you downloaded from NVIDIA and checked (`sha256sum {file}` prints it) in its "
        "place there; unpinned files are never installed.",
    ),
    # All stacks of a host (resolve_stacks).
    "state_invalid": Message(
        "stacks",
        "state {state!r} is neither present nor absent.",
        "Set state: present (the default: install and keep the stack) or state: absent (remove it).",
    ),
    "default_absent": Message(
        "stacks",
        "The default stack {default!r} has state: absent; the default stack owns /usr/local/cuda and the "
        "system library path, so it cannot be removed.",
        "Make another stack the default first (gpu_preflight_default_stack), or keep this one present.",
    ),
    "current_default_absent": Message(
        "stacks",
        "Stack {current!r} has state: absent, but it is this host's default now (/etc/tf-stacks/default); the "
        "default moves to {default!r} only after {default!r} passed verification here, and removing {current!r} in "
        "the same run would leave the host without a working default if it does not.",
        "Run once with {current!r} present, so that {default!r} verifies and becomes the default, then set "
        "state: absent.",
    ),
    "no_present_stack": Message(
        "stacks",
        "Every stack has state: absent; a host needs one stack to own /usr/local/cuda and the library path.",
        "Keep one stack present (the default), or remove the host from the GPU group.",
    ),
    "absent_venv_in_use": Message(
        "stacks",
        "Stack {name!r} has state: absent, but its venv {venv} is, holds or sits inside stack {user!r}'s venv; "
        "removing it would damage that stack.",
        "Give the absent stack the venv it was installed in (venv:), or drop it from the list.",
    ),
    "no_stacks": Message(
        "stacks", "No stack is pinned.", "Set gpu_preflight_stacks in the inventory (see inventories/gpu_hosts)."
    ),
    "unknown_keys": Message(
        "stacks",
        "Unknown key {keys} in gpu_preflight_stacks.",
        "Use only {allowed} (check the spelling).",
    ),
    "missing_key": Message("stacks", "The stack has no {key!r}.", "Give every item of gpu_preflight_stacks a {key!r}."),
    "name_invalid": Message(
        "stacks",
        "Stack name {name!r} is not safe in file names, config files and JUnit class names.",
        "Use up to 64 letters, digits, '.', '_' and '-', starting with a letter or digit (e.g. {suggestion!r}).",
    ),
    "name_not_text": Message(
        "stacks",
        "Stack name {name!r} is {kind}, not text.",
        'Quote the name, and start it with a letter so that YAML keeps it text (e.g. name: "{suggestion}").',
    ),
    "venv_not_absolute": Message(
        "venv",
        "venv {venv!r} is not an absolute path.",
        "Set venv: to an absolute path of its own (e.g. {suggestion}), or leave it out for {root}/X.Y.",
    ),
    "venv_shared_folder": Message(
        "venv",
        "venv {venv!r} is {folder}, a folder the system or other software shares; python -m venv would put its "
        "bin/, lib/ and pyvenv.cfg among the files there.",
        "Set venv: to a folder of its own (e.g. {suggestion}), or leave it out for {root}/X.Y.",
    ),
    "venv_in_cuda_toolkit": Message(
        "venv",
        "venv {venv!r} is inside {link} or {prefix}X.Y, the CUDA toolkit trees the CUDA installer owns.",
        "Set venv: to a folder of its own (e.g. {suggestion}), or leave it out for {root}/X.Y.",
    ),
    "python_not_absolute": Message(
        "python",
        "python {python!r} is not an absolute path; which interpreter runs would depend on the PATH on the host.",
        "Set python: to the interpreter's full path (e.g. /usr/bin/python3.11), or leave it out for "
        "gpu_preflight_python.",
    ),
    "duplicate_name": Message(
        "stacks", "Stack name {name!r} is used twice.", "Give every stack in gpu_preflight_stacks its own name."
    ),
    "default_unknown": Message(
        "stacks",
        "The default stack {default!r} is not one of the stacks pinned ({names}).",
        "Set gpu_preflight_default_stack to one of the stack names.",
    ),
    "driver_pin_invalid": Message(
        "driver",
        "nvidia_driver_version {pin!r} is not an exact driver version; a moving target such as 'latest' "
        "lets reruns drift.",
        'Pin the exact version, in quotes (nvidia_driver_version: "535.104.05").',
    ),
    "driver_runfile_missing": Message(
        "driver",
        "No NVIDIA-Linux-x86_64-{driver}.run is in the artifact manifest.",
        "Add its entry with a sha256 to an artifact manifest (gpu_preflight_manifest_overlays), or pin a driver "
        "the manifest has.",
    ),
    "shared_cuda": Message(
        "cuda",
        "Stacks {first} and {second} want CUDA {first_version} and {second_version} in the same {root}.",
        "Pin the same CUDA release in both stacks.",
    ),
    "shared_cudnn": Message(
        "cudnn",
        "Stacks {first} and {second} want cuDNN {first_version} and {second_version} in the same {root}; one "
        "toolkit tree holds one cuDNN, and cuDNN of another major cannot serve both.",
        "Pin one cuDNN major for the stacks on this CUDA release (the highest minor then serves both), or put one "
        "stack on another CUDA release, which gets its own tree.",
    ),
    "cudnn_unified": Message(
        "cudnn",
        "Stacks {names} share {root} and pin cuDNN {pinned}; each gets cuDNN {version}, the highest of one major, "
        "which serves them all (TensorFlow loads a cuDNN of its build's major with an equal or higher minor).",
        "Nothing to do; pin cuDNN {short} in each of them to silence this.",
    ),
    "shared_venv": Message(
        "venv",
        "Stacks {first} and {second} share the virtual environment {venv}.",
        "Set venv: for one of them (e.g. venv: {suggestion} for {second}), so that each stack has its own.",
    ),
}

# ``{kind}`` of ``name_not_text``: what YAML read an unquoted name as (anything else: a list or dict).
NOT_TEXT_KINDS = {bool: "a yes/no value", int: "a number", float: "a number"}

# Stacks that share a CUDA X.Y share its toolkit tree and the cuDNN copied into it: the stack record
# key compared, and the message when two stacks want different releases there.
SHARED_TREE = (("cuda_toolkit", "shared_cuda"), ("cudnn", "shared_cudnn"))


def _unknown_tensorflow(stack: str, tf_pin: str, matrix: dict) -> Problem:
    """A TensorFlow series the matrix lacks; where it is a known series less its trailing 0 (YAML reads an unquoted
    2.10 as the number 2.1), the fix says to quote it."""
    padded = f"{tf_pin}0"
    quoted = (
        f' in quotes (tensorflow: "{padded}"; unquoted, YAML reads {padded} as {tf_pin})'
        if padded in matrix["tensorflow"]
        else ""
    )
    newest = max((str(row["latest"]) for row in matrix["tensorflow"].values()), key=_v)
    known = _range_text(list(matrix["tensorflow"]))
    return _problem(stack, "tensorflow_unknown", pin=tf_pin, known=known, quoted=quoted, newest=newest)


def _check_tensorflow_release(stack: str, tf_pin: str, tf_row: dict) -> list[Problem]:
    """An exact TensorFlow pin above its series' newest release in the matrix: no such release is known (its
    wheel, lock and tested configuration are not), so it is refused naming the newest one."""
    latest = str(tf_row["latest"])
    if tf_pin == _series(tf_pin) or _v(tf_pin) <= _v(latest):
        return []
    return [_problem(stack, "tensorflow_release_unknown", pin=tf_pin, series=_series(tf_pin), latest=latest)]


def _problem(stack: str, message: str, /, *, check: str = "", **fields: Any) -> Problem:
    """The one builder of problem and warning records: ``MESSAGES[message]`` filled in with ``fields``.

    ``check`` overrides the message's own check (``sha256_missing`` is shared by every component).
    A field missing from ``fields`` raises KeyError, so a typo cannot ship a half-filled message."""
    text = MESSAGES[message]
    return {
        "stack": str(stack),
        "check": check or text.check,
        "cause": text.cause.format(**fields),
        "fix": text.fix.format(**fields),
    }


def _message(problem: Problem) -> str:
    """One line for the report: ``'<stack>: <cause> <fix>'``, without the stack for host-wide ones."""
    prefix = "" if problem["stack"] == HOST_WIDE else problem["stack"] + ": "
    return f"{prefix}{problem['cause']} {problem['fix']}".strip()


def _v(text: Any) -> Version:
    """Parse a version; raises packaging.version.InvalidVersion on junk."""
    return Version(str(text))


def _series(text: Any, parts: int = 2) -> str:
    """'2.12.1' -> '2.12' (parts=2); '8.6.0.163' -> '8.6.0' (parts=3)."""
    return ".".join(str(text).split(".")[:parts])


def _starts(version: str, prefix: str) -> bool:
    """True when ``version`` equals ``prefix`` or continues it at a dot ('11.8.0' starts '11.8')."""
    return version == prefix or version.startswith(prefix + ".")


def _spec_text(spec: str) -> str:
    """'>=3.8,<3.12' -> '3.8-3.11', the way TensorFlow's table writes it."""
    low = high = None
    for clause in SpecifierSet(spec):
        if clause.operator == ">=":
            low = clause.version
        elif clause.operator == "<":
            major, minor = (int(x) for x in clause.version.split(".")[:2])
            high = f"{major}.{minor - 1}"
    return f"{low}-{high}"


def _range_text(series_list: list[str]) -> str:
    """['2.16', '2.17', '2.18'] -> '2.16-2.18'; one item -> itself."""
    ordered = sorted(series_list, key=_v)
    if not ordered:
        return "none"
    return ordered[0] if len(ordered) == 1 else f"{ordered[0]}-{ordered[-1]}"


def _normal_path(path: str) -> str:
    """'/usr/', '/usr/.' and '//usr' -> '/usr' (normpath keeps a leading '//'; Linux reads it as '/')."""
    folder = posixpath.normpath(path)
    return "/" + folder.lstrip("/") if folder.startswith("/") else folder


def _well_formed(key: str, text: str) -> bool:
    """True when ``text`` has one of the forms :data:`VERSION_FORMS` allows for the pin ``key``."""
    return VERSION_FORMS[key].fullmatch(text) is not None


def _int_parts(text: str) -> list[int]:
    """'8.6.0.163' -> [8, 6, 0, 163]; [] when any part is not a number."""
    try:
        return [int(x) for x in text.split(".")]
    except ValueError:
        return []


def cuda_min_driver(matrix: dict, cuda_version: str) -> Version | None:
    """Minimum Linux driver for an exact CUDA release, or None when the matrix lacks it."""
    row = matrix.get("cuda", {}).get(cuda_version)
    return _v(row["min_driver"]) if row else None


def tensorflow_series_for_driver(matrix: dict, driver: Version) -> list[str]:
    """TensorFlow series whose built CUDA has at least one release that ``driver`` can run."""
    ok = []
    for series, row in matrix["tensorflow"].items():
        floors = [_v(r["min_driver"]) for v, r in matrix["cuda"].items() if _starts(v, row["cuda"])]
        if floors and min(floors) <= driver:
            ok.append(series)
    return ok


def tensorflow_series_for_python(matrix: dict, python: Version) -> list[str]:
    """TensorFlow series whose tested Python range contains ``python``."""
    return [s for s, row in matrix["tensorflow"].items() if SpecifierSet(row["python"]).contains(python)]


def cudnn_accepts(built: str, pinned: list[int]) -> bool:
    """True when TensorFlow built with cuDNN ``built`` ('X.Y') loads cuDNN ``pinned`` ([X, Y, ...]).

    The major must match and the minor be equal or higher; patch levels do not matter
    (``IsSourceCompatibleWithCudnnLibrary``, tensorflow/stream_executor/cuda/cudnn_version.cc)."""
    b_major, b_minor = (int(x) for x in built.split("."))
    return pinned[0] == b_major and pinned[1] >= b_minor


def _pick_artifact(manifest: dict, component: str, prefix: str, **match: Any) -> tuple[str, dict] | None:
    """Newest manifest entry of ``component`` whose version starts with ``prefix``; of entries with the
    same version, the last (gpu_preflight merges the built-in manifests first, then the overlays, so a
    user's overlay entry wins over the built-in one for the same release)."""
    found = [
        (position, name, entry)
        for position, (name, entry) in enumerate(manifest.items())
        if entry.get("component") == component
        and _starts(str(entry.get("version")), prefix)
        and all(entry.get(k) == val for k, val in match.items())
    ]
    if not found:
        return None
    _position, name, entry = max(found, key=lambda item: (_v(item[2]["version"]), item[0]))
    return name, entry


def _artifact_record(name: str, entry: dict) -> dict:
    """An artifact as the roles use it; ``manifest`` is the file the entry came from (gpu_preflight's
    load step adds it while merging), so that messages name the user's overlay, not the built-in file."""
    return {
        "file": name,
        "sha256": entry.get("sha256"),
        "size_bytes": entry.get("size_bytes"),
        "url": entry.get("url"),
        "manifest": entry.get("manifest") or "the artifact manifest",
    }


def cudnn_layout(archive: str) -> dict | None:
    """Where the headers and libraries are inside the cuDNN archive named ``archive``
    (:data:`CUDNN_LAYOUTS`): ``{name, include, lib, form, supported}`` with paths relative to the
    unpacking folder, or None for a name NVIDIA does not use."""
    for layout in CUDNN_LAYOUTS:
        match = layout.pattern.fullmatch(archive)
        if match:
            top = match.groupdict().get("top") or ""
            return {
                "name": layout.name,
                "form": layout.form,
                "include": layout.include.format(top=top),
                "lib": layout.lib.format(top=top),
                "supported": CUDNN_LAYOUTS_TEXT,
            }
    return None


# --- one stack: each step below is one check or one pick --------------------------------------


def _tensorflow_record(pin: dict, tf_row: dict, wheels: bool = False) -> dict:
    """The stack's ``tensorflow`` record; a pin of only X.Y takes the series' latest release. A wheels stack's
    package is ``tensorflow[and-cuda]``, whose extra brings NVIDIA's wheels."""
    tf_pin = str(pin["tensorflow"])
    series = _series(tf_pin)
    return {
        "version": tf_row["latest"] if tf_pin == series else tf_pin,
        "series": series,
        "package": WHEELS_PACKAGE if wheels else pin.get("package") or "",
        "built_cuda": tf_row["cuda"],
        "built_cudnn": tf_row["cudnn"],
    }


def _warn_known_bad(name: str, tf: dict, matrix: dict) -> list[Problem]:
    """A warning when the exact TensorFlow release is listed under ``known_bad`` in the matrix."""
    known_bad = matrix.get("known_bad", {})
    if tf["version"] not in known_bad:
        return []
    return [_problem(name, "tensorflow_known_bad", version=tf["version"], note=known_bad[tf["version"]].strip())]


def _check_python(name: str, tf: dict, tf_row: dict, path: str, found: str, matrix: dict) -> list[Problem]:
    """The stack's interpreter must be in the Python range TensorFlow tested ("Tested build
    configurations", https://www.tensorflow.org/install/source#gpu)."""
    try:
        python = _v(found)
    except InvalidVersion:
        detail = f" (it printed {found!r})" if found else ": no such file, or it does not run"
        return [_problem(name, "python_unreadable", path=path, detail=detail, supported=_spec_text(tf_row["python"]))]
    if SpecifierSet(tf_row["python"]).contains(python):
        return []
    fits = tensorflow_series_for_python(matrix, python)
    alternative = (
        f"pin TensorFlow {_range_text(fits)} for Python {_series(found)}"
        if fits
        else f"no TensorFlow in the matrix supports Python {_series(found)}"
    )
    supported = _spec_text(tf_row["python"])
    fields = {"series": tf["series"], "path": path, "found": found, "supported": supported}
    return [_problem(name, "python_unsupported", alternative=alternative, **fields)]


def _check_cuda_major(name: str, tf: dict, cuda_pin: str) -> list[Problem]:
    """TensorFlow loads only the CUDA runtime of the major release it was built with."""
    built = tf["built_cuda"]
    if cuda_pin.split(".")[0] == built.split(".")[0]:
        return []
    return [_problem(name, "cuda_other_major", series=tf["series"], built=built, pin=cuda_pin)]


def _warn_cuda_minor(name: str, tf: dict, cuda_pin: str) -> list[Problem]:
    """Another minor release of the built CUDA major runs, but TensorFlow did not test it."""
    built = tf["built_cuda"]
    if cuda_pin.split(".")[0] != built.split(".")[0] or _series(cuda_pin) == built:
        return []
    return [_problem(name, "cuda_other_minor", series=tf["series"], built=built, pinned=_series(cuda_pin))]


def cudart_soname(version: str) -> str:
    """The CUDA runtime's soname: ``libcudart.so.11.0`` up to CUDA 11, ``libcudart.so.<major>``
    from CUDA 12 on (the SONAME entries of the toolkits' ``libcudart.so``, ``readelf -d``)."""
    major = int(version.split(".")[0])
    return f"libcudart.so.{major}.0" if major <= 11 else f"libcudart.so.{major}"


def _pick_cuda(name: str, cuda_pin: str, matrix: dict, manifest: dict) -> tuple[dict | None, list[Problem]]:
    """The stack's ``cuda_toolkit`` record from the newest manifest runfile matching the pin.

    Its ``min_driver`` is the matrix row's (CUDA Toolkit release notes, table "CUDA Toolkit and
    Corresponding Driver Versions", https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/)."""
    picked = _pick_artifact(manifest, "cuda_toolkit", cuda_pin)
    if picked is None:
        # The releases of the pin's major the manifest has (another major is another TensorFlow build).
        major = cuda_pin.split(".")[0]
        runfiles = [str(e.get("version")) for e in manifest.values() if e.get("component") == "cuda_toolkit"]
        have = sorted({version for version in runfiles if _starts(version, major)}, key=_v)
        known = any(_starts(str(version), cuda_pin) for version in matrix["cuda"])
        code = "cuda_runfile_missing" if known else "cuda_release_unknown"
        return None, [_problem(name, code, pin=cuda_pin, have=", ".join(have) or f"none of CUDA {major}")]
    runfile, entry = picked
    version = str(entry["version"])
    problems = []
    if cuda_min_driver(matrix, version) is None:
        problems.append(_problem(name, "cuda_min_driver_missing", version=version))
    record = {
        "source": "runfile",
        "version": version,
        "series": _series(version),
        "root": CUDA_ROOT_PREFIX + _series(version),
        "nvcc_version": entry.get("nvcc_version"),
        "cudart_soname": cudart_soname(version),
        "min_driver": None if problems else matrix["cuda"][version]["min_driver"],
        "runfile": _artifact_record(runfile, entry),
    }
    return record, problems


def _resolve_cuda(
    name: str, tf: dict, cuda_pin: str, matrix: dict, manifest: dict
) -> tuple[dict | None, list[Problem]]:
    """The stack's ``cuda_toolkit`` record, or None with the problems: a well-formed pin (its X.Y
    names the toolkit tree, ``/usr/local/cuda-X.Y``) of the major TensorFlow was built with."""
    if not _well_formed("cuda", cuda_pin):
        return None, [_problem(name, "cuda_pin_invalid", pin=cuda_pin, series=tf["series"], built=tf["built_cuda"])]
    problems = _check_cuda_major(name, tf, cuda_pin)
    cuda, found = _pick_cuda(name, cuda_pin, matrix, manifest)
    return cuda, problems + found


def _check_cudnn_pin(name: str, tf: dict, cudnn_pin: str) -> list[Problem]:
    """The pinned cuDNN must be a version TensorFlow loads (:func:`cudnn_accepts`)."""
    built = tf["built_cudnn"]
    fields = {"series": tf["series"], "built": built}
    if not _well_formed("cudnn", cudnn_pin):
        return [_problem(name, "cudnn_pin_invalid", pin=cudnn_pin, **fields)]
    if not cudnn_accepts(built, _int_parts(cudnn_pin)):
        return [_problem(name, "cudnn_refused", pinned=_series(cudnn_pin), **fields)]
    return []


def _resolve_cudnn(
    name: str, tf: dict, cudnn_pin: str, cuda_pin: str, manifest: dict
) -> tuple[dict | None, list[Problem]]:
    """The stack's ``cudnn`` record, or None with the problems; none is picked for a malformed
    cuDNN or CUDA pin (the archive is chosen by the CUDA major)."""
    problems = _check_cudnn_pin(name, tf, cudnn_pin)
    if not (_well_formed("cudnn", cudnn_pin) and _well_formed("cuda", cuda_pin)):
        return None, problems
    cudnn, found = _pick_cudnn(name, cudnn_pin, cuda_pin, manifest)
    return cudnn, problems + found


def _pick_cudnn(name: str, cudnn_pin: str, cuda_pin: str, manifest: dict) -> tuple[dict | None, list[Problem]]:
    """The stack's ``cudnn`` record from the newest manifest archive for the pin and the CUDA major
    (NVIDIA builds each cuDNN release once per CUDA major: cuDNN support matrix,
    https://docs.nvidia.com/deeplearning/cudnn/backend/latest/reference/support-matrix.html)."""
    cuda_major = int(cuda_pin.split(".")[0])
    picked = _pick_artifact(manifest, "cudnn", cudnn_pin, cuda_major=cuda_major)
    if picked is None:
        return None, [_problem(name, "cudnn_archive_missing", pin=cudnn_pin, cuda_major=cuda_major)]
    archive, entry = picked
    layout = cudnn_layout(archive)
    if layout is None:
        manifest = _artifact_record(archive, entry)["manifest"]
        return None, [
            _problem(name, "cudnn_archive_unnamed", file=archive, manifest=manifest, layouts=CUDNN_LAYOUTS_TEXT)
        ]
    version = str(entry["version"])
    record = {
        "source": "runfile",
        "version": version,
        "short": _series(version, 3),
        "series": _series(version),
        "major": int(version.split(".", maxsplit=1)[0]),
        "archive": _artifact_record(archive, entry),
        "layout": layout,
    }
    return record, []


def _check_driver(
    name: str, tf: dict, cuda: dict | None, driver_text: str, matrix: dict, manifest: dict
) -> list[Problem]:
    """The CUDA runtime must not be newer than the driver (CUDA Toolkit release notes, table "CUDA
    Toolkit and Corresponding Driver Versions"); suggests the CUDA TensorFlow was built with where the
    stack pins another one the driver cannot run, else older TensorFlow series the driver runs."""
    if not (cuda and cuda["min_driver"] and driver_text):
        return []
    driver = _v(driver_text)
    if driver >= _v(cuda["min_driver"]):
        return []
    built = tf["built_cuda"]
    # The release a pin of the built CUDA would resolve to (_pick_cuda), not any release of that series.
    built_pick = _pick_artifact(manifest, "cuda_toolkit", built)
    built_floor = cuda_min_driver(matrix, str(built_pick[1]["version"])) if built_pick else None
    built_runs = built_floor is not None and built_floor <= driver
    older = [s for s in tensorflow_series_for_driver(matrix, driver) if _v(s) < _v(tf["series"])]
    if built_runs and cuda["series"] != built:
        alternative = (
            f" or pin CUDA {built}, which TensorFlow {tf['series']} was built with and driver {driver_text} runs"
        )
    else:
        alternative = f" or pin TensorFlow {_range_text(older)}" if older else ""
    fields = {"cuda": cuda["version"], "min_driver": cuda["min_driver"], "driver": driver_text}
    return [_problem(name, "driver_too_old", alternative=alternative, **fields)]


def _check_compute_capability(name: str, tf: dict, tf_row: dict, gpus: list[dict] | None) -> list[Problem]:
    """The wheel must carry code for every GPU of the host: compute capability >= the row's
    ``min_compute_capability`` (TensorFlow release notes, e.g. 2.17.0:
    https://github.com/tensorflow/tensorflow/releases/tag/v2.17.0)."""
    floor = tf_row["min_compute_capability"]
    floor_version = _v(floor)
    problems = []
    for gpu in gpus or []:
        capability = gpu.get("compute_capability")
        if capability and _v(capability) < floor_version:
            gpu_fields = {"index": gpu.get("index"), "gpu": gpu.get("name"), "capability": capability}
            problems.append(
                _problem(name, "compute_capability_too_low", series=tf["series"], floor=floor, **gpu_fields)
            )
    return problems


def _checksum_problem(name: str, check: str, record: dict) -> list[Problem]:
    """A record without a sha256, or with something else in its place: a placeholder left unfilled (the example
    overlay's ``replace-with-the-sha256-of-your-file``) or a digest cut short."""
    fields = {"check": check, "file": record["file"], "manifest": record["manifest"]}
    value = record["sha256"]
    if not value:
        return [_problem(name, "sha256_missing", **fields)]
    text = str(value)
    if SHA256.fullmatch(text):
        return []
    shown = f"{text!r} ({len(text)} characters)" if re.fullmatch(r"[0-9a-fA-F]+", text) else f"the placeholder {text!r}"
    return [_problem(name, "sha256_not_a_digest", value=shown, **fields)]


def _check_checksums(name: str, records: list[tuple[str, dict | None]]) -> list[Problem]:
    """Every artifact record (``(check, record)``; None for one not picked) must have a sha256."""
    return [problem for check, record in records if record for problem in _checksum_problem(name, check, record)]


def _stack_record(pin: dict, tf: dict, python: dict, cuda: dict | None, cudnn: dict | None) -> dict:
    return {
        "name": pin["name"],
        "tensorflow": tf,
        "python": python,
        "cuda_toolkit": cuda,
        "cudnn": cudnn,
        "venv": _venv(pin, tf),
    }


def _venv(pin: dict, tf: dict) -> str:
    return pin.get("venv") or f"{DEFAULT_VENV_ROOT}/{tf['series']}"


def cuda_source(pin: dict) -> str:
    """Where the stack's CUDA comes from (:data:`CUDA_SOURCES`); a value that is neither is refused by
    :func:`_check_pin_values` and read as ``runfile`` here."""
    source = str(pin.get("cuda_source") or "runfile")
    return source if source in CUDA_SOURCES else "runfile"


def _resolve_runfile(
    name: str, pin: dict, tf: dict, matrix: dict, manifest: dict, host: dict
) -> tuple[dict | None, dict | None, list[Problem]]:
    """The stack's CUDA runfile and cuDNN archive (``cuda_toolkit`` and ``cudnn`` records), checked against
    TensorFlow's build and the driver."""
    cuda_pin = str(pin.get("cuda") or tf["built_cuda"])
    cudnn_pin = str(pin.get("cudnn") or tf["built_cudnn"])
    package = str(pin.get("package") or "")
    problems = [_problem(name, "package_extras_runfile", package=package)] if "[" in package else []
    cuda, found = _resolve_cuda(name, tf, cuda_pin, matrix, manifest)
    problems += found
    cudnn, found = _resolve_cudnn(name, tf, cudnn_pin, cuda_pin, manifest)
    problems += found
    problems += _check_driver(name, tf, cuda, str(host.get("driver_version") or ""), matrix, manifest)
    problems += _check_checksums(name, [("cuda", cuda and cuda["runfile"]), ("cudnn", cudnn and cudnn["archive"])])
    return cuda, cudnn, problems


def _check_wheels_pin(name: str, pin: dict, tf: dict, matrix: dict) -> list[Problem]:
    """What ``cuda_source: wheels`` allows besides TensorFlow's series: not a release the matrix refuses for it
    (``cuda_wheels.refused``, notes in ``known_bad``), the ``tensorflow`` package, and the CUDA and cuDNN the
    extra pins (TensorFlow's build, the matrix row)."""
    wheels = matrix["cuda_wheels"]
    problems = []
    if tf["version"] in wheels["refused"]:
        latest = str(matrix["tensorflow"][tf["series"]]["latest"])
        note = str(matrix.get("known_bad", {}).get(tf["version"]) or "listed under cuda_wheels.refused").strip()
        fields = {"version": tf["version"], "note": note, "series": tf["series"], "latest": latest}
        problems.append(_problem(name, "wheels_release_refused", instead=latest, **fields))
    package = pin.get("package")
    if package and package not in ("tensorflow", WHEELS_PACKAGE):
        problems.append(_problem(name, "wheels_package", package=package))
    # Only X.Y: the lock, not the pin, decides the exact releases of NVIDIA's wheels.
    for key, built in (("cuda", tf["built_cuda"]), ("cudnn", tf["built_cudnn"])):
        value = str(pin.get(key) or "")
        if value and value != built:
            problems.append(_problem(name, "wheels_pin", key=key, pin=value, built=built, series=tf["series"]))
    return problems


def _wheels_records(tf: dict, python: dict, venv: str, matrix: dict) -> tuple[dict, dict]:
    """The ``cuda_toolkit`` and ``cudnn`` records of a wheels stack: the series TensorFlow's ``[and-cuda]`` extra pins
    (its build, the matrix row), the library folders of NVIDIA's wheels in the venv, and the driver floor of the
    CUDA major (NVIDIA "CUDA Minor Version Compatibility": the wheels' runtime runs on any driver of the major's
    floor)."""
    cuda, cudnn = tf["built_cuda"], tf["built_cudnn"]
    major = cuda.split(".")[0]
    found = str(python.get("version") or "")
    python_series = _series(found) if re.match(r"[0-9]+\.[0-9]+", found) else "X.Y"
    site = f"{venv}/lib/python{python_series}/site-packages"
    toolkit = {
        "source": "wheels",
        "version": cuda,
        "series": cuda,
        "root": None,
        "nvcc_version": None,
        "cudart_soname": cudart_soname(cuda),
        "min_driver": str(matrix["cuda_major_compat"][major]["min_driver"]),
        "runfile": None,
        "site_packages": site,
        "library_dirs": [f"{site}/nvidia/{folder}/lib" for folder in matrix["cuda_wheels"]["library_folders"]],
    }
    dnn = {"source": "wheels", "version": cudnn, "short": cudnn, "series": cudnn, "major": int(cudnn.split(".")[0])}
    return toolkit, {**dnn, "archive": None, "layout": None}


def _check_wheels_driver(name: str, tf: dict, cuda: dict, driver_text: str, matrix: dict) -> list[Problem]:
    """The driver must reach the CUDA major's floor; else older TensorFlow series the driver runs are named."""
    if not driver_text or _v(driver_text) >= _v(cuda["min_driver"]):
        return []
    older = [s for s in tensorflow_series_for_driver(matrix, _v(driver_text)) if _v(s) < _v(tf["series"])]
    alternative = f", or pin TensorFlow {_range_text(older)} with cuda_source: runfile" if older else ""
    major = cuda["version"].split(".")[0]
    fields = {"cuda": cuda["version"], "min_driver": cuda["min_driver"], "driver": driver_text, "major": major}
    return [_problem(name, "wheels_driver_too_old", series=tf["series"], alternative=alternative, **fields)]


def _resolve_wheels(
    name: str, pin: dict, tf: dict, python: dict, matrix: dict, host: dict
) -> tuple[dict | None, dict | None, list[Problem]]:
    """A stack whose CUDA and cuDNN come from NVIDIA's wheels in its venv (``tensorflow[and-cuda]``)."""
    if not isinstance(matrix.get("cuda_wheels"), dict):
        return None, None, [_problem(name, "wheels_matrix_missing")]
    floor = str(matrix["cuda_wheels"]["min_tensorflow"])
    if _v(tf["series"]) < _v(floor):
        return None, None, [_problem(name, "wheels_tensorflow_too_old", series=tf["series"], floor=floor)]
    problems = _check_wheels_pin(name, pin, tf, matrix)
    cuda, cudnn = _wheels_records(tf, python, _venv(pin, tf), matrix)
    problems += _check_wheels_driver(name, tf, cuda, str(host.get("driver_version") or ""), matrix)
    return cuda, cudnn, problems


def resolve_stack(pin: dict, matrix: dict, manifest: dict, host: dict) -> dict:
    """Resolve one stack pin.

    Args:
        pin: ``{name: str, tensorflow: 'X.Y' | 'X.Y.Z', cuda?: 'X.Y' | 'X.Y.Z', cudnn?: 'X.Y' |
            'X.Y.Z' | 'X.Y.Z.B', python?: path, package?: pip name, venv?: path}``.
        matrix: the parsed ``data/version_matrix.yml``.
        manifest: ``{file name: entry}`` from the merged artifact manifests.
        host: ``{python_version: 'X.Y.Z' (of pin['python'] on the host), default_python: the
            interpreter of a pin without ``python``, driver_version: the driver the host will run,
            gpus?: [{index, name, compute_capability: 'X.Y'}] (nvidia_gpu_facts)}``.

    Returns:
        ``{ok: bool, stack: dict | None, problems: [{stack, check, cause, fix}], warnings: [...]}``.
        ``stack`` is None when TensorFlow itself could not be resolved.

    Raises:
        KeyError: when ``pin`` has no ``name`` or ``tensorflow`` (argument specs prevent this).
    """
    name = pin["name"]
    tf_pin = str(pin["tensorflow"])
    tf_row = matrix["tensorflow"].get(_series(tf_pin)) if _well_formed("tensorflow", tf_pin) else None
    if tf_row is None:
        if _well_formed("tensorflow", tf_pin):
            problems = [_unknown_tensorflow(name, tf_pin, matrix)]
        else:
            problems = [
                _problem(name, "tensorflow_pin_invalid", pin=tf_pin, known=_range_text(list(matrix["tensorflow"])))
            ]
        return {"ok": False, "stack": None, "problems": problems, "warnings": []}
    problems = _check_tensorflow_release(name, tf_pin, tf_row)
    if problems:
        return {"ok": False, "stack": None, "problems": problems, "warnings": []}
    if str(pin.get("cuda_source") or "runfile") not in CUDA_SOURCES:
        return {"ok": False, "stack": None, "problems": [], "warnings": []}  # _check_pin_values names it
    wheels = cuda_source(pin) == "wheels"
    tf = _tensorflow_record(pin, tf_row, wheels)
    python = {"path": pin.get("python") or host["default_python"], "version": str(host.get("python_version", ""))}
    cuda_pin = str(pin.get("cuda") or tf["built_cuda"])
    warnings = [] if wheels else _warn_known_bad(name, tf, matrix)
    warnings += _warn_cuda_minor(name, tf, cuda_pin) if _well_formed("cuda", cuda_pin) and not wheels else []

    # The steps run in this order, and report their problems in it.
    problems = _check_python(name, tf, tf_row, python["path"], python["version"], matrix)
    if wheels:
        cuda, cudnn, found = _resolve_wheels(name, pin, tf, python, matrix, host)
    else:
        cuda, cudnn, found = _resolve_runfile(name, pin, tf, matrix, manifest, host)
    problems += found
    problems += _check_compute_capability(name, tf, tf_row, host.get("gpus"))

    stack = _stack_record(pin, tf, python, cuda, cudnn)
    return {"ok": not problems, "stack": stack, "problems": problems, "warnings": warnings}


# --- all stacks of a host -------------------------------------------------------------------------


def _label(index: int, pin: dict) -> str:
    """The ``stack`` of a problem with one item of the list: its name, or ``stack #N`` without one."""
    return str(pin.get("name") or "").strip() or f"stack #{index + 1}"


def _check_pin_keys(index: int, pin: dict) -> list[Problem]:
    """Unknown keys (typos) and a missing ``name`` or ``tensorflow`` in one item of the list."""
    label = _label(index, pin)
    problems = []
    unknown = sorted(set(pin) - set(PIN_KEYS))
    if unknown:
        keys = ", ".join(map(repr, unknown))
        problems.append(_problem(label, "unknown_keys", keys=keys, allowed=", ".join(PIN_KEYS)))
    problems += [_problem(label, "missing_key", key=key) for key in ("name", "tensorflow") if not pin.get(key)]
    return problems


def _safe_name(name: Any) -> bool:
    """True for text of :data:`NAME_PATTERN`, at most :data:`NAME_MAX` characters."""
    return isinstance(name, str) and len(name) <= NAME_MAX and NAME_PATTERN.fullmatch(name) is not None


def _suggest_name(index: int, pin: dict) -> str:
    """A safe name for the item: its own name when safe; else that name without spaces, other
    unsafe characters as '-', no leading '.', '_' or '-', cut to 64; else ``tf<X.Y>`` or ``stack<N>``."""
    name = pin.get("name")
    if _safe_name(name):
        return name
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", re.sub(r"\s+", "", name)) if isinstance(name, str) else ""
    text = text.lstrip("._-")[:NAME_MAX].rstrip("-")
    if text:
        return text
    tensorflow = str(pin.get("tensorflow") or "")
    return f"tf{_series(tensorflow)}" if _well_formed("tensorflow", tensorflow) else f"stack{index + 1}"


def _check_name(label: str, index: int, pin: dict) -> list[Problem]:
    """The name is text, safe in file names, config files and JUnit class names (:data:`NAME_PATTERN`)."""
    name = pin.get("name")
    if not name or _safe_name(name):
        return []  # a missing name is missing_key's
    suggestion = _suggest_name(index, pin)
    if isinstance(name, str):
        return [_problem(label, "name_invalid", name=name, suggestion=suggestion)]
    # isinstance, not type(): Ansible hands over its own subclasses of float, int and bool.
    kind = next((text for cls, text in NOT_TEXT_KINDS.items() if isinstance(name, cls)), "a list or dict")
    return [_problem(label, "name_not_text", name=name, kind=kind, suggestion=suggestion)]


def _check_venv_path(label: str, venv: str, suggestion: str) -> list[Problem]:
    """An explicit venv is absolute, not a shared folder (:data:`SHARED_FOLDERS`), not in a CUDA tree."""
    if not venv:
        return []
    fields = {"venv": venv, "suggestion": suggestion, "root": DEFAULT_VENV_ROOT}
    if not venv.startswith("/"):
        return [_problem(label, "venv_not_absolute", **fields)]
    folder = _normal_path(venv)
    if folder in SHARED_FOLDERS:
        return [_problem(label, "venv_shared_folder", folder=folder, **fields)]
    if folder == CUDA_LINK or folder.startswith((CUDA_LINK + "/", CUDA_ROOT_PREFIX)):
        return [_problem(label, "venv_in_cuda_toolkit", link=CUDA_LINK, prefix=CUDA_ROOT_PREFIX, **fields)]
    return []


def _check_pin_values(index: int, pin: dict) -> list[Problem]:
    """The name, and the paths of one item: ``venv`` and ``python`` absolute, the venv a folder of its own.

    The version pins are checked where they are resolved (:func:`resolve_stack`)."""
    label = _label(index, pin)
    problems = _check_name(label, index, pin)
    venv_suggestion = f"{DEFAULT_VENV_ROOT}/{_suggest_name(index, pin)}"
    problems += _check_venv_path(label, str(pin.get("venv") or ""), venv_suggestion)
    python = str(pin.get("python") or "")
    if python and not python.startswith("/"):
        problems.append(_problem(label, "python_not_absolute", python=python))
    if pin.get("state", "present") not in STATES:
        problems.append(_problem(label, "state_invalid", state=pin.get("state")))
    if str(pin.get("cuda_source") or "runfile") not in CUDA_SOURCES:
        problems.append(_problem(label, "cuda_source_invalid", source=pin.get("cuda_source")))
    return problems


def _check_pins(pins: list[dict]) -> list[Problem]:
    """The list itself: not empty, and every item well formed."""
    problems = [] if pins else [_problem(HOST_WIDE, "no_stacks")]
    for index, pin in enumerate(pins):
        problems += _check_pin_keys(index, pin)
        problems += _check_pin_values(index, pin)
    return problems


def _check_duplicate_names(names: list[Any]) -> list[Problem]:
    """Names compared as the text they become in file names (a YAML number 1 is "1")."""
    texts = [str(n) for n in names]
    return [_problem(dup, "duplicate_name", name=dup) for dup in sorted({t for t in texts if texts.count(t) > 1})]


def _check_default(default: str, names: list[str], absent: list[str], current: str = "") -> list[Problem]:
    if default in absent:
        return [_problem(default, "default_absent", default=default)]
    if current in absent:
        return [_problem(current, "current_default_absent", current=current, default=default)]
    if not names and absent:
        return [_problem(HOST_WIDE, "no_present_stack")]
    if not names or default in names:
        return []
    return [_problem(default, "default_unknown", default=default, names=", ".join(map(str, names)))]


def _absent_paths(pin: dict, matrix: dict) -> tuple[str, str, list[Problem]]:
    """The toolkit tree and venv an absent stack was installed in, from its pins (the matrix gives
    the CUDA of a pin without ``cuda``); problems when they cannot be known."""
    name, tf_pin = pin["name"], str(pin["tensorflow"])
    if not _well_formed("tensorflow", tf_pin):
        return (
            "",
            "",
            [_problem(name, "tensorflow_pin_invalid", pin=tf_pin, known=_range_text(list(matrix["tensorflow"])))],
        )
    tf_row = matrix["tensorflow"].get(_series(tf_pin)) or {}
    if cuda_source(pin) == "wheels":
        return "", _normal_path(str(pin.get("venv") or f"{DEFAULT_VENV_ROOT}/{_series(tf_pin)}")), []
    cuda_pin = str(pin.get("cuda") or tf_row.get("cuda") or "")
    if not cuda_pin:
        return "", "", [_unknown_tensorflow(name, tf_pin, matrix)]
    if not _well_formed("cuda", cuda_pin):
        built = tf_row.get("cuda", "X.Y")
        return "", "", [_problem(name, "cuda_pin_invalid", pin=cuda_pin, series=_series(tf_pin), built=built)]
    venv = _normal_path(str(pin.get("venv") or f"{DEFAULT_VENV_ROOT}/{_series(tf_pin)}"))
    return CUDA_ROOT_PREFIX + _series(cuda_pin), venv, []


def _nested(one: str, other: str) -> bool:
    """``one`` and ``other`` are the same folder, or one holds the other."""
    return one == other or one.startswith(other.rstrip("/") + "/") or other.startswith(one.rstrip("/") + "/")


def _absent_stack(pin: dict, matrix: dict, stacks: list[dict]) -> tuple[dict | None, list[Problem]]:
    """What removing an absent stack removes: ``{name, venv, cuda_root, remove_toolkit}``. The
    toolkit tree goes only when no present stack uses it; the venv never when it is, holds or sits
    inside a present stack's venv."""
    root, venv, problems = _absent_paths(pin, matrix)
    if problems:
        return None, problems
    users = [s["name"] for s in stacks if _nested(_normal_path(str(s["venv"])), venv)]
    if users:
        return None, [_problem(pin["name"], "absent_venv_in_use", name=pin["name"], venv=venv, user=users[0])]
    in_use = {tree_root(s) for s in stacks}
    return {
        "name": pin["name"],
        "venv": venv,
        "cuda_root": root,
        "remove_toolkit": bool(root) and root not in in_use,
    }, []


def _resolve_absent(pins: list[dict], matrix: dict, stacks: list[dict]) -> tuple[list[dict], list[Problem]]:
    absent, problems = [], []
    for pin in pins:
        record, found = _absent_stack(pin, matrix, stacks)
        problems += found
        absent += [record] if record else []
    return absent, problems


def _pick_driver(manifest: dict, host: dict) -> tuple[dict | None, list[Problem]]:
    """The driver the host gets (``driver_install``) and its runfile, unless it comes from packages
    (``driver_method: package`` or ``distribution``: no runfile, so none is needed in the manifest)."""
    driver_text = str(host.get("driver_version") or "")
    if not (host.get("driver_install") and driver_text):
        return None, []
    if host.get("driver_method") in PACKAGE_METHODS:
        return {"version": driver_text, "runfile": None}, []
    picked = _pick_artifact(manifest, "nvidia_driver", driver_text)
    if picked is None or str(picked[1]["version"]) != driver_text:
        return None, [_problem(HOST_WIDE, "driver_runfile_missing", driver=driver_text)]
    driver = {"version": driver_text, "runfile": _artifact_record(*picked)}
    return driver, _check_checksums(HOST_WIDE, [("driver", driver["runfile"])])


def _resolve_each(
    pins: list[dict], matrix: dict, manifest: dict, host: dict, default: str
) -> tuple[list[dict], list[Problem], list[Problem]]:
    """:func:`resolve_stack` for every pin, each with its own interpreter's version."""
    python_versions = host.get("python_versions") or {}
    stacks: list[dict] = []
    problems: list[Problem] = []
    warnings: list[Problem] = []
    for pin in pins:
        one_host = dict(host, python_version=python_versions.get(pin.get("python") or host["default_python"], ""))
        result = resolve_stack(pin, matrix, manifest, one_host)
        problems += result["problems"]
        warnings += result["warnings"]
        if result["stack"]:
            stacks.append(dict(result["stack"], default=result["stack"]["name"] == default))
    return stacks, problems, warnings


def tree_root(stack: dict) -> str | None:
    """The toolkit tree the stack's CUDA lives in (``/usr/local/cuda-X.Y``); None for a stack whose CUDA comes from
    wheels in its venv, or whose CUDA did not resolve."""
    return (stack.get("cuda_toolkit") or {}).get("root")


def _check_shared_tree(stack: dict, other: dict) -> list[Problem]:
    """``stack`` and ``other`` use the same toolkit tree: same CUDA release, same cuDNN in it."""
    if other is stack:
        return []
    problems = []
    for key, message in SHARED_TREE:
        mine, theirs = stack[key], other[key]
        if mine and theirs and mine["version"] != theirs["version"]:
            versions = {"first_version": theirs["version"], "second_version": mine["version"]}
            fields = {"first": other["name"], "second": stack["name"], "root": stack["cuda_toolkit"]["root"]}
            problems.append(_problem(stack["name"], message, **fields, **versions))
    return problems


def _unify_cudnn(stacks: list[dict]) -> tuple[list[dict], list[Problem]]:
    """Stacks that share a toolkit tree share the cuDNN copied into it: when their cuDNN pins differ
    within one major, every one of them gets the highest, with a warning. Pins of
    different majors stay as they are, for :func:`_check_shared_tree` to refuse."""
    groups: dict[str, list[int]] = {}
    for index, stack in enumerate(stacks):
        if tree_root(stack) and stack["cudnn"]:
            groups.setdefault(tree_root(stack), []).append(index)
    chosen: dict[int, dict] = {}
    warnings = []
    for root, members in groups.items():
        records = [stacks[i]["cudnn"] for i in members]
        versions = {r["version"] for r in records}
        if len(versions) < 2 or len({_int_parts(v)[0] for v in versions}) > 1:
            continue
        best = max(records, key=lambda record: _v(record["version"]))
        chosen.update(dict.fromkeys(members, best))
        names = ", ".join(str(stacks[i]["name"]) for i in members)
        fields = {"names": names, "root": root, "version": best["version"], "short": best["short"]}
        pinned = ", ".join(sorted(versions, key=_v))
        warnings.append(_problem(stacks[members[0]]["name"], "cudnn_unified", pinned=pinned, **fields))
    return [dict(s, cudnn=chosen[i]) if i in chosen else s for i, s in enumerate(stacks)], warnings


def _check_side_by_side(stacks: list[dict]) -> list[Problem]:
    """One toolkit tree per CUDA X.Y, one cuDNN per tree, one stack per venv (explicit or the
    default ``/opt/tensorflow/X.Y``, compared normalised: ``/srv/tf/`` is ``/srv/tf``)."""
    problems = []
    by_root: dict[str, dict] = {}
    by_venv: dict[str, str] = {}
    for stack in stacks:
        if tree_root(stack):
            problems += _check_shared_tree(stack, by_root.setdefault(tree_root(stack), stack))
        venv = _normal_path(str(stack["venv"]))
        if venv in by_venv:
            suggestion = f"{DEFAULT_VENV_ROOT}/{stack['name']}"
            fields = {"first": by_venv[venv], "second": stack["name"], "venv": venv, "suggestion": suggestion}
            problems.append(_problem(stack["name"], "shared_venv", **fields))
        by_venv.setdefault(venv, stack["name"])
    return problems


def resolve_stacks(pins: list[dict], matrix: dict, manifest: dict, host: dict, default: str = "") -> dict:
    """Resolve every stack of a host and check that they can live side by side.

    Args:
        pins: list of stack pins (see :func:`resolve_stack`); each item's keys, name, venv and python
            path are checked first (:func:`_check_pins`), its versions as it resolves.
        matrix, manifest: as for :func:`resolve_stack`.
        host: as for :func:`resolve_stack`, plus ``python_versions: {path: 'X.Y.Z'}`` giving the
            version of each stack's interpreter, ``driver_install: bool`` (the run installs the
            driver) and ``driver_method`` (``runfile``, the default: the manifest must have its
            runfile; ``package``: the driver's ``runfile`` is None) and ``current_default``, the stack the
            host serves as its default now (may not be removed in this run, see :func:`serve_default`).
        default: name of the default stack (owns ``/usr/local/cuda`` and the system library path);
            empty means the first stack.

    Returns:
        ``{ok, stacks: [stack...], absent: [{name, venv, cuda_root, remove_toolkit}], default: name,
        driver: {version, runfile} | None, problems, warnings,
        messages: ['<stack>: <cause> <fix>', ...]}``; ``stacks`` holds only resolved stacks of
        ``state: present`` (the default), each with ``default: bool``; ``absent`` what removing each
        ``state: absent`` stack removes (its toolkit tree only when no present stack uses it).
    """
    problems = _check_pins(pins)
    pins = [p for p in pins if p.get("name") and p.get("tensorflow")]
    problems += _check_duplicate_names([p.get("name") for p in pins])
    absent_pins = [p for p in pins if p.get("state") == "absent"]
    pins = [p for p in pins if p.get("state") != "absent"]
    names = [p.get("name") for p in pins]
    default = default or (names[0] if names else "")
    absent_names = [p.get("name") for p in absent_pins]
    problems += _check_default(default, names, absent_names, str(host.get("current_default") or ""))
    driver_text = str(host.get("driver_version") or "")
    if driver_text and not VERSION_FORMS["driver"].fullmatch(driver_text):
        problems.append(_problem(HOST_WIDE, "driver_pin_invalid", pin=driver_text))
        host = {**host, "driver_version": ""}  # nothing more to say about a driver that is no version
    driver, found = _pick_driver(manifest, host)
    problems += found
    stacks, found, warnings = _resolve_each(pins, matrix, manifest, host, default)
    problems += found
    stacks, found = _unify_cudnn(stacks)
    warnings += found
    problems += _check_side_by_side(stacks)
    absent, found = _resolve_absent(absent_pins, matrix, stacks)
    problems += found
    return {
        "ok": not problems,
        "stacks": stacks,
        "absent": absent,
        "default": default,
        "driver": driver,
        "problems": problems,
        "warnings": warnings,
        "messages": [_message(p) for p in problems],
    }


def stacks_unresolved(role: str) -> str:
    """Why ``role`` stops when no earlier task of the run published the resolved stacks, and the fix."""
    return (
        f"{role} reads the pinned stacks (gpu_preflight_resolved_stacks, the stack model), and no earlier task "
        "of this run published them. Resolve them first, in the play's pre_tasks, as the collection's playbooks "
        "do: an include_tasks of the collection's playbooks/tasks/stacks.yml (the action gpu_fleet.tf_hosts.gpu_stacks "
        "and the task that publishes its model), with file: \"{{ lookup('gpu_fleet.tf_hosts.collection_path', "
        "'playbooks/tasks/stacks.yml') }}\" from an installed collection. With --tags, tag that task `always`, "
        "with apply: {tags: [always]}."
    )


def stacks_required(stacks: list[dict] | None, role: str) -> list[dict]:
    """The resolved stacks ``role`` reads; raises :func:`stacks_unresolved`'s message when none were published.
    The roles of :data:`TREE_ROLES` read only the stacks whose CUDA lives in a toolkit tree (not from wheels).

    Read where the role first reads the stacks, so that a role run before the stacks are resolved stops there, before
    any change, without a task of its own.
    """
    if stacks is None:
        raise AnsibleFilterError(stacks_unresolved(role))
    if role in TREE_ROLES:
        return [stack for stack in stacks if tree_root(stack)]
    return stacks


def stacks_hosts_to_resolve(hosts: list[str], hostvars: Any) -> list[str]:
    """The hosts of ``hosts`` (in their order) that no earlier play of the run published the stack model for:
    a phase playbook's first play resolves it for them alone, and in site.yml, whose preflight resolved it,
    for none (a play without hosts prints no task). ``hostvars`` is empty for the run's first play, whose
    keywords are templated before Ansible defines it: no play ran before, so every host needs the model."""
    return [host for host in hosts if host not in hostvars or "gpu_preflight_resolved_stacks" not in hostvars[host]]


def serve_default(stacks: list[dict], current: str = "") -> dict:
    """Which stack a host's default pointers serve in this run, and which switch waits.

    ``/usr/local/cuda``, ``PATH`` and the system library path move to a newly declared default only
    after it passed verification on the host: until then they keep serving the
    host's current default, when that is one of the present stacks.

    Args:
        stacks: resolved stacks (:func:`resolve_stacks`); the declared default is the one with
            ``declared_default`` (set here) or, the first time, ``default``.
        current: name of the stack the host serves now (``/etc/tf-stacks/default``), or the stack
            to serve from now on (the switch after verification, or back after a failed one). A
            name that is no present stack serves the declared default (or, when that was held
            back, the first stack).

    Returns:
        ``{stacks, default, pending}``: the stacks with ``default`` true for the served one and
        ``declared_default`` true for the declared one; the served stack; the declared stack while
        the switch to it waits, else None.
    """
    if not stacks:
        return {"stacks": [], "default": None, "pending": None}
    # No declared default among them when it was held back (the action gpu_stacks, option hold_back).
    declared = next((s["name"] for s in stacks if s.get("declared_default", s.get("default"))), None)
    names = [s["name"] for s in stacks]
    served = current if current in names else (declared or names[0])
    marked = [{**s, "default": s["name"] == served, "declared_default": s["name"] == declared} for s in stacks]
    return {
        "stacks": marked,
        "default": next(s for s in marked if s["default"]),
        "pending": next((s for s in marked if s["declared_default"] and not s["default"]), None),
    }


def cudnn_header_version(text: str) -> str:
    """Version 'X.Y.Z' from the text of ``cudnn_version.h`` (``CUDNN_MAJOR``, ``CUDNN_MINOR``,
    ``CUDNN_PATCHLEVEL`` macros, cuDNN 8 and 9; TensorFlow's ``third_party/gpus/find_cuda_config.py``
    reads the same three), or '' when they are missing."""
    found = dict(re.findall(r"^\s*#\s*define\s+CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", text or "", re.M))
    if len(found) != 3:
        return ""
    return f"{found['MAJOR']}.{found['MINOR']}.{found['PATCHLEVEL']}"


def tf_requirement(tensorflow: dict, default_package: str = "tensorflow") -> str:
    """pip requirement of a resolved stack's TensorFlow: ``'tensorflow-cpu==2.12.1'``.

    ``tensorflow`` is the stack's ``tensorflow`` record; ``default_package`` is used when the stack
    names no package (``tf_venv_package``)."""
    return f"{tensorflow.get('package') or default_package}=={tensorflow['version']}"


def gpu_stacks_resolve(pins: list[dict], matrix: dict, manifest: dict, host: dict, default: str = "") -> dict:
    """Ansible filter: ``{{ pins | gpu_stacks_resolve(matrix, manifest, host, default) }}``."""
    if PACKAGING_ERROR is not None:
        raise AnsibleFilterError(
            f"gpu_stacks_resolve needs the Python package packaging, a dependency of ansible-core: {PACKAGING_ERROR}"
        )
    return resolve_stacks(pins, matrix, manifest, host, default)


def stacks_host(facts: dict, pins: dict) -> dict:
    """``{{ ansible_facts | gpu_stacks_host(pins) }}``: the ``host`` of :func:`gpu_stacks_resolve`.

    ``pins``: ``python_versions``, ``default_python``, ``driver_version`` (the pinned driver),
    ``driver_install``, ``driver_method`` and ``current_default``. The stacks are checked against the
    driver the host will run: the pinned one when the run installs it, else the loaded one (none when
    no driver is loaded or the GPU facts were not gathered, as for an air-gap bundle)."""
    gpu_facts = (facts or {}).get("gpu_facts") or {}
    install = boolean(pins.get("driver_install"), strict=False)
    return {
        "python_versions": pins.get("python_versions") or {},
        "default_python": pins.get("default_python"),
        "driver_version": pins.get("driver_version") if install else (gpu_facts.get("driver_version") or ""),
        "driver_install": install,
        "driver_method": pins.get("driver_method"),
        "current_default": pins.get("current_default") or "",
        "gpus": gpu_facts.get("gpus") or [],
    }


class FilterModule:
    """GPU stack resolution filters."""

    def filters(self) -> dict:
        return {
            "gpu_stacks_resolve": gpu_stacks_resolve,
            "gpu_stacks_host": stacks_host,
            "cudnn_header_version": cudnn_header_version,
            "gpu_tf_requirement": tf_requirement,
            "gpu_stacks_serve": serve_default,
            "gpu_stacks_unresolved": stacks_unresolved,
            "gpu_stacks_required": stacks_required,
            "gpu_stacks_hosts_to_resolve": stacks_hosts_to_resolve,
        }
