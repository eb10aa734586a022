"""``bench --hicache-ab --launcher native`` on the real server (marked ``gpu``).

The bench starts the GPU rig's profile (tests/gpu_rig/h200-tiny.yaml: SGLang 0.5.19 from the
serving closure, a tiny random-weight hybrid Qwen3.5 model, a 2,048-token device pool, HiCache
at ratio 2) through ``escha-deploy serve --profile`` twice, HiCache off then on, with the same
workload: 3 distinct 900-token prefixes (2,700 tokens: more than the device pool, so the second
pass finds them on the host tier only when HiCache is on). Expected: exit 0, two runs labelled
off and on, the on-run's second pass served partly from the host tier (response or metrics)
and faster than its first; the off-run's second pass takes nothing from a host tier.
The figures go to ``$ESCHA_GPU_REPORT`` for docs/bench.md (an H200, never a consumer card).

Run on the GPU machine after ``scripts/gpu-run.sh`` has installed the closure (it sets
``ESCHA_RUNTIME_DESCRIPTION``): ``python3 -m pytest -m gpu -q tests/bench/test_ab_gpu.py``
(two servers start one after the other: about 3 to 5 minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.gpu_rig import realserver as rs

pytestmark = pytest.mark.gpu

PROFILE = rs.RIG / "h200-tiny.yaml"


def test_hicache_ab_natively_on_the_rig(tmp_path):
    rs.closure_description()
    rs.make_model(PROFILE, "tiny")
    out = tmp_path / "ab.json"
    r = subprocess.run(
        [sys.executable, "-m", "escha_deploy", "bench", "--hicache-ab", "--launcher", "native", "--profile", str(PROFILE),
         "--prefixes", "3", "--prefix-tokens", "900", "--prefill-tokens", "1000", "--decode-tokens", "32",
         "--request-timeout", "300", "--format", "json"],
        capture_output=True, text=True, cwd=rs.REPO, timeout=560, env=dict(os.environ))
    out.write_text(r.stdout)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout)
    assert report["mode"] == "hicache-ab" and [run["facts"]["hicache"] for run in report["runs"]] == [False, True]
    off, on = report["runs"]
    figures = {label: {"first_s": run["first_pass"]["wall_s"], "second_s": run["second_pass"]["wall_s"],
                       "second_cached": run["second_pass"]["cached"], "prefill_ttft_s": run["prefill"]["ttft_s"]}
               for label, run in (("off", off), ("on", on))}
    rs.report("bench/hicache_ab_tiny", figures)
    assert (off["second_pass"]["cached"]["host_tokens"] or 0) == 0
    assert (on["second_pass"]["cached"]["host_tokens"] or 0) > 0 or any(
        v > 0 for v in (on["second_pass"]["cached"]["load_back_tokens"] or {}).values())
    assert on["second_pass"]["wall_s"] < on["first_pass"]["wall_s"]
