"""gpu_env's filters: what the default stack puts on the host's system paths (runfile or NVIDIA's wheels), and why a
refresh of the loader cache fails the host (gpu_env's ldconfig), in the words the role used."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))

import gpu_loader
import pytest
from ansible.errors import AnsibleFilterError

COPY = "ldconfig: /usr/local/cuda-12.2/lib64/libcudnn.so.8 is not a symbolic link"
FIX = (
    'A file named "is not a symbolic link" is a library\'s soname name (such as libcudnn.so.8) that is a copy, not a '
    "link to the versioned file: replace it with the link (ln -sf <versioned file> <name> in its folder), or "
    "reinstall what put it there, then rerun."
)


def test_a_complaint_on_stderr_fails_although_ldconfig_exited_0():
    result = {"rc": 0, "stderr": COPY + "\n", "stderr_lines": [COPY]}
    assert gpu_loader.gpu_ldconfig_problem(result) == (
        f"ldconfig complained while refreshing the loader cache: {COPY}. {FIX}"
    )


def test_an_exit_status_without_a_message():
    assert gpu_loader.gpu_ldconfig_problem({"rc": 1, "stderr": "", "stderr_lines": []}) == (
        f"ldconfig exited 1 while refreshing the loader cache: no message. {FIX}"
    )


def test_every_line_is_named():
    lines = [COPY, "ldconfig: /usr/lib/libfoo.so.1 is not a symbolic link"]
    text = gpu_loader.gpu_ldconfig_problem({"rc": 0, "stderr": "\n".join(lines), "stderr_lines": lines})
    assert f"cache: {lines[0]}; {lines[1]}. A file" in text


def test_real_ldconfig_over_nvidias_cudnn_copied_without_its_links():
    """Debian 12's ldconfig over NVIDIA's real cuDNN 8.6.0 libraries copied without cp -P: each complaint
    ends with an empty line, which the message leaves out (tests/fixtures/real_outputs/README.md)."""
    stderr = (ROOT / "tests/fixtures/real_outputs/ldconfig-copied-cudnn-8.6.0.stderr").read_text()
    text = gpu_loader.gpu_ldconfig_problem({"rc": 0, "stderr": stderr, "stderr_lines": stderr.splitlines()})
    assert text == (
        "ldconfig complained while refreshing the loader cache: "
        "ldconfig: /tmp/copied/libcudnn_ops_infer.so.8 is not a symbolic link; "
        f"ldconfig: /tmp/copied/libcudnn.so.8 is not a symbolic link. {FIX}"
    )


def test_a_quiet_run_or_a_skipped_one_is_no_problem():
    assert gpu_loader.gpu_ldconfig_problem({"rc": 0, "stderr": "", "stderr_lines": []}) == ""
    assert gpu_loader.gpu_ldconfig_problem({"skipped": True, "changed": False}) == ""
    assert gpu_loader.gpu_ldconfig_problem(None) == ""


# --- gpu_system_cuda: the served default stack's folders on the host's system paths --------------------

RUNFILE = {"name": "tf2.12", "cuda_toolkit": {"source": "runfile", "root": "/usr/local/cuda-11.8"}}
WHEELS = {"name": "tf2.18", "cuda_toolkit": {"source": "wheels", "root": None, "library_dirs": ["/x/nvidia/cudnn/lib"]}}


def test_a_runfile_default_puts_its_toolkit_on_every_system_path():
    assert gpu_loader.gpu_system_cuda(RUNFILE) == {
        "home": "/usr/local/cuda-11.8",
        "bin": ["/usr/local/cuda-11.8/bin"],
        "lib": ["/usr/local/cuda-11.8/lib64"],
        "text": "PATH and the library path set for /usr/local/cuda-11.8",
    }
    # A record resolved before stacks named their CUDA's source is a runfile one.
    legacy = {"name": "tf2.12", "cuda_toolkit": {"root": "/usr/local/cuda-11.8"}}
    assert gpu_loader.gpu_system_cuda(legacy) == gpu_loader.gpu_system_cuda(RUNFILE)


def test_a_wheels_default_puts_no_cuda_on_the_system_paths():
    """Its wheels' folders stay its own (the stack's environment file), never the system's."""
    assert gpu_loader.gpu_system_cuda(WHEELS) == {
        "home": None,
        "bin": [],
        "lib": [],
        "text": "no system CUDA: the default stack tf2.18 takes CUDA from NVIDIA's wheels in its venv",
    }


@pytest.mark.parametrize(
    ("stack", "message"),
    [
        ({"name": "x", "cuda_toolkit": {"source": "conda", "root": None}}, "unknown CUDA source 'conda'"),
        ({"name": "x", "cuda_toolkit": {"source": "runfile", "root": None}}, "a runfile CUDA without a toolkit root"),
        ({"name": "x"}, "not a resolved stack"),
        (None, "not a resolved stack"),
    ],
)
def test_a_stack_that_is_not_resolved_is_named(stack, message):
    with pytest.raises(AnsibleFilterError, match=message):
        gpu_loader.gpu_system_cuda(stack)
