"""The health check as it runs on a host: the role puts files/health/gpu_health.py and the shared
plugins/module_utils/gpu_parsers.py in one folder, where the script imports the parsers by name.
Here both folders go on sys.path, and on PYTHONPATH for the runs of the script as a command
(the way tests/unit/verify/conftest.py does it for files/verify)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPT = ROOT / "files" / "health" / "gpu_health.py"
SCRIPT_PATH = [str(ROOT / "files" / "health"), str(ROOT / "plugins" / "module_utils")]

for folder in reversed(SCRIPT_PATH):
    if folder not in sys.path:
        sys.path.insert(0, folder)
os.environ["PYTHONPATH"] = os.pathsep.join([*SCRIPT_PATH, *filter(None, [os.environ.get("PYTHONPATH")])])


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


@pytest.fixture
def read_fixture() -> Callable[[str], str]:
    return fixture_text


# The text exposition format (https://prometheus.io/docs/instrumenting/exposition_formats/): names
# [a-zA-Z_:][a-zA-Z0-9_:]*, label names without a colon, label values in double quotes with \\, \"
# and \n escaped, one HELP and one TYPE line per family before its samples, samples of a family
# together, no series twice.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"^(?P<name>{_NAME})(?P<labels>\{{(?:{_LABEL}(?:,{_LABEL})*)?\}})? (?P<value>\S+)$")
_COMMENT = re.compile(rf"^# (?P<kind>HELP|TYPE) (?P<name>{_NAME}) (?P<rest>.*)$")


def exposition_problems(text: str) -> list[str]:
    """What is wrong with ``text`` as a textfile-collector file of this project; [] when nothing."""
    problems, helped, typed, done, series, current = [], set(), {}, set(), set(), None
    if not text.endswith("\n"):
        problems.append("the text does not end with a newline")
    for number, line in enumerate(text.splitlines(), start=1):
        comment, sample = _COMMENT.match(line), _SAMPLE.match(line)
        if comment:
            name, kind, rest = comment.group("name"), comment.group("kind"), comment.group("rest")
            if name in done or (kind == "HELP" and name in helped) or (kind == "TYPE" and name in typed):
                problems.append(f"line {number}: a second {kind} for {name}")
            if kind == "TYPE" and rest not in ("counter", "gauge", "histogram", "summary", "untyped"):
                problems.append(f"line {number}: unknown type {rest!r}")
            if kind == "HELP":
                helped.add(name)
            else:
                typed[name] = rest
            if current and current != name:
                done.add(current)
            current = name
        elif sample:
            name = sample.group("name")
            if name != current or name not in helped or name not in typed:
                problems.append(f"line {number}: sample of {name} outside its family's HELP/TYPE block")
            try:
                float(sample.group("value"))
            except ValueError:
                problems.append(f"line {number}: value {sample.group('value')!r} is not a number")
            key = (name, sample.group("labels") or "")
            problems += [f"line {number}: series {key} twice"] if key in series else []
            series.add(key)
        else:
            problems.append(f"line {number}: neither a HELP/TYPE comment nor a sample: {line!r}")
    for name, kind in typed.items():
        if not name.startswith("gpu_fleet_health_"):
            problems.append(f"{name}: not named gpu_fleet_health_*")
        if (kind == "counter") != name.endswith("_total"):
            problems.append(f"{name}: a {kind}; only counters end in _total")
    return problems


def promtool_problems(text: str, tmp_path: Path) -> list[str]:
    """``promtool check metrics`` when promtool is installed, else :func:`exposition_problems`."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return exposition_problems(text)
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    return [] if done.returncode == 0 else [done.stdout + done.stderr]


@pytest.fixture
def metrics_problems(tmp_path: Path) -> Callable[[str], list[str]]:
    """promtool's verdict on a metrics text, or the validator's when promtool is not installed."""
    return lambda text: promtool_problems(text, tmp_path)


@pytest.fixture
def validator() -> Callable[[str], list[str]]:
    """The validator itself, for the tests that check it catches broken text."""
    return exposition_problems
