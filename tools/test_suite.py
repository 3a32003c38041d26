#!/usr/bin/env python3
"""Run the test suite's parts, two at a time, and print a table of each part's wall time.

Parts and what they need are data (``tests/parts.yml``): a part starts once the parts it needs have
passed, and the ready part with the longest chain goes first (its time plus that of the parts waiting
for it: the last measured time, kept in build/test-times.json, or the data file's estimate), so the
slow ones and the ones others wait for do not end up last. Each
part's output goes to build/test-logs/<part>.log; a failed part's tail is printed at once, the
others go on, and the run fails at the end. A part whose need failed is not run and counts as
failed.

The ``converged`` snapshot (tests/snapshots.py) is a part of its own, so that the parts that start
hosts from it wait for one build instead of each building it.

Usage: tools/test_suite.py [--tier check|test] [--jobs N] [--only PART|PATTERN ...]
Exit codes: 0 every part passed; 1 a part failed; 2 usage.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / "tests" / "parts.yml"
LOGS = ROOT / "build" / "test-logs"
TIMES = ROOT / "build" / "test-times.json"
TAIL = 80  # lines of a failed part's log printed on the console when it fails
# Lines that say why a part failed, repeated after the table (CI keeps only the end of the console
# output): pytest, Molecule/Ansible, ansible-test and make; ansible-lint's rule lines and summary,
# yamllint's errors, ruff's findings and the files ruff would reformat.
CAUSE = re.compile(
    r"^(FAILED |ERROR|FATAL|fatal:|E   |make: \*\*\*|Failed: )|Error:|AssertionError"
    r"|^[\w-]+\[[\w-]+\]: |^\s+\d+:\d+\s+error\s|^\S+:\d+:\d+: [A-Z]+\d+ |^\s+--> |would be reformatted"
)
CAUSES = 30  # the last cause lines of each failed part printed after the table
# yamllint names the file on a line of its own above its error lines: that line is kept with them.
YAMLLINT_ERROR = re.compile(r"^\s+\d+:\d+\s+(error|warning)\s")


@dataclass
class Part:
    name: str
    command: str
    tier: str
    estimate: float
    needs: list[str] = field(default_factory=list)
    # True: nothing beside it (timed against waits of a few seconds). "offline": only offline parts beside
    # it (its burst of network lookups must not meet another part's); while one is still to run, the
    # offline parts leave the slots to the container parts that wait (see _fits).
    alone: bool | str = False
    offline: bool = False  # starts no container and reaches no network (lint, unit, sanity)
    # Parts it starts after when they are in the run, whatever their result (one may make what this
    # part would otherwise make itself); unlike needs, --only does not bring them in.
    after: list[str] = field(default_factory=list)
    result: str = "waiting"
    seconds: float = 0.0
    started: float = 0.0


def load(tier: str, only: list[str]) -> list[Part]:
    data = yaml.safe_load(PARTS.read_text())
    measured = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    tiers = ("check",) if tier == "check" else ("check", "test")
    parts = [
        Part(
            name,
            spec["command"],
            spec.get("tier", "test"),
            measured.get(name, spec["estimate"]),
            spec.get("needs", []),
            spec.get("alone", False),
            spec.get("offline", False),
            spec.get("after", []),
        )
        for name, spec in data["parts"].items()
        if spec.get("tier", "test") in tiers
    ]
    if only:
        wanted = {part.name for part in parts if any(fnmatch.fnmatchcase(part.name, pattern) for pattern in only)}
        for part in parts:  # what the chosen parts need comes with them
            if part.name in wanted:
                wanted |= set(part.needs)
        parts = [part for part in parts if part.name in wanted]
    return parts


class Runner:
    def __init__(self, parts: list[Part], jobs: int, env: dict[str, str]):
        self.parts, self.jobs, self.env = parts, jobs, env
        self.lock = threading.Condition()
        self.t0 = time.monotonic()

    def _ready(self) -> Part | None:
        running = [p for p in self.parts if p.result == "running"]
        if any(p.alone is True for p in running):
            return None
        done = {p.name: p.result for p in self.parts}
        for part in sorted(self.parts, key=lambda p: -self._rank(p)):
            if part.result != "waiting":
                continue
            states = [done.get(need, "passed") for need in part.needs]
            if any(state in ("failed", "not run") for state in states):
                part.result = "not run"
                continue
            if any(done.get(name) in ("waiting", "running") for name in part.after):
                continue
            if all(state == "passed" for state in states) and self._fits(part, running):
                return part
        return None

    def _fits(self, part: Part, running: list[Part]) -> bool:
        """Whether ``part`` may start beside the ``running`` ones (:attr:`Part.alone`, :attr:`Part.offline`)."""
        if part.alone is True:
            return not running
        if part.alone == "offline":
            return all(p.offline for p in running)
        if any(p.alone == "offline" for p in running):
            return part.offline
        # An offline part keeps for an offline-alone part that has still to run, to run beside it;
        # but not while the slot would stay empty: when only alone and offline parts are left to start.
        if part.offline and any(p.alone == "offline" and p.result == "waiting" for p in self.parts):
            return not any(p.result == "waiting" and not (p.offline or p.alone) for p in self.parts)
        return True

    def _rank(self, part: Part) -> float:
        """The part's estimate plus the longest chain of parts waiting for it (needs and after): a part
        others wait for goes before a longer part that nobody waits for."""
        waiting = [self._rank(p) for p in self.parts if part.name in p.needs or part.name in p.after]
        return part.estimate + max(waiting, default=0.0)

    def run(self) -> bool:
        LOGS.mkdir(parents=True, exist_ok=True)
        with self.lock:
            while any(p.result in ("waiting", "running") for p in self.parts):
                running = sum(p.result == "running" for p in self.parts)
                part = self._ready() if running < self.jobs else None
                if part is None:
                    if not running:  # nothing runs and nothing can start: needs that never pass
                        for p in self.parts:
                            p.result = "not run" if p.result == "waiting" else p.result
                        break
                    self.lock.wait()
                    continue
                part.result, part.started = "running", time.monotonic()
                print(f"[{self._clock()}] start  {part.name}", flush=True)
                threading.Thread(target=self._one, args=(part,), daemon=True).start()
        return all(p.result == "passed" for p in self.parts)

    def _clock(self) -> str:
        elapsed = int(time.monotonic() - self.t0)
        return f"{elapsed // 60:3d}:{elapsed % 60:02d}"

    def _one(self, part: Part) -> None:
        log = log_path(part)
        returncode = -1
        try:
            with open(log, "w") as out:
                returncode = subprocess.run(
                    part.command, shell=True, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
                ).returncode
        finally:
            with self.lock:
                part.seconds = time.monotonic() - part.started
                part.result = "passed" if returncode == 0 else "failed"
                print(f"[{self._clock()}] {part.result:6} {part.name} ({part.seconds:.0f} s)", flush=True)
                if returncode != 0:
                    lines = log.read_text(errors="replace").splitlines()[-TAIL:] if log.exists() else []
                    print(f"--- last {len(lines)} lines of {log}\n" + "\n".join(lines) + "\n---", flush=True)
                self.lock.notify_all()


def log_path(part: Part) -> Path:
    return LOGS / f"{part.name.replace(':', '-')}.log"


def causes(part: Part) -> list[str]:
    """The last lines of the part's log that say why it failed (the error lines of its tools)."""
    log = log_path(part)
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    kept: list[str] = []
    for number, line in enumerate(lines):
        if not CAUSE.search(line):
            continue
        if YAMLLINT_ERROR.match(line):
            path = next((text for text in reversed(lines[:number]) if text and not text[0].isspace()), None)
            if path and path not in kept[-CAUSES:]:
                kept.append(path[:300])
        kept.append(line[:300])
    return kept[-CAUSES:]


def table(parts: list[Part], wall: float) -> str:
    rows = ["| part | result | wall s | started at s |", "|---|---|---|---|"]
    t0 = min((p.started for p in parts if p.started), default=0.0)
    for part in sorted(parts, key=lambda p: (p.started or float("inf"), p.name)):
        start = f"{part.started - t0:.0f}" if part.started else ""
        rows.append(f"| {part.name} | {part.result} | {part.seconds:.0f} | {start} |")
    busy = sum(p.seconds for p in parts)
    rows.append(f"| **all ({len(parts)} parts)** | | {wall:.0f} wall, {busy:.0f} summed | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", choices=("check", "test"), default="test")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", "2")))
    parser.add_argument(
        "--only", nargs="*", default=[], help="these parts (shell patterns: 'molecule:*') and what they need"
    )
    args = parser.parse_args(argv)
    parts = load(args.tier, args.only)
    if not parts:
        parser.error(f"no such part: {' '.join(args.only)}")
    runner = Runner(parts, max(1, args.jobs), dict(os.environ))
    started = time.monotonic()
    ok = runner.run()
    wall = time.monotonic() - started
    measured = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    measured.update({p.name: round(p.seconds) for p in parts if p.result == "passed"})
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    print(f"\nTest parts ({args.tier}, {args.jobs} at a time; logs in {LOGS}/):\n")
    print(table(parts, wall))
    failed = [p.name for p in parts if p.result != "passed"]
    for part in parts:
        if part.result == "failed":
            print(f"\n{part.name} failed; from {log_path(part)}:\n" + "\n".join(causes(part) or ["(no error line)"]))
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all parts passed'} in {wall:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
