"""The monitoring files of the collection (files/monitoring): the Prometheus alerting rules, their
promtool unit tests (tests/monitoring), the Grafana dashboard, and the metrics both read.

- ``promtool check rules`` and ``promtool test rules`` pass; the unit tests assert every alert once on
  a healthy host (silent) and at least once on a fault (firing).
- ``promtool check metrics`` passes on the textfiles that gpu_health.render_metrics writes for a
  healthy, an unhealthy and a could-not-check report, and on a verification textfile written after
  files/monitoring/verification-metrics.yml.
- Every ``gpu_fleet_*`` name that the rules and the dashboard use is a metric gpu_health renders (for a
  report that has every kind of series) or a verification metric of that file.

promtool ("Unit testing for rules",
https://prometheus.io/docs/prometheus/latest/configuration/unit_testing_rules/) is installed by
tools/install-host-deps.sh (``make deps``). Without it these tests are skipped, except under CI (the
CI variable set), where a missing promtool fails them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "files" / "monitoring"
RULES = MONITORING / "prometheus" / "gpu-fleet.rules.yml"
RULES_TEST = ROOT / "tests" / "monitoring" / "gpu-fleet.rules.test.yml"
DASHBOARD = MONITORING / "grafana" / "gpu-fleet-health.json"
VERIFICATION_METRICS = MONITORING / "verification-metrics.yml"
HEALTH_FIXTURES = ROOT / "tests" / "unit" / "health" / "fixtures"

# gpu_health.py imports its parsers by name, as on a host (see tests/unit/health/conftest.py).
for folder in (ROOT / "plugins" / "module_utils", ROOT / "files" / "health"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import gpu_health
from gpu_parsers import parse_health_query, parse_nvlink_status, parse_xid_events

NAME = re.compile(r"gpu_fleet_[a-z_]+")
NOW = 1717171717.25
# The Xid catalog's actions (data/xid.yml) after which the GPU is unusable until acted on.
CRITICAL_XID_ACTIONS = {"reset the GPU", "reboot", "drain and RMA"}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is not installed: `make deps` (tools/install-host-deps.sh) installs it"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI must run these tests)")
        pytest.skip(reason)
    return found


def run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, cwd=ROOT)


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def verification_metrics() -> list[dict[str, Any]]:
    return yaml.safe_load(VERIFICATION_METRICS.read_text(encoding="utf-8"))["metrics"]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


# --- the textfiles ---------------------------------------------------------------------------------


def fixture(name: str) -> str:
    return (HEALTH_FIXTURES / name).read_text(encoding="utf-8")


def health_report(
    query: str, kernel_log: str | None = None, fabric_manager: str | None = "active", pci_readable: bool = True
) -> dict[str, Any]:
    """A report of gpu_health's own pipeline on the 8x H100 fixtures of tests/unit/health (all 8 GPUs on
    the PCI bus, also the one nvidia-smi no longer lists in the faulty query). ``fabric_manager`` None and
    ``pci_readable`` False: those inputs cannot be read, so their checks are skipped."""
    baseline = gpu_health.validate_baseline(json.loads(fixture("baseline-h100x8.json")))
    catalog = gpu_health.load_xid_catalog(str(ROOT / "data" / "xid.yml"))
    observed = {
        "gpus": parse_health_query(fixture(query)),
        "mismatch": None,
        "nvlink": parse_nvlink_status(fixture("nvlink-s-h100x8.txt")),
        "nvlink_error": None,
        "xid_events": parse_xid_events(fixture(kernel_log)) if kernel_log else [],
        "module_version": "550.54.15",
        "pci": [gpu["pci_bus_id"] for gpu in parse_health_query(fixture("query-h100x8-healthy.csv"))],
        "pci_note": None,
        "fabric_manager": {"state": fabric_manager, "note": None if fabric_manager else "systemd is not running"},
        "stacks": {},
    }
    if not pci_readable:
        observed.update(pci=None, pci_note="/sys/bus/pci/devices cannot be read")
    return gpu_health.build_report(NOW, observed, baseline, gpu_health.judge(observed, baseline, catalog))


def rich_report() -> dict[str, Any]:
    """The unhealthy report (findings, Xids, a missing GPU) with a value for every per-GPU series that
    the fixtures' GPUs leave out ([N/A]), so its textfile holds every family gpu_health writes."""
    report = health_report("query-h100x8-faults.csv", "kernel-dmesg.txt", fabric_manager="failed")
    keys = [key for _name, key, _kind, _help in gpu_health.GPU_METRICS]
    keys += [key for key, _words, _reason in gpu_health.CLOCK_REASONS]
    for row in report["gpus"]:
        for key in keys:
            if row.get(key) is None:
                row[key] = 0
    return report


def rendered_names(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))


def verification_textfile() -> str:
    """A textfile as the verification writes it after verification-metrics.yml (made-up values)."""
    lines = []
    for metric in verification_metrics():
        labels = ",".join(f'{label}="{label}-1"' for label in metric["labels"])
        lines += [f"# HELP {metric['name']} {metric['help']}", f"# TYPE {metric['name']} {metric['type']}"]
        lines.append(f"{metric['name']}{{{labels}}} 1" if labels else f"{metric['name']} 1")
    return "\n".join(lines) + "\n"


def skipping_report() -> dict[str, Any]:
    """A healthy host whose PCI folder and systemd cannot be read: the pci and fabric_manager checks skipped."""
    return health_report("query-h100x8-healthy.csv", fabric_manager=None, pci_readable=False)


def known_names() -> set[str]:
    """Every metric name the rules and the dashboard may use."""
    rendered = gpu_health.render_metrics(rich_report()) + gpu_health.render_metrics(skipping_report())
    return rendered_names(rendered) | {m["name"] for m in verification_metrics()}


REPORTS = {
    "healthy": lambda: health_report("query-h100x8-healthy.csv"),
    "unhealthy": lambda: health_report("query-h100x8-faults.csv", "kernel-dmesg.txt", fabric_manager="failed"),
    "checks-skipped": skipping_report,
    "could-not-check": lambda: gpu_health.failed_report(NOW, gpu_health.CouldNotCheck("nvidia-smi hung.", "Reboot.")),
}


@pytest.mark.parametrize("kind", REPORTS)
def test_promtool_accepts_the_health_textfile(promtool, kind):
    text = gpu_health.render_metrics(REPORTS[kind]())
    checked = run([promtool, "check", "metrics"], stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr + "\n" + text


def test_the_reports_are_what_their_names_say():
    assert REPORTS["healthy"]()["findings"] == []
    assert REPORTS["unhealthy"]()["findings"] and REPORTS["unhealthy"]()["xid_events"]
    assert set(REPORTS["checks-skipped"]()["skipped"]) == {"pci", "fabric_manager"}
    assert REPORTS["could-not-check"]()["up"] is False


def test_the_rich_report_renders_every_family():
    names = rendered_names(gpu_health.render_metrics(rich_report()))
    expected = {name for name, _key, _kind, _help in gpu_health.GPU_METRICS}
    assert expected <= names
    assert {"gpu_fleet_health_finding", "gpu_fleet_health_xid_events", "gpu_fleet_health_driver_info"} <= names
    findings = {item["check"] for item in rich_report()["findings"]}
    assert {"gpus", "pci", "pcie", "fabric_manager", "ecc", "xid", "clocks", "persistence"} <= findings


def test_the_verification_metrics_are_well_formed(promtool):
    metrics = verification_metrics()
    names = [metric["name"] for metric in metrics]
    assert len(names) == len(set(names)), "a verification metric is listed twice"
    for metric in metrics:
        assert set(metric) == {"name", "type", "help", "labels"}, metric
        assert metric["name"].startswith("gpu_fleet_verification_"), metric["name"]
        assert metric["type"] == "gauge", metric["name"]
        assert metric["help"].strip(), metric["name"]
        assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", label) for label in metric["labels"]), metric
    checked = run([promtool, "check", "metrics"], stdin=verification_textfile())
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_verification_metrics_are_the_ones_the_rules_need():
    names = {metric["name"] for metric in verification_metrics()}
    assert names == {
        "gpu_fleet_verification_last_run_timestamp_seconds",
        "gpu_fleet_verification_passed",
        "gpu_fleet_verification_check_passed",
        "gpu_fleet_verification_fit_samples_per_second",
        "gpu_fleet_verification_gpus_expected",
        "gpu_fleet_verification_gpus_seen",
        "gpu_fleet_verification_info",
    }
    labels = {metric["name"]: metric["labels"] for metric in verification_metrics()}
    assert labels["gpu_fleet_verification_check_passed"] == ["stack", "check"]
    assert labels["gpu_fleet_verification_info"] == [
        "stack",
        "tensorflow_version",
        "cuda_version",
        "cudnn_version",
        "driver_version",
    ]


# --- the rules -------------------------------------------------------------------------------------


def test_promtool_checks_the_rules(promtool):
    checked = run([promtool, "check", "rules", str(RULES)])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_of_the_rules_pass(promtool):
    tested = run([promtool, "test", "rules", str(RULES_TEST)])
    assert tested.returncode == 0, tested.stdout + tested.stderr


def alert_tests() -> list[tuple[str, dict[str, Any]]]:
    document = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))
    return [(group["name"], case) for group in document["tests"] for case in group.get("alert_rule_test", [])]


def test_the_unit_tests_cover_every_alert_silent_and_firing():
    names = set(alerts())
    cases = alert_tests()
    healthy = {
        case["alertname"] for group, case in cases if group.startswith("a healthy host") and not case["exp_alerts"]
    }
    firing = {case["alertname"] for _group, case in cases if case["exp_alerts"]}
    assert names - healthy == set(), "alerts the healthy host's test does not assert silent"
    assert names - firing == set(), "alerts no test makes fire"
    assert {case["alertname"] for _group, case in cases} <= names, "tests of alerts the rules do not define"


def test_the_healthy_host_is_asserted_after_every_for():
    def seconds(text: str) -> int:
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))

    longest = max(seconds(rule.get("for", "0s")) for rule in alerts().values())
    times = [seconds(case["eval_time"]) for group, case in alert_tests() if group.startswith("a healthy host")]
    assert min(times) > longest


def per_gpu_names() -> set[str]:
    names = {name for name, _key, _kind, _help in gpu_health.GPU_METRICS}
    return names | {"gpu_fleet_health_clocks_event_active", "gpu_fleet_health_xid_events"}


def test_every_alert_has_a_severity_and_names_cause_and_fix():
    for name, rule in alerts().items():
        assert re.fullmatch(r"Gpu[A-Za-z]+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        annotations = rule["annotations"]
        assert set(annotations) >= {"summary", "description"}, name
        assert "$labels.instance" in annotations["summary"] and "$labels.instance" in annotations["description"], name
        if used_names(rule["expr"]) & per_gpu_names():
            assert "$labels.bus_id" in annotations["description"], f"{name}: a GPU's alert names the GPU"


def used_names(text: str) -> set[str]:
    return set(NAME.findall(text))


def test_the_rules_use_only_rendered_or_verification_metrics():
    known = known_names()
    used = set()
    for rule in rules():
        used |= used_names(rule["expr"])
        for text in rule.get("annotations", {}).values():
            used |= used_names(text)  # the names in `query` templates and in the prose
    assert used - known == set(), "names the health check does not render and the verification does not write"


def xid_regex(expr: str) -> set[int]:
    match = re.search(r'xid[!=]~"([0-9|]+)"', expr)
    assert match, expr
    return {int(number) for number in match.group(1).split("|")}


def test_critical_xids_are_the_catalogs_reset_reboot_and_rma_xids():
    catalog = gpu_health.load_xid_catalog(str(ROOT / "data" / "xid.yml"))
    critical = {xid for xid, entry in catalog["xids"].items() if entry.get("action") in CRITICAL_XID_ACTIONS}
    assert critical, "no critical Xid in data/xid.yml"
    assert xid_regex(alerts()["GpuXidCritical"]["expr"]) == critical
    assert xid_regex(alerts()["GpuXidWarning"]["expr"]) == critical  # the same list, negated: every Xid alerts once
    assert '!~"' in alerts()["GpuXidWarning"]["expr"] and '=~"' in alerts()["GpuXidCritical"]["expr"]


# Each check of gpu_health.py with alerts of its own, and those alerts; GpuHealthFinding takes the
# findings of any other check (one added to gpu_health.py later).
COVERED_CHECKS = {
    "nvidia_smi": ["GpuNvidiaSmiHung"],
    "gpus": ["GpuMissing", "GpuCountMismatch"],
    "pci": ["GpuGoneFromPciBus", "GpuMissing", "GpuCountMismatch"],
    "pcie": ["GpuPcieLinkDegraded", "GpuPcieLinkBelowBaseline"],
    "nvlink": ["GpuNvlinkDown", "GpuNvlinkStatusUnreadable"],
    "fabric_manager": ["GpuFabricManagerDown"],
    "ecc": [
        "GpuEccUncorrectableErrors",
        "GpuEccUncorrectableErrorsIncreased",
        "GpuRetiredPagesPending",
        "GpuRemappedRowsPending",
        "GpuRowRemapFailure",
    ],
    "xid": ["GpuXidCritical", "GpuXidWarning"],
    "clocks": ["GpuClocksSlowdown"],
    "persistence": ["GpuPersistenceModeOff"],
    "driver": ["GpuDriverMismatch"],
    "venv": ["GpuVenvDrift"],
}


def test_the_catch_all_alert_leaves_out_exactly_the_checks_with_alerts_of_their_own():
    expr = alerts()["GpuHealthFinding"]["expr"]
    excluded = set(re.search(r'check!~"([a-z_|]+)"', expr).group(1).split("|"))
    assert excluded == set(COVERED_CHECKS)
    assert excluded <= set(gpu_health.CHECKS), "a check gpu_health.py does not have"
    assert {name for names in COVERED_CHECKS.values() for name in names} <= set(alerts())


# --- the dashboard ---------------------------------------------------------------------------------


def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for item in items:
        found.append(item)
        found += panels(item.get("panels", []))
    return found


def dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (f"{panel['title']} {target['refId']}", target["expr"])
        for panel in panels(dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def test_the_dashboard_is_importable_json():
    board = dashboard()
    assert board["uid"] and len(board["uid"]) <= 40
    assert board["id"] is None
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 39
    ids = [panel["id"] for panel in panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["type"] == "query" and variables["instance"]["includeAll"]


def test_the_dashboard_names_no_datasource_uid():
    """Every panel and query reads the ${datasource} variable; no data source of one Grafana is named."""
    board = dashboard()
    refs = [panel.get("datasource") for panel in panels(board["panels"]) if panel["type"] != "row"]
    refs += [target.get("datasource") for panel in panels(board["panels"]) for target in panel.get("targets", [])]
    refs += [variable["datasource"] for variable in board["templating"]["list"] if "datasource" in variable]
    assert refs and all(ref == {"type": "prometheus", "uid": "${datasource}"} for ref in refs), refs
    assert not re.search(r'"uid": "(?!\$\{datasource\}|gpu-fleet-health|-- Grafana --)', DASHBOARD.read_text())


def test_the_dashboard_uses_only_rendered_or_verification_metrics():
    known = known_names()
    used = {name for _where, expr in dashboard_exprs() for name in used_names(expr)}
    definition = dashboard()["templating"]["list"]
    used |= {name for variable in definition for name in used_names(variable.get("definition", ""))}
    assert used - known == set()
    assert {m["name"] for m in verification_metrics()} <= used, "verification metrics the dashboard does not show"


def test_the_dashboard_queries_are_promql(promtool, tmp_path):
    """Each query with its variables filled in, as a recording rule that `promtool check rules` parses."""
    filled = [
        {"record": f"dashboard:query_{number}", "expr": expr.replace("$instance", ".*")}
        for number, (_where, expr) in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": filled}]}))
    checked = run([promtool, "check", "rules", str(path)])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_docs_describe_every_alert():
    docs = (ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(Gpu[A-Za-z]+)` \| (critical|warning) \|", docs, re.MULTILINE))
    assert rows == {(name, rule["labels"]["severity"]) for name, rule in alerts().items()}


# --- the health metrics' table in docs/monitoring.md --------------------------------------------------------------

TABLE_ROW = re.compile(r"^\| `(gpu_fleet_health_\w+)` \| (\w+) \| (.*?) \| (.*) \|$")


def documented_health_metrics() -> dict[str, tuple[str, set[str], str]]:
    """``{name: (type, labels, meaning)}`` of the table "The health metrics" in docs/monitoring.md."""
    text = (ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8").split("### The health metrics", 1)[1]
    rows = [TABLE_ROW.match(line) for line in text.split("\n\n| metric |", 1)[1].splitlines()]
    return {
        row.group(1): (row.group(2), set(re.findall(r"`(\w+)`", row.group(3))), row.group(4)) for row in rows if row
    }


def rendered_health_metrics() -> dict[str, tuple[str, set[str], str]]:
    """The same of every family gpu_health writes: the rich report (a DCGM diagnostic run too) and the skipping one."""
    dcgm = {"level": 1, "tests": [{"test": "memory", "gpu": 0, "result": "Pass"}]}
    text = gpu_health.render_metrics({**rich_report(), "dcgm": dcgm}) + gpu_health.render_metrics(skipping_report())
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.MULTILINE))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    labels: dict[str, set[str]] = {name: set() for name in types}
    for name, body in re.findall(r"^(gpu_fleet_health_\w+)\{(.*)\} ", text, re.MULTILINE):
        labels[name] |= set(re.findall(r'(\w+)="', body))
    return {name: (types[name], labels[name], helps[name]) for name in types}


def test_the_docs_table_of_the_health_metrics_is_what_the_check_writes():
    """One list of the health metrics for people, kept equal to the writer (names, types, labels, HELP)."""
    assert documented_health_metrics() == rendered_health_metrics()
