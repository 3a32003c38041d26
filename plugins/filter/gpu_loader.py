"""Filters of gpu_env: what the default stack puts on the host's system paths, and the loader's cache
that gpu_env refreshes (ldconfig(8)).

``gpu_system_cuda``: the served default stack -> the CUDA it puts on the host's system paths (``CUDA_HOME``
and ``/usr/local/cuda``'s target, the ``bin`` folders for ``PATH`` and sudo's ``secure_path``, the library
folders of ``/etc/ld.so.conf.d``), by where the stack's CUDA comes from (``SYSTEM_CUDA``): a runfile
toolkit's tree, or nothing for NVIDIA's wheels inside the venv.
``gpu_ldconfig_problem``: the registered result of ``ldconfig`` -> why it fails the host (cause and
fix), or ``''``. ldconfig exits 0 with warnings on stderr, such as "<file> is not a symbolic link" for
a library whose soname name is a copy instead of a link, and keeps such names out of the cache: a
complaint fails the host as an exit status does.

Each filter is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

# What a stack's CUDA puts on the host's system paths, by its source ({root} the toolkit's tree, {name} the
# stack). A runfile toolkit: its tree for CUDA_HOME and /usr/local/cuda, its bin and lib64 (where the cudnn
# role puts the stack's cuDNN too). NVIDIA's wheels: nothing; TensorFlow finds them inside the venv through
# the RUNPATH of its own libraries (TensorFlow, "Install TensorFlow with pip",
# https://www.tensorflow.org/install/pip#linux), and a system CUDA on the loader path could shadow them.
SYSTEM_CUDA: dict[str, dict[str, Any]] = {
    "runfile": {
        "home": "{root}",
        "bin": ["{root}/bin"],
        "lib": ["{root}/lib64"],
        "text": "PATH and the library path set for {root}",
    },
    "wheels": {
        "home": None,
        "bin": [],
        "lib": [],
        "text": "no system CUDA: the default stack {name} takes CUDA from NVIDIA's wheels in its venv",
    },
}


def _filled(value: Any, fields: dict[str, str]) -> Any:
    if isinstance(value, list):
        return [_filled(item, fields) for item in value]
    return value.format(**fields) if isinstance(value, str) else value


def gpu_system_cuda(stack: dict[str, Any]) -> dict[str, Any]:
    """``{home, bin, lib, text}``: what the served default ``stack`` (a resolved stack) puts on the host's
    system paths; ``home`` None and empty lists for a stack whose CUDA comes from NVIDIA's wheels."""
    try:
        toolkit = stack["cuda_toolkit"]
        source = toolkit.get("source") or "runfile"
        fields = {"root": str(toolkit.get("root")), "name": str(stack["name"])}
    except (KeyError, TypeError, AttributeError) as error:
        raise AnsibleFilterError(f"gpu_system_cuda: not a resolved stack (no {error})") from None
    if source not in SYSTEM_CUDA:
        raise AnsibleFilterError(
            f"gpu_system_cuda: stack {fields['name']}: unknown CUDA source {source!r} (known: {', '.join(SYSTEM_CUDA)})"
        )
    if SYSTEM_CUDA[source]["home"] and not toolkit.get("root"):
        raise AnsibleFilterError(f"gpu_system_cuda: stack {fields['name']}: a {source} CUDA without a toolkit root")
    return {key: _filled(value, fields) for key, value in SYSTEM_CUDA[source].items()}


CAUSE = "ldconfig {how} while refreshing the loader cache: {said}."
FIX = (
    'A file named "is not a symbolic link" is a library\'s soname name (such as libcudnn.so.8) that is a copy, not a '
    "link to the versioned file: replace it with the link (ln -sf <versioned file> <name> in its folder), or "
    "reinstall what put it there, then rerun."
)


def gpu_ldconfig_problem(result: dict[str, Any] | None) -> str:
    """Why ldconfig's run fails the host, or ``''`` (also for a run that was skipped)."""
    result = result or {}
    rc = int(result.get("rc") or 0)
    if rc == 0 and not result.get("stderr"):
        return ""
    how = f"exited {rc}" if rc != 0 else "complained"
    # ldconfig ends each complaint with an empty line (tests/fixtures/real_outputs/ldconfig-copied-cudnn-8.6.0.stderr).
    said = "; ".join(line for line in result.get("stderr_lines") or [] if line.strip()) or "no message"
    return f"{CAUSE.format(how=how, said=said)} {FIX}"


class FilterModule:
    """gpu_env filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_ldconfig_problem": gpu_ldconfig_problem, "gpu_system_cuda": gpu_system_cuda}
