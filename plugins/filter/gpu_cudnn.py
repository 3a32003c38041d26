"""Filters for cuDNN in the toolkit trees of roles/cudnn: what its one look reads, what each tree needs
and why an archive is refused.

``gpu_cudnn_look``: the stacks -> the paths of one ``gpu_host_probe`` look at every toolkit tree.
``gpu_cudnn_trees``: the stacks and that look -> the trees the install loop takes and ``cudnn_plan``'s lines.
``gpu_cudnn_layout_problem``: what an archive unpacked to -> the stop's text (cause, then fix).

Installed means by content: the version header says the pinned version, the pinned library is there,
the soname link leads to it (ldconfig points libcudnn.so.<major> at the newest file of that soname), no
other cuDNN <major> version is left in the tree to win that race, and the record of the last completed
copy names the pinned version. Each filter is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_stack import cudnn_header_version
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.host_cache import may_hold
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message

# The completion record's name in a toolkit tree, written last by tasks/unpack.yml.
DONE_NAME = ".gpu_fleet_cudnn.done"
PLAN_TEXTS = {
    "installed": "cuDNN {short} in {root}",
    "other": "cuDNN {found} -> {short} in {root}",
    "reinstall": "cuDNN {short} would be reinstalled (incomplete) into {root}",
    "install": "cuDNN {short} would be installed into {root}",
}
MESSAGES: dict[str, Message] = {
    "layout": Message(
        "{file} unpacked to {found}, without {missing}, where a {form} archive has them. Nothing was copied "
        "into {root}.",
        "Use NVIDIA's archive under its own name: {supported}.",
    ),
}


def tree_paths(stack: dict) -> dict[str, str]:
    """What the look reads of the tree ``stack``'s cuDNN goes into: the pinned library, the soname link, the
    version header, the completion record and the glob of every library of the pinned major."""
    root, cudnn = stack["cuda_toolkit"]["root"], stack["cudnn"]
    return {
        "library": f"{root}/lib64/libcudnn.so.{cudnn['short']}",
        "soname": f"{root}/lib64/libcudnn.so.{cudnn['major']}",
        "header": f"{root}/include/cudnn_version.h",
        "done": f"{root}/{DONE_NAME}",
        "same_major": f"{root}/lib64/libcudnn*.so.{cudnn['major']}.*",
    }


def _trees(stacks: list[dict]) -> list[dict]:
    """The stacks, one per toolkit tree (the first stack of each tree), in order."""
    seen: dict[str, dict] = {}
    for stack in stacks:
        seen.setdefault(stack["cuda_toolkit"]["root"], stack)
    return list(seen.values())


def gpu_cudnn_look(stacks: list[dict]) -> dict[str, list[str]]:
    """``stat``, ``read`` and ``glob`` of one gpu_host_probe look at every tree of ``stacks``."""
    look: dict[str, list[str]] = {"stat": [], "read": [], "glob": []}
    for stack in _trees(stacks):
        paths = tree_paths(stack)
        look["stat"] += [paths["library"], paths["soname"]]
        look["read"] += [paths["header"], paths["done"]]
        look["glob"].append(paths["same_major"])
    return look


def tree_installed(stack: dict, look: dict) -> bool:
    """Whether the stack's pinned cuDNN is in its toolkit tree in full, as ``look`` found it."""
    paths, short = tree_paths(stack), stack["cudnn"]["short"]
    reads, stats = look.get("read") or {}, look.get("stat") or {}
    header = reads.get(paths["header"])
    pinned = re.compile(r"^libcudnn.*[.]so[.]" + re.escape(short) + "$")
    others = [
        path
        for path in (look.get("glob") or {}).get(paths["same_major"]) or []
        if not pinned.match(posixpath.basename(path))
    ]
    return (
        isinstance(header, str)
        and cudnn_header_version(header) == short
        and bool((stats.get(paths["library"]) or {}).get("exists"))
        and posixpath.basename((stats.get(paths["soname"]) or {}).get("lnk_source") or "") == f"libcudnn.so.{short}"
        and not others
        and (reads.get(paths["done"]) or "").strip() == stack["cudnn"]["version"]
    )


def _cached(stack: dict, inputs: dict) -> bool:
    """Whether the stack's archive may be in the host cache (its removal is to be tried): never when the
    cache is kept; else when gpu_preflight found it there or what the cache holds is unknown."""
    return may_hold(f"/cudnn/{stack['cudnn']['version']}/{stack['cudnn']['archive']['file']}", inputs)


def gpu_cudnn_trees(stacks: list[dict], look: dict, inputs: dict) -> dict[str, Any]:
    """``work`` (the stacks whose tree the install loop takes, each with ``installed``: trees without the
    pinned cuDNN in full, and trees whose archive may still be in the host cache) and ``plan`` ({root:
    {change, text}}). ``inputs``: ``cache_files`` (gpu_preflight's look at the host cache, None when
    unknown) and ``keep_cache``."""
    work, plan = [], {}
    for stack in _trees(stacks):
        installed = tree_installed(stack, look)
        header = (look.get("read") or {}).get(tree_paths(stack)["header"])
        found = cudnn_header_version(header) if isinstance(header, str) else ""
        short = stack["cudnn"]["short"]
        key = "installed" if installed else "other" if found not in ("", short) else "reinstall" if found else "install"
        fields = {"short": short, "found": found, "root": stack["cuda_toolkit"]["root"]}
        plan[fields["root"]] = {"change": not installed, "text": PLAN_TEXTS[key].format(**fields)}
        if not installed or _cached(stack, inputs):
            work.append(dict(stack, installed=installed))
    return {"work": work, "plan": plan}


def gpu_cudnn_layout_problem(unpacked: list[str], missing: list[str], inputs: dict) -> str:
    """The stop when the archive (``inputs``: ``file``, ``root``, ``layout`` with ``form`` and ``supported``)
    unpacked to ``unpacked`` (paths) without the ``missing`` members its layout has."""
    names = ", ".join(sorted(posixpath.basename(path) for path in unpacked)) or "nothing"
    layout = inputs.get("layout") or {}
    return MESSAGES["layout"].text(
        file=inputs.get("file"),
        found=names,
        missing=" or ".join(missing),
        form=layout.get("form"),
        root=inputs.get("root"),
        supported=layout.get("supported"),
    )


class FilterModule:
    """cuDNN filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_cudnn_look": gpu_cudnn_look,
            "gpu_cudnn_trees": gpu_cudnn_trees,
            "gpu_cudnn_layout_problem": gpu_cudnn_layout_problem,
        }
