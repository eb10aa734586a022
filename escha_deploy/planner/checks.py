"""SGLang's own host-memory check, stock and patched, evaluated before anything starts.

Stock 0.5.19 (``srt/mem_cache/pool_host/base.py: host_memory_budget_bytes``): every rank, at
every host pool it builds, reads ``psutil.virtual_memory().available``, subtracts the 10 GiB
``HICACHE_HOST_MEMORY_RESERVE_BYTES`` and divides by ``ranks_per_host()``; it raises
"Not enough host memory available" when the pool is larger. Ranks are not synchronised, so in
the worst ordering a late rank checks after its N-1 peers pinned both pools, and still divides
by N (sglang#38156). For N ranks, KV pool P and mamba pool M per rank, that rank needs:

    KV:    (A - (N-1)(P+M) - R) // N >= P
    mamba: (A - (N-1)(P+M) - P - R) // N >= M

which for N = 2 is ``A >= R + max(3P + M, 2P + 3M)`` (research/upstream.md section 1).

Patched (our series, capability ``hicache-host-reserve-env``): ``A0`` is read once for the TP
group (MIN across ranks) before any rank pins, the reserve ``R'`` comes from
``ESCHA_HICACHE_HOST_RESERVE_BYTES``, and each rank adds up its own accepted pools:
accept iff ``P + M <= (A0 - R') // N``.
"""

from __future__ import annotations

from ..units import GiB, fmt_gb, fmt_gib, fmt_gib_gb

STOCK_RESERVE_BYTES = 10 * GiB  # pool_host/base.py: HICACHE_HOST_MEMORY_RESERVE_BYTES


def stock_check(available: int, ranks: int, kv: int, mamba: int,
                reserve: int = STOCK_RESERVE_BYTES) -> tuple[bool, str]:
    """Whether stock 0.5.19 accepts the pools in the worst rank ordering; and why."""
    peers = (ranks - 1) * (kv + mamba)
    kv_share = (available - peers - reserve) // ranks
    ok_kv = kv <= kv_share
    mamba_share = (available - peers - kv - reserve) // ranks
    ok_m = mamba == 0 or mamba <= mamba_share
    if ok_kv and ok_m:
        return True, (
            f"late rank's share {fmt_gb(kv_share)} >= KV {fmt_gb(kv)}"
            + (f", then {fmt_gb(mamba_share)} >= mamba {fmt_gb(mamba)}" if mamba else "")
        )
    failing, need, share = ("KV", kv, kv_share) if not ok_kv else ("mamba", mamba, mamba_share)
    return False, (
        f"{fmt_gib(available)} available - {fmt_gib(reserve)} reserve leaves a late rank "
        f"{fmt_gib_gb(max(share, 0))} for its {failing} pool of {fmt_gib_gb(need)} after counting its "
        f"peers' pools twice (sglang#38156): \"Not enough host memory available. Requesting "
        f"{need / 1e9:.2f} GB but only have {max(share, 0) / 1e9:.2f} GB free\""
    )


def patched_check(available: int, ranks: int, kv: int, mamba: int, reserve: int) -> tuple[bool, str]:
    """Whether our series' once-per-group check accepts the pools; and why."""
    share = (available - reserve) // ranks
    ok = kv + mamba <= share
    rel = "<=" if ok else ">"
    return ok, (
        f"one reading for the TP group: ({fmt_gib(available)} - {fmt_gib(reserve)} reserve) / "
        f"{ranks} = {fmt_gib_gb(max(share, 0))} per rank; pools {fmt_gib_gb(kv + mamba)} {rel} that"
    )
