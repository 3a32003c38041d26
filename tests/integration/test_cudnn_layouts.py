"""cuDNN from NVIDIA's older tar archive form, and an archive whose contents match neither form.

NVIDIA's older cuDNN archives are ``cudnn-<CUDA X.Y>-linux-x64-v<version>.tgz`` holding
``cuda/include`` and ``cuda/lib64``; later ones ``cudnn-linux-x86_64-<version>_cuda<M>-archive.tar.xz``
holding ``<name>/include`` and ``<name>/lib`` (NVIDIA cuDNN Installation Guide, "Tar File
Installation"). One fresh sandbox host, only the phases up to cuDNN (``--tags preflight,cuda``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ansible_run import failures
from sandbox_hosts import ROOT, SMALL_STANDINS, site

LEGACY = "cudnn-11.8-linux-x64-v8.6.0.163.tgz"
CURRENT = "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"
TREE = "/usr/local/cuda-11.8"


def _exec(name: str, command: str) -> str:
    return subprocess.run(["podman", "exec", name, "sh", "-c", command], capture_output=True, text=True).stdout


def _artifacts_with(tmp_path: Path, *, legacy_contents: str) -> Path:
    """A copy of the stand-ins whose only cuDNN archive is LEGACY: built by the stand-in builder
    (``legacy_contents="legacy"``) or the current-form archive under the older name ("current")."""
    artifacts = tmp_path / legacy_contents
    shutil.copytree(SMALL_STANDINS, artifacts, symlinks=True)
    builder = ROOT / "tests/fixtures/nvidia/build_standins.py"
    subprocess.run(
        [sys.executable, str(builder), "--out", str(artifacts), "--cudnn", "8.6.0.163:11:legacy"],
        check=True,
        capture_output=True,
    )
    if legacy_contents == "current":
        # A gzip-compressed tar under the older name, holding the current form's folders.
        tar = subprocess.run(["xz", "-dc", str(artifacts / CURRENT)], check=True, capture_output=True).stdout
        gz = subprocess.run(["gzip", "-n", "-c"], input=tar, check=True, capture_output=True).stdout
        (artifacts / LEGACY).write_bytes(gz)
        digest = subprocess.run(["sha256sum", str(artifacts / LEGACY)], capture_output=True, text=True)
        text = (artifacts / "artifacts.yml").read_text()
        entry = text[text.index(f"  {LEGACY}:") :]
        old = entry[entry.index('sha256: "') + 9 :][:64]
        (artifacts / "artifacts.yml").write_text(text.replace(old, digest.stdout.split()[0]))
    return artifacts


def _pin_digest(artifacts: Path, file: str) -> None:
    """The stand-ins' manifest pins ``file`` as it now is."""
    digest = subprocess.run(["sha256sum", str(artifacts / file)], capture_output=True, text=True).stdout.split()[0]
    text = (artifacts / "artifacts.yml").read_text()
    entry = text[text.index(f"  {file}:") :]
    old = entry[entry.index('sha256: "') + 9 :][:64]
    (artifacts / "artifacts.yml").write_text(text.replace(old, digest))


def _artifacts_with_copies(tmp_path: Path) -> Path:
    """The current-form archive repacked with its symbolic links stored as copies (``tar -h``), as a
    repack or a zip round trip leaves it."""
    artifacts = tmp_path / "copies"
    shutil.copytree(SMALL_STANDINS, artifacts, symlinks=True)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xJf", str(artifacts / CURRENT), "-C", str(unpacked)], check=True)
    (artifacts / CURRENT).unlink()
    top = CURRENT.removesuffix(".tar.xz")
    subprocess.run(["tar", "-cJhf", str(artifacts / CURRENT), "-C", str(unpacked), top], check=True)
    listing = subprocess.run(["tar", "-tvJf", str(artifacts / CURRENT)], capture_output=True, text=True).stdout
    assert "libcudnn.so.8 ->" not in listing and "/libcudnn.so.8\n" in listing + "\n"  # a copy, no link
    _pin_digest(artifacts, CURRENT)
    return artifacts


def _run(inventory: Path, artifacts: Path) -> subprocess.CompletedProcess:
    # Only this manifest: the built-in one lists the current-form 8.6.0.163 archive (without a sha256).
    extra = {
        "gpu_artifacts_controller_dir": str(artifacts),
        "gpu_preflight_manifest_files": [],
        "gpu_preflight_manifest_overlays": [str(artifacts / "artifacts.yml")],
    }
    return site(inventory, "--tags", "preflight,cuda", "-e", json.dumps(extra))


def test_older_tgz_archive_installs_and_other_contents_stop_before_copying(fresh_host, tmp_path):
    """Then, on the same host with cuDNN taken out again, an archive whose library links are copies
    (ldconfig refuses such copies, and the look sees no soname link): the chain is made again at install,
    and a second run does not install again."""
    name, inventory = fresh_host

    wrong = _run(inventory, _artifacts_with(tmp_path, legacy_contents="current"))
    assert wrong.returncode != 0
    assert (
        f"{LEGACY} unpacked to {CURRENT.removesuffix('.tar.xz')}, without cuda/include/cudnn_version.h or "
        f"cuda/lib64/libcudnn.so.8, where a cudnn-<CUDA X.Y>-linux-x64-v<version>.tgz archive has them. "
        f"Nothing was copied into {TREE}. Use NVIDIA's archive under its own name: "
    ) in wrong.stdout, failures(wrong.stdout)
    assert _exec(name, f"ls {TREE}/include/cudnn*.h {TREE}/lib64/libcudnn* 2>/dev/null") == ""
    assert _exec(name, "find /var/cache/gpu-artifacts/cudnn /var/tmp/cudnn-staging ! -type d 2>/dev/null") == ""

    good = _run(inventory, _artifacts_with(tmp_path, legacy_contents="legacy"))
    assert good.returncode == 0, good.stdout[-3000:]
    assert "CUDNN_MINOR 6" in _exec(name, f"grep CUDNN_MINOR {TREE}/include/cudnn_version.h")
    assert _exec(name, f"readlink {TREE}/lib64/libcudnn.so.8").strip() == "libcudnn.so.8.6.0"
    assert _exec(name, f"ls -d {TREE}/cuda {TREE}/lib64/lib64 2>/dev/null") == ""
    loader = _exec(name, "ldconfig -p | grep 'libcudnn.so.8 '")
    assert f"=> {TREE}/lib64/libcudnn.so.8" in loader
    assert _exec(name, f"ls /var/cache/gpu-artifacts/cudnn/8.6.0.163/{LEGACY} 2>/dev/null") == ""

    _exec(name, f"rm -f {TREE}/lib64/libcudnn* {TREE}/include/cudnn*.h {TREE}/.gpu_fleet_cudnn.done && ldconfig")
    copies = _artifacts_with_copies(tmp_path)
    first = _run(inventory, copies)
    assert first.returncode == 0, first.stdout[-3000:]
    assert _exec(name, f"readlink {TREE}/lib64/libcudnn.so.8").strip() == "libcudnn.so.8.6.0"
    assert _exec(name, f"readlink {TREE}/lib64/libcudnn.so").strip() == "libcudnn.so.8"
    assert _exec(name, f"readlink {TREE}/lib64/libcudnn_ops_infer.so.8").strip() == "libcudnn_ops_infer.so.8.6.0"
    assert f"=> {TREE}/lib64/libcudnn.so.8" in _exec(name, "ldconfig -p | grep 'libcudnn.so.8 '")
    second = _run(inventory, copies)
    assert second.returncode == 0, second.stdout[-3000:]
    assert "TASK [gpu_fleet.tf_hosts.cudnn : Copy headers and libraries into" not in second.stdout
