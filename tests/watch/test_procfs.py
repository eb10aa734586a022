"""The host readings: the pure parsers (table tests), the reader over /proc + cgroup fixture
trees (tests/watch/fixtures: a calm box and a pressed one, two readings 10 s apart) and over
this machine's real /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from escha_deploy.watch import procfs
from escha_deploy.watch.collect import read_host
from escha_deploy.watch.reading import host_window

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("text,key,expected", [
    ("MemTotal:       65536000 kB\n", "MemTotal", 65536000 * 1024),
    ("HugePages_Total:       4\n", "HugePages_Total", 4),
    ("Active(file):   12 kB\nInactive(file): 3 kB\n", "Active(file)", 12 * 1024),
    ("garbage line\nMemFree: x kB\n", "MemFree", None),
])
def test_meminfo(text, key, expected):
    assert procfs.parse_meminfo(text).get(key) == expected


@pytest.mark.parametrize("mem,expected", [
    ({"Active(file)": 2, "Inactive(file)": 3, "Cached": 100}, 5),
    ({"Cached": 100}, None),
])
def test_page_cache_is_the_file_lru(mem, expected):
    assert procfs.page_cache_bytes(mem) == expected


@pytest.mark.parametrize("text,expected", [
    ("some avg10=1.50 avg60=2.00 avg300=0.10 total=77\nfull avg10=0.50 avg60=0.25 avg300=0.00 total=9\n",
     dict(some_avg10=1.5, some_avg60=2.0, full_avg10=0.5, full_avg60=0.25, some_total_us=77, full_total_us=9)),
    ("some avg10=3.00 avg60=1.00 avg300=0.00 total=5\n",  # cgroup v1-era kernels: no full line
     dict(some_avg10=3.0, some_avg60=1.0, full_avg10=None, full_avg60=None, some_total_us=5, full_total_us=None)),
])
def test_psi(text, expected):
    assert procfs.parse_psi(text).model_dump() == expected


@pytest.mark.parametrize("text", ["", "full avg10=1.00\n", "some total=3\n"])
def test_psi_without_a_some_line_is_none(text):
    assert procfs.parse_psi(text) is None


@pytest.mark.parametrize("text,expected", [
    ("Name:\tpython\nVmRSS:\t  1024 kB\n", 1024 * 1024),
    ("Name:\tkthreadd\n", None),
])
def test_rss(text, expected):
    assert procfs.parse_rss_bytes(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("0::/system.slice/x.service\n", "/system.slice/x.service"),
    ("4:memory:/docker/abc\n0::/\n", "/"),
    ("4:memory:/docker/abc\n", None),
])
def test_cgroup_path(text, expected):
    assert procfs.parse_cgroup_path(text) == expected


@pytest.mark.parametrize("text,expected", [("max\n", None), ("64000000000\n", 64_000_000_000)])
def test_limit(text, expected):
    assert procfs.parse_limit(text) == expected


def test_descendants_follow_ppid():
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1}
    assert procfs.descendants(parents, [10]) == [10, 11, 12]
    assert procfs.descendants(parents, [99]) == []


def test_calm_fixture():
    h = read_host([4242], FIX / "calm")
    assert h.mem_total_bytes == 65536000 * 1024
    assert h.mem_available_bytes == 30000000 * 1024
    assert h.page_cache_bytes == (12000000 + 7000000) * 1024
    assert (h.swap_in_pages, h.swap_out_pages) == (1200, 3400)
    assert h.psi.some_avg10 == 0.12
    assert h.server_pids == [4242, 4243]  # the serve process and its SGLang child, not sshd
    assert h.server_rss_bytes == (81920 + 9437184) * 1024
    cg = h.cgroup
    assert cg.path == "/system.slice/escha-serve.service"
    assert (cg.current_bytes, cg.max_bytes, cg.anon_bytes, cg.file_bytes) == (9_800_000_000, None, 9_500_000_000,
                                                                             300_000_000)
    assert cg.events["oom_kill"] == 0


def test_pressed_fixture_window():
    a, b = read_host([4242], FIX / "pressed-0"), read_host([4242], FIX / "pressed-1")
    assert b.page_cache_bytes == (300000 + 275195) * 1024  # the seed box's 589 MB
    w = host_window(b, a, 10.0)
    assert (w.swap_in_pages_per_s, w.swap_out_pages_per_s) == (300.0, 500.0)
    assert w.cgroup_events == {"high": 17, "oom": 1, "oom_kill": 1}
    assert b.cgroup.psi.some_avg10 == 40.0 and b.cgroup.max_bytes == 64_000_000_000


def test_missing_psi_is_not_available(tmp_path):
    import shutil

    shutil.copytree(FIX / "calm", tmp_path / "box")
    (tmp_path / "box/proc/pressure/memory").unlink()
    assert read_host([4242], tmp_path / "box").psi is None


def test_this_machines_proc():
    h = read_host([os.getpid()])
    assert h.mem_total_bytes and h.mem_total_bytes > 0
    assert h.mem_available_bytes is not None and 0 < h.mem_available_bytes <= h.mem_total_bytes
    assert h.page_cache_bytes is not None and h.page_cache_bytes <= h.mem_total_bytes
    assert h.swap_in_pages is not None and h.swap_out_pages is not None
    assert os.getpid() in h.server_pids
    assert h.server_rss_bytes and h.server_rss_bytes > 1 << 20  # this Python holds more than 1 MiB
    assert h.page_size_bytes == os.sysconf("SC_PAGE_SIZE")
    if Path("/proc/pressure/memory").is_file():
        assert h.psi is not None
    else:
        assert h.psi is None
