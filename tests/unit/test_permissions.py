"""Every file the roles and playbooks write has an explicit owner, group and mode, none is
world-writable, and nothing turns TLS verification off.

The rule, checked on every task of roles/*/tasks, roles/*/handlers and playbooks/ (blocks,
rescue and always sections included; included and imported task files are checked where they live):

- A task whose module writes files (``WRITERS``) sets ``owner``, ``group`` and ``mode``.
- Controller tasks (``delegate_to: localhost``/``127.0.0.1`` or ``connection: local``, on the task or
  an enclosing block, or any task of a play on ``hosts: localhost``) run without become and write the
  run's own outputs (fleet report, air-gap bundle, artifact cache): those belong to the user who runs
  the playbook, so they set ``mode`` only and must not name an owner or group, which would need root
  on the controller.
- ``mode`` (and a ``directory_mode``) is a quoted octal string such as ``"0644"`` or a symbolic mode
  (chmod(1) syntax, e.g. ``u=rwX,go=rX``) that gives others no write bit; a templated mode passes only
  when every quoted literal in it does. A recursive ``copy`` (``src`` or ``dest`` ending in ``/``)
  also sets ``directory_mode``: without it, the folders it creates get the remote umask
  (ansible.builtin.copy documentation, parameter ``directory_mode``).
- Exempt: ``file`` with ``state: absent`` (writes nothing) or ``link``/``hard`` (a link has no mode of
  its own: the file module documentation, parameter ``mode``, and chmod(2) on symbolic links), and
  ``ansible.builtin.fetch``, which has no owner/group/mode options and writes on the controller as
  the controller user.
- Out of scope: files created by ``command``/``shell`` with ``creates:`` (installers, ``venv``); their
  modes are the program's, and the integration test looks for world-writable paths after a run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from role_tasks import CONTROLLER, file_tasks, task_files, walk

ROOT = Path(__file__).resolve().parents[2]
WRITERS = {
    "copy",
    "template",
    "file",
    "unarchive",
    "get_url",
    "lineinfile",
    "blockinfile",
    "assemble",
    "replace",
    "ini_file",
    "tempfile",
}
OCTAL = re.compile(r"^[0-7]{3,4}$")
SYMBOLIC = re.compile(r"^[ugoa]*[-+=][rwxXst]*$")


def module_of(task: dict) -> str | None:
    """The short name of the task's module (``copy`` for ``ansible.builtin.copy``)."""
    for key in task:
        short = key.rsplit(".", 1)[-1]
        if short in WRITERS or short == "fetch":
            return short
    return None


def world_writable(mode: object) -> bool | None:
    """True when the mode lets others write, False when it does not, None when it is no valid mode
    (unquoted YAML numbers arrive as int and are refused: YAML 1.1 reads 0644 as octal, 1.2 as 420)."""
    if not isinstance(mode, str):
        return None
    if "{{" in mode:
        literals = re.findall(r"'([^']*)'", mode)
        verdicts = [world_writable(lit) for lit in literals]
        return None if not verdicts or None in verdicts else any(verdicts)
    if OCTAL.match(mode):
        return bool(int(mode, 8) & 0o002)
    clauses = mode.split(",")
    if not all(SYMBOLIC.match(c) for c in clauses):
        return None
    return any(re.match(r"^([ugo]*[ao][ugoa]*|)[+=][^,]*w", c) for c in clauses)


def problems(task: dict, scope: dict) -> list[str]:
    """What the task's file-writing options lack, by the rule in the module docstring."""
    module = module_of(task)
    if module in (None, "fetch"):
        return []
    args = task[next(k for k in task if k.rsplit(".", 1)[-1] == module)] or {}
    if module == "file" and args.get("state") in ("absent", "link", "hard"):
        return []
    found = []
    on_controller = scope.get("delegate_to") in CONTROLLER or scope.get("connection") == "local"
    for key in ("owner", "group"):
        if on_controller and key in args:
            found.append(f"{key} set on a controller task (the run's user owns its outputs)")
        elif not on_controller and key not in args:
            found.append(f"no {key}")
    modes = {"mode": args.get("mode")}
    if module == "copy" and (str(args.get("src", "")).endswith("/") or str(args.get("dest", "")).endswith("/")):
        modes["directory_mode"] = args.get("directory_mode")
    for key, mode in modes.items():
        verdict = world_writable(mode)
        if verdict is None:
            found.append(f"{key} {mode!r} is not a quoted octal string or a symbolic mode")
        elif verdict:
            found.append(f"{key} {mode!r} is world-writable")
    return found


def offenders() -> list[str]:
    return [
        f"{path.relative_to(ROOT)}: {task.get('name', '<unnamed>')}: {problem}"
        for path in task_files()
        for task, scope in file_tasks(path)
        for problem in problems(task, scope)
    ]


def test_every_written_file_has_an_owner_group_and_safe_mode():
    found = offenders()
    assert not found, "\n".join(found)


def test_the_walk_reaches_tasks_in_blocks_and_plays():
    names = {task.get("name") for path in task_files() for task, _ in file_tasks(path)}
    assert "Blacklist nouveau" in names  # inside a block
    # A playbook's task file (playbooks/tasks/checks.yml):
    assert (
        "Check the options of the driver, CUDA, cuDNN, environment, venv, health check and verification roles" in names
    )
    assert "Check the options, the stacks, the hosts and NVIDIA's files" in names  # a play's tasks


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("0644", False),
        ("0755", False),
        ("0440", False),
        ("0666", True),
        ("0777", True),
        ("1777", True),
        ("u=rwX,go=rX", False),
        ("u+w", False),
        ("o+w", True),
        ("a=rwx", True),
        ("+w", True),
        ("go=rw", True),
        ("{{ '0600' if secret else '0644' }}", False),
        ("{{ '0600' if secret else '0666' }}", True),
        ("{{ some_mode }}", None),
        (420, None),
        (None, None),
        ("rw-r--r--", None),
    ],
)
def test_mode_check(mode, expected):
    assert world_writable(mode) is expected


def test_the_rule_catches_missing_owner_and_controller_owner():
    host_task = {"name": "t", "ansible.builtin.template": {"src": "a", "dest": "/etc/a", "mode": "0644"}}
    assert problems(host_task, {}) == ["no owner", "no group"]
    mine = {"name": "t", "ansible.builtin.copy": {"dest": "/r/x", "owner": "root", "group": "root", "mode": "0644"}}
    assert problems(mine, {"delegate_to": "localhost"}) == [
        "owner set on a controller task (the run's user owns its outputs)",
        "group set on a controller task (the run's user owns its outputs)",
    ]
    tree = {"ansible.builtin.copy": {"src": "d/", "dest": "/opt/d/", "owner": "root", "group": "root", "mode": 644}}
    assert problems(tree, {}) == [
        "mode 644 is not a quoted octal string or a symbolic mode",
        "directory_mode None is not a quoted octal string or a symbolic mode",
    ]
    assert problems({"ansible.builtin.file": {"path": "/x", "state": "link", "src": "/y"}}, {}) == []
    block = [{"block": [host_task], "delegate_to": "localhost"}]
    assert list(walk(block, {})) == [(host_task, {"delegate_to": "localhost"})]


# TLS is never switched off: Ansible's validate_certs, pip's --trusted-host / trusted-host and
# PIP_TRUSTED_HOST, curl's --insecure, wget's --no-check-certificate, requests' verify=False,
# Python's ssl.CERT_NONE and unverified contexts. A site with its own CA gives its bundle
# (tf_venv_pip_ca_bundle, the system trust store) instead. Spelled in pieces so that a grep for
# these forms finds only real uses.
INSECURE = re.compile(
    "|".join(
        [
            r"validate_certs['\"]?\s*[:=]\s*['\"]?(false|no|0)\b",
            r"--" + r"insecure\b",
            r"trusted[-_]" + r"host",
            r"no-check-" + r"certificate",
            r"\bverify\s*=\s*False\b",
            r"CERT_" + r"NONE",
            r"_create_" + r"unverified_context",
            r"check_hostname\s*=\s*False",
            r"SSL_NO_" + r"VERIFY",
        ]
    ),
    re.IGNORECASE,
)
SCANNED = ["roles", "playbooks", "plugins", "molecule", "tests", "files", "site.yml", "ansible.cfg"]


def insecure_uses(root: Path) -> list[str]:
    found = []
    for top in SCANNED:
        paths = [root / top] if (root / top).is_file() else sorted((root / top).rglob("*"))
        for path in paths:
            if not path.is_file() or "__pycache__" in path.parts or path.resolve() == Path(__file__).resolve():
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if INSECURE.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_nothing_turns_tls_verification_off():
    found = insecure_uses(ROOT)
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "    validate_certs: false",
        "    validate_certs: no",
        '    validate_certs: "False"',
        "get_url(url, validate_certs=False)",
        "pip install --" + "trusted-host mirror.example tensorflow",
        "trusted-" + "host = mirror.example",
        "curl --" + "insecure https://mirror.example/",
        "requests.get(url, verify=False)",
        "ctx.verify_mode = ssl.CERT_" + "NONE",
    ],
)
def test_the_tls_check_catches(tmp_path, line):
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "x.yml").write_text(line + "\n")
    assert insecure_uses(tmp_path) == [f"roles/x.yml:1: {line.strip()}"]


def test_the_tls_check_passes_safe_forms(tmp_path):
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "x.yml").write_text("validate_certs: true\nverify=True\ncert = /etc/ssl/ca.pem\n")
    assert insecure_uses(tmp_path) == []


# Credentials: the mirror's user and password, and index or mirror URLs, which may carry
# user:password@ (RFC 3986, section 3.2.1). A task that uses one in a Jinja expression Ansible can
# print (arguments, messages, names, vars) either has no_log, or strips the userinfo right there.
CREDENTIAL = re.compile(r"\b(gpu_artifacts_mirror_(?:url|username|password)|tf_venv_pip_(?:extra_)?index_urls?)\b")
REDACT = "regex_replace('(?<=://)[^/@]*@', '')"
# The same cut over a list of URLs, also for a URL written without its scheme (user:password@host/...).
REDACT_EACH = "map('regex_replace', '^((?:[a-z][a-z0-9+.-]*://)?)[^/@]*@', '\\1')"
NOT_PRINTED = {"when", "that", "until", "changed_when", "failed_when", "no_log"}
JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)


def printable_strings(value: object, key: str = "") -> Iterator[str]:
    if key in NOT_PRINTED:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from printable_strings(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from printable_strings(v, key)


def exposed_credentials(task: dict) -> list[str]:
    """Credential names the task could print: used in an expression without the userinfo cut."""
    if task.get("no_log"):
        return []
    found = []
    for text in printable_strings(task):
        for expression in JINJA.findall(text):
            for match in CREDENTIAL.finditer(expression):
                if not any(cut in expression[match.end() :] for cut in (REDACT, REDACT_EACH)):
                    found.append(match.group(1))
    return found


def test_tasks_never_print_credentials():
    found = [
        f"{path.relative_to(ROOT)}: {task.get('name', '<unnamed>')}: {name}"
        for path in task_files()
        for task, _ in file_tasks(path)
        for name in exposed_credentials(task)
    ]
    assert not found, "set no_log on the task, or pipe the value through " + REDACT + ":\n" + "\n".join(found)


def test_the_credential_check_catches_a_printed_credential():
    printed = {"ansible.builtin.debug": {"msg": "index {{ tf_venv_pip_index_url }}"}}
    assert exposed_credentials(printed) == ["tf_venv_pip_index_url"]
    assert exposed_credentials({**printed, "no_log": True}) == []
    cut = {"ansible.builtin.debug": {"msg": "index {{ tf_venv_pip_index_url | " + REDACT + " }}"}}
    assert exposed_credentials(cut) == []
    each = {"ansible.builtin.debug": {"msg": "{{ [tf_venv_pip_index_url] | " + REDACT_EACH + " | list }}"}}
    assert exposed_credentials(each) == []
    named_only = {"ansible.builtin.assert": {"that": "{{ gpu_artifacts_mirror_password }}", "fail_msg": "set it"}}
    assert exposed_credentials(named_only) == []
