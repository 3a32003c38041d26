"""Commands that reach a package mirror from a test's set-up, tried again after a passing failure.

A mirror or an index answers now and then with an error that is gone a few seconds later (apt-get's
exit 100 on a half-synced mirror, a DNS lookup that failed while other containers set up their
networks). Set-up that installs from one (``apt-get`` in a test container, ``pip install`` for a
test's tools) runs through ``run``: a failure is tried again a bounded number of times, with a growing
pause, and when it gives up the error holds the command's own last output (stdout and stderr), so the
cause is read in the test's report instead of being guessed. Shell scripts have the same as
``retry`` in tools/retry.sh.

``in_container`` is the usual case: ``podman exec`` of a shell script in a container.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Sequence

TRIES = 3
PAUSE = 10.0  # seconds before the second try; the pause grows with each try
TAIL = 3000  # characters of each output stream kept in the error


class RetryError(RuntimeError):
    """A command failed every try: the message names it, its exit status and its own last output."""


def _tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = (text or "").rstrip()
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def run(
    argv: Sequence[str],
    *,
    tries: int = TRIES,
    pause: float = PAUSE,
    what: str | None = None,
    timeout: float | None = None,
    **kwargs,
) -> subprocess.CompletedProcess:
    """Run ``argv`` (output captured as text; ``input``, ``env``, ``cwd`` pass on to subprocess.run)
    until it exits 0, at most ``tries`` times; returns the passing run. ``what`` names the command in
    the messages (default: its command line). A run past ``timeout`` counts as a failed try.
    Raises RetryError with the last try's exit status, stdout and stderr."""
    shown = what or shlex.join(argv)
    done: subprocess.CompletedProcess | None = None
    for attempt in range(1, tries + 1):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout, **kwargs)
        except subprocess.TimeoutExpired as exc:
            said = "\n".join(filter(None, (_tail(exc.stderr), f"(stopped: it ran past {timeout} s)")))
            done = subprocess.CompletedProcess(argv, 124, exc.stdout, said)
        if done.returncode == 0:
            return done
        if attempt < tries:
            wait = pause * attempt
            print(f"retry: `{shown}` failed (exit {done.returncode}), try {attempt} of {tries}; again in {wait:g} s",
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(wait)
    stdout, stderr = _tail(done.stdout), _tail(done.stderr)
    raise RetryError(
        f"`{shown}` failed {tries} time(s), last with exit {done.returncode}; its own output:\n"
        f"--- stdout ---\n{stdout or '(none)'}\n--- stderr ---\n{stderr or '(none)'}"
    )


def in_container(container: str, script: str, **kwargs) -> subprocess.CompletedProcess:
    """``run`` of ``sh -c script`` in ``container`` (``podman exec -i``; ``input`` feeds its stdin)."""
    kwargs.setdefault("what", f"{script} (in {container})")
    return run(["podman", "exec", "-i", container, "sh", "-c", script], **kwargs)


# apt-get without questions: what the test containers' package installs run.
APT_INSTALL = (
    "export DEBIAN_FRONTEND=noninteractive && apt-get -q update && apt-get -q install -y --no-install-recommends"
)


def apt_install(container: str, *packages: str, **kwargs) -> subprocess.CompletedProcess:
    """``apt-get update`` and ``apt-get install`` of ``packages`` in ``container``, tried again."""
    return in_container(container, f"{APT_INSTALL} {shlex.join(packages)}", **kwargs)
