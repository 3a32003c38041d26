"""Load the CUDA driver API, CUDA runtime and cuDNN through ctypes and check their versions.

What is loaded and how the version is read:

* ``libcuda.so.1`` (installed by the NVIDIA driver): ``cuDriverGetVersion(int*)``; the value is
  the newest CUDA version the driver supports, e.g. 11080.
* ``libcudart.so.11.0`` / ``.so.12`` / ``.so.13`` (CUDA toolkit; the soname carries only the major
  version from CUDA 11 on): ``cudaRuntimeGetVersion(int*)``, e.g. 11080.
* ``libcudnn.so.<major>``: ``cudnnGetVersion()`` returns ``size_t``.  cuDNN 8 encodes
  ``major*1000 + minor*100 + patch`` and cuDNN 9 ``major*10000 + minor*100 + patch``
  (the ``CUDNN_VERSION`` macro of cuDNN's ``cudnn_version.h``, shipped in the cuDNN tar archive and
  the ``nvidia-cudnn-cu*`` wheels).

CUDA version integers decode as ``major = v // 1000``, ``minor = (v % 1000) // 10`` (11080 ->
"11.8"), the encoding used by ``cudaRuntimeGetVersion``/``cuDriverGetVersion`` in the CUDA
runtime API reference.

Libraries are found the way every process finds them (``LD_LIBRARY_PATH``, the ``ldconfig``
cache built from ``/etc/ld.so.conf.d``); the file really mapped is read back from
``/proc/self/maps`` (with ``dladdr`` to pick one when several copies are mapped).  TensorFlow
wheels can also use their own RUNPATH to pip-installed NVIDIA libraries (``$ORIGIN/../nvidia/<pkg>/lib``,
set by ``cuda_rpath_flags`` in openxla/xla ``xla/tsl/platform/default/cuda_build_defs.bzl``),
so ``fit.py`` additionally reports what TensorFlow itself mapped (:func:`mapped_library_versions`).

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
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from verify_common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    Problem,
    dumps,
    parse_version,
    problem,
)

# Names of CUresult values worth spelling out (CUDA driver API reference, "Error Handling").
CUDA_DRIVER_ERRORS = {
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}

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
            "libcuda.so.1 comes with the NVIDIA driver, not the toolkit: install/repair the driver "
            "(nvidia_driver role), then run `ldconfig` and check `ldconfig -p | grep libcuda`"
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
    whatever loaded them."""
    by_major: dict[int, list[str]] = {}
    for path in paths:
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


def compare_cudart(record: dict[str, Any], expected_cuda: str | None) -> list[Problem]:
    """libcudart major.minor must equal the pinned CUDA ``"X.Y"``."""
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
            "another toolkit comes first on the loader path: make the stack's "
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
) -> list[Problem]:
    """libcudnn major.minor.patch must equal the pinned cuDNN (extra parts like .163 ignored).

    ``pinned``: the stack's own copy (:func:`pinned_copy`); when the loaded file is another one,
    the problem names both (:func:`stale_ahead_problem`)."""
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
            "another cuDNN comes first on the loader path (an older copy in /usr/lib or "
            "LD_LIBRARY_PATH wins): remove it or reorder the paths (gpu_env role), run "
            "`ldconfig`, or fix the pin",
        )
    ]


def compare_driver_runtime(libcuda: dict[str, Any], libcudart: dict[str, Any]) -> list[Problem]:
    """The driver's CUDA version (cuDriverGetVersion) must be >= the runtime's.

    NVIDIA's minor-version compatibility ("CUDA Minor Version Compatibility",
    https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html) lets an older driver of the same
    major run a newer runtime with a "limited feature-set" (PTX from a newer toolkit fails), so
    this project treats any driver older than the runtime as a failure.
    """
    if not (libcuda.get("ok") and libcudart.get("ok")):
        return []
    if libcuda["raw"] >= libcudart["raw"]:
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


# --- I/O: loading through ctypes ------------------------------------------------------------


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


def _call_version(lib: ctypes.CDLL, symbol: str) -> tuple[Any, int]:
    """Call the version entry point ``symbol`` of ``lib``; returns (function, raw version).

    Raises:
        AttributeError: the symbol is not exported.
        RuntimeError: the call returned a CUDA error code.
    """
    function = getattr(lib, symbol)
    return function, _read_version(function, symbol)


def _read_version(function: Any, symbol: str) -> int:
    """Call a version entry point: ``cudnnGetVersion()`` returns size_t, the CUDA ones fill an
    ``int*`` and return a status (0 = success).

    Raises:
        RuntimeError: the call returned a non-zero status.
    """
    if symbol == "cudnnGetVersion":
        function.restype = ctypes.c_size_t
        function.argtypes = []
        return int(function())
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.POINTER(ctypes.c_int)]
    value = ctypes.c_int(0)
    status = function(ctypes.byref(value))
    if status != 0:
        name = CUDA_DRIVER_ERRORS.get(status, "error") if symbol == "cuDriverGetVersion" else "error"
        raise RuntimeError(f"{symbol} returned {status} ({name})")
    return int(value.value)


LIBRARY_KINDS: dict[str, tuple[str, Callable[[int], str]]] = {
    "libcuda": ("cuDriverGetVersion", decode_cuda_version),
    "libcudart": ("cudaRuntimeGetVersion", decode_cuda_version),
    "libcudnn": ("cudnnGetVersion", decode_cudnn_version),
}


def load_library(key: str, soname: str, install_dirs: Sequence[str] = ()) -> tuple[dict[str, Any], list[Problem]]:
    """dlopen ``soname`` and read its version.

    ``install_dirs``: folders where the library is expected to be installed (the stack's
    ``<cuda_root>/lib64``); when dlopen fails but the file is there, the problem says it is
    installed but not on the loader path.

    Returns ``({"soname", "path", "found_as", "raw", "version", "ok", "error"}, problems)``:
    ``path`` is the real file mapped into this process, ``found_as`` the name the loader opened
    (often a symlink in the folder that won the search).
    """
    symbol, decode = LIBRARY_KINDS[key]
    record: dict[str, Any] = {
        "soname": soname,
        "path": None,
        "found_as": None,
        "raw": None,
        "version": None,
        "ok": False,
        "error": None,
    }
    try:
        lib = ctypes.CDLL(soname)
    except OSError as exc:
        record["error"] = str(exc)
        conf = ld_so_conf_dirs()
        found = find_off_path(soname, install_dirs)
        login = login_only_mentions(os.path.dirname(found)) if found else []
        return record, [
            load_failure_problem(key, soname, str(exc), os.environ.get("LD_LIBRARY_PATH"), conf, found, login)
        ]
    function = getattr(lib, symbol, None)
    raw: int | None = None
    if function is None:
        record["error"] = f"{soname} does not export {symbol}"
    else:
        try:
            raw = _read_version(function, symbol)
        except RuntimeError as exc:
            record["error"] = str(exc)
    found_as = dladdr_path(function) if function is not None else None
    mapped = paths_from_maps(read_maps(), soname_stem(soname))
    real = os.path.realpath(found_as) if found_as else None
    record["found_as"] = found_as
    record["path"] = real if (real and (real in mapped or not mapped)) else (mapped[0] if mapped else real)
    if len(mapped) > 1:
        record["also_mapped"] = [p for p in mapped if p != record["path"]]
    if raw is None:
        if "CUDA_ERROR_STUB_LIBRARY" in (record["error"] or "") or "/stubs/" in (record["path"] or ""):
            fix = (
                "the toolkit's stub libcuda (lib64/stubs) is on the loader path: remove that folder "
                "from LD_LIBRARY_PATH and /etc/ld.so.conf.d, run `ldconfig`"
            )
        else:
            fix = f"{soname} at {record['path']} is not a working {key}: reinstall it and run `ldconfig`"
        return record, [problem(key, f"{soname} at {record['path']}: {record['error']}.", fix)]
    record.update(raw=raw, version=decode(raw), ok=True)
    return record, []


def mapped_library_versions(
    maps_text: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Versions of every libcuda/libcudart/libcudnn/libcublas file already mapped into this process
    (``maps_text``: ``/proc/self/maps`` text, read when None).  Returns ``{key: [{"path", "raw",
    "version", "error"}, ...]}`` with the keys libcublas, libcuda, libcudart, libcudnn.

    Used after TensorFlow ran, to report the copies TensorFlow itself loaded (which may come
    from its RUNPATH rather than the system loader path).  dlopen of an already-mapped path
    returns the same handle, so nothing new is loaded.
    """
    maps_text = read_maps() if maps_text is None else maps_text
    result: dict[str, list[dict[str, Any]]] = {}
    # cuBLAS's version query needs a handle (a GPU context): the real file name carries the version
    # instead (libcublas.so.11.11.3.6, the toolkit's lib64 layout).
    result["libcublas"] = [
        {"path": path, "raw": None, "version": os.path.basename(path).partition(".so.")[2] or None, "error": None}
        for path in paths_from_maps(maps_text, "libcublas.so")
    ]
    for key, (symbol, decode) in LIBRARY_KINDS.items():
        entries = []
        for path in paths_from_maps(maps_text, key + ".so"):
            entry: dict[str, Any] = {
                "path": path,
                "raw": None,
                "version": None,
                "error": None,
            }
            try:
                _function, raw = _call_version(ctypes.CDLL(path), symbol)
                entry.update(raw=raw, version=decode(raw))
            except (OSError, AttributeError, RuntimeError) as exc:
                entry["error"] = str(exc)
            entries.append(entry)
        result[key] = entries
    return result


def _first_loadable(key: str, candidates: Sequence[str]) -> tuple[dict[str, Any], list[Problem]]:
    """Try sonames newest first (used when no version is pinned)."""
    record: dict[str, Any] = {}
    problems: list[Problem] = []
    for soname in candidates:
        record, problems = load_library(key, soname)
        if record["error"] is None or record["path"]:
            return record, problems
    return record, problems


def default_cuda_root(expect_cuda: str | None) -> str | None:
    """Where the cuda_toolkit role installs CUDA ``X.Y``: ``/usr/local/cuda-X.Y`` (NVIDIA's runfile
    default ``--toolkitpath``), or None without a pin."""
    return f"/usr/local/cuda-{expect_cuda}" if expect_cuda else None


def check_libraries(
    expect_cuda: str | None = None, expect_cudnn: str | None = None, cuda_root: str | None = None
) -> dict[str, Any]:
    """Load the three libraries and run the comparisons.

    ``cuda_root``: the stack's toolkit folder (default :func:`default_cuda_root`); its ``lib64``
    is where libcudart and libcudnn are expected, and a CUDA runtime of another major that the
    loader finds before it is a problem (:func:`runtime_shadow_problems`).

    Returns ``{"libraries": {"libcuda": rec, "libcudart": rec, "libcudnn": rec}, "problems": [...],
    "ok": bool}``.

    Raises:
        ValueError: ``expect_cuda``/``expect_cudnn`` are not dotted versions.
    """
    problems: list[Problem] = []
    libs: dict[str, dict[str, Any]] = {}
    cuda_root = cuda_root or default_cuda_root(expect_cuda)
    install_dirs = [os.path.join(cuda_root, "lib64")] if cuda_root else []
    libs["libcuda"], found = load_library("libcuda", "libcuda.so.1")
    problems += found
    if expect_cuda:
        libs["libcudart"], found = load_library("libcudart", cudart_soname(expect_cuda), install_dirs)
    else:
        libs["libcudart"], found = _first_loadable(
            "libcudart", ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
        )
    problems += found
    if expect_cudnn:
        libs["libcudnn"], found = load_library("libcudnn", cudnn_soname(expect_cudnn), install_dirs)
    else:
        libs["libcudnn"], found = _first_loadable("libcudnn", ["libcudnn.so.9", "libcudnn.so.8"])
    problems += found
    search_order = loader_search_order(os.environ.get("LD_LIBRARY_PATH"), ld_so_conf_dirs())
    pinned = pinned_copy(cudnn_soname(expect_cudnn), install_dirs) if expect_cudnn else None
    problems += compare_cudart(libs["libcudart"], expect_cuda)
    problems += compare_cudnn(libs["libcudnn"], expect_cudnn, pinned, search_order)
    problems += compare_driver_runtime(libs["libcuda"], libs["libcudart"])
    problems += runtime_shadow_problems(expect_cuda, search_order)
    problems += mixed_cuda_major_problems(cuda_library_paths(read_maps()))
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
        description="Load libcuda, libcudart and libcudnn via ctypes, report the files and "
        "versions really loaded, compare with the pins and TensorFlow's build; print JSON.",
        epilog="Exit codes: 0 all checks passed, 1 a check failed, 2 usage error.",
    )
    parser.add_argument("--expect-cuda", metavar="X.Y", help="pinned CUDA version, e.g. 11.8")
    parser.add_argument("--expect-cudnn", metavar="X.Y.Z", help="pinned cuDNN version, e.g. 8.6.0")
    parser.add_argument("--expect-tensorflow", metavar="X.Y.Z", help="pinned TensorFlow version")
    parser.add_argument("--no-tensorflow", action="store_true", help="do not import TensorFlow")
    return parser


def check_pin_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject malformed ``--expect-cuda`` / ``--expect-cudnn`` through ``parser.error`` (exit 2)
    before any check runs (shared with gpu_verify.py)."""
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
    check_pin_arguments(parser, args)
    doc = check_libraries(args.expect_cuda, args.expect_cudnn)
    doc["tensorflow"] = None
    if not args.no_tensorflow:
        doc["tensorflow"] = tensorflow_build_info()
        doc["problems"] += tensorflow_problems(doc["tensorflow"], doc["libraries"], args.expect_tensorflow)
    doc["ok"] = not doc["problems"]
    print(dumps(doc))
    return EXIT_OK if doc["ok"] else EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
