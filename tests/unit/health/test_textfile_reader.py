"""Whether a node_exporter on the host reads the health metrics' folder (gpu_health_checks.textfile_note): read
from a /proc of made-up processes; the check says so in its report's notes, never as a finding."""

from __future__ import annotations

from pathlib import Path

import gpu_health_checks as checks
import pytest

TEXTFILE = "/var/lib/prometheus/node-exporter/gpu_fleet_health.prom"


def fake_proc(root: Path, *commands: list[str]) -> str:
    """A /proc with one process per command line (``cmdline``: arguments each ended by a NUL) and pid 1, init."""
    for pid, argv in enumerate([["/sbin/init"], *commands], start=1):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in argv))
    (root / "self").mkdir()
    return str(root)


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/bin/prometheus-node-exporter"],  # Debian's build reads this folder by default
        ["/usr/local/bin/node_exporter", "--collector.textfile.directory=/var/lib/prometheus/node-exporter"],
        ["node_exporter", "--collector.textfile.directory", "/var/lib/prometheus/node-exporter/"],
        [
            "node_exporter",
            "--collector.disable-defaults",
            "--collector.textfile",
            "--collector.textfile.directory=/tmp,/var/lib/prometheus/node-exporter",
        ],
    ],
)
def test_a_node_exporter_that_reads_the_folder_leaves_no_note(tmp_path: Path, argv: list[str]) -> None:
    assert checks.textfile_note(TEXTFILE, fake_proc(tmp_path, argv)) is None


def test_no_node_exporter_is_named_with_the_folder_and_the_fix(tmp_path: Path) -> None:
    note = checks.textfile_note(TEXTFILE, fake_proc(tmp_path, ["/usr/sbin/sshd", "-D"]))
    assert note is not None
    assert note["cause"] == (
        f"The health metrics go to {TEXTFILE}, but no node_exporter runs on this host: no Prometheus sees them."
    )
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in note["fix"]
    assert "gpu_health_textfile_dir" in note["fix"] and "prometheus-node-exporter" in note["fix"]


@pytest.mark.parametrize(
    ("argv", "reads"),
    [
        (["/opt/node_exporter", "--collector.textfile.directory=/srv/textfiles"], "/srv/textfiles"),
        (["/opt/node_exporter"], "no textfile folder"),  # upstream's build reads none unless told
        (["/usr/bin/prometheus-node-exporter", "--no-collector.textfile"], "no textfile folder"),
        (
            [
                "node_exporter",
                "--collector.disable-defaults",
                "--collector.textfile.directory=/var/lib/prometheus/node-exporter",
            ],
            "no textfile folder",
        ),
    ],
)
def test_a_node_exporter_that_reads_elsewhere_is_named(tmp_path: Path, argv: list[str], reads: str) -> None:
    note = checks.textfile_note(TEXTFILE, fake_proc(tmp_path, argv))
    assert note is not None, argv
    assert (
        f"no node_exporter on this host reads that folder ({Path(argv[0]).name} (pid 2) reads {reads})" in note["cause"]
    )


def test_no_textfile_no_note(tmp_path: Path) -> None:
    assert checks.textfile_note(None, fake_proc(tmp_path)) is None
