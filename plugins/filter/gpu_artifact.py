"""Filter ``gpu_artifact_problem``: what is wrong with an artifact file on the controller, if anything.

The sha256 pin says whether a file is the pinned one; this says, before anything is pushed, why a
file cannot be used in words an administrator can act on: a folder where a file should be, a
download cut short (fewer bytes than the manifest's ``size_bytes``), or a file that is not of its
kind at all (an HTML error page saved under an archive's name, which a pin taken from that page
would even accept). Filters run on the controller, where the files are. Documented in
gpu_artifact_problem.yml.

gpu_artifacts' verification on the controller: ``gpu_artifacts_needed`` (what the play's hosts need,
each file once), ``gpu_artifacts_checked`` (each record beside its controller hash),
``gpu_artifacts_problems`` (each unusable file's stop, from the catalog ``MESSAGES``) and
``gpu_artifacts_host_problems`` (what that means for one host). Each is documented in <name>.yml.

Formats, by the first bytes of the file:

- ``.tar.xz``: the XZ magic bytes ``FD 37 7A 58 5A 00`` (The .xz File Format, section 2.1.1.1
  "Header Magic Bytes", https://tukaani.org/xz/xz-file-format.txt);
- ``.tgz`` and ``.tar.gz``: the gzip ID bytes ``1F 8B`` (RFC 1952, section 2.3.1);
- ``.run``: a shell script (``#!``): NVIDIA's runfiles are self-extracting archives made with
  makeself, whose header is a shell script (https://makeself.io/).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_proxy import masked, proxy_for
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import COLLECTION_ROOT
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message

# (file name suffix, magic bytes, what the file should be)
FORMATS = (
    (".tar.xz", b"\xfd7zXZ\x00", "an xz-compressed tar archive"),
    (".tgz", b"\x1f\x8b", "a gzip-compressed tar archive"),
    (".tar.gz", b"\x1f\x8b", "a gzip-compressed tar archive"),
    (".run", b"#!", "a self-extracting runfile (a shell script)"),
)
# Every stop of the controller's verification, by id; each problem ends with SUFFIX.
MESSAGES: dict[str, Message] = {
    "unusable": Message(
        "{problem}.",
        "Put NVIDIA's file in {dir} again (or remove what is there, so that the mirror's copy is fetched), and "
        "check its pin in {manifest}.",
    ),
    "controller_copy_wrong": Message(
        "The copy in {dir} has sha256 {checksum}, not the pinned {sha256}, and no good copy could be fetched.", ""
    ),
    "mirror_holds_another": Message(
        "The mirror's {url} has sha256 {got}, but {manifest} pins {sha256}: the mirror holds another file.", ""
    ),
    "not_fetched": Message("Could not fetch {file} from {url}{through}: {said}.", ""),
    "fetch_fix": Message(
        "",
        "Check the mirror (gpu_artifacts_mirror_url) and its copy of the file{proxy}, or put NVIDIA's file in {dir}.",
    ),
    "missing": Message(
        "{file} is not in {dir} on the controller.",
        "Put NVIDIA's file there under this exact name{origin}, set gpu_artifacts_mirror_url to a mirror that has "
        "it, or set gpu_artifacts_controller_dir to the folder that has it.",
    ),
    "checksum": Message(
        "{file} has sha256 {checksum}, but {manifest} pins {sha256}.",
        "The file is corrupt or not the one pinned: download it again and compare, or correct the pin in "
        "{manifest} if you verified the new file.",
    ),
    # The pin came from the collection's own manifest, which an upgrade replaces: a pin of the user's own goes
    # into an overlay, whose later entry wins (gpu_stacks merges the overlays last).
    "checksum_builtin": Message(
        "{file} has sha256 {checksum}, but {manifest} pins {sha256}.",
        "The file is corrupt or not the one pinned: download it again and compare. If you verified the new file, "
        "pin it in an overlay manifest of your own (an entry for {file} with its sha256, in a file listed in "
        "gpu_preflight_manifest_overlays): {manifest} is the collection's own, and an upgrade replaces it.",
    ),
}
SUFFIX = " Nothing was installed."
# A user:password@ in a URL (RFC 3986, section 3.2.1, userinfo): messages never show the password.
USERINFO = re.compile(r"(?<=://)[^/@]*@")
PASSWORD = re.compile(r"(?<=://)([^/@:\s]*):[^/@\s]*@")
# get_url's checksum failure reads "... did not match <pinned>; it was <actual>."
GOT = re.compile(r"it was ([0-9a-f]{64})")


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
        ((stack.get("cuda_toolkit") or {}).get("runfile") or {}).get("file"),
        ((stack.get("cudnn") or {}).get("archive") or {}).get("file"),
    ]
    return " ".join(problems[name] for name in dict.fromkeys(files) if name in problems)


def gpu_artifacts_needed(stacks: list[Any], drivers: list[Any]) -> list[dict[str, Any]]:
    """The records the play's hosts need, each file once, in order: every toolkit runfile, every cuDNN
    archive, then every driver runfile. ``stacks``: each host's resolved stacks; ``drivers``: each host's
    resolved driver (None or without ``runfile`` for a package install)."""
    flat = [stack for host in stacks for stack in (host if isinstance(host, list) else [host])]
    records = [stack["cuda_toolkit"]["runfile"] for stack in flat]
    records += [stack["cudnn"]["archive"] for stack in flat]
    records += [(driver or {}).get("runfile") for driver in drivers if driver]
    unique: dict[str, dict] = {}
    for record in records:
        if record:
            unique.setdefault(record["file"], record)
    return list(unique.values())


def gpu_artifacts_checked(needed: list[dict], found: list[dict]) -> list[dict[str, Any]]:
    """Each record of ``needed`` beside what the lookup artifact_sha256 found for it: ``{item, stat}``."""
    return [{"item": record, "stat": stat} for record, stat in zip(needed, found)]


def collection_manifest(path: str) -> bool:
    """Whether the manifest at ``path`` is one of the collection's own (its data/ folder), not the user's."""
    data = os.path.join(os.path.realpath(COLLECTION_ROOT), "data")
    return os.path.commonpath([os.path.realpath(path), data]) == data


def _url(record: dict, mirror: str, masked_userinfo: bool = True) -> str:
    url = f"{mirror.rstrip('/')}/{record['file']}" if mirror else (record.get("url") or "")
    return USERINFO.sub("", url) if masked_userinfo else url


def _fetch_cause(checked: dict, outcome: dict, fields: dict, settings: dict) -> str:
    """Why a fetch did not bring a good copy, then where to look."""
    stat = checked["stat"]
    parts = [MESSAGES["controller_copy_wrong"].cause.format(**fields)] if stat.get("exists") else []
    said = str(outcome.get("msg", "unknown error"))
    got = GOT.findall(str(outcome.get("msg") or ""))
    proxy_url = proxy_for(settings.get("proxy"), fields["url"])
    through = f" through the proxy {masked(proxy_url)}" if proxy_url else ""
    if got:
        parts.append(MESSAGES["mirror_holds_another"].cause.format(got=got[0], **fields))
    else:
        said = re.sub(r"[.\s]+$", "", PASSWORD.sub(r"\1:****@", said))
        parts.append(MESSAGES["not_fetched"].cause.format(through=through, said=said, **fields))
    proxy = ", the proxy (gpu_artifacts_proxy)" if through else ""
    parts.append(MESSAGES["fetch_fix"].fix.format(proxy=proxy, **fields))
    return " ".join(parts)


def artifact_cause(checked: dict, outcome: dict, settings: dict) -> str:
    """Why one needed file cannot be used ('' when it can): ``checked`` (``{item, stat}``), ``outcome``
    (its fetch's result: skipped, failed, msg) and ``settings`` (controller_dir, mirror_url, proxy)."""
    stat, record = checked["stat"], checked["item"]
    folder = settings["controller_dir"]
    fields = {
        "dir": os.path.realpath(folder),
        "manifest": record.get("manifest", "the manifest"),
        "sha256": record["sha256"],
        "checksum": stat.get("checksum"),
        "file": record["file"],
        "url": _url(record, settings.get("mirror_url") or ""),
    }
    fetched = not outcome.get("skipped", False)
    problem = gpu_artifact_problem(f"{folder}/{record['file']}", record)
    if problem:
        return MESSAGES["unusable"].text(problem=problem, **fields)
    intact = stat.get("exists") and (stat.get("checksum") or "") == record["sha256"]
    if intact or (fetched and not boolean(outcome.get("failed", False), strict=False)):
        return ""
    if fetched:
        return _fetch_cause(checked, outcome, fields, settings)
    if not stat.get("exists"):
        origin = f" (origin: {record['url']})" if record.get("url") else ""
        return MESSAGES["missing"].text(origin=origin, **fields)
    return MESSAGES["checksum_builtin" if collection_manifest(fields["manifest"]) else "checksum"].text(**fields)


def gpu_artifacts_problems(checked: list[dict], fetches: list[dict], settings: dict) -> dict[str, str]:
    """``{file: stop}`` for each needed file that cannot be used, from gpu_artifacts_checked's list and the
    fetch loop's results (in the same order)."""
    problems = {}
    for item, outcome in zip(checked, fetches):
        cause = artifact_cause(item, outcome or {}, settings)
        if cause:
            problems[item["item"]["file"]] = cause + SUFFIX
    return problems


def gpu_artifacts_host_problems(stacks: list[dict], driver: dict | None, problems: dict[str, str]) -> dict[str, Any]:
    """What the unusable files mean for one host: ``bad_stacks`` ({stack name: its problems}),
    ``driver_bad`` (the driver's runfile is one) and ``message`` (every problem of the host's files, '' when
    none)."""
    runfile = ((driver or {}).get("runfile") or {}).get("file")
    bad_stacks = {}
    for stack in stacks:
        text = stack_artifact_problems(stack, problems)
        if text:
            bad_stacks[stack["name"]] = text
    # A stack whose CUDA comes from wheels has no runfile nor archive (None).
    records = [stack["cuda_toolkit"]["runfile"] for stack in stacks] + [stack["cudnn"]["archive"] for stack in stacks]
    mine = [record["file"] for record in records if record]
    mine += [runfile] if runfile else []
    message = " ".join(problems[name] for name in dict.fromkeys(mine) if name in problems)
    return {"bad_stacks": bad_stacks, "driver_bad": bool(runfile) and runfile in problems, "message": message}


class FilterModule:
    """Artifact file filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_artifact_problem": gpu_artifact_problem,
            "gpu_stack_artifact_problems": stack_artifact_problems,
            "gpu_artifacts_needed": gpu_artifacts_needed,
            "gpu_artifacts_checked": gpu_artifacts_checked,
            "gpu_artifacts_problems": gpu_artifacts_problems,
            "gpu_artifacts_host_problems": gpu_artifacts_host_problems,
        }
