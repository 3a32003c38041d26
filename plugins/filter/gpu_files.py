"""Filter ``gpu_files_into``: files of the controller as the items of the action gpu_files, each copied
into one folder on the host under its own name (the verification scripts, the health check's files)."""

from __future__ import annotations

import posixpath
from typing import Any


def gpu_files_into(paths: list[str], folder: str, mode: str = "0644") -> list[dict[str, Any]]:
    """``{{ paths | gpu_fleet.tf_hosts.gpu_files_into('/opt/gpu-verify') }}`` ->
    ``[{'dest': '/opt/gpu-verify/<name>', 'src': <path>, 'mode': '0644'}, ...]``, in the order given."""
    return [
        {"dest": f"{folder}/{posixpath.basename(str(path))}", "src": str(path), "mode": mode} for path in paths or []
    ]


class FilterModule:
    """gpu_files filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_files_into": gpu_files_into}
