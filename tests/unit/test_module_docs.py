"""Custom plugins document themselves: ansible-doc renders the module, the lookup and every filter
with the project's ansible.cfg, and lists no filter as UNDOCUMENTED."""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "gpu_fleet.tf_hosts"


def ansible_doc(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOME=str(ROOT / ".ansible"))
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def exported_filters() -> list[str]:
    """Every filter name the FilterModule classes of plugins/filter/*.py export (conftest.py puts
    collections/ on sys.path, so they import by their collection path)."""
    names = []
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):
        module = importlib.import_module(f"ansible_collections.gpu_fleet.tf_hosts.plugins.filter.{path.stem}")
        names += module.FilterModule().filters()
    return sorted(names)


FILTERS = exported_filters()


def test_ansible_doc_renders_nvidia_gpu_facts():
    out = ansible_doc("-t", "module", f"{COLLECTION}.nvidia_gpu_facts")
    assert out.returncode == 0, out.stderr
    for text in ("nvidia_gpu_facts", "nvidia_smi_path", "lspci_path", "RETURN VALUES", "nvswitch_present"):
        assert text in out.stdout, text


def test_ansible_doc_renders_gpu_host_probe():
    out = ansible_doc("-t", "module", f"{COLLECTION}.gpu_host_probe")
    assert out.returncode == 0, out.stderr
    for text in ("gpu_host_probe", "target_exists", "max_bytes", "RETURN VALUES"):
        assert text in out.stdout, text


def test_ansible_doc_renders_gpu_files():
    out = ansible_doc("-t", "module", f"{COLLECTION}.gpu_files")
    assert out.returncode == 0, out.stderr
    for text in ("gpu_files", "validate", "one round trip", "RETURN VALUES"):
        assert text in out.stdout, text


def test_ansible_doc_renders_gpu_artifact():
    out = ansible_doc("-t", "module", f"{COLLECTION}.gpu_artifact")
    assert out.returncode == 0, out.stderr
    for text in ("gpu_artifact", "cache_files", "keep_cache", "corresponding action plugin", "RETURN VALUES"):
        assert text in out.stdout, text


def test_ansible_doc_renders_collection_path_lookup():
    out = ansible_doc("-t", "lookup", f"{COLLECTION}.collection_path")
    assert out.returncode == 0, out.stderr
    for text in ("collection_path", "default_of", "RETURN VALUES"):
        assert text in out.stdout, text


@pytest.mark.parametrize(
    ("name", "texts"),
    [
        ("host_failures", ("gpu_verify_unreachable_reason", "callbacks_enabled")),
        ("progress", ("still running after", "callbacks_enabled")),
        ("preload", ("forked", "callbacks_enabled")),
    ],
)
def test_ansible_doc_renders_the_callbacks(name, texts):
    out = ansible_doc("-t", "callback", f"{COLLECTION}.{name}")
    assert out.returncode == 0, out.stderr
    for text in (name, *texts):
        assert text in out.stdout, text


def test_ansible_doc_lists_every_filter_documented():
    out = ansible_doc("-t", "filter", "-l", COLLECTION)
    assert out.returncode == 0, out.stderr
    listed = {}
    for line in out.stdout.splitlines():
        name, _, description = line.partition(" ")
        if name.startswith(COLLECTION + "."):
            listed[name.removeprefix(COLLECTION + ".")] = description.strip()
    assert sorted(listed) == FILTERS
    undocumented = sorted(name for name, description in listed.items() if "UNDOCUMENTED" in description)
    assert not undocumented, f"filters without plugins/filter/<name>.yml: {undocumented}"


@functools.cache
def rendered(kind: str, names: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Every named plugin's page from one ansible-doc run (one run each cost about 3 s of the unit tier's
    time), split at each page's header line ``> FILTER <fqcn> (<file>)``."""
    out = ansible_doc("-t", kind, *(f"{COLLECTION}.{name}" for name in names))
    pages: dict[str, str] = {}
    header = rf"> {kind.upper()} {re.escape(COLLECTION)}\.(\w+) "
    for page in re.split(rf"^(?=> {kind.upper()} )", re.sub(r"\x1b\[[0-9;]*m", "", out.stdout), flags=re.M):
        found = re.match(header, page)
        if found:
            pages[found.group(1)] = page
    return out, pages


def rendered_filters() -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    return rendered("filter", tuple(FILTERS))


MODULES = sorted(path.stem for path in (ROOT / "plugins" / "modules").glob("*.py"))


def test_ansible_doc_renders_every_module_without_a_warning():
    out, pages = rendered("module", tuple(MODULES))
    assert out.returncode == 0, out.stderr
    assert not out.stderr.strip(), out.stderr
    assert sorted(pages) == MODULES
    for name, page in pages.items():
        for text in ("OPTIONS", "EXAMPLES"):
            assert text in page, (name, text)


def test_ansible_doc_renders_the_filters_without_a_warning():
    out, pages = rendered_filters()
    assert out.returncode == 0, out.stderr
    assert not out.stderr.strip(), out.stderr
    assert sorted(pages) == FILTERS


@pytest.mark.parametrize("name", FILTERS)
def test_ansible_doc_renders_filter(name: str):
    page = rendered_filters()[1].get(name, "")
    for text in (f"{COLLECTION}.{name}", "EXAMPLES", "RETURN VALUES", "_input"):
        assert text in page, text
