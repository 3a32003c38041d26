"""Behaviour of the NVIDIA stand-ins built by tests/fixtures/nvidia/build_standins.py."""

from __future__ import annotations

import ctypes
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import NvidiaSmiStandin

DRIVER = "NVIDIA-Linux-x86_64-520.61.05.run"
CUDA = "cuda_11.8.0_520.61.05_linux.run"
CUDNN = "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"
BUILDER = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia" / "build_standins.py"


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """An empty fake system root for NVIDIA_STANDIN_ROOT."""
    path = tmp_path / "root"
    path.mkdir()
    return path


def run_runfile(
    runfile: Path, *args: str, root: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sh <runfile> <args>`` as Ansible runs it, with system paths under root."""
    base = dict(os.environ if env is None else env)
    base["NVIDIA_STANDIN_ROOT"] = str(root)
    base["TMPDIR"] = str(root.parent)
    return subprocess.run(
        ["sh", str(runfile), *args],
        env=base,
        capture_output=True,
        text=True,
        check=False,
    )


def path_without(tmp_path: Path, *hidden: str) -> str:
    """A PATH holding links to every tool in /usr/bin and /bin except those starting with hidden."""
    bindir = tmp_path / "bin-without"
    bindir.mkdir(exist_ok=True)
    for source in (Path("/usr/bin"), Path("/bin")):
        for tool in source.iterdir():
            link = bindir / tool.name
            if not tool.name.startswith(hidden) and not link.exists():
                link.symlink_to(tool)
    python = bindir / "python3"
    if python.is_symlink():
        python.unlink()
    python.symlink_to(sys.executable)
    return str(bindir)


# -- runfiles: option handling ---------------------------------------------------


@pytest.mark.parametrize("runfile", [DRIVER, CUDA])
def test_runfiles_reject_an_unknown_option(standins_dir: Path, root: Path, runfile: str) -> None:
    proc = run_runfile(standins_dir / runfile, "--silent", "--frobnicate", root=root)
    assert proc.returncode == 1
    assert "--frobnicate" in proc.stderr


def test_driver_runfile_requires_silent(standins_dir: Path, root: Path) -> None:
    proc = run_runfile(standins_dir / DRIVER, "--no-kernel-modules", root=root)
    assert proc.returncode == 1
    assert "--silent" in proc.stderr
    assert not (root / "usr").exists()


def test_driver_runfile_without_kernel_tree_gives_the_real_error(standins_dir: Path, root: Path) -> None:
    proc = run_runfile(standins_dir / DRIVER, "--silent", "--dkms", root=root)
    assert proc.returncode == 1
    assert "ERROR: Unable to find the kernel source tree for the currently running kernel." in proc.stderr
    log = (root / "var/log/nvidia-installer.log").read_text()
    assert "Unable to find the kernel source tree" in log


def test_driver_runfile_never_fakes_a_kernel_module_build(standins_dir: Path, root: Path) -> None:
    (root / "lib/modules" / os.uname().release / "build").mkdir(parents=True)
    proc = run_runfile(standins_dir / DRIVER, "--silent", root=root)
    assert proc.returncode == 1
    assert "cannot build kernel modules" in proc.stderr
    assert not (root / "usr").exists()


def test_driver_runfile_rejects_a_missing_tmpdir(standins_dir: Path, root: Path) -> None:
    proc = run_runfile(
        standins_dir / DRIVER,
        "--silent",
        "--no-kernel-modules",
        f"--tmpdir={root}/nope",
        root=root,
    )
    assert proc.returncode == 1
    assert "temporary directory" in proc.stderr


def test_driver_userspace_install_then_uninstall(standins_dir: Path, root: Path, tmp_path: Path) -> None:
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    args = (
        "--silent",
        "--no-kernel-modules",
        "--no-questions",
        "-m=kernel-open",
        "--dkms",
        f"--tmpdir={tmp_path}",
    )
    proc = run_runfile(standins_dir / DRIVER, *args, root=root)
    assert proc.returncode == 0, proc.stderr
    libdir = root / "usr/lib/x86_64-linux-gnu"
    assert os.readlink(libdir / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(libdir / "libcuda.so.1") == "libcuda.so.520.61.05"
    assert os.readlink(libdir / "libnvidia-ml.so.1") == "libnvidia-ml.so.520.61.05"
    log = (root / "var/log/nvidia-installer.log").read_text().splitlines()
    assert log[0] == "nvidia-installer log file '/var/log/nvidia-installer.log'"
    assert "nvidia-installer command line:" in log
    assert "    --no-kernel-modules" in log
    version = subprocess.run(
        [str(root / "usr/bin/nvidia-installer"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "nvidia-installer:  version 520.61.05" in version.stdout
    smi = subprocess.run(
        [str(root / "usr/bin/nvidia-smi"), "-L"],
        capture_output=True,
        text=True,
        env=dict(os.environ, NVIDIA_STANDIN_ROOT=str(root)),
        check=False,
    )
    assert smi.stdout.startswith("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-")
    manifest = (root / "var/lib/nvidia-standin/installed-files").read_text().split()
    assert str(libdir / "libcuda.so.520.61.05") in manifest
    assert str(root / "usr/bin/nvidia-smi") in manifest

    env = dict(os.environ, NVIDIA_STANDIN_ROOT=str(root))
    proc = subprocess.run(
        [str(root / "usr/bin/nvidia-uninstall"), "--silent"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert not any(os.path.lexists(path) for path in manifest)


# -- CUDA runfile ----------------------------------------------------------------


def test_cuda_toolkit_install(standins_dir: Path, root: Path, tmp_path: Path) -> None:
    toolkit = tmp_path / "cuda-11.8"
    proc = run_runfile(
        standins_dir / CUDA,
        "--silent",
        "--toolkit",
        f"--toolkitpath={toolkit}",
        "--override",
        "--no-man-page",
        f"--tmpdir={tmp_path}",
        root=root,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nvcc = subprocess.run(
        [str(toolkit / "bin/nvcc"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Cuda compilation tools, release 11.8, V11.8.89" in nvcc.stdout.splitlines()
    assert subprocess.run([str(toolkit / "bin/nvcc"), "x.cu"], capture_output=True, check=False).returncode != 0
    version = json.loads((toolkit / "version.json").read_text())
    assert version["cuda_nvcc"]["version"] == "11.8.89"
    assert version["cuda"]["version"] == "11.8.20220929"
    assert version["nvidia_driver"]["version"] == "520.61.05"
    assert '   "cuda" : {' in (toolkit / "version.json").read_text()
    assert os.readlink(toolkit / "lib64") == "targets/x86_64-linux/lib"
    assert os.readlink(toolkit / "include") == "targets/x86_64-linux/include"
    assert os.readlink(toolkit / "lib64/libcudart.so.11.0") == "libcudart.so.11.8.89"
    assert "#define CUDART_VERSION  11080" in (toolkit / "include/cuda_runtime_api.h").read_text()
    assert (toolkit / "bin/cuda-uninstaller").is_file()
    assert os.readlink(root / "usr/local/cuda") == str(toolkit)
    log = (root / "var/log/cuda-installer.log").read_text().splitlines()
    assert log[-1] == "[INFO]: Complete"
    assert f"Toolkit:  Installed in {toolkit}/" in proc.stdout
    assert "Logfile is /var/log/cuda-installer.log" in proc.stdout
    cudart = ctypes.CDLL(str(toolkit / "lib64/libcudart.so"))
    value = ctypes.c_int()
    assert cudart.cudaRuntimeGetVersion(ctypes.byref(value)) == 0
    assert value.value == 11080

    proc = subprocess.run(
        [str(toolkit / "bin/cuda-uninstaller"), "--silent"],
        capture_output=True,
        text=True,
        env=dict(os.environ, NVIDIA_STANDIN_ROOT=str(root)),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert not toolkit.exists()
    assert not os.path.lexists(root / "usr/local/cuda")


def test_cuda_runfile_without_gcc_fails_like_nvidia(standins_dir: Path, root: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PATH=path_without(tmp_path, "gcc"))
    proc = run_runfile(
        standins_dir / CUDA,
        "--silent",
        "--toolkit",
        f"--toolkitpath={tmp_path}/cuda",
        root=root,
        env=env,
    )
    assert proc.returncode == 1
    assert " Failed to verify gcc version. See log at /var/log/cuda-installer.log for details." in proc.stdout
    assert "[ERROR]: Missing gcc. gcc is required to continue." in (root / "var/log/cuda-installer.log").read_text()
    assert not (tmp_path / "cuda").exists()


def test_cuda_runfile_rejects_an_unusable_tmpdir(standins_dir: Path, root: Path, tmp_path: Path) -> None:
    proc = run_runfile(
        standins_dir / CUDA,
        "--silent",
        "--toolkit",
        "--override",
        f"--tmpdir={tmp_path}/missing",
        f"--toolkitpath={tmp_path}/cuda",
        root=root,
    )
    assert proc.returncode == 1
    assert "An error occurred during extraction. See log at /var/log/cuda-installer.log" in proc.stdout
    assert not (tmp_path / "cuda").exists()


def test_cuda_runfile_silent_needs_a_component(standins_dir: Path, root: Path) -> None:
    proc = run_runfile(standins_dir / CUDA, "--silent", root=root)
    assert proc.returncode == 1
    assert "--toolkit" in proc.stderr


def test_cuda_runfile_extract(standins_dir: Path, root: Path, tmp_path: Path) -> None:
    dest = tmp_path / "extract"
    proc = run_runfile(standins_dir / CUDA, f"--extract={dest}", root=root)
    assert proc.returncode == 0, proc.stderr
    assert (dest / DRIVER).is_file()
    assert json.loads((dest / "version.json").read_text())["cuda_cudart"]["version"] == "11.8.89"
    assert not os.path.lexists(root / "usr/local/cuda")


# -- cuDNN archive ---------------------------------------------------------------


def test_cudnn_archive_layout(standins_dir: Path) -> None:
    top = CUDNN.removesuffix(".tar.xz")
    with tarfile.open(standins_dir / CUDNN) as archive:
        members = {m.name: m for m in archive.getmembers()}
        member = archive.extractfile(f"{top}/include/cudnn_version.h")
        assert member is not None
        version_h = member.read().decode()
    assert f"{top}/LICENSE" in members
    for lib in (
        "libcudnn",
        "libcudnn_adv_infer",
        "libcudnn_cnn_train",
        "libcudnn_ops_infer",
    ):
        assert members[f"{top}/lib/{lib}.so"].issym() and members[f"{top}/lib/{lib}.so"].linkname == f"{lib}.so.8"
        assert (
            members[f"{top}/lib/{lib}.so.8"].issym() and members[f"{top}/lib/{lib}.so.8"].linkname == f"{lib}.so.8.6.0"
        )
        assert members[f"{top}/lib/{lib}.so.8.6.0"].isfile()
    for header in (
        "cudnn.h",
        "cudnn_v8.h",
        "cudnn_version_v8.h",
        "cudnn_backend.h",
        "cudnn_ops_train_v8.h",
    ):
        assert members[f"{top}/include/{header}"].mode == 0o644
    macros = dict(re.findall(r"#define (CUDNN_\w+) (.+)", version_h))
    assert (
        macros["CUDNN_MAJOR"],
        macros["CUDNN_MINOR"],
        macros["CUDNN_PATCHLEVEL"],
    ) == ("8", "6", "0")
    assert macros["CUDNN_VERSION"] == "(CUDNN_MAJOR * 1000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)"


def test_builder_legacy_cudnn_is_the_older_tgz_layout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BUILDER), "--out", str(tmp_path), "--cudnn", "8.6.0.163:11:legacy"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    name = "cudnn-11.8-linux-x64-v8.6.0.163.tgz"
    with tarfile.open(tmp_path / name, "r:gz") as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert {n.split("/")[0] for n in members} == {"cuda"}
    assert members["cuda/include/cudnn_version.h"].isfile()
    assert members["cuda/lib64/libcudnn.so.8"].linkname == "libcudnn.so.8.6.0"
    assert not any(n.startswith("cuda/lib/") for n in members)
    assert f"  {name}:\n    component: cudnn\n" in (tmp_path / "artifacts.yml").read_text()


def test_builder_rejects_an_unknown_cudnn_layout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BUILDER), "--out", str(tmp_path), "--cudnn", "8.6.0.163:11:old"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "VERSION:CUDA_MAJOR[:CUDART][:legacy]" in proc.stderr


@pytest.mark.skipif(
    not shutil.which("ldconfig") and not os.path.exists("/sbin/ldconfig"),
    reason="no ldconfig",
)
def test_cudnn_libraries_are_ldconfig_clean(standins_dir: Path, tmp_path: Path) -> None:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    with tarfile.open(standins_dir / CUDNN) as archive:
        # filter= exists from Python 3.11.4 on; older 3.11 extracts the same way.
        safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
        archive.extractall(tmp_path, **safe)
    libdir = next(tmp_path.glob("*/lib"))
    proc = subprocess.run([ldconfig, "-n", "-v", str(libdir)], capture_output=True, text=True, check=False)
    assert "is not a symbolic link" not in proc.stderr
    # NVIDIA's known pitfall reproduces: copying without -P turns the links into files.
    flat = tmp_path / "flat"
    flat.mkdir()
    for lib in libdir.iterdir():
        shutil.copy(lib, flat / lib.name)
    proc = subprocess.run([ldconfig, "-n", str(flat)], capture_output=True, text=True, check=False)
    assert f"{flat}/libcudnn.so.8 is not a symbolic link" in proc.stderr


# -- shared libraries ------------------------------------------------------------


def test_libraries_report_their_versions(standins_dir: Path) -> None:
    libs = standins_dir / "libs"
    cudnn = ctypes.CDLL(str(libs / "libcudnn.so.8"))
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    cudnn.cudnnGetCudartVersion.restype = ctypes.c_size_t
    assert cudnn.cudnnGetVersion() == 8600
    assert cudnn.cudnnGetCudartVersion() == 11080
    value = ctypes.c_int(-1)
    cudart = ctypes.CDLL(str(libs / "libcudart.so.11.0"))
    assert cudart.cudaRuntimeGetVersion(ctypes.byref(value)) == 0 and value.value == 11080
    assert cudart.cudaDriverGetVersion(ctypes.byref(value)) == 0 and value.value == 0
    cuda = ctypes.CDLL(str(libs / "libcuda.so.1"))
    assert cuda.cuDriverGetVersion(ctypes.byref(value)) == 0 and value.value == 11080
    assert cuda.cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE
    nvml = ctypes.CDLL(str(libs / "libnvidia-ml.so.1"))
    buffer = ctypes.create_string_buffer(80)
    assert nvml.nvmlInit_v2() == 0
    assert nvml.nvmlSystemGetDriverVersion(buffer, 80) == 0 and buffer.value == b"520.61.05"


@pytest.mark.skipif(not shutil.which("readelf"), reason="no readelf")
@pytest.mark.parametrize(
    "name, soname",
    [
        ("libcudnn.so.8.6.0", "libcudnn.so.8"),
        ("libcudart.so.11.8.89", "libcudart.so.11.0"),
        ("libcuda.so.520.61.05", "libcuda.so.1"),
    ],
)
def test_library_sonames(standins_dir: Path, name: str, soname: str) -> None:
    out = subprocess.run(
        ["readelf", "-d", str(standins_dir / "libs" / name)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    assert f"Library soname: [{soname}]" in out


# -- driver packages (apt) -------------------------------------------------------

DEB_VERSIONS = ["520.61.05", "535.104.05"]
DEB_NAMES = [
    "libcuda1",
    "libnvidia-ml1",
    "nvidia-smi",
    "nvidia-driver-cuda",
    "nvidia-kernel-dkms",
    "nvidia-kernel-open-dkms",
]
LIBDIR = "./usr/lib/x86_64-linux-gnu"
needs_dpkg_deb = pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="no dpkg-deb")


def deb_path(apt: Path, name: str, driver: str) -> Path:
    """The .deb of package name at driver's version; fabricmanager means nvidia-fabricmanager-<branch>."""
    if name == "fabricmanager":
        name = f"nvidia-fabricmanager-{driver.split('.')[0]}"
    return apt / f"{name}_{driver}-1_amd64.deb"


def paragraphs(text: str) -> list[dict[str, str]]:
    """Debian control paragraphs (continuation lines joined with newlines)."""
    found = []
    for block in text.strip("\n").split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith(" "):
                fields[key] += "\n" + line
            else:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        found.append(fields)
    return found


def deb_fields(deb: Path) -> dict[str, str]:
    """The control fields of a .deb, as dpkg-deb reads them."""
    text = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True).stdout
    return paragraphs(text)[0]


def deb_contents(deb: Path) -> dict[str, str]:
    """path -> 'mode owner [-> target]' of every entry of a .deb's data archive (dpkg-deb --contents)."""
    out = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True).stdout
    entries = {}
    for line in out.splitlines():
        mode, owner, _size, date, _time, rest = line.split(None, 5)
        path, _, target = rest.partition(" -> ")
        assert date == "1970-01-01", line
        entries[path] = f"{mode} {owner}" + (f" -> {target}" if target else "")
    return entries


def files_of(deb: Path) -> dict[str, str]:
    """deb_contents without the directories."""
    return {path: entry for path, entry in deb_contents(deb).items() if not entry.startswith("d")}


def extract(deb: Path, dest: Path) -> Path:
    """Unpack a .deb's files into dest (dpkg-deb -x) and return dest."""
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


@pytest.fixture(scope="session")
def apt_dir(standins_dir: Path) -> Path:
    """The flat apt repository the builder writes by default (both driver versions)."""
    path = standins_dir / "apt"
    if not (path / "Packages").exists():
        pytest.skip(f"{path} holds no packages (built with --debs none?)")
    return path


@needs_dpkg_deb
def test_apt_folder_holds_each_package_at_both_versions(apt_dir: Path) -> None:
    expected = {deb_path(apt_dir, name, v).name for v in DEB_VERSIONS for name in [*DEB_NAMES, "fabricmanager"]}
    assert expected | {"Packages", "Packages.gz", "Release"} == {p.name for p in apt_dir.iterdir()}


@needs_dpkg_deb
@pytest.mark.parametrize("driver", DEB_VERSIONS)
@pytest.mark.parametrize("name", [*DEB_NAMES, "fabricmanager"])
def test_driver_package_control_fields(apt_dir: Path, name: str, driver: str) -> None:
    fields = deb_fields(deb_path(apt_dir, name, driver))
    package = f"nvidia-fabricmanager-{driver.split('.')[0]}" if name == "fabricmanager" else name
    assert (fields["Package"], fields["Version"], fields["Architecture"]) == (package, f"{driver}-1", "amd64")
    assert "test stand-in" in fields["Maintainer"] and "not NVIDIA" in fields["Maintainer"]
    assert fields["Description"].splitlines()[0].endswith("(test stand-in)")
    assert "contains no NVIDIA code" in fields["Description"]


@needs_dpkg_deb
@pytest.mark.parametrize("driver", DEB_VERSIONS)
def test_driver_packages_depend_on_their_exact_version(apt_dir: Path, driver: str) -> None:
    version = f"{driver}-1"
    meta = deb_fields(deb_path(apt_dir, "nvidia-driver-cuda", driver))
    assert meta["Depends"] == f"libcuda1 (= {version}), libnvidia-ml1 (= {version}), nvidia-smi (= {version})"
    assert deb_fields(deb_path(apt_dir, "nvidia-smi", driver))["Depends"] == f"libnvidia-ml1 (= {version}), python3"
    closed = deb_fields(deb_path(apt_dir, "nvidia-kernel-dkms", driver))
    opened = deb_fields(deb_path(apt_dir, "nvidia-kernel-open-dkms", driver))
    assert (closed["Depends"], closed["Conflicts"]) == ("dkms", "nvidia-kernel-open-dkms")
    assert (opened["Depends"], opened["Conflicts"]) == ("dkms", "nvidia-kernel-dkms")
    other = "520" if driver.startswith("535") else "535"
    fabric = deb_fields(deb_path(apt_dir, "fabricmanager", driver))
    assert fabric["Conflicts"] == fabric["Replaces"] == f"nvidia-fabricmanager-{other}"


@needs_dpkg_deb
@pytest.mark.parametrize("driver", DEB_VERSIONS)
def test_driver_package_file_lists(apt_dir: Path, driver: str) -> None:
    lib = "-rw-r--r-- root/root"
    link = "lrwxrwxrwx root/root"
    assert files_of(deb_path(apt_dir, "libcuda1", driver)) == {
        f"{LIBDIR}/libcuda.so.{driver}": lib,
        f"{LIBDIR}/libcuda.so.1": f"{link} -> libcuda.so.{driver}",
    }
    assert files_of(deb_path(apt_dir, "libnvidia-ml1", driver)) == {
        f"{LIBDIR}/libnvidia-ml.so.{driver}": lib,
        f"{LIBDIR}/libnvidia-ml.so.1": f"{link} -> libnvidia-ml.so.{driver}",
    }
    assert files_of(deb_path(apt_dir, "nvidia-smi", driver)) == {
        "./usr/bin/nvidia-smi": "-rwxr-xr-x root/root",
        "./usr/share/nvidia-standin/gpus.json": lib,
    }
    assert files_of(deb_path(apt_dir, "nvidia-driver-cuda", driver)) == {}
    for name in ("nvidia-kernel-dkms", "nvidia-kernel-open-dkms"):
        assert list(files_of(deb_path(apt_dir, name, driver))) == [f"./usr/share/doc/{name}/STANDIN-NO-KERNEL-MODULE"]
    assert files_of(deb_path(apt_dir, "fabricmanager", driver)) == {
        "./lib/systemd/system/nvidia-fabricmanager.service": lib,
        "./usr/bin/nv-fabricmanager": "-rwxr-xr-x root/root",
        "./usr/share/nvidia/nvswitch/fabricmanager.cfg": lib,
    }


@needs_dpkg_deb
@pytest.mark.parametrize("driver", DEB_VERSIONS)
def test_packages_of_one_version_share_no_file_and_ship_no_uninstaller(apt_dir: Path, driver: str) -> None:
    seen: dict[str, str] = {}
    for name in [*DEB_NAMES, "fabricmanager"]:
        for path in files_of(deb_path(apt_dir, name, driver)):
            assert path not in seen, f"{path} is in {seen.get(path)} and {name}"
            seen[path] = name
    assert not {"./usr/bin/nvidia-uninstall", "./usr/bin/nvidia-installer"} & set(seen)


@needs_dpkg_deb
def test_library_packages_run_the_ldconfig_trigger_and_nvidia_smi_its_postinst(apt_dir: Path) -> None:
    def control_member(name: str, member: str) -> str:
        deb = deb_path(apt_dir, name, "520.61.05")
        return subprocess.run(["dpkg-deb", "--info", str(deb), member], capture_output=True, text=True).stdout

    assert control_member("libcuda1", "triggers") == "activate-noawait ldconfig\n"
    assert control_member("libnvidia-ml1", "triggers") == "activate-noawait ldconfig\n"
    postinst = control_member("nvidia-smi", "postinst")
    assert "[ ! -e /etc/nvidia-standin/gpus.json ]" in postinst
    assert control_member("nvidia-driver-cuda", "postinst") == ""


@needs_dpkg_deb
def test_packaged_libraries_are_the_runfile_libraries(standins_dir: Path, apt_dir: Path, tmp_path: Path) -> None:
    old = extract(deb_path(apt_dir, "libcuda1", "520.61.05"), tmp_path / "520")
    shipped = old / LIBDIR / "libcuda.so.520.61.05"
    assert shipped.read_bytes() == (standins_dir / "libs/driver-520.61.05/libcuda.so.520.61.05").read_bytes()
    new = extract(deb_path(apt_dir, "libcuda1", "535.104.05"), tmp_path / "535")
    extract(deb_path(apt_dir, "libnvidia-ml1", "535.104.05"), new)
    value = ctypes.c_int(-1)
    cuda = ctypes.CDLL(str(new / LIBDIR / "libcuda.so.1"))
    assert cuda.cuDriverGetVersion(ctypes.byref(value)) == 0 and value.value == 12020
    buffer = ctypes.create_string_buffer(80)
    nvml = ctypes.CDLL(str(new / LIBDIR / "libnvidia-ml.so.1"))
    assert nvml.nvmlSystemGetDriverVersion(buffer, 80) == 0 and buffer.value == b"535.104.05"


@needs_dpkg_deb
@pytest.mark.parametrize("driver", DEB_VERSIONS)
def test_packaged_tools_report_their_driver_version(apt_dir: Path, tmp_path: Path, driver: str) -> None:
    root = extract(deb_path(apt_dir, "nvidia-smi", driver), tmp_path)
    extract(deb_path(apt_dir, "fabricmanager", driver), root)
    smi = subprocess.run([str(root / "usr/bin/nvidia-smi"), "--version"], capture_output=True, text=True)
    assert f"DRIVER version      : {driver}" in smi.stdout.splitlines()
    fabric = root / "usr/bin/nv-fabricmanager"
    version = subprocess.run([str(fabric), "--version"], capture_output=True, text=True)
    assert (version.returncode, version.stdout) == (0, f"Fabric Manager version is : {driver}\n")
    config = str(root / "usr/share/nvidia/nvswitch/fabricmanager.cfg")
    start = subprocess.run([str(fabric), "-c", config], capture_output=True, text=True)
    assert start.returncode == 1 and "no NVSwitch" in start.stderr
    unknown = subprocess.run([str(fabric), "--frobnicate"], capture_output=True, text=True)
    assert unknown.returncode == 1 and "unrecognized option: --frobnicate" in unknown.stderr


@needs_dpkg_deb
def test_apt_index_matches_the_packages(apt_dir: Path) -> None:
    index = paragraphs((apt_dir / "Packages").read_text())
    assert len(index) == 2 * (len(DEB_NAMES) + 1)
    for entry in index:
        deb = apt_dir / entry["Filename"]
        data = deb.read_bytes()
        assert entry["Filename"] == f"./{entry['Package']}_{entry['Version']}_amd64.deb"
        assert int(entry["Size"]) == len(data)
        assert entry["MD5sum"] == hashlib.md5(data).hexdigest()
        assert entry["SHA256"] == hashlib.sha256(data).hexdigest()
        control = {k: v for k, v in entry.items() if k not in ("Filename", "Size", "MD5sum", "SHA256")}
        assert control == deb_fields(deb)
    assert gzip.decompress((apt_dir / "Packages.gz").read_bytes()) == (apt_dir / "Packages").read_bytes()


def test_apt_release_lists_the_indices(apt_dir: Path) -> None:
    release = paragraphs((apt_dir / "Release").read_text())[0]
    assert release["Date"] == "Thu, 01 Jan 1970 00:00:00 UTC"
    assert release["Architectures"] == "amd64"
    for field, algorithm in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        listed = {line.split()[2]: line.split()[:2] for line in release[field].splitlines()[1:]}
        assert set(listed) == {"Packages", "Packages.gz"}
        for name, (digest, size) in listed.items():
            data = (apt_dir / name).read_bytes()
            assert (digest, int(size)) == (hashlib.new(algorithm, data).hexdigest(), len(data))


def tree_digests(folder: Path) -> dict[str, str]:
    """name -> sha256 of every file in folder."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


@needs_dpkg_deb
def test_apt_repository_rebuilds_byte_for_byte(apt_dir: Path, tmp_path: Path) -> None:
    if os.environ.get("NVIDIA_STANDINS_DIR"):
        pytest.skip("prebuilt stand-ins in use")
    out = tmp_path / "elsewhere"
    proc = subprocess.run(
        [sys.executable, str(BUILDER), "--out", str(out), "--debs", ",".join(DEB_VERSIONS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert tree_digests(out / "apt") == tree_digests(apt_dir)


@needs_dpkg_deb
def test_builder_debs_option(tmp_path: Path) -> None:
    def build(out: str, debs: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(BUILDER), "--out", str(tmp_path / out), "--debs", debs]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    assert build("none", "none").returncode == 0
    assert not (tmp_path / "none" / "apt").exists()
    assert build("one", "535.104.05").returncode == 0
    names = {p.name for p in (tmp_path / "one" / "apt").glob("*.deb")}
    assert names == {f"{name}_535.104.05-1_amd64.deb" for name in [*DEB_NAMES, "nvidia-fabricmanager-535"]}
    fabric = deb_fields(tmp_path / "one" / "apt" / "nvidia-fabricmanager-535_535.104.05-1_amd64.deb")
    assert "Conflicts" not in fabric  # no other branch built
    bad = build("bad", "5x,535.104.05")
    assert bad.returncode == 2 and "expected driver versions" in bad.stderr


# -- nvidia-smi ------------------------------------------------------------------


def test_nvidia_smi_lists_gpus(nvidia_smi_standin: NvidiaSmiStandin) -> None:
    proc = nvidia_smi_standin.run("-L")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-89fdc1e1-18b2-f499-c12b-82bcb9bfb3fa)",
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-fd26179c-de1f-3f6f-f298-383b36269b35)",
    ]


def test_nvidia_smi_query_csv(nvidia_smi_standin: NvidiaSmiStandin) -> None:
    proc = nvidia_smi_standin.run(
        "--query-gpu=index,name,memory.total,driver_version,compute_cap,pci.bus_id,"
        "pcie.link.width.current,utilization.gpu,count",
        "--format=csv",
    )
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        (
            "index, name, memory.total [MiB], driver_version, compute_cap, pci.bus_id, "
            "pcie.link.width.current, utilization.gpu [%], count"
        ),
        "0, NVIDIA A100-SXM4-80GB, 81920 MiB, 520.61.05, 8.0, 00000000:07:00.0, 16, 0 %, 2",
        "1, NVIDIA A100-SXM4-80GB, 81920 MiB, 520.61.05, 8.0, 00000000:0F:00.0, 16, 0 %, 2",
    ]
    proc = nvidia_smi_standin.run("--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits")
    assert proc.stdout.splitlines() == ["81920, 81920", "81920, 81920"]


def test_stand_ins_read_by_the_shared_parsers_give_one_bus_id_form(nvidia_smi_standin: NvidiaSmiStandin) -> None:
    """The stand-in prints nvidia-smi's ``00000000:0F:00.0``; lspci prints ``0000:0f:00.0`` (-D) or
    ``0f:00.0``; gpu_parsers turns all of them into ``0000:0f:00.0``."""
    from ansible_collections.gpu_fleet.tf_hosts.plugins.module_utils import gpu_parsers

    fields = ",".join(gpu_parsers.QUERY_FIELDS)
    smi = nvidia_smi_standin.run(f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    assert smi.returncode == 0, smi.stdout
    assert "00000000:0F:00.0" in smi.stdout
    gpus = gpu_parsers.parse_query_gpu(smi.stdout)
    assert [gpu["pci_bus_id"] for gpu in gpus] == ["0000:07:00.0", "0000:0f:00.0"]
    assert {gpu["compute_capability"] for gpu in gpus} == {"8.0"}
    lspci = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia" / "lspci.py"
    env = nvidia_smi_standin.env("2xA100-SXM4-80GB.json")
    for args in (["-nn"], ["-D", "-nn"], ["-D", "-n", "-d", "10de:"]):
        out = subprocess.run([sys.executable, str(lspci), *args], env=env, capture_output=True, text=True, check=True)
        bus_ids = [gpu["pci_bus_id"] for gpu in gpu_parsers.parse_lspci(out.stdout)]
        assert bus_ids == ["0000:07:00.0", "0000:0f:00.0"], args


def test_nvidia_smi_link_width_of_the_rtx_fixture(
    nvidia_smi_standin: NvidiaSmiStandin,
) -> None:
    proc = nvidia_smi_standin.run(
        "--query-gpu=pcie.link.width.current,pcie.link.width.max",
        "--format=csv,noheader",
        description="4xRTX3090-PCIe-x8.json",
    )
    assert proc.stdout.splitlines() == ["16, 16", "16, 16", "8, 16", "8, 16"]


def test_nvidia_smi_omits_a_gpu_that_fell_off_the_bus(
    nvidia_smi_standin: NvidiaSmiStandin,
) -> None:
    proc = nvidia_smi_standin.run(
        "--query-gpu=index,uuid,count",
        "--format=csv,noheader",
        description="2xA100-one-missing.json",
    )
    assert proc.stdout.splitlines() == ["0, GPU-89fdc1e1-18b2-f499-c12b-82bcb9bfb3fa, 1"]


def test_nvidia_smi_unknown_field(nvidia_smi_standin: NvidiaSmiStandin) -> None:
    proc = nvidia_smi_standin.run("--query-gpu=index,bogus.field", "--format=csv")
    assert proc.returncode == 2
    assert 'Field "bogus.field" is not a valid field to query.' in proc.stdout


def test_nvidia_smi_without_a_description_finds_no_gpu(
    nvidia_smi_standin: NvidiaSmiStandin,
) -> None:
    proc = nvidia_smi_standin.run("-L", description=None)
    assert proc.returncode == 6
    assert proc.stdout.strip() == "No devices were found"


def test_nvidia_smi_topology(nvidia_smi_standin: NvidiaSmiStandin) -> None:
    lines = nvidia_smi_standin.run("topo", "-m").stdout.splitlines()
    assert lines[0] == "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    assert lines[1].split("\t")[:3] == ["GPU0", " X ", "NV12"]
    assert lines[2].split("\t")[:3] == ["GPU1", "NV12", " X "]
    assert "Legend:" in lines
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in lines
    rtx = nvidia_smi_standin.run("topo", "-m", description="4xRTX3090-PCIe-x8.json").stdout.splitlines()
    assert rtx[1].split("\t")[1:5] == [" X ", "PHB", "PHB", "PHB"]


def test_nvidia_smi_version_header(nvidia_smi_standin: NvidiaSmiStandin) -> None:
    out = nvidia_smi_standin.run().stdout
    assert "NVIDIA-SMI 520.61.05" in out and "Driver Version: 520.61.05" in out and "CUDA Version: 11.8" in out


# -- builder ---------------------------------------------------------------------


def test_artifacts_manifest_matches_the_files(standins_dir: Path) -> None:
    text = (standins_dir / "artifacts.yml").read_text()
    entries = re.findall(r"^  (\S+):\n((?:    .*\n)+)", text, flags=re.MULTILINE)
    assert [name for name, _ in entries] == [CUDA, DRIVER, CUDNN]
    for name, body in entries:
        fields = dict(re.findall(r"^    (\w+): (.*)$", body, flags=re.MULTILINE))
        data = (standins_dir / name).read_bytes()
        assert fields["sha256"] == f'"{hashlib.sha256(data).hexdigest()}"'
        assert int(fields["size_bytes"]) == len(data)
        assert fields["url"] == "null"
    assert '    bundled_driver: "520.61.05"' in text
    assert "    cuda_major: 11" in text


def test_builder_skips_up_to_date_outputs(standins_dir: Path, tmp_path: Path) -> None:
    if os.environ.get("NVIDIA_STANDINS_DIR"):
        pytest.skip("prebuilt stand-ins in use")
    before = (standins_dir / "artifacts.yml").read_text()
    proc = subprocess.run(
        [sys.executable, str(BUILDER), "--out", str(standins_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("up to date") == 4
    assert "up to date  apt/Packages" in proc.stdout
    assert (standins_dir / "artifacts.yml").read_text() == before


def test_builder_names_the_missing_package(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=path_without(tmp_path, "makeself"))
    proc = subprocess.run(
        [sys.executable, str(BUILDER), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 1
    assert "apt-get install makeself" in proc.stderr


def test_builder_rejects_a_malformed_cuda_spec(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BUILDER), "--out", str(tmp_path), "--cuda", "11.8"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "VERSION:DRIVER:NVCC" in proc.stderr


def test_nvidia_smi_compute_apps_from_the_description(nvidia_smi_standin: NvidiaSmiStandin, tmp_path: Path) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures/nvidia/gpus/2xA100-SXM4-80GB.json"
    data = json.loads(fixture.read_text())
    data["compute_apps"] = [{"pid": 4242, "process_name": "python3", "gpu_uuid": "GPU-x", "used_memory_mib": 30512}]
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps(data))
    query = ("--query-compute-apps=pid,process_name,gpu_uuid,used_memory", "--format=csv,noheader,nounits")
    assert nvidia_smi_standin.run(*query, description=str(busy)).stdout.splitlines() == ["4242, python3, GPU-x, 30512"]
    idle = nvidia_smi_standin.run(*query)
    assert (idle.returncode, idle.stdout) == (0, "")
