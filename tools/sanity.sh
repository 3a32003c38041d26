#!/usr/bin/env bash
# ansible-test sanity on the collection as users install it: build the tarball, install it under
# build/sanity/ansible_collections/gpu_fleet/tf_hosts, add tests/sanity/ (the ignore file) and run
# `ansible-test sanity` there, so what ships is what is checked (tests/, tools/ and molecule/ are
# not in the tarball, see galaxy.yml build_ignore).
#
# ansible-test lists its files through the nearest enclosing git repository, which would be this
# clone, where build/ is ignored: the installed copy gets a throw-away `git init` of its own.
# --venv installs each test's pinned requirements (pylint, yamllint, voluptuous, ...) from PyPI into
# virtual environments under build/sanity-home (ansible-test's ~/.ansible/test), reused by later
# runs. ansible-test bootstraps pip in them with get-pip from ci-files.testing.ansible.com; where
# that host cannot be reached, a stand-in that runs ensurepip and then pip from PyPI takes its place.
#
# Time on a 2-core machine: about 30-45 s; the first run (or one after `make clean`) about 110 s,
# most of it creating the test venvs. Build and install take 2 s.
#
# Usage: tools/sanity.sh [more ansible-test sanity options, e.g. --test pep8]
# Exit codes: 0 every test passed; otherwise that of the failed build, install or ansible-test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg" ANSIBLE_HOME="$root/.ansible"
python_version=3.11
dist="$root/build/dist"
install_root="$root/build/sanity"
collection="$install_root/ansible_collections/gpu_fleet/tf_hosts"

# Sanity tests that cannot run here, as "name: reason" (passed as --skip-test name); every other
# test runs. None at present: all 24 tests of ansible-core 2.19 run. shellcheck and pslint find no
# targets (the tarball has no shell or PowerShell files), so they pass without needing the
# shellcheck and pwsh binaries, which are not installed.
skipped=()

started=$SECONDS
rm -rf "$dist" "$install_root"
ansible-galaxy collection build --force --output-path "$dist" >/dev/null
tarball="$(echo "$dist"/gpu_fleet-tf_hosts-*.tar.gz)"
# --offline: the collection has no dependencies, so no Galaxy server is asked. The collections path
# names the target, which ansible-galaxy otherwise warns is not a configured one.
ANSIBLE_COLLECTIONS_PATH="$install_root" \
  ansible-galaxy collection install --offline --force -p "$install_root" "$tarball" >/dev/null
mkdir -p "$collection/tests"
cp -r tests/sanity "$collection/tests/"
git -C "$collection" init --quiet
printf '%s\n' 'tests/output/' '__pycache__/' '*.pyc' >"$collection/.git/info/exclude"

# ansible-test keeps its state (venvs, pip bootstrap script) under ~/.ansible/test: here, under
# build/. pip keeps the user's configuration and download cache.
export XDG_CONFIG_HOME="${XDG_CONFIG_HOME:-$HOME/.config}" XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"
export HOME="$root/build/sanity-home"
# The pip version ansible-test bootstraps (24.2 for ansible-core 2.19), from its internals; when
# they change, ansible-test is left to fetch get-pip itself.
pip_version="$(python -c 'from types import SimpleNamespace
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(SimpleNamespace(version="'"$python_version"'"))["pip"])' 2>/dev/null || true)"
get_pip="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
if [[ -n "$pip_version" && ! -s "$get_pip" ]]; then
  mkdir -p "$(dirname "$get_pip")"
  if ! python - "$pip_version" "$get_pip" 2>/dev/null <<'PY'; then
import sys, urllib.request
url = "https://ci-files.testing.ansible.com/ansible-test/get-pip-%s.py" % sys.argv[1]
with urllib.request.urlopen(url, timeout=15) as response, open(sys.argv[2], "wb") as out:
    out.write(response.read())
PY
    rm -f "$get_pip"
    cat >"$get_pip" <<'PY'
"""Stand-in for get-pip.py (ci-files.testing.ansible.com is unreachable): ensurepip, then pip
installs the packages ansible-test asks for (pip==X.Y) from the configured index."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"], stdout=subprocess.DEVNULL)
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
PY
    echo "sanity: get-pip ${pip_version} could not be downloaded; using an ensurepip stand-in ($get_pip)"
  fi
fi

skip_args=()
echo "sanity: skipped tests:"
for entry in "${skipped[@]}"; do
  skip_args+=(--skip-test "${entry%%:*}")
  echo "  - $entry"
done
[[ ${#skipped[@]} -gt 0 ]] || echo "  none"

cd "$collection"
status=0
ansible-test sanity --color no --python "$python_version" --venv "${skip_args[@]}" "$@" || status=$?
echo "sanity: finished in $((SECONDS - started)) s (rc $status)"
exit "$status"
