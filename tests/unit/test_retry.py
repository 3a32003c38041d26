"""tests/retry.py and tools/retry.sh: a mirror's passing failure is tried again, a lasting one is
reported with the command's own output."""

from __future__ import annotations

import subprocess
import sys

import pytest
import retry
from helpers import ROOT

# Fails (exit 100, as apt-get does on a mirror's error, with a message on each stream) until it has
# been run ``$2`` times, counting its runs in the file ``$1``.
FLAKY = """
n=$(($(cat "$1" 2>/dev/null || echo 0) + 1)); echo "$n" > "$1"
if [ "$n" -le "$2" ]; then echo "E: Failed to fetch http://deb.example/pool/x.deb  500 Internal Server Error" >&2
  echo "Reading package lists... (try $n)"; exit 100; fi
echo installed
"""


def flaky(counter, failures: int) -> list[str]:
    return ["sh", "-c", FLAKY, "flaky", str(counter), str(failures)]


def test_a_command_that_fails_twice_then_passes_is_run_three_times(tmp_path, capsys):
    done = retry.run(flaky(tmp_path / "n", 2), pause=0)
    assert done.stdout.strip() == "installed"
    assert (tmp_path / "n").read_text().strip() == "3"
    said = capsys.readouterr().err
    assert "try 1 of 3" in said and "try 2 of 3" in said and "exit 100" in said


def test_a_command_that_always_fails_gives_up_with_its_own_output(tmp_path):
    with pytest.raises(retry.RetryError) as raised:
        retry.run(flaky(tmp_path / "n", 99), pause=0, what="apt-get install tinyproxy")
    assert (tmp_path / "n").read_text().strip() == "3"
    message = str(raised.value)
    assert "`apt-get install tinyproxy` failed 3 time(s), last with exit 100" in message
    assert "500 Internal Server Error" in message  # its stderr
    assert "Reading package lists... (try 3)" in message  # its stdout, of the last try


def test_a_command_past_its_timeout_is_a_failed_try():
    with pytest.raises(retry.RetryError, match=r"(?s)exit 124.*stopped: it ran past 0.5 s"):
        retry.run([sys.executable, "-c", "import time; time.sleep(30)"], tries=1, timeout=0.5)


def test_input_reaches_the_command():
    assert retry.run(["cat"], input="conf\n", tries=1).stdout == "conf\n"


def shell_retry(tmp_path, failures: int) -> subprocess.CompletedProcess:
    script = f'. "{ROOT}/tools/retry.sh" && RETRY_PAUSE=0 retry sh -c \'{FLAKY}\' flaky "$1" {failures}'
    return subprocess.run(["bash", "-c", script, "bash", str(tmp_path / "n")], capture_output=True, text=True)


def test_the_shell_function_tries_again_and_passes(tmp_path):
    done = shell_retry(tmp_path, 2)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "n").read_text().strip() == "3"
    assert "try 2 of 3" in done.stderr


def test_the_shell_function_gives_up_with_the_commands_own_output(tmp_path):
    done = shell_retry(tmp_path, 99)
    assert done.returncode == 100
    assert (tmp_path / "n").read_text().strip() == "3"
    assert "failed 3 time(s), last with exit 100" in done.stderr
    assert "500 Internal Server Error" in done.stderr and "(try 3)" in done.stderr
