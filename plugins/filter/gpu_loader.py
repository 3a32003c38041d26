"""Filters for the dynamic loader's cache that gpu_env refreshes (ldconfig(8)).

``gpu_ldconfig_problem``: the registered result of ``ldconfig`` -> why it fails the host (cause and
fix), or ``''``. ldconfig exits 0 with warnings on stderr, such as "<file> is not a symbolic link" for
a library whose soname name is a copy instead of a link, and keeps such names out of the cache: a
complaint fails the host as an exit status does.

Documented in plugins/filter/gpu_ldconfig_problem.yml.
"""

from __future__ import annotations

from typing import Any

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
    """Dynamic loader filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_ldconfig_problem": gpu_ldconfig_problem}
