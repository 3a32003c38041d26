#!/usr/bin/env bash
# Install the Debian packages the controller needs for the sandbox, the stand-ins and the tests:
# podman + runc (rootful containers; crun cannot run here), debootstrap (the image), makeself, gcc,
# binutils (readelf: the sonames of NVIDIA's libraries), xz-utils (the NVIDIA stand-ins), python3-venv, chromium (renders the HTML report in a test), and
# promtool (checks the alerting rules and the metrics textfiles in tests/unit/monitoring).
# promtool comes from Debian's `prometheus` package, but only the one program is taken: installing
# the package would also create a prometheus user and enable and start a Prometheus server on port
# 9090 (its maintainer scripts start the service), which a test machine has no use for. So the
# package is downloaded (`apt-get download`), unpacked aside (`dpkg-deb -x`, which runs no
# maintainer script) and its usr/bin/promtool installed as /usr/local/bin/promtool, on PATH; it
# needs only libc (a Go program).
# Skips apt when everything is present already.
# Exit codes: 0 ready; 1 apt failed; 2 not root.
set -euo pipefail
need=()
for pair in podman:podman runc:runc debootstrap:debootstrap makeself:makeself gcc:gcc readelf:binutils xz:xz-utils chromium:chromium; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair##*:}")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
promtool=()
command -v promtool >/dev/null 2>&1 || promtool=(promtool)
if [ ${#need[@]} -eq 0 ] && [ ${#promtool[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${need[*]} ${promtool[*]}; run as root or install them with apt-get" >&2
  exit 2
fi
# A mirror's passing failure gets two more tries; when apt gives up, its own message is shown.
. "$(dirname "$0")/retry.sh"
echo "installing: ${need[*]} ${promtool[*]}"
export DEBIAN_FRONTEND=noninteractive
retry apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
  retry apt-get install -y -qq "${need[@]}"
fi
if [ ${#promtool[@]} -gt 0 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # As root, apt downloads as its sandbox user _apt, which cannot write a folder of mktemp's (0700).
  (cd "$work" && retry apt-get download -qq -o APT::Sandbox::User=root prometheus)
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  install -m 0755 "$work/root/usr/bin/promtool" /usr/local/bin/promtool
  promtool --version | head -n 1
fi
