"""Parsing SGLang's /metrics text: names, labels, TP-rank de-duplication, deltas."""

from __future__ import annotations

from escha_deploy.bench.metrics import (
    CACHED_TOKENS,
    HOST_TOTAL_TOKENS,
    LOAD_BACK_TOKENS,
    Snapshot,
    delta,
)

# The shape prometheus_client writes for SGLang 0.5.19's collectors (names and label sets from
# observability/metrics_collector.py), as two TP ranks export it with
# --enable-metrics-for-all-schedulers.
TEXT = """\
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="m"} 100.0
sglang:cached_tokens_total{cache_source="host",engine_type="unified",model_name="m"} 40.0
# HELP sglang:load_back_tokens_total The number of tokens loaded back from local host DRAM (L2) to GPU, by host pool (kv, swa, mamba, ...).
# TYPE sglang:load_back_tokens_total counter
sglang:load_back_tokens_total{engine_type="unified",model_name="m",moe_ep_rank="0",pool="kv",pp_rank="0",tp_rank="0"} 40.0
sglang:load_back_tokens_total{engine_type="unified",model_name="m",moe_ep_rank="0",pool="kv",pp_rank="0",tp_rank="1"} 40.0
sglang:load_back_tokens_total{engine_type="unified",model_name="m",moe_ep_rank="0",pool="mamba",pp_rank="0",tp_rank="0"} 1.0
# HELP sglang:hicache_host_total_tokens Total capacity of the host KV cache in tokens.
# TYPE sglang:hicache_host_total_tokens gauge
sglang:hicache_host_total_tokens{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 420008.0
sglang:hicache_host_total_tokens{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 420008.0
"""


def test_totals_by_label_and_rank_zero_only():
    s = Snapshot.parse(TEXT)
    assert s.total(CACHED_TOKENS) == 140
    assert s.total(CACHED_TOKENS, cache_source="host") == 40
    assert s.total(LOAD_BACK_TOKENS) == 41  # tp_rank 1 not counted twice
    assert s.total(LOAD_BACK_TOKENS, pool="kv") == 40
    assert s.total(HOST_TOTAL_TOKENS) == 420008
    assert s.labels_of(LOAD_BACK_TOKENS, "pool") == {"kv", "mamba"}
    assert not s.has("sglang:evicted_tokens_total")


def test_delta_between_scrapes():
    before = Snapshot.parse(TEXT)
    after = Snapshot.parse(TEXT.replace("} 40.0\n", "} 90.0\n"))
    assert delta(after, before, CACHED_TOKENS, cache_source="host") == 50
    assert delta(after, before, LOAD_BACK_TOKENS, pool="kv") == 50


def test_standin_exposition_parses_with_the_real_names(standin):
    import httpx

    srv = standin(tp_size=2)
    s = Snapshot.parse(httpx.get(srv.url + "/metrics").text)
    assert s.has(HOST_TOTAL_TOKENS) and s.total(HOST_TOTAL_TOKENS) == srv.cfg.host_tokens


def test_standin_runs_as_a_process_and_reads_the_hicache_override():
    """What an image running the stand-in gets from ``escha-deploy serve``'s command line."""
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    script = Path(__file__).with_name("standin_sglang.py")
    p = subprocess.Popen([sys.executable, str(script), "serve", "--profile", "x", "--set",
                          "hicache.enabled=false", "--port", "0"],
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        while line and "listening on" not in line:
            line = p.stdout.readline()
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:")
        info = httpx.get(url + "/server_info", timeout=5).json()
        assert info["enable_hierarchical_cache"] is False
    finally:
        p.terminate()
        p.wait(timeout=5)
