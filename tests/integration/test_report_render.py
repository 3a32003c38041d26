"""The HTML fleet report renders in headless Chromium: the table is there, each row coloured."""

from __future__ import annotations

import shutil
import subprocess
import sys

from PIL import Image
from sandbox_hosts import ROOT

sys.path.insert(0, str(ROOT / "roles/gpu_verify/files"))

import fleet_report

PASS_RGB, FAIL_RGB = (0xC8, 0xF0, 0xC8), (0xF6, 0xC4, 0xC4)  # fleet_report.HTML_STYLE status cells
CHROMIUM = [
    "chromium",
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _doc(ok: bool) -> dict:
    problems = (
        [] if ok else [{"check": "libcudnn", "cause": "cuDNN 8.5.0 is loaded; TF 2.12 needs 8.6.", "fix": "Rerun."}]
    )
    return {
        "ok": ok,
        "stack": "tf2.12",
        "mode": "gpu",
        "driver_version": "520.61.05",
        "problems": problems,
        "gpus": {"expected": 2, "seen": 2},
        "libraries": {"libcudart": {"version": "11.8"}},
        "fit": {"num_replicas_in_sync": 2, "loss_start": 2.4, "loss_end": 0.6},
    }


def test_html_report_renders_with_table_and_colours(tmp_path):
    assert shutil.which("chromium"), "chromium is missing: make deps installs it"
    page = tmp_path / "fleet-report.html"
    page.write_text(
        fleet_report.format_html(fleet_report.build_report({"gpu01": [_doc(True)], "gpu02": [_doc(False)]}, None))
    )
    profile = [f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*CHROMIUM, *profile, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert '<table id="fleet">' in dom.stdout
    assert dom.stdout.count('<tr class="pass">') == 1 and dom.stdout.count('<tr class="fail">') == 1
    shot = tmp_path / "report.png"
    subprocess.run(
        [*CHROMIUM, *profile, f"--screenshot={shot}", "--window-size=1400,400", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    counts = {rgb: n for n, rgb in colours}
    assert counts.get(PASS_RGB, 0) > 500, "no green PASS cell in the screenshot"
    assert counts.get(FAIL_RGB, 0) > 500, "no red FAIL cell in the screenshot"
