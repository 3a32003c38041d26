"""Filters for binding each TensorFlow venv to its own stack (roles/tf_venv, files/tf_stack.py).

``gpu_tf_stack_env``: a resolved stack -> the ``{KEY: value}`` of its environment file
(``<venv>/tf-stack.env``, linked from ``/etc/tf-stacks/<name>.env``).
``gpu_tf_kernel_spec``: a resolved stack and that environment -> its Jupyter kernel spec.

Each is documented in plugins/filter/<name>.yml.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

# The PATH of `tf-stack run` and of a systemd unit using the file, after the stack's own folders:
# Debian's and RHEL's default PATH for root (what systemd gives services, systemd.exec(5), "PATH").
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _cuda_values(cuda: dict, venv: str) -> dict[str, str]:
    """The keys that bind the stack to its CUDA, by where it comes from (``cuda['source']``, default runfile).

    A runfile toolkit: ``CUDA_HOME``, its ``lib64`` (where the cudnn role puts the stack's cuDNN too) and ``bin``.
    NVIDIA's wheels (``tensorflow[and-cuda]``): no ``CUDA_HOME``; the ``nvidia/*/lib`` folders of the venv
    (``library_dirs``), ahead of any system CUDA the caller's ``LD_LIBRARY_PATH`` names; XLA's CUDA data folder is
    the ``nvidia/cuda_nvcc`` wheel (ptxas and libdevice); the venv's ``bin`` then the system's on ``PATH``."""
    if (cuda.get("source") or "runfile") == "wheels":
        return {
            "LD_LIBRARY_PATH": ":".join(cuda["library_dirs"]),
            "XLA_FLAGS": f"--xla_gpu_cuda_data_dir={cuda['site_packages']}/nvidia/cuda_nvcc",
            "PATH": f"{venv}/bin:{SYSTEM_PATH}",
        }
    root = cuda["root"]
    return {
        "CUDA_HOME": root,
        "LD_LIBRARY_PATH": f"{root}/lib64",
        # XLA finds ptxas and libdevice under this folder (TensorFlow GPU guide, "XLA" flags).
        "XLA_FLAGS": f"--xla_gpu_cuda_data_dir={root}",
        "PATH": f"{venv}/bin:{root}/bin:{SYSTEM_PATH}",
    }


def gpu_tf_stack_env(stack: dict, default_package: str = "tensorflow") -> dict[str, str]:
    """``{{ stack | gpu_fleet.tf_hosts.gpu_tf_stack_env(tf_venv_package) }}``: the stack's environment.

    The library folders are the toolkit's ``lib64`` (runfile), or the venv's ``nvidia/*/lib`` folders where the
    stack's CUDA comes from NVIDIA's wheels (:func:`_cuda_values`). Values hold no spaces or quotes: the file is
    read by systemd (``EnvironmentFile=``), by POSIX ``sh`` and by ``tf_stack.read_env`` alike."""
    try:
        cuda, cudnn, tensorflow = stack["cuda_toolkit"], stack["cudnn"], stack["tensorflow"]
        venv = stack["venv"]
        values = {
            "TF_STACK": stack["name"],
            "TF_STACK_VENV": venv,
            "TF_STACK_PACKAGE": tensorflow.get("package") or default_package,
            "TF_STACK_TENSORFLOW": tensorflow["version"],
            "TF_STACK_PYTHON": str(stack["python"]["version"]),
            "TF_STACK_CUDA": cuda["version"],
            "TF_STACK_CUDNN": cudnn["version"],
            "TF_STACK_CUDART": cuda["cudart_soname"],
            "TF_STACK_CUDNN_SONAME": f"libcudnn.so.{cudnn['major']}",
            **_cuda_values(cuda, venv),
        }
    except (KeyError, TypeError) as error:
        raise AnsibleFilterError(f"gpu_tf_stack_env: not a resolved stack (no {error})") from None
    unsafe = sorted(key for key, value in values.items() if any(c in str(value) for c in " \t\n\"'\\$`"))
    if unsafe:
        raise AnsibleFilterError(
            f"stack {stack['name']}: {', '.join(unsafe)} would hold a space, quote or shell character; "
            "name the stack and its venv with letters, digits, '.', '-', '_' and '/' only"
        )
    return values


def gpu_tf_kernel_spec(stack: dict, command: str) -> dict[str, Any]:
    """``{{ stack | gpu_fleet.tf_hosts.gpu_tf_kernel_spec(tf_venv_command_path) }}``: ``kernel.json``
    for the stack (Jupyter Client documentation, "Kernel specs"). The kernel starts through the host's
    ``tf-stack run STACK --``, which prepends the stack's library folder and ``bin`` folders to the
    user's ``LD_LIBRARY_PATH`` and ``PATH`` and then becomes the kernel (exec, same process): a spec's own
    ``env`` would replace the user's values instead, and would not follow the stack's file."""
    cuda, cudnn = stack["cuda_toolkit"], stack["cudnn"]
    python = f"{stack['venv']}/bin/python"
    # A stack whose CUDA comes from NVIDIA's wheels says so: two kernels of one CUDA series can differ there.
    wheels = " wheels" if cuda.get("source") == "wheels" else ""
    return {
        "argv": [command, "run", stack["name"], "--", python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": (
            f"TensorFlow {stack['tensorflow']['version']} ({stack['name']}: CUDA {cuda['series']}{wheels}, "
            f"cuDNN {cudnn['series']})"
        ),
        "language": "python",
        "metadata": {"tf_stack": stack["name"], "debugger": True},
    }


class FilterModule:
    """Stack binding filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_tf_stack_env": gpu_tf_stack_env, "gpu_tf_kernel_spec": gpu_tf_kernel_spec}
