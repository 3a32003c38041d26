"""data/xid.yml, the Xid catalog of the health check, and the reader that hosts use for it."""

from __future__ import annotations

from pathlib import Path

import gpu_health
import pytest
import yaml

CATALOG_FILE = Path(__file__).resolve().parents[3] / "data" / "xid.yml"
COMMON_XIDS = (13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120)
ACTIONS = {"check the application", "reset the GPU", "reboot", "drain and RMA", "contact support"}


def test_the_reader_and_pyyaml_agree_on_the_catalog() -> None:
    text = CATALOG_FILE.read_text(encoding="utf-8")
    assert gpu_health.parse_xid_catalog(text) == yaml.safe_load(text)


def test_the_catalog_cites_nvidia_and_holds_the_common_xids() -> None:
    text = CATALOG_FILE.read_text(encoding="utf-8")
    header = text.split("\ncatalog_url:", 1)[0]
    assert "https://docs.nvidia.com/deploy/xid-errors/" in header
    catalog = gpu_health.parse_xid_catalog(text)
    assert catalog["catalog_url"] == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    assert set(COMMON_XIDS) <= set(catalog["xids"])
    for xid, entry in catalog["xids"].items():
        assert set(entry) == {"mnemonic", "meaning", "action", "nvidia", "detail"}, xid
        assert entry["action"] in ACTIONS, (xid, entry["action"])
        assert entry["detail"].endswith("."), xid


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        (79, "reboot"),
        (48, "reset the GPU"),
        (64, "drain and RMA"),
        (13, "check the application"),
        (95, "reset the GPU"),
    ],
)
def test_actions_of_the_xids_that_matter_most(xid: int, action: str) -> None:
    assert gpu_health.parse_xid_catalog(CATALOG_FILE.read_text(encoding="utf-8"))["xids"][xid]["action"] == action


@pytest.mark.parametrize(
    "text",
    [
        "xids:\n  13:\n    meaning: [a, list]\n",
        "xids:\n  13:\n    meaning: 'single quoted'\n",
        "xids:\n  13:\n    meaning: a: b\n",
        "xids:\n  thirteen:\n    meaning: x\n",
        "xids:\n    meaning: x\n",
        "xids:\n  13:\n      meaning: x\n",
        'xids:\n  13:\n    meaning: "broken\n',
        "catalog_url:\n",
        "- a list item\n",
    ],
)
def test_the_reader_refuses_yaml_outside_its_subset(text: str) -> None:
    with pytest.raises(ValueError, match=r"line \d+"):
        gpu_health.parse_xid_catalog(text)


def test_an_unreadable_catalog_could_not_check(tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text("xids:\n  13: [x]\n", encoding="utf-8")
    for path in (tmp_path / "absent.yml", tmp_path / "bad.yml"):
        with pytest.raises(gpu_health.CouldNotCheck, match="Xid catalog"):
            gpu_health.load_xid_catalog(str(path))


def test_the_default_catalog_of_a_clone_is_data_xid_yml() -> None:
    assert Path(gpu_health.default_xid_catalog()) == CATALOG_FILE
