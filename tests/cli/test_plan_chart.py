"""``plan --chart OUT.png``: the segments add up to the memory base (or say by how much the
pools pass it), the PNG is written, and without matplotlib it exits 2 naming the extra."""

from __future__ import annotations

import sys

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.pipeline.chart import segments
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB
from inproc import run_main

SEED = ("--profile", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2")


@pytest.mark.parametrize("ratio,last", [(1.0, "left"), (2.0, "over")])
def test_segments_split_the_memory_base(ratio, last):
    p = plan(load_profile("rtx5060ti-tp2"), described_host(16 * GiB, "wsl2"), ratio=ratio)
    segs = segments(p)
    assert segs[-1].kind == last
    inside = sum(s.bytes for s in segs[:-1])
    assert inside + (segs[-1].bytes if last == "left" else -segs[-1].bytes) == p.budget.memory_base_bytes
    kinds = [s.kind for s in segs]
    assert kinds.count("server") == 2 and kinds.count("kv") == 2 and kinds.count("mamba") == 2
    assert sum(s.bytes for s in segs if s.kind in ("kv", "mamba", "other")) == p.pinned_total_bytes


def test_chart_png_is_written_even_for_an_unsafe_plan(tmp_path):
    out = tmp_path / "seed.png"
    r = run_main("plan", *SEED, "--ratio", "2", "--chart", str(out))
    assert r.code == 3  # unsafe, and the picture shows why
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chart written to {out}" in r.err


def test_without_matplotlib_exit_2_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "seed.png"
    r = run_main("plan", *SEED, "--chart", str(out))
    assert r.code == 2 and not out.exists()
    # the same two lines as bench --chart says (escha-deploy installs from its checkout)
    from escha_deploy.pipeline.chart import CHART_INSTALL_HINT, CHART_MISSING

    assert r.err.splitlines() == [f"error: {CHART_MISSING}", f"hint: {CHART_INSTALL_HINT}"]
    b = run_main("bench", "-e", "http://127.0.0.1:9", "--chart", str(out))
    assert b.code == 2 and b.err.splitlines() == r.err.splitlines()
    assert r.out == ""  # refused before planning


def test_chart_into_a_missing_folder_is_exit_2(tmp_path):
    r = run_main("plan", *SEED, "--chart", str(tmp_path / "nope" / "x.png"))
    assert r.code == 2 and "--chart" in r.err
