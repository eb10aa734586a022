"""Pin what SGLang 0.5.19's own hybrid radix cache does with HiCache on the rigs' request sequences
(``tests/replay/sglang_tree_replay.py``: the real ``UnifiedRadixCache``, components, pools, host
pools, ``Req`` and ``PrefillAdder`` on the CPU; the cache controller stood in by bookkeeping).

The tests marked ``wheel`` need the throwaway virtual environment that
``.ci/check-flag-catalog.sh`` builds (``.cache/flagcat-venv``, or ``ESCHA_FLAGCAT_VENV``) and skip
without it, as ``tests/test_flag_catalog.py``'s do; CI builds it before pytest runs. One
subprocess imports SGLang once (about 20 s) and runs every scenario (about 2 s).

Reading the numbers: ``device_hit``/``host_hit`` are what ``Req.init_next_round_input`` ->
``match_prefix`` gave (``len(prefix_indices)`` and ``host_hit_length``); ``reused`` the prefix
after ``init_load_back``; a prefix of a hybrid model is reusable only up to a node holding a mamba
state (device, or host for a load-back), and states are kept only at chunk ends
(``mamba_last_track_seqlen``), at a request's tracked end, and at a matched branching point.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "replay" / "sglang_tree_replay.py"


def _venv_python() -> Path:
    """The default release's flag-catalog venv (as ``tests/test_flag_catalog.py: _venv_python``)."""
    venv = Path(os.environ.get("ESCHA_FLAGCAT_VENV") or REPO / ".cache" / "flagcat-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no flag-catalog venv at {venv}; .ci/check-flag-catalog.sh builds it")
    return python


TIER_TRACE = REPO / "tests" / "gpu_rig" / "tier_trace"


@pytest.fixture(scope="module")
def replay_doc(tmp_path_factory) -> dict:
    """Every scenario and variant, from one run of the harness in the venv, with the GPU runs'
    test-only trace (``tests/gpu_rig/tier_trace``) loaded as on the GPU machine: its events are
    read back into ``doc["trace"]``."""
    trace = tmp_path_factory.mktemp("trace") / "tier.jsonl"
    env = dict(os.environ, ESCHA_GPU_TIER_TRACE=str(trace),
               PYTHONPATH=os.pathsep.join(p for p in (str(TIER_TRACE), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([str(_venv_python()), str(HARNESS), "all", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    doc["trace"] = [json.loads(line) for line in trace.read_text().splitlines()] if trace.is_file() else []
    return doc


@pytest.fixture(scope="module")
def replay(replay_doc) -> dict:
    return replay_doc["results"]


def _answer(replay: dict, name: str) -> dict:
    return replay[name]["answer"]


@pytest.mark.wheel
def test_shape_true_pools_are_sized_by_sglangs_own_rules(replay) -> None:
    # pool_host/mha.py: int(28,672 * 4) page-floored + 1 page; pool_host/mamba.py: int(10 * 4) + 1
    assert replay["canary"]["sizes"] == {"device_kv": 28_672, "device_mamba": 10,
                                         "host_kv": 114_689, "host_mamba": 41}
    assert replay["bench ratio 1"]["sizes"]["host_kv"] == 28_673
    assert replay["bench ratio 1"]["sizes"]["host_mamba"] == 11
    assert replay["bench ratio 8"]["sizes"]["host_mamba"] == 81
    assert replay["seed"]["sizes"] == {"device_kv": 210_000, "device_mamba": 16,
                                       "host_kv": 210_001, "host_mamba": 17}


@pytest.mark.wheel
def test_canary_comes_back_from_host_mamba_with_full_kv_still_on_device(replay) -> None:
    # The second ask matches 3,072 (the last chunk-end state below the 4,095-token match limit)
    # and checkpoints the branching point 4,032 (mamba_component.py: mamba_branching_seqlen).
    asks = {a["label"]: a for a in replay["canary"]["asks"]}
    assert asks["P again"]["device_hit"] == 3072 and asks["P again"]["branching"] == 4032
    # The fill takes every device mamba state of P (3 slots per filler: running + ping-pong) but
    # never P's Full KV: the fill evicts 1 + 9 x 768 tokens (fillers' tails), not 7,936.
    assert _answer(replay, "canary") == {
        "device_hit": 0, "host_hit": 4032, "prefix_after_load_back": 4032,
        "loaded_kv_tokens": 0, "loaded_mamba_slots": 2, "evicted_during_fill": 6913,
    }
    # host mamba: 38 of 41 slots used, none reclaimed; no backup failed
    state = replay["canary"]["state_before_last"]
    assert state["host_mamba_free"] == 3 and state["host_evicted_mamba"] == 0
    assert state["backup_failures"] == 0
    # the tree before the last ask: P's Full KV on device and host, its states on host only
    assert replay["canary"]["tree_before_last"][:4] == [
        " [0,1024) kv=DH mamba=-H lock=0", "  [1024,2048) kv=DH mamba=-H lock=0",
        "   [2048,3072) kv=DH mamba=-H lock=0", "    [3072,4032) kv=DH mamba=-H lock=0"]
    # fillers asked for 1 token, as escha_deploy/bench/canary.py asks them: the same
    assert _answer(replay, "canary fillers 1 token") == _answer(replay, "canary")


@pytest.mark.wheel
def test_canary_with_the_fields_eviction_count_still_loads_back(replay) -> None:
    # 672 device tokens fewer than the rig's pool: the fill evicts exactly the field's 7,936
    # tokens (1 + P's tail [3072,4095) + 9 fillers' [2048,2816) tails), and the last ask still
    # loads P's tail (960 tokens of Full KV) and its 4,032 state back from the host tier.
    assert _answer(replay, "canary device 28000") == {
        "device_hit": 0, "host_hit": 4032, "prefix_after_load_back": 4032,
        "loaded_kv_tokens": 960, "loaded_mamba_slots": 2, "evicted_during_fill": 7936,
    }


@pytest.mark.wheel
def test_bench_second_pass_per_variant(replay) -> None:
    def hits(name: str) -> tuple[int, int]:
        a = _answer(replay, name)
        return a["second_pass_host_hits"], a["second_pass_host_tokens"]

    # chunk 1024: each prefix reusable to its last chunk end below 6,000 (5,120), all from host
    assert hits("bench") == (8, 8 * 5120)
    assert hits("bench chunk 2048") == (8, 8 * 4096)
    # chunk 8192: one chunk, the only state at 6,016 (past the shared 6,000): nothing reusable
    assert hits("bench chunk 8192") == (0, 0)
    # ratio 1: 11 host mamba slots and 28,673 host KV tokens, both reclaimed LRU before the
    # second pass comes back (5 states a prefix: chunk ends 2,048..5,120 and 6,016)
    assert hits("bench ratio 1") == (0, 0)
    assert replay["bench ratio 1"]["state"]["host_evicted_mamba"] > 0
    assert replay["bench ratio 1"]["state"]["host_evicted_kv"] > 0
    # ratio 4: 40 states in 41 host slots, nothing reclaimed during the first pass
    assert replay["bench"]["state"]["backup_failures"] == 0
    assert hits("bench ratio 8") == (8, 8 * 5120)
    # write_back: chunk-end states are dropped with their device slot (only leaves are backed up)
    assert hits("bench write_back") == (0, 0)
    for name in ("bench", "bench chunk 2048", "bench chunk 8192", "bench ratio 1", "bench ratio 8",
                 "bench write_back"):
        assert _answer(replay, name)["second_pass_device_hits"] == 0, name


@pytest.mark.wheel
def test_seed_box_reuses_nothing_from_either_tier(replay) -> None:
    # 16 device and 17 host mamba slots for 8 x 9 chunk states: both tiers cycle LRU
    a = _answer(replay, "seed")
    assert (a["second_pass_device_hits"], a["second_pass_host_hits"], a["second_pass_reused_tokens"]) == (0, 0, 0)
    assert replay["seed"]["state"]["host_evicted_mamba"] > 100
    assert replay["seed"]["state"]["device_kv_free"] > 70_000  # Full KV was never the limit


@pytest.mark.wheel
def test_sent_at_once_the_answers_stay(replay) -> None:
    # 8 requests a pass arriving together (max_running 2 on the rig, 3 on the seed's box)
    a = _answer(replay, "bench at once")
    assert (a["second_pass_host_hits"], a["second_pass_host_tokens"]) == (8, 8 * 5120)
    seed = _answer(replay, "seed at once")
    assert (seed["second_pass_device_hits"], seed["second_pass_host_hits"]) == (0, 0)
    # the seed's second pass still finds >= 16,384 tokens of Full KV on device (the branching
    # point it checkpoints), with no mamba state on the path to start from
    assert all(x["branching"] >= 16_384 for x in replay["seed at once"]["asks"][8:])


@pytest.mark.wheel
def test_the_gpu_tier_trace_records_what_sglangs_tree_did(replay_doc) -> None:
    """The trace scripts/gpu_tier_variants.py loads into a real server's processes wraps SGLang
    0.5.19's own methods by their real signatures: on the replay (the same code, on the CPU) it
    records every kind of event its summary counts, raises nothing, and counts as many
    successful D->H backups as the stand-in controller completed."""
    events = replay_doc["trace"]
    kinds = {e["event"] for e in events}
    assert "trace_error" not in kinds, [e for e in events if e["event"] == "trace_error"][:3]
    assert {"backup", "evict_leaf", "evict_host", "mamba_state", "mamba_evict", "match"} <= kinds, kinds
    ok = sum(1 for e in events if e["event"] == "backup" and e["ok"])
    assert ok == replay_doc["totals"]["writes"] > 0
    # host hits the trace saw at admission: one per host-hit ask the scenarios report
    assert any(e["event"] == "match" and e["host"] > 0 for e in events)
    assert any(e["event"] == "mamba_state" and e["chunked"] for e in events)


#: The replay's scenarios as the plan's workloads (``planner/reach.py``): bench 8 x 6,000, seed 8 x 18,000
_WORKLOADS = {"bench": (8, 6_000), "seed": (8, 18_000)}


@pytest.mark.wheel
def test_plan_reachability_agrees_with_the_replay(replay) -> None:
    """Every bench/seed variant, predicted by the plan's pure rule from the host pools SGLang's own
    constructors built (less their padding slot and page): where the plan says ``all``, every
    prefix comes back (host or device) with between ``restore_tokens`` and ``restore_tokens_max``
    tokens each; where it says ``none``, nothing does. ``not_guaranteed`` asserts nothing of the
    count (LRU decides: ratio 1 returns 0 of 8, the first seed's box at ratio 4 all 8)."""
    from escha_deploy.planner.reach import Workload, reach

    seen = {"all": 0, "none": 0, "not_guaranteed": 0}
    for name, r in replay.items():
        kind = name.split()[0]
        if kind not in _WORKLOADS:
            continue
        rig, sizes, a = r["rig"], r["sizes"], r["answer"]
        w = Workload(*_WORKLOADS[kind])
        p = reach(w, chunk=rig["chunk"], host_kv_tokens=sizes["host_kv"] - 1,
                  host_mamba_slots=sizes["host_mamba"] - 1, write_policy=rig["policy"])
        seen[p.verdict] += 1
        back = a["second_pass_host_hits"] + a["second_pass_device_hits"]
        if p.verdict == "all":
            assert back == w.prefixes, (name, p, a)
            assert (w.prefixes * p.restore_tokens <= a["second_pass_reused_tokens"]
                    <= w.prefixes * p.restore_tokens_max), (name, p, a)
        elif p.verdict == "none":
            assert a["second_pass_reused_tokens"] == 0, (name, p, a)
    # the grid covers each verdict: the pins below would not catch a rule that says "all" everywhere
    assert seen["all"] >= 5 and seen["none"] >= 2 and seen["not_guaranteed"] >= 3, seen


@pytest.mark.wheel
def test_patch_0004s_host_mamba_count_brings_the_seed_box_back(replay) -> None:
    # ratio 1 (17 host states): none of 8; ratio 1 with 80 host states: all 8, 1,280 MB of host KV
    # per rank fewer than ratio 4 (which gets them back too, with 840,001 host KV tokens)
    assert replay["seed"]["answer"]["second_pass_reused_tokens"] == 0
    got = replay["seed host mamba 80"]
    assert got["sizes"]["host_mamba"] == 81 and got["sizes"]["host_kv"] == 210_001
    assert got["answer"]["second_pass_host_hits"] + got["answer"]["second_pass_device_hits"] == 8
    # the shape-true rig at ratio 2: 56 host states all 8 prefixes at 5,120 tokens each (what the
    # GPU run's r2_slots56 variant is asked to show); ratio 1's host KV (28,673 tokens) is too small
    assert replay["bench ratio 2 host mamba 56"]["answer"]["second_pass_host_tokens"] == 8 * 5_120
    assert replay["bench ratio 1 host mamba 48"]["answer"]["second_pass_reused_tokens"] == 0
