"""Filter ``gpu_artifact_problem``: what is wrong with an artifact file on the controller, if anything.

The sha256 pin says whether a file is the pinned one; this says, before anything is pushed, why a
file cannot be used in words an administrator can act on: a folder where a file should be, a
download cut short (fewer bytes than the manifest's ``size_bytes``), or a file that is not of its
kind at all (an HTML error page saved under an archive's name, which a pin taken from that page
would even accept). Filters run on the controller, where the files are. Documented in
gpu_artifact_problem.yml.

Formats, by the first bytes of the file:

- ``.tar.xz``: the XZ magic bytes ``FD 37 7A 58 5A 00`` (The .xz File Format, section 2.1.1.1
  "Header Magic Bytes", https://tukaani.org/xz/xz-file-format.txt);
- ``.tgz`` and ``.tar.gz``: the gzip ID bytes ``1F 8B`` (RFC 1952, section 2.3.1);
- ``.run``: a shell script (``#!``): NVIDIA's runfiles are self-extracting archives made with
  makeself, whose header is a shell script (https://makeself.io/).
"""

from __future__ import annotations

import os
from typing import Any

# (file name suffix, magic bytes, what the file should be)
FORMATS = (
    (".tar.xz", b"\xfd7zXZ\x00", "an xz-compressed tar archive"),
    (".tgz", b"\x1f\x8b", "a gzip-compressed tar archive"),
    (".tar.gz", b"\x1f\x8b", "a gzip-compressed tar archive"),
    (".run", b"#!", "a self-extracting runfile (a shell script)"),
)


def _format_problem(path: str, name: str) -> str:
    for suffix, magic, kind in FORMATS:
        if name.endswith(suffix):
            with open(path, "rb") as handle:
                head = handle.read(max(len(magic), 16))
            if head.startswith(magic):
                return ""
            shown = head.decode("ascii", "replace").replace("\ufffd", "?").strip() or repr(head)
            return f"{name} is not {kind}: it starts with {shown!r}. The download saved something else (an error page?)"
    return ""


def gpu_artifact_problem(path: str, record: dict[str, Any]) -> str:
    """``{{ path | gpu_fleet.tf_hosts.gpu_artifact_problem(record) }}``: '' when the file at ``path``
    (on the controller) can be what the manifest ``record`` ({file, size_bytes?}) describes,
    otherwise the cause. A missing file is '' (the caller says where to get it)."""
    name = record.get("file") or os.path.basename(path)
    if os.path.isdir(path):
        return f"{path} is a folder, not the file {name}"
    if not os.path.isfile(path):
        return ""
    size, want = os.path.getsize(path), record.get("size_bytes")
    if want and size < int(want):
        return f"{name} has {size} bytes; the manifest says {int(want)}. The download was cut short"
    return _format_problem(path, name)


def stack_artifact_problems(stack: dict[str, Any], problems: dict[str, str]) -> str:
    """``{{ stack | gpu_fleet.tf_hosts.gpu_stack_artifact_problems(problems) }}``: what is wrong with
    the artifacts a resolved stack installs from (its toolkit's runfile, its cuDNN archive), from
    ``problems`` ({file: text}, gpu_artifacts' verification); '' when nothing is."""
    files = [
        (stack.get("cuda_toolkit") or {}).get("runfile", {}).get("file"),
        (stack.get("cudnn") or {}).get("archive", {}).get("file"),
    ]
    return " ".join(problems[name] for name in dict.fromkeys(files) if name in problems)


class FilterModule:
    """Artifact file filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_artifact_problem": gpu_artifact_problem, "gpu_stack_artifact_problems": stack_artifact_problems}
