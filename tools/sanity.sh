#!/usr/bin/env bash
# ansible-test sanity on the collection as users install it, under the oldest or the newest
# ansible-core the collection supports (meta/runtime.yml): build the tarball, install it under
# build/sanity-<X.Y>/ansible_collections/gpu_fleet/tf_hosts, add tests/sanity/ (the ignore files) and
# run `ansible-test sanity` there, so what ships is what is checked (tests/, tools/ and molecule/ are
# not in the tarball, see galaxy.yml's manifest).
#
# The release lines and their Pythons are tests/ansible_cores.py's: 2.16 (what Automation Platform
# 2.5 ships) runs here on Python 3.11; 2.21 needs Python 3.12 or later, which Debian 12 lacks, so it
# runs in a container of the Debian 13 sandbox image (Python 3.13, `make image`) with python3-venv
# installed from Debian's mirror. Both run ansible-core as `python3 -m ansible test` from its folder.
#
# ansible-test lists its files through the nearest enclosing git repository, which would be this
# clone, where build/ is ignored: the installed copy gets a throw-away `git init` of its own (in the
# container, where git is missing and the clone is not mounted, it walks the folder instead).
# --venv installs each test's pinned requirements (pylint, yamllint, voluptuous, ...) from PyPI into
# virtual environments under build/sanity-home-<X.Y> (ansible-test's ~/.ansible/test), reused by
# later runs; tools/sanity_get_pip.py seeds the pip bootstrap they need.
#
# Time on a 2-core machine: about 40-60 s; the first run of a line (or one after `make clean`) about
# 2 minutes, most of it creating the test venvs.
#
# Usage: tools/sanity.sh [--core 2.16|2.21] [more ansible-test sanity options, e.g. --test pep8]
# Exit codes: 0 every test passed; otherwise that of the failed build, install or ansible-test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg" ANSIBLE_HOME="$root/.ansible"
core=2.16
if [[ "${1:-}" == --core ]]; then
  core="$2"
  shift 2
fi
python_version="$(python -c "import sys; sys.path.insert(0, 'tests'); import ansible_cores; print(ansible_cores.PYTHON['$core'])")"
core_dir="$(python tests/ansible_cores.py "$core")"
# One folder per line: `sanity` and `sanity:newest` run side by side and each rebuilds its tarball.
dist="$root/build/dist-$core"
install_root="$root/build/sanity-$core"
collection="$install_root/ansible_collections/gpu_fleet/tf_hosts"
sanity_home="$root/build/sanity-home-$core"
debian13_image="${GPU_SANDBOX_IMAGE_DEBIAN13:-localhost/gpu-sandbox-debian:13}"

# Sanity tests that cannot run here, as "name: reason" (passed as --skip-test name); every other
# test runs. None at present. shellcheck and pslint find no targets (the tarball has no shell or
# PowerShell files), so they pass without needing the shellcheck and pwsh binaries.
skipped=()

started=$SECONDS
rm -rf "$install_root"
mkdir -p "$dist" "$sanity_home"
ansible-galaxy collection build --force --output-path "$dist" >/dev/null
tarball="$(echo "$dist"/gpu_fleet-tf_hosts-*.tar.gz)"
# --offline: the collection has no dependencies, so no Galaxy server is asked. The collections path
# names the target, which ansible-galaxy otherwise warns is not a configured one.
ANSIBLE_COLLECTIONS_PATH="$install_root" \
  ansible-galaxy collection install --offline --force -p "$install_root" "$tarball" >/dev/null
mkdir -p "$collection/tests"
cp -r tests/sanity tests/config.yml "$collection/tests/"

skip_args=()
echo "sanity: ansible-core $core on Python $python_version; skipped tests:"
for entry in "${skipped[@]}"; do
  skip_args+=(--skip-test "${entry%%:*}")
  echo "  - $entry"
done
[[ ${#skipped[@]} -gt 0 ]] || echo "  none"

status=0
test_args=(--color no --python "$python_version" --venv "${skip_args[@]}" "$@")
if [[ "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" == "$python_version" ]]; then
  git -C "$collection" init --quiet
  printf '%s\n' 'tests/output/' '__pycache__/' '*.pyc' >"$collection/.git/info/exclude"
  # ansible-test keeps its state under ~/.ansible/test: here, under build/. pip keeps the user's
  # configuration and download cache.
  export XDG_CONFIG_HOME="${XDG_CONFIG_HOME:-$HOME/.config}" XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"
  export HOME="$sanity_home" PYTHONPATH="$core_dir"
  python3 tools/sanity_get_pip.py "$python_version"
  (cd "$collection" && python3 -m ansible test sanity "${test_args[@]}") || status=$?
else
  tools/build-sandbox-image.sh "$debian13_image" >/dev/null
  # The machine's CA bundle (TEST-HOST: HTTPS goes through a TLS-inspecting proxy) for pip in the
  # container; pip's download cache is this machine's. The host's network: behind podman's NAT, pip's
  # index lookups once failed with "Temporary failure in name resolution" while another part's
  # containers set up their networks. apt-get runs under tools/retry.sh's `retry`: a mirror's passing
  # failure is tried again, and apt's own message is shown when it gives up.
  mkdir -p "${XDG_CACHE_HOME:-$HOME/.cache}/pip"
  podman run --rm --runtime=runc --network host --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
    -v "$install_root:$install_root" -v "$sanity_home:/root/.ansible" -v "$core_dir:/opt/ansible-core:ro" \
    -v "$root/tools/sanity_get_pip.py:/opt/sanity_get_pip.py:ro" -v "$root/tools/retry.sh:/opt/retry.sh:ro" \
    -v "${XDG_CACHE_HOME:-$HOME/.cache}/pip:/root/.cache/pip" \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    -e PIP_CERT=/etc/ssl/certs/ca-certificates.crt -e SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    -e PYTHONPATH=/opt/ansible-core -w "$collection" "$debian13_image" \
    bash -c 'export DEBIAN_FRONTEND=noninteractive && . /opt/retry.sh && retry apt-get -qq update \
      && retry apt-get -qq install -y python3-venv && python3 /opt/sanity_get_pip.py "$0" && python3 -m ansible test sanity "$@"' \
    "$python_version" "${test_args[@]}" || status=$?
fi
echo "sanity: finished in $((SECONDS - started)) s (rc $status)"
exit "$status"
