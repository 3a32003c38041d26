"""The sandbox host after site.yml: one behaviour per test (testinfra, podman backend)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shlex
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from ansible_run import latest_report, run_playbook

# Molecule runs ansible-playbook with `-i <ephemeral dir>/inventory` (a folder holding
# ansible_inventory.yml, which the tests get as MOLECULE_INVENTORY_FILE): gpu_verify names the
# report folder after it, so the reports are under <report dir>/inventory/.
MOLECULE_INVENTORY = "inventory"
# The scenario's own report folder (gpu_verify_report_dir in .config/molecule/config.yml).
REPORTS = ROOT / "reports" / "molecule-default"
CUDA = "/usr/local/cuda-11.8"
VENV = "/opt/tensorflow/2.12"


def test_toolkit_tree(host):
    assert host.file(f"{CUDA}/bin/nvcc").is_file
    lib64 = host.file(f"{CUDA}/lib64")
    assert lib64.is_symlink and lib64.linked_to == f"{CUDA}/targets/x86_64-linux/lib"
    version = json.loads(host.file(f"{CUDA}/version.json").content_string)
    assert version["cuda_nvcc"]["version"] == "11.8.89"
    assert version["libcublas"]["version"] == "11.11.3.6"


def test_nvcc_is_nvidias_own(host):
    out = host.run(f"{CUDA}/bin/nvcc --version")
    assert out.rc == 0, out.stderr
    assert "Cuda compilation tools, release 11.8, V11.8.89" in out.stdout
    assert "Build cuda_11.8.r11.8/compiler.31833905_0" in out.stdout


# The toolkit's and cuDNN's libraries on the host are NVIDIA's bytes: those of NVIDIA's wheels
# (tests/fixtures/nvidia/nvidia_files.toml), under the names NVIDIA's runfile and archive give them.
NVIDIA_FILES = {
    "libcudart.so.11.8.89": ("nvidia_cuda_runtime_cu11-11.8.89", "nvidia/cuda_runtime/lib/libcudart.so.11.0"),
    "libcublas.so.11.11.3.6": ("nvidia_cublas_cu11-11.11.3.6", "nvidia/cublas/lib/libcublas.so.11"),
    "libnvrtc.so.11.8.89": ("nvidia_cuda_nvrtc_cu11-11.8.89", "nvidia/cuda_nvrtc/lib/libnvrtc.so.11.2"),
    "libcudnn.so.8.6.0": ("nvidia_cudnn_cu11-8.6.0.163", "nvidia/cudnn/lib/libcudnn.so.8"),
}


def test_the_libraries_are_nvidias_real_files_with_their_soname_links(host):
    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvidia"))
    import nvidia_files

    wheels = {entry.file.split("-py3-")[0]: entry for entry in nvidia_files.load()}
    for name, (wheel, member) in NVIDIA_FILES.items():
        entry = wheels[wheel]
        with zipfile.ZipFile(nvidia_files.fetch([entry])[entry.file]) as archive:
            expected = hashlib.sha256(archive.read(member)).hexdigest()
        assert host.file(f"{CUDA}/lib64/{name}").sha256sum == expected, name
    links = host.run(f"cd {CUDA}/lib64 && readlink libcublas.so libcublas.so.11 libnvrtc.so libnvrtc.so.11.2")
    assert links.stdout.split() == [
        "libcublas.so.11",
        "libcublas.so.11.11.3.6",
        "libnvrtc.so.11.2",
        "libnvrtc.so.11.8.89",
    ]


def test_default_symlink_points_at_default_toolkit(host):
    link = host.file("/usr/local/cuda")
    assert link.is_symlink and link.linked_to == CUDA


def test_cudnn_headers_readable_with_pinned_version(host):
    header = host.file(f"{CUDA}/include/cudnn_version.h")
    assert header.mode & 0o444 == 0o444
    text = header.content_string
    for macro, value in (("MAJOR", 8), ("MINOR", 6), ("PATCHLEVEL", 0)):
        assert f"#define CUDNN_{macro} {value}" in text


def test_cudnn_symlink_chain_and_modes(host):
    lib = f"{CUDA}/lib64"
    assert host.file(f"{lib}/libcudnn.so").linked_to.endswith("/libcudnn.so.8.6.0")
    assert host.run(f"readlink {lib}/libcudnn.so").stdout.strip() == "libcudnn.so.8"
    assert host.run(f"readlink {lib}/libcudnn.so.8").stdout.strip() == "libcudnn.so.8.6.0"
    real = host.file(f"{lib}/libcudnn.so.8.6.0")
    assert real.is_file and not real.is_symlink and real.mode & 0o444 == 0o444


def test_ldconfig_knows_cudnn_without_warnings(host):
    out = host.run("ldconfig 2>&1; ldconfig -p")
    assert "is not a symbolic link" not in out.stdout
    assert f"libcudnn.so.8 (libc6,x86-64) => {CUDA}/lib64/libcudnn.so.8" in out.stdout.replace(
        f"{CUDA}/targets/x86_64-linux/lib", f"{CUDA}/lib64"
    )


def test_ld_so_conf_names_only_the_default_toolkit(host):
    conf = host.file("/etc/ld.so.conf.d/gpu-env.conf")
    assert conf.mode == 0o644
    lines = [line for line in conf.content_string.splitlines() if line and not line.startswith("#")]
    assert lines == [f"{CUDA}/lib64"]


def test_profile_puts_toolkit_on_path(host):
    text = host.file("/etc/profile.d/gpu-env.sh").content_string
    assert f"CUDA_HOME={CUDA}" in text
    assert host.run("bash -lc 'command -v nvcc'").stdout.strip() == f"{CUDA}/bin/nvcc"


def test_login_shell_finds_nvcc_11_8(host):
    out = host.run("bash -lc 'nvcc --version'")
    assert out.rc == 0 and "release 11.8, V11.8.89" in out.stdout


def test_sudo_finds_nvcc_11_8(host):
    out = host.run("sudo nvcc --version")
    assert out.rc == 0 and "release 11.8, V11.8.89" in out.stdout


def test_empty_environment_loads_cudnn_and_cudart(host):
    # The runtime starts the driver first: 100 (cudaErrorNoDevice) says it found the driver's libcuda.so.1
    # (35 without one) and the sandbox has no GPU, as NVIDIA's runtime answers; it then gives no version.
    code = (
        "import ctypes;"
        "d=ctypes.CDLL('libcudnn.so.8'); d.cudnnGetVersion.restype=ctypes.c_size_t;"
        "r=ctypes.CDLL('libcudart.so.11.0'); v=ctypes.c_int();"
        "print(d.cudnnGetVersion(), r.cudaRuntimeGetVersion(ctypes.byref(v)))"
    )
    out = host.run(f'env -i {VENV}/bin/python -c "{code}"')
    assert out.rc == 0, out.stderr
    assert out.stdout.split() == ["8600", "100"]


# The stack's own interpreter binds itself (tf_venv's tf_stack.pth): in each context the loader path
# starts with the stack's lib64 and the libraries come from there.
BOUND_PROBE = (
    "import ctypes, os; ctypes.CDLL('libcudnn.so.8'); ctypes.CDLL('libcudart.so.11.0');"
    "print(os.environ['LD_LIBRARY_PATH'].split(':')[0]);"
    "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcud' in l}))"
)
PROBE_ARG = shlex.quote(BOUND_PROBE)
CONTEXTS = {
    "direct": f"{VENV}/bin/python -c {PROBE_ARG}",
    "cron-like empty environment": f"env -i {VENV}/bin/python -c {PROBE_ARG}",
    "sudo to another user": f"sudo -u nobody {VENV}/bin/python -c {PROBE_ARG}",
    "activated shell": "sh -c " + shlex.quote(f". {VENV}/bin/activate && python -c {PROBE_ARG}"),
    "tf-stack run": f"tf-stack run tf2.12 -- python -c {PROBE_ARG}",
}


def test_each_context_binds_the_venv_to_its_stack(host):
    for context, command in CONTEXTS.items():
        out = host.run(command)
        assert out.rc == 0, (context, out.stderr)
        first, files = out.stdout.splitlines()
        assert first == f"{CUDA}/lib64", context
        paths = ast.literal_eval(files)
        assert len(paths) == 2 and all(path.startswith(f"{CUDA}/") for path in paths), (context, paths)


def test_tf_stack_lists_the_stack_as_default_and_healthy(host):
    out = host.run("tf-stack list")
    assert out.rc == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[1].split() == [
        "*",
        "tf2.12",
        "2.12.1",
        host.run(f"{VENV}/bin/python -c 'import platform; print(platform.python_version())'").stdout.strip(),
        "11.8.0",
        "8.6.0.163",
        VENV,
        "ok",
    ]
    assert host.file("/etc/tf-stacks/tf2.12.env").linked_to == f"{VENV}/tf-stack.env"


def test_tf_stack_probe_loads_the_stack_libraries(host):
    out = host.run("tf-stack probe tf2.12")
    assert out.rc == 0, out.stderr
    found = json.loads(out.stdout)
    # NVIDIA's real runtime without a GPU: no version, its own error name; the file is 11.8.89's.
    assert (found["cudaRuntimeGetVersion"], found["cudaRuntimeGetVersion_error"]) == (None, "100 (cudaErrorNoDevice)")
    assert found["cudnnGetVersion"] == 8600
    assert f"{CUDA}/targets/x86_64-linux/lib/libcudart.so.11.8.89" in found["files"]
    # The runtime opened the driver's libcuda.so.1 itself; every toolkit file is the stack's.
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05" in found["files"]
    assert all(path.startswith(f"{CUDA}/") for path in found["files"] if "/libcuda.so" not in path)


def test_venv_has_pinned_tensorflow_gpu_build(host):
    out = host.run(f"{VENV}/bin/python -c \"import importlib.metadata as m; print(m.version('tensorflow'))\"")
    assert out.stdout.strip() == "2.12.1"
    assert host.run(f"{VENV}/bin/python -c \"import importlib.metadata as m; m.version('tensorflow-cpu')\"").rc != 0


def test_venv_pip_trusts_the_given_ca_bundle(host):
    assert f"cert = {VENV}/pip-ca-bundle.pem" in host.file(f"{VENV}/pip.conf").content_string
    assert host.file(f"{VENV}/pip-ca-bundle.pem").is_file


def test_driver_user_space_installed_and_kernel_steps_skipped(host):
    assert host.file("/usr/lib/x86_64-linux-gnu/libcuda.so.520.61.05").is_file
    assert not host.file("/etc/modprobe.d/blacklist-nouveau.conf").exists
    assert len(host.run("nvidia-smi -L").stdout.strip().splitlines()) == 2


def test_installers_removed_from_host_cache(host):
    out = host.run("find /var/cache/gpu-artifacts -type f")
    assert out.stdout.strip() == ""


def test_report_json_fields():
    report = json.loads(latest_report(REPORTS, MOLECULE_INVENTORY).read_text())
    entry = next(iter(report["hosts"].values()))
    assert entry["status"] == "PASS"
    doc = entry["results"][0]
    assert doc["ok"] is True
    assert doc["driver_version"] == "520.61.05"
    # Read from NVIDIA's real libraries: cuDNN answers cudnnGetVersion without a GPU; the runtime
    # answers 100 (no device), so its release comes from the real file's name, and the report says so.
    cudart, cudnn = doc["libraries"]["libcudart"], doc["libraries"]["libcudnn"]
    assert (cudart["version"], cudart["release"], cudart["version_source"]) == ("11.8", "11.8.89", "file name")
    assert cudart["call_error"].startswith("cudaRuntimeGetVersion returned 100 (cudaErrorNoDevice")
    assert "reinstall" not in json.dumps(doc["problems"])
    assert (cudnn["raw"], cudnn["version"], cudnn["release"]) == (8600, "8.6.0", "8.6.0")
    assert cudnn["path"] == f"{CUDA}/targets/x86_64-linux/lib/libcudnn.so.8.6.0"
    # TensorFlow's GPU build, built for the stack's CUDA and cuDNN, finding no GPU.
    tensorflow = doc["tensorflow"]
    assert (tensorflow["version"], tensorflow["is_cuda_build"], tensorflow["gpus"]) == ("2.12.1", True, 0)
    assert (tensorflow["build_info"]["cuda_version"], tensorflow["build_info"]["cudnn_version"]) == ("11.8", "8")
    assert "not on GPUs" in doc["mode_note"]
    assert (doc["gpus"]["expected"], doc["gpus"]["seen"]) == (2, 2)
    assert doc["fit"]["num_replicas_in_sync"] == 2
    assert doc["fit"]["loss_end"] < doc["fit"]["loss_start"]
    assert doc["mode"] == "cpu-replicas"
    assert doc["disk_used_bytes"][CUDA] > 0 and doc["disk_used_bytes"][VENV] > 100 * 1024**2
    assert report["summary"]["failed"] == 0


def test_report_for_people_and_ci_dashboards():
    assert '<tr class="pass">' in latest_report(REPORTS, MOLECULE_INVENTORY, "fleet-report.html").read_text()
    text = latest_report(REPORTS, MOLECULE_INVENTORY, "fleet-report.md").read_text()
    assert f"libcudart 11.8.89 {CUDA}/targets/x86_64-linux/lib/libcudart.so.11.8.89" in text
    assert f"libcudnn 8.6.0 {CUDA}/targets/x86_64-linux/lib/libcudnn.so.8.6.0" in text
    assert "TensorFlow 2.12.1: GPU build for CUDA 11.8 and cuDNN 8; it sees 0 GPUs" in text
    assert "fit ran on 2 logical CPU devices (--cpu-replicas 2), not on GPUs" in text
    junit = latest_report(REPORTS, MOLECULE_INVENTORY, "fleet-report.junit.xml").read_text()
    assert 'failures="0"' in junit and 'name="fit"' in junit


def test_the_health_check_runs_and_the_verified_host_is_its_baseline(host):
    assert host.file("/etc/systemd/system/gpu-health.timer").contains("OnUnitInactiveSec=5min")
    baseline = json.loads(host.file("/var/lib/gpu-health/baseline.json").content_string)
    assert (baseline["expected_gpus"], baseline["driver_version"]) == (2, "520.61.05")
    assert set(baseline["stacks"]) == {"tf2.12"} and len(baseline["gpus"]) == 2
    # The idempotence run judged the host against the converge run's baseline: healthy, in its report.
    report = json.loads(latest_report(REPORTS, MOLECULE_INVENTORY).read_text())
    assert next(iter(report["hosts"].values()))["health"]["status"] == "healthy"
    done = host.run("gpu-health --format json")
    assert done.rc == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["findings"] == []
    assert host.file("/var/lib/prometheus/node-exporter/gpu_fleet_verification.prom").contains(
        "^gpu_fleet_verification_passed 1$"
    )


def test_more_gpus_expected_than_seen_fails_verification(tmp_path):
    """playbooks/verify.yml on its own, with the inventory expecting 3 GPUs on a 2-GPU host."""
    out = run_playbook(
        "playbooks/verify.yml",
        os.environ["MOLECULE_INVENTORY_FILE"],
        "-e",
        "gpu_verify_expected_gpu_count=3",
        "-e",
        f"gpu_verify_report_dir={tmp_path}",
    )
    assert out.returncode != 0
    assert "Expected 3 GPUs, nvidia-smi sees 2 (1 missing)" in out.stdout
    report = json.loads(latest_report(tmp_path, MOLECULE_INVENTORY).read_text())
    assert report["summary"]["failed"] == 1


def test_check_on_the_fresh_host_wrote_the_plan_of_what_converge_then_did():
    """Molecule's check step ran site.yml --check on the fresh host before converge: its plan names
    each phase's change, and it is written beside the reports, not as one (plans/latest)."""
    plan = json.loads((REPORTS / MOLECULE_INVENTORY / "plans" / "latest" / "plan.json").read_text())
    host = plan["hosts"]["molecule-gpu-default"]
    lines = {p["phase"]: p["line"] for p in host["phases"]}
    assert list(lines) == ["driver", "CUDA", "cuDNN", "environment", "TensorFlow"]
    assert (
        lines["driver"] == "driver 520.61.05 would be installed (runfile)"
    )  # a container: no kernel module, no reboot
    assert lines["CUDA"].startswith(f"CUDA 11.8.0 would be installed in {CUDA}; /usr/local/cuda would point at {CUDA}")
    assert lines["cuDNN"] == f"cuDNN 8.6.0 would be installed into {CUDA}"
    assert "/etc/profile.d/gpu-env.sh" in lines["environment"] and lines["environment"].endswith("would be written")
    assert lines["TensorFlow"] == f"venv tf2.12 would be created in {VENV} (TensorFlow 2.12.1)"
    assert host["changes"] == 5 and plan["summary"]["would_change"] == 1
    markdown = (REPORTS / MOLECULE_INVENTORY / "plans" / "latest" / "plan.md").read_text()
    assert f"| molecule-gpu-default | cuDNN | cuDNN 8.6.0 would be installed into {CUDA} |" in markdown


def test_check_on_the_provisioned_host_plans_only_the_drift_and_leaves_host_and_reports_alone(host, tmp_path):
    """site.yml --check on the converged host with /usr/local/cuda moved: the plan names that one change,
    every other phase has nothing to do; the read-only checks see the host as it is and fail the default
    stack's pointer check; the link stays moved, the previous report and latest stay."""
    old = tmp_path / MOLECULE_INVENTORY / "20260101T000000Z"
    old.mkdir(parents=True)
    (old / "fleet-report.json").write_text("{}")
    (tmp_path / MOLECULE_INVENTORY / "latest").symlink_to(old.name)
    assert host.run("ln -sfn /opt /usr/local/cuda").rc == 0
    try:
        run = run_playbook(
            "site.yml", os.environ["MOLECULE_INVENTORY_FILE"], "--check", "-e", f"gpu_verify_report_dir={tmp_path}"
        )
        assert host.file("/usr/local/cuda").linked_to == "/opt"
    finally:
        host.run(f"ln -sfn {CUDA} /usr/local/cuda")
    assert run.returncode != 0, run.stdout[-4000:]
    assert f"/usr/local/cuda points at /opt, not at the default stack's toolkit {CUDA}." in run.stdout
    plan = json.loads((tmp_path / MOLECULE_INVENTORY / "plans" / "latest" / "plan.json").read_text())
    phases = plan["hosts"]["molecule-gpu-default"]["phases"]
    assert [p["line"] for p in phases if p["change"]] == [f"/usr/local/cuda would point at {CUDA}"]
    assert {p["phase"]: p["line"] for p in phases}[
        "TensorFlow"
    ] == "nothing to do (venv tf2.12 current (TensorFlow 2.12.1, locked))"
    assert f"/usr/local/cuda would point at {CUDA}" in run.stdout  # printed at the end of the run
    assert sorted(p.name for p in (tmp_path / MOLECULE_INVENTORY).iterdir()) == ["20260101T000000Z", "latest", "plans"]
    assert os.readlink(tmp_path / MOLECULE_INVENTORY / "latest") == "20260101T000000Z"
