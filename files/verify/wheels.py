"""A stack whose CUDA comes from NVIDIA's wheels (``tensorflow[and-cuda]``): where its libraries must be mapped
from, and the version of the wheel that installed a library file.

Such a stack has no CUDA tree: ``pip install tensorflow[and-cuda]`` puts NVIDIA's ``nvidia-*-cu12`` wheels into
the venv, each library under ``<site-packages>/nvidia/<folder>/lib`` (``cuda_runtime``, ``cublas``, ``cudnn``,
...), and TensorFlow finds them through its RUNPATH (``$ORIGIN/../nvidia/<folder>/lib``, set by
``cuda_rpath_flags`` in openxla/xla ``xla/tsl/platform/default/cuda_build_defs.bzl``).  The dynamic loader
searches ``LD_LIBRARY_PATH`` before a library's DT_RUNPATH and the ``ldconfig`` cache after it (ld.so(8),
"DESCRIPTION", https://man7.org/linux/man-pages/man8/ld.so.8.html): a system CUDA earlier on
``LD_LIBRARY_PATH`` shadows the wheels, and TensorFlow loads a mix of the two.

``library_dirs``: the stack's ``cuda_toolkit.library_dirs``, the wheels' ``lib`` folders (gpu_verify passes
them as ``--library-dir``).  libcudart, libcublas, libcublasLt and libcudnn mapped from anywhere else fail the
stack, naming both files (:func:`stray_problems`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Any

from verify_common import Problem, problem

# The libraries that must come from the venv's wheels, by their file names' stem, with the check their
# problem counts against and the wheel folder under <site-packages>/nvidia that holds them (the RECORD files
# of nvidia-cuda-runtime-cu12, nvidia-cublas-cu12 and nvidia-cudnn-cu12).
WHEEL_LIBRARIES = {
    "libcudart": ("libcudart", "cuda_runtime"),
    "libcublas": ("libcublas", "cublas"),
    "libcublasLt": ("libcublas", "cublas"),
    "libcudnn": ("libcudnn", "cudnn"),
}
LABELS = {"libcudart": "CUDA runtime", "libcublas": "cuBLAS", "libcublasLt": "cuBLASLt", "libcudnn": "cuDNN"}
# Where a wheel's files are listed: PyPA "Recording installed projects", the RECORD file (one
# ``path,hash,size`` line per file, paths relative to site-packages). NVIDIA's wheels are all named nvidia-*.
DIST_INFO_GLOB = "nvidia_*.dist-info"


def stem(path: str) -> str:
    """``/x/libcublasLt.so.12`` -> ``libcublasLt``."""
    return os.path.basename(path).split(".so", 1)[0]


def resolve(soname: str, ld_library_path: str | None, library_dirs: Sequence[str]) -> str:
    """What a TensorFlow library whose RUNPATH holds ``library_dirs`` loads for ``soname``: the file in the first
    ``LD_LIBRARY_PATH`` folder that has it, else in the first library dir that has it (a path); else ``soname``
    itself, which the loader then looks up in its cache and default folders."""
    for folder in [part for part in (ld_library_path or "").split(":") if part] + list(library_dirs):
        candidate = os.path.join(folder, soname)
        if os.path.exists(candidate):
            return candidate
    return soname


def own_file(soname: str, library_dirs: Sequence[str]) -> str:
    """The venv's own ``soname``: ``<library dir>/<soname>`` in the wheel folder of its library
    (:data:`WHEEL_LIBRARIES`), else in the first library dir that has it, else in the first library dir."""
    folder = WHEEL_LIBRARIES.get(stem(soname), ("", ""))[1]
    ordered = [d for d in library_dirs if folder and d.rstrip("/").endswith(f"/nvidia/{folder}/lib")]
    ordered += [d for d in library_dirs if d not in ordered]
    for directory in ordered:
        if os.path.exists(os.path.join(directory, soname)):
            return os.path.join(directory, soname)
    return os.path.join(ordered[0] if ordered else "<site-packages>/nvidia/<wheel>/lib", soname)


def is_own(path: str, library_dirs: Sequence[str]) -> bool:
    """Whether ``path`` (a file mapped: its real path) lies in one of ``library_dirs``."""
    folder = os.path.realpath(os.path.dirname(path))
    return any(folder == os.path.realpath(directory) for directory in library_dirs)


def strays(paths: Sequence[str], library_dirs: Sequence[str]) -> list[str]:
    """The files of :data:`WHEEL_LIBRARIES` among ``paths`` that lie outside ``library_dirs``, once each."""
    found: list[str] = []
    for path in paths:
        if path and stem(path) in WHEEL_LIBRARIES and not is_own(path, library_dirs) and path not in found:
            found.append(path)
    return found


def soname_of(path: str) -> str:
    """The soname a mapped file stands for: ``libcudart.so.12.5.82`` -> ``libcudart.so.12`` (the wheels' files
    are named by their sonames, NVIDIA's toolkit names them by the full version)."""
    name = os.path.basename(path)
    head, _dot, suffix = name.partition(".so.")
    return f"{head}.so.{suffix.split('.')[0]}" if suffix else name


def stray_problem(path: str, source: str, library_dirs: Sequence[str], stack: str | None, who: str) -> Problem:
    """One library mapped from outside the wheels: both files, what put the other one first and the fix.
    ``source``: what puts its folder on the loader path (``LD_LIBRARY_PATH``, an ld.so.conf.d file, ...);
    ``who``: the process that mapped it (``the probe``, ``TensorFlow``)."""
    key = stem(path)
    check = WHEEL_LIBRARIES[key][0]
    own = own_file(soname_of(path), library_dirs)
    missing = "" if os.path.exists(own) else ", which is missing"
    folder = os.path.dirname(path)
    cause = (
        f"{who} mapped {LABELS[key]} {path} (its folder {folder} is on the loader path through {source}) instead "
        f"of the venv's own {own}{missing}: a library of another CUDA shadows the stack's NVIDIA wheels, so "
        "TensorFlow loads a mix of the two."
    )
    if missing:
        fix = (
            "rerun playbooks/tensorflow.yml (or site.yml): tf_venv installs the venv again from its lock of "
            "tensorflow[and-cuda], whose NVIDIA wheels hold this library"
        )
    else:
        fix = (
            f"remove {folder} from {source} where it is set (a login file, the unit's Environment=, the user's "
            f"shell), or run the program through `tf-stack run {stack or '<stack>'}`, which puts the venv's "
            "library folders first"
        )
    return problem(check, cause, fix)


def wheel_of(path: str | None) -> tuple[str, str] | None:
    """NVIDIA's wheel that installed ``path`` (``<site-packages>/nvidia/<folder>/lib/<file>``): ``(project,
    version)`` of the ``nvidia_*.dist-info`` whose RECORD lists the file, or None (not a wheel's file)."""
    parts = os.path.normpath(path or "").split(os.sep)
    if "nvidia" not in parts[:-1]:
        return None
    index = len(parts) - 1 - parts[::-1].index("nvidia")
    site, member = os.sep.join(parts[:index]) or os.sep, "/".join(parts[index:])
    for info in sorted(glob.glob(os.path.join(site, DIST_INFO_GLOB))):
        try:
            with open(os.path.join(info, "RECORD"), encoding="utf-8", errors="replace") as handle:
                listed = any(line.split(",", 1)[0] == member for line in handle)
        except OSError:
            continue
        if listed:
            project, _dash, version = os.path.basename(info)[: -len(".dist-info")].rpartition("-")
            return project.replace("_", "-"), version
    return None


def wheel_fields(path: str | None) -> dict[str, Any]:
    """``{"wheel": "nvidia-cuda-runtime-cu12 12.5.82"}`` for a file a wheel installed, else ``{}``."""
    found = wheel_of(path)
    return {"wheel": f"{found[0]} {found[1]}"} if found else {}
