"""The HTML fleet report renders in headless Chromium: the table is there, each row coloured, it fits
1400 px, and at 1400 and 1920 px no word of the table is broken inside or runs past its cell."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
from PIL import Image
from sandbox_hosts import ROOT

sys.path.insert(0, str(ROOT / "roles/gpu_verify/files"))

import fleet_report
import report_history

OUTPUT = ROOT / "build" / "test-output"

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
    # the cause beside the status, each word that could break after a character kept on one line
    assert '<b>libcudnn</b>: Cannot load <span class="w">libcudnn.so.8:</span>' in dom.stdout


# Measures, in the page itself, each word (a run of non-space characters) of each header and cell of the
# table: a word whose rendered boxes sit on more than one line is broken inside; a word that reaches past
# its cell's edge overflows it.  The report itself has no scripts; this one is added for the test.
WORDS = """<script>
window.addEventListener('load', () => {
  const broken = [], overflowing = [];
  for (const cell of document.querySelectorAll('#fleet th, #fleet td')) {
    const box = cell.getBoundingClientRect();
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        const tops = new Set(rects.map(r => Math.round(r.top)));
        const where = (cell.className || cell.tagName) + ': ' + match[0];
        if (tops.size > 1) broken.push(where + ' (' + tops.size + ' lines)');
        if (rects.some(r => r.left < box.left - 1 || r.right > box.right + 1)) overflowing.push(where);
      }
    }
  }
  document.body.setAttribute('data-words', JSON.stringify({
    scroll: document.documentElement.scrollWidth, broken: broken, overflowing: overflowing,
    cells: document.querySelectorAll('#fleet td').length}));
});
</script></body>"""

LONG_CAUSE = (
    "It is installed at /usr/local/cuda-11.8/lib64/libcudnn.so.8.6.0, but /usr/local/cuda-11.8/lib64 is not on "
    "the loader path: only /etc/profile.d/gpu-env.sh adds it, and services and cron jobs do not read that file"
)
PCI_NOTE = {"expected": 8, "seen": 8, "pci_bus_ids": None}  # the sandbox has no lspci


def _stack(stack: str, ok: bool = True, **changes: Any) -> dict:
    """One realistic verification document: eight GPUs, every figure filled, no lspci (as in the sandbox)."""
    doc = _doc(ok)
    doc.update(stack=stack, driver_version="535.183.01", gpus=dict(PCI_NOTE), lock={"sha256": "9f2c" * 16, "ok": True})
    doc["libraries"] = {
        "libcuda": {"version": "12.2", "release": "535.183.01", "path": "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
        "libcudart": {"version": "12.2", "release": "12.2.140", "path": "/usr/local/cuda-12.2/lib64/libcudart.so.12"},
        "libcudnn": {"version": "8.9.7", "path": "/usr/local/cuda-12.2/lib64/libcudnn.so.8.9.7"},
    }
    doc["tensorflow"] = {"version": "2.15.1", "is_cuda_build": True, "gpus": 8}
    doc["fit"] = {"ok": ok, "num_replicas_in_sync": 8, "loss_start": 2.4028, "loss_end": 0.5953}
    doc["fit"].update(fit_seconds=1234.56, samples_per_second=123456.7, mixed_precision=True)
    doc["disk_used_bytes"] = {"/usr/local/cuda-12.2": 6 * 1024**3, "/opt/tensorflow/2.15": 3 * 1024**3}
    doc["scaling"] = {"ok": None, "efficiency": 0.87, "note": "not judged on logical CPU devices"}
    doc.update(changes)
    return doc


def _dashboard_report() -> dict[str, Any]:
    """Thirteen hosts as an administrator sees them: passing hosts with two stacks (one the default),
    hosts failing with long causes, one unreachable, one in each GPU health status, and one this run
    left out (its GPUs ran jobs), carried over from the previous report."""
    previous = fleet_report.build_report({"gpu-node-009.cluster.example.org": [_stack("tf2.15")]}, None)
    busy = {"status": "skipped", "reason": "its GPUs ran jobs (3 processes)"}
    current = fleet_report.build_report(_dashboard_results(), "dashboard")
    return report_history.merge(previous, current, None, {"gpu-node-009.cluster.example.org": busy})


def _dashboard_results() -> dict[str, Any]:
    """The run's own twelve hosts of :func:`_dashboard_report`."""
    healthy = {"status": "healthy", "checked_at": "2026-12-07T17:03:12Z", "findings": [], "error": None}
    finding = {"check": "ecc", "bus_id": "00000000:3B:00.0", "cause": "2 uncorrectable ECC errors", "fix": "Drain."}
    unhealthy = dict(healthy, status="unhealthy", findings=[finding, dict(finding, check="xid", bus_id=None)])
    unknown = dict(healthy, status="could not check", error={"cause": "nvidia-smi hung", "fix": "Reboot."})
    results: dict[str, Any] = {}
    for number in range(8):
        first, second = _stack("tf2.15", health=healthy), _stack("tf2.12-legacy-cuda11", health=healthy)
        first["default"] = {"symlink": "/usr/local/cuda", "ok": True}
        results[f"gpu-node-{number:03d}.cluster.example.org"] = [first, second]
    problems = [
        {"check": "libcudnn", "cause": LONG_CAUSE, "fix": "Rerun playbooks/site.yml."},
        {
            "check": "driver",
            "cause": "Driver/library version mismatch: NVML 535.183.01, kernel module 535.104.12",
            "fix": "Reboot the host.",
        },
    ]
    results["gpu-node-010.cluster.example.org"] = [_stack("tf2.15", False, problems=problems, health=unhealthy)]
    results["gpu-node-011.cluster.example.org"] = [_stack("tf2.15", False, problems=problems[:1], health=unknown)]
    results["gpu-node-012.cluster.example.org"] = [_stack("tf2.15", mode="cpu-replicas")]
    results["gpu-node-013.cluster.example.org"] = {
        "unreachable": True,
        "error": "Failed to connect to the host via ssh: ssh: connect to host 10.20.30.13 port 22: "
        "Connection timed out",
    }
    return results


def _words(page, width: int, height: int, shot) -> dict[str, Any]:
    """The WORDS measure of ``page`` in a ``width`` x ``height`` window, and its screenshot at ``shot``."""
    profile = [f"--user-data-dir={page.parent / 'profile'}", f"--window-size={width},{height}"]
    dom = subprocess.run(
        [*CHROMIUM, *profile, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    found = re.search(r"data-words=\"([^\"]+)\"", dom.stdout)
    assert found, dom.stdout[-2000:] + dom.stderr[-2000:]
    subprocess.run([*CHROMIUM, *profile, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.parametrize("width, height", [(1400, 900), (1920, 1080)])
def test_html_report_breaks_no_word_inside_and_shows_each_note_once(tmp_path, width, height):
    assert shutil.which("chromium"), "chromium is missing: make deps installs it"
    page_html = fleet_report.format_html(_dashboard_report())
    page = tmp_path / "fleet-report.html"
    page.write_text(page_html.replace("</body>", WORDS))
    OUTPUT.mkdir(parents=True, exist_ok=True)
    shot = OUTPUT / f"fleet-report-{width}x{height}.png"
    measure = _words(page, width, height, shot)
    assert measure["cells"] == 21 * len(fleet_report.HTML_COLUMNS), measure  # each row was measured
    broken, overflowing = measure["broken"], measure["overflowing"]
    assert not broken, f"{len(broken)} words broken inside at {width} px (see {shot}), e.g. {broken[:12]}"
    assert not overflowing, f"{len(overflowing)} words past their cell at {width} px, e.g. {overflowing[:12]}"
    assert measure["scroll"] <= width, f"the page is {measure['scroll']} px wide at {width}"
    assert Image.open(shot).size == (width, height)
    # The sandbox's PCI note is one line naming its hosts, not one per host and stack.
    assert page_html.count("PCI cross-check skipped") == 1
