"""Configuration rules, each naming its field; and the field reports' configuration cases.
Rules that need the profile alone are refused when it loads: tests/test_profile_rules.py."""

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB

BOX = described_host(64 * GiB, "linux")


def findings(profile, sets=(), **kw):
    p = plan(load_profile(profile, list(sets)), BOX, **kw)
    return p, {(f.severity, f.field) for f in p.findings}, " | ".join(f.message for f in p.findings)


@pytest.mark.parametrize("sets,field,needle", [
    (["hicache.hicache_mem_layout=layer_first"], "hicache.hicache_mem_layout", "page_first"),
    (["hicache.hicache_mem_layout=page_head"], "hicache.hicache_mem_layout", "MambaPoolHost"),
    (["hicache.hicache_host_memory_mode=buffer_only", "hicache.hicache_storage_backend=mooncake"],
     "hicache.hicache_host_memory_mode", "FULL/SWA"),
    (["hicache.hicache_storage_backend=eic"], "hicache.l3.kind", "NotImplementedError"),
    (["hicache.hicache_storage_backend=simm"], "hicache.l3.kind", "NotImplementedError"),
    (["hicache.hicache_storage_backend=aibrix"], "hicache.l3.kind", "NotImplementedError"),
    (["runtime.enable_mixed_chunk=true"], "runtime.enable_mixed_chunk", "sglang#39526"),
    (["runtime.disable_radix_cache=true"], "runtime.disable_radix_cache", "radix cache"),
    (["runtime.enable_int8_mamba_checkpoint=true"], "runtime.enable_int8_mamba_checkpoint", "HiCache"),
    (["runtime.tp_size=2", "model.architecture.num_key_value_heads=3"], "model.architecture.num_key_value_heads",
     "neither divisible"),
    (["model.architecture.linear_num_value_heads=1"], "model.architecture.linear_num_value_heads",
     "Mamba2StateShape.create"),
])
def test_errors_name_their_field(sets, field, needle):
    p, fs, text = findings("rtx5060ti-tp2-fp8", sets)
    assert ("error", field) in fs
    assert needle in text
    assert p.verdict == "unsafe"
    assert any(r.startswith(field) for r in p.reasons)


def test_file_backend_with_hybrid_on_stock_warns_b22_b23():
    p, fs, text = findings("linux-tp2-l3")
    assert ("warning", "hicache.l3.kind") in fs
    assert "sglang#16771" in text


def test_int2_without_its_capability():
    p, fs, text = findings("rtx5060ti-tp2", capabilities=frozenset({"hicache-host-reserve-env"}))
    assert ("error", "runtime.kv_cache.dtype") in fs and ("error", "model.quantization") in fs


def test_int2_page_and_strategy():
    p, fs, _ = findings("rtx5060ti-tp2", ["runtime.page_size=16", "runtime.mamba_radix_cache_strategy=no_buffer"])
    assert ("error", "runtime.page_size") in fs and ("error", "runtime.mamba_radix_cache_strategy") in fs


def test_mixed_chunk_is_fine_with_the_fix():
    _, fs, _ = findings("rtx5060ti-tp2-fp8", ["runtime.enable_mixed_chunk=true"],
                        capabilities=frozenset({"hicache-host-reserve-env", "hicache-host-allocator",
                                                "mamba-mixed-chunk-fix"}))
    assert ("error", "runtime.enable_mixed_chunk") not in fs


def test_small_host_pool_warns():
    p = plan(load_profile("rtx5060ti-tp2-fp8"), BOX, ratio=0.5)
    assert any("not larger than the device pool" in w for w in p.warnings)
    assert p.verdict == "ok"


def test_hicache_size_times_ranks_over_budget_b02():
    """B02: --hicache-size is per rank; TP x size must fit the budget."""
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(32 * GiB, "linux"), hicache_size_gb=14)
    assert p.verdict == "unsafe"
    assert p.pinned_total_bytes > p.budget.pinned_budget_bytes
    assert any("hicache_size <=" in r for r in p.reasons)


def test_reserve_is_printed_with_both_units_b04():
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(16 * GiB, "linux"), ratio=1)
    assert "10.00 GiB reserve" in p.runtime_check.stock_detail and " GB" in p.runtime_check.stock_detail


def test_stock_check_quotes_sglangs_message_b01():
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(16 * GiB, "linux"), ratio=1)
    assert p.runtime_check.stock == "refuse"
    assert "Not enough host memory available. Requesting" in p.runtime_check.stock_detail
    assert "sglang#38156" in p.runtime_check.stock_detail


def test_max_running_requests_capped_by_mamba_slots():
    _, fs, text = findings("rtx5060ti-tp2-fp8", ["runtime.max_running_requests=8"])
    assert ("warning", "runtime.max_running_requests") in fs and "caps it to 2" in text


def test_profile_weights_follow_tp_size(cli):
    """weights_total / runtime.tp_size: one 12 GB card no longer "fits" a 27B model at TP 1
    with the TP 2 figure per rank."""
    import json

    two = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "-f", "json").out)
    one = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "-f", "json",
                         "--set", "runtime.tp_size=1", "--set", "container.gpus=[0]").out)
    assert two["per_rank"]["weights_bytes"] == 8_100_000_000
    assert one["per_rank"]["weights_bytes"] == 16_200_000_000
    assert one["verdict"] == "unsafe"


def test_one_weights_estimate(cli, tmp_path):
    both = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", "model.weights_per_rank=8GB")
    assert both.code == 2 and "give model.weights_total or model.weights_per_rank, not both" in both.err
    per_rank = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "--set", "model.weights_total=null",
                   "--set", "model.weights_per_rank=8GB")
    assert per_rank.code == 0, per_rank.err


def test_the_mooncake_segment_comes_out_of_the_pinned_budget(cli):
    """mooncake_store.py: the global segment (4 GiB unless set) is host memory on this box."""
    import json

    args = ("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "--linux", "-f", "json")
    plain = json.loads(cli(*args).out)["budget"]
    default = json.loads(cli(*args, "--set", "hicache.l3={kind: mooncake, master: '127.0.0.1:50051'}").out)["budget"]
    small = json.loads(cli(*args, "--set", "hicache.l3={kind: mooncake, master: '127.0.0.1:50051', "
                                          "global_segment_size: 1GiB}").out)["budget"]
    assert plain["l3_store_bytes"] == 0
    assert default["l3_store_bytes"] == 4 * 2**30
    assert plain["pinned_budget_bytes"] - default["pinned_budget_bytes"] == 4 * 2**30
    assert plain["pinned_budget_bytes"] - small["pinned_budget_bytes"] == 2**30
    assert "Mooncake global segment" in default["binding_detail"]


def test_each_rule_is_named_and_cites_its_source():
    """``planner/validate.py: RULES``: unique kebab-case names, and each rule's source names an
    SGLang file (``file.py: function``), an upstream issue (``sglang#N``), the overlay it needs or
    the module whose findings it reports."""
    import re

    from escha_deploy.planner.validate import RULES

    names = [r.name for r in RULES]
    assert len(set(names)) == len(names)
    assert [n for n in names if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n)] == []
    cites = re.compile(r"\w+\.py\b|sglang#\d+|overlay|^profile\.\w+$")
    assert [(r.name, r.source) for r in RULES if not cites.search(r.source)] == []
