"""tools/sanity_get_pip.py: seeds ansible-test's pip bootstrap, with a stand-in where the download fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SPEC = importlib.util.spec_from_file_location("sanity_get_pip", ROOT / "tools" / "sanity_get_pip.py")
sanity_get_pip = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sanity_get_pip)


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _unreachable(*args, **kwargs):
    raise OSError("Name or service not known")


def test_an_unreachable_download_leaves_the_stand_in_under_the_version_ansible_test_asks_for(home, monkeypatch):
    monkeypatch.setattr(sanity_get_pip, "pip_version", lambda python: "24.2")
    monkeypatch.setattr(sanity_get_pip.urllib.request, "urlopen", _unreachable)
    sanity_get_pip.main("3.11")
    seeded = home / ".ansible/test/cache/get_pip_24_2.py"
    assert "ensurepip" in seeded.read_text()


def test_the_stand_in_runs_ensurepip_then_pip_with_the_arguments_less_the_ones_pip_lacks(home, monkeypatch):
    monkeypatch.setattr(sanity_get_pip, "pip_version", lambda python: "24.2")
    monkeypatch.setattr(sanity_get_pip.urllib.request, "urlopen", _unreachable)
    sanity_get_pip.main("3.11")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # pip exists once ensurepip ran; --no-index reaches pip install, get-pip's own --no-wheel does not
    # (pip has no such option).
    done = subprocess.run(
        [str(venv / "bin/python"), str(home / ".ansible/test/cache/get_pip_24_2.py"), "--no-wheel", "--no-index", "pip"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "Requirement already satisfied: pip" in done.stdout, done.stdout + done.stderr


def test_a_seeded_script_is_kept_and_an_unknown_version_writes_nothing(home, monkeypatch):
    seeded = home / ".ansible/test/cache/get_pip_24_2.py"
    seeded.parent.mkdir(parents=True)
    seeded.write_text("# fetched earlier\n")
    monkeypatch.setattr(sanity_get_pip, "pip_version", lambda python: "24.2")
    monkeypatch.setattr(sanity_get_pip.urllib.request, "urlopen", _unreachable)
    sanity_get_pip.main("3.11")
    assert seeded.read_text() == "# fetched earlier\n"
    monkeypatch.setattr(sanity_get_pip, "pip_version", lambda python: None)
    sanity_get_pip.main("3.13")
    assert sorted(p.name for p in seeded.parent.iterdir()) == ["get_pip_24_2.py"]
