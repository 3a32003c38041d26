"""The TensorFlow venv filters: the --check plan's line, the venvs' look, the files before pip, and the
texts of the stops (as the role showed them before they moved to Python)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))

import gpu_venv

STACK = {"name": "tf2.15", "venv": "/opt/tensorflow/2.15", "tensorflow": {"version": "2.15.1"}}
DRIFT = ["numpy 1.26.4 -> 1.26.3", "absl-py missing", "wrapt extra"]


@pytest.mark.parametrize(
    ("state", "text"),
    [
        ({"has_python": False, "change": True, "locked": True}, "venv tf2.15 would be created in /opt/tensorflow/2.15 (TensorFlow 2.15.1)"),
        ({"has_python": True, "change": True, "locked": True, "drift": DRIFT}, "venv tf2.15 would be brought to its lock (numpy 1.26.4 -> 1.26.3; absl-py missing; and 1 more)"),
        ({"has_python": True, "change": True, "locked": True, "drift": DRIFT[:1]}, "venv tf2.15 would be brought to its lock (numpy 1.26.4 -> 1.26.3)"),
        ({"has_python": True, "change": True, "locked": True, "drift": []}, "venv tf2.15 would be brought to its lock (a new lock or an interrupted install)"),
        ({"has_python": True, "change": True, "locked": False, "drift": DRIFT}, "TensorFlow 2.15.1 would be installed into venv tf2.15 (unlocked)"),
        ({"has_python": True, "change": False, "locked": True}, "venv tf2.15 current (TensorFlow 2.15.1, locked)"),
        ({"has_python": "yes", "change": "false", "locked": "false"}, "venv tf2.15 current (TensorFlow 2.15.1, unlocked)"),
    ],
)  # fmt: skip
def test_plan_text(state, text):
    assert gpu_venv.gpu_venv_plan_text(STACK, state) == text


LOOK = {
    "distributions_script": "print(1)",
    "lock_record": "tf-lock.sha256",
    "try_index": True,
    "index_key": "pip index",
    "python": "/usr/bin/python3",
    "index_script": "print(2)",
    "target": {"scheme": "https", "hostname": "pypi.org", "port": None},
}


def test_look_commands_per_venv_and_the_index_on_its_default_port():
    stacks = [STACK, {"venv": "/opt/tensorflow/2.12"}]
    assert gpu_venv.gpu_venv_look_commands(stacks, LOOK) == {
        "/opt/tensorflow/2.15": [
            "/opt/tensorflow/2.15/bin/python",
            "-c",
            "print(1)",
            "/opt/tensorflow/2.15/tf-lock.sha256",
        ],
        "/opt/tensorflow/2.12": [
            "/opt/tensorflow/2.12/bin/python",
            "-c",
            "print(1)",
            "/opt/tensorflow/2.12/tf-lock.sha256",
        ],
        "pip index": ["/usr/bin/python3", "-c", "print(2)", "pypi.org", "443"],
    }


def test_look_commands_proxy_port_and_no_index_try():
    proxy = dict(LOOK, target={"scheme": "http", "hostname": "proxy.example.com", "port": 3128})
    assert gpu_venv.gpu_venv_look_commands([], proxy)["pip index"][-2:] == ["proxy.example.com", "3128"]
    plain = dict(LOOK, target={"scheme": "http", "hostname": "mirror.example.com", "port": None})
    assert gpu_venv.gpu_venv_look_commands([], plain)["pip index"][-1] == "80"
    assert gpu_venv.gpu_venv_look_commands([STACK], dict(LOOK, try_index=False)).keys() == {"/opt/tensorflow/2.15"}


PIP_FILES = {
    "ca_bundle": "",
    "pip_conf": "[global]\n",
    "locked": True,
    "lock_path": "locks/tf.txt",
    "lock_file": "tf-lock.txt",
}


def test_pip_files_locked_with_a_ca_bundle():
    files = gpu_venv.gpu_venv_pip_files("/opt/tf", dict(PIP_FILES, ca_bundle="/etc/ssl/site.pem"))
    assert files == [
        {"dest": "/opt/tf/pip-ca-bundle.pem", "src": "/etc/ssl/site.pem", "mode": "0644"},
        {"dest": "/opt/tf/pip.conf", "content": "[global]\n", "mode": "0600"},
        {"dest": "/opt/tf/tf-lock.txt", "src": "locks/tf.txt", "mode": "0644"},
    ]


def test_pip_files_unlocked_without_a_ca_bundle():
    assert [f["dest"] for f in gpu_venv.gpu_venv_pip_files("/opt/tf", dict(PIP_FILES, locked=False))] == [
        "/opt/tf/pip.conf"
    ]


PIP = {
    "what": "the lock tensorflow-2.15.1-py3.11.txt",
    "venv": "/opt/tensorflow/2.15",
    "wheelhouse": "",
    "from_controller": False,
    "locked": True,
    "wheel_dir": "/var/cache/wheels/abc/cp311-x86_64",
    "index_url": "",
}
PIP_FAILED = {"msg": "stdout: Collecting numpy\n\nERROR: Could not find a version that satisfies numpy==1.26.4\n\n"}
PIP_SAID = "pip could not install the lock tensorflow-2.15.1-py3.11.txt into /opt/tensorflow/2.15: ERROR: Could not find a version that satisfies numpy==1.26.4."
KEPT = (
    " /opt/tensorflow/2.15 was there before this run and keeps what it held; its lock record is unchanged, so the "
    "next run brings it to its lock again."
)


def test_pip_problem_from_the_index_hides_its_credentials():
    text = gpu_venv.gpu_venv_pip_problem(
        PIP_FAILED, dict(PIP, index_url="https://fleet:s3cret@pypi.example.com/simple/")
    )
    assert text == (
        f"{PIP_SAID} Rerun (downloads are retried), check the index (https://pypi.example.com/simple/) and the CA "
        "bundle, or install from a wheelhouse (tf_venv_wheelhouse)." + KEPT
    )
    assert "check the index (PyPI)" in gpu_venv.gpu_venv_pip_problem(PIP_FAILED, PIP)


def test_pip_problem_from_a_wheelhouse():
    assert gpu_venv.gpu_venv_pip_problem(PIP_FAILED, dict(PIP, wheelhouse="/srv/wheels", from_controller=True)) == (
        f"{PIP_SAID} pip installed from the wheelhouse /srv/wheels (tf_venv_wheelhouse) only: put every wheel of the "
        "lock for the Python and platform of the host there (make the bundle again: playbooks/airgap_bundle.yml)."
        + KEPT
    )


def test_pip_problem_from_the_controllers_wheels_only_when_locked():
    assert gpu_venv.gpu_venv_pip_problem(PIP_FAILED, dict(PIP, from_controller=True)) == (
        f"{PIP_SAID} pip installed from the wheels the controller fetched into /var/cache/wheels/abc/cp311-x86_64 only "
        "(tf_venv_wheels_from: controller): remove that folder so that the next run fetches it again, or set "
        "tf_venv_wheels_from: index." + KEPT
    )
    unlocked = gpu_venv.gpu_venv_pip_problem({}, dict(PIP, from_controller=True, locked=False))
    assert unlocked.startswith(
        "pip could not install the lock tensorflow-2.15.1-py3.11.txt into /opt/tensorflow/2.15: . Rerun"
    )


def test_pip_problem_says_the_venv_this_run_made_and_the_wheels_pushed_for_it_were_removed():
    inputs = dict(PIP, wheelhouse="/srv/wheels", created="True", wheels_removed="/var/cache/tf-wheelhouse")
    assert gpu_venv.gpu_venv_pip_problem(PIP_FAILED, inputs).endswith(
        "(make the bundle again: playbooks/airgap_bundle.yml). The venv /opt/tensorflow/2.15 that this run made was "
        "removed, so no half-built venv stands where the stack's is expected. The wheels pushed to "
        "/var/cache/tf-wheelhouse for it were removed."
    )
    assert gpu_venv.gpu_venv_pip_problem(PIP_FAILED, dict(inputs, created=False, wheels_removed="")).endswith(KEPT)
    # A venv made in a folder that was there before, empty: the folder stays, emptied.
    emptied = gpu_venv.gpu_venv_pip_problem(PIP_FAILED, dict(inputs, emptied="True", wheels_removed=""))
    assert emptied.endswith(
        "/opt/tensorflow/2.15 was an empty folder before this run: the venv this run made in it was removed and the "
        "folder stays, empty, so no half-built venv stands where the stack's is expected."
    )


NEED = {
    "name": "tensorflow-2.15.1-py3.11.txt",
    "python": "3.11",
    "arch": "x86_64",
    "dir": "/var/cache/wheels/abc/cp311-x86_64",
}
GAPS = ["no locked wheel of a==1", "no locked wheel of b==2", "no locked wheel of c==3", "no locked wheel of d==4"]


def test_wheel_problem_names_what_pip_said_and_three_gaps():
    text = gpu_venv.gpu_venv_wheel_problem(
        NEED, {"stderr": "x\nERROR: 403 Forbidden\n", "rc": 1}, GAPS, "/usr/bin/python3"
    )
    assert text == (
        "The controller could not fetch the wheels of the lock tensorflow-2.15.1-py3.11.txt for CPython 3.11 on "
        "x86_64 into /var/cache/wheels/abc/cp311-x86_64 (ERROR: 403 Forbidden; no locked wheel of a==1; no locked "
        "wheel of b==2; no locked wheel of c==3 and 1 more). Check the controller's pip index, proxy and CA bundle "
        "(its own pip.conf or PIP_INDEX_URL; pip runs as /usr/bin/python3 -m pip), then rerun; or set "
        "tf_venv_wheels_from: index to let each host download from its index."
    )


def test_wheel_problem_falls_back_to_msg_and_to_the_gaps_alone():
    said = gpu_venv.gpu_venv_wheel_problem(NEED, {"stderr": "", "msg": "[Errno 2] No such file"}, GAPS[:1], "p")
    assert "([Errno 2] No such file; no locked wheel of a==1)." in said
    assert (
        "x86_64 into /var/cache/wheels/abc/cp311-x86_64 (no locked wheel of a==1)."
        in gpu_venv.gpu_venv_wheel_problem(NEED, {"skipped": True}, GAPS[:1], "p")
    )


INDEX = {
    "index": {"scheme": "https", "hostname": "pypi.org", "port": None, "path": "/simple/"},
    "proxy": "",
    "proxy_from_role": False,
}


def test_index_problem_none_when_it_answered_or_was_not_tried():
    assert gpu_venv.gpu_venv_index_problem({"rc": 0, "stderr": ""}, INDEX) == ""
    assert gpu_venv.gpu_venv_index_problem(None, INDEX) == ""


def test_index_problem_through_the_role_proxy():
    inputs = dict(INDEX, proxy="http://fleet:****@10.0.0.1:3128", proxy_from_role=True)
    assert gpu_venv.gpu_venv_index_problem({"rc": 1, "stderr": "10.0.0.1 port 3128: Connection refused\n"}, inputs) == (
        "The pip index https://pypi.org/simple/ cannot be reached from the host through the proxy "
        "http://fleet:****@10.0.0.1:3128 (10.0.0.1 port 3128: Connection refused). Fix tf_venv_pip_index_url, the "
        "proxy (tf_venv_proxy, by default gpu_preflight_proxy) or the firewall, let the controller fetch the wheels "
        "(tf_venv_wheels_from: controller), or install from a wheelhouse (tf_venv_wheelhouse)."
    )


def test_index_problem_names_the_port_and_no_answer():
    inputs = dict(INDEX, index={"scheme": "http", "hostname": "127.0.0.1", "port": 9, "path": "/simple"})
    text = gpu_venv.gpu_venv_index_problem({"rc": 1, "stderr": ""}, inputs)
    assert text.startswith("The pip index http://127.0.0.1:9/simple cannot be reached from the host (no answer). Fix ")
    assert "the proxy (https_proxy on the host)" in text


CHECK = {
    "ca_bundle": "",
    "index_urls": [],
    "install_timeout": 3600,
    "kernel_dir": "/usr/local/share/jupyter/kernels",
    "proxy_problem": "",
}


def test_check_problems_none_for_the_defaults():
    assert gpu_venv.gpu_venv_check_problems(CHECK) == []
    assert (
        gpu_venv.gpu_venv_check_problems(dict(CHECK, install_timeout="60", index_urls=["http://10.0.0.1:8080"])) == []
    )


def test_check_problems_each_with_its_text_as_the_role_showed_it(tmp_path):
    bad = dict(
        CHECK,
        ca_bundle=str(tmp_path / "corp-ca.pem"),
        index_urls=["https://pypi.org/simple", "pypi.example.com/simple"],
        install_timeout=0,
        kernel_dir="relative/kernels",
        proxy_problem="tf_venv_proxy url is bad. Fix it.",
    )
    assert gpu_venv.gpu_venv_check_problems(bad) == [
        f"tf_venv_pip_ca_bundle {tmp_path}/corp-ca.pem does not exist on the controller; each venv's pip is given a "
        "copy of it. Point tf_venv_pip_ca_bundle at the CA bundle that signs your index or proxy (often "
        "/etc/ssl/certs/ca-certificates.crt), or leave it empty for pip's own.",
        "The pip index URL pypi.example.com/simple (tf_venv_pip_index_url or tf_venv_pip_extra_index_urls) has no "
        "http:// or https:// scheme and host. Write it in full, for example https://pypi.org/simple or "
        "https://mirror.example.com/pypi/simple, or leave tf_venv_pip_index_url empty for pip's own.",
        "tf_venv_pip_install_timeout is 0; it is the seconds a venv's pip install may run before the run stops it, "
        "at least 60. Set it to 3600 (the default) or more behind a slow mirror.",
        "tf_venv_jupyter_kernel_dir is relative/kernels; it is the folder on the host where a stack whose lock names "
        "ipykernel gets its kernel spec, an absolute path. Set it to one of Jupyter's kernel folders, "
        "/usr/local/share/jupyter/kernels (the default) or /usr/share/jupyter/kernels.",
        "tf_venv_proxy url is bad. Fix it.",
    ]


@pytest.mark.parametrize("timeout", [59, "3600s", -100, True, "1e4"])
def test_check_problems_a_time_limit_that_is_not_whole_seconds_of_a_minute_or_more(timeout):
    [text] = gpu_venv.gpu_venv_check_problems(dict(CHECK, install_timeout=timeout))
    assert text.startswith(f"tf_venv_pip_install_timeout is {timeout};")


@pytest.mark.parametrize("timeout", [0, -1, "2m", 1.5])
def test_check_problems_a_network_timeout_pip_would_refuse(timeout):
    [text] = gpu_venv.gpu_venv_check_problems(dict(CHECK, network_timeout=timeout))
    assert text == (
        f"tf_venv_pip_timeout is {timeout}; it is pip's network timeout in seconds, a whole number above 0. "
        "Set it to 120 (the default) or more behind a slow mirror."
    )


def test_check_problems_a_link_to_the_ca_bundle_counts_as_the_file(tmp_path):
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "link.pem").symlink_to(tmp_path / "ca.pem")
    assert gpu_venv.gpu_venv_check_problems(dict(CHECK, ca_bundle=str(tmp_path / "link.pem"))) == []


LOCK_STACK = {
    "name": "tf2.12",
    "tensorflow": {"version": "2.12.1", "package": "tensorflow-cpu"},
    "python": {"version": "3.11.2"},
}
SIX = hashlib.sha256(b"the real wheel").hexdigest()


def _locks(tmp_path):
    (tmp_path / "tensorflow-cpu-2.12.1-py3.11.txt").write_text(f"six==1.17.0 \\\n    --hash=sha256:{SIX}\n")
    return {
        "lock_dir": str(tmp_path),
        "package": "tensorflow",
        "extras": [],
        "require_lock": True,
        "wheelhouse": "",
        "wheel_files": [],
    }


def test_lock_problems_none_for_a_lock_that_holds_the_extras(tmp_path):
    assert gpu_venv.gpu_venv_lock_problems([LOCK_STACK], _locks(tmp_path)) == []
    assert gpu_venv.gpu_venv_lock_problems([LOCK_STACK], dict(_locks(tmp_path), extras=["six==1.17.0"])) == []


def test_lock_problems_a_missing_lock_unless_not_required(tmp_path):
    inputs = dict(_locks(tmp_path), lock_dir=str(tmp_path / "none"))
    [text] = gpu_venv.gpu_venv_lock_problems([LOCK_STACK], inputs)
    assert text.startswith(
        f"Stack tf2.12 has no dependency lock: {tmp_path}/none/tensorflow-cpu-2.12.1-py3.11.txt does not exist."
    )
    assert gpu_venv.gpu_venv_lock_problems([LOCK_STACK], dict(inputs, require_lock="false")) == []


def test_lock_problems_a_stack_with_extras_takes_the_lock_named_after_them(tmp_path):
    """tensorflow[and-cuda] (CUDA from NVIDIA's wheels) has its own lock, not the one of tensorflow alone."""
    stack = dict(LOCK_STACK, tensorflow={"version": "2.18.1", "package": "tensorflow[and-cuda]"})
    inputs = _locks(tmp_path)
    (tmp_path / "tensorflow-2.18.1-py3.11.txt").write_text(f"six==1.17.0 \\\n    --hash=sha256:{SIX}\n")
    [text] = gpu_venv.gpu_venv_lock_problems([stack], inputs)
    assert text.startswith(
        f"Stack tf2.12 has no dependency lock: {tmp_path}/tensorflow-and-cuda-2.18.1-py3.11.txt does not exist."
    )
    assert "--package 'tensorflow[and-cuda]' --tensorflow 2.18.1 --python 3.11" in text
    (tmp_path / "tensorflow-and-cuda-2.18.1-py3.11.txt").write_text(f"six==1.17.0 \\\n    --hash=sha256:{SIX}\n")
    assert gpu_venv.gpu_venv_lock_problems([stack], inputs) == []


WHEELHOUSE_FIX = (
    "Download the lock's wheels into it from a machine that reaches your index: `python3 -m pip download --dest "
    "/srv/wheels --require-hashes --no-deps -r {lock} --only-binary=:all: --implementation cp --python-version 3.11 "
    "--progress-bar off --platform=manylinux2014_x86_64 --platform=manylinux_2_17_x86_64 --platform=linux_x86_64` "
    "(pip keeps each locked file there and fetches the others again), or build the bundle again "
    "(playbooks/airgap_bundle.yml with gpu_bundle_python_version=3.11) and set tf_venv_wheelhouse to its wheels/ "
    "folder. Nothing was pushed to the host."
)


def _wheelhouse(tmp_path, *wheels):
    return dict(_locks(tmp_path), wheelhouse="/srv/wheels/", wheel_files=list(wheels), arch="x86_64")


def test_lock_problems_an_altered_wheel_of_the_wheelhouse(tmp_path):
    wheel = {"path": "/srv/wheels/six-1.17.0-py2.py3-none-any.whl", "checksum": hashlib.sha256(b"altered").hexdigest()}
    [text] = gpu_venv.gpu_venv_lock_problems([LOCK_STACK], _wheelhouse(tmp_path, wheel))
    lock = tmp_path / "tensorflow-cpu-2.12.1-py3.11.txt"
    assert text == (
        "The wheelhouse /srv/wheels (tf_venv_wheelhouse) does not hold the wheels of the lock "
        "tensorflow-cpu-2.12.1-py3.11.txt for CPython 3.11 on x86_64: six-1.17.0-py2.py3-none-any.whl is not the "
        f"file the lock pins: its sha256 is {hashlib.sha256(b'altered').hexdigest()[:16]}…, the lock lists "
        f"{SIX[:16]} for six==1.17.0; no locked wheel of six==1.17.0. " + WHEELHOUSE_FIX.format(lock=lock)
    )
    good = dict(wheel, checksum=SIX)
    assert gpu_venv.gpu_venv_lock_problems([LOCK_STACK], _wheelhouse(tmp_path, good)) == []


def test_lock_problems_the_altered_wheel_removed_as_once_advised_is_missing(tmp_path):
    # The old advice ("remove the others") left a wheelhouse without six: refused before any push.
    other = {"path": "/srv/wheels/requests-2.32.3-py3-none-any.whl", "checksum": "e" * 64}
    [text] = gpu_venv.gpu_venv_lock_problems([LOCK_STACK], _wheelhouse(tmp_path, other))
    assert "tensorflow-cpu-2.12.1-py3.11.txt for CPython 3.11 on x86_64: no locked wheel of six==1.17.0. " in text
    assert "remove" not in text


def test_lock_problems_a_locked_wheel_of_another_architecture_is_missing(tmp_path):
    wheel = {"path": "/srv/wheels/six-1.17.0-py3-none-manylinux2014_aarch64.whl", "checksum": SIX}
    [text] = gpu_venv.gpu_venv_lock_problems([LOCK_STACK], _wheelhouse(tmp_path, wheel))
    assert "on x86_64: no locked wheel of six==1.17.0." in text
    assert gpu_venv.gpu_venv_lock_problems([LOCK_STACK], dict(_wheelhouse(tmp_path, wheel), arch="aarch64")) == []


def test_lock_problems_name_five_missing_pins_then_how_many_more(tmp_path):
    pins = "".join(f"p{n}==1.0 \\\n    --hash=sha256:{n:064d}\n" for n in range(8))
    inputs = _wheelhouse(tmp_path)
    (tmp_path / "tensorflow-cpu-2.12.1-py3.11.txt").write_text(pins)
    [text] = gpu_venv.gpu_venv_lock_problems([LOCK_STACK], inputs)
    assert ": no locked wheel of p0==1.0, p1==1.0, p2==1.0, p3==1.0, p4==1.0, and 3 more. Download" in text


def test_lock_problems_the_wheelhouse_only_once_every_lock_can_be_used(tmp_path):
    wheel = {"path": "/srv/wheels/six-1.17.0-py2.py3-none-any.whl", "checksum": hashlib.sha256(b"altered").hexdigest()}
    inputs = dict(_locks(tmp_path), wheelhouse="/srv/wheels", wheel_files=[wheel], extras=["pandas==2.2.3"])
    [text] = gpu_venv.gpu_venv_lock_problems([LOCK_STACK], inputs)
    assert text.startswith("tf_venv_extra_packages pandas==2.2.3 not in stack tf2.12's lock")


def test_plan_the_updated_the_current_and_the_absent():
    stacks = [STACK, {"name": "tf2.12", "venv": "/opt/tensorflow/2.12", "tensorflow": {"version": "2.12.1"}}]
    bound = [
        {"__tf_venv_stack": stacks[0], "ansible_loop_var": "__tf_venv_stack", "skipped": True},
        {"__tf_venv_stack": stacks[1], "ansible_loop_var": "__tf_venv_stack", "changed": False},
    ]
    updated = {"tf2.15": {"change": True, "text": "venv tf2.15 would be created"}}
    absent = {"tf2.10": {"change": True, "text": "venv tf2.10 would be removed (/opt/tensorflow/2.10)"}}
    plan = gpu_venv.gpu_venv_plan(stacks, {"updated": updated, "bound": bound, "absent": absent})
    assert plan == {
        "tf2.15": {"change": True, "text": "venv tf2.15 would be created"},
        "tf2.12": {"change": False, "text": "venv tf2.12 current (TensorFlow 2.12.1, locked)"},
        "tf2.10": {"change": True, "text": "venv tf2.10 would be removed (/opt/tensorflow/2.10)"},
    }
    assert list(plan) == ["tf2.15", "tf2.12", "tf2.10"]


def test_plan_names_no_stack_the_run_did_not_look_at():
    assert gpu_venv.gpu_venv_plan([STACK], {"updated": {}, "bound": [], "absent": {}}) == {}


def test_download_argv():
    need = {"lock": "/locks/tf.txt", "dir": "/cache/abc/cp311-aarch64", "python": "3.11", "arch": "aarch64"}
    assert gpu_venv.gpu_venv_download_argv(need, "/usr/bin/python3") == [
        "/usr/bin/python3", "-m", "pip", "download", "--dest", "/cache/abc/cp311-aarch64", "--require-hashes",
        "--no-deps", "-r", "/locks/tf.txt", "--only-binary=:all:", "--implementation", "cp", "--python-version",
        "3.11", "--progress-bar", "off", "--platform=manylinux2014_aarch64", "--platform=manylinux_2_17_aarch64",
        "--platform=linux_aarch64",
    ]  # fmt: skip


def test_message_absent_texts_as_the_role_showed_them():
    fields = {"venv": "/opt/tensorflow/2.10", "env_file": "tf-stack.env", "name": "tf2.10"}
    assert gpu_venv.gpu_venv_message("absent_env_unreadable", said="Permission denied", **fields) == (
        "/opt/tensorflow/2.10/tf-stack.env cannot be read (Permission denied), so whether /opt/tensorflow/2.10 is "
        "stack tf2.10's venv is not known; nothing of it was removed. Make the file readable by root (or remove the "
        "venv by hand), then rerun."
    )
    assert gpu_venv.gpu_venv_message("absent_venv_stays", **fields) == (
        "/opt/tensorflow/2.10 stays: its tf-stack.env is missing or does not name stack tf2.10 (a venv installed "
        "before tf_venv wrote that file, or another folder). Remove it by hand if it is that stack's venv."
    )


def test_message_unknown_id():
    with pytest.raises(AnsibleFilterError, match="no message 'nope'"):
        gpu_venv.gpu_venv_message("nope")
