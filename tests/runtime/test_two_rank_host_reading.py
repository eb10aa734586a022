"""The two-rank host reading (``scripts/two_rank_host_reading.py``) on two real GPUs (``gpu``).

Two processes, one GPU each, an NCCL world group plus a gloo CPU group (as SGLang's TP CPU
group); both take the patch's once-per-group reading ``A0``, then rank 0 pins a 16 GiB pool
(cudaHostAlloc) before rank 1 checks, the late-rank ordering of sglang#38156. What
docs/two-gpu.md records for SGLang 0.5.19, checked as relations (no absolute figures):

- patched (``(A0 - 10 GiB) // 2``): both ranks read the same ``A0``, the MIN of their first
  readings, and get the same budget;
- stock 0.5.19 (``pool_host/base.py: host_memory_budget_bytes``, ``(available - 10 GiB) // 2``
  read afresh at each pool): rank 0, checking before it pins, gets the patched budget; rank 1,
  checking after, sees MemAvailable fall by about the pool and still divides by 2, so the two
  ranks differ by about half the pool: the peer's pool is charged twice.

Memory is touched first (``--touch-gib``): on a VM whose memory grows as it is used, MemTotal
rising during the reading would hide the drop; rank 1's MemTotal must be the same at both
readings for the stock comparison to mean anything. Needs 2 CUDA devices and about 32 GiB of host memory.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "two_rank_host_reading.py"
GiB = 2**30
POOL_GIB = 16  # as docs/two-gpu.md records the 0.5.19 reading
#: MemAvailable's fall on rank 1, per byte rank 0 pinned: the pool plus page tables and driver
#: bookkeeping (docs/two-gpu.md: 17.5 GB for 16 GiB, 1.02x); outside these bounds the drop is
#: not the pool's.
DROP_RATIO = (0.9, 1.25)


def _script():
    spec = importlib.util.spec_from_file_location("two_rank_host_reading", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stock_ranks_differ_patched_ranks_agree(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices (one TP rank each); {torch.cuda.device_count()} visible")
    script = _script()
    r = script.run_reading(POOL_GIB, str(tmp_path / "reading"), touch_gib=2 * POOL_GIB)
    assert r["exit_codes"] == [0, 0], r
    r0, r1 = r["ranks"]
    pinned = POOL_GIB * GiB
    assert (r0["pinned_here"], r1["pinned_here"]) == (pinned, 0)
    reserve = r0["reserve"]
    assert reserve == r1["reserve"] == 10 * GiB  # SGLang 0.5.19's HICACHE_HOST_MEMORY_RESERVE_BYTES

    # patched: one MIN all-reduce before anyone pinned; both ranks size from it
    a0 = min(r0["first_read"], r1["first_read"])
    assert r0["a0"] == r1["a0"] == a0
    assert r0["patched_budget"] == r1["patched_budget"] == (a0 - reserve) // 2
    assert r["ok"]

    # stock: each rank's own fresh reading at its check, divided by the rank count
    for rank in (r0, r1):
        assert rank["stock_budget"] == (rank["fresh_read_after_peer_pinned"] - reserve) // 2
    assert r1["mem_total_first"] == r1["mem_total_fresh"], (
        "MemTotal grew during the reading (memory that grows as it is used): touch more first", r1)
    drop = r1["first_read"] - r1["fresh_read_after_peer_pinned"]
    assert DROP_RATIO[0] <= drop / pinned <= DROP_RATIO[1], (drop, pinned)
    # rank 0 checks before pinning (its first reading), rank 1 after: the stock ranks differ by
    # about half the pool, and rank 1 falls below the patched budget by the same amount
    stock_rank0 = (r0["first_read"] - reserve) // 2
    stock_rank1 = r1["stock_budget"]
    lo, hi = DROP_RATIO[0] * pinned / 2, DROP_RATIO[1] * pinned / 2
    assert lo <= stock_rank0 - stock_rank1 <= hi, (stock_rank0, stock_rank1)
    assert lo <= r1["patched_budget"] - stock_rank1 <= hi, (r1["patched_budget"], stock_rank1)
