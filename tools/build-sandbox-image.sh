#!/usr/bin/env bash
# Build the sandbox/Molecule base image (Debian 12, minbase) locally with debootstrap and import it
# into podman. Used where no registry can be reached; on a normal machine you may instead set
# GPU_SANDBOX_IMAGE=docker.io/library/debian:bookworm (python3 and sudo are then installed by the
# prepare step).
#
#
# The image also holds a test fixture: /usr/share/gpu-sandbox/pci-devices/<bus id>/{vendor,device,class},
# a sysfs-like list of the 2 GPUs that the stand-in nvidia-smi describes (written by
# tests/fixtures/nvidia/pci_sysfs.py). A container's /sys is this machine's, which has no NVIDIA
# GPU; the sandbox inventory points gpu_preflight_pci_devices_path there. An image pulled from a
# registry lacks it: preflight then falls back to lspci and nvidia-smi. It also holds an empty
# /var/log/kern.log, the kernel log the sandbox inventory gives the health check.
#
# The image carries a label with a hash of its inputs (this script, the fixture writer and the GPU
# description); an image whose label differs is rebuilt, so `make image` picks up fixture changes.
#
# The Debian release is the image tag's: localhost/gpu-sandbox-debian:13 is trixie (the Debian 13 host
# of tests/integration/test_debian13.py and the container of `tools/sanity.sh --core 2.21`), any
# other tag bookworm; GPU_SANDBOX_SUITE overrides it.
#
# Usage: tools/build-sandbox-image.sh [IMAGE]     (default: localhost/gpu-sandbox-debian:12)
# Exit codes: 0 image present or built; 1 build failed.
set -euo pipefail
image="${1:-${GPU_SANDBOX_IMAGE:-localhost/gpu-sandbox-debian:12}}"
case "$image" in
  *:13) default_suite=trixie ;;
  *) default_suite=bookworm ;;
esac
suite="${GPU_SANDBOX_SUITE:-$default_suite}"
mirror="${GPU_SANDBOX_MIRROR:-http://deb.debian.org/debian}"
root="$(cd "$(dirname "$0")/.." && pwd)"
fixtures="$root/tests/fixtures/nvidia"
pci_devices=/usr/share/gpu-sandbox/pci-devices
label=io.gpu-fleet.sandbox-inputs

inputs="$(cat "$0" "$fixtures/pci_sysfs.py" "$fixtures/lspci.py" "$fixtures/gpus/2xA100-SXM4-80GB.json" \
  | { cat; echo "$suite"; } | sha256sum | cut -c1-16)"
# One build of an image per machine at a time: clones on the machine share podman's storage, so a
# second build waits for the first (a lock file in the machine's test cache, as tests/snapshots.py's)
# and then finds the image.
locks="${GPU_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-fleet-tests}/images"
mkdir -p "$locks"
exec 9>"$locks/.lock-$(printf '%s' "$image" | tr -c 'A-Za-z0-9._-' '_')"
flock 9
if podman image exists "$image"; then
  present="$(podman image inspect --format "{{ index .Labels \"$label\" }}" "$image" 2>/dev/null || true)"
  if [ "$present" = "$inputs" ]; then
    echo "image $image already present"
    exit 0
  fi
  echo "image $image was built from other inputs (label $label: '${present}', now '$inputs'): rebuilding"
fi
rootfs="$(mktemp -d /var/tmp/gpu-sandbox-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap $suite into $rootfs (about a minute)"
debootstrap --variant=minbase --include=python3,python3-apt,sudo,ca-certificates \
  "$suite" "$rootfs" "$mirror" >/dev/null
python3 "$fixtures/pci_sysfs.py" --out "$rootfs$pci_devices"
# No kernel log of its own in a container: an empty rsyslog-style file for the health check to read.
: >"$rootfs/var/log/kern.log"
tar -C "$rootfs" -c . \
  | podman import --change 'CMD ["/bin/bash"]' --change "LABEL $label=$inputs" - "$image" >/dev/null
echo "built $image"
