"""execution-environment.yml: ansible-builder turns it into a build context (no image is built).

`ansible-builder create` validates the file against the version 3 schema and writes the context
an image build would use; the test reads that context the way the build would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

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
    built = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work / "build/ee"), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
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


def test_python_requirements_are_the_declared_ones(context):
    declared = yaml.safe_load(DEFINITION.read_text())["dependencies"]
    assert pins((context / "_build/requirements.txt").read_text()) == pins("\n".join(declared["python"]))
    assert "openssh-clients [platform:rpm]" in (context / "_build/bindep.txt").read_text()


def test_ansible_core_matches_the_controller_pin(context):
    containerfile = (context / "Containerfile").read_text()
    controller = pins((ROOT / "requirements.txt").read_text())
    assert f"ansible-core=={controller['ansible-core']}" in containerfile
    assert "ansible-runner==" in containerfile
    # Packages the collection imports on the controller are pinned as the controller pins them.
    declared = pins((context / "_build/requirements.txt").read_text())
    assert declared == {name: controller[name] for name in declared}
