"""Seed ansible-test's pip bootstrap script where ci-files.testing.ansible.com cannot be reached.

ansible-test sanity --venv bootstraps pip in each test venv with get-pip.py of a pinned pip version,
downloaded from ci-files.testing.ansible.com into ~/.ansible/test/cache/. Run under the ansible-core
that runs ansible-test (its internals name the version); where the download fails, a stand-in that
runs ensurepip and then pip from the configured index (pip==X.Y) takes its place.

Usage: python3 tools/sanity_get_pip.py <python X.Y of the test venvs>
Exit codes: 0 seeded, already there, or the version is unknown (ansible-test then fetches it itself).
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

STAND_IN = '''"""Stand-in for get-pip.py (ci-files.testing.ansible.com is unreachable): ensurepip, then pip
installs the packages ansible-test asks for (pip==X.Y) from the configured index."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"], stdout=subprocess.DEVNULL)
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
'''


def pip_version(python: str) -> str | None:
    try:
        from ansible_test._internal.python_requirements import get_venv_packages
    except ImportError:
        return None
    return get_venv_packages(SimpleNamespace(version=python)).get("pip")


def main(python: str) -> None:
    version = pip_version(python)
    if not version:
        return
    target = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{version.replace('.', '_')}.py"
    if target.is_file() and target.stat().st_size:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    url = f"https://ci-files.testing.ansible.com/ansible-test/get-pip-{version}.py"
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            target.write_bytes(response.read())
    except OSError:
        target.write_text(STAND_IN)
        print(f"sanity: get-pip {version} could not be downloaded; using an ensurepip stand-in ({target})")


if __name__ == "__main__":
    main(sys.argv[1])
