#!/usr/bin/env bash
# Install the Debian packages the controller needs for the sandbox, the stand-ins and the tests:
# podman + runc (rootful containers; crun cannot run here), debootstrap (the image), makeself, gcc,
# xz-utils (the NVIDIA stand-ins), python3-venv, chromium (renders the HTML report in a test).
# Skips apt when everything is present already.
# Exit codes: 0 ready; 1 apt failed; 2 not root.
set -euo pipefail
need=()
for pair in podman:podman runc:runc debootstrap:debootstrap makeself:makeself gcc:gcc xz:xz-utils chromium:chromium; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair##*:}")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${need[*]}; run as root or install them with apt-get" >&2
  exit 2
fi
echo "installing: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
