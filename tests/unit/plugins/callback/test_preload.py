"""The callback plugin preload: the main process loads Ansible's and the collection's Jinja2 and lookup
plugins at the start of a playbook, so that the workers forked for each task inherit them loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "callback"))

import preload

# Run in a fresh interpreter: the loaders and sys.modules of this test process are shared by the others.
PROBE = """
import json, sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1]])
sys.path.insert(0, sys.argv[2])
import preload
module = "ansible_collections.gpu_fleet.tf_hosts.plugins.filter.gpu_stack"
before = module in sys.modules
failed = preload.preload()
print(json.dumps({"before": before, "after": module in sys.modules, "failed": failed,
                  "core": any(m.startswith("ansible.plugins.filter.core") for m in sys.modules)}))
"""


def test_each_filter_test_and_lookup_of_the_collection_is_named_for_its_loader():
    names = [name for _, name in preload.collection_plugins()]
    assert "gpu_fleet.tf_hosts.gpu_stacks_resolve" in names  # a filter, by its documentation file
    assert "gpu_fleet.tf_hosts.collection_path" in names  # a lookup, by its module
    assert not any(name.endswith(("gpu_stack", "__init__")) for name in names), "modules of filters are not names"


def test_the_main_process_holds_every_plugin_loaded_after_the_playbook_starts():
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "collections"), str(ROOT / "plugins" / "callback")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found == {"before": False, "after": True, "failed": [], "core": True}


def test_a_plugin_that_cannot_load_is_named_and_the_others_still_load(tmp_path):
    (tmp_path / "plugins" / "filter").mkdir(parents=True)
    (tmp_path / "plugins" / "filter" / "no_such_filter.yml").write_text("DOCUMENTATION: {}\n")
    assert preload.preload(tmp_path) == ["gpu_fleet.tf_hosts.no_such_filter"]
