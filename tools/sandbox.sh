#!/usr/bin/env bash
# Start or remove the sandbox host: a rootful podman container named like the host in
# inventories/sandbox (gpu-sandbox), from the locally built image.
# Usage: tools/sandbox.sh up [extra podman run options]|down|status
# The tests and the bench start their hosts with it too (GPU_SANDBOX_NAME names each one).
# Exit codes: 0 done; 1 podman failed; 2 usage.
set -euo pipefail
name="${GPU_SANDBOX_NAME:-gpu-sandbox}"
image="${GPU_SANDBOX_IMAGE:-localhost/gpu-sandbox-debian:12}"
case "${1:-}" in
  up)
    if [ "$(podman container inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = "true" ]; then
      echo "sandbox $name already running"
      exit 0
    fi
    podman rm -f "$name" >/dev/null 2>&1 || true
    # runc: crun cannot set up cgroups on hosts in hybrid mode; ulimits: the defaults need
    # CAP_SYS_RESOURCE; --init: a PID 1 that reaps and stops fast.
    podman run -d --name "$name" --hostname "$name" --runtime=runc --init \
      --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 "${@:2}" "$image" sleep infinity >/dev/null
    echo "sandbox $name started"
    ;;
  down)
    podman rm -f -t 2 "$name" >/dev/null 2>&1 || true
    echo "sandbox $name removed"
    ;;
  status)
    podman ps -a --filter "name=^${name}\$" --format '{{.Names}} {{.Status}}'
    ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
