#!/usr/bin/env bash
# antsibull-docs lint-collection-docs --plugin-docs on the collection as users install it: built and
# installed into a temporary folder. The linter copies the folder it is given, and the clone's own
# folder also holds build outputs that are not the collection's (build/: venvs whose interpreter
# links point into a container, the wheelhouse, the stand-ins).
#
# Usage: tools/lint-collection-docs.sh
# Exit codes: 0 the docs pass; otherwise that of the failed build, install or antsibull-docs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$root/.venv/bin:$PATH"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ansible-galaxy collection build --output-path "$work" "$root" >/dev/null
ANSIBLE_COLLECTIONS_PATH="$work/installed" \
  ansible-galaxy collection install --offline -p "$work/installed" "$work"/gpu_fleet-tf_hosts-*.tar.gz >/dev/null
cd "$work/installed/ansible_collections/gpu_fleet/tf_hosts"
antsibull-docs lint-collection-docs --plugin-docs .
