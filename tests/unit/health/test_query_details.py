"""``nvidia-smi -q`` in gpu_parsers.py (parse_query_details, memory_error_details) on the captures of
fixtures/ (README there: H100, A10, V100 with -d ECC,PAGE_RETIREMENT,ROW_REMAPPER, an RTX 2080 SUPER's
-d PIDS, full -q of an H100 and of an H200 in MIG mode), and the words gpu_health_checks.py makes of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gpu_health_checks as checks
import pytest
from gpu_parsers import memory_error_details, parse_query_details

H100X8 = "q-d-ecc-h100x8-535.161.08.txt"
A10 = "q-d-ecc-a10-535.129.03-remap-pending.txt"
V100X8 = "q-d-ecc-v100x8-550.127.05.txt"
PIDS = "q-d-pids-rtx2080super-610.57.04.txt"
H100 = "q-h100-590.48.01.txt"
H200_MIG = "q-h200-mig-590.48.01.txt"
MEMORY_SECTIONS = ["ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows"]
NO_PAGES = {"single_bit": None, "double_bit": None, "pending": None}
NO_ROWS = {"correctable": None, "uncorrectable": None, "pending": None, "failure": None}
HEALTHY_ROWS = {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
NO_ECC_ERRORS = {"volatile": 0, "aggregate": 0}


def details(rows: dict[str, Any], pages: dict[str, Any], ecc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"remapped_rows": rows, "retired_pages": pages, "ecc_uncorrected": ecc}


def test_h100x8_gives_each_gpu_its_memory_sections(read_fixture: Callable[[str], str]) -> None:
    gpus = parse_query_details(read_fixture(H100X8))
    assert list(gpus) == [f"0000:{bus}:00.0" for bus in ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")]
    section = gpus["0000:19:00.0"]
    assert list(section) == MEMORY_SECTIONS
    assert section["ECC Mode"] == {"Current": "Enabled", "Pending": "Enabled"}
    assert section["ECC Errors"]["Volatile"] == {
        "SRAM Correctable": "0",
        "SRAM Uncorrectable Parity": "0",
        "SRAM Uncorrectable SEC-DED": "0",
        "DRAM Correctable": "0",
        "DRAM Uncorrectable": "0",
    }
    assert section["ECC Errors"]["Aggregate"]["SRAM Threshold Exceeded"] == "No"
    assert section["ECC Errors"]["Aggregate Uncorrectable SRAM Sources"]["SRAM PCIE"] == "0"
    assert section["Retired Pages"] == {
        "Single Bit ECC": "N/A",
        "Double Bit ECC": "N/A",
        "Pending Page Blacklist": "N/A",
    }
    assert section["Remapped Rows"]["Bank Remap Availability Histogram"]["Max"] == "2560 bank(s)"
    expected = details(HEALTHY_ROWS, NO_PAGES, NO_ECC_ERRORS)
    assert all(memory_error_details(gpu) == expected for gpu in gpus.values())


def test_a10_with_a_row_remap_pending(read_fixture: Callable[[str], str]) -> None:
    (section,) = parse_query_details(read_fixture(A10)).values()
    assert section["Remapped Rows"]["Uncorrectable Error"] == "4"
    assert section["ECC Errors"]["Volatile"]["SRAM Uncorrectable"] == "0"
    rows = {"correctable": 0, "uncorrectable": 4, "pending": True, "failure": False}
    assert memory_error_details(section) == details(rows, NO_PAGES, NO_ECC_ERRORS)


def test_v100x8_retires_pages_and_counts_by_single_and_double_bit(read_fixture: Callable[[str], str]) -> None:
    gpus = parse_query_details(read_fixture(V100X8))
    assert len(gpus) == 8 and "0000:00:0a.0" in gpus
    section = gpus["0000:00:04.0"]
    assert list(section) == MEMORY_SECTIONS and section["Remapped Rows"] == "N/A"
    # The headings "Single Bit            " end in spaces; the keys do not.
    assert section["ECC Errors"]["Aggregate"]["Double Bit"]["Total"] == "0"
    assert section["ECC Errors"]["Volatile"]["Single Bit"]["Texture Memory"] == "N/A"
    pages = {"single_bit": 0, "double_bit": 0, "pending": False}
    assert memory_error_details(section) == details(NO_ROWS, pages, NO_ECC_ERRORS)
    # 0000:00:08.0 has had 4 correctable (single-bit) errors in device memory and retired 1 page for them.
    worn = gpus["0000:00:08.0"]
    assert worn["ECC Errors"]["Aggregate"]["Single Bit"]["Device Memory"] == "4"
    assert memory_error_details(worn) == details(NO_ROWS, {**pages, "single_bit": 1}, NO_ECC_ERRORS)


def test_repeated_keys_keep_every_value_in_order(read_fixture: Callable[[str], str]) -> None:
    (section,) = parse_query_details(read_fixture(PIDS)).values()
    processes = section["Processes"]
    assert processes["Process ID"] == ["1720", "4556"]
    assert processes["Name"] == ["/usr/bin/gnome-shell", "/usr/bin/Xwayland"]
    assert processes["Used GPU Memory"] == ["173 MiB", "3 MiB"]
    assert memory_error_details(section) == details(NO_ROWS, NO_PAGES, {"volatile": None, "aggregate": None})


def test_a_full_query_keeps_every_value_as_printed(read_fixture: Callable[[str], str]) -> None:
    (section,) = parse_query_details(read_fixture(H100)).values()
    assert section["Product Name"] == "NVIDIA H100 80GB HBM3"
    assert section["Display Mode"] == "Requested functionality has been deprecated"
    assert section["Driver Model"] == {"Current": "N/A", "Pending": "N/A"}
    assert section["PCI"]["Bus Id"] == "00000000:00:09.0"
    assert section["PCI"]["GPU Link Info"]["PCIe Generation"]["Host Max"] == "N/A"
    assert section["GPU Memory Power Readings"]["Average Power Draw"] == "43.19 W"  # "Readings " in the capture
    # HW Thermal Slowdown is printed under "HW Slowdown : Not Active": it joins that line's section.
    assert section["Clocks Event Reasons"]["HW Thermal Slowdown"] == "Not Active"
    assert section["Applications Clocks"]["Graphics"] == "Requested functionality has been deprecated"
    assert section["Processes"] == "None" and section["Capabilities"] == {"EGM": "disabled"}
    assert memory_error_details(section) == details(HEALTHY_ROWS, NO_PAGES, NO_ECC_ERRORS)


def test_mig_devices_are_a_list_and_rows_are_not_reported_in_mig_mode(read_fixture: Callable[[str], str]) -> None:
    gpus = parse_query_details(read_fixture(H200_MIG))
    (section,) = gpus.values()
    assert list(gpus) == ["0000:83:00.0"]
    devices = section["MIG Device"]
    assert [device["Index"] for device in devices] == ["0", "1", "2", "3", "4"]
    assert devices[0]["ECC Errors"] == {"Volatile": {"SRAM Uncorrectable": "0"}}
    assert section["Remapped Rows"] == "N/A"
    assert memory_error_details(section) == details(NO_ROWS, NO_PAGES, NO_ECC_ERRORS)


def test_counts_in_the_volta_form_and_the_sram_dram_form(read_fixture: Callable[[str], str]) -> None:
    v100 = read_fixture(V100X8).split("\nGPU 00000000:00:05.0")[0]
    lines = v100.splitlines()
    totals = [number for number, line in enumerate(lines) if line.strip().startswith("Total")]
    lines[totals[1]] = lines[totals[1]].replace(": 0", ": 2")  # Volatile > Double Bit > Total
    lines[totals[3]] = lines[totals[3]].replace(": 0", ": 14")  # Aggregate > Double Bit > Total
    (section,) = parse_query_details("\n".join(lines)).values()
    assert memory_error_details(section)["ecc_uncorrected"] == {"volatile": 2, "aggregate": 14}
    h100 = read_fixture(H100X8).replace("SRAM Uncorrectable SEC-DED    : 0", "SRAM Uncorrectable SEC-DED    : 1")
    h100 = h100.replace("DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : 2")
    counts = memory_error_details(parse_query_details(h100)["0000:19:00.0"])["ecc_uncorrected"]
    assert counts == {"volatile": 3, "aggregate": 3}


def test_a_total_and_its_parts_are_not_counted_twice() -> None:
    volatile = {"SRAM Uncorrectable": "1", "SRAM Uncorrectable Parity": "1", "DRAM Uncorrectable": "2"}
    section = {"ECC Errors": {"Volatile": volatile, "Aggregate": {"DRAM Uncorrectable": "N/A"}}}
    assert memory_error_details(section)["ecc_uncorrected"] == {"volatile": 3, "aggregate": None}


@pytest.mark.parametrize(
    ("line", "pending"),
    [
        pytest.param("Pending Page Blacklist            : Yes", True, id="pending-page-blacklist"),
        pytest.param("Pending                           : Yes", True, id="older-pending"),
        pytest.param("Pending Page Retirement           : No", False, id="pending-page-retirement"),
        pytest.param("Pending Page Blacklist            : Not Supported", None, id="not-supported"),
        pytest.param("Pending Page Blacklist            : [N/A]", None, id="bracketed-na"),
    ],
)
def test_pending_page_retirement_under_each_name(read_fixture: Callable[[str], str], line: str, pending: Any) -> None:
    text = read_fixture(V100X8).replace("Pending Page Blacklist            : No", line, 1)
    section = parse_query_details(text)["0000:00:04.0"]
    assert section["Retired Pages"][line.split(" : ")[0].strip()] == line.split(" : ")[1]  # kept as printed
    assert memory_error_details(section)["retired_pages"]["pending"] is pending


@pytest.mark.parametrize("section", [None, "N/A", {}, {"Remapped Rows": "N/A", "Retired Pages": "N/A"}])
def test_no_sections_give_no_details(section: Any) -> None:
    assert memory_error_details(section) == details(NO_ROWS, NO_PAGES, {"volatile": None, "aggregate": None})


def test_no_devices_gives_nothing() -> None:
    assert parse_query_details("No devices were found\n") == {}
    banner = "\n==============NVSMI LOG==============\n\nDriver Version : 535.161.08\n\nAttached GPUs : 0\n"
    assert parse_query_details(banner) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "not nvidia-smi -q output", id="empty"),
        pytest.param("0, 0000:19:00.0, Enabled\n", "not nvidia-smi -q output", id="csv"),
        pytest.param("Attached GPUs : 1\n    Product Name : x\n", "indented before the first GPU", id="no-gpu-line"),
        pytest.param("Attached GPUs : 1\nGPU 00000000:19:00.0\nPCI : x\n", "not indented", id="unindented-line"),
        pytest.param(
            "Attached GPUs : 2\nGPU 00000000:19:00.0\n    A : 1\nGPU 0000:19:00.0\n    A : 1\n", "twice", id="gpu-twice"
        ),
    ],
)
def test_text_that_is_not_query_output_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_query_details(text)


# -- in words, for the ecc findings (gpu_health_checks.py) -------------------------------------------------


def test_memory_error_words_leave_out_what_the_gpu_does_not_report(read_fixture: Callable[[str], str]) -> None:
    (a10,) = parse_query_details(read_fixture(A10)).values()
    assert checks.memory_error_words(memory_error_details(a10)) == (
        "Remapped rows: 4 uncorrectable, 0 correctable, pending Yes, failure No. "
        "Uncorrectable ECC errors: 0 volatile, 0 aggregate."
    )
    v100 = parse_query_details(read_fixture(V100X8))["0000:00:04.0"]
    assert checks.memory_error_words(memory_error_details(v100)) == (
        "Retired pages: 0 single-bit, 0 double-bit, pending No. Uncorrectable ECC errors: 0 volatile, 0 aggregate."
    )
    partly = details({**NO_ROWS, "pending": True}, NO_PAGES, {"volatile": None, "aggregate": None})
    assert (
        checks.memory_error_words(partly)
        == "Remapped rows: N/A uncorrectable, N/A correctable, pending Yes, failure N/A."
    )
    assert checks.memory_error_words(memory_error_details(None)) == ""


def test_ecc_detail_answer(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture(A10)
    assert checks.ecc_detail_answer("0000:07:00.0", 0, text).startswith("Remapped rows: 4 uncorrectable")
    assert checks.ecc_detail_answer("0000:07:00.0", 2, text) is None  # failed
    assert checks.ecc_detail_answer("0000:08:00.0", 0, text) is None  # another GPU
    assert checks.ecc_detail_answer("0000:07:00.0", 0, "Invalid combination of input arguments.") is None
    assert checks.ecc_detail_answer("0000:0c:00.0", 0, read_fixture(PIDS)) is None  # nothing reported
    assert checks.ecc_detail_command("nvidia-smi", "0000:07:00.0") == [
        *("nvidia-smi", "-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER", "-i", "0000:07:00.0")
    ]


def test_with_ecc_details_ends_each_finding_of_the_gpu() -> None:
    findings = [
        checks.finding("ecc", "0000:07:00.0", "GPU 0000:07:00.0 has memory rows pending remapping.", "reset"),
        checks.finding("ecc", "0000:07:00.0", "A memory row remapping failed on GPU 0000:07:00.0.", "RMA"),
        checks.finding("ecc", "0000:0f:00.0", "GPU 0000:0f:00.0 has had 2 uncorrectable ECC errors.", "reset"),
    ]
    out = checks.with_ecc_details(findings, {"0000:07:00.0": "Remapped rows: 4 uncorrectable."})
    assert [item["cause"] for item in out] == [
        "GPU 0000:07:00.0 has memory rows pending remapping. Remapped rows: 4 uncorrectable.",
        "A memory row remapping failed on GPU 0000:07:00.0. Remapped rows: 4 uncorrectable.",
        "GPU 0000:0f:00.0 has had 2 uncorrectable ECC errors.",
    ]
    assert out[2] is findings[2] and findings[0]["cause"].endswith("remapping.")  # the input is left as it was
