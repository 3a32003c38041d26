"""gpu_cudnn: cudnn's one look at every toolkit tree, its decision per tree and its layout stop."""

from __future__ import annotations

from ansible_collections.gpu_fleet.tf_hosts.plugins.filter import gpu_cudnn

ROOT = "/usr/local/cuda-11.8"
STACK = {
    "name": "tf211",
    "cuda_toolkit": {"root": ROOT},
    "cudnn": {"version": "8.6.0.163", "short": "8.6.0", "major": "8", "archive": {"file": "cudnn-8.6.0.tar.xz"}},
}
HEADER = "#define CUDNN_MAJOR 8\n#define CUDNN_MINOR {minor}\n#define CUDNN_PATCHLEVEL 0\n"


def _look(minor=6, record="8.6.0.163\n", others=(), link="libcudnn.so.8.6.0"):
    paths = gpu_cudnn.tree_paths(STACK)
    return {
        "stat": {paths["library"]: {"exists": True}, paths["soname"]: {"lnk_source": f"{ROOT}/lib64/{link}"}},
        "read": {paths["header"]: HEADER.format(minor=minor) if minor is not None else None, paths["done"]: record},
        "glob": {paths["same_major"]: [f"{ROOT}/lib64/libcudnn.so.8.6.0", *others]},
    }


def test_one_look_covers_every_tree_once():
    look = gpu_cudnn.gpu_cudnn_look([STACK, dict(STACK, name="other")])
    assert look == {
        "stat": [f"{ROOT}/lib64/libcudnn.so.8.6.0", f"{ROOT}/lib64/libcudnn.so.8"],
        "read": [f"{ROOT}/include/cudnn_version.h", f"{ROOT}/.gpu_fleet_cudnn.done"],
        "glob": [f"{ROOT}/lib64/libcudnn*.so.8.*"],
    }


def test_a_converged_tree_takes_no_task():
    assert gpu_cudnn.gpu_cudnn_trees([STACK], _look(), {"cache_files": []}) == {
        "work": [],
        "plan": {ROOT: {"change": False, "text": f"cuDNN 8.6.0 in {ROOT}"}},
    }
    assert gpu_cudnn.gpu_cudnn_trees([STACK], _look(), {"cache_files": None})["work"][0]["installed"] is True


def test_what_is_not_installed_in_full_is_named_in_the_plan():
    def text(look):
        return gpu_cudnn.gpu_cudnn_trees([STACK], look, {"cache_files": []})["plan"][ROOT]["text"]

    assert text(_look(minor=4)) == f"cuDNN 8.4.0 -> 8.6.0 in {ROOT}"
    assert text(_look(record=None)) == f"cuDNN 8.6.0 would be reinstalled (incomplete) into {ROOT}"
    assert text(_look(minor=None)) == f"cuDNN 8.6.0 would be installed into {ROOT}"
    assert not gpu_cudnn.tree_installed(STACK, _look(others=[f"{ROOT}/lib64/libcudnn_ops.so.8.9.7"]))
    assert not gpu_cudnn.tree_installed(STACK, _look(link="libcudnn.so.8.9.7"))


def test_the_layout_stop_names_what_was_found_and_what_is_supported():
    inputs = {"file": "x.tgz", "root": ROOT, "layout": {"form": "legacy .tgz", "supported": "A or B"}}
    assert gpu_cudnn.gpu_cudnn_layout_problem(["/s/b", "/s/a"], ["cuda/include/cudnn_version.h"], inputs) == (
        "x.tgz unpacked to a, b, without cuda/include/cudnn_version.h, where a legacy .tgz archive has them. "
        f"Nothing was copied into {ROOT}. Use NVIDIA's archive under its own name: A or B."
    )
    assert "unpacked to nothing, without a or b," in gpu_cudnn.gpu_cudnn_layout_problem([], ["a", "b"], inputs)
