"""Filter ``gpu_driver_module_version``: the version of the loaded NVIDIA kernel module.

Reads the text of ``/proc/driver/nvidia/version`` (the check in the NVIDIA CUDA Installation Guide
for Linux, section "Verify the Driver Version") with the collection's shared parser, so the role
compares whole versions instead of looking for a substring. Documented in gpu_driver_module_version.yml.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_parsers import parse_proc_driver_version


def gpu_driver_module_version(text: str | None) -> str | None:
    """``{{ proc_text | gpu_fleet.tf_hosts.gpu_driver_module_version }}``: the version on the
    ``NVRM version:`` line (``535.104.05``), or None when the text has none (no module loaded)."""
    return parse_proc_driver_version(text)


class FilterModule:
    """Driver version filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_driver_module_version": gpu_driver_module_version}
