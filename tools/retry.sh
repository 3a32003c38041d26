# shellcheck shell=bash
# retry CMD [ARG...]: run a command that reaches a package mirror (apt-get, pip) up to RETRY_TRIES
# times (default 3), pausing RETRY_PAUSE seconds times the try (default 10) after a failure; when it
# gives up it prints the command's own last output (stdout and stderr) on stderr and returns its exit
# status. A mirror's passing error (apt-get's exit 100 on a half-synced mirror, a failed DNS lookup)
# must not fail a run, and a run that fails must say why. Source it: `. tools/retry.sh` (the Python
# tests have the same in tests/retry.py).
retry() {
  local tries=${RETRY_TRIES:-3} pause=${RETRY_PAUSE:-10} try=1 out rc
  while :; do
    if out=$("$@" 2>&1); then
      return 0
    else
      rc=$?
    fi
    [ "$try" -ge "$tries" ] && break
    echo "retry: \`$*\` failed (exit $rc), try $try of $tries; again in $((pause * try)) s" >&2
    sleep $((pause * try))
    try=$((try + 1))
  done
  printf 'retry: `%s` failed %s time(s), last with exit %s; its own output:\n%s\n' "$*" "$tries" "$rc" "$out" >&2
  return "$rc"
}
