"""Load the CUDA driver API, CUDA runtime and cuDNN through ctypes and check their versions.

What is loaded and how the version is read:

* ``libcuda.so.1`` (installed by the NVIDIA driver): ``cuDriverGetVersion(int*)``; the value is
  the newest CUDA version the driver supports, e.g. 11080.
* ``libcudart.so.11.0`` / ``.so.12`` / ``.so.13`` (CUDA toolkit; the soname carries only the major
  version from CUDA 11 on): ``cudaRuntimeGetVersion(int*)``, e.g. 11080.  The runtime starts the
  driver first, so without a usable GPU the call fails (100, cudaErrorNoDevice; 35,
  cudaErrorInsufficientDriver, without a driver) and gives nothing: the version then comes from
  the real file's name, which NVIDIA gives the full version (``libcudart.so.11.8.89`` in the
  toolkit's ``lib64``), and the record's ``note`` says what the error means.  No device is never a
  failure here: a host verified with ``--cpu-replicas`` has none on purpose, and on a GPU host
  gpu_verify's GPU count check fails already.
* ``libcudnn.so.<major>``: ``cudnnGetVersion()`` returns ``size_t``.  cuDNN 8 encodes
  ``major*1000 + minor*100 + patch`` and cuDNN 9 ``major*10000 + minor*100 + patch``
  (the ``CUDNN_VERSION`` macro of cuDNN's ``cudnn_version.h``, shipped in the cuDNN tar archive and
  the ``nvidia-cudnn-cu*`` wheels).

CUDA version integers decode as ``major = v // 1000``, ``minor = (v % 1000) // 10`` (11080 ->
"11.8"), the encoding used by ``cudaRuntimeGetVersion``/``cuDriverGetVersion`` in the CUDA
runtime API reference.

The loads and calls run in a child process of the same interpreter (this script with a hidden
``--probe`` option, :func:`run_probe`), which reports each library as soon as it has it: cuDNN calls
abort() when it cannot load one of its sub-libraries (``Could not load library
libcudnn_ops_infer.so.8. Error: libnvrtc.so: ...``), and a library may hang.  Such a library's record
and problem say so and name what it could not load; the ones probed before it keep their records,
and this script still prints its document.

Libraries are found the way every process finds them (``LD_LIBRARY_PATH``, the ``ldconfig``
cache built from ``/etc/ld.so.conf.d``); the file really mapped is read back from
``/proc/self/maps`` (with ``dladdr`` to pick one when several copies are mapped).  TensorFlow
wheels can also use their own RUNPATH to pip-installed NVIDIA libraries (``$ORIGIN/../nvidia/<pkg>/lib``,
set by ``cuda_rpath_flags`` in openxla/xla ``xla/tsl/platform/default/cuda_build_defs.bzl``),
so ``fit.py`` additionally reports what TensorFlow itself mapped (:func:`mapped_library_versions`).

A stack whose CUDA comes from NVIDIA's wheels (``--cuda-source wheels``, ``tensorflow[and-cuda]``) has no
toolkit folder: libcudart and libcudnn are loaded as TensorFlow's RUNPATH finds them (``LD_LIBRARY_PATH``
first, then the wheels' ``--library-dir`` folders) and every libcudart, libcublas(Lt) and libcudnn mapped
must be one of those folders' files (:func:`check_wheel_libraries`, ``wheels.py``).

``tensorflow_build_info()`` imports TensorFlow lazily and compares its build with the loaded
libraries using TensorFlow's cuDNN rule (``cuda_dnn.cc``, quoted in tensorflow/tensorflow issue #62626,
https://github.com/tensorflow/tensorflow/issues/62626): "CuDNN
library needs to have matching major version and equal or higher minor version."

Exit codes: 0 all checks passed, 1 a check failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import wheels
from verify_common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    Problem,
    dumps,
    parse_version,
    problem,
    tail,
)

# Names of CUresult values worth spelling out (CUDA driver API reference, "Error Handling").
CUDA_DRIVER_ERRORS = {
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}

# cudaError_t values the version call returns without a working driver and device, with NVIDIA's
# names and texts (CUDA Runtime API reference, "Data types used by CUDA Runtime", enum cudaError;
# the same words cudaGetErrorName/cudaGetErrorString give): used where the runtime does not
# export those two functions.  The driver API's CUresult has the same numbers for these.
CUDA_ERROR_STUB_LIBRARY = 34
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_RUNTIME_ERRORS = {
    3: ("cudaErrorInitializationError", "initialization error"),
    CUDA_ERROR_STUB_LIBRARY: ("cudaErrorStubLibrary", "CUDA driver is a stub library"),
    CUDA_ERROR_INSUFFICIENT_DRIVER: (
        "cudaErrorInsufficientDriver",
        "CUDA driver version is insufficient for CUDA runtime version",
    ),
    CUDA_ERROR_NO_DEVICE: ("cudaErrorNoDevice", "no CUDA-capable device is detected"),
    999: ("cudaErrorUnknown", "unknown error"),
}
# What a failed cudaRuntimeGetVersion means for the host (the note of the libcudart record).
RUNTIME_CALL_MEANINGS = {
    CUDA_ERROR_NO_DEVICE: (
        "no usable GPU or driver (the driver sees no CUDA device: kernel module not loaded, GPU not "
        "passed into the container, or no GPU)"
    ),
    CUDA_ERROR_INSUFFICIENT_DRIVER: "no NVIDIA driver (libcuda.so.1 could not be loaded) or one too old for this runtime",
    CUDA_ERROR_STUB_LIBRARY: "the libcuda.so.1 loaded is the CUDA toolkit's stub, not the driver's",
}
RUNTIME_CALL_OTHER = "the CUDA runtime could not start the driver"
# What each library is called in the problems.
LIBRARY_LABELS = {"libcuda": "CUDA driver library", "libcudart": "CUDA runtime", "libcudnn": "cuDNN"}
# The role that installs each library.
LIBRARY_ROLES = {"libcuda": "nvidia_driver", "libcudart": "cuda_toolkit", "libcudnn": "cudnn"}
# cuDNN's own words on stderr before it calls abort(), e.g. "Could not load library
# libcudnn_ops_infer.so.8. Error: libnvrtc.so: cannot open shared object file: No such file or directory"
# (the second part is dlerror()'s text, glibc's "cannot open shared object file").
COULD_NOT_LOAD = re.compile(r"Could not load library (\S+?)\.? Error: ([^\n]+)")
MISSING_FILE = re.compile(r"(\S+?): cannot open shared object file")
# The hidden option that makes this script the probe process (:func:`probe_child`), and how long
# the probe may take: loading cuDNN and cuBLAS (over 600 MB) from a cold disk takes seconds.
PROBE_OPTION = "--probe"
PROBE_TIMEOUT_SECONDS = 120.0
PROBE_KILL_WAIT_SECONDS = 5.0
# The fields of a probe record that mapped_library_versions reports per file.
MAPPED_FIELDS = ("raw", "version", "error", "release", "version_source", "call_error", "note")
# version_source of a libcudart version read from the wheel that installed the file (its dist-info).
WHEEL_SOURCE = "wheel metadata"
# Where a stack's CUDA comes from (the stack record's cuda_toolkit.source): NVIDIA's runfile tree, or NVIDIA's
# wheels in the venv (tensorflow[and-cuda], wheels.py).
CUDA_SOURCES = ("runfile", "wheels")

LD_SO_CONF_D = "/etc/ld.so.conf.d"
# Folders the loader searches after the ld.so.conf ones (glibc's trusted directories on x86_64;
# ld.so(8), "the default path").
TRUSTED_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
# Files that set environment variables for login shells only (sourced by /etc/profile, or read by
# pam_env): services, cron, sudo's secure environment and `ansible` commands never see them.
LOGIN_ONLY_FILES = ("/etc/profile", "/etc/profile.d/*.sh", "/etc/bash.bashrc", "/etc/environment")
# CUDA toolkit libraries whose soname carries the CUDA major version (libcudart.so.11.0,
# libcublas.so.12, ...); two majors in one process means two toolkits were mixed.
CUDA_MAJOR_LIBRARIES = ("libcudart", "libcublas", "libcublasLt", "libcufft", "libcurand", "libcusolver", "libcusparse")


# --- pure decoding and naming -------------------------------------------------------------


def decode_cuda_version(raw: int) -> str:
    """CUDA version integer to ``"major.minor"``: 11080 -> "11.8", 12020 -> "12.2"."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def decode_cudnn_version(raw: int) -> str:
    """``cudnnGetVersion()`` value to ``"major.minor.patch"``: 8600 -> "8.6.0", 90300 -> "9.3.0".

    cuDNN <= 8 uses ``*1000`` and cuDNN >= 9 ``*10000`` (``CUDNN_VERSION`` in ``cudnn_version.h``); the ranges do not
    overlap (8.x < 10000 <= 9.x), so the value itself says which formula applies.
    """
    if raw >= 10000:
        return f"{raw // 10000}.{(raw % 10000) // 100}.{raw % 100}"
    return f"{raw // 1000}.{(raw % 1000) // 100}.{raw % 100}"


LIBRARY_KINDS: dict[str, tuple[str, Callable[[int], str]]] = {
    "libcuda": ("cuDriverGetVersion", decode_cuda_version),
    "libcudart": ("cudaRuntimeGetVersion", decode_cuda_version),
    "libcudnn": ("cudnnGetVersion", decode_cudnn_version),
}


def cudart_soname(cuda: str) -> str:
    """Soname of the CUDA runtime for CUDA ``"X.Y"``: 11.x -> libcudart.so.11.0, 12.x -> .so.12,
    13.x -> .so.13 (the toolkit's ``lib64/`` symlink names); 10.x and older carry major.minor.

    Raises:
        ValueError: ``cuda`` is not ``X.Y``.
    """
    major, minor = parse_version(cuda, 2, "CUDA version")
    if major == 11:
        return "libcudart.so.11.0"
    if major >= 12:
        return f"libcudart.so.{major}"
    return f"libcudart.so.{major}.{minor}"


def cudnn_soname(cudnn: str) -> str:
    """Soname of cuDNN for version ``"X.Y.Z"`` (or ``"X"``): ``libcudnn.so.<X>``.

    Raises:
        ValueError: ``cudnn`` does not start with an integer major version.
    """
    (major,) = parse_version(cudnn, 1, "cuDNN version")
    return f"libcudnn.so.{major}"


def soname_stem(soname: str) -> str:
    """``libcudart.so.11.0`` -> ``libcudart.so`` (the prefix every file of the library shares)."""
    return soname.split(".so", 1)[0] + ".so"


def paths_from_maps(maps_text: str, stem: str) -> list[str]:
    """Distinct file paths in ``/proc/<pid>/maps`` text whose basename is ``stem`` or
    ``stem.<anything>`` (``libcudnn.so`` matches ``libcudnn.so.8.6.0``, not
    ``libcudnn_ops_infer.so.8``), in order of first appearance."""
    found: list[str] = []
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue
        path = fields[5].strip()
        # str.removesuffix is Python 3.9+; hosts may run 3.8.
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        base = os.path.basename(path)
        if (base == stem or base.startswith(stem + ".")) and path not in found:
            found.append(path)
    return found


def ld_so_conf_dirs(conf_dir: str = LD_SO_CONF_D) -> dict[str, list[str]]:
    """Directories listed in each ``*.conf`` file of ``conf_dir`` (what ``ldconfig`` caches)."""
    result: dict[str, list[str]] = {}
    for conf in sorted(glob.glob(os.path.join(conf_dir, "*.conf"))):
        try:
            with open(conf, encoding="utf-8", errors="replace") as handle:
                lines = [ln.split("#", 1)[0].strip() for ln in handle]
        except OSError:
            continue
        result[os.path.basename(conf)] = [ln for ln in lines if ln and not ln.startswith("include")]
    return result


def search_places_text(ld_library_path: str | None, conf: dict[str, list[str]]) -> str:
    """One-line description of where the dynamic loader looked."""
    conf_text = "; ".join(f"{name}: {', '.join(dirs) or '(empty)'}" for name, dirs in conf.items())
    return f"LD_LIBRARY_PATH={ld_library_path or '(unset)'}; {LD_SO_CONF_D}: {conf_text or '(no .conf files)'}"


def load_failure_problem(
    check: str,
    soname: str,
    error: str,
    ld_library_path: str | None,
    conf: dict[str, list[str]],
    found_elsewhere: str | None = None,
    login_only: Sequence[str] = (),
) -> Problem:
    """Problem for a library dlopen could not load: names the soname, the error and the places.

    ``found_elsewhere`` is a path where the library does exist although the loader did not find it
    (the stack's toolkit folder, see :func:`find_off_path`); ``login_only`` the login-shell files
    that add its folder to ``LD_LIBRARY_PATH`` (see :func:`login_only_mentions`).  Both make the
    cause precise: installed, but not on the loader path of non-login processes.
    """
    places = search_places_text(ld_library_path, conf)
    cause = f"Cannot load {soname}: {error} (looked in {places})."
    if found_elsewhere:
        folder = os.path.dirname(found_elsewhere)
        cause += f" It is installed at {found_elsewhere}, but {folder} is not on the loader path"
        if login_only:
            cause += (
                f": only {', '.join(login_only)} add it (LD_LIBRARY_PATH), which login shells read and "
                "services, cron, sudo and Ansible commands do not"
            )
        cause += "."
        fix = (
            f"list {folder} in a file under {LD_SO_CONF_D}/ (the gpu_env role writes gpu-env.conf; rerun "
            "playbooks/cuda.yml or site.yml) and run `ldconfig`; `ldconfig -p | grep "
            f"{soname_stem(soname)}` must then show it"
        )
    elif check == "libcuda":
        fix = (
            "install/repair the NVIDIA driver (nvidia_driver role): libcuda.so.1 comes with the driver, not the "
            "toolkit; then run `ldconfig` and check `ldconfig -p | grep libcuda`"
        )
    else:
        fix = (
            f"install the library (cuda_toolkit/cudnn roles), list its folder in a file under "
            f"{LD_SO_CONF_D}/ (gpu_env role) and run `ldconfig`; `ldconfig -p | grep "
            f"{soname_stem(soname)}` shows what the loader sees"
        )
    return problem(check, cause, fix)


def find_off_path(soname: str, folders: Sequence[str]) -> str | None:
    """First ``<folder>/<soname>`` that exists (the library is installed there), or None."""
    for folder in folders:
        candidate = os.path.join(folder, soname)
        if os.path.exists(candidate):
            return candidate
    return None


def login_only_mentions(folder: str, patterns: Sequence[str] = LOGIN_ONLY_FILES) -> list[str]:
    """Login-shell files (``patterns`` are globs) whose text names ``folder`` (or its realpath)."""
    names = {folder.rstrip("/"), os.path.realpath(folder)}
    found: list[str] = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
            except OSError:
                continue
            if any(name and name in text for name in names):
                found.append(path)
    return found


def loader_search_order(ld_library_path: str | None, conf: dict[str, list[str]]) -> list[tuple[str, str]]:
    """Folders in the order the dynamic loader searches them, each with where it came from:
    ``LD_LIBRARY_PATH`` entries, then the ``ld.so.conf.d`` files in name order (earlier folders win
    in the ``ldconfig`` cache), then the trusted folders.  Returns ``[(folder, source), ...]``
    without repeats."""
    order: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(folder: str, source: str) -> None:
        folder = folder.rstrip("/") or "/"
        if folder and folder not in seen:
            seen.add(folder)
            order.append((folder, source))

    for folder in (ld_library_path or "").split(":"):
        if folder:
            add(folder, "LD_LIBRARY_PATH")
    for name, folders in conf.items():
        for folder in folders:
            add(folder, f"{LD_SO_CONF_D}/{name}")
    for folder in TRUSTED_DIRS:
        add(folder, "default path")
    return order


def soname_major(filename: str) -> int | None:
    """CUDA major version in a toolkit library file name: ``libcudart.so.11.0`` / ``libcudart.so.11.8.89``
    -> 11, ``libcublas.so.12`` -> 12; None without a numeric suffix."""
    suffix = os.path.basename(filename).partition(".so.")[2]
    head = suffix.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def runtime_shadow_problems(
    expect_cuda: str | None,
    search_order: Sequence[tuple[str, str]],
    listdir: Callable[[str], list[str]] = os.listdir,
) -> list[Problem]:
    """A CUDA runtime of another major in a folder the loader searches before the pinned toolkit's.

    The sonames differ per major (``libcudart.so.11.0`` vs ``.so.12``), so the pinned runtime still
    loads; but every library both toolkits ship under one soname (``libcudnn.so.8``,
    ``libnccl.so.2``, ``libcupti``...) and every ``dlopen("libcudart.so")`` then come from the other
    toolkit, and a process ends up with CUDA 11 and CUDA 12 libraries together.

    ``search_order`` is :func:`loader_search_order`'s result.  Only a folder *before* the one that
    holds the pinned runtime counts, so a second stack's toolkit listed after the default one is
    not a problem.
    """
    if not expect_cuda:
        return []
    want_major = parse_version(expect_cuda, 2, "CUDA version")[0]
    pinned = cudart_soname(expect_cuda)
    earlier: list[tuple[str, str, int]] = []
    for folder, source in search_order:
        try:
            names = listdir(folder)
        except OSError:
            continue
        if pinned in names:
            break
        for name in sorted(names):
            major = soname_major(name) if name.startswith("libcudart.so.") else None
            if major is not None and major != want_major:
                earlier.append((os.path.join(folder, name), source, major))
                break
    else:
        return []  # the pinned runtime is not on the path at all: load_library reports that
    return [
        problem(
            "libcudart",
            f"CUDA {major} runtime {path} (from {source}) comes before the pinned CUDA {expect_cuda} "
            f"({pinned}) on the library path: libraries both toolkits ship under one soname (libcudnn, "
            f'libnccl, libcupti) and dlopen("libcudart.so") load from the CUDA {major} folder, mixing '
            f"CUDA {major} and CUDA {want_major} in one process.",
            f"remove {os.path.dirname(path)} from {source} (or list it after the stack's toolkit), run "
            "`ldconfig`; the gpu_env role writes the stack's own entry",
        )
        for path, source, major in earlier
    ]


def cuda_library_paths(maps_text: str) -> list[str]:
    """Files of the :data:`CUDA_MAJOR_LIBRARIES` mapped in ``/proc/<pid>/maps`` text."""
    return [path for stem in CUDA_MAJOR_LIBRARIES for path in paths_from_maps(maps_text, stem + ".so")]


def mixed_cuda_major_problems(paths: Sequence[str]) -> list[Problem]:
    """Toolkit library files of two or more CUDA majors loaded in one process (``paths``, e.g. from
    :func:`cuda_library_paths`), e.g. ``libcudart.so.11.0`` next to ``libcublas.so.12``: a failure,
    whatever loaded them. Only the :data:`CUDA_MAJOR_LIBRARIES` count: the driver's
    ``libcuda.so.520.61.05`` and cuDNN's ``libcudnn.so.8.6.0`` carry their own versions, not CUDA's."""
    by_major: dict[int, list[str]] = {}
    for path in paths:
        if os.path.basename(path).split(".so", 1)[0] not in CUDA_MAJOR_LIBRARIES:
            continue
        major = soname_major(path)
        if major is not None and path not in by_major.get(major, []):
            by_major.setdefault(major, []).append(path)
    if len(by_major) < 2:
        return []
    listing = "; ".join(f"CUDA {major}: {', '.join(paths)}" for major, paths in sorted(by_major.items()))
    return [
        problem(
            "libraries",
            f"CUDA libraries of {len(by_major)} major versions are loaded in one process ({listing}).",
            "keep one toolkit per process: remove the other toolkit's folder from LD_LIBRARY_PATH and "
            f"{LD_SO_CONF_D}/, or the venv's nvidia-* wheels of the other CUDA major, then run `ldconfig`",
        )
    ]


# --- comparisons (pure) ----------------------------------------------------------------


def compare_cudart(record: dict[str, Any], expected_cuda: str | None, fix: str | None = None) -> list[Problem]:
    """libcudart major.minor must equal the pinned CUDA ``"X.Y"``; ``fix``: the fix of a wheels stack
    (:data:`WHEEL_VERSION_FIX`), the runfile tree's otherwise."""
    if not expected_cuda or not record.get("ok"):
        return []
    want = parse_version(expected_cuda, 2, "CUDA version")
    have = parse_version(record["version"], 2)
    if have == want:
        return []
    return [
        problem(
            "libcudart",
            f"CUDA runtime {record['soname']} at {record['path']} is {record['version']}, the stack "
            f"pins {expected_cuda}.",
            fix
            or "another toolkit comes first on the loader path: make the stack's "
            "/usr/local/cuda-X.Y/lib64 win in LD_LIBRARY_PATH and /etc/ld.so.conf.d (gpu_env "
            "role), run `ldconfig`, or fix the pin",
        )
    ]


def pinned_copy(
    soname: str, install_dirs: Sequence[str], realpath: Callable[[str], str] = os.path.realpath
) -> tuple[str, str | None] | None:
    """The stack's own copy of ``soname``: ``(real file, version from its name)`` for the first
    ``<install_dir>/<soname>`` that exists (``libcudnn.so.8.6.0`` -> ``"8.6.0"``; None where the name
    carries no version), or None when no install dir has it."""
    found = find_off_path(soname, install_dirs)
    if found is None:
        return None
    real = realpath(found)
    return real, os.path.basename(real).partition(".so.")[2] or None


def _loader_source(folder: str, search_order: Sequence[tuple[str, str]]) -> str:
    """What puts ``folder`` on the loader path (:func:`loader_search_order`'s sources)."""
    for place, source in search_order:
        if place == folder.rstrip("/"):
            return source
    return "none of LD_LIBRARY_PATH, /etc/ld.so.conf.d or the default folders (an RPATH/RUNPATH?)"


def _as_listed(path: str, search_order: Sequence[tuple[str, str]]) -> str:
    """``path``'s folder as the loader path names it: ``ldconfig -p`` prints the configured folder
    (CUDA's ``lib64``), not the one links resolve to (``targets/x86_64-linux/lib``)."""
    real = os.path.realpath(os.path.dirname(path))
    return next((place for place, _source in search_order if os.path.realpath(place) == real), os.path.dirname(path))


def stale_ahead_problem(
    record: dict[str, Any],
    expected_cudnn: str,
    pinned: tuple[str, str | None],
    search_order: Sequence[tuple[str, str]],
    tf_rule: str,
) -> Problem:
    """Another cuDNN file won the loader search over the stack's own copy ``pinned``: both paths,
    both versions, and why the stale one comes first (search order: ld.so(8), "Description";
    ldconfig(8) reads /etc/ld.so.conf, whose ``include /etc/ld.so.conf.d/*.conf`` takes the files
    in name order)."""
    pinned_path, pinned_version = pinned
    opened = record.get("found_as") or record["path"]
    folder = os.path.dirname(opened)
    return problem(
        "libcudnn",
        f"cuDNN {record['soname']}: the loader loaded {record['path']} (cuDNN {record['version']}) ahead of the "
        f"pinned {pinned_path} ({pinned_version or 'version not in its name'}); the stack pins "
        f"{expected_cudnn}.{tf_rule}",
        f"remove or move {opened} (and the file it points to) out of {folder}, then run `ldconfig`; "
        f"`ldconfig -p | grep {soname_stem(record['soname'])}` must then list "
        f"{_as_listed(pinned_path, search_order)}/{record['soname']} first. {folder} is on the loader path through {_loader_source(folder, search_order)} (the "
        f"loader searches LD_LIBRARY_PATH, then the {LD_SO_CONF_D} files in name order, then the "
        "default folders)",
    )


def compare_cudnn(
    record: dict[str, Any],
    expected_cudnn: str | None,
    pinned: tuple[str, str | None] | None = None,
    search_order: Sequence[tuple[str, str]] = (),
    fix: str | None = None,
) -> list[Problem]:
    """libcudnn major.minor.patch must equal the pinned cuDNN (extra parts like .163 ignored).

    ``pinned``: the stack's own copy (:func:`pinned_copy`); when the loaded file is another one,
    the problem names both (:func:`stale_ahead_problem`). ``fix``: the fix of a wheels stack."""
    if not expected_cudnn or not record.get("ok"):
        return []
    parts = min(3, len(str(expected_cudnn).split(".")))
    want = parse_version(expected_cudnn, parts, "cuDNN version")
    have = parse_version(record["version"], 3)[:parts]
    if have == want:
        return []
    refused = cudnn_tf_rule(str(expected_cudnn), record["version"])
    tf_rule = (
        f' TensorFlow built with cuDNN {expected_cudnn} refuses it ({refused}; TensorFlow logs "Loaded runtime '
        f'CuDNN library: {record["version"]} but source was compiled with: {expected_cudnn}").'
        if refused
        else ""
    )
    if pinned and pinned[0] != record["path"]:
        return [stale_ahead_problem(record, str(expected_cudnn), pinned, search_order, tf_rule)]
    return [
        problem(
            "libcudnn",
            f"cuDNN {record['soname']} at {record['path']} is {record['version']}, the stack pins "
            f"{expected_cudnn} (loaded vs built).{tf_rule}",
            fix
            or "another cuDNN comes first on the loader path (an older copy in /usr/lib or "
            "LD_LIBRARY_PATH wins): remove it or reorder the paths (gpu_env role), run "
            "`ldconfig`, or fix the pin",
        )
    ]


def compare_driver_runtime(
    libcuda: dict[str, Any], libcudart: dict[str, Any], minor_compatible: bool = False
) -> list[Problem]:
    """The driver's CUDA version (cuDriverGetVersion) must be >= the runtime's.

    NVIDIA's minor-version compatibility ("CUDA Minor Version Compatibility",
    https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html) lets an older driver of the same
    major run a newer runtime with a "limited feature-set" (PTX from a newer toolkit fails), so
    this project treats any driver older than the runtime as a failure; except for a stack of NVIDIA's
    wheels (``minor_compatible``), which TensorFlow's own guide installs on any driver of the CUDA major and
    whose driver floor preflight checks (the matrix's ``cuda_major_compat``): there the major must be served.
    """
    if not (libcuda.get("ok") and libcudart.get("ok")):
        return []
    # The runtime's version may come from its file name (no raw value): compare major.minor.
    parts = 1 if minor_compatible else 2
    if parse_version(libcuda["version"], 2)[:parts] >= parse_version(libcudart["version"], 2)[:parts]:
        return []
    return [
        problem(
            "driver",
            f"Driver too old for the runtime: the driver supports CUDA {libcuda['version']} "
            f"({libcuda['path']}), the runtime is CUDA {libcudart['version']} "
            f"({libcudart['path']}).",
            "upgrade the driver to the branch the stack's CUDA version needs (nvidia_driver_version, "
            "see the version matrix) or pin an older CUDA",
        )
    ]


def cudnn_tf_rule(built: str, loaded: str) -> str | None:
    """TensorFlow's runtime cuDNN rule (``cuda_dnn.cc``, quoted in tensorflow/tensorflow#62626): same
    major, loaded minor >= built minor.  ``built`` may be major only (pip builds report ``"8"``).

    Returns None when TensorFlow accepts the pair, else the reason.
    """
    built_parts = [int(p) for p in str(built).split(".")[:2] if p.isdigit()]
    loaded_major, loaded_minor = parse_version(loaded, 2)
    if not built_parts:
        return None
    if loaded_major != built_parts[0]:
        return f"major {loaded_major} != {built_parts[0]}"
    if len(built_parts) > 1 and loaded_minor < built_parts[1]:
        return f"minor {loaded_minor} < {built_parts[1]}"
    return None


def compare_with_build(tf_info: dict[str, Any], libs: dict[str, dict[str, Any]]) -> list[Problem]:
    """Compare TensorFlow's build info with the loaded libcudart/libcudnn (CUDA builds only).

    CUDA: same major required (the soname TF links against carries the major); a loaded minor
    older than the build's is flagged because kernels/PTX built for the newer minor may not run.
    """
    problems: list[Problem] = []
    if not tf_info or not tf_info.get("is_cuda_build"):
        return problems
    build = tf_info.get("build_info") or {}
    version = tf_info.get("version")
    cudart = libs.get("libcudart") or {}
    built_cuda = build.get("cuda_version")
    if built_cuda and cudart.get("ok"):
        b_major, b_minor = parse_version(built_cuda, 2)
        l_major, l_minor = parse_version(cudart["version"], 2)
        if l_major != b_major or l_minor < b_minor:
            problems.append(
                problem(
                    "tensorflow",
                    f"TensorFlow {version} was built for CUDA {built_cuda} but the loaded runtime "
                    f"is {cudart['version']} ({cudart['path']}).",
                    f"install CUDA {built_cuda} for this venv's stack and put it first on the "
                    "loader path, or pin the TensorFlow version that matches the installed CUDA",
                )
            )
    cudnn = libs.get("libcudnn") or {}
    built_cudnn = build.get("cudnn_version")
    if built_cudnn and cudnn.get("ok"):
        reason = cudnn_tf_rule(str(built_cudnn), cudnn["version"])
        if reason:
            problems.append(
                problem(
                    "tensorflow",
                    f"TensorFlow {version} was built with cuDNN {built_cudnn} and will refuse the "
                    f"loaded cuDNN {cudnn['version']} ({cudnn['path']}; {reason}): it needs the "
                    "same major and an equal or higher minor.",
                    f"install cuDNN {built_cudnn}.x for this stack and put it first on the loader "
                    "path (gpu_env role), then run `ldconfig`",
                )
            )
    return problems


# --- the probe's answers (pure) ---------------------------------------------------------------


def new_record(soname: str) -> dict[str, Any]:
    """A library's record before anything is known.  ``path``: the real file mapped; ``found_as``:
    the name the loader opened; ``loaded``: dlopen worked; ``raw``: the version call's value;
    ``version``: decoded, from the call or the file name (``version_source``); ``release``: the
    version in the real file's name (libcuda: the driver's); ``call_status``/``call_error``: a
    version call that failed; ``note``: what that means when it fails nothing; ``ok``: loaded and
    version known (None: not known, and nothing failed); ``error``: why the library failed."""
    return {
        "soname": soname,
        "path": None,
        "found_as": None,
        "loaded": False,
        "raw": None,
        "version": None,
        "release": None,
        "version_source": None,
        "call_status": None,
        "call_error": None,
        "note": None,
        "ok": False,
        "error": None,
    }


def release_from_name(path: str | None) -> str | None:
    """The version in a real library file's name, as NVIDIA names the files (the toolkit's
    ``lib64``, the cuDNN archive, the driver): ``libcudart.so.11.8.89`` -> "11.8.89",
    ``libcudnn.so.8.6.0`` -> "8.6.0", ``libcuda.so.535.261.03`` -> "535.261.03".  None for a
    soname: ``libcudart.so.11.0`` is CUDA 11's soname, not a version, so three numeric parts are
    needed."""
    suffix = os.path.basename(path or "").partition(".so.")[2]
    parts = suffix.split(".")
    return suffix if len(parts) >= 3 and all(part.isdigit() for part in parts) else None


def call_error_text(symbol: str, status: int, name: str | None = None, text: str | None = None) -> str:
    """``cudaRuntimeGetVersion returned 100 (cudaErrorNoDevice: no CUDA-capable device is
    detected)``: ``name``/``text`` as the runtime's cudaGetErrorName/cudaGetErrorString say them,
    else :data:`CUDA_RUNTIME_ERRORS`; the driver API's CUresult names for ``cuDriverGetVersion``."""
    if symbol == "cuDriverGetVersion":
        return f"{symbol} returned {status} ({CUDA_DRIVER_ERRORS.get(status, 'error')})"
    known_name, known_text = CUDA_RUNTIME_ERRORS.get(status, ("unrecognized error code", ""))
    name, text = name or known_name, text or known_text
    return (
        f"{symbol} returned {status} ({name}: {text})"
        if text and text != name
        else f"{symbol} returned {status} ({name})"
    )


def runtime_call_note(record: dict[str, Any], cuda_visible_devices: str | None = None) -> str:
    """The ``note`` of a libcudart whose ``cudaRuntimeGetVersion`` failed: the error, what it means,
    and where the version came from."""
    status = record["call_status"]
    note = f"{record['call_error']}: {RUNTIME_CALL_MEANINGS.get(status, RUNTIME_CALL_OTHER)}"
    if status == CUDA_ERROR_NO_DEVICE and cuda_visible_devices is not None:
        note += f"; CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} is set and may hide every GPU"
    name = os.path.basename(record.get("path") or record["soname"])
    if record.get("version") and record.get("version_source") == WHEEL_SOURCE:
        return note + f"; version {record['version']} read from the wheel {record['wheel']} that installed {name}"
    if record.get("version"):
        return note + f"; version {record['version']} read from the file name {name}"
    return note + f"; its version is unknown: the file name {name} carries none"


def settle_record(key: str, record: dict[str, Any], cuda_visible_devices: str | None = None) -> dict[str, Any]:
    """A probe record made final: ``release`` from the file name, or for a file of NVIDIA's wheels (named by
    its soname) ``wheel``, the wheel that installed it (wheels.wheel_fields); a libcudart whose version call
    failed takes ``version`` from the file name or that wheel's version (the call needs a working driver and
    a device, the name needs nothing) and a ``note``; other failed calls are errors."""
    record = dict(record)
    record["release"] = release_from_name(record.get("path"))
    if not record["release"] and record.get("loaded"):
        record.update(wheels.wheel_fields(record.get("path")))  # a wheel's file: named by its soname only
    status = record.get("call_status")
    if not record.get("loaded") or record.get("ok") or not status:
        return record
    if key != "libcudart":
        record["error"] = record["call_error"]
        return record
    release = record["release"]
    if release:
        record.update(version=".".join(release.split(".")[:2]), version_source="file name", ok=True)
    elif record.get("wheel"):
        wheel_version = record["wheel"].rpartition(" ")[2]
        record.update(version=".".join(wheel_version.split(".")[:2]), version_source=WHEEL_SOURCE, ok=True)
    else:
        record["ok"] = None
    record["note"] = runtime_call_note(record, cuda_visible_devices)
    return record


def parse_probe_events(stdout: str) -> list[dict[str, Any]]:
    """The probe's JSON-line events (:func:`probe_child`); other lines (a library printing to
    stdout) are skipped."""
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events


def could_not_load(stderr: str) -> tuple[str, str | None, str] | None:
    """cuDNN's last ``Could not load library X. Error: Y`` line in ``stderr``: ``(X, the file the
    loader could not open or None, Y)``, or None."""
    found = None
    for match in COULD_NOT_LOAD.finditer(stderr or ""):
        missing = MISSING_FILE.match(match.group(2))
        found = (match.group(1), missing.group(1) if missing else None, match.group(2).strip())
    return found


def missing_library_fix(missing: str, cuda_root: str | None, installed: str | None = None) -> str:
    """Where a library cuDNN could not load comes from, and how to make the loader find it;
    ``installed``: where it is, though the loader did not find it (:func:`find_off_path`)."""
    check = f"`ldconfig -p | grep {soname_stem(missing)}` must then list it"
    if missing.startswith("libcudnn"):
        return (
            f"the cuDNN install is incomplete ({missing} is part of cuDNN): rerun the cudnn role (playbooks/cuda.yml "
            f"or site.yml), then run `ldconfig`; {check}"
        )
    if not missing.startswith(("libcublas", "libnvrtc")):
        return f"install the package that provides {missing}, list its folder in a file under {LD_SO_CONF_D}/ and run `ldconfig`; {check}"
    lib64 = f"{cuda_root}/lib64" if cuda_root else "the stack's <cuda_root>/lib64"
    # libnvrtc.so is the unversioned link the toolkit keeps beside libnvrtc.so.<X.Y>; cuDNN opens that name.
    origin = f"{missing} comes with the stack's CUDA toolkit, in {lib64}"
    if installed:
        return (
            f"put {os.path.dirname(installed)} on the loader path through the gpu_env role (rerun playbooks/cuda.yml "
            f"or site.yml) and run `ldconfig`: {origin}; {check}"
        )
    return (
        f"install the stack's CUDA toolkit in full (cuda_toolkit role; {origin}) and keep {lib64} on the loader "
        f"path through the gpu_env role (rerun playbooks/cuda.yml or site.yml), then run `ldconfig`; {check}"
    )


def probe_death(returncode: int | None, timed_out: bool, timeout: float) -> str:
    """How the probe process ended without a record: ``aborted the process (SIGABRT)``, ..."""
    if timed_out:
        return f"did not answer within {timeout:g} s (the probe process was killed)"
    if returncode is None:
        return "could not be probed (the probe process did not start)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{'aborted' if name == 'SIGABRT' else 'killed'} the process ({name})"
    return f"ended the process (exit status {returncode}) without an answer"


def crash_problem(key: str, record: dict[str, Any], death: str, stderr: str, cuda_root: str | None) -> Problem:
    """The problem of a library whose probe died (``death``: :func:`probe_death`), naming the library
    it could not load when it said so on ``stderr`` (cuDNN's ``Could not load library``)."""
    what = f"{LIBRARY_LABELS[key]} {record['soname']}" + (f" ({record['path']})" if record.get("path") else "")
    stage = "when asked for its version" if record.get("loaded") else "while being loaded"
    cause = f"{what} {death} {stage}"
    said = could_not_load(stderr)
    if said:
        library, missing, error = said
        needed = missing or library
        cause += f": it could not load {needed}"
        if missing is None:
            cause += f" ({error})"
        elif missing != library:
            cause += f" (needed by {library})"
        installed = find_off_path(needed, [os.path.join(cuda_root, "lib64")] if cuda_root else [])
        if installed:
            cause += f"; it is installed at {installed}, but {os.path.dirname(installed)} is not on the loader path"
        return problem(key, cause + ".", missing_library_fix(needed, cuda_root, installed))
    last = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    cause += f": {last[-1]}" if last else ""
    if death.startswith("did not answer"):
        fix = (
            "a library that hangs while it starts usually waits on the driver: check that `nvidia-smi` answers "
            "quickly and `dmesg | grep -i -e xid -e nvrm`"
        )
    else:
        fix = (
            f"the record's stderr_tail holds the library's own words and `dmesg` the crash; a damaged {key} is "
            f"reinstalled by the {LIBRARY_ROLES[key]} role, then run `ldconfig`"
        )
    return problem(key, cause + ".", fix)


def probe_records(
    plan: Sequence[dict[str, Any]], run: dict[str, Any], timeout: float, cuda_root: str | None = None
) -> tuple[list[dict[str, Any]], dict[int, list[Problem]], list[str]]:
    """The probe's answers (:func:`run_probe`) as one record per plan item, the problems of a probe
    that died (by plan index), and the CUDA toolkit files mapped in it.  The library being probed
    when the process died gets a failed record naming how (:func:`crash_problem`) with the end of
    its stderr (``stderr_tail``); the ones after it are not probed (``ok`` None, a ``note``); the
    ones before keep their records."""
    records: dict[int, dict[str, Any]] = {}
    current: dict[int, dict[str, Any]] = {}
    paths: list[str] = []
    for event in run["events"]:
        index = event.get("index")
        if event["event"] == "record":
            records[index] = event["record"]
        elif event["event"] in ("start", "loaded"):
            current[index] = dict(event, loaded=event["event"] == "loaded")
        elif event["event"] == "maps":
            paths = list(event.get("paths") or [])
    result: list[dict[str, Any]] = []
    problems: dict[int, list[Problem]] = {}
    culprit: str | None = None
    for index, item in enumerate(plan):
        if index in records:
            result.append(records[index])
            continue
        record = new_record(item["candidates"][0])
        if culprit is None:
            culprit = item["key"]
            seen = current.get(index) or {}
            record.update({k: seen[k] for k in ("soname", "path", "found_as", "loaded") if seen.get(k) is not None})
            death = probe_death(run["returncode"], run["timed_out"], timeout)
            found = crash_problem(item["key"], record, death, run["stderr"], cuda_root)
            record.update(error=found["cause"], stderr_tail=tail(run["stderr"], 2000) or None)
            problems[index] = [found]
        else:
            record.update(ok=None, note=f"not probed: the probe process ended while probing {culprit}")
        result.append(record)
    return result, problems, paths


# --- I/O: the probe process ------------------------------------------------------------------
#
# Every dlopen and version call runs in one child process (this file with --probe): cuDNN calls
# abort() when one of its sub-libraries cannot be loaded, which would otherwise kill the
# verification before it prints its document.  The child writes one JSON line per event, flushed
# at once, so whatever it learnt before it died reaches the parent:
#   {"event": "start", "index": i, "soname": s}     before each dlopen of a candidate
#   {"event": "loaded", "index": i, "soname", "path", "found_as"}  dlopen worked; the version call is next
#   {"event": "record", "index": i, "record": {...}}  the library's facts (see new_record)
#   {"event": "maps", "paths": [...]}               CUDA toolkit files mapped in the child (cuda_library_paths)
#   {"event": "done"}


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def dladdr_path(function: Any) -> str | None:
    """Path of the shared object that holds ctypes ``function`` (glibc ``dladdr``), or None."""
    for libname in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libname).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        address = ctypes.cast(function, ctypes.c_void_p).value
        if dladdr(address, ctypes.byref(info)) and info.dli_fname:
            return os.fsdecode(info.dli_fname)
    return None


def read_maps() -> str:
    """This process's ``/proc/self/maps`` ("" where there is none)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _read_version(function: Any, symbol: str) -> tuple[int, int]:
    """Call a version entry point; returns ``(status, raw version)``.  ``cudnnGetVersion()`` returns
    size_t (status 0); the CUDA ones fill an ``int*`` and return a status (0 = success)."""
    if symbol == "cudnnGetVersion":
        function.restype = ctypes.c_size_t
        function.argtypes = []
        return 0, int(function())
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.POINTER(ctypes.c_int)]
    value = ctypes.c_int(0)
    status = int(function(ctypes.byref(value)))
    return status, int(value.value)


def runtime_error_names(lib: Any, status: int) -> tuple[str | None, str | None]:
    """``cudaGetErrorName``/``cudaGetErrorString`` of ``status`` as the runtime ``lib`` itself says
    them (None for each it does not export)."""
    names: list[str | None] = []
    for symbol in ("cudaGetErrorName", "cudaGetErrorString"):
        function = getattr(lib, symbol, None)
        text = None
        if function is not None:
            function.restype = ctypes.c_char_p
            function.argtypes = [ctypes.c_int]
            raw = function(status)
            text = raw.decode("utf-8", "replace") if raw else None
        names.append(text)
    return names[0], names[1]


def _emit(event: dict[str, Any]) -> None:
    """Write one probe event as a JSON line and flush it: the parent keeps it even when a library
    kills this process a moment later."""
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _locate(record: dict[str, Any], soname: str, function: Any) -> None:
    """Fill ``found_as`` (the name the loader opened) and ``path`` (the real file mapped) of a
    library just loaded, and ``also_mapped`` when several copies are mapped."""
    found_as = dladdr_path(function) if function is not None else None
    mapped = paths_from_maps(read_maps(), soname_stem(os.path.basename(soname)))
    real = os.path.realpath(found_as) if found_as else None
    record["found_as"] = found_as
    record["path"] = real if (real and (real in mapped or not mapped)) else (mapped[0] if mapped else real)
    if len(mapped) > 1:
        record["also_mapped"] = [p for p in mapped if p != record["path"]]


def probe_one(index: int, key: str, soname: str) -> dict[str, Any]:
    """Child side: dlopen ``soname`` (a soname or a path), say where it was found (``loaded``
    event), then call its version entry point.  Returns the facts (:func:`new_record`); judging
    them is the parent's work (:func:`settle_record`)."""
    symbol, decode = LIBRARY_KINDS[key]
    record = new_record(soname)
    _emit({"event": "start", "index": index, "soname": soname})
    try:
        lib = ctypes.CDLL(soname)
    except OSError as exc:
        record["error"] = str(exc)
        return record
    record["loaded"] = True
    function = getattr(lib, symbol, None)
    _locate(record, soname, function)
    _emit({"event": "loaded", "index": index, "soname": soname, "path": record["path"], "found_as": record["found_as"]})
    if function is None:
        record["error"] = f"{soname} does not export {symbol}"
        return record
    status, raw = _read_version(function, symbol)
    if status == 0:
        record.update(raw=raw, version=decode(raw), version_source=symbol, ok=True)
    else:
        record["call_status"] = status
        record["call_error"] = call_error_text(symbol, status, *runtime_error_names(lib, status))
    return record


def probe_child(plan: Sequence[dict[str, Any]]) -> int:
    """The probe process: for each plan item ``{"key", "candidates"}`` the first candidate that
    loads (sonames newest first, or paths), then the CUDA toolkit files mapped here."""
    for index, item in enumerate(plan):
        record: dict[str, Any] = {}
        for soname in item["candidates"]:
            record = probe_one(index, item["key"], soname)
            if record["loaded"]:
                break
        _emit({"event": "record", "index": index, "record": record})
    _emit({"event": "maps", "paths": cuda_library_paths(read_maps())})
    _emit({"event": "done"})
    return EXIT_OK


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for the probe process; kill it after ``timeout`` seconds.  True when it was killed."""
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
    try:
        proc.wait(timeout=PROBE_KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass  # stuck in the kernel (a hung driver): what it wrote is read all the same
    return True


def run_probe(plan: Sequence[dict[str, Any]], timeout: float = PROBE_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Run :func:`probe_child` for ``plan`` in a child process of this interpreter, killed after
    ``timeout`` seconds (it stays in this process group, so that a Ctrl-C or a kill of the group ends
    it too).  Returns ``{"events", "stderr", "returncode", "timed_out"}``; the child writes no
    bytecode next to the scripts (``-B``).

    Its output goes to temporary files, not pipes: what it wrote can be read even when it cannot be
    reaped (a process stuck in the kernel outlives SIGKILL)."""
    command = [sys.executable, "-B", os.path.abspath(__file__), PROBE_OPTION, json.dumps(list(plan))]
    out = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
    err = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
    with out, err:
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as exc:
            return {
                "events": [],
                "stderr": f"cannot start {sys.executable}: {exc}",
                "returncode": None,
                "timed_out": False,
            }
        timed_out = _wait(proc, timeout)
        out.seek(0)
        err.seek(0)
        return {
            "events": parse_probe_events(out.read()),
            "stderr": err.read(),
            "returncode": proc.returncode,
            "timed_out": timed_out,
        }


# --- checking (the parent) -------------------------------------------------------------------


STUB_FIX = (
    "the toolkit's stub libcuda (lib64/stubs) is on the loader path: remove that folder "
    "from LD_LIBRARY_PATH and /etc/ld.so.conf.d, run `ldconfig`"
)


def record_problems(key: str, record: dict[str, Any], install_dirs: Sequence[str] = ()) -> list[Problem]:
    """The problems of one settled record (:func:`settle_record`): a library dlopen could not load
    (``install_dirs``: where it is expected, see :func:`load_failure_problem`), one without its
    version entry point, a driver whose ``cuDriverGetVersion`` failed."""
    if record.get("ok") is not False:
        return []
    soname, path, error = record["soname"], record.get("path"), record.get("error")
    if not record.get("loaded"):
        found = find_off_path(soname, install_dirs)
        login = login_only_mentions(os.path.dirname(found)) if found else []
        return [
            load_failure_problem(
                key, soname, str(error), os.environ.get("LD_LIBRARY_PATH"), ld_so_conf_dirs(), found, login
            )
        ]
    if "CUDA_ERROR_STUB_LIBRARY" in (error or "") or "/stubs/" in (path or ""):
        fix = STUB_FIX
    else:
        fix = f"{soname} at {path} is not a working {key}: reinstall it and run `ldconfig`"
    return [problem(key, f"{soname} at {path}: {error}.", fix)]


def runtime_call_problems(
    libcuda: dict[str, Any], libcudart: dict[str, Any], driver_problems: Sequence[Problem] = ()
) -> list[Problem]:
    """A failed ``cudaRuntimeGetVersion`` as a failure, where it is one and nothing else names it.

    100 (no device) never is: on a host verified with ``--cpu-replicas`` there is no GPU on purpose,
    and on a GPU host the GPU count check fails already; the record's ``note`` names it.  34 (stub
    libcuda) and 35 (no driver, or one too old) are failures only when the libcuda probe found
    nothing wrong and no ``driver_problems`` (:func:`compare_driver_runtime`) explain them.  Any
    other status is a driver that cannot start.
    """
    status = libcudart.get("call_status")
    if not status or status == CUDA_ERROR_NO_DEVICE:
        return []
    explained = libcuda.get("ok") is not True or bool(driver_problems)
    if status in (CUDA_ERROR_STUB_LIBRARY, CUDA_ERROR_INSUFFICIENT_DRIVER) and explained:
        return []
    where = f"CUDA runtime {libcudart['soname']} at {libcudart.get('path')}: {libcudart['call_error']}"
    if status == CUDA_ERROR_STUB_LIBRARY:
        return [problem("libcuda", f"{where}: the libcuda.so.1 it loaded is the CUDA toolkit's stub.", STUB_FIX)]
    if status == CUDA_ERROR_INSUFFICIENT_DRIVER:
        return [
            problem(
                "libcudart",
                f"{where}, though libcuda.so.1 at {libcuda.get('path')} supports CUDA {libcuda.get('version')}.",
                "another libcuda.so.1 is loaded before the driver's: `ldconfig -p | grep libcuda.so.1` must list only "
                "the driver's; reinstall the driver (nvidia_driver role) and run `ldconfig`",
            )
        ]
    return [
        problem(
            "libcudart",
            f"{where}: the CUDA runtime could not start the driver.",
            "check that `nvidia-smi` answers, that the loaded kernel module is the driver's version (`cat "
            "/proc/driver/nvidia/version`; reboot after a driver upgrade) and `dmesg | grep -i -e xid -e nvrm`",
        )
    ]


def _named_version(path: str) -> dict[str, Any]:
    """A library whose version has no call without a GPU (cuBLAS): the version its file's name carries, or
    for a file of NVIDIA's wheels (named by its soname) that of the wheel that installed it."""
    version = os.path.basename(path).partition(".so.")[2] or None
    wheel = wheels.wheel_fields(path) if not release_from_name(path) else {}
    if wheel:
        version = wheel["wheel"].rpartition(" ")[2]
    return {"path": path, "raw": None, "version": version, "error": None, **wheel}


def mapped_library_versions(
    maps_text: str | None = None, timeout: float = PROBE_TIMEOUT_SECONDS
) -> dict[str, list[dict[str, Any]]]:
    """Versions of every libcuda/libcudart/libcudnn/libcublas(Lt) file already mapped into this process
    (``maps_text``: ``/proc/self/maps`` text, read when None).  Returns ``{key: [{"path", "raw",
    "version", "error", ...}, ...]}`` with the keys libcublas, libcublasLt, libcuda, libcudart, libcudnn;
    the probed ones also carry ``release``, ``version_source``, ``call_error`` and ``note``
    (:func:`new_record`), and a file of NVIDIA's wheels ``wheel`` (:func:`wheels.wheel_fields`).

    Used after TensorFlow ran, to report the copies TensorFlow itself loaded (which may come from
    its RUNPATH rather than the system loader path).  The version calls run in the probe process
    (:func:`run_probe`) on those very files, by path, so a library that aborts cannot take this
    process with it.
    """
    maps_text = read_maps() if maps_text is None else maps_text
    result: dict[str, list[dict[str, Any]]] = {}
    # cuBLAS's version query needs a handle (a GPU context): the real file name carries the version
    # instead (libcublas.so.11.11.3.6, the toolkit's lib64 layout), or a wheel's metadata.
    for stem in ("libcublas", "libcublasLt"):
        result[stem] = [_named_version(path) for path in paths_from_maps(maps_text, stem + ".so")]
    plan = [
        {"key": key, "candidates": [path]} for key in LIBRARY_KINDS for path in paths_from_maps(maps_text, key + ".so")
    ]
    records = probe_records(plan, run_probe(plan, timeout), timeout)[0] if plan else []
    for key in LIBRARY_KINDS:
        result[key] = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    for item, record in zip(plan, records):
        settled = settle_record(item["key"], record, visible)
        entry = {"path": item["candidates"][0]}
        entry.update((name, settled.get(name)) for name in MAPPED_FIELDS)
        if settled.get("wheel"):
            entry["wheel"] = settled["wheel"]
        result[item["key"]].append(entry)
    return result


def default_cuda_root(expect_cuda: str | None) -> str | None:
    """Where the cuda_toolkit role installs CUDA ``X.Y``: ``/usr/local/cuda-X.Y`` (NVIDIA's runfile
    default ``--toolkitpath``), or None without a pin."""
    return f"/usr/local/cuda-{expect_cuda}" if expect_cuda else None


def library_plan(
    expect_cuda: str | None, expect_cudnn: str | None, wheel_dirs: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """What the probe loads, in order: libcuda, libcudart, libcudnn, each by its pinned soname, or
    the sonames newest first without a pin.  ``wheel_dirs``: a wheels stack's library folders; libcudart
    and libcudnn are then loaded as TensorFlow's RUNPATH finds them (:func:`wheels.resolve`)."""
    cudart = (
        [cudart_soname(expect_cuda)] if expect_cuda else ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    )
    cudnn = [cudnn_soname(expect_cudnn)] if expect_cudnn else ["libcudnn.so.9", "libcudnn.so.8"]
    if wheel_dirs is not None:
        ld_library_path = os.environ.get("LD_LIBRARY_PATH")
        cudart = [wheels.resolve(soname, ld_library_path, wheel_dirs) for soname in cudart]
        cudnn = [wheels.resolve(soname, ld_library_path, wheel_dirs) for soname in cudnn]
    return [
        {"key": "libcuda", "candidates": ["libcuda.so.1"]},
        {"key": "libcudart", "candidates": cudart},
        {"key": "libcudnn", "candidates": cudnn},
    ]


def probe_libraries(
    plan: Sequence[dict[str, Any]], probe_timeout: float, cuda_root: str | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, list[Problem]], list[str]]:
    """Run the probe process for ``plan``: each library's settled record (:func:`settle_record`, by key, in the
    plan's order), the problems of a probe that died (by key) and the CUDA toolkit files mapped in it."""
    records, crashed, mapped = probe_records(plan, run_probe(plan, probe_timeout), probe_timeout, cuda_root)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    libs = {item["key"]: settle_record(item["key"], record, visible) for item, record in zip(plan, records)}
    return libs, {plan[index]["key"]: found for index, found in crashed.items()}, mapped


def check_libraries(
    expect_cuda: str | None = None,
    expect_cudnn: str | None = None,
    cuda_root: str | None = None,
    probe_timeout: float = PROBE_TIMEOUT_SECONDS,
    library_dirs: Sequence[str] | None = None,
    stack: str | None = None,
) -> dict[str, Any]:
    """Load the three libraries in the probe process (:func:`run_probe`) and run the comparisons.

    ``cuda_root``: the stack's toolkit folder (default :func:`default_cuda_root`); its ``lib64``
    is where libcudart and libcudnn are expected, and a CUDA runtime of another major that the
    loader finds before it is a problem (:func:`runtime_shadow_problems`).  ``probe_timeout``:
    seconds before a probe that hangs is killed.  ``library_dirs``: a stack of NVIDIA's wheels
    (``--cuda-source wheels``), checked by :func:`check_wheel_libraries` instead; ``stack`` its name.

    Returns ``{"libraries": {"libcuda": rec, "libcudart": rec, "libcudnn": rec}, "problems": [...],
    "ok": bool}`` (records: :func:`new_record`).

    Raises:
        ValueError: ``expect_cuda``/``expect_cudnn`` are not dotted versions.
    """
    if library_dirs is not None:
        return check_wheel_libraries(expect_cuda, expect_cudnn, library_dirs, probe_timeout, stack)
    cuda_root = cuda_root or default_cuda_root(expect_cuda)
    install_dirs = [os.path.join(cuda_root, "lib64")] if cuda_root else []
    libs, crashed, mapped = probe_libraries(library_plan(expect_cuda, expect_cudnn), probe_timeout, cuda_root)
    # Where a pinned library is expected (a library found only there is installed, but not on the path).
    pinned_dirs = {"libcudart": install_dirs if expect_cuda else [], "libcudnn": install_dirs if expect_cudnn else []}
    problems: list[Problem] = []
    for key, record in libs.items():
        problems += crashed.get(key) or record_problems(key, record, pinned_dirs.get(key, []))
    search_order = loader_search_order(os.environ.get("LD_LIBRARY_PATH"), ld_so_conf_dirs())
    pinned = pinned_copy(cudnn_soname(expect_cudnn), install_dirs) if expect_cudnn else None
    driver = compare_driver_runtime(libs["libcuda"], libs["libcudart"])
    problems += runtime_call_problems(libs["libcuda"], libs["libcudart"], driver)
    problems += compare_cudart(libs["libcudart"], expect_cuda)
    problems += compare_cudnn(libs["libcudnn"], expect_cudnn, pinned, search_order)
    problems += driver
    problems += runtime_shadow_problems(expect_cuda, search_order)
    problems += mixed_cuda_major_problems(mapped)
    return {"libraries": libs, "problems": problems, "ok": not problems}


# The fixes of a wheels stack's library that is missing, or whose version is not the stack's.
WHEEL_MISSING_FIX = (
    "rerun playbooks/tensorflow.yml (or site.yml): tf_venv installs the venv again from its lock of "
    "tensorflow[and-cuda], whose NVIDIA wheels hold this library; `{python} -m pip show {project}` lists the "
    "wheel's files"
)
WHEEL_VERSION_FIX = (
    "the venv's NVIDIA wheel is not the one its lock pins: rerun playbooks/tensorflow.yml (tf_venv installs "
    "the lock again), or fix the stack's pin"
)
WHEEL_PROJECTS = {"libcudart": "nvidia-cuda-runtime-cu12", "libcudnn": "nvidia-cudnn-cu12"}


def wheel_library_problems(
    libs: dict[str, dict[str, Any]], library_dirs: Sequence[str], mapped: Sequence[str], stack: str | None
) -> tuple[list[Problem], set[str]]:
    """A wheels stack's libcudart and libcudnn that did not load, and each file of libcudart, libcublas(Lt)
    and libcudnn mapped from outside its ``library_dirs`` (the probe's records and ``mapped``, what the probe
    process mapped), naming both files (:func:`wheels.stray_problem`). Returns the problems and the checks
    that a stray file failed (their versions are not compared: the stray file's are not the stack's)."""
    problems: list[Problem] = []
    for key in ("libcudart", "libcudnn"):
        record = libs[key]
        if record.get("ok") is not False:  # checked, or not probed after a library that killed the probe
            continue
        if record.get("loaded"):
            problems += record_problems(key, record)
        else:
            own = wheels.own_file(record["soname"], library_dirs)
            state = "is there, but did not load" if os.path.exists(own) else "is missing"
            cause = f"Cannot load {record['soname']}: {record.get('error')} (the venv's own {own} {state})."
            fix = WHEEL_MISSING_FIX.format(python=sys.executable, project=WHEEL_PROJECTS[key])
            problems.append(problem(key, cause, fix))
    paths = [libs[key]["path"] for key in ("libcudart", "libcudnn") if libs[key].get("path")] + list(mapped)
    strays = stray_wheel_problems(paths, library_dirs, stack, "The probe")
    return problems + [found for _path, found in strays], {found["check"] for _path, found in strays}


def stray_wheel_problems(
    paths: Sequence[str], library_dirs: Sequence[str], stack: str | None, who: str
) -> list[tuple[str, Problem]]:
    """``(file, problem)`` for each libcudart/libcublas(Lt)/libcudnn file among ``paths`` (files ``who``
    mapped) that is not in the wheels' ``library_dirs``, with what put its folder on the loader path."""
    search_order = loader_search_order(os.environ.get("LD_LIBRARY_PATH"), ld_so_conf_dirs())
    return [
        (
            path,
            wheels.stray_problem(path, _loader_source(os.path.dirname(path), search_order), library_dirs, stack, who),
        )
        for path in wheels.strays(paths, library_dirs)
    ]


def check_wheel_libraries(
    expect_cuda: str | None,
    expect_cudnn: str | None,
    library_dirs: Sequence[str],
    probe_timeout: float = PROBE_TIMEOUT_SECONDS,
    stack: str | None = None,
) -> dict[str, Any]:
    """:func:`check_libraries` for a stack of NVIDIA's wheels: libcudart and libcudnn loaded as TensorFlow's
    RUNPATH finds them (``LD_LIBRARY_PATH`` first, then ``library_dirs``: :func:`wheels.resolve`), their
    versions from NVIDIA's calls (libcudart's from the wheel's metadata where the call needs a GPU), each
    against the stack's series; a library mapped from outside ``library_dirs`` fails naming both files
    (:func:`wheel_library_problems`); a driver of the CUDA major serves the runtime (minor-version
    compatibility). No toolkit folder, no ``ldconfig`` checks: the wheels are in no system folder."""
    plan = library_plan(expect_cuda, expect_cudnn, library_dirs)
    libs, crashed, mapped = probe_libraries(plan, probe_timeout)
    for record in libs.values():
        record["soname"] = os.path.basename(record["soname"])
    problems = list(crashed.get("libcuda") or record_problems("libcuda", libs["libcuda"]))
    crashes = [found for key in ("libcudart", "libcudnn") for found in crashed.get(key, [])]
    found, shadowed = wheel_library_problems(libs, library_dirs, mapped, stack)
    problems += crashes + [item for item in found if item["check"] not in {c["check"] for c in crashes}]
    driver = compare_driver_runtime(libs["libcuda"], libs["libcudart"], minor_compatible=True)
    problems += runtime_call_problems(libs["libcuda"], libs["libcudart"], driver)
    if "libcudart" not in shadowed:
        problems += compare_cudart(libs["libcudart"], expect_cuda, WHEEL_VERSION_FIX)
    if "libcudnn" not in shadowed:
        problems += compare_cudnn(libs["libcudnn"], expect_cudnn, fix=WHEEL_VERSION_FIX)
    problems += driver + mixed_cuda_major_problems(mapped)
    return {"libraries": libs, "problems": problems, "ok": not problems}


# --- TensorFlow (imported lazily) -----------------------------------------------------------


def json_safe(value: Any) -> Any:
    """Make build-info values JSON-serialisable (tuples -> lists, unknown objects -> str)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def tensorflow_build_info() -> dict[str, Any]:
    """Import TensorFlow and describe its build.

    Returns ``{"version", "build_info", "is_cuda_build", "gpus", "error"}``; ``gpus`` is
    ``len(tf.config.list_physical_devices("GPU"))``.  ``tf.sysconfig.get_build_info()`` holds
    ``cuda_version``/``cudnn_version``/``is_cuda_build``
    (https://www.tensorflow.org/api_docs/python/tf/sysconfig/get_build_info).  Import failures
    are returned in ``error``, not raised.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except Exception as exc:
        return {
            "version": None,
            "build_info": {},
            "is_cuda_build": None,
            "gpus": None,
            "error": f"import tensorflow failed: {type(exc).__name__}: {exc}",
        }
    build = json_safe(dict(tf.sysconfig.get_build_info()))
    return {
        "version": tf.__version__,
        "build_info": build,
        "is_cuda_build": bool(build.get("is_cuda_build", False)),
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "error": None,
    }


def tensorflow_problems(
    tf_info: dict[str, Any],
    libs: dict[str, dict[str, Any]],
    expect_tensorflow: str | None = None,
) -> list[Problem]:
    """Import failure, version pin and build-vs-loaded comparisons for TensorFlow."""
    if tf_info.get("error"):
        return [
            problem(
                "tensorflow",
                f"{tf_info['error']} (interpreter {sys.executable}).",
                "run the script with the venv's python; if it is that venv's, its files are damaged (pip still"
                f" counts it as holding its lock): remove {sys.prefix} and run playbooks/tensorflow.yml, which"
                " rebuilds it",
            )
        ]
    problems: list[Problem] = []
    if expect_tensorflow and tf_info.get("version") != expect_tensorflow:
        problems.append(
            problem(
                "tensorflow",
                f"TensorFlow {tf_info.get('version')} is installed, the stack pins {expect_tensorflow}.",
                "rerun the tf_venv role for this stack (it installs the pinned wheel) or fix the pin",
            )
        )
    return problems + compare_with_build(tf_info, libs)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Load libcuda, libcudart and libcudnn via ctypes (in a child process, so that a library "
        "that aborts cannot stop the report), report the files and versions really loaded, compare with the "
        "pins and TensorFlow's build; print JSON.",
        epilog="Exit codes: 0 all checks passed, 1 a check failed, 2 usage error.",
    )
    parser.add_argument("--expect-cuda", metavar="X.Y", help="pinned CUDA version, e.g. 11.8")
    parser.add_argument("--expect-cudnn", metavar="X.Y.Z", help="pinned cuDNN version, e.g. 8.6.0")
    parser.add_argument("--expect-tensorflow", metavar="X.Y.Z", help="pinned TensorFlow version")
    parser.add_argument("--no-tensorflow", action="store_true", help="do not import TensorFlow")
    add_source_arguments(parser)
    parser.add_argument("--stack", help="the stack's name, for the fix of a library that shadows its wheels")
    # The probe process's own entry point (run_probe): a JSON plan, not for people.
    parser.add_argument(PROBE_OPTION, metavar="PLAN", help=argparse.SUPPRESS)
    return parser


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the stack's CUDA comes from (shared with gpu_verify.py): ``--cuda-source``, ``--cuda-root`` for
    the runfile tree, one ``--library-dir`` per wheel folder for NVIDIA's wheels."""
    parser.add_argument(
        "--cuda-source",
        choices=CUDA_SOURCES,
        default="runfile",
        help="where the stack's CUDA comes from: NVIDIA's runfile tree (default), or NVIDIA's wheels in the venv "
        "(tensorflow[and-cuda]; give each --library-dir)",
    )
    parser.add_argument(
        "--cuda-root",
        metavar="DIR",
        help="the stack's CUDA toolkit folder (default /usr/local/cuda-<--expect-cuda>); its lib64 is "
        "where libcudart/libcudnn are expected (--cuda-source runfile)",
    )
    parser.add_argument(
        "--library-dir",
        metavar="DIR",
        action="append",
        default=[],
        help="--cuda-source wheels: a folder of the venv's NVIDIA wheels (<site-packages>/nvidia/<wheel>/lib), "
        "once each; libcudart, libcublas(Lt) and libcudnn must be mapped from these",
    )


def wheel_dirs(args: argparse.Namespace) -> list[str] | None:
    """The wheels' library folders of a ``--cuda-source wheels`` stack, None for a runfile one."""
    return list(args.library_dir) if args.cuda_source == "wheels" else None


def check_pin_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject malformed ``--expect-cuda`` / ``--expect-cudnn`` and a ``--cuda-source`` without its folders
    through ``parser.error`` (exit 2) before any check runs (shared with gpu_verify.py)."""
    if args.cuda_source == "wheels" and (args.cuda_root or not args.library_dir):
        parser.error("--cuda-source wheels takes each --library-dir of the venv's NVIDIA wheels and no --cuda-root")
    if args.cuda_source == "runfile" and args.library_dir:
        parser.error("--library-dir is for --cuda-source wheels; a runfile stack's folder is --cuda-root")
    try:
        if args.expect_cuda:
            cudart_soname(args.expect_cuda)
        if args.expect_cudnn:
            cudnn_soname(args.expect_cudnn)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.probe is not None:
        return probe_child(json.loads(args.probe))
    check_pin_arguments(parser, args)
    doc = check_libraries(
        args.expect_cuda, args.expect_cudnn, args.cuda_root, library_dirs=wheel_dirs(args), stack=args.stack
    )
    doc["tensorflow"] = None
    if not args.no_tensorflow:
        doc["tensorflow"] = tensorflow_build_info()
        doc["problems"] += tensorflow_problems(doc["tensorflow"], doc["libraries"], args.expect_tensorflow)
    doc["ok"] = not doc["problems"]
    print(dumps(doc))
    return EXIT_OK if doc["ok"] else EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
