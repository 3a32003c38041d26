"""The HTML fleet report renders in headless Chromium: the table is there, each row coloured."""

from __future__ import annotations

import json
import re
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


# Measures the laid-out page in Chromium (the report itself has no scripts): the page's width, and
# for each row the right edge of its status and problems cells.
MEASURE = """<script>
window.addEventListener('load', () => {
  const edges = [...document.querySelectorAll('#fleet tbody tr')].map(tr =>
    Math.ceil(Math.max(tr.querySelector('td.status').getBoundingClientRect().right,
                       tr.querySelector('td.problems').getBoundingClientRect().right)));
  document.body.setAttribute('data-measure', JSON.stringify(
    {scroll: document.documentElement.scrollWidth, edges: edges}));
});
</script></body>"""


def _many_hosts() -> dict:
    """Six rows with long values: two stacks per host, long causes, every figure filled."""
    cause = (
        "Cannot load libcudnn.so.8: not found in /usr/local/cuda-11.8/lib64 or any folder ldconfig -p lists; "
        "the loader looked in /etc/ld.so.conf.d/gpu-env.conf's folders"
    )
    results = {}
    for number in range(3):
        good, bad = _doc(True), _doc(False)
        bad["problems"] = [{"check": "libcudnn", "cause": cause, "fix": "Rerun site.yml."}]
        good["default"] = {"symlink": "/usr/local/cuda", "ok": True}
        for doc, stack in ((good, "tf2.12"), (bad, "tf2.18-with-a-long-name")):
            doc.update(stack=stack, lock={"sha256": "0123456789abcdef" * 4, "ok": True})
            doc["fit"].update(fit_seconds=123.45, samples_per_second=98765.4)
        results[f"gpu-node-{number:03d}.cluster.example.org"] = [good, bad]
    return results


def test_html_report_fits_1400_px_with_each_rows_status_and_causes_visible(tmp_path):
    assert shutil.which("chromium"), "chromium is missing: make deps installs it"
    page = tmp_path / "fleet-report.html"
    html = fleet_report.format_html(fleet_report.build_report(_many_hosts(), None))
    assert html.count('<span class="default">default</span>') == 3  # each host's default stack is marked
    page.write_text(html.replace("</body>", MEASURE))
    dom = subprocess.run(
        [*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"data-measure=\"([^\"]+)\"", dom.stdout)
    assert found, dom.stdout[-2000:]
    measure = json.loads(found.group(1).replace("&quot;", '"'))
    assert measure["scroll"] <= 1400, f"the page is {measure['scroll']} px wide at 1400"
    assert len(measure["edges"]) == 6 and max(measure["edges"]) <= 1400, measure
    assert "<b>libcudnn</b>: Cannot load libcudnn.so.8" in dom.stdout  # the cause beside the status
