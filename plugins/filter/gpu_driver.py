"""Driver filters: the loaded module's version, and the decisions of nvidia_driver's package method.

- ``gpu_driver_module_version`` reads the text of ``/proc/driver/nvidia/version`` (the check in the
  NVIDIA CUDA Installation Guide for Linux, section "Verify the Driver Version") with the collection's
  shared parser, so the role compares whole versions instead of looking for a substring.
- ``gpu_driver_os_key`` names the package set a host takes, ``gpu_driver_packages`` turns a set of
  nvidia_driver's ``vars/packages.yml`` into exact-version package specs and the names to hold,
  ``gpu_driver_missing_packages`` compares them with ``package_facts``, and ``gpu_driver_method``
  decides between NVIDIA's packages and its runfile. The package names come from the NVIDIA Driver
  Installation Guide, https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/
  ("Compute-only (Headless) and Desktop-only (no Compute) Installation" per distribution).

- ``gpu_driver_found`` reads the role's one probe against the pins (installed or not, the loaded module, the
  plan) and ``gpu_driver_problems`` lists why the decided method cannot start, so that the role's check is a
  probe and two tasks instead of a task per decision.
- ``gpu_driver_package_problem``, ``gpu_driver_sources_problem``, ``gpu_driver_hold_failures`` and
  ``gpu_driver_message`` word the role's stops from the catalog ``MESSAGES`` (cause, then fix).

Each filter is documented in ``<filter name>.yml`` beside this file.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_plan import gpu_plan_driver
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils.gpu_parsers import parse_proc_driver_version
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.message import Message

# A driver release as NVIDIA writes it (520.61.05, 515.76); the first part is the branch.
DRIVER_VERSION = re.compile(r"^(\d+)\.\d+(?:\.\d+)?$")
# Distributions served by another's package set: NVIDIA's rhel9 repository also serves Rocky Linux 9
# and AlmaLinux 9 (NVIDIA Driver Installation Guide, "Red Hat Enterprise Linux compatible distributions").
OS_ALIASES = {"Rocky": "RedHat", "AlmaLinux": "RedHat"}
# The OS keys nvidia_driver's vars/packages.yml has a set for (a unit test keeps the two the same).
OS_KEYS = ("Debian-12", "Ubuntu-22", "Ubuntu-24", "RedHat-9")
# What a package set must define, and how each package manager writes "this name at this version".
SET_FIELDS = ("manager", "version", "userspace", "kernel", "fabricmanager", "fabricmanager_service", "hold")
VERSION_SPEC = {"apt": "{name}={version}", "dnf": "{name}-{version}"}
# package: NVIDIA's repository; distribution: the distribution's own archive (gpu_driver_distribution.py).
METHODS = ("package", "runfile", "distribution")
# Each package manager's refresh of its package lists, and a dry run of an install that changes nothing
# but fails as the install would (apt-get(8) "-s, --simulate"; dnf(8) "--setopt=tsflags=test" runs the
# transaction check only).
MANAGER_COMMANDS = {
    "apt": {
        "refresh": ["apt-get", "update"],
        "dry_run": [
            "apt-get",
            "install",
            "--simulate",
            "--allow-downgrades",
            "--allow-change-held-packages",
            "-o",
            "APT::Install-Recommends=no",
        ],
    },
    "dnf": {"refresh": ["dnf", "makecache"], "dry_run": ["dnf", "install", "-y", "--setopt=tsflags=test"]},
}
# How each hold method holds and releases packages, and how its output tells a new hold from an old
# one: dpkg's selections (the role holds with Ansible's dpkg_selections, which shows a pending hold under
# --check and --diff, after reading the held names with apt-mark(8) "showhold"; "unhold" releases; "hold"
# prints "<pkg> set on hold." or "<pkg> was already set on hold.") and dnf's versionlock plugin
# (dnf-plugins-core, "dnf versionlock"; "add" prints "Adding versionlock on: <spec>" for a new lock).
# apt holds names; versionlock locks the exact name-version specs.
HOLD_METHODS = {
    "dpkg_selections": {
        "held": ["apt-mark", "showhold"],
        "hold": ["apt-mark", "hold"],
        "release": ["apt-mark", "unhold"],
        "items": "names",
        "changed": r"(?m)^\S+ set on hold\.$",
    },
    "versionlock": {
        "held": None,
        "hold": ["dnf", "versionlock", "add"],
        "release": ["dnf", "versionlock", "delete"],
        "items": "install",
        "changed": "Adding versionlock on",
    },
}
DONE_RECORD = "/var/lib/gpu_fleet/nvidia_driver.done"


def gpu_driver_module_version(text: str | None) -> str | None:
    """``{{ proc_text | gpu_fleet.tf_hosts.gpu_driver_module_version }}``: the version on the
    ``NVRM version:`` line (``535.104.05``), or None when the text has none (no module loaded)."""
    return parse_proc_driver_version(text)


def gpu_driver_os_key(facts: dict[str, Any] | None, keys: Any = None) -> str | None:
    """``{{ ansible_facts | gpu_fleet.tf_hosts.gpu_driver_os_key(keys) }}``: ``<distribution>-<major>``
    (``Debian-12``, ``Ubuntu-22``, ``RedHat-9``; Rocky and AlmaLinux take RedHat's), or None when no
    package set serves the host: one of ``keys`` (the keys of a package-set file; NVIDIA's repository sets,
    ``OS_KEYS``, by default)."""
    facts = facts or {}
    distribution = str(facts.get("distribution") or "")
    key = f"{OS_ALIASES.get(distribution, distribution)}-{facts.get('distribution_major_version')}"
    return key if key in (OS_KEYS if keys is None else list(keys)) else None


def _flag(value: Any, name: str) -> bool:
    """A boolean argument (true/false, yes/no, a bool); anything else is an error that names it."""
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise AnsibleFilterError(f"{name} is {value!r}, not a boolean; pass true or false.") from None


def _package_set(sets: dict | None, os_key: str | None) -> dict:
    """The set of ``os_key``, checked for the fields the filter reads."""
    sets = sets or {}
    if os_key not in sets:
        known = ", ".join(sorted(sets)) or "none"
        raise AnsibleFilterError(
            f"No driver package set for OS key {os_key!r} (sets: {known}), so the driver cannot be installed from "
            "packages on this host; install it from NVIDIA's runfile (nvidia_driver_method: runfile), or add a set "
            "for this OS to nvidia_driver's vars/packages.yml."
        )
    package_set = sets[os_key]
    missing = [field for field in SET_FIELDS if field not in package_set]
    if missing or package_set["manager"] not in VERSION_SPEC or package_set["hold"] not in HOLD_METHODS:
        raise AnsibleFilterError(
            f"The driver package set {os_key} lacks {', '.join(missing) or 'a known manager or hold method'} "
            "(manager must be apt or dnf, hold dpkg_selections or versionlock); complete it in nvidia_driver's "
            "vars/packages.yml."
        )
    return package_set


def _branch(version: Any, os_key: str, package_set: dict) -> str:
    """The branch (major part) of ``version``, checked against the set's ``max_branch``."""
    match = DRIVER_VERSION.match(str(version if version is not None else ""))
    if not match:
        raise AnsibleFilterError(
            f"Driver version {version!r} is not a release as NVIDIA writes it (X.Y or X.Y.Z, such as 520.61.05), so "
            "no package version can be formed from it; set nvidia_driver_version to such a release."
        )
    branch = match.group(1)
    newest = package_set.get("max_branch")
    if newest is not None and int(branch) > int(newest):
        raise AnsibleFilterError(
            f"Driver {version} is of branch {branch}, but the {os_key} package names in nvidia_driver's "
            f"vars/packages.yml hold only up to branch {newest}; pin a driver of branch {newest} or older, or install "
            "this one from NVIDIA's runfile (nvidia_driver_method: runfile)."
        )
    return branch


def _wanted(
    package_set: dict, kind: str, version: str, kernel: bool, fabricmanager: bool, revision: str = "*"
) -> list[tuple[str, str]]:
    """(name template, package version) of every package to install, in install order; the set's ``unpinned``
    names (a package versioned apart from the driver, such as Debian's nvidia-persistenced) get version ''."""
    driver = package_set["version"].format(version=version, revision=revision)
    fabric = package_set.get("fabricmanager_version", package_set["version"]).format(version=version, revision=revision)
    groups = [(package_set["userspace"], driver), (package_set.get("unpinned") or [], "")]
    if kernel:
        groups.append((package_set["kernel"][kind], driver))
    if fabricmanager:
        groups.append((package_set["fabricmanager"], fabric))
    return [(name, package_version) for names, package_version in groups for name in names]


def _any_branch_pattern(package_set: dict) -> str:
    """A regular expression for every package name the set can give, of any branch and module kind."""
    kernel = package_set.get("kernel") or {}
    templates = [*package_set["userspace"], *(package_set.get("unpinned") or [])]
    templates += [*kernel.get("proprietary", []), *kernel.get("open", [])]
    templates += package_set["fabricmanager"]
    names = sorted({re.escape(name).replace(re.escape("{branch}"), r"\d+") for name in templates})
    return "^(" + "|".join(names) + ")$"


def gpu_driver_packages(
    sets: dict,
    os_key: str | None,
    version: str,
    kernel_modules: Any,
    kernel_open: Any = False,
    fabricmanager: Any = False,
    revision: str = "*",
) -> dict[str, Any]:
    """``{{ __sets | gpu_fleet.tf_hosts.gpu_driver_packages(os_key, version, kernel_modules, kernel_open,
    fabricmanager) }}``: what the package method installs and holds on one host.

    Returns ``{os_key, manager, branch, install, names, versions, hold, hold_method, held_command, hold_command,
    hold_changed, release_command, any_branch_pattern, hold_requires, kernel_modules, module_stream,
    fabricmanager_service, unattended_upgrades_blacklist, refresh_command, dry_run_command, repository}``:
    ``install`` the exact-version specs (apt ``name=VER``, dnf ``name-VER``), ``names`` the same
    packages by name, ``versions`` name to package version, ``kernel_modules`` ``open``/``proprietary``
    or None (a container: no kernel packages), ``fabricmanager_service`` None unless ``fabricmanager``,
    ``held_command`` the argv that lists the held names (None for versionlock, whose hold command says
    what it added), ``hold_command``/``release_command`` the argv that holds/releases them, ``hold_changed`` the
    regular expression that finds a new hold in the hold command's output and ``any_branch_pattern``
    one that matches the set's names of any branch and module kind; ``kernel_install`` the kernel packages' specs,
    ``dkms_module`` and ``libcuda`` where the set gives them. ``revision`` fills ``{revision}`` (``*``, any, serves
    only the installed check); ``unpinned`` names get no version (the archive's) and are held.

    Raises:
        AnsibleFilterError: an OS key without a set, an incomplete set, a version that is no driver
            release or a branch newer than the set's names; each with its cause and fix.
    """
    package_set = _package_set(sets, os_key)
    branch = _branch(version, str(os_key), package_set)
    kind = "open" if _flag(kernel_open, "kernel_open") else "proprietary"
    kernel = _flag(kernel_modules, "kernel_modules")
    with_fabric = _flag(fabricmanager, "fabricmanager")
    wanted = [
        (name.format(branch=branch), v)
        for name, v in _wanted(package_set, kind, version, kernel, with_fabric, str(revision or "*"))
    ]
    spec = VERSION_SPEC[package_set["manager"]]
    names = [name for name, _version in wanted]
    stream = (package_set.get("module_stream") or {}).get(kind)
    install = [spec.format(name=name, version=v) if v else name for name, v in wanted]
    kernel_names = [name.format(branch=branch) for name in package_set["kernel"][kind]] if kernel else []
    return {
        "os_key": os_key,
        "manager": package_set["manager"],
        "branch": branch,
        "install": install,
        "names": names,
        "versions": dict(wanted),
        "hold_requires": list(package_set.get("hold_requires") or []),
        "kernel_modules": kind if kernel else None,
        "module_stream": stream.format(branch=branch) if stream else None,
        "fabricmanager_service": package_set["fabricmanager_service"] if with_fabric else None,
        "repository": dict(package_set.get("repository") or {}),
        "kernel_install": [spec for name, spec in zip(names, install) if name in kernel_names],
        "dkms_module": (package_set.get("dkms_module") or {}).get(kind),
        "libcuda": str(package_set.get("libcuda") or "").format(version=version) or None,
        **_commands(package_set, install, names),
    }


def _commands(package_set: dict, install: list[str], names: list[str]) -> dict[str, Any]:
    """The hold, release, refresh and dry-run commands of :func:`gpu_driver_packages`."""
    hold = HOLD_METHODS[package_set["hold"]]
    manager = MANAGER_COMMANDS[package_set["manager"]]
    return {
        "hold": list(names),
        "hold_method": package_set["hold"],
        "held_command": hold["held"],
        "hold_command": hold["hold"] + (install if hold["items"] == "install" else names),
        "hold_changed": hold["changed"],
        "release_command": hold["release"] + names,
        # Held packages of another branch or module kind (nvidia-fabricmanager-520 before a 535 pin) block
        # the new ones, which conflict with them: the role releases the held ones this matches, minus names.
        "any_branch_pattern": _any_branch_pattern(package_set),
        # Exactly the held names: a prefix such as ^nvidia- would also keep security updates from
        # nvidia-container-toolkit or libnvidia-container1.
        "unattended_upgrades_blacklist": [f"^{re.escape(name)}$" for name in names] if hold["items"] == "names" else [],
        "refresh_command": manager["refresh"],
        "dry_run_command": manager["dry_run"] + install,
    }


def _installed_at(entries: list[dict], manager: str, version: str) -> bool:
    """Whether one of a package's ``package_facts`` entries is ``version``: apt's carries the whole
    Debian version (with an epoch, ``1:``, when there is one); rpm's the upstream version apart from
    its release and epoch. ``version`` may be a pattern (``535.261.03-*``: any revision) or '' (any version:
    an unpinned package)."""
    for entry in entries or []:
        found = str(entry.get("version") or "")
        if not version or found == version or (manager == "apt" and found.split(":", 1)[-1] == version):
            return True
        if "*" in version and fnmatchcase(found.split(":", 1)[-1], version):
            return True
    return False


def gpu_driver_missing_packages(packages: dict[str, Any], installed: dict[str, list] | None) -> list[str]:
    """``{{ driver_packages | gpu_fleet.tf_hosts.gpu_driver_missing_packages(ansible_facts['packages']) }}``:
    the ``install`` specs of the packages that are not installed at their version (absent, or at
    another version), in install order; empty when the host has them all."""
    installed = installed or {}
    versions = packages.get("versions") or {}
    return [
        spec
        for name, spec in zip(packages.get("names") or [], packages.get("install") or [])
        if not _installed_at(installed.get(name) or [], packages.get("manager", ""), versions.get(name, ""))
    ]


def _recorded(record_text: str | None) -> tuple[str | None, str | None]:
    """(version, method) of the completion record; a record of 0.10.0 holds only the version and
    means the runfile. (None, None) without a record."""
    lines = [line.strip() for line in str(record_text or "").splitlines()]
    if not lines or not lines[0]:
        return None, None
    method = lines[1] if len(lines) > 1 and lines[1] else "runfile"
    if method not in METHODS:
        raise AnsibleFilterError(
            f"The driver's completion record {DONE_RECORD} names the install method {method!r} on its second line, "
            "none of package, runfile or distribution; remove the record and rerun (the driver is then installed again)."
        )
    return lines[0], method


def gpu_driver_method(
    requested: Any, record_text: str | None, runfile_present: Any, driver_present: Any = False
) -> dict[str, Any]:
    """``{{ nvidia_driver_method | gpu_fleet.tf_hosts.gpu_driver_method(record_text, runfile_present,
    driver_present) }}``.

    The host's method now: ``runfile`` when NVIDIA's uninstaller (``/usr/bin/nvidia-uninstall``) is
    there, since the runfile's files are then on the host whatever the record says; else the method
    of the completion record; else none. ``auto`` keeps it, or takes ``package`` on a host without a
    driver; ``package`` and ``runfile`` are taken as asked, with ``switch_from`` naming the method
    to remove first when the host has the other one. ``auto`` on a host with a driver this role did
    not install (``driver_present``: ``libcuda.so.1`` is there, but neither a record nor the
    uninstaller) is an error: the role cannot tell which method would not fight it.

    Returns ``{method, switch_from, current, recorded_version}``.
    """
    request = str(requested).strip().lower()
    if request not in ("auto", *METHODS):
        raise AnsibleFilterError(
            f"nvidia_driver_method is {requested!r}; set it to auto (keep the method the host has), package, runfile "
            "or distribution."
        )
    version, recorded = _recorded(record_text)
    current = "runfile" if _flag(runfile_present, "runfile_present") else recorded
    if request == "auto" and current is None and _flag(driver_present, "driver_present"):
        raise AnsibleFilterError(
            "nvidia_driver_method is auto and this host has an NVIDIA driver that this role did not install "
            "(libcuda.so.1 is there, with no completion record and no nvidia-uninstall); installing NVIDIA's "
            "packages or runfile over it would mix two drivers. Set nvidia_driver_method: package (its packages "
            "replace a packaged driver of the same names) or runfile for this host, or remove the other driver first."
        )
    method = (current or "package") if request == "auto" else request
    if {current, method} == {"package", "distribution"}:
        raise AnsibleFilterError(
            f"This host's driver came from the {current} method's packages and nvidia_driver_method is {method}: "
            "the role moves a host between the runfile and packages, not between NVIDIA's repository and the "
            "distribution's archive, whose packages share names at versions apt would mix. Remove the current "
            "packages first (apt-mark unhold and apt-get purge the driver's packages, remove the role's source file "
            "under /etc/apt/sources.list.d/ and /var/lib/gpu_fleet/nvidia_driver.done), then run again; or keep "
            f"nvidia_driver_method: {current}."
        )
    return {
        "method": method,
        "switch_from": current if current not in (None, method) else None,
        "current": current,
        "recorded_version": version,
    }


# Where each package manager reads a repository, the file the role writes and how the key is named
# in it: sources.list(5) ("deb [signed-by=<keyring>] <url> /", NVIDIA's repositories are flat, and an
# armored key needs a .asc name) and dnf.conf(5) ("[repository]" sections, gpgkey a file:// URL).
REPOSITORY_FILES = {
    "apt": {
        "path": "/etc/apt/sources.list.d/gpu-fleet-nvidia-driver.list",
        "key_path": "/etc/apt/keyrings/gpu-fleet-nvidia-driver.asc",
    },
    "dnf": {
        "path": "/etc/yum.repos.d/gpu-fleet-nvidia-driver.repo",
        "key_path": "/etc/pki/rpm-gpg/RPM-GPG-KEY-gpu-fleet-nvidia-driver",
    },
}


def gpu_driver_repository(packages: dict[str, Any], url: str = "", key_file: str = "") -> dict[str, str]:
    """``{{ packages | gpu_fleet.tf_hosts.gpu_driver_repository(url, key_file) }}``: the repository file of
    the package method, ``{path, content, key_path, key_url, url}``; ``url`` (a site mirror) replaces
    NVIDIA's. apt reads a binary keyring only under a ``.gpg`` name and an armored one only under
    ``.asc`` (sources.list(5), "Signed-By"): a ``key_file`` named ``*.gpg`` keeps that extension."""
    manager = (packages or {}).get("manager")
    if manager not in REPOSITORY_FILES:
        raise AnsibleFilterError(
            f"No repository file is known for the package manager {manager!r}. Pass the result of "
            "gpu_driver_packages (manager apt or dnf)."
        )
    files = dict(REPOSITORY_FILES[manager])
    if manager == "apt" and str(key_file).endswith(".gpg"):
        files["key_path"] = files["key_path"].removesuffix(".asc") + ".gpg"
    repository = packages.get("repository") or {}
    base = str(url or repository.get("url") or "")
    if not base:
        raise AnsibleFilterError(
            "The driver repository has no URL: set nvidia_driver_package_repository_url, or give the OS's "
            "package set a repository url in vars/packages.yml."
        )
    if any(char.isspace() or char in "[]" for char in base):
        raise AnsibleFilterError(
            f"The driver repository URL {base!r} has a space or a bracket, which would break the package manager's "
            "source line; set nvidia_driver_package_repository_url to a plain URL."
        )
    if manager == "apt":
        content = f"deb [signed-by={files['key_path']}] {base} /\n"
    else:
        content = (
            "[gpu-fleet-nvidia-driver]\n"
            "name=NVIDIA CUDA repository (driver packages, gpu_fleet.tf_hosts)\n"
            f"baseurl={base}\n"
            "enabled=1\n"
            "gpgcheck=1\n"
            f"gpgkey=file://{files['key_path']}\n"
        )
    return {
        "path": files["path"],
        "content": content,
        "key_path": files["key_path"],
        "key_url": str(repository.get("key_url") or ""),
        "url": base,
    }


# Every stop of nvidia_driver's package method and its install record, by id.
MESSAGES: dict[str, Message] = {
    "os_unknown": Message(
        "The driver packages are not known for {distribution} {major_version} (nvidia_driver_method: package).",
        "Set nvidia_driver_method: runfile, or use an OS the role has package data for (Debian 12, Ubuntu 22.04 "
        "and 24.04, RHEL/Rocky 9).",
    ),
    "repository_key": Message(
        "NVIDIA's package repository needs its signing key and {missing}:",
        "set nvidia_driver_package_repository_key to the key file on the controller (NVIDIA publishes it as "
        "{key_url}), or nvidia_driver_package_key_download_allowed: true to let the host download it, or "
        "nvidia_driver_package_repository_manage: false when the host's own repositories (a site mirror) already "
        "carry the driver.",
    ),
    "sources_unread": Message(
        "The apt sources could not be searched for other source lines of {url} ({errors}).",
        "Make /etc/apt/sources.list and /etc/apt/sources.list.d readable by root, then rerun.",
    ),
    "sources_other": Message(
        "{url} is already a source in {files} (for example from NVIDIA's cuda-keyring package); a second source "
        "line with another key breaks every apt command.",
        "Set nvidia_driver_package_repository_manage: false to use that source, or remove it and rerun.",
    ),
    "fabricmanager_runfile": Message(
        "{host} has NVSwitches, which need NVIDIA's fabric manager at the driver's exact version ({version}); the "
        "role installs it from NVIDIA's packages only.",
        "Set nvidia_driver_method: package, or install the fabric manager archive yourself and set "
        "nvidia_driver_fabricmanager: false.",
    ),
    "packages_uninstallable": Message(
        "The driver packages {packages} cannot be installed here: {error}.",
        "Check that the repository ({url}) has driver {version} for this OS, or pin a version it has. Nothing was "
        "changed on the driver.",
    ),
    "distribution_uninstallable": Message(
        "The distribution's driver packages {packages} cannot be installed here: {error}.",
        "Fix what apt names (a component the sources lack, a held or conflicting package), or pin a version the "
        "archive has. Nothing was changed on the driver.",
    ),
    "packages_failed_after_runfile": Message(
        "The runfile driver was uninstalled, then the {method} method's packages failed to install ({error}): {host} "
        "has no NVIDIA driver now, and nothing records one as installed.",
        "Fix what the package manager names and rerun: the packages are installed again, no runfile needed (`dpkg "
        "--audit` lists a half-installed package). To go back instead, set nvidia_driver_method: runfile and rerun.",
    ),
    "gpus_busy": Message(
        "The driver would be (re)installed while GPUs run compute processes: {processes}.",
        "Drain the host (stop those jobs) and rerun, or set nvidia_driver_allow_busy_gpus: true to go ahead anyway.",
    ),
    "kernel_skipped": Message(
        "Kernel-module steps skipped on {host}: it is a {virtualization} container, whose kernel belongs to its host.",
        "Only the driver's user-space part is installed here.",
    ),
    "reboot_needed": Message(
        "The loaded NVIDIA kernel module is not {version} ({loaded}).",
        "Reboot the host, or set nvidia_driver_reboot_allowed: true to let the run do it.",
    ),
    "libcuda_missing": Message(
        "The driver install ({method}) finished, but {libcuda} is not there: the installer did not install driver "
        "{version}'s libraries. Nothing was recorded as installed.",
        "Read the installer's log ({log}), fix what it names, and rerun.",
    ),
}
# Where each install method's own account of a failed install is.
INSTALL_LOGS = {
    "runfile": "/var/log/nvidia-installer.log",
    "package": "the package manager's output above",
    "distribution": "the package manager's output above",
}


def gpu_driver_message(name: str, fields: dict[str, Any] | None = None) -> str:
    """The text of the stop ``name`` of ``MESSAGES``; a ``method`` field also names its install log."""
    if name not in MESSAGES:
        raise AnsibleFilterError(f"gpu_driver_message: no message {name!r}; the messages are {', '.join(MESSAGES)}.")
    fields = dict(fields or {})
    if "method" in fields:
        fields.setdefault("log", INSTALL_LOGS.get(fields["method"], "the installer's output above"))
    return MESSAGES[name].text(**fields)


def gpu_driver_package_problem(inputs: dict[str, Any]) -> str:
    """Why the package method cannot start on this host, or ``''``.

    ``inputs``: ``os_key`` (gpu_driver_os_key), ``distribution``, ``major_version``, ``manage`` (the role adds
    NVIDIA's repository), ``key_download_allowed``, ``key`` (the key file's controller path, '' when unset),
    ``key_found`` (it is a file there) and ``key_url`` (where NVIDIA publishes the key).
    """
    if not inputs.get("os_key"):
        return gpu_driver_message("os_unknown", inputs)
    if not boolean(inputs.get("manage"), strict=False) or boolean(inputs.get("key_download_allowed"), strict=False):
        return ""
    key = inputs.get("key") or ""
    if key and boolean(inputs.get("key_found"), strict=False):
        return ""
    missing = f"the key file {key} is not a file on the controller" if key else "none is configured"
    return gpu_driver_message("repository_key", {"missing": missing, "key_url": inputs.get("key_url", "")})


def gpu_driver_sources_problem(result: dict[str, Any], url: str) -> str:
    """Why the driver repository's apt source cannot be added, from the registered ``grep -rlF <url>`` over
    the apt sources, or ``''``. grep exits 1 when nothing matches and 2 when it cannot read a file; a
    missing folder is no error."""
    result = result or {}
    if int(result.get("rc") or 0) > 1 and "No such file" not in (result.get("stderr") or ""):
        return gpu_driver_message("sources_unread", {"url": url, "errors": "; ".join(result.get("stderr_lines") or [])})
    files = result.get("stdout_lines") or []
    return gpu_driver_message("sources_other", {"url": url, "files": ", ".join(files)}) if files else ""


def gpu_driver_hold_failures(selections: dict | None, held_now: dict | None, hold: dict | None) -> list[str]:
    """What kept the driver packages from being held: the failed ``dpkg_selections`` items, a failed read
    of the held names, a failed versionlock (the registered results; skipped ones add nothing)."""
    found = [f"dpkg_selections: {item['msg']}" for item in (selections or {}).get("results") or [] if "msg" in item]
    held_now, hold = held_now or {}, hold or {}
    if int(held_now.get("rc") or 0) != 0:
        found.append(f"{' '.join(held_now.get('cmd') or [])} failed: {held_now.get('stderr') or ''}")
    if int(hold.get("rc") or 0) != 0:
        errors = "; ".join(hold.get("stderr_lines") or [])
        found.append(f"{' '.join(hold.get('cmd') or [])} failed (exit {hold['rc']}): {errors}")
    return found


# libcuda's soname link names the user-space driver it belongs to (libcuda.so.1 -> libcuda.so.520.61.05).
LIBCUDA_VERSION = re.compile(r"^libcuda[.]so[.]([0-9]+[.][0-9.]+)$")


def _found_version(recorded: str | None, libcuda_link: dict | None) -> str | None:
    """The user-space version on the host now: the record of the last install, else libcuda's file name."""
    if recorded:
        return recorded
    source = str((libcuda_link or {}).get("lnk_source") or "")
    match = LIBCUDA_VERSION.match(source.rsplit("/", 1)[-1])
    return match.group(1) if match else None


def gpu_driver_found(look: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """What the driver probe (one ``gpu_host_probe`` result) says against the pins, in one place.

    ``inputs``: ``decided`` (the ``gpu_driver_method`` result), ``version`` (the pinned driver), ``libdir``,
    ``libcuda`` (the pinned library where the method puts it; default ``<libdir>/libcuda.so.<version>``),
    ``done_file`` (the completion record), ``proc_version`` (``/proc/driver/nvidia/version``), ``manage_kernel``,
    ``reboot_allowed``, ``packages`` (the ``gpu_driver_packages`` result, empty unless the method is package) and
    ``installed_packages`` (``ansible_facts['packages']``).

    Returns ``{installed, found_version, loaded_version, loaded_line, reboot_required, plan}``: installed only
    when the record names this version and method and its library is there, and for packages every pinned
    package is at its version; ``plan`` is ``gpu_plan_driver``'s item.
    """
    stat, read = (look or {}).get("stat") or {}, (look or {}).get("read") or {}
    decided, version, libdir = inputs.get("decided") or {}, str(inputs.get("version")), inputs.get("libdir")
    record = str(read.get(inputs.get("done_file")) or "").split()
    method = decided.get("method")
    packages = inputs.get("packages") or {}
    with_packages = method in ("package", "distribution")
    missing = gpu_driver_missing_packages(packages, inputs.get("installed_packages")) if with_packages else []
    libcuda = inputs.get("libcuda") or f"{libdir}/libcuda.so.{version}"
    installed = (
        bool((stat.get(libcuda) or {}).get("exists"))
        and record[:1] == [version]
        and (record[1:2] or ["runfile"]) == [method]
        and not missing
    )
    text = read.get(inputs.get("proc_version"))
    loaded = gpu_driver_module_version(text) if isinstance(text, str) else None
    manage_kernel = _flag(inputs.get("manage_kernel"), "manage_kernel")
    reboot_allowed = _flag(inputs.get("reboot_allowed"), "reboot_allowed")
    found = _found_version(decided.get("recorded_version"), stat.get(f"{libdir}/libcuda.so.1"))
    return {
        "installed": installed,
        "found_version": found,
        "loaded_version": loaded,
        "loaded_line": text.splitlines()[0] if isinstance(text, str) and text.strip() else "",
        "reboot_required": manage_kernel and isinstance(text, str) and loaded != version and not reboot_allowed,
        "plan": gpu_plan_driver(version, decided, installed, found, loaded, manage_kernel, reboot_allowed),
    }


def gpu_driver_problems(inputs: dict[str, Any]) -> list[str]:
    """Every reason the decided method cannot start on this host, before any change, each cause then fix.

    ``inputs``: ``method`` (decided), ``package`` (``gpu_driver_package_problem``'s inputs, read for the package
    method only), ``fabricmanager`` (this host needs the fabric manager), ``host``, ``version`` and
    ``proxy_problem`` (``gpu_proxy_problem`` of nvidia_driver_proxy, '' when fine).
    """
    problems = []
    if inputs.get("method") == "package":
        problems.append(gpu_driver_package_problem(inputs.get("package") or {}))
    elif inputs.get("method") == "runfile" and _flag(inputs.get("fabricmanager", False), "fabricmanager"):
        problems.append(gpu_driver_message("fabricmanager_runfile", inputs))
    problems.append(str(inputs.get("proxy_problem") or ""))
    return [problem for problem in problems if problem]


class FilterModule:
    """Driver version and package-method filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_driver_module_version": gpu_driver_module_version,
            "gpu_driver_os_key": gpu_driver_os_key,
            "gpu_driver_packages": gpu_driver_packages,
            "gpu_driver_missing_packages": gpu_driver_missing_packages,
            "gpu_driver_method": gpu_driver_method,
            "gpu_driver_repository": gpu_driver_repository,
            "gpu_driver_message": gpu_driver_message,
            "gpu_driver_package_problem": gpu_driver_package_problem,
            "gpu_driver_sources_problem": gpu_driver_sources_problem,
            "gpu_driver_hold_failures": gpu_driver_hold_failures,
            "gpu_driver_found": gpu_driver_found,
            "gpu_driver_problems": gpu_driver_problems,
        }
