"""Filters of the rolling reprovisioning (playbooks/reprovision.yml, role gpu_rollout).

``gpu_rollout_serial`` / ``gpu_rollout_max_fail_percentage``: check the two play keywords' values
and return them as Ansible takes them, or stop the play before any host with the cause and the fix
(Ansible's own error for a bad ``serial`` is "Unexpected Exception, this is probably a bug").

``gpu_rollout_batches``: the batches Ansible forms from ``serial``, as its playbook executor does
(ansible-core ``lib/ansible/executor/playbook_executor.py``, ``_get_serialized_batches``, and
``lib/ansible/utils/helpers.py``, ``pct_to_int``; Ansible documentation "Controlling playbook
execution: strategies and more", section "Setting the batch size with serial",
https://docs.ansible.com/ansible/latest/playbook_guide/playbooks_strategies.html).

``gpu_rollout_processes``: the compute processes of a busy host in one line.

``gpu_rollout_not_verified``: the hosts a rollout did not verify (skipped as busy, or not reached),
each with its status and reason: gpu_verify's input ``gpu_verify_not_verified``, so the fleet
report written by any batch names every host of the run.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

# Published by gpu_rollout's guard on each host it reached.
SKIPPED_FACT = "gpu_rollout_skipped"
PROCESSES_FACT = "gpu_rollout_busy_processes"
# Published by gpu_rollout's drain on a host whose GPUs still computed when the wait after the drain ran out.
GIVEN_BACK_FACT = "gpu_rollout_given_back"
# Published by gpu_verify on each host it verified.
RESULTS_FACT = "gpu_verify_results"

SERIAL_FIX = (
    "Give a number of hosts (5), a percentage of the play's hosts ('25%') or a list of them "
    "([1, '10%', '100%']), on the command line (-e gpu_rollout_serial=10%) or in the vars of a playbook "
    "that imports playbooks/reprovision.yml: play keywords do not see inventory variables."
)
PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")


def _serial_item(value: Any) -> int | str:
    """One batch size: a whole number of hosts >= 1, or ``'N%'`` with 1 <= N <= 100."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        if value < 1:
            raise ValueError(value)
        return value
    text = str(value).strip()
    match = PERCENT.match(text)
    if match:
        if not 1 <= int(match.group(1)) <= 100:
            raise ValueError(value)
        return f"{int(match.group(1))}%"
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(value)


def gpu_rollout_serial(value: Any) -> list[int | str]:
    """``gpu_rollout_serial`` as the play's ``serial`` keyword: a list of batch sizes (numbers of
    hosts, or ``'N%'`` of the play's hosts; the last one repeats).

    Raises:
        AnsibleFilterError: empty, not a number or percentage, 0 or below, above 100 %.
    """
    items = value if isinstance(value, (list, tuple)) else [value]
    try:
        if not items:
            raise ValueError(value)
        return [_serial_item(item) for item in items]
    except ValueError:
        raise AnsibleFilterError(
            f"gpu_rollout_serial is {value!r}; it must be 1 or more hosts per batch. {SERIAL_FIX}"
        ) from None


def gpu_rollout_max_fail_percentage(value: Any) -> float:
    """``gpu_rollout_max_fail_percentage`` as the play's ``max_fail_percentage``: 0 to 100 (``'N%'``
    accepted).  More failed hosts than this share of a batch stops the rollout; the share must be
    exceeded, not equalled (Ansible documentation "Error handling in playbooks", section "Setting a
    maximum failure percentage",
    https://docs.ansible.com/ansible/latest/playbook_guide/playbooks_error_handling.html).

    Raises:
        AnsibleFilterError: not a number from 0 to 100.
    """
    text = str(value).strip().removesuffix("%").strip()
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number = float(text)
        if not 0 <= number <= 100:
            raise ValueError(value)
    except ValueError:
        raise AnsibleFilterError(
            f"gpu_rollout_max_fail_percentage is {value!r}; it must be a number from 0 to 100 (0: the first failed "
            "host stops the rollout). Set it on the command line (-e gpu_rollout_max_fail_percentage=10) or in the "
            "vars of a playbook that imports playbooks/reprovision.yml: play keywords do not see inventory variables."
        ) from None
    return int(number) if number.is_integer() else number


def _batch_size(item: int | str, total: int) -> int:
    """Hosts in one batch, as Ansible's ``pct_to_int``: a percentage of all the play's hosts, rounded
    down, at least 1."""
    if isinstance(item, str) and item.endswith("%"):
        return int(int(item[:-1]) / 100.0 * total) or 1
    return int(item)


def gpu_rollout_batches(hosts: list[str], serial: Any) -> list[list[str]]:
    """The play's hosts (``ansible_play_hosts_all``, in play order) cut into Ansible's batches for
    ``serial``: each list item is the size of one batch, the last one repeats."""
    sizes = gpu_rollout_serial(serial)
    left, batches, index = list(hosts), [], 0
    while left:
        size = _batch_size(sizes[index], len(hosts))
        batches.append(left[:size])
        left = left[size:]
        index = min(index + 1, len(sizes) - 1)
    return batches


def gpu_rollout_processes(processes: Any) -> str:
    """``python3 pid 4242 (1024 MiB on GPU-5c1e...), ...`` from the ``gpu_compute_apps`` filter's
    items; ``none`` for an empty list."""
    parts = []
    for proc in processes or []:
        if not isinstance(proc, dict):
            continue
        memory = proc.get("used_memory_mib")
        where = f"{memory} MiB on {proc.get('gpu_uuid')}" if memory is not None else f"on {proc.get('gpu_uuid')}"
        parts.append(f"{proc.get('process_name')} pid {proc.get('pid')} ({where})")
    return ", ".join(parts) or "none"


def stops_after(failed: int, batch_size: int, max_fail_percentage: Any) -> bool:
    """Whether Ansible starts no further batch: more than ``max_fail_percentage`` of the batch failed
    (ansible-core ``lib/ansible/plugins/strategy/linear.py``: ``failed / batch_size > percentage``),
    or every host of the batch failed (``playbook_executor.py``: the play ends when a whole batch
    failed)."""
    if failed <= 0 or batch_size <= 0:
        return False
    return failed / batch_size > gpu_rollout_max_fail_percentage(max_fail_percentage) / 100.0 or failed >= batch_size


def _facts(hostvars: Any, host: str) -> Any:
    try:
        return hostvars[host]
    except KeyError:
        return {}


def skipped_reason(processes: Any, given_back: bool = False) -> str:
    """Why gpu_rollout skipped a host, for the report: its guard (busy before the drain) or its drain
    (still busy when the wait after the drain ran out: given back unchanged)."""
    if given_back:
        return (
            f"its GPUs still ran compute processes when the wait after the drain ran out: "
            f"{gpu_rollout_processes(processes)}; it was given back to the scheduler unchanged (rerun when those "
            "jobs end, raise gpu_rollout_drain_timeout, or set gpu_rollout_force_busy: true)"
        )
    return (
        f"its GPUs run compute processes: {gpu_rollout_processes(processes)}; it was not drained or changed "
        "(rerun when those jobs end, or set gpu_rollout_force_busy: true)"
    )


def gpu_rollout_not_verified(
    all_hosts: list[str],
    hostvars: Any,
    alive_hosts: list[str],
    current_host: str,
    serial: Any,
    max_fail_percentage: Any,
) -> dict[str, dict[str, str]]:
    """The hosts of the rollout that this report cannot show verified, ``{host: {"status", "reason"}}``.

    Args:
        all_hosts: every host of the play (``ansible_play_hosts_all``), in play order.
        hostvars: Ansible's ``hostvars``; per host the facts ``gpu_rollout_skipped`` and
            ``gpu_rollout_busy_processes`` (gpu_rollout's guard) and ``gpu_verify_results``.
        alive_hosts: hosts that have not failed (``ansible_play_hosts``).
        current_host: a host of the batch that writes the report (``inventory_hostname``).
        serial, max_fail_percentage: the play's ``serial`` and ``max_fail_percentage``.

    Returns:
        A host the guard skipped (busy GPUs): ``{"status": "skipped", "reason": <its processes>}``.
        A host of a later batch: ``not reached`` with ``the rollout stopped after <hosts> failed``
        when this batch's failures stop the rollout (:func:`stops_after`), else ``not reached yet``
        (``in batch N of M``).  Hosts with results, failed hosts and the current batch's hosts are
        left to the report (their results, or why they have none).
    """
    batches = gpu_rollout_batches(all_hosts, serial)
    number = next((n for n, batch in enumerate(batches) if current_host in batch), None)
    if number is None:
        raise AnsibleFilterError(f"{current_host} is not a host of this play ({', '.join(all_hosts)}).")
    alive = set(alive_hosts)
    failed = [h for h in batches[number] if h not in alive]
    stopped = stops_after(len(failed), len(batches[number]), max_fail_percentage)
    found: dict[str, dict[str, str]] = {}
    for later, batch in enumerate(batches):
        for host in batch:
            facts = _facts(hostvars, host)
            if facts.get(RESULTS_FACT) or host not in alive:
                continue
            if facts.get(SKIPPED_FACT):
                reason = skipped_reason(facts.get(PROCESSES_FACT), bool(facts.get(GIVEN_BACK_FACT)))
                found[host] = {"status": "skipped", "reason": reason}
            elif later > number and stopped:
                found[host] = {
                    "status": "not reached",
                    "reason": f"the rollout stopped after {', '.join(failed)} failed",
                }
            elif later > number:
                found[host] = {"status": "not reached yet", "reason": f"in batch {later + 1} of {len(batches)}"}
    return found


class FilterModule:
    """gpu_rollout filters."""

    def filters(self) -> dict:
        return {
            "gpu_rollout_serial": gpu_rollout_serial,
            "gpu_rollout_max_fail_percentage": gpu_rollout_max_fail_percentage,
            "gpu_rollout_batches": gpu_rollout_batches,
            "gpu_rollout_processes": gpu_rollout_processes,
            "gpu_rollout_not_verified": gpu_rollout_not_verified,
        }
