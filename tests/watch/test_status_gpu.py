"""``status`` on the real server, TP 1 (marked ``gpu``).

A fresh GPU-rig server (started as tests/runtime/test_real_server_gpu.py starts one: native
``serve --profile tests/gpu_rig/h200-tiny.yaml``, SGLang 0.5.19, a 2,048-token device pool, host
pool at ratio 2) gets a load that reaches the host tier: 4 distinct 900-token prefixes asked
twice in turn (3,600 tokens: the first pass pushes each out of the device pool before its
second ask). Then ``status`` finds the server by ``serve``'s state file and:

- its view since the start equals what the responses said (``meta_info.cached_tokens_details``
  device and host, summed) and what ``/metrics`` says, with SGLang 0.5.19's radix-cache counters
  under "all ranks" (no ``tp_rank`` on them) and the scheduler's gauges under rank 0;
- the inert-tier alert stays quiet on this paying tier (``--check`` exit 0);
- host memory is beside it: MemAvailable and the server's RSS;
- ``--watch --count 2`` draws the view twice; ``--record`` writes two JSON lines.

Run on the GPU machine after ``scripts/gpu-run.sh`` has installed the closure:
``python3 -m pytest -m gpu -q tests/watch/test_status_gpu.py``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from tests.gpu_rig import realserver as rs

pytestmark = pytest.mark.gpu

PROFILE = rs.RIG / "h200-tiny.yaml"
READY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A fresh rig server for this module (as tests/runtime/test_real_server_gpu.py starts one)."""
    rs.closure_description()
    rs.make_model(PROFILE, "tiny")
    log = rs.logs_dir(tmp_path_factory) / ("serve-tiny-%s.log" % __name__.rsplit(".", 1)[-1])
    port = rs.free_port()
    srv = rs.start(rs.serve_cmd(PROFILE, port), log, port)
    try:
        rs.wait_ready(srv, READY_TIMEOUT_S)
        yield srv
    finally:
        rs.kill_all(srv)

PREFIXES, TOKENS = 4, 900
VOCAB = 2048  # the tiny model's (tests/gpu_rig/make_model.py)


def _status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "escha_deploy", "status", "--profile", "h200-tiny", *args],
                          capture_output=True, text=True, cwd=rs.REPO, timeout=120)


@pytest.fixture(scope="module")
def loaded(server):
    import httpx

    rng = random.Random(7)
    prompts = [[rng.randrange(10, VOCAB - 10) for _ in range(TOKENS)] for _ in range(PREFIXES)]
    got = {"device": 0, "host": 0, "requests": 0}
    with httpx.Client(base_url=server.base, timeout=300, trust_env=False) as c:
        for _ in range(2):
            for ids in prompts:
                r = c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                                                   "temperature": 0},
                                              "return_cached_tokens_details": True})
                r.raise_for_status()
                d = r.json()["meta_info"].get("cached_tokens_details") or {}
                got["device"] += int(d.get("device") or 0)
                got["host"] += int(d.get("host") or 0)
                got["requests"] += 1
        metrics = c.get("/metrics").text
    rs.report("status/load", got)
    assert got["host"] > 0, got  # the load reached the host tier
    return got, metrics


def test_the_view_equals_the_responses_and_the_metrics(loaded):
    from escha_deploy.bench.metrics import Snapshot

    got, metrics = loaded
    r = _status("--format", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout)
    s = row["server"]
    w = s["window"]
    assert w["since_start"] and w["requests"] == got["requests"]
    assert w["cached_tokens"].get("host", 0) == got["host"] and w["cached_tokens"].get("device", 0) == got["device"]
    snap = Snapshot.parse(metrics)
    every, rank0 = s["ranks"]["all"], s["ranks"]["0"]
    assert every["load_back_tokens"]["kv"] >= snap.total("sglang:load_back_tokens_total", pool="kv") > 0
    assert rank0["load_back_tokens"] is None and rank0["host_used_tokens"] > 0
    assert rank0["host_total_tokens"] == rank0["planned_host_tokens"]  # SGLang's host pool is the plan's
    assert every["load_back_gb_per_s"] and every["load_back_gb_per_s"] > 0
    assert row["host"]["mem_available_bytes"] > 0 and row["host"]["server_rss_bytes"] > 0
    assert s["unknown_series"], "the real 0.5.19 exposition has series no catalog defines; they are named"
    rs.report("status/view", {"ranks": s["ranks"], "window": w, "host": {k: row["host"][k] for k in
                                                                      ("mem_available_bytes", "server_rss_bytes")}})


def test_check_is_quiet_on_a_paying_tier(loaded):
    r = _status("--check", "--interval", "1", "--format", "json")
    (row,) = json.loads(r.stdout)
    assert r.returncode == 0 and row["alerts"] == [], (r.stderr[-2000:], row["alerts"])


def test_watch_draws_and_records(loaded, tmp_path):
    rec = tmp_path / "day2.jsonl"
    r = _status("--watch", "--count", "2", "--interval", "1", "--record", str(rec))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "all ranks" in r.stdout and "rank 0" in r.stdout and "MemAvailable" in r.stdout
    from escha_deploy.watch.record import read_record

    looks = read_record(rec)
    assert len(looks) == 2 and all(lk["targets"][0]["profile"] == "h200-tiny" for lk in looks)
