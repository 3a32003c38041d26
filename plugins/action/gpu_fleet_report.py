# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Action plugin gpu_fleet_report: the fleet report of a run, written, shown and published in one task.

It runs gpu_verify's report writer (``roles/gpu_verify/files/fleet_report.py``) on the controller, with this
Python, the results on its stdin and the options given; then it prints the report's table and publishes its
summary as the job's artifacts (``gpu_verify_report_summary``, as ``ansible.builtin.set_stats`` with
``aggregate`` and without ``per_host`` would: AWX and Automation Platform show a job's stats as its artifacts).
The table is printed for people: on stdout under a stdout callback that prints for them, on stderr under a
machine-readable one (``ansible.posix.json``, AWX's events), whose stdout is that callback's alone; the task's
result carries it as ``table`` (its lines), which every stdout callback shows or serializes its own way.
Documentation: plugins/modules/gpu_fleet_report.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import collection_file
from ansible_collections.gpu_fleet.tf_hosts.plugins.plugin_utils.human_output import to_stderr

WRITER = "roles/gpu_verify/files/fleet_report.py"
ARGS = ArgumentSpecValidator(
    {
        "options": {"type": "list", "elements": "str", "required": True},
        "results": {"type": "dict", "required": True},
    }
)
STAT = "gpu_verify_report_summary"
TAIL = 2000  # characters of the writer's stderr a failure shows


def shown(done: dict[str, Any]) -> list[str]:
    """The report's table, line by line, and where it was written."""
    lines = str(done.get("table") or "").splitlines()
    if done.get("written"):
        lines.append(f"Written to {done['run_dir']} (JSON, Markdown, HTML, JUnit); {done['latest']} points at it.")
    return lines


def summary(done: dict[str, Any]) -> dict[str, Any]:
    """The job's artifact: the report's summary, where it was written and for which inventory."""
    keys = ("inventory", "run_dir", "latest", "written")
    return dict(done.get("summary") or {}, **{key: done.get(key) for key in keys})


class ActionModule(ActionBase):
    """Writes the fleet report on the controller, shows it and publishes its summary."""

    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        args = ARGS.validate(self._task.args)
        if args.error_messages:
            return dict(result, failed=True, msg="gpu_fleet_report: " + " ".join(args.error_messages))
        options = args.validated_parameters
        # The options say --dry-run under --check: the writer itself then writes nothing.
        argv = [sys.executable, collection_file(WRITER), *options["options"]]
        done = subprocess.run(
            argv,
            input=json.dumps(options["results"]),
            capture_output=True,
            text=True,
            check=False,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-TAIL:]
            return dict(result, failed=True, rc=done.returncode, msg=f"The fleet report could not be written: {said}")
        report = json.loads(done.stdout)
        # Ansible gives stdout to the stdout callback alone ("You can only have one plugin be the main manager of
        # your console output", Ansible documentation "Callback plugins",
        # https://docs.ansible.com/ansible/latest/plugins/callback.html): the table goes there only when that
        # callback prints for people, else to stderr; scripts read it from this task's result (``table``).
        lines = shown(report)
        self._display.display("\n".join(lines), stderr=to_stderr())
        return dict(
            result,
            changed=False,
            table=lines,
            msg=f"The fleet report of {report.get('inventory')}: "
            + ("written" if report.get("written") else "not written"),
            summary=summary(report),
            ansible_stats={"data": {STAT: summary(report)}, "per_host": False, "aggregate": True},
        )
