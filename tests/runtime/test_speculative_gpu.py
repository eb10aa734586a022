"""NEXTN speculative decoding on the real server with HiCache on (marked ``gpu``).

Native ``escha-deploy serve --profile tests/gpu_rig/h200-tiny.yaml`` with ``runtime.speculative``
NEXTN (3 steps, top-k 1, 4 draft tokens) and the model's own folder as the draft
(``model.draft``), the model ``make_model.py tiny-mtp`` makes: the tiny hybrid Qwen3.5 with one
MTP layer (``mtp_num_hidden_layers: 1``, the ``mtp.*`` tensors SGLang's
``srt/models/qwen3_5_mtp.py: Qwen3_5ForCausalLMMTP`` loads). ``runtime.max_total_tokens`` is
800,000 so that the host pool at ratio 2 is gigabytes and the draft's packed layer a measurable
half of it. One server start; what is compared with the plan:

- the host KV pool: SGLang 0.5.19 packs the draft's MTP layer into the target's host KV pool
  when HiCache is on (``speculative/base_spec_worker.py: _build_hicache_draft_plan``, decided by
  ``_can_pack_hicache_mtp``; ``mem_cache/pool_host/mha.py: get_size_per_token`` with
  ``layer_num + 1``): 2,048 B per token for the tiny model's one full-attention layer plus the
  draft's, where the target alone takes 1,024. The plan says so (``host_kv_bytes_per_token``),
  ``serve``'s pre-flight (SGLang's own pool classes on this GPU) gives the plan's host KV bytes,
  SGLang's log gives the plan's host tokens, and the pinned pools read from /proc/meminfo across
  the host pools' allocation (``test_real_server_shape_gpu._pool_cost``'s window) are within 3 %
  and 64 MiB of the plan's pinned bytes, and further than that from what the pools would pin
  without the draft's layer. The pools are the window's ``Shmem`` growth: both allocators' buffers
  (the stock ``alloc_mmap`` + ``cudaHostRegister``, and ``cudaHostAlloc``) are shared pages the
  kernel counts there. ``MemTotal - MemAvailable`` over the same window is reported beside it and
  is larger: the first run on the H200 (2026-12-02) read 3,803,537,408 B used against 3,303,374,848 B
  of Shmem (the plan: 3,303,366,656), the rest the processes' own heap (``AnonPages`` +329,625,600:
  under NEXTN the draft worker starts right after the target's pools), not a pool;
- the device pools: SGLang's ``KV Cache is allocated`` lines (the target's and the draft
  worker's) and its mamba pool, against the plan's device KV tokens, draft KV bytes and mamba
  slots; ``serve``'s drift check at ready passes;
- a request is served with speculation on (``/generate``, greedy); its ``meta_info`` is reported;
- SIGTERM: nothing of the server's tree is left, and MemAvailable comes back.

Figures go to ``$ESCHA_GPU_REPORT`` under ``spec/nextn``. Run by ``DEADLINE=570 bash
scripts/gpu-run.sh spec``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu_rig import realserver as rs
from tests.runtime import test_real_server_shape_gpu as shape

pytestmark = pytest.mark.gpu

PROFILE = rs.RIG / "h200-tiny.yaml"
MODEL = Path("/tmp/escha-rig/models/tiny-mtp")
#: one full-attention layer of 2 KV heads of 128, bf16, K and V (the tiny rig's): bytes per token
LAYER_BYTES = 2 * 128 * 2 * 2
SETS = [f"model.path={MODEL}", f"model.host_dir={MODEL}", f"model.draft.path={MODEL}", f"model.draft.host_dir={MODEL}",
        "runtime.speculative.algorithm=NEXTN", "runtime.speculative.num_steps=3", "runtime.speculative.eagle_topk=1",
        "runtime.speculative.num_draft_tokens=4", "runtime.mamba_radix_cache_strategy=auto",
        "runtime.max_total_tokens=800000", "hicache.hicache_ratio=2"]
#: the tiny rig is ready in 34 s with warm JIT caches, 165 s without (test_real_server_gpu.py);
#: the draft worker adds its own model load and pools
READY_TIMEOUT_S = 330
KV_DEVICE = re.compile(r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+),[^\n]*")
MAMBA_DEVICE = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+),[^\n]*")
HOST_KV = re.compile(r"Allocating \w+ hierarchical KV host pool: (\d+) tokens[^\n]*")
PREFLIGHT = re.compile(r"SGLang's pre-flight passed in ([\d.]+) s.*?host pools (\d+) B KV \+ (\d+) B mamba per rank")


def _make_model() -> None:
    if not (MODEL / "config.json").is_file():
        r = subprocess.run([sys.executable, str(rs.MAKE_MODEL), "tiny-mtp", str(MODEL)], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def nextn(tmp_path_factory):
    """``(plan, figures, log text)`` of one NEXTN server run (module docstring)."""
    rs.closure_description()
    _make_model()
    plan = rs.plan_json(PROFILE, SETS)
    log = rs.logs_dir(tmp_path_factory) / "serve-tiny-nextn.log"
    trace = log.with_suffix(".geometry.jsonl")
    trace.unlink(missing_ok=True)
    env = dict(os.environ, ESCHA_GPU_GEOMETRY_TRACE=str(trace),
               PYTHONPATH=os.pathsep.join([str(shape.TRACE_SITE), os.environ.get("PYTHONPATH", "")]))
    port = rs.free_port()
    baseline = rs.mem_available()
    sampler = rs.MemSampler(log)
    srv = rs.start(rs.serve_cmd(PROFILE, port, SETS), log, port, env)
    sampler.start()
    try:
        rs.wait_ready(srv, READY_TIMEOUT_S)
        fig = {"ready_seconds": srv.seconds_to_ready, "processes": len(srv.tree), "baseline": baseline,
               **shape._pool_cost(sampler, srv), "drift": rs.wait_drift(srv)}  # noqa: SLF001
        fig["generate"] = _generate(srv.base)
        text = srv.log_text()
        fig["sigterm"] = rs.sigterm(srv)
    finally:
        sampler.stop()
        rs.kill_all(srv)
    back = rs.settle_mem_available(baseline, shape.NOISE)
    fig.update(mem_available_back=back, not_returned_bytes=baseline - back,
               geometry=shape._trace(trace))  # noqa: SLF001
    fig.pop("used_trace", None)
    pr = plan["per_rank"]
    fig["plan"] = {k: pr[k] for k in ("device_kv_tokens", "device_kv_bytes_per_token", "device_draft_kv_bytes",
                                      "draft_kv_bytes_per_token", "device_mamba_slots",
                                      "device_mamba_intermediate_bytes", "host_kv_tokens", "host_kv_bytes_per_token",
                                      "host_kv_bytes", "host_mamba_bytes", "pinned_bytes")}
    fig["log"] = {"kv_device": [m.group(0)[-200:] for m in KV_DEVICE.finditer(text)],
                  "mamba_device": [m.group(0)[-200:] for m in MAMBA_DEVICE.finditer(text)],
                  "host_kv": [m.group(0)[-200:] for m in HOST_KV.finditer(text)]}
    m = PREFLIGHT.search(text)
    fig["preflight"] = {"seconds": float(m.group(1)), "host_kv_bytes": int(m.group(2)),
                        "host_mamba_bytes": int(m.group(3))} if m else None
    rs.report("spec/nextn", fig)
    return plan, fig, text


def _generate(base: str) -> dict:
    import httpx

    ids = [(31 * k + 7) % 1990 + 5 for k in range(300)]
    r = httpx.post(base + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 32, "temperature": 0, "ignore_eos": True}}, timeout=240)
    assert r.status_code == 200, r.text[:2000]
    mi = r.json().get("meta_info", {})
    return {k: v for k, v in mi.items() if k in ("prompt_tokens", "completion_tokens", "cached_tokens") or "spec" in k}


def test_the_plan_packs_the_drafts_layer_into_the_host_kv_pool(nextn):
    plan, fig, text = nextn
    pr = plan["per_rank"]
    assert plan["verdict"] == "ok", plan["reasons"]
    assert (pr["device_kv_bytes_per_token"], pr["host_kv_bytes_per_token"]) == (LAYER_BYTES, 2 * LAYER_BYTES), pr
    assert pr["host_kv_bytes"] == pr["host_kv_tokens"] * 2 * LAYER_BYTES
    # serve's pre-flight built SGLang's own host pools on this GPU with the draft packed
    assert fig["preflight"], text[-4000:]
    assert (fig["preflight"]["host_kv_bytes"], fig["preflight"]["host_mamba_bytes"]) == (
        pr["host_kv_bytes"], pr["host_mamba_bytes"]), fig["preflight"]


def test_the_host_pools_sglang_pins_are_the_plans(nextn):
    plan, fig, _ = nextn
    pr = plan["per_rank"]
    tokens = [int(HOST_KV.search(x).group(1)) for x in fig["log"]["host_kv"]]
    assert tokens == [pr["host_kv_tokens"]], fig["log"]["host_kv"]  # one pool: the draft is packed, no sidecar
    shape._check_pinned_cost(fig, pr["pinned_bytes"])  # noqa: SLF001  (the Shmem rise: module docstring)
    without_draft = pr["pinned_bytes"] - pr["host_kv_tokens"] * LAYER_BYTES
    assert abs(fig["pools_bytes"] - without_draft) > shape.ABS_TOLERANCE, (fig["pools_bytes"], without_draft)


def test_the_device_pools_and_the_drift_check(nextn):
    plan, fig, text = nextn
    pr = plan["per_rank"]
    kv = [int(KV_DEVICE.search(x).group(1)) for x in fig["log"]["kv_device"]]
    # the target's pool and the draft worker's, both at the target's token count (the draft shares
    # req_to_token: speculative/eagle_worker.py)
    assert kv and all(t == pr["device_kv_tokens"] for t in kv), (kv, fig["log"]["kv_device"])
    slots = [int(MAMBA_DEVICE.search(x).group(1)) for x in fig["log"]["mamba_device"]]
    assert slots and slots[0] == pr["device_mamba_slots"], fig["log"]["mamba_device"]
    assert fig["drift"]["drift"] == [], fig["drift"]
    assert fig["drift"]["log"] > 0, text[-4000:]
    checks = [g for g in fig["geometry"] if g.get("event") == "check_host_pool"]
    assert checks and all(g["error"] is None for g in checks), fig["geometry"]


def test_a_request_is_served_and_the_tree_goes(nextn):
    _, fig, _ = nextn
    assert fig["generate"].get("completion_tokens") == 32, fig["generate"]
    assert fig["sigterm"]["exit"] == 0 and fig["sigterm"]["left"] == [], fig["sigterm"]
    assert fig["not_returned_bytes"] < shape.NOISE, fig
