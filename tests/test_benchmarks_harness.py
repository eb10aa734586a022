"""benchmarks/harness.py's bookkeeping (the timing itself is hyperfine's and runs only under
benchmarks/run): paired ratios and goals, and runs added to the doc newest first."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "harness.py"


@pytest.fixture(scope="module")
def h():
    spec = importlib.util.spec_from_file_location("bench_harness", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_harness"] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules["bench_harness"]


def test_summary_is_the_median_of_paired_ratios(h):
    p = h.Pair("plan", "plan", ["a"], "ref", ["b"], goal_ratio=1.5, goal_abs_s=0.25)
    p.a, p.b = [0.2, 0.3, 0.9], [0.1, 0.3, 0.3]  # ratios 2.0, 1.0, 3.0
    s = p.summary()
    assert s["ratio"] == 2.0 and s["ratio_range"] == [1.0, 3.0]
    assert s["cmd_s"] == [0.2, 0.3, 0.9] and s["ref_s"] == [0.1, 0.3, 0.3]
    assert s["met"] is False
    p.a, p.b = [0.2, 0.2, 0.2], [0.2, 0.2, 0.2]
    assert p.summary()["met"] is True
    p.a = [0.3, 0.3, 0.3]  # ratio 1.5 meets the ratio, 0.3 s misses the 0.25 s
    p.b = [0.2, 0.2, 0.2]
    assert p.summary()["met"] is False


def test_runs_are_added_newest_first_below_the_marker(h, tmp_path, monkeypatch):
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\ntext\n")
    monkeypatch.setattr(h, "DOC", doc)
    h.write_doc("### run A\n")
    h.write_doc("### run B\n")
    text = doc.read_text()
    assert text.startswith("# Performance\n\ntext\n")
    assert text.index(h.MARKER) < text.index("### run B") < text.index("### run A")
    assert text.count(h.MARKER) == 1


@pytest.mark.skipif(shutil.which("hyperfine") is None, reason="hyperfine not installed")
def test_hyperfine_times_each_command_once(h):
    times = h.hyperfine([["true"], ["sleep", "0.05"]], None, None)
    assert len(times) == 2 and times[1] >= 0.05 > times[0]


def test_run_refuses_fewer_than_nine_rounds():
    r = subprocess.run([str(HARNESS.parent / "run"), "--rounds", "3", "--no-write"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "at least 9" in r.stderr


def test_a_floor_has_no_goal_and_renders_a_dash(h):
    p = h.Pair("floor-docker", "floor", ["a"], "ref", ["b"], goal_ratio=None)
    p.a, p.b = [0.2, 0.2, 0.2], [0.1, 0.1, 0.1]
    s = p.summary()
    assert s["met"] is None and s["goal"] == "none (a floor)" and s["ratio"] == 2.0
    m = {"date": "d", "commit": "c", "host": "h", "cpu": "x", "cores": 2, "mem": "1", "kernel": "k",
         "load_start": (0, 0, 0), "load_end": (0, 0, 0), "python": "3", "versions": {},
         "hyperfine": "hf", "docker": "dk", "sha256sum": "s"}
    row = h.render(m, [s], [])
    assert "| none (a floor) | - |" in row


@pytest.mark.skipif(shutil.which("hyperfine") is None, reason="hyperfine not installed")
def test_cpu_time_leaves_out_the_time_asleep(h, monkeypatch):
    """``--cpu`` times user + system CPU: a command that sleeps 0.2 s costs far less CPU than
    wall time, one that spins 0.2 s about as much."""
    monkeypatch.setattr(h, "MEASURE", "cpu")
    spin = [sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"]
    asleep, busy = h.hyperfine([["sleep", "0.2"], spin], None, None)
    assert asleep < 0.05 and busy >= 0.2


def test_every_floor_command_runs_and_the_profile_floor_validates_the_reference_profile(h):
    """Each floor's two commands run as the harness would start them (exit 0); the profile
    floor loads the profile `plan` is timed on, through escha-deploy's loader and its models."""
    pairs = {p.key: p for p in h.floor_pairs()}
    assert set(pairs) == {"floor-pydantic", "floor-profile", "floor-docker"}
    for p in pairs.values():
        for argv in (p.cmd, p.ref):
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (p.key, r.stderr)
    probe = pairs["floor-profile"].cmd[:2] + [pairs["floor-profile"].cmd[2] + (
        "\nimport sys; print(sorted(m for m in sys.modules if m.startswith('escha_deploy.profile.models')))")]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "escha_deploy.profile.models" in out and "rtx5060ti-tp2" in h.PROFILE_FLOOR
    assert "rtx5060ti-tp2" in h.PLAN_ARGS
