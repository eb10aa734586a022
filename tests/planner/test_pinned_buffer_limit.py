"""One pinned (cudaHostAlloc) host buffer may not exceed the runtime hook's 4 GiB limit.

``runtime/hooks/host_alloc.py: resolve`` raises ``PinnedAllocationTooLarge`` for any single
buffer above ``PINNED_MAX_BYTES`` when the allocator is pinned (sglang#7666), which stops the
server at startup after the weights load. The planner must cap the ratio it recommends by that
limit and refuse an explicit ratio above it.

Input: a WSL2 host with MemTotal 128 GiB and doctor's findings ``host_allocator=pinned``,
``rtx5060ti-tp2`` (16 device mamba slots, 48 GDN layers per rank at TP 2, temporal state
1,572,864 B per slot per layer). Expected figures by hand: at ratio r the host mamba pool has
``int(16 r) + 1`` slots (pool_host/base.py), its temporal buffer ``slots x 48 x 1,572,864`` B:
r = 4 -> 65 slots -> 4,907,335,680 B > 4,294,967,296 B; the largest r with
``(int(16 r) + 1) x 75,497,472 <= 4 GiB`` is 3.499 (56 slots = 4,227,858,432 B); 3.5 gives
57 slots = 4,303,355,904 B.
"""

import json

import pytest

from escha_deploy.facts.host import HostFacts
from escha_deploy.planner import plan
from escha_deploy.planner.pools import host_buffers, host_pools_at_ratio
from escha_deploy.profile import load_profile
from escha_deploy.runtime.hooks.host_alloc import PINNED_MAX_BYTES, PinnedAllocationTooLarge, resolve

GiB = 1024**3


@pytest.fixture
def facts(tmp_path):
    f = tmp_path / "facts.json"
    f.write_text(json.dumps({
        "schema_version": 1,
        "host": {"platform": "wsl2", "mem_total_bytes": 128 * GiB},
        "findings": {"created_at": "2026-11-30T09:00:00+00:00", "host_id": "wsl-box", "platform": "wsl2",
                     "host_allocator": "pinned"},
    }))
    return str(f)


def test_auto_ratio_is_capped_by_the_pinned_allocation_limit(cli, facts):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--facts", facts, "-f", "json")
    d = json.loads(r.out)
    assert r.code == 0, r.err
    assert d["hicache"]["host_allocator"] == "pinned"
    assert d["max_safe_ratio"] == 3.499
    assert d["recommended_ratio"] == d["hicache"]["ratio"] == 3.45
    assert d["per_rank"]["host_mamba_slots"] == int(16 * 3.45) + 1 == 56
    assert any("4,294,967,296 B (4 GiB) limit on one pinned" in x and "host mamba temporal buffer" in x
               for x in d["reasons"])


@pytest.mark.parametrize("ratio,code,slots", [(4, 3, 65), (3.5, 3, 57), (3.499, 0, 56)])
def test_explicit_ratio_above_the_limit_is_refused(cli, facts, ratio, code, slots):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--facts", facts, "--ratio", str(ratio), "-f", "json")
    d = json.loads(r.out)
    assert r.code == code
    assert d["per_rank"]["host_mamba_slots"] == slots
    temporal = slots * 48 * 1_572_864
    refusal = [x for x in d["reasons"] if x.startswith("hicache.hicache_ratio:")]
    if code == 3:
        assert d["verdict"] == "unsafe"
        assert len(refusal) == 1
        assert f"the host mamba temporal buffer is {temporal:,} B" in refusal[0]
        assert "4,294,967,296 B (4 GiB)" in refusal[0] and "sglang#7666" in refusal[0]
        assert "PinnedAllocationTooLarge" in refusal[0] and "use a ratio <= 3.499" in refusal[0]
    else:
        assert d["verdict"] == "ok" and refusal == []
    # the planner's verdict agrees with what the runtime hook does with that buffer
    if temporal > PINNED_MAX_BYTES:
        with pytest.raises(PinnedAllocationTooLarge):
            resolve("pinned", None, temporal)
    else:
        assert resolve("pinned", None, temporal) == "pinned"


def test_row_input_exact_figure(cli, facts):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--facts", facts, "--ratio", "4")
    assert r.code == 3
    assert "4,907,335,680 B (4.57 GiB)" in r.out


def test_register_allocator_has_no_per_buffer_limit():
    """Off WSL2 with ``auto`` (register where registered memory is device-mappable) the
    limit does not apply: ratio 4 stays ok on the same 128 GiB."""
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(platform="linux", mem_total_bytes=128 * GiB, source="described")
    p = plan(prof, host, ratio=4.0)
    assert p.hicache.host_allocator == "auto"
    assert p.verdict == "ok"
    assert p.max_safe_ratio > 4.0


def test_host_buffers_sum_to_the_pools_and_int2_splits_codes():
    """Each buffer is named; for INT2 the codes (K and V), K scales/zeros and V scales/zeros are
    three allocations (6,144 B/token = 4,096 codes + 2 x 1,024); they add up to pinned_bytes."""
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(platform="linux", mem_total_bytes=128 * GiB, source="described")
    p = plan(prof, host, ratio=4.0)
    from escha_deploy.planner.pools import DevicePools
    dev = DevicePools(kv_tokens=p.per_rank.device_kv_tokens, kv_bytes=p.per_rank.device_kv_bytes, kv_page_size=8,
                      mamba_slots=16, mamba_bytes=p.per_rank.device_mamba_bytes, mamba_bytes_per_slot=76_972_032,
                      host_kv_bytes_per_token=6_144,
                      host_kv_buffers_per_token=(("codes", 4_096), ("k sz", 1_024), ("v sz", 1_024)),
                      mamba_layers=48, mamba_conv_bytes_per_layer=30_720, mamba_temporal_bytes_per_layer=1_572_864)
    pools = host_pools_at_ratio(dev, 4.0)
    bufs = dict(host_buffers(dev, pools))
    assert bufs == {"codes": 840_008 * 4_096, "k sz": 840_008 * 1_024, "v sz": 840_008 * 1_024,
                    "host mamba temporal buffer": 4_907_335_680, "host mamba conv buffer": 65 * 48 * 30_720}
    assert sum(bufs.values()) == pools.pinned_bytes == p.per_rank.pinned_bytes


def test_hicache_size_is_refused_and_capped_too(cli, facts):
    """By size the GB split by device bytes (hybrid_pool_assembler._split_hicache_size) gives the
    mamba pool 10e9 x 1,308,524,544 / (1,290,289,152 + 1,308,524,544) B: 66 slots -> temporal
    66 x 75,497,472 = 4,982,833,152 B > 4 GiB; the largest whole size that fits is 8 GB."""
    r = cli("plan", "-p", "rtx5060ti-tp2", "--facts", facts, "--hicache-size", "10", "-f", "json")
    d = json.loads(r.out)
    assert r.code == 3
    assert d["reasons"][0].startswith("hicache.hicache_size: at 10 GB per rank the host mamba temporal buffer "
                                      "is 4,982,833,152 B")
    assert d["reasons"][0].endswith("use hicache_size <= 8")
    assert cli("plan", "-p", "rtx5060ti-tp2", "--facts", facts, "--hicache-size", "8").code == 0
