#!/usr/bin/python
# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""Ansible module gpu_mig: check, apply or verify a MIG layout with nvidia-smi."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_mig
short_description: Check, apply or verify a MIG layout of the host's NVIDIA GPUs
description:
  - Reads the GPUs and their MIG devices with C(nvidia-smi -L) and their MIG mode with
    C(nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader).
  - O(state=checked) checks the layout against the GPUs' models (O(models)) and changes nothing; with O(gpus)
    given (the C(gpu_facts.gpus) of M(gpu_fleet.tf_hosts.nvidia_gpu_facts)) it runs no command at all.
  - O(state=applied) changes only the GPUs whose MIG mode or MIG devices differ from the layout, and only when
    none of them runs a compute application (C(nvidia-smi --query-compute-apps), matched by the GPU's UUID or one
    of its MIG devices'); else it fails with the processes and the fix. For each such GPU it destroys the compute
    and GPU instances (C(nvidia-smi mig -i N -dci), C(-dgi)) and fails, naming the usual holders (DCGM,
    dcgm-exporter, nvsm) and the fix, when C(nvidia-smi mig -i N -lgi) still lists some; it sets the MIG mode
    (C(nvidia-smi -i N -mig 1|0)) and creates the layout's GPU instances, each with its default compute instance
    (C(nvidia-smi mig -i N -cgi P,P -C)). When nvidia-smi refuses them (a placement the slices allow but the GPU
    does not), it creates the GPU's previous instances again and fails saying so.
  - Placements are not checked before a change, only the instances and slices of each profile.
    A mode change that stays pending (the GPU needs a reset or the host a reboot) is returned in
    RV(pending), and no instance is created on that GPU.
  - O(state=verified) only reads, and returns in RV(differences) each GPU whose MIG devices differ.
  - "Source: NVIDIA Multi-Instance GPU User Guide (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/),
    sections Getting Started with MIG and Supported MIG Profiles."
version_added: "0.19.0"
author:
  - gpu-fleet maintainers (!UNKNOWN)
options:
  layout:
    description:
      - List of C({gpus, profiles}); C(gpus) is C(all) or a list of GPU indices, C(profiles) the GPU instance
        profiles of each of those GPUs (an empty list turns MIG mode off). GPUs not named are left alone.
    type: list
    elements: dict
    required: true
  models:
    description:
      - List of C({match, profiles}); C(match) is a regular expression searched in the GPU's name, C(profiles)
        maps each profile name to C({instances, memory_slices}). Needed by O(state=checked) and O(state=applied).
    type: list
    elements: dict
    default: []
  gpus:
    description:
      - The GPUs to check against instead of asking nvidia-smi (O(state=checked) only), each C({index, name}) (the
        C(gpu_facts.gpus) of M(gpu_fleet.tf_hosts.nvidia_gpu_facts)), or C({device_id}) in the GPUs' order (its
        C(gpu_facts.pci_gpus), sorted by bus ID, before a driver answers).
    type: list
    elements: dict
  state:
    description: What to do with the layout.
    type: str
    choices: [checked, applied, verified]
    default: applied
  nvidia_smi:
    description: Name or path of nvidia-smi.
    type: str
    default: nvidia-smi
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Two 3g.40gb instances on each GPU
  gpu_fleet.tf_hosts.gpu_mig:
    layout: [{gpus: all, profiles: [3g.40gb, 3g.40gb]}]
    models: "{{ my_models }}"
"""

RETURN = r"""
differences:
  description: "C({index: what differs}) before any change, for each GPU the layout names whose state differs."
  returned: always
  type: dict
devices:
  description: The number of MIG devices the layout asks for on this host.
  returned: always
  type: int
changed_gpus:
  description: The indices of the GPUs this run changed (or would change, in check mode).
  returned: always
  type: list
  elements: int
problems:
  description: With O(state=verified), what is wrong with the layout on this host (a GPU it names is missing).
  returned: when O(state=verified)
  type: list
  elements: str
pending:
  description: The indices of the GPUs whose MIG mode change waits for a GPU reset or a reboot.
  returned: always
  type: list
  elements: int
"""

import re  # noqa: E402  (after the documentation blocks, as ansible-test validate-modules requires)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402  (imports follow the documentation blocks, as ansible-test validate-modules requires)
from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils import gpu_mig  # noqa: E402

ARGUMENT_SPEC = {
    "layout": {"type": "list", "elements": "dict", "required": True},
    "models": {"type": "list", "elements": "dict", "default": []},
    "gpus": {"type": "list", "elements": "dict"},
    "state": {"type": "str", "choices": ["checked", "applied", "verified"], "default": "applied"},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
}
APPS = "--query-compute-apps=pid,process_name,gpu_uuid"
MODES = "--query-gpu=index,mig.mode.current,mig.mode.pending"


def smi(module: AnsibleModule, *args: str) -> str:
    """nvidia-smi's stdout; a failure fails the module with its output."""
    argv = [module.params["nvidia_smi"], *args]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"{' '.join(argv)} failed (exit {rc}): {(out + err).strip()}", rc=rc)
    return out


def read_state(module: AnsibleModule) -> tuple[dict, dict]:
    """(``nvidia-smi -L`` parsed, the MIG modes)."""
    return gpu_mig.parse_list(smi(module, "-L")), gpu_mig.parse_modes(smi(module, MODES, "--format=csv,noheader"))


HOLDERS = (
    "A process that is no compute application holds the GPU's MIG instances: typically NVIDIA DCGM (nv-hostengine, "
    'service nvidia-dcgm), dcgm-exporter or nvsm (the MIG User Guide, "Getting Started with MIG"). Stop them for '
    "the change (systemctl stop nvidia-dcgm dcgm-exporter nvsm, or their containers), run again, and start them after."
)
GI_PROFILE = re.compile(r"^\d+g\.\d+gb(\+me)?$")  # a GPU instance profile; -L names other compute instances 1c.3g...
GI_ROW = re.compile(r"^\|\s+\d+\s+MIG\s", re.MULTILINE)  # a row of nvidia-smi mig -lgi


class MigStop(Exception):
    """A GPU could not be brought to its layout; the message says what is left and the fix."""


def busy_problem(module: AnsibleModule, listed: dict, indices: list[int]) -> str | None:
    """The compute applications on the GPUs to change (found by the GPU's UUID or one of its MIG devices'), with
    the fix; None when there are none."""
    uuids = {listed[i]["uuid"]: i for i in indices}
    uuids.update({device["uuid"]: i for i in indices for device in listed[i]["mig"]})
    apps = [line.split(",") for line in smi(module, APPS, "--format=csv,noheader").splitlines() if line.strip()]
    busy = [
        f"pid {a[0].strip()} ({a[1].strip()}) on GPU {uuids[a[2].strip()]}"
        for a in apps
        if len(a) == 3 and a[2].strip() in uuids
    ]
    if not busy:
        return None
    return (f"The MIG layout of GPUs {indices} differs, but compute applications run on them: {'; '.join(busy)}. "
            "A MIG change needs idle GPUs. Drain the host (stop those processes, or drain it in the scheduler) "
            "and run again; nothing was changed.")  # fmt: skip


def gpu_instances(module: AnsibleModule, gpu: str) -> int:
    """The number of GPU instances on the GPU (``nvidia-smi mig -i N -lgi``; Not Found: none)."""
    rc, out, err = module.run_command([module.params["nvidia_smi"], "mig", "-i", gpu, "-lgi"])
    if rc != 0 and "Not Found" in out + err:
        return 0
    if rc != 0:
        module.fail_json(msg=f"nvidia-smi mig -i {gpu} -lgi failed (exit {rc}): {(out + err).strip()}", rc=rc)
    return len(GI_ROW.findall(out))


def clear_gpu(module: AnsibleModule, gpu: str) -> None:
    """Destroy the GPU's compute and GPU instances; MigStop when some are left (a holder such as DCGM)."""
    said = []
    for clear in ("-dci", "-dgi"):
        rc, out, err = module.run_command([module.params["nvidia_smi"], "mig", "-i", gpu, clear])
        if rc != 0 and "Not Found" not in out + err:  # nothing to destroy: Not Found, read as done
            said.append(f"nvidia-smi mig -i {gpu} {clear}: {(out + err).strip()}")
    left = gpu_instances(module, gpu)
    if left:
        errors = "; ".join(said) or "no error said"
        raise MigStop(f"GPU {gpu} still has {left} GPU instances after destroying them ({errors}). {HOLDERS}")


def create(module: AnsibleModule, gpu: str, profiles: list[str], previous: list[str]) -> None:
    """Create the layout's GPU instances, each with its default compute instance. When nvidia-smi refuses (most
    often a placement the slices allow but the GPU does not), create the GPU's previous instances again and
    MigStop saying so."""
    argv = [module.params["nvidia_smi"], "mig", "-i", gpu, "-cgi", ",".join(gpu_mig.creation_order(profiles)), "-C"]
    rc, out, err = module.run_command(argv)
    if rc == 0:
        return
    failed = f"{' '.join(argv[1:])} failed (exit {rc}): {(out + err).strip()}"
    restore = [p for p in previous if GI_PROFILE.match(p)]
    if not restore:
        back = f"GPU {gpu} had no MIG devices before; it is left in MIG mode without any."
    else:
        for clear in ("-dci", "-dgi"):  # what the failed -cgi created before it stopped
            module.run_command([module.params["nvidia_smi"], "mig", "-i", gpu, clear])
        again = [*argv[:5], ",".join(gpu_mig.creation_order(restore)), "-C"]
        rc_back, out_back, err_back = module.run_command(again)
        back = (f"Its previous MIG devices ({', '.join(restore)}) were created again." if rc_back == 0 else
                f"Creating its previous MIG devices ({', '.join(restore)}) failed too "
                f"({(out_back + err_back).strip()}): GPU {gpu} has no MIG devices now.")  # fmt: skip
    raise MigStop(f"{failed}. {back} The profiles fit the GPU's slices but not its placements (the MIG User Guide, "
                  f"\"Supported MIG Profiles\"; nvidia-smi mig -i {gpu} -lgipp lists them), or a process holds the GPU. "
                  "Change gpu_mig_layout (other profiles or their order) and run again.")  # fmt: skip


def apply_gpu(module: AnsibleModule, index: int, profiles: list[str], mode: str, previous: list[str]) -> bool:
    """Bring one GPU to its layout; False when its MIG mode change is pending (a reset or reboot first); MigStop
    when its instances cannot be destroyed or created."""
    gpu = str(index)
    if mode == "Enabled":
        clear_gpu(module, gpu)
    wanted = "Enabled" if profiles else "Disabled"
    if mode != wanted:
        smi(module, "-i", gpu, "-mig", "1" if profiles else "0")
        if (
            gpu_mig.parse_modes(smi(module, MODES, "--format=csv,noheader", "-i", gpu)).get(index, {}).get("current")
            != wanted
        ):
            return False
    if profiles:
        create(module, gpu, profiles, previous if mode == "Enabled" else [])
    return True


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    if params["state"] == "checked" and params["gpus"] is not None:
        listed, modes = {g.get("index", n): dict(g, mig=[]) for n, g in enumerate(params["gpus"])}, {}
    else:
        listed, modes = read_state(module)
    gpus = [{"index": i, "name": g.get("name"), "device_id": g.get("device_id")} for i, g in sorted(listed.items())]
    wanted, problems = gpu_mig.desired_layout(params["layout"], sorted(listed))
    result = {"changed": False, "devices": sum(len(p) for p in wanted.values()), "changed_gpus": [], "pending": []}
    if params["state"] == "verified":  # only reads: what differs, the layout's own problems included
        found = gpu_mig.differences(wanted, listed, modes)
        module.exit_json(differences=found, problems=problems, **result)
    problems = gpu_mig.layout_problems(params["layout"], gpus, params["models"])
    if problems:
        module.fail_json(msg=" ".join(problems), problems=problems, **result)
    result["differences"] = {} if params["state"] == "checked" else gpu_mig.differences(wanted, listed, modes)
    if params["state"] != "applied" or not result["differences"]:
        module.exit_json(**result)
    to_change = sorted(result["differences"])
    busy = busy_problem(module, listed, to_change)
    if busy:
        module.fail_json(msg=busy, **result)
    result.update(changed=True, changed_gpus=to_change)
    for index in [] if module.check_mode else to_change:
        try:
            done = apply_gpu(module, index, wanted[index], modes[index]["current"], mig_profiles(listed, index))
        except MigStop as stop:
            module.fail_json(msg=str(stop), **result)
        result["pending"] += [] if done else [index]
    module.exit_json(**result)


def mig_profiles(listed: dict, index: int) -> list[str]:
    """The profiles of the GPU's MIG devices as nvidia-smi -L listed them before the change."""
    return [device["profile"] for device in listed[index]["mig"]]


if __name__ == "__main__":
    main()
