"""Filters of nvidia_driver's ``distribution`` method: the driver from the distribution's own archive.

- ``gpu_driver_apt_components`` reads the host's apt sources (sources.list(5): the one-line format of
  ``*.list`` files and the deb822 format of ``*.sources`` files) and says which components they give a
  suite, and from which mirrors.
- ``gpu_driver_distribution_problem`` says why the method cannot start on a host (an OS without package
  data, a suite whose sources lack the components the packages live in, NVSwitches), before any change.
- ``gpu_driver_archive_version`` finds the distribution's exact package version of the pinned upstream
  driver among those apt offers (apt-cache(8), ``madison``), so the pin names Debian's own revision
  (``535.261.03-1``) without guessing it.
- ``gpu_driver_dkms_state`` turns ``dkms status`` (dkms(8), ``status``) into one line when DKMS has not
  built the module for the running kernel (a container, missing headers, a failed build), instead of a
  raw maintainer-script dump.

Each filter is documented in ``<filter name>.yml`` beside this file.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message

# The host's own sources: the main list and the files of sources.list.d apt reads (sources.list(5),
# "SOURCES.LIST.D": *.list and *.sources; other names such as *.save are ignored by apt too).
SOURCES_LIST = "/etc/apt/sources.list"
SOURCES_DIR = "/etc/apt/sources.list.d/"
# The file the role writes when it manages the components (nvidia_driver_distribution_sources_manage).
MANAGED_FILE = "/etc/apt/sources.list.d/gpu-fleet-nvidia-driver-distribution.list"

MESSAGES: dict[str, Message] = {
    "os_unknown": Message(
        "The distribution's NVIDIA driver packages are not known for {distribution} {major_version} "
        "(nvidia_driver_method: distribution).",
        "Use an OS the role has distribution package data for (Debian 12 and 13; Ubuntu 22.04 and 24.04, untested), "
        "or set nvidia_driver_method: package or runfile.",
    ),
    "components_missing": Message(
        "The apt sources of {host} give {suite} the components {have}, but {distribution}'s NVIDIA driver packages "
        "need {missing} as well ({where}).",
        "Add {missing} to the {suite} line of the host's sources (for example `deb {site} {suite} {all}` in "
        "/etc/apt/sources.list), or set nvidia_driver_distribution_sources_manage: true to let the role add them in "
        + MANAGED_FILE
        + ". Nothing was changed.",
    ),
    "no_suite": Message(
        "The apt sources of {host} have no line for {suite}, so the role cannot tell which mirror to add {missing} "
        "from.",
        "Add the {suite} line of the host's mirror to its sources (for example `deb http://deb.debian.org/debian "
        "{suite} {all}`), then rerun. Nothing was changed.",
    ),
    "fabricmanager": Message(
        "{host} has NVSwitches, which need NVIDIA's fabric manager at the driver's exact version ({version}); "
        "{distribution} does not package it.",
        "Set nvidia_driver_method: package (NVIDIA's repository has it), or install the fabric manager yourself and "
        "set nvidia_driver_fabricmanager: false.",
    ),
    "version_missing": Message(
        "The archive in the apt sources of {host} has no {package} {version} (it offers {offered}).",
        "Pin nvidia_driver_version to one of those upstream versions, or point the sources at a mirror that still has "
        "{version} (such as snapshot.debian.org). Nothing was changed on the driver.",
    ),
    "dkms_not_built": Message(
        "DKMS has not built the NVIDIA kernel module {module}/{version} for the running kernel {kernel} ({why}); "
        'the driver\'s user space is installed, and the verification will say "NVIDIA kernel module not loaded".',
        "{fix}",
    ),
}
DKMS_FIXES = {
    "headers": "Install linux-headers-{kernel} and run `dkms autoinstall -k {kernel}` (or boot a kernel whose headers "
    "are installed); in a container, load the module on the container's host instead.",
    "build": "Read {log}, fix what it names, then run `dkms autoinstall -k {kernel}` (or `dpkg --configure -a` "
    "when the package is left unconfigured).",
}


def _deb822(lines: list[str]) -> list[dict[str, str]]:
    """The stanzas of a deb822 file, each field's value with its continuation lines joined."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    field = ""
    for line in [*lines, ""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, field = {}, ""
        elif line[0].isspace() and field:
            current[field] += " " + line.strip()
        elif ":" in line:
            field, value = line.split(":", 1)
            field = field.strip().lower()
            current[field] = value.strip()
    return stanzas


def _one_line(lines: list[str]) -> list[dict[str, str]]:
    """The ``deb`` lines of a one-line-format file, as deb822-like fields; the options (``[signed-by=...]``) kept
    whole in ``options``."""
    entries = []
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words, options = words[1:], []
        if words and words[0].startswith("["):
            while words and not words[0].endswith("]"):
                options, words = options + [words[0]], words[1:]
            options, words = options + words[:1], words[1:]
        if len(words) >= 2:
            fields = {"uris": words[0], "suites": words[1], "components": " ".join(words[2:])}
            entries.append({"types": "deb", "options": " ".join(options), **fields})
    return entries


def _options(entry: dict[str, str]) -> str:
    """The options a line of the same mirror must repeat: apt refuses two entries of one mirror and suite whose
    ``Signed-By`` differ (sources.list(5), "Signed-By")."""
    if entry.get("options"):
        return entry["options"]
    signed_by = entry.get("signed-by", "")
    return f"[signed-by={signed_by}]" if signed_by and not any(c.isspace() for c in signed_by) else ""


def _files(lines: list[str], exclude: str) -> dict[str, list[str]]:
    """``grep -rH ''`` output (``path:line``) by file: the files apt reads, without ``exclude``."""
    files: dict[str, list[str]] = {}
    for line in lines or []:
        path, sep, text = str(line).partition(":")
        wanted = path == SOURCES_LIST or (path.startswith(SOURCES_DIR) and path.endswith((".list", ".sources")))
        if sep and wanted and path != exclude:
            files.setdefault(path, []).append(text)
    return files


def gpu_driver_apt_components(lines: list[str] | None, suite: str, exclude: str = MANAGED_FILE) -> dict[str, Any]:
    """``{{ grep_lines | gpu_fleet.tf_hosts.gpu_driver_apt_components(suite) }}``: the components the host's
    enabled ``deb`` sources give ``suite`` and the mirrors (URIs) that serve it, from ``grep -rH ''`` over
    /etc/apt/sources.list and /etc/apt/sources.list.d (``exclude``: the role's own file, left out so the check
    sees what the host has without it). Returns ``{components, sites}``, each sorted and without repeats."""
    components: set[str] = set()
    sites: list[str] = []
    options: list[str] = []  # of the first site's entry
    for path, text in _files(lines or [], exclude).items():
        for entry in _deb822(text) if path.endswith(".sources") else _one_line(text):
            if entry.get("enabled", "yes").lower() == "no" or "deb" not in entry.get("types", "").split():
                continue
            if suite not in entry.get("suites", "").split():
                continue
            components.update(entry.get("components", "").split())
            options += [] if sites else [_options(entry)]
            sites += [uri.rstrip("/") for uri in entry.get("uris", "").split() if uri.rstrip("/") not in sites]
    return {"components": sorted(components), "sites": sites, "options": options[0] if options else ""}


def gpu_driver_distribution_problem(inputs: dict[str, Any]) -> str:
    """Why the distribution method cannot start on this host, or ``''``.

    ``inputs``: ``os_key`` (the distribution set's key, None without one), ``distribution``, ``major_version``,
    ``host``, ``version``, ``suite`` (the release's codename), ``needed`` (the set's components), ``found``
    (``gpu_driver_apt_components``'s result), ``where`` (which packages live where, for the message), ``manage``
    (the role adds the missing components) and ``fabricmanager`` (the host needs the fabric manager).
    """
    fields = dict(inputs)
    if not inputs.get("os_key"):
        return MESSAGES["os_unknown"].text(**fields)
    if inputs.get("fabricmanager") in (True, "true", "True"):
        return MESSAGES["fabricmanager"].text(**fields)
    found = inputs.get("found") or {}
    needed = list(inputs.get("needed") or [])
    missing = [name for name in needed if name not in (found.get("components") or [])]
    if not missing:
        return ""
    sites = found.get("sites") or []
    fields.update(
        missing=" ".join(missing),
        have=" ".join(found.get("components") or []) or "none",
        all=" ".join(["main", *needed]),
        site=sites[0] if sites else "http://deb.debian.org/debian",
    )
    if not sites:
        return MESSAGES["no_suite"].text(**fields)
    if inputs.get("manage") in (True, "true", "True"):
        return ""
    return MESSAGES["components_missing"].text(**fields)


def gpu_driver_distribution_sources(found: dict[str, Any], suite: str, needed: list[str]) -> str:
    """The content of the role's own source file when it manages the components: the host's first mirror for
    ``suite`` with the needed components the host's own lines lack (``found`` is read without the role's file, so
    the content stays the same on a rerun), or ``''`` when they lack none (the file is then removed) or no line
    names the suite."""
    found = found or {}
    sites = found.get("sites") or []
    missing = [name for name in needed or [] if name not in (found.get("components") or [])]
    options = f"{found['options']} " if found.get("options") else ""
    return f"deb {options}{sites[0]} {suite} {' '.join(missing)}\n" if sites and missing else ""


def _upstream(version: str) -> str:
    """The upstream part of a Debian version (deb-version(7)): without the epoch and the revision."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def gpu_driver_archive_version(lines: list[str] | None, version: str, host: str = "") -> dict[str, Any]:
    """``{{ madison.stdout_lines | gpu_fleet.tf_hosts.gpu_driver_archive_version(version) }}``: from
    ``apt-cache madison <package>`` (``name | version | source`` per line, newest first), the first package
    version whose upstream part is ``version``. Returns ``{version, revision, offered, problem}``: ``revision``
    the part after the upstream version (``1`` of ``535.261.03-1``), ``offered`` every version listed, and
    ``problem`` the stop's text when none matches ('' otherwise)."""
    offered: list[str] = []
    package = ""
    for line in lines or []:
        parts = [part.strip() for part in str(line).split("|")]
        if len(parts) >= 3 and parts[1] not in offered:
            package = package or parts[0]
            offered.append(parts[1])
    for found in offered:
        if _upstream(found) == str(version):
            revision = found.split(":", 1)[-1][len(str(version)) + 1 :]
            return {"version": found, "revision": revision, "offered": offered, "problem": ""}
    problem = MESSAGES["version_missing"].text(
        host=host, package=package or "the driver package", version=version, offered=", ".join(offered) or "none"
    )
    return {"version": "", "revision": "", "offered": offered, "problem": problem}


def gpu_driver_dkms_state(status: dict[str, Any] | None, inputs: dict[str, Any]) -> str:
    """``{{ probe | gpu_fleet.tf_hosts.gpu_driver_dkms_state(inputs) }}``: ``''`` when ``dkms status`` lists
    the module as installed for the running kernel, else one line: what DKMS did, why and the fix.

    ``status``: the ``dkms status -m <module> -v <version> -k <kernel>`` run (``rc``, ``stdout``); ``inputs``:
    ``module``, ``version``, ``kernel`` and ``headers`` (the kernel's build tree, /lib/modules/<kernel>/build,
    is there)."""
    module, version, kernel = inputs.get("module"), inputs.get("version"), inputs.get("kernel")
    text = str((status or {}).get("stdout") or "")
    installed = re.compile(rf"^{re.escape(f'{module}/{version}, {kernel},')}[^:]*: installed", re.MULTILINE)
    if installed.search(text):
        return ""
    states = re.findall(rf"^{re.escape(f'{module}/{version}')}[^:]*: (\w+)", text, re.MULTILINE)
    state = f"dkms status: {states[0]}" if states else "dkms status lists no such module"
    log = f"/var/lib/dkms/{module}/{version}/build/make.log"
    headers = inputs.get("headers") in (True, "true", "True")
    why = f"{state}; no build tree at /lib/modules/{kernel}/build" if not headers else f"{state}; see {log}"
    fix = DKMS_FIXES["build" if headers else "headers"].format(kernel=kernel, log=log)
    return MESSAGES["dkms_not_built"].text(module=module, version=version, kernel=kernel, why=why, fix=fix)


class FilterModule:
    """The distribution method's filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_driver_apt_components": gpu_driver_apt_components,
            "gpu_driver_distribution_problem": gpu_driver_distribution_problem,
            "gpu_driver_distribution_sources": gpu_driver_distribution_sources,
            "gpu_driver_archive_version": gpu_driver_archive_version,
            "gpu_driver_dkms_state": gpu_driver_dkms_state,
        }
