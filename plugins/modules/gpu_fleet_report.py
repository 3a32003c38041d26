#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""The documentation of the action plugin plugins/action/gpu_fleet_report.py, which runs on the controller only."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_fleet_report
short_description: Write the fleet report on the controller, print it and publish its summary
description:
  - Runs gpu_verify's report writer (C(roles/gpu_verify/files/fleet_report.py)) with the Python that runs
    ansible-playbook, the results of O(results) on its standard input and the options of O(options). It writes a
    new run folder (JSON, Markdown, HTML, JUnit) and points C(latest) at it, unless the options say C(--dry-run).
  - Prints the report's table and where it was written, and publishes the summary as the custom stat
    C(gpu_verify_report_summary) (aggregated, not per host), which AWX and Automation Platform show as the job's
    artifacts, as M(ansible.builtin.set_stats) would.
  - The table goes to standard output under a stdout callback that prints for people (C(default), C(minimal),
    C(community.general.yaml) and the like) and to standard error under any other (such as C(ansible.posix.json)
    or AWX's event stream), so that a machine-readable standard output holds that callback's output alone. The
    result carries the same lines as RV(table).
  - gpu_verify's entry point C(report) runs it once per play or batch (C(run_once)); the filters
    P(gpu_fleet.tf_hosts.gpu_verify_report_args#filter) and P(gpu_fleet.tf_hosts.gpu_verify_collect#filter) build
    its options. Runs on the controller only; changes nothing on the hosts.
version_added: "0.19.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  options:
    description:
      - The writer's command-line options (after its path), as the filter
        P(gpu_fleet.tf_hosts.gpu_verify_report_args#filter) makes them; they read the input from standard input
        (C(--input -)) and emit JSON (C(--emit json)).
    type: list
    elements: str
    required: true
  results:
    description:
      - Every host's results keyed by inventory hostname, as the filter
        P(gpu_fleet.tf_hosts.gpu_verify_collect#filter) collects them.
    type: dict
    required: true
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: The options decide; under C(--check) gpu_verify passes C(--dry-run), and nothing is written.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Write the fleet report, point latest at it, show it and publish its summary as the job's artifacts
  gpu_fleet.tf_hosts.gpu_fleet_report:
    options: "{{ {'inventory_hosts': groups['all']} | gpu_fleet.tf_hosts.gpu_verify_report_args }}"
    results: "{{ ansible_play_hosts_all | gpu_fleet.tf_hosts.gpu_verify_collect(hostvars, ansible_play_hosts) }}"
  run_once: true
"""

RETURN = r"""
summary:
  description: The report's summary (hosts, passed, failed, ...) with C(inventory), C(run_dir), C(latest) and C(written).
  returned: success
  type: dict
table:
  description: The lines printed, the report's table and where it was written.
  returned: success
  type: list
  elements: str
"""
