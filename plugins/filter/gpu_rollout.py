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

``gpu_rollout_problems``: what is wrong with the rollout's settings in this batch (hooks, hook host,
a ``gpu_rollout_serial`` the play's ``serial`` cannot see). ``gpu_rollout_plan_note`` and
``gpu_rollout_busy_note``: the lines the rollout shows for its plan and for a busy host. All three
word their texts from the catalog ``MESSAGES``.

``gpu_rollout_not_verified``: the hosts a rollout did not verify (skipped as busy, or not reached),
each with its status and reason: gpu_verify's input ``gpu_verify_not_verified``, so the fleet
report written by any batch names every host of the run.

``gpu_rollout_run_id``: the rollout's one label, made by its first batch and found by each later one
on the hosts before it.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

# Published by gpu_rollout's guard on each host it reached.
SKIPPED_FACT = "gpu_rollout_skipped"
PROCESSES_FACT = "gpu_rollout_busy_processes"
# Published by gpu_rollout's drain on a host whose GPUs still computed when the wait after the drain ran out.
GIVEN_BACK_FACT = "gpu_rollout_given_back"
# Published by gpu_rollout's status on each host of a batch, the same for the whole rollout.
RUN_ID_FACT = "gpu_rollout_run_id"
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


def gpu_rollout_run_id(all_hosts: list[str], hostvars: Any, fresh: str) -> str:
    """The rollout's label: the ``gpu_rollout_run_id`` an earlier batch gave its hosts (the first host
    of the play, ``all_hosts``, that has one), else ``rollout-<fresh>`` for the first batch (``fresh``:
    the time and a random number, ``20261129T120000Z-4242``)."""
    for host in all_hosts:
        found = _facts(hostvars, host).get(RUN_ID_FACT)
        if found:
            return str(found)
    return f"rollout-{fresh}"


# What the rollout says, by id: str.format templates, cause then fix in one text.
MESSAGES = {
    "hooks_one_sided": (
        "Only one of the drain and undrain hooks is set (gpu_rollout_drain_command/_tasks, "
        "gpu_rollout_undrain_command/_tasks): without the other, hosts would stay out of the scheduler after a "
        "verified reprovisioning, or be given back without having been taken out. Set both (Slurm: scontrol update "
        "nodename=<host> state=DRAIN reason=..., then state=RESUME; Kubernetes: kubectl drain <node>, then kubectl "
        "uncordon <node>) or neither."
    ),
    "hook_tasks": (
        "{variable} is {path}, which is not an absolute path of a file on the controller. Give the task file's full "
        "path, or leave it empty."
    ),
    "hook_host": (
        "gpu_rollout_hook_host is {host}, which is not a host of the inventory. Add it to the inventory (with how to "
        "reach it), use localhost for a command the controller runs, or leave it empty to run the hooks on each GPU "
        "host."
    ),
    "serial_unseen": (
        "This batch is {batch}, but gpu_rollout_serial {serial} makes it {planned}: gpu_rollout_serial is set where "
        "the play's serial cannot see it (play keywords never see inventory variables, "
        "https://github.com/ansible/ansible/issues/18131). Remove it (and gpu_rollout_max_fail_percentage) from the "
        "inventory and give them on the command line (-e gpu_rollout_serial=10%) or in the vars of a playbook that "
        "imports playbooks/reprovision.yml."
    ),
    "plan": (
        "Batch {number} of {batches} ({planned}) of the rolling reprovisioning of {hosts} hosts (gpu_rollout_serial "
        "{serial}). Each batch is verified before the next starts; more than {max_fail} % failed hosts in a batch "
        "(gpu_rollout_max_fail_percentage) stops the rollout."
    ),
    "busy_skipped": (
        "Skipped: {host}'s GPUs run compute processes: {processes}. It is not drained or changed in this run; rerun "
        "playbooks/reprovision.yml when those jobs end, or set gpu_rollout_force_busy: true."
    ),
    "busy_given_back": (
        "Skipped: {host}'s GPUs still run compute processes {waited} s after the drain: {processes}. It is given "
        "back to the scheduler unchanged; rerun playbooks/reprovision.yml when those jobs end, raise "
        "gpu_rollout_drain_timeout, or set gpu_rollout_force_busy: true."
    ),
    "busy_forced": (
        "Going ahead (gpu_rollout_force_busy): {host}'s GPUs run compute processes: {processes}. nvidia_driver still "
        "stops before changing the driver under them unless nvidia_driver_allow_busy_gpus."
    ),
}


def _hook_tasks(variable: str, path: Any, found: Any) -> list[str]:
    """A hook task file must be an absolute path of a file on the controller (``found``), or empty."""
    if not path or (posixpath.isabs(str(path)) and found):
        return []
    return [MESSAGES["hook_tasks"].format(variable=variable, path=path)]


def gpu_rollout_problems(settings: dict[str, Any]) -> list[str]:
    """What stops this batch before any change, each with its fix; ``[]`` when nothing does.

    ``settings``: the hooks (``drain_command``, ``drain_tasks``, ``undrain_command``, ``undrain_tasks``, and
    ``drain_tasks_found``/``undrain_tasks_found``: each task file is a file on the controller),
    ``hook_host`` and ``inventory_hosts``, ``batch`` (the play's batch now), ``play_hosts`` (the hosts of
    the play still in it), ``planned`` (the batch gpu_rollout_serial makes of this host's) and ``serial``.
    """
    drains = bool(settings.get("drain_command") or settings.get("drain_tasks"))
    undrains = bool(settings.get("undrain_command") or settings.get("undrain_tasks"))
    found = [] if drains == undrains else [MESSAGES["hooks_one_sided"]]
    for hook in ("drain", "undrain"):
        found += _hook_tasks(
            f"gpu_rollout_{hook}_tasks", settings.get(f"{hook}_tasks"), settings.get(f"{hook}_tasks_found")
        )
    host = settings.get("hook_host") or ""
    if host and host not in [*(settings.get("inventory_hosts") or []), "localhost"]:
        found.append(MESSAGES["hook_host"].format(host=host))
    # A serial from the inventory reaches the tasks but never the play: its batches differ.
    batch, planned = list(settings.get("batch") or []), list(settings.get("planned") or [])
    if sorted(h for h in planned if h in (settings.get("play_hosts") or [])) != sorted(batch):
        fields = {"batch": ", ".join(batch), "planned": ", ".join(planned), "serial": settings.get("serial")}
        found.append(MESSAGES["serial_unseen"].format(**fields))
    return found


def gpu_rollout_plan_note(batches: list[list[str]], planned: list[str], settings: dict[str, Any]) -> str:
    """The rollout's plan as this batch (``planned``, one of ``batches``) shows it; ``settings``: ``hosts``
    (how many the play has), ``serial`` and ``max_fail_percentage``."""
    fields = {
        "number": batches.index(planned) + 1,
        "batches": len(batches),
        "planned": ", ".join(planned),
        "hosts": settings.get("hosts"),
        "serial": settings.get("serial"),
        "max_fail": settings.get("max_fail_percentage"),
    }
    return MESSAGES["plan"].format(**fields)


def gpu_rollout_busy_note(processes: Any, host: str, skipped: Any, waited: Any = None) -> str:
    """What the rollout does with a host whose GPUs run compute processes: skip it, or go ahead
    (gpu_rollout_force_busy) while nvidia_driver still guards the driver; ``waited`` (the seconds of
    the wait after the drain) for a skipped host still busy after its drain, given back unchanged."""
    note = "busy_forced"
    if boolean(skipped, strict=False):
        note = "busy_skipped" if waited is None else "busy_given_back"
    return MESSAGES[note].format(host=host, processes=gpu_rollout_processes(processes), waited=waited)


class FilterModule:
    """gpu_rollout filters."""

    def filters(self) -> dict:
        return {
            "gpu_rollout_serial": gpu_rollout_serial,
            "gpu_rollout_max_fail_percentage": gpu_rollout_max_fail_percentage,
            "gpu_rollout_batches": gpu_rollout_batches,
            "gpu_rollout_processes": gpu_rollout_processes,
            "gpu_rollout_not_verified": gpu_rollout_not_verified,
            "gpu_rollout_problems": gpu_rollout_problems,
            "gpu_rollout_plan_note": gpu_rollout_plan_note,
            "gpu_rollout_busy_note": gpu_rollout_busy_note,
            "gpu_rollout_run_id": gpu_rollout_run_id,
        }
