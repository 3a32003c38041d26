"""Two stacks on one host after site.yml (testinfra, podman backend): each venv loads its own
toolkit's libcudart.so.11.0 and libcudnn.so.8 in every context, though the loader cache serves the
default stack only; tf-stack lists both."""

from __future__ import annotations

import json
import shlex

import pytest

STACKS = {  # name: (venv, toolkit, cudaRuntimeGetVersion, cudnnGetVersion)
    "tf2.12": ("/opt/tensorflow/2.12", "/usr/local/cuda-11.8", 11080, 8600),
    "tf2.12-cu117": ("/opt/tensorflow/2.12-cu117", "/usr/local/cuda-11.7", 11070, 8907),
}
PROBE = (
    "import ctypes, json; rt = ctypes.CDLL('libcudart.so.11.0'); v = ctypes.c_int();"
    "rt.cudaRuntimeGetVersion(ctypes.byref(v)); dnn = ctypes.CDLL('libcudnn.so.8');"
    "dnn.cudnnGetVersion.restype = ctypes.c_size_t; ctypes.CDLL('libcudnn_ops_infer.so.8');"
    "print(json.dumps([v.value, dnn.cudnnGetVersion(),"
    " sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcud' in l})]))"
)
ARG = shlex.quote(PROBE)
CONTEXTS = {  # @venv@, @name@ and @other@ (the other stack's name) are filled in
    "direct": "@venv@/bin/python -c " + ARG,
    "cron-like empty environment": "env -i @venv@/bin/python -c " + ARG,
    "under the other stack's environment": "tf-stack run @other@ -- @venv@/bin/python -c " + ARG,
    "sudo to another user": "sudo -u nobody @venv@/bin/python -c " + ARG,
    "activated shell": "sh -c " + shlex.quote(". @venv@/bin/activate && python -c " + ARG),
    "tf-stack run": "tf-stack run @name@ -- python -c " + ARG,
}


@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("name", sorted(STACKS))
def test_each_venv_loads_its_own_toolkit_in_every_context(host, name, context):
    venv, root, runtime, cudnn = STACKS[name]
    other = next(key for key in STACKS if key != name)
    command = CONTEXTS[context].replace("@venv@", venv).replace("@name@", name).replace("@other@", other)
    out = host.run(command)
    assert out.rc == 0, out.stderr
    found_runtime, found_cudnn, files = json.loads(out.stdout)
    assert (found_runtime, found_cudnn) == (runtime, cudnn)
    assert len(files) == 3 and all(path.startswith(f"{root}/") for path in files), files


def test_the_loader_cache_serves_the_default_stack_only(host):
    cache = host.run("ldconfig -p").stdout
    assert "/usr/local/cuda-11.8/" in cache and "/usr/local/cuda-11.7/" not in cache
    assert host.file("/usr/local/cuda").linked_to == "/usr/local/cuda-11.8"


def test_tf_stack_lists_both_with_the_default_marked(host):
    out = host.run("tf-stack list --json")
    assert out.rc == 0, out.stdout + out.stderr
    listed = json.loads(out.stdout)
    assert listed["default"] == "tf2.12"
    rows = {row["TF_STACK"]: row for row in listed["stacks"]}
    assert sorted(rows) == sorted(STACKS) and all(row["TF_STACK_HEALTH"] == "ok" for row in rows.values())
    assert (rows["tf2.12-cu117"]["TF_STACK_CUDA"], rows["tf2.12-cu117"]["TF_STACK_CUDNN"]) == ("11.7.1", "8.9.7.29")


@pytest.mark.parametrize("name", sorted(STACKS))
def test_tensorflow_imports_in_each_venv(host, name):
    out = host.run(f"env -i {STACKS[name][0]}/bin/python -c 'import tensorflow as tf; print(tf.__version__)'")
    assert out.rc == 0 and out.stdout.strip() == "2.12.1", out.stderr[-2000:]


def test_each_cudnn_went_into_its_own_toolkit(host):
    for root, version in (("/usr/local/cuda-11.8", "8.6.0"), ("/usr/local/cuda-11.7", "8.9.7")):
        assert host.file(f"{root}/lib64/libcudnn.so.8").linked_to.endswith(f"libcudnn.so.{version}")


def test_without_the_binding_the_loader_cache_decides(host):
    """The control case: with the binding turned off, the second stack's venv loads the default
    stack's CUDA 11.8 and cuDNN 8.6 from the loader cache, the mix the binding prevents."""
    out = host.run(f"env -i TF_STACK_BIND=0 {STACKS['tf2.12-cu117'][0]}/bin/python -c {ARG}")
    assert out.rc == 0, out.stderr
    found_runtime, found_cudnn, files = json.loads(out.stdout)
    assert (found_runtime, found_cudnn) == (11080, 8600)
    assert all(path.startswith("/usr/local/cuda-11.8/") for path in files), files
