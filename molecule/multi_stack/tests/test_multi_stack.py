"""Three stacks on one host after site.yml (testinfra, podman backend): TensorFlow 2.12 on CUDA 11.8
and cuDNN 8.6, TensorFlow 2.18 on CUDA 12.5 and cuDNN 9.3, and TensorFlow 2.18 with CUDA 12.5 and
cuDNN 9.3 from NVIDIA's wheels in its venv (tensorflow[and-cuda]). Each venv loads its own toolkit's
(or its own wheels') libcudart and libcudnn in every context, though the loader cache serves the
default stack only; tf-stack lists all three. tf2.18 and tf2.18w load the same sonames from different
folders. (Two toolkits with the same sonames are tests/unit/test_tf_stack.py's case.)"""

from __future__ import annotations

import json
import shlex

import pytest

WHEELS_VENV = "/opt/tensorflow/2.18-wheels"
STACKS = {  # name: (venv, toolkit or the wheels' folder, libcudart's real file, cudnnGetVersion, TensorFlow)
    "tf2.12": ("/opt/tensorflow/2.12", "/usr/local/cuda-11.8", "libcudart.so.11.8.89", 8600, "2.12.1"),
    "tf2.18": ("/opt/tensorflow/2.18", "/usr/local/cuda-12.5", "libcudart.so.12.5.82", 90300, "2.18.1"),
    # NVIDIA's wheels name the runtime's file by its soname.
    "tf2.18w": (WHEELS_VENV, f"{WHEELS_VENV}/lib/python3.11/site-packages/nvidia", "libcudart.so.12", 90300, "2.18.1"),
}
# What cudaRuntimeGetVersion returns in each venv (see probe): 100 but for NVIDIA's real runtime of the wheel.
STATUS = {"tf2.18w": 0}
# How many of the toolkit's files the probe maps: NVIDIA's real libcudnn_ops.so.9 of the wheel also loads
# libcudnn_graph.so.9 (its DT_NEEDED); the stand-ins need nothing more.
MAPPED = {"tf2.18w": 4}
SONAMES = {  # name: (libcudart, libcudnn, one of cuDNN's sub-libraries), as NVIDIA names them
    "tf2.12": ("libcudart.so.11.0", "libcudnn.so.8", "libcudnn_ops_infer.so.8"),
    "tf2.18": ("libcudart.so.12", "libcudnn.so.9", "libcudnn_ops.so.9"),
    "tf2.18w": ("libcudart.so.12", "libcudnn.so.9", "libcudnn_ops.so.9"),
}


def probe(name: str) -> str:
    """Python source that loads stack ``name``'s libraries by soname, as TensorFlow does, and prints
    what cudaRuntimeGetVersion answers, cuDNN's version and the files the process mapped.  The toolkits'
    runtime stand-ins start the driver first: the sandbox's has no GPU, so they answer 100
    (cudaErrorNoDevice; 35 without a driver) and no version, the release is their file's name. NVIDIA's
    real CUDA 12.5 runtime of the wheel (tf2.18w) answers 0 and its version without a GPU (:data:`STATUS`)."""
    cudart, cudnn, part = SONAMES[name]
    return (
        f"import ctypes, json; rt = ctypes.CDLL('{cudart}'); v = ctypes.c_int();"
        f"s = rt.cudaRuntimeGetVersion(ctypes.byref(v)); dnn = ctypes.CDLL('{cudnn}');"
        f"dnn.cudnnGetVersion.restype = ctypes.c_size_t; ctypes.CDLL('{part}');"
        "print(json.dumps([s, dnn.cudnnGetVersion(),"
        " sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcud' in l})]))"
    )


CONTEXTS = {  # @venv@, @name@, @other@ (the other stack's name) and @arg@ (the probe) are filled in
    "direct": "@venv@/bin/python -c @arg@",
    "cron-like empty environment": "env -i @venv@/bin/python -c @arg@",
    "under the other stack's environment": "tf-stack run @other@ -- @venv@/bin/python -c @arg@",
    "sudo to another user": "sudo -u nobody @venv@/bin/python -c @arg@",
    "activated shell": "sh -c @activated@",
    "login shell (the default stack's profile)": "bash -lc @login@",
    "tf-stack run": "tf-stack run @name@ -- python -c @arg@",
}


@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("name", sorted(STACKS))
def test_each_venv_loads_its_own_toolkit_in_every_context(host, name, context):
    venv, root, runtime, cudnn, _tf = STACKS[name]
    other = next(key for key in STACKS if key != name)
    arg = shlex.quote(probe(name))
    activated = shlex.quote(f". {venv}/bin/activate && python -c {arg}")
    login = shlex.quote(f"{venv}/bin/python -c {arg}")
    command = CONTEXTS[context].replace("@activated@", activated).replace("@login@", login).replace("@arg@", arg)
    command = command.replace("@venv@", venv).replace("@name@", name).replace("@other@", other)
    out = host.run(command)
    assert out.rc == 0, out.stderr
    status, found_cudnn, files = json.loads(out.stdout)
    assert (status, found_cudnn) == (STATUS.get(name, 100), cudnn)
    # The runtime opened the driver's libcuda.so.1 itself; the toolkit's files are the stack's own.
    toolkit = [path for path in files if "/libcuda.so" not in path]
    assert len(toolkit) == MAPPED.get(name, 3) and all(path.startswith(f"{root}/") for path in toolkit), files
    assert any(path.endswith(f"/{runtime}") for path in toolkit), files
    # NVIDIA's real runtime of the wheel does not keep the stand-in libcuda open: that exports only
    # cuDriverGetVersion, cuInit and cuDeviceGetCount (tests/fixtures/nvidia/src/lib/libcuda.c).
    assert name in STATUS or "/usr/lib/x86_64-linux-gnu/libcuda.so.555.42.06" in files


def test_the_loader_cache_serves_the_default_stack_only(host):
    cache = host.run("ldconfig -p").stdout
    assert "/usr/local/cuda-11.8/" in cache and "/usr/local/cuda-12.5/" not in cache
    assert f"{WHEELS_VENV}/" not in cache
    assert host.file("/usr/local/cuda").linked_to == "/usr/local/cuda-11.8"


def test_tf_stack_lists_both_with_the_default_marked(host):
    out = host.run("tf-stack list --json")
    assert out.rc == 0, out.stdout + out.stderr
    listed = json.loads(out.stdout)
    assert listed["default"] == "tf2.12"
    rows = {row["TF_STACK"]: row for row in listed["stacks"]}
    assert sorted(rows) == sorted(STACKS) and all(row["TF_STACK_HEALTH"] == "ok" for row in rows.values())
    assert (rows["tf2.18"]["TF_STACK_CUDA"], rows["tf2.18"]["TF_STACK_CUDNN"]) == ("12.5.1", "9.3.0.75")
    assert (rows["tf2.18w"]["TF_STACK_CUDA"], rows["tf2.18w"]["TF_STACK_CUDNN"]) == ("12.5", "9.3")
    assert rows["tf2.18w"]["TF_STACK_PACKAGE"] == "tensorflow[and-cuda]"


@pytest.mark.parametrize("name", sorted(STACKS))
def test_tensorflow_imports_in_each_venv(host, name):
    venv, _root, _runtime, _cudnn, version = STACKS[name]
    out = host.run(f"env -i {venv}/bin/python -c 'import tensorflow as tf; print(tf.__version__)'")
    assert out.rc == 0 and out.stdout.strip() == version, out.stderr[-2000:]


def test_each_cudnn_went_into_its_own_toolkit(host):
    for root, soname, version in (
        ("/usr/local/cuda-11.8", "libcudnn.so.8", "8.6.0"),
        ("/usr/local/cuda-12.5", "libcudnn.so.9", "9.3.0"),
    ):
        assert host.file(f"{root}/lib64/{soname}").linked_to.endswith(f"{soname[:-2]}.{version}")


def test_without_the_binding_the_loader_cache_decides(host):
    """The control case: with the binding turned off, tf2.18's venv finds no CUDA 12 runtime at all,
    since the loader cache serves the default stack (CUDA 11.8) only; the binding is what finds it."""
    out = host.run(f"env -i TF_STACK_BIND=0 {STACKS['tf2.18'][0]}/bin/python -c {shlex.quote(probe('tf2.18'))}")
    assert out.rc != 0 and "libcudart.so.12" in out.stderr, out.stdout + out.stderr
