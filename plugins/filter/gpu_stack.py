"""Resolve pinned GPU software stacks against the version matrix and the artifact manifest.

A *stack* is what one TensorFlow virtual environment needs: TensorFlow, the Python interpreter that
runs it, a CUDA toolkit and a cuDNN release, plus the NVIDIA driver underneath (one per host).
Users pin some of these in the inventory (``gpu_preflight_stacks``); everything left out is taken
from the version matrix (``data/version_matrix.yml``) and the artifact manifest
(``data/artifacts.yml`` plus overlays). Every problem is collected, not only the first, and each one
names its cause and a concrete fix.

Facts used here and their sources are listed in ``data/version_matrix.yml``; the cuDNN rule (same
major, equal or higher minor) is TensorFlow's own run-time check in ``cuda_dnn.cc``, quoted in
tensorflow/tensorflow#62626.

Exposed to Ansible as the filters ``gpu_stacks_resolve``, ``cudnn_header_version`` and
``gpu_tf_requirement``; plain
functions for unit tests.
"""

from __future__ import annotations

import re
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

DEFAULT_PYTHON = "/usr/bin/python3"
PIN_KEYS = ("name", "tensorflow", "cuda", "cudnn", "python", "package", "venv")
DEFAULT_VENV_ROOT = "/opt/tensorflow"
CUDA_ROOT_PREFIX = "/usr/local/cuda-"

Problem = dict[str, str]


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


def _pick_artifact(manifest: dict, component: str, prefix: str, **match: Any) -> tuple[str, dict] | None:
    """Newest manifest entry of ``component`` whose version starts with ``prefix``."""
    found = [
        (name, entry)
        for name, entry in manifest.items()
        if entry.get("component") == component
        and _starts(str(entry.get("version")), prefix)
        and all(entry.get(k) == val for k, val in match.items())
    ]
    if not found:
        return None
    return max(found, key=lambda item: _v(item[1]["version"]))


def _artifact_record(name: str, entry: dict) -> dict:
    return {
        "file": name,
        "sha256": entry.get("sha256"),
        "size_bytes": entry.get("size_bytes"),
        "url": entry.get("url"),
    }


def resolve_stack(pin: dict, matrix: dict, manifest: dict, host: dict) -> dict:
    """Resolve one stack pin.

    Args:
        pin: ``{name: str, tensorflow: 'X.Y' | 'X.Y.Z', cuda?: 'X.Y' | 'X.Y.Z', cudnn?: 'X.Y' |
            'X.Y.Z' | 'X.Y.Z.B', python?: path, package?: pip name, venv?: path}``.
        matrix: the parsed ``data/version_matrix.yml``.
        manifest: ``{file name: entry}`` from the merged artifact manifests.
        host: ``{python_version: 'X.Y.Z' (of pin['python'] on the host), driver_version: the driver
            the host will run, gpus?: [{index, name, compute_capability: 'X.Y'}] (nvidia_gpu_facts)}``.

    Returns:
        ``{ok: bool, stack: dict | None, problems: [{stack, check, cause, fix}], warnings: [...]}``.
        ``stack`` is None when TensorFlow itself could not be resolved.

    Raises:
        KeyError: when ``pin`` has no ``name`` or ``tensorflow`` (argument specs prevent this).
    """
    name = pin["name"]
    problems: list[Problem] = []
    warnings: list[Problem] = []

    def problem(check: str, cause: str, fix: str) -> None:
        problems.append({"stack": name, "check": check, "cause": cause, "fix": fix})

    # TensorFlow: the anchor of the chain.
    tf_pin = str(pin["tensorflow"])
    tf_series = _series(tf_pin)
    tf_row = matrix["tensorflow"].get(tf_series)
    if tf_row is None:
        problem(
            "tensorflow",
            f"TensorFlow {tf_pin} is not in the version matrix.",
            f"Pin one of TensorFlow {_range_text(list(matrix['tensorflow']))}, or add a row with its "
            "sources to data/version_matrix.yml.",
        )
        return {"ok": False, "stack": None, "problems": problems, "warnings": warnings}
    tf_version = tf_row["latest"] if tf_pin == tf_series else tf_pin
    if tf_version in matrix.get("known_bad", {}):
        warnings.append(
            {
                "stack": name,
                "check": "tensorflow",
                "cause": f"TensorFlow {tf_version}: " + matrix["known_bad"][tf_version].strip(),
                "fix": "",
            }
        )

    # Python: TensorFlow's tested range.
    python_path = pin.get("python") or DEFAULT_PYTHON
    py_text = str(host.get("python_version", ""))
    try:
        py_version = _v(py_text)
    except InvalidVersion:
        py_version = None
        problem(
            "python",
            f"Could not read the version of {python_path} on the host ({py_text!r}).",
            f"Install Python {_spec_text(tf_row['python'])} or point the stack's python at it.",
        )
    if py_version is not None and not SpecifierSet(tf_row["python"]).contains(py_version):
        fits = tensorflow_series_for_python(matrix, py_version)
        alternative = (
            f"pin TensorFlow {_range_text(fits)} for Python {_series(py_text)}"
            if fits
            else f"no TensorFlow in the matrix supports Python {_series(py_text)}"
        )
        problem(
            "python",
            f"TensorFlow {tf_series} supports Python {_spec_text(tf_row['python'])}; "
            f"{python_path} on this host is {py_text}.",
            f"Point the stack's python at a Python {_spec_text(tf_row['python'])} interpreter, or {alternative}.",
        )

    # CUDA: the toolkit TensorFlow was built with, unless the user chose a compatible one.
    built_cuda = tf_row["cuda"]
    cuda_pin = str(pin.get("cuda") or built_cuda)
    if cuda_pin.split(".")[0] != built_cuda.split(".")[0]:
        problem(
            "cuda",
            f"TensorFlow {tf_series} was built with CUDA {built_cuda}; CUDA {cuda_pin} is another "
            "major release, whose runtime library TensorFlow does not load.",
            f"Pin CUDA {built_cuda} for TensorFlow {tf_series}, or leave cuda out to take it from the matrix.",
        )
    elif _series(cuda_pin) != built_cuda:
        warnings.append(
            {
                "stack": name,
                "check": "cuda",
                "cause": f"TensorFlow {tf_series} was tested with CUDA {built_cuda}, not {_series(cuda_pin)}.",
                "fix": f"Pin CUDA {built_cuda} unless you have tested {_series(cuda_pin)}.",
            }
        )
    cuda = None
    picked = _pick_artifact(manifest, "cuda_toolkit", cuda_pin)
    if picked is None:
        problem(
            "cuda",
            f"No CUDA {cuda_pin} runfile is in the artifact manifest.",
            f"Add its cuda_{cuda_pin}*_linux.run entry with a sha256 to an artifact manifest "
            "(gpu_preflight_manifest_overlays), or pin a CUDA release the manifest has.",
        )
    else:
        runfile, entry = picked
        cuda_version = str(entry["version"])
        min_driver = cuda_min_driver(matrix, cuda_version)
        if min_driver is None:
            problem(
                "cuda",
                f"CUDA {cuda_version} has no minimum-driver row in the version matrix.",
                "Add it to data/version_matrix.yml from NVIDIA's CUDA release notes.",
            )
        cuda = {
            "version": cuda_version,
            "series": _series(cuda_version),
            "root": CUDA_ROOT_PREFIX + _series(cuda_version),
            "nvcc_version": entry.get("nvcc_version"),
            "min_driver": matrix["cuda"][cuda_version]["min_driver"] if min_driver else None,
            "runfile": _artifact_record(runfile, entry),
        }

    # cuDNN: TensorFlow accepts the same major and an equal or higher minor than it was built with.
    built_cudnn = tf_row["cudnn"]
    cudnn_pin = str(pin.get("cudnn") or built_cudnn)
    b_major, b_minor = (int(x) for x in built_cudnn.split("."))
    try:
        p_parts = [int(x) for x in cudnn_pin.split(".")]
    except ValueError:
        p_parts = []
    if len(p_parts) < 2:
        problem(
            "cudnn",
            f"cuDNN pin {cudnn_pin!r} is not a version like 8.6 or 8.6.0.163.",
            f"Pin cuDNN {built_cudnn} for TensorFlow {tf_series}.",
        )
    elif p_parts[0] != b_major or p_parts[1] < b_minor:
        problem(
            "cudnn",
            f"TensorFlow {tf_series} was built with cuDNN {built_cudnn}; it refuses cuDNN "
            f"{_series(cudnn_pin)} (it needs the same major and an equal or higher minor).",
            f"Pin cuDNN {built_cudnn} for TensorFlow {tf_series}.",
        )
    cudnn = None
    cuda_major = int(cuda_pin.split(".")[0])
    picked = _pick_artifact(manifest, "cudnn", cudnn_pin, cuda_major=cuda_major)
    if picked is None:
        problem(
            "cudnn",
            f"No cuDNN {cudnn_pin} archive for CUDA {cuda_major} is in the artifact manifest.",
            f"Add its cudnn-linux-x86_64-{cudnn_pin}*_cuda{cuda_major}-archive.tar.xz entry with a sha256 "
            "to an artifact manifest (gpu_preflight_manifest_overlays).",
        )
    else:
        archive, entry = picked
        version = str(entry["version"])
        cudnn = {
            "version": version,
            "short": _series(version, 3),
            "series": _series(version),
            "major": int(version.split(".")[0]),
            "archive": _artifact_record(archive, entry),
        }

    # Driver: the runtime must not be newer than the driver.
    driver_text = str(host.get("driver_version") or "")
    if cuda and cuda["min_driver"] and driver_text:
        driver = _v(driver_text)
        if driver < _v(cuda["min_driver"]):
            older = [s for s in tensorflow_series_for_driver(matrix, driver) if _v(s) < _v(tf_series)]
            alternative = f" or pin TensorFlow {_range_text(older)}" if older else ""
            problem(
                "driver",
                f"CUDA {cuda['version']} needs driver >= {cuda['min_driver']}; the pinned driver is {driver_text}.",
                f"Raise nvidia_driver_version to >= {cuda['min_driver']}{alternative}.",
            )

    # GPUs: the wheel must carry code for the oldest GPU on the host.
    floor = _v(tf_row["min_compute_capability"])
    for gpu in host.get("gpus") or []:
        cap = gpu.get("compute_capability")
        if cap and _v(cap) < floor:
            problem(
                "compute_capability",
                f"GPU {gpu.get('index')} ({gpu.get('name')}) has compute capability {cap}; the "
                f"TensorFlow {tf_series} wheel needs >= {tf_row['min_compute_capability']}.",
                "Pin an older TensorFlow that still ships code for it, or use newer GPUs.",
            )

    for part, rec in (("cuda", cuda and cuda["runfile"]), ("cudnn", cudnn and cudnn["archive"])):
        if rec and not rec["sha256"]:
            problem(
                part,
                f"{rec['file']} has no sha256 in the artifact manifest.",
                "Add the sha256 of the file you downloaded to an overlay manifest "
                "(gpu_preflight_manifest_overlays); unpinned files are never installed.",
            )

    series_dir = tf_series
    stack = {
        "name": name,
        "tensorflow": {
            "version": tf_version,
            "series": tf_series,
            "package": pin.get("package") or "",
            "built_cuda": built_cuda,
            "built_cudnn": built_cudnn,
        },
        "python": {"path": python_path, "version": py_text},
        "cuda_toolkit": cuda,
        "cudnn": cudnn,
        "venv": pin.get("venv") or f"{DEFAULT_VENV_ROOT}/{series_dir}",
    }
    return {"ok": not problems, "stack": stack, "problems": problems, "warnings": warnings}


def resolve_stacks(pins: list[dict], matrix: dict, manifest: dict, host: dict, default: str = "") -> dict:
    """Resolve every stack of a host and check that they can live side by side.

    Args:
        pins: list of stack pins (see :func:`resolve_stack`).
        matrix, manifest: as for :func:`resolve_stack`.
        host: as for :func:`resolve_stack`, plus ``python_versions: {path: 'X.Y.Z'}`` giving the
            version of each stack's interpreter, and ``driver_install: bool`` (the driver is
            installed from its runfile, so the manifest must have it).
        default: name of the default stack (owns ``/usr/local/cuda`` and the system library path);
            empty means the first stack.

    Returns:
        ``{ok, stacks: [stack...], default: name, driver: {version, runfile} | None, problems,
        warnings,
        messages: ['<stack>: <cause> <fix>', ...]}``; ``stacks`` holds only resolved stacks, each
        with ``default: bool``.
    """
    problems: list[Problem] = []
    warnings: list[Problem] = []
    stacks: list[dict] = []
    if not pins:
        problems.append(
            {
                "stack": "-",
                "check": "stacks",
                "cause": "No stack is pinned.",
                "fix": "Set gpu_preflight_stacks in the inventory (see inventories/gpu_hosts).",
            }
        )
    for index, pin in enumerate(pins):
        label = str(pin.get("name") or f"stack #{index + 1}")
        unknown = sorted(set(pin) - set(PIN_KEYS))
        if unknown:
            problems.append(
                {
                    "stack": label,
                    "check": "stacks",
                    "cause": f"Unknown key {', '.join(map(repr, unknown))} in gpu_preflight_stacks.",
                    "fix": f"Use only {', '.join(PIN_KEYS)} (check the spelling).",
                }
            )
        for key in ("name", "tensorflow"):
            if not pin.get(key):
                problems.append(
                    {
                        "stack": label,
                        "check": "stacks",
                        "cause": f"The stack has no {key!r}.",
                        "fix": f"Give every item of gpu_preflight_stacks a {key!r}.",
                    }
                )
    pins = [p for p in pins if p.get("name") and p.get("tensorflow")]
    names = [p.get("name") for p in pins]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(
            {
                "stack": dup,
                "check": "stacks",
                "cause": f"Stack name {dup!r} is used twice.",
                "fix": "Give every stack in gpu_preflight_stacks its own name.",
            }
        )
    default = default or (names[0] if names else "")
    if pins and default not in names:
        problems.append(
            {
                "stack": default,
                "check": "stacks",
                "cause": f"The default stack {default!r} is not one of {names}.",
                "fix": "Set gpu_preflight_default_stack to one of the stack names.",
            }
        )
    driver = None
    driver_text = str(host.get("driver_version") or "")
    if host.get("driver_install") and driver_text:
        picked = _pick_artifact(manifest, "nvidia_driver", driver_text)
        if picked is None or str(picked[1]["version"]) != driver_text:
            problems.append(
                {
                    "stack": "-",
                    "check": "driver",
                    "cause": f"No NVIDIA-Linux-x86_64-{driver_text}.run is in the artifact manifest.",
                    "fix": "Add its entry with a sha256 to an artifact manifest "
                    "(gpu_preflight_manifest_overlays), or pin a driver the manifest has.",
                }
            )
        else:
            driver = {"version": driver_text, "runfile": _artifact_record(*picked)}
            if not picked[1].get("sha256"):
                problems.append(
                    {
                        "stack": "-",
                        "check": "driver",
                        "cause": f"{picked[0]} has no sha256 in the artifact manifest.",
                        "fix": "Add the sha256 of the file you downloaded to an overlay manifest "
                        "(gpu_preflight_manifest_overlays); unpinned files are never installed.",
                    }
                )
    python_versions = host.get("python_versions") or {}
    for pin in pins:
        one_host = dict(host, python_version=python_versions.get(pin.get("python") or DEFAULT_PYTHON, ""))
        result = resolve_stack(pin, matrix, manifest, one_host)
        problems += result["problems"]
        warnings += result["warnings"]
        if result["stack"]:
            stacks.append(dict(result["stack"], default=result["stack"]["name"] == default))

    # Side by side: one toolkit tree per CUDA X.Y, one cuDNN per tree, one stack per venv.
    by_root: dict[str, dict] = {}
    by_venv: dict[str, str] = {}
    for stack in stacks:
        cuda, cudnn = stack["cuda_toolkit"], stack["cudnn"]
        if cuda:
            other = by_root.setdefault(cuda["root"], stack)
            o_cuda, o_cudnn = other["cuda_toolkit"], other["cudnn"]
            if other is not stack and o_cuda["version"] != cuda["version"]:
                problems.append(
                    {
                        "stack": stack["name"],
                        "check": "cuda",
                        "cause": f"Stacks {other['name']} and {stack['name']} want CUDA "
                        f"{o_cuda['version']} and {cuda['version']} in the same {cuda['root']}.",
                        "fix": "Pin the same CUDA release in both stacks.",
                    }
                )
            if other is not stack and cudnn and o_cudnn and o_cudnn["version"] != cudnn["version"]:
                problems.append(
                    {
                        "stack": stack["name"],
                        "check": "cudnn",
                        "cause": f"Stacks {other['name']} and {stack['name']} want cuDNN "
                        f"{o_cudnn['version']} and {cudnn['version']} in the same {cuda['root']}.",
                        "fix": "Pin the same cuDNN release for stacks that share a CUDA version.",
                    }
                )
        if stack["venv"] in by_venv:
            problems.append(
                {
                    "stack": stack["name"],
                    "check": "venv",
                    "cause": f"Stacks {by_venv[stack['venv']]} and {stack['name']} share the "
                    f"virtual environment {stack['venv']}.",
                    "fix": "Give each stack its own venv path.",
                }
            )
        by_venv.setdefault(stack["venv"], stack["name"])
    messages = [f"{p['stack'] + ': ' if p['stack'] != '-' else ''}{p['cause']} {p['fix']}".strip() for p in problems]
    return {
        "ok": not problems,
        "stacks": stacks,
        "default": default,
        "driver": driver,
        "problems": problems,
        "warnings": warnings,
        "messages": messages,
    }


def cudnn_header_version(text: str) -> str:
    """Version 'X.Y.Z' from the text of ``cudnn_version.h`` (``CUDNN_MAJOR``, ``CUDNN_MINOR``,
    ``CUDNN_PATCHLEVEL`` macros, cuDNN 8 and 9; reference 5.2), or '' when they are missing."""
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
    return resolve_stacks(pins, matrix, manifest, host, default)


class FilterModule:
    """GPU stack resolution filters."""

    def filters(self) -> dict:
        return {
            "gpu_stacks_resolve": gpu_stacks_resolve,
            "cudnn_header_version": cudnn_header_version,
            "gpu_tf_requirement": tf_requirement,
        }
