"""Filters of the action gpu_files: ``gpu_files_into`` (files of the controller as its items, each copied into
one folder on the host under its own name: the verification scripts, the health check's files) and
``gpu_files_look`` (what a role's own look at the host must see so that the action needs no look of its own)."""

from __future__ import annotations

import posixpath
from typing import Any


def gpu_files_into(paths: list[str], folder: str, mode: str = "0644") -> list[dict[str, Any]]:
    """``{{ paths | gpu_fleet.tf_hosts.gpu_files_into('/opt/gpu-verify') }}`` ->
    ``[{'dest': '/opt/gpu-verify/<name>', 'src': <path>, 'mode': '0644'}, ...]``, in the order given."""
    return [
        {"dest": f"{folder}/{posixpath.basename(str(path))}", "src": str(path), "mode": mode} for path in paths or []
    ]


def gpu_files_look(files: list[dict[str, Any]]) -> dict[str, list[str]]:
    """``{{ files | gpu_fleet.tf_hosts.gpu_files_look }}`` -> the arguments ``stat`` (every dest and every folder
    of one that is not itself a dest) and ``checksum`` (every dest that is no link) of gpu_host_probe: what the
    action gpu_files looks at before it writes. A role that looks at the host anyway adds them to its look and
    hands the result to gpu_files (``looked``), which then writes what differs without a look of its own."""
    dests = [str(item["dest"]) for item in files or []]
    folders = sorted({posixpath.dirname(dest) for dest in dests} - set(dests))
    return {"stat": dests + folders, "checksum": [str(i["dest"]) for i in files or [] if "link" not in i]}


class FilterModule:
    """gpu_files filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_files_into": gpu_files_into, "gpu_files_look": gpu_files_look}
