"""Drift check on log lines in SGLang 0.5.19's real formats (see escha_deploy/launch/drift.py)."""

from __future__ import annotations

from escha_deploy.launch.drift import PlannedSizes, compare, parse_sizes

# The reference plan at ratio 2 (the reference box (16 GiB WSL2, two 12 GiB RTX 5060 Ti, TP 2, INT2 KV, ratio 2)): host KV 420,008 tokens x 6,144 B
# = 2,580,529,152 B; host mamba 33 slots x 76,972,032 B = 2,540,077,056 B; device KV 210,000.
PLANNED = PlannedSizes(kv_tokens=210000, host_kv_tokens=420008, host_kv_bytes=2_580_529_152,
                       host_mamba_bytes=2_540_077_056, device_mamba_slots=16)


def log(kv_gb="2.58", mamba_gb="2.54", tokens=420008, total=210000):
    out = []
    for tp in (0, 1):
        out += [
            f"[2026-11-29 16:20:00 TP{tp}] Mamba Cache is allocated. max_mamba_cache_size: 16, "
            "conv_state size: 0.06GB, ssm_state size: 1.21GB ",
            f"[2026-11-29 16:20:01 TP{tp}] Allocating kv hierarchical KV host pool: {tokens} tokens, "
            f"{kv_gb} GB host memory.",
            f"[2026-11-29 16:20:01 TP{tp}] Allocating {mamba_gb} GB host memory for hierarchical Mamba "
            "cache (layout=page_first).",
        ]
    out.append(f"[2026-11-29 16:20:09 TP0] max_total_num_tokens={total}, chunked_prefill_size=2048, "
               "max_prefill_tokens=16384, max_running_requests=3, context_len=131072, "
               "available_gpu_mem=0.95 GB")
    return out


def test_parse_per_rank_and_scheduler():
    obs = parse_sizes(log())
    assert set(obs.ranks) == {0, 1}
    assert obs.ranks[1].host_kv_tokens == 420008 and obs.ranks[1].host_kv_bytes == 2_580_000_000
    assert obs.ranks[0].host_mamba_bytes == 2_540_000_000 and obs.ranks[0].device_mamba_slots == 16
    assert obs.max_total_num_tokens == 210000 and obs.available_gpu_mem_bytes == 950_000_000


def test_seed_figures_match_within_print_resolution():
    rep = compare(PLANNED, parse_sizes(log()))
    assert rep.items == [] and rep.compared == 9


def test_mtp_variant_of_the_host_pool_line_parses():
    line = ("[2026-11-29 16:20:01 TP0] Allocating kv hierarchical KV host pool: 420008 tokens, 2.58 GB "
            "host memory, packed MTP KV layers: target_layers=16, draft_layers=1, total_layers=17.")
    assert parse_sizes([line]).ranks[0].host_kv_bytes == 2_580_000_000


def test_drift_is_reported_per_rank():
    rep = compare(PLANNED, parse_sizes(log(kv_gb="2.62", total=205000)))
    figs = [(i.figure, i.rank) for i in rep.items]
    assert ("host KV pool", 0) in figs and ("host KV pool", 1) in figs
    assert ("device KV tokens (max_total_num_tokens)", None) in figs
    line = next(i for i in rep.items if i.figure == "host KV pool").line()
    assert line == "drift: host KV pool rank 0: planned 2.58 GB, server logged 2.62 GB (+1.5%)"


def test_counts_are_compared_exactly_and_bytes_at_the_printed_precision():
    # 2,580,529,152 B prints as 2.58 GB: equal at SGLang's %.2f; one token or slot less is drift
    rep = compare(PLANNED, parse_sizes(log(tokens=420007, total=209999)))
    assert sorted((i.figure, i.rank) for i in rep.items) == [
        ("device KV tokens (max_total_num_tokens)", None), ("host KV pool tokens", 0), ("host KV pool tokens", 1)]
    assert compare(PLANNED, parse_sizes(log(kv_gb="2.59"))).items[0].line() == (
        "drift: host KV pool rank 0: planned 2.58 GB, server logged 2.59 GB (+0.4%)")


def test_other_host_pool_labels_are_ignored():
    line = "[2026-11-29 16:20:01 TP0] Allocating indexer hierarchical KV host pool: 5 tokens, 9.99 GB host memory."
    assert parse_sizes([line]).ranks == {}
