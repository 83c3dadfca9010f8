"""Estimates before long work: refusals name the estimate, how it was made and the limit."""

import pytest

from lmckit.budget import (
    Budget,
    ResourceError,
    available_memory,
    check_budget,
    human_bytes,
    human_seconds,
)
from lmckit.errors import UsageError


def test_human_units():
    assert human_seconds(12) == "12 s"
    assert human_seconds(90) == "1.5 min"
    assert human_seconds(86400) == "24 h"
    assert human_seconds(3 * 86400) == "3 days"
    assert human_seconds(5 * 365.25 * 86400) == "5 years"
    assert human_bytes(3 << 30) == "3 GiB" and human_bytes(512) == "512 B"


def test_a_request_beyond_the_budget_is_refused_with_its_estimate():
    check_budget("x", seconds=3600, memory=1 << 20, budget=Budget.hours(2))  # fits
    with pytest.raises(ResourceError, match=r"y would take at least 3 days \(z\), more than "
                       r"the 2 h allowed.*--max-hours") as exc:  # fmt: skip
        check_budget("y", seconds=3 * 86400, detail="z", budget=Budget.hours(2))
    assert isinstance(exc.value, UsageError)  # the command line exits 2
    with pytest.raises(ResourceError, match=r"would need at least 2 GiB of memory.*1 GiB is"):
        check_budget("w", memory=2 << 30, budget=Budget(memory=1 << 30))
    assert available_memory() > 0


def test_available_memory_is_in_bytes_as_the_system_counts_them():
    """``MemAvailable`` is given in KiB: read as bytes, the budget would believe the machine
    has 1/1024 of its memory. Checked against the page counts the kernel reports through
    ``sysconf`` (another interface, in pages): between half the free pages and all pages."""
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    free = os.sysconf("SC_AVPHYS_PAGES") * page
    available = available_memory()
    assert free / 2 <= available <= total, (free, available, total)
    assert Budget().memory_limit() == pytest.approx(available, rel=0.25)
    assert Budget(memory=123).memory_limit() == 123


def test_memory_sizes_on_the_command_line_are_binary_units():
    import argparse

    from lmckit.cli.arguments import size as _size

    assert _size("4096") == 4096 and _size("12G") == 12 << 30 and _size("800M") == 800 << 20
    assert _size("1.5GiB") == 3 << 29 and _size("2T") == 2 << 40 and _size("64k") == 64 << 10
    for bad in ("0.5", "12X", "", "-1G"):
        with pytest.raises(argparse.ArgumentTypeError):
            _size(bad)


def test_available_memory_reads_memavailable_in_kib(tmp_path):
    """The field and its unit, from a meminfo file of known values: MemAvailable (not
    MemFree, which leaves out the reclaimable page cache), in KiB."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       24683568 kB\nMemFree:          500000 kB\n"
        "MemAvailable:   20000000 kB\nBuffers:          100000 kB\n"
    )
    assert available_memory(meminfo) == 20000000 * 1024
    meminfo.write_text("MemTotal: 1 kB\n")  # no MemAvailable (an old kernel): the pages
    import os

    fallback = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert available_memory(meminfo) == pytest.approx(fallback, rel=0.25)
