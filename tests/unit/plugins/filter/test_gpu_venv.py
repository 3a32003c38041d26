"""The TensorFlow venv filters: the --check plan's line, the venvs' look, the files before pip, and the
texts of the stops (as the role showed them before they moved to Python)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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


def test_pip_problem_from_the_index_hides_its_credentials():
    text = gpu_venv.gpu_venv_pip_problem(
        PIP_FAILED, dict(PIP, index_url="https://fleet:s3cret@pypi.example.com/simple/")
    )
    assert text == (
        f"{PIP_SAID} Rerun (downloads are retried), check the index (https://pypi.example.com/simple/) and the CA "
        "bundle, or install from a wheelhouse (tf_venv_wheelhouse)."
    )
    assert "check the index (PyPI)" in gpu_venv.gpu_venv_pip_problem(PIP_FAILED, PIP)


def test_pip_problem_from_a_wheelhouse():
    assert gpu_venv.gpu_venv_pip_problem(PIP_FAILED, dict(PIP, wheelhouse="/srv/wheels", from_controller=True)) == (
        f"{PIP_SAID} pip installed from the wheelhouse /srv/wheels (tf_venv_wheelhouse) only: put every wheel of the "
        "lock for the Python and platform of the host there (make the bundle again: playbooks/airgap_bundle.yml)."
    )


def test_pip_problem_from_the_controllers_wheels_only_when_locked():
    assert gpu_venv.gpu_venv_pip_problem(PIP_FAILED, dict(PIP, from_controller=True)) == (
        f"{PIP_SAID} pip installed from the wheels the controller fetched into /var/cache/wheels/abc/cp311-x86_64 only "
        "(tf_venv_wheels_from: controller): remove that folder so that the next run fetches it again, or set "
        "tf_venv_wheels_from: index."
    )
    unlocked = gpu_venv.gpu_venv_pip_problem({}, dict(PIP, from_controller=True, locked=False))
    assert unlocked.startswith(
        "pip could not install the lock tensorflow-2.15.1-py3.11.txt into /opt/tensorflow/2.15: . Rerun"
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
