"""Prometheus text exposition, written by the health check on each host (files/health/gpu_health.py,
which gets this file beside it) and by the controller's filters (the verification's metrics).

Format: "Exposition formats", text format (https://prometheus.io/docs/instrumenting/exposition_formats/):
``# HELP`` and ``# TYPE`` lines, then one sample per line, label values escaped (backslash, double
quote, newline). Standard library only, Python 3.8+ syntax, so that hosts run it as is.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

Sample = Tuple[Dict[str, Any], float]
# (name, type, help, samples)
Family = Tuple[str, str, str, List[Sample]]


def escape(value: str, quote: bool) -> str:
    """A HELP text (``quote`` False) or a label value (True) escaped as the format asks."""
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
    return escaped.replace('"', '\\"') if quote else escaped


def sample_line(name: str, labels: dict[str, Any], value: float) -> str:
    """One sample: integers without a decimal point, other numbers as Python's repr of a float."""
    body = ",".join(f'{key}="{escape(str(text), True)}"' for key, text in labels.items())
    number = str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))
    return f"{name}{{{body}}} {number}" if body else f"{name} {number}"


def render(families: list[Family]) -> str:
    """The families as a textfile; a family without samples is left out."""
    lines: list[str] = []
    for name, kind, help_text, samples in families:
        if not samples:
            continue
        lines += [f"# HELP {name} {escape(help_text, False)}", f"# TYPE {name} {kind}"]
        lines += [sample_line(name, labels, value) for labels, value in samples]
    return "\n".join(lines) + "\n"
