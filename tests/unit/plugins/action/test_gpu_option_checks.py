"""gpu_option_checks: the later phases' options against their roles' argument specifications, and the option rules
of gpu_verify and gpu_health, checked with the values a role would read (the host's variables, else the documented
defaults, templated), in real ansible-playbook runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpu_fleet.tf_hosts.plugins.action import gpu_option_checks
from ansible_collections.gpu_fleet.tf_hosts.plugins.callback import host_failures
from ansible_collections.gpu_fleet.tf_hosts.plugins.lookup.collection_path import option_names, role_names
from helpers import localhost_playbook

ROOT = Path(__file__).resolve().parents[4]


def _play(tmp_path: Path, variables: dict, roles: object = ("gpu_verify", "gpu_health")) -> tuple[int, str]:
    playbook = tmp_path / "check.yml"
    task = {"name": "Check", "gpu_fleet.tf_hosts.gpu_option_checks": {"roles": list(roles) if roles else roles}}
    play = {"hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": [task]}
    playbook.write_text(yaml.safe_dump([play]))
    done = localhost_playbook(playbook)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("role", ["gpu_verify", "gpu_health"])
def test_the_options_checked_are_the_ones_the_role_itself_checks(role):
    """The role's own check (vars/main.yml, __<role>_options) and preflight's read the same options."""
    own = yaml.safe_load((ROOT / f"roles/{role}/vars/main.yml").read_text())[f"__{role}_options"]
    assert set(gpu_option_checks.RULES[role][0]) == set(own)


def test_documented_defaults_keep_their_rules_once_the_gpu_count_is_set(tmp_path):
    rc, out = _play(tmp_path, {"gpu_verify_expected_gpu_count": 2})
    assert rc == 0, out
    assert "ok=1 " in out and "failed=0" in out


def test_every_bad_option_of_every_role_is_named_at_once(tmp_path):
    rc, out = _play(
        tmp_path,
        {"gpu_verify_timeout": 0, "gpu_health_interval": "5s", "gpu_health_state_dir": "state"},
    )
    assert rc != 0
    assert "gpu_verify_expected_gpu_count is not set; it must be a whole number of GPUs of at least 1." in out
    assert "gpu_verify_timeout is 0; it must be a number of seconds above 0." in out
    assert "gpu_health_interval is 5s" in out and "gpu_health_state_dir is state" in out


def test_every_later_phase_keeps_its_specification_with_the_documented_defaults(tmp_path):
    rc, out = _play(tmp_path, {"gpu_verify_expected_gpu_count": 2}, roles=gpu_option_checks.ROLES)
    assert rc == 0, out
    assert "ok=1 " in out and "failed=0" in out


def test_a_wrong_type_or_choice_is_named_as_the_role_would_name_it_with_where_to_fix_it(tmp_path):
    """As Ansible's own check when the role starts (the same validator), before that role's phase: all at once."""
    rc, out = _play(
        tmp_path,
        {"nvidia_driver_method": "packages", "tf_venv_pip_timeout": "soon", "tf_venv_require_lock": "maybe"},
        roles=["nvidia_driver", "cuda_toolkit", "tf_venv"],
    )
    assert rc != 0
    assert (
        "value of nvidia_driver_method must be one of: auto, package, runfile, distribution, got: packages (nvidia_driver's options"
        in out
    )
    assert "tf_venv_pip_timeout" in out and "(tf_venv's options; fix it in the inventory" in out
    assert "tf_venv_require_lock" in out and "cuda_toolkit" not in out.split("TASK [Check]", 1)[1]


def test_a_host_path_gpu_env_writes_must_be_absolute(tmp_path):
    """A path type takes any word (and a list, as its text): gpu_env would write the host's driver, CUDA and cuDNN
    first, then stop at its own look. Named before any change instead, with the default as the fix."""
    rc, out = _play(tmp_path, {"gpu_env_profile_path": "x", "gpu_env_sudoers_path": ["y"]}, roles=["gpu_env"])
    assert rc != 0
    assert (
        "gpu_env_profile_path is x; it must be an absolute path on the host. Set it to /etc/profile.d/gpu-env.sh" in out
    )
    assert "gpu_env_sudoers_path is ['y']; it must be an absolute path on the host" in out
    assert "gpu_env_ld_conf_path" not in out.split("TASK [Check]", 1)[1]


def test_the_cuda_installers_time_limit_is_named_by_its_rule(tmp_path):
    rc, out = _play(tmp_path, {"cuda_toolkit_install_timeout": 30}, roles=["cuda_toolkit"])
    assert rc != 0
    assert "cuda_toolkit_install_timeout is 30; it is the seconds NVIDIA's CUDA installer may run" in out
    assert "cuda_toolkit's options" not in out


def test_an_option_a_rule_covers_is_named_once_by_its_rule(tmp_path):
    """gpu_verify_timeout has a rule of its own: its message, not a second one from the specification."""
    rc, out = _play(tmp_path, {"gpu_verify_expected_gpu_count": 2, "gpu_verify_timeout": "soon"}, roles=["gpu_verify"])
    assert rc != 0
    assert "gpu_verify_timeout is soon" in out
    assert "gpu_verify's options" not in out


def test_a_default_that_follows_another_role_reads_that_roles_value(tmp_path):
    """gpu_verify_jupyter_kernel_dir's documented default is tf_venv_jupyter_kernel_dir's value."""
    rc, out = _play(tmp_path, {"gpu_verify_expected_gpu_count": 1, "tf_venv_jupyter_kernel_dir": "kernels"})
    assert rc != 0
    assert "gpu_verify_jupyter_kernel_dir is kernels; it must be an absolute folder on the host" in out


def test_a_variable_is_templated_as_the_role_would_read_it(tmp_path):
    rc, out = _play(tmp_path, {"gpus": 4, "gpu_verify_expected_gpu_count": "{{ gpus - 5 }}"}, roles=["gpu_verify"])
    assert rc != 0
    assert "gpu_verify_expected_gpu_count is -1; it must be a whole number of GPUs of at least 1." in out
    assert "gpu_health" not in out.split("TASK [Check]", 1)[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"roles": ["gpu_verify", "gpu_rollout"]},
            "gpu_option_checks does not check the options of the role 'gpu_rollout'",
        ),
        ({"roles": []}, "gpu_option_checks takes one option, roles: a list of some of nvidia_driver, cuda_toolkit"),
        ({"roles": "gpu_verify"}, "gpu_option_checks takes one option, roles"),
        ({"roles": ["gpu_verify"], "strict": True}, "gpu_option_checks takes one option, roles"),
    ],
)
def test_bad_arguments_are_named(args, message):
    assert message in " ".join(gpu_option_checks.argument_problems(args))


def test_an_option_without_value_or_default_is_none():
    values = gpu_option_checks.option_values(
        ("gpu_verify_expected_gpu_count", "gpu_verify_timeout"), {}, lambda value: value
    )
    assert values == {"gpu_verify_expected_gpu_count": None, "gpu_verify_timeout": 600}
    assert json.dumps(values)  # plain data, as the rules read it


# --- variables that start with a role's name and are no option of it --------------------------------------------


def test_a_misspelt_role_variable_stops_the_host_naming_the_closest_option(tmp_path):
    """Ansible ignores a variable no task reads: nvidia_driver_versoin would leave the default driver in place."""
    rc, out = _play(tmp_path, {"gpu_verify_expected_gpu_count": 2, "nvidia_driver_versoin": "535.104.05"})
    assert rc != 0
    assert (
        "nvidia_driver_versoin is no option of the role nvidia_driver, so it would change nothing (did you mean "
        "nvidia_driver_version?). Correct its name, or remove it from the inventory or the -e command line; if another "
        "tool reads it (NVIDIA's nvidia.nvidia_driver role has nvidia_driver_* names of its own), list it in "
        "gpu_preflight_foreign_variables." in out
    )


@pytest.mark.parametrize(
    ("name", "meaning"),
    [
        ("tf_venv_pip_idx_url", "did you mean tf_venv_pip_index_url?"),
        ("gpu_rollout_serail", "did you mean gpu_rollout_serial?"),
        ("gpu_preflight_stack", "did you mean gpu_preflight_stacks?"),
        ("gpu_env_switch_defaults", "did you mean gpu_env_switch_default?"),  # an option of entry point switch
        ("cudnn_zzz", "its options: roles/cudnn/README.md"),
        # Compared after the role's prefix, which every name of the role shares: no likely meaning here.
        ("nvidia_driver_branch", "its options: roles/nvidia_driver/README.md"),
        ("nvidia_driver_ubuntu_install_from_cuda_repo", "its options: roles/nvidia_driver/README.md"),
        # Another role's option is no likely meaning of a name under this role's.
        ("cudnn_verison", "its options: roles/cudnn/README.md"),
    ],
)
def test_every_roles_prefix_is_checked_against_every_entry_point(name, meaning):
    (message,) = gpu_option_checks.unknown_variables([name, "gpu_verify_timeout", "gpu_env_switch_default"])
    assert message.startswith(f"{name} is no option of the role ") and f"({meaning})" in message


def test_another_tools_variables_listed_as_foreign_are_left_alone():
    """NVIDIA's nvidia.nvidia_driver role reads nvidia_driver_* names of its own (gpu_preflight_foreign_variables)."""
    names = ["nvidia_driver_branch", "nvidia_driver_ubuntu_install_from_cuda_repo", "nvidia_driver_versoin"]
    (left,) = gpu_option_checks.unknown_variables(names, ["nvidia_driver_branch", "nvidia_driver_ubuntu_*"])
    assert left.startswith("nvidia_driver_versoin is no option")


def test_internal_names_published_facts_and_other_names_are_no_misspellings():
    names = ["__nvidia_driver_plan", "gpu_preflight_resolved_stacks", "gpu_verify_failed_reason", "gpus", "cuda"]
    assert gpu_option_checks.unknown_variables(names) == []


def _house_map():
    spec = importlib.util.spec_from_file_location("house_map", ROOT / "tools" / "house_map.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["house_map"] = module
    spec.loader.exec_module(module)
    return module


def test_every_name_the_run_sets_is_known_to_be_no_misspelling():
    """A fact a role publishes (docs/architecture_map.md) or a playbook's play variable is among a host's variables
    when the checks run in a later batch (reprovision.yml) or play: never named as a misspelt option."""
    house = _house_map().measure(ROOT)
    play_vars = {
        name
        for path in ROOT.glob("playbooks/*.yml")
        for play in yaml.safe_load(path.read_text()) or []
        for name in (play.get("vars") or {})
    }
    assert gpu_option_checks.unknown_variables({*house.writers, *play_vars}) == []
    options = set().union(*(option_names(role) for role in role_names()))
    assert gpu_option_checks.run_variables().isdisjoint(options)


def test_the_callbacks_notes_are_no_misspellings():
    callback_vars = {host_failures.UNREACHABLE_VAR, host_failures.FAILED_VAR, host_failures.CHECK_VAR}
    assert callback_vars <= gpu_option_checks.run_variables()


def test_gpu_slurm_on_mig_gpus_needs_autodetect_before_any_change(tmp_path):
    """gpu_slurm's rule reads gpu_mig's inputs: a layout in MIG mode and a gres.conf of physical GPUs is refused."""
    variables = {
        "gpu_slurm_enabled": True,
        "gpu_mig_enabled": True,
        "gpu_mig_layout": [{"gpus": "all", "profiles": ["3g.40gb"]}],
    }
    rc, out = _play(tmp_path, variables, roles=["gpu_slurm"])
    assert rc != 0
    assert "gpu_mig_layout puts GPUs in MIG mode" in out
    rc, out = _play(tmp_path, dict(variables, gpu_slurm_autodetect=True), roles=["gpu_slurm"])
    assert rc == 0, out
