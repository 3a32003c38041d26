# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Filter ``gpu_kernel_modules``: whether a host gets NVIDIA kernel modules.

One decision, made the same way by gpu_preflight (which kernel checks to run) and nvidia_driver
(what to install). A container shares its host's kernel, so the host's module serves it and only
the driver's user-space part belongs inside (NVIDIA driver README, "Installing the NVIDIA Driver":
``--no-kernel-modules``).
"""

from __future__ import annotations

from typing import Any

# ``virtualization_type`` values (ansible.builtin.setup) of hosts that share another machine's
# kernel: they never get kernel modules.
CONTAINER_TYPES = frozenset({"container", "docker", "podman", "lxc", "containerd", "systemd-nspawn", "openvz"})
SETTINGS = {"auto": None, "true": True, "yes": True, "false": False, "no": False}


def kernel_modules(setting: Any, facts: dict[str, Any]) -> bool:
    """``auto`` means yes except in a container (``virtualization_role`` guest of a container
    type); ``true``/``false`` (or booleans) force the answer.

    Raises:
        ValueError: the setting is none of auto, true, false.
    """
    key = str(setting).strip().lower()
    if key not in SETTINGS:
        raise ValueError(f"nvidia_driver_kernel_modules is {setting!r}; it must be auto, true or false")
    forced = SETTINGS[key]
    if forced is not None:
        return forced
    in_container = facts.get("virtualization_role") == "guest" and facts.get("virtualization_type") in CONTAINER_TYPES
    return not in_container


class FilterModule:
    """Kernel-module decision."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_kernel_modules": kernel_modules}
