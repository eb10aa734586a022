"""The planner counts each host buffer as the runtime's allocator pins it.

The rule lives in one place, ``runtime/hooks/host_alloc.py: pinned_bytes``: both allocators
pin the request rounded up to the 4 KiB page (``pinned``: one cudaHostAlloc of the exact
size; ``register``: an mmap of the exact size, registered whole). Torch's caching host
allocator, which ``pinned`` used before, rounds each block up to a power of two instead: a
2,147,745,792 B pool pinned 4,294,967,296 B on an H200 machine (torch.cuda.host_memory_stats).

Input: ``rtx5060ti-tp2`` (INT2 KV: codes + K and V scales/zeros; 48 GDN layers of mamba state)
on the seed's described 16 GiB WSL2 VM, where the plan sets ``pinned``. Expected figures by
hand (per rank, ratio 2): codes 420,008 tokens x 16 layers x 2 x 128 B = 1,720,352,768; scales
420,008 x 16 x 64 = 430,088,192 each; mamba temporal 33 slots x 48 x 24 x 128 x 128 x 4 B =
2,491,416,576; conv 33 x 48 x 5,120 x 3 x 2 B = 48,660,480.
"""

import json

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.planner.pools import DevicePools, host_pools_at_ratio, pinned_buffers
from escha_deploy.profile import load_profile
from escha_deploy.runtime.hooks import host_alloc as ha
from escha_deploy.utils.units import GiB


@pytest.fixture(scope="module")
def seed():
    return load_profile("rtx5060ti-tp2")


@pytest.fixture(scope="module")
def wsl2_16():
    return described_host(16 * GiB, "wsl2")


@pytest.mark.parametrize("request_b, pinned_b", [
    (1, 4096), (4096, 4096), (4097, 8192),
    (2_147_745_792, 2_147_745_792),   # torch's caching allocator pinned 4,294,967,296 for this
    (48_660_480, 48_660_480),         # and 67,108,864 for this
    (2_580_529_152, 2_580_529_152),
])
def test_the_allocator_rule_is_the_page_not_a_power_of_two(request_b, pinned_b):
    for allocator in ("pinned", "register"):
        assert ha.pinned_bytes(request_b, allocator) == pinned_b


def test_unknown_allocator_is_refused():
    with pytest.raises(ha.HostAllocatorError):
        ha.pinned_bytes(4096, "caching")


def test_ratio_2_buffers_are_counted_by_the_allocator_rule(seed, wsl2_16):
    p = plan(seed, wsl2_16, ratio=2)
    rows = p.per_rank.host_buffers
    assert [(r.name, r.requested_bytes) for r in rows] == [
        ("host KV codes buffer (K and V)", 1_720_352_768),
        ("host K scales/zeros buffer", 430_088_192),
        ("host V scales/zeros buffer", 430_088_192),
        ("host mamba temporal buffer", 2_491_416_576),
        ("host mamba conv buffer", 48_660_480),
    ]
    assert {r.allocator for r in rows} == {"pinned"}  # WSL2: cudaHostAlloc (sglang#40232)
    for r in rows:
        assert r.pinned_bytes == ha.pinned_bytes(r.requested_bytes, "pinned")
        assert r.source == ha.PINNED_BYTES_SOURCE["pinned"]
    assert p.per_rank.pinned_bytes == sum(r.pinned_bytes for r in rows)
    assert p.pinned_total_bytes == 2 * p.per_rank.pinned_bytes == 10_241_212_416


def test_the_seed_readme_figures_still_hold(seed, wsl2_16):
    """README: ratio 1 is ok on the seed's 16 GiB WSL2 VM and the plan recommends 1.45."""
    one = plan(seed, wsl2_16, ratio=1)
    assert one.verdict == "ok"
    auto = plan(seed, wsl2_16)
    assert (auto.verdict, auto.recommended_ratio, auto.hicache.ratio) == ("ok", 1.45, 1.45)
    rows = auto.per_rank.host_buffers
    assert sum(r.pinned_bytes for r in rows) == auto.per_rank.pinned_bytes
    assert auto.pinned_total_bytes == 7_436_402_688  # what ratio 1.45 pins: 7.44 GB, under the budget


def test_off_wsl2_the_register_path_is_counted(wsl2_16):
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(64 * GiB, "linux"))
    assert p.per_rank.host_buffers and {r.allocator for r in p.per_rank.host_buffers} == {"register"}
    assert p.per_rank.pinned_bytes == sum(r.pinned_bytes for r in p.per_rank.host_buffers)


def test_a_buffer_off_the_page_is_counted_whole_pages():
    """A pool whose buffers are not page multiples pins more than it requests, and the pools'
    pinned total (what the budget checks) counts the pinned figure."""
    dev = DevicePools(kv_tokens=1000, kv_bytes=0, kv_page_size=1, mamba_slots=0, mamba_bytes=0,
                      mamba_bytes_per_slot=0, host_kv_bytes_per_token=3)
    pools = host_pools_at_ratio(dev, 1.0)   # 1001 tokens x 3 B = 3,003 B
    assert pools.kv_bytes == 3_003
    [buf] = pinned_buffers(pools, "pinned")
    assert (buf.requested_bytes, buf.pinned_bytes) == (3_003, 4_096)
    assert pools.pinned_bytes == 4_096


def test_plan_json_and_table_list_each_buffer(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--ratio", "2", "--host-ram", "16GiB", "--wsl2", "-f", "json")
    rows = json.loads(r.out)["per_rank"]["host_buffers"]
    assert [(x["requested_bytes"], x["pinned_bytes"], x["allocator"]) for x in rows][0] == (
        1_720_352_768, 1_720_352_768, "pinned")
    assert all(x["source"].startswith("cudaHostAlloc of the exact size") for x in rows)
    t = cli("plan", "-p", "rtx5060ti-tp2", "--ratio", "2", "--host-ram", "16GiB", "--wsl2")
    assert "host mamba temporal buffer" in t.out and "2,491,416,576 B" in t.out
    assert "cudaHostAlloc of the exact size" in t.out
