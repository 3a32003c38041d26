"""Filter of the gpu_bundle role: the command line of ``pip download`` for the hosts' Python and platform.

``gpu_bundle_pip_download``: the download's settings and what to download -> the argv.
"""

from __future__ import annotations

from typing import Any


def gpu_bundle_pip_download(settings: dict[str, Any], requirements: list[str]) -> list[str]:
    """``settings``: ``python`` (the controller's, which runs pip), ``dest`` (the bundle's wheel folder),
    ``python_version`` (X.Y of the hosts) and ``platform`` (a wheel platform tag); ``requirements``: pip's
    arguments naming what to download (``-r <lock>`` and its options, or requirement specifiers).
    Binary wheels only, for CPython: pip downloads for another interpreter and platform only so
    (pip documentation, "pip download", options --platform and --only-binary)."""
    return [
        str(settings["python"]), "-m", "pip", "download", "--dest", str(settings["dest"]), "--only-binary=:all:",
        "--implementation", "cp", "--python-version", str(settings["python_version"]),
        "--platform", str(settings["platform"]), "--progress-bar", "off",
        *[str(part) for part in requirements or []],
    ]  # fmt: skip


class FilterModule:
    """gpu_bundle filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_bundle_pip_download": gpu_bundle_pip_download}
