"""The real server through the product, on a CUDA GPU (marked ``gpu``).

Native ``escha-deploy serve --profile tests/gpu_rig/h200-tiny.yaml``: SGLang 0.5.19 patched by
escha-deploy's series, from the serving closure (``scripts/gpu_closure.py install``, which
``scripts/gpu-run.sh`` runs and whose runtime description ``$ESCHA_RUNTIME_DESCRIPTION``
names), serving a tiny random-weight hybrid Qwen3.5 model made on the machine
(``tests/gpu_rig/make_model.py tiny``). One server for the module; in order:

1. ``plan`` of the rig plans the closure's runtime (its release and capabilities, from its
   description: no ``runtime.needs`` override), and ``serve``'s log shows SGLang's pre-flight
   passed on the real GPU with the plan's per-rank host pool bytes;
2. ``serve``'s drift check at ready (``launch/drift.py``, the one ``up`` runs) passes on the real
   server's log and ``/server_info``: no ``drift:`` line, and the line saying how many figures
   agreed names figures from both; ``/server_info`` read here agrees with the plan too;
3. a prefix pushed out of the device pool comes back from the host tier (how SGLang decides
   what is a host hit on a hybrid model, and what its load-back counter counts, is in
   ``test_a_prefix_pushed_out_of_the_device_pool_comes_back_from_host``);
4. SIGTERM to ``serve``: it exits, and no process of the server's tree (``serve``, SGLang's
   launcher, scheduler, detokenizer, the watchdog) is left.

Nothing here stands in for SGLang; the closure's departures from a stock install are its own
(docs/runtime.md, "The serving closure"). ``$ESCHA_GPU_LOGS``: where serve's log is kept (else a
temp dir); ``$ESCHA_GPU_REPORT``: a JSON file the figures are added to.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.gpu_rig import realserver as rs

pytestmark = pytest.mark.gpu

PROFILE = rs.RIG / "h200-tiny.yaml"
#: Time to ready: 34 s with the JIT caches of an earlier run, 165 s without (H200, 2026-12-01,
#: SGLang's pre-flight included); the first forward then compiles Triton's GDN kernels.
READY_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 240
PREFIX_TOKENS = 1000
PAGE = 1  # the rig's page_size
#: SGLang's mamba checkpoint grid on this rig: ``runtime_context.mamba_checkpoint_grid`` =
#: lcm(``arg_groups/overrides.py: mamba_cache_chunk_size`` = max(FLA chunk 64
#: (``fla/chunk_delta_h.CHUNK_SIZE``; the model's config sets no ``mamba_chunk_size``), page 1), page 1).
MAMBA_GRID = 64


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    rs.closure_description()
    rs.make_model(PROFILE, "tiny")
    log = rs.logs_dir(tmp_path_factory) / "serve-tiny.log"
    port = rs.free_port()
    srv = rs.start(rs.serve_cmd(PROFILE, port), log, port)
    try:
        rs.wait_ready(srv, READY_TIMEOUT_S)
        rs.report("real_server/ready", {"seconds": srv.seconds_to_ready, "processes": len(srv.tree)})
        yield srv
    finally:
        rs.kill_all(srv)


def _plan() -> dict:
    return rs.plan_json(PROFILE)


def test_serve_plans_the_closure_and_its_preflight_passes(server):
    desc = rs.closure_description()
    plan = _plan()
    # the closure's description decides the runtime planned: its release and its capabilities
    assert plan["sglang_release"] == desc["sglang_version"] == "0.5.19"
    assert plan["sglang_release_source"].startswith("this runtime"), plan["sglang_release_source"]
    assert sorted(plan["capabilities"]) == sorted(desc["capabilities"]) != []
    text = server.log_text()
    m = re.search(r"SGLang's pre-flight passed in ([\d.]+) s.*?host pools (\d+) B KV \+ (\d+) B mamba per rank", text)
    assert m, text[-4000:]
    figures = {"preflight_seconds": float(m.group(1)),
               "preflight_host_kv_bytes": int(m.group(2)), "preflight_host_mamba_bytes": int(m.group(3)),
               "plan_host_kv_bytes": plan["per_rank"]["host_kv_bytes"],
               "plan_host_mamba_bytes": plan["per_rank"]["host_mamba_bytes"]}
    rs.report("real_server/preflight", figures)
    assert (figures["preflight_host_kv_bytes"], figures["preflight_host_mamba_bytes"]) == (
        figures["plan_host_kv_bytes"], figures["plan_host_mamba_bytes"])


def test_the_drift_check_passes_on_the_real_log_and_server_info_agrees(server):
    fig = rs.wait_drift(server)  # serve runs it once the server is ready (native.supervise on_ready)
    agree = rs.server_info_agreement(server.base, _plan())
    rs.report("real_server/drift", {**fig, "server_info_vs_plan": agree})
    assert fig["drift"] == [], fig["drift"]
    # the log's 8 (launch/drift.py: device KV tokens twice, mamba slots, host KV tokens and GB, host
    # mamba GB, max running requests, context length) and /server_info's 4 (max_total_num_tokens,
    # effective_max_running_requests_per_dp, context_length, max_mamba_cache_size)
    assert (fig["log"], fig["server_info"]) == (8, 4), (fig, server.log_text()[-4000:])
    assert agree and all(p == o for p, o in agree.values()), agree


def _counter(base: str, name: str, pool: str) -> float:
    """``sglang:NAME{pool=POOL}`` summed over its other labels (``cache_type``:
    ``srt/observability/metrics_collector.py``); 0 before the series first appears."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name == f"sglang:{name}" and s.labels.get("pool") == pool:
                total += s.value
    return total


def _generate(base: str, ids: list[int]) -> dict:
    import httpx

    t = time.monotonic()
    r = httpx.post(base + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text[:2000]
    mi = r.json().get("meta_info", {})
    return {"prompt_tokens": mi.get("prompt_tokens"), "cached_tokens": mi.get("cached_tokens"),
            "details": mi.get("cached_tokens_details"), "seconds": round(time.monotonic() - t, 3)}


def _ids(seed: int, n: int) -> list[int]:
    """``n`` token ids below the tokenizer's vocabulary (2000), distinct per ``seed`` from the
    first id on (so no two seeds share a radix-tree node)."""
    return [(17 * seed + 31 * k + 7 * (k // 97)) % 1990 + 5 for k in range(n)]


def test_a_prefix_pushed_out_of_the_device_pool_comes_back_from_host(server):
    """How SGLang 0.5.19 serves a hybrid (GDN) model's prefix from host, read in its code:

    - A radix-tree match ends at a node that holds a mamba state (``mem_cache/unified_cache/
      components/mamba_component.py: create_match_validator``); a request's state is stored at
      the end of its own sequence, so a second prompt that only shares a prefix matches nothing.
      That match sets ``mamba_branching_seqlen``, the shared length floored to the checkpoint
      grid (``finalize_match_result_in_tree_core``: 960 for a 1,000-token prefix, grid 64), and
      the second request keeps its state there as well (``managers/schedule_batch.py:
      _mamba_radix_cache_v2_req_prepare_for_extend``, extra_buffer strategy). So: prefix + a,
      prefix + b (the branch), three other prompts push both out of the 2,048-token device pool
      (write-through keeps them on host), then prefix + c hits the branch point from host.
    - ``cached_tokens_details.host`` is the match's ``host_hit_length`` (``schedule_batch.py:
      split_cached_prefix_by_tier``): the host-backed tokens between the last node valid on the
      device for every pool and the matched node (``full_component.py:
      finalize_match_result_in_tree_core``), whether or not their KV is still on the device.
    - ``load_back_tokens_total{pool="kv"}`` rises by the KV tokens a load actually copied:
      ``len(op.device_indices)`` (``hybrid_cache/hybrid_cache_controller.py: _num_tokens_by_pool``),
      the evicted nodes on the path (``full_component.py: build_hicache_transfers``, LOAD_BACK),
      counted when the load's ack is polled (``unified_radix_cache.py: loading_check``). So the
      rise is at most the host hit, and equals it when the whole matched prefix had left the
      device pool, as here (no other prompt shares its first token). ``{pool="mamba"}`` rises
      by 2 per such load: the node's state restored, and its copy into the request's slot
      (``mamba_component.py: build_hicache_transfers``).
    """
    prefix = _ids(0, PREFIX_TOKENS)
    kv0, mamba0 = _counter(server.base, "load_back_tokens_total", "kv"), _counter(
        server.base, "load_back_tokens_total", "mamba")
    steps = [("prefix + a", _generate(server.base, prefix + _ids(100, 24))),
             ("prefix + b", _generate(server.base, prefix + _ids(300, 24)))]
    # three other 1,000-token prompts: 3,000+ tokens through a 2,048-token device pool
    for i in (1, 2, 3):
        steps.append((f"other {i}", _generate(server.base, _ids(i, PREFIX_TOKENS))))
    again = _generate(server.base, prefix + _ids(200, 24))
    steps.append(("prefix + c", again))
    details = again["details"] or {}
    host = details.get("host", 0)
    deadline, kv, mamba = time.monotonic() + 15, kv0, mamba0
    while time.monotonic() < deadline:  # the counter moves when loading_check polls the ack
        kv, mamba = (_counter(server.base, "load_back_tokens_total", p) for p in ("kv", "mamba"))
        if kv - kv0 >= host > 0:
            break
        time.sleep(0.5)
    expected_hit = PREFIX_TOKENS // MAMBA_GRID * MAMBA_GRID
    rs.report("real_server/load_back", {"steps": steps, "host_hit": host, "device_hit": details.get("device", 0),
                                        "expected_host_hit": expected_hit,
                                        "load_back_kv": kv - kv0, "load_back_mamba": mamba - mamba0})
    assert (details.get("device", 0), host) == (0, expected_hit), steps
    assert host - PAGE <= kv - kv0 <= host, (kv0, kv, steps)
    assert mamba - mamba0 >= 1, (mamba0, mamba)  # the branch point's state came back from host


def test_sigterm_leaves_no_process_of_the_server_tree(server):
    procs = rs.alive(rs.tree(server.proc.pid) + server.tree)
    assert len(procs) >= 3, [p.pid for p in procs]  # serve, SGLang's launcher and its workers
    res = rs.sigterm(server)
    rs.report("real_server/sigterm", res)
    assert res["exit"] == 0, server.log_text()[-3000:]
    assert res["left"] == [], res["left"]
