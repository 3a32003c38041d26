"""``gpu_tf_config``: the TF_CONFIG of every worker of a MultiWorkerMirroredStrategy check.

TF_CONFIG is the JSON document TensorFlow's ``MultiWorkerMirroredStrategy`` reads from the
environment (TensorFlow guide "Multi-worker training with Keras", section "Cluster setup")::

    {"cluster": {"worker": ["10.0.0.1:12345", "10.0.0.2:12345"]},
     "task": {"type": "worker", "index": 0}}

Every worker gets the same cluster list (in the play's host order) and its own index; worker 0
is the chief.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

# gpu_verify publishes this fact on every host before the cluster is built: {address, port, ready}.
WORKER_FACT = "gpu_verify_multiworker_worker"


def _worker(hostvars: Any, host: str) -> dict:
    return hostvars[host].get(WORKER_FACT) or {}


def worker_endpoint(address: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[fd00::1]:12345``)."""
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"{address}:{port}"


def _port(host: str, value: Any) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 1 <= port <= 65535:
        raise AnsibleFilterError(f"gpu_verify_multiworker_port of {host} must be a TCP port 1-65535, got {value!r}.")
    return port


def gpu_tf_config(hosts: list[str], hostvars: Any, all_hosts: list[str] | None = None) -> dict[str, dict]:
    """TF_CONFIG (as a dict; ``| to_json`` makes the environment value) per host, keyed by
    inventory hostname.

    Args:
        hosts: the workers, in order (``ansible_play_hosts``); the first is the chief.
        hostvars: Ansible's ``hostvars``. Per host, the fact ``gpu_verify_multiworker_worker``
            published by gpu_verify: ``address`` (from ``gpu_verify_multiworker_address``: where
            the other workers reach it), ``port`` (``gpu_verify_multiworker_port``: the TCP port it
            listens on; hosts may differ) and ``ready`` (its venv exists).
        all_hosts: every host the play started with (``ansible_play_hosts_all``), to name the
            ones that dropped out before this point.

    Raises:
        AnsibleFilterError: fewer than 2 hosts, a bad port, a host without an address or without
            the venv, or two workers on the same address and port; the message names the hosts
            and the variable to fix. Raised on every host before any worker starts.
    """
    dropped = [h for h in (all_hosts or []) if h not in hosts]
    if len(hosts) < 2:
        gone = f"; {', '.join(dropped)} failed or were unreachable earlier in this run" if dropped else ""
        raise AnsibleFilterError(
            f"The multi-worker check needs at least 2 hosts in the play, got {len(hosts)} ({', '.join(hosts)}){gone}: "
            "run playbooks/verify.yml -e gpu_verify_multiworker=true against a group of 2 or more reachable hosts."
        )
    not_ready = [h for h in hosts if not _worker(hostvars, h).get("ready", True)]
    if not_ready:
        raise AnsibleFilterError(
            f"The default stack's venv is missing on {', '.join(not_ready)}; every worker needs it, so no worker "
            "was started: run playbooks/tensorflow.yml (or site.yml) for those hosts first."
        )
    endpoints = []
    for host in hosts:
        address = str(_worker(hostvars, host).get("address") or "").strip()
        if not address:
            raise AnsibleFilterError(
                f"{host} has no address for the multi-worker cluster: set gpu_verify_multiworker_address "
                "for it (an address the other workers can reach), or gather facts so its default IPv4 "
                "address is known."
            )
        endpoints.append(worker_endpoint(address, _port(host, _worker(hostvars, host).get("port"))))
    clashes = sorted({e for e in endpoints if endpoints.count(e) > 1})
    if clashes:
        owners = {e: [h for h, x in zip(hosts, endpoints) if x == e] for e in clashes}
        raise AnsibleFilterError(
            "Two workers would listen on the same address and port: "
            + "; ".join(f"{e}: {', '.join(owners[e])}" for e in clashes)
            + ". Give each host its own gpu_verify_multiworker_address (or port)."
        )
    return {
        host: {"cluster": {"worker": list(endpoints)}, "task": {"type": "worker", "index": index}}
        for index, host in enumerate(hosts)
    }


class FilterModule:
    """Multi-worker cluster filters."""

    def filters(self) -> dict:
        return {"gpu_tf_config": gpu_tf_config}
