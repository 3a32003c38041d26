#!/usr/bin/env bash
# Build the sandbox/Molecule base image (Debian 12, minbase) locally with debootstrap and import it
# into podman. Used where no registry can be reached; on a normal machine you may instead set
# GPU_SANDBOX_IMAGE=docker.io/library/debian:bookworm (python3 and sudo are then installed by the
# prepare step).
#
# Usage: tools/build-sandbox-image.sh [IMAGE]     (default: localhost/gpu-sandbox-debian:12)
# Exit codes: 0 image present or built; 1 build failed.
set -euo pipefail
image="${1:-${GPU_SANDBOX_IMAGE:-localhost/gpu-sandbox-debian:12}}"
suite="${GPU_SANDBOX_SUITE:-bookworm}"
mirror="${GPU_SANDBOX_MIRROR:-http://deb.debian.org/debian}"

if podman image exists "$image"; then
  echo "image $image already present"
  exit 0
fi
rootfs="$(mktemp -d /var/tmp/gpu-sandbox-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap $suite into $rootfs (about a minute)"
debootstrap --variant=minbase --include=python3,python3-apt,sudo,ca-certificates \
  "$suite" "$rootfs" "$mirror" >/dev/null
tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "built $image"
