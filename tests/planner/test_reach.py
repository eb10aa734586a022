"""The host tier's reachability in the plan (``planner/reach.py``) and patch 0004's host mamba
count (``hicache.host_mamba_slots``): the rule's figures, the split the plan chooses, and the
refusals. The rule itself is checked against SGLang 0.5.19's own radix cache replayed on the CPU
in ``tests/replay/test_tree_replay.py::test_plan_reachability_agrees_with_the_replay``."""

from __future__ import annotations

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.pipeline.argv import server_env
from escha_deploy.planner import plan
from escha_deploy.planner.reach import Workload, needs, parse_workload, reach, state_positions
from escha_deploy.profile import load_profile
from escha_deploy.utils.errors import BadInput
from escha_deploy.utils.units import GiB

MAMBA_SLOT = 76_972_032  # rtx5060ti-tp2 per rank (tests/planner/test_seed_figures.py)
SERIES = ["int2-kv", "w2-weights", "hicache-host-reserve-env", "hicache-host-allocator", "transfer-geometry-check"]
WITH_0004 = frozenset(SERIES + ["hicache-host-mamba-slots"])


def test_chunk_states_follow_sglangs_grid() -> None:
    # schedule_batch.py: len(prefix) + (extend_len // 64) * 64 for each chunk of at least 64 tokens
    assert state_positions(0, 18_016, 2048) == [2048 * k for k in range(1, 9)] + [16_384 + 1_600]
    assert state_positions(0, 6_016, 1024) == [1024, 2048, 3072, 4096, 5120, 6016]
    assert state_positions(0, 100, 1024) == [64]
    assert state_positions(0, 63, 1024) == []


def test_the_two_workloads_figures() -> None:
    # the first seed's 8 x 18K at chunk 2048: back to 16,384 (17,984 when the last chunk's state
    # reaches the host), 8 x (9 + 1) states, 8 x (18,024 + 1,640) tokens over both passes
    assert needs(Workload(8, 18_000), 2048) == (16_384, 17_984, 80, 157_312)
    # the shape-true rig's bench 8 x 6,000 at chunk 1024: the last state (6,016) is past the prefix
    assert needs(Workload(8, 6_000), 1024) == (5_120, 5_120, 56, 55_424)


@pytest.mark.parametrize("kv,slots,policy,chunk,verdict", [
    (157_312, 80, "write_through", 2048, "all"),
    (157_311, 80, "write_through", 2048, "not_guaranteed"),
    (157_312, 79, "write_through", 2048, "not_guaranteed"),
    (10**6, 10**3, "write_back", 2048, "none"),
    (10**6, 10**3, "write_through", 32_768, "none"),  # one chunk: its only state is past the prefix
    (10**6, 10**3, "write_through_selective", 2048, "not_guaranteed"),
])
def test_verdicts_at_their_edges(kv, slots, policy, chunk, verdict) -> None:
    r = reach(Workload(8, 18_000), chunk=chunk, host_kv_tokens=kv, host_mamba_slots=slots, write_policy=policy)
    assert r.verdict == verdict
    assert r.restored == (8 if verdict == "all" else 0)


@pytest.mark.parametrize("text", ["8", "8x", "x8", "0x5", "8x0", "8y18000", "8x18000x2", "8x1.5K", "-8x100"])
def test_a_workload_that_is_not_count_x_tokens_is_refused(text) -> None:
    with pytest.raises(ValueError, match="expected COUNTxTOKENS"):
        parse_workload(text)


def test_workload_forms() -> None:
    assert parse_workload("8x18K") == parse_workload(" 8 X 18_000 ") == Workload(8, 18_000)


def _plan(host_ram_gib: int, platform: str, caps: frozenset[str], **keys):
    sets = [f"hicache.{k}={v}" for k, v in keys.items()]
    return plan(load_profile("rtx5060ti-tp2", sets), described_host(host_ram_gib * GiB, platform), capabilities=caps)


def test_on_a_32_gib_box_0004_brings_all_8_back_with_less_pinned() -> None:
    stock = _plan(32, "linux", frozenset(SERIES), workload="8x18000")
    planned = _plan(32, "linux", WITH_0004, workload="8x18000", host_mamba_slots="auto")
    # stock: the recommended ratio 4 gives int(16 x 4) + 1 = 65 host states < 80: LRU decides
    assert stock.hicache.ratio == 4.0 and stock.per_rank.host_mamba_slots == 65
    assert [r.verdict for r in stock.host_tier_reach] == ["not_guaranteed", "all"]
    assert "which this runtime lacks" in stock.host_tier_reach[1].config
    # planned: ratio 1 (210,008 host tokens >= 157,312) and 80 states (+1 padding slot)
    assert planned.hicache.ratio == 1.0 and planned.hicache.host_mamba_slots == 80
    assert planned.per_rank.host_mamba_slots == 81
    assert planned.per_rank.host_mamba_bytes == 81 * MAMBA_SLOT
    assert [(r.verdict, r.restored) for r in planned.host_tier_reach] == [("all", 8), ("not_guaranteed", 0)]
    assert planned.per_rank.pinned_bytes < stock.per_rank.pinned_bytes
    # the stock-runtime row's alternative is the split the planned runtime then uses
    assert stock.host_tier_reach[1].pinned_bytes_per_rank == planned.per_rank.pinned_bytes
    profile = load_profile("rtx5060ti-tp2", ["hicache.workload=8x18000", "hicache.host_mamba_slots=auto"])
    assert server_env(planned, profile)["ESCHA_HICACHE_HOST_MAMBA_SLOTS"] == "80"
    assert "ESCHA_HICACHE_HOST_MAMBA_SLOTS" not in server_env(stock, profile)


def test_on_the_16_gib_wsl2_reference_box_the_prefixes_that_fit_are_sized() -> None:
    p = _plan(16, "wsl2", WITH_0004, workload="8x18000", host_mamba_slots="auto")
    assert p.verdict == "ok"
    assert p.hicache.host_mamba_slots == 30  # 3 prefixes x (9 + 1) states
    row = p.host_tier_reach[0]
    assert (row.verdict, row.restored, row.prefixes) == ("all", 3, 3)
    assert "sized for 3 of the 8 prefixes" in row.config
    assert any("3 of its 8 prefixes fit the pinned budget" in w for w in p.warnings)
    assert p.budget.headroom_bytes is not None and p.budget.headroom_bytes >= p.safety_policy.recommend_headroom_bytes


def test_unset_keeps_sglangs_own_split_byte_for_byte() -> None:
    a = _plan(32, "linux", WITH_0004, host_mamba_slots="null", workload="null")
    b = _plan(32, "linux", frozenset(SERIES), host_mamba_slots="null", workload="null")
    assert a.hicache.host_mamba_slots is None and a.per_rank == b.per_rank
    assert a.host_tier_reach == []  # no workload: no reachability table


def test_the_reference_profile_shows_its_workloads_table_and_the_split_0004_would_set() -> None:
    # rtx5060ti-tp2 ships hicache.workload 8x18000 with SGLang's own split (host_mamba_slots null)
    p = _plan(32, "linux", WITH_0004)
    assert p.hicache.host_mamba_slots is None and p.hicache.ratio == 4.0
    assert [(r.verdict, r.restored) for r in p.host_tier_reach] == [("not_guaranteed", 0), ("all", 8)]
    assert "set hicache.host_mamba_slots: auto" in p.host_tier_reach[1].config
    assert _plan(32, "linux", WITH_0004, host_mamba_slots="auto").hicache.host_mamba_slots == 80


def test_an_explicit_count_on_a_runtime_without_0004_is_one_line_naming_the_key() -> None:
    with pytest.raises(BadInput, match=r"hicache.host_mamba_slots 72: the runtime lacks the capability "
                                       r"hicache-host-mamba-slots"):
        _plan(32, "linux", frozenset(SERIES), host_mamba_slots=72)
    p = _plan(32, "linux", WITH_0004, host_mamba_slots=72)
    assert p.per_rank.host_mamba_slots == 73


def test_auto_without_the_capability_keeps_stock_and_says_so() -> None:
    p = _plan(32, "linux", frozenset(SERIES), workload="8x18000", host_mamba_slots="auto")
    assert p.hicache.host_mamba_slots is None
    # said once: the host tier's rows name the split patch 0004 would give "which this runtime
    # lacks", the decision why; no warning repeats it
    assert "which this runtime lacks" in p.host_tier_reach[1].config
    assert any(d.step == "host_mamba" and "runtime lacks hicache-host-mamba-slots" in d.reason for d in p.decisions)
    assert not any("hicache-host-mamba-slots" in w for w in p.warnings)
    # without a workload there is no table to say it: the warning does
    bare = _plan(32, "linux", frozenset(SERIES), workload="null", host_mamba_slots="auto")
    assert any("runtime lacks hicache-host-mamba-slots" in w for w in bare.warnings)


@pytest.mark.parametrize("key,value,needle", [
    ("host_mamba_slots", "0", "hicache.host_mamba_slots"),
    ("host_mamba_slots", "many", "hicache.host_mamba_slots"),
    ("workload", "8y18000", "hicache.workload"),
])
def test_bad_profile_values_name_their_key(key, value, needle) -> None:
    with pytest.raises(BadInput) as err:
        load_profile("rtx5060ti-tp2", [f"hicache.{key}={value}"])
    assert needle in str(err.value)
