"""execution-environment.yml and the collection's meta/execution-environment.yml: ansible-builder
turns the first into a build context (no image is built) and reads the second from an installed copy.

`ansible-builder create` validates the file against the version 3 schema and writes the context
an image build would use; the test reads that context the way the build would. `ansible-builder
introspect` lists what a collection installed into an image asks for, as a user's own build would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFINITION = ROOT / "execution-environment.yml"


def pins(text: str) -> dict[str, str]:
    """``name==version`` lines -> {name: version} (comments and blanks ignored)."""
    found = {}
    for line in text.splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            found[name.split("[", 1)[0].lower()] = version.strip()
    return found


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> Path:
    """The build context of a copy of the definition, next to a freshly built collection tarball."""
    work = tmp_path_factory.mktemp("ee")
    shutil.copy(DEFINITION, work)
    shutil.copytree(ROOT / "meta", work / "meta")
    built = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work / "build/ee"), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (tarball,) = (work / "build/ee").glob("gpu_fleet-tf_hosts-*.tar.gz")
    tarball.rename(work / "build/ee/gpu_fleet-tf_hosts.tar.gz")  # as `make ee-context` names it
    created = subprocess.run(
        [str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c", "context"],
        capture_output=True,
        text=True,
        cwd=work,
        check=False,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    return work / "context"


def test_the_collection_is_installed_from_this_clone(context):
    galaxy = yaml.safe_load((context / "_build/requirements.yml").read_text())
    (entry,) = galaxy["collections"]
    assert entry["type"] == "file"
    # The galaxy stage runs in /build, the context's _build folder: the tarball must be there.
    tarball = context / "_build" / entry["name"]
    with tarfile.open(tarball) as archive:
        manifest = archive.extractfile("MANIFEST.json")
        assert manifest is not None
        info = yaml.safe_load(manifest.read())["collection_info"]
    meta = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert (info["namespace"], info["name"], info["version"]) == (meta["namespace"], meta["name"], meta["version"])
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    assert "roles/gpu_verify/tasks/main.yml" in names
    assert "plugins/callback/host_failures.py" in names
    assert not [n for n in names if n.startswith(("tests/", "build/", ".venv/", "reports/"))]


def requirements(text: str) -> list[str]:
    """The requirement lines of a pip requirements or bindep file (comments and blanks left out)."""
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def test_the_context_holds_the_collections_own_requirements(context):
    assert requirements((context / "_build/requirements.txt").read_text()) == requirements(
        (ROOT / "meta/ee-requirements.txt").read_text()
    )
    bindep = (context / "_build/bindep.txt").read_text()
    assert "openssh-clients [platform:rpm]" in bindep and "openssh-client [platform:dpkg]" in bindep


def test_ansible_core_matches_the_controller_pin_and_the_collections_ranges_admit_its_pins(context):
    containerfile = (context / "Containerfile").read_text()
    controller = pins((ROOT / "requirements.txt").read_text())
    assert f"ansible-core=={controller['ansible-core']}" in containerfile
    assert "ansible-runner==" in containerfile
    # The packages the collection imports on the controller: the controller's pins are in their ranges.
    for line in requirements((context / "_build/requirements.txt").read_text()):
        wanted = Requirement(line)
        assert wanted.specifier.contains(controller[wanted.name]), (line, controller[wanted.name])


def test_the_base_image_is_a_build_argument_and_no_version_is_written_twice(context):
    definition = yaml.safe_load(DEFINITION.read_text())
    base = definition["images"]["base_image"]["name"]
    containerfile = (context / "Containerfile").read_text()
    assert f'ARG EE_BASE_IMAGE="{base}"' in containerfile and "FROM $EE_BASE_IMAGE" in containerfile
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    assert version not in DEFINITION.read_text() and version not in (ROOT / "Makefile").read_text()


def test_an_installed_copy_tells_ansible_builder_what_it_needs(context, tmp_path):
    """What a user's own execution environment gets from the collection (meta/execution-environment.yml)."""
    tarball = context / "_build/collections/gpu_fleet-tf_hosts.tar.gz"
    installed = subprocess.run(
        [
            str(BIN / "ansible-galaxy"),
            "collection",
            "install",
            "--force",
            "--no-deps",
            "-p",
            str(tmp_path),
            str(tarball),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    found = subprocess.run(
        [str(BIN / "ansible-builder"), "introspect", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert found.returncode == 0, found.stdout + found.stderr
    assert "packaging>=21.0  # from collection gpu_fleet.tf_hosts" in found.stdout
    assert "openssh-clients [platform:rpm]  # from collection gpu_fleet.tf_hosts" in found.stdout
