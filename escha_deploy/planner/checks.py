"""SGLang's own host-memory check, stock and patched, evaluated before anything starts.

Stock 0.5.19 (``srt/mem_cache/pool_host/base.py: host_memory_budget_bytes``): every rank, at
every host pool it builds, reads ``psutil.virtual_memory().available``, subtracts the 10 GiB
``HICACHE_HOST_MEMORY_RESERVE_BYTES`` and divides by ``ranks_per_host()``; it raises
"Not enough host memory available" when the pool is larger. Ranks are not synchronised, so in
the worst ordering a late rank checks after its N-1 peers pinned both pools, and still divides
by N (sglang#38156). For N ranks, KV pool P and mamba pool M per rank, that rank needs:

    KV:    (A - (N-1)(P+M) - R) // N >= P
    mamba: (A - (N-1)(P+M) - P - R) // N >= M

which for N = 2 is ``A >= R + max(3P + M, 2P + 3M)`` (solving both inequalities at N = 2).

Patched (our series, capability ``hicache-host-reserve-env``): ``A0`` is read once for the TP
group (MIN across ranks) before any rank pins, the reserve ``R'`` comes from
``ESCHA_HICACHE_HOST_RESERVE_BYTES``, and each rank adds up its own accepted pools:
accept iff ``P + M <= (A0 - R') // N``.
"""

from __future__ import annotations

from ..utils.units import fmt_gb, fmt_gib, fmt_gib_gb

def stock_check(available: int, ranks: int, kv: int, mamba: int, reserve: int) -> tuple[bool, str]:
    """Whether the stock release's guard accepts the pools in the worst rank ordering; and why.
    ``available``: what the guard reads (``guard_available``); ``reserve``: the release's
    ``HICACHE_HOST_MEMORY_RESERVE_BYTES`` (``releases/VERSION/facts.yaml``), bytes."""
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


# --------------------------------------------------------------------------- per release


def guard_available(release: str | None, a_runtime: int, *, mem_total: int, hugetlb: int,
                    cgroup_limit: int | None, os_reserve: int, server_processes: int,
                    weights_read: int = 0) -> tuple[int, str]:
    """``(bytes, how)``: the available memory ``release``'s host guard reads when the pools are
    built, from the plan's model of the host (bytes).

    ``per-pool-available`` (0.5.19, 0.5.20: ``pool_host/base.py: host_memory_budget_bytes``
    reads psutil): ``a_runtime``, the planner's modelled MemAvailable. ``cgroup-bounded``
    (0.5.21+: ``mem_cache/host_memory.py: available_host_memory_bytes``):
    min(MemAvailable, cgroup headroom), MemAvailable = MemTotal - huge pages - OS - server
    processes, headroom = the cgroup limit - the cgroup's usage less its page cache (the server
    processes: the page cache is credited). ``cgroup-bounded-cache-charged`` (0.5.21:
    the same reader, but ``available_host_memory_bytes`` takes the cgroup's usage whole: "charged
    file cache is not assumed reclaimable"): headroom = the limit - the server processes - the
    page cache the weights leave charged to the cgroup, at least ``weights_read`` (bytes: the
    checkpoint the host's ranks read before the pools are built).
    """
    from ..sglang.releases import load_release

    guard = load_release(release).host_guard
    if guard.kind == "per-pool-available":
        return a_runtime, f"MemAvailable modelled {fmt_gib(a_runtime)} (psutil; pool_host/base.py: host_memory_budget_bytes)"
    host_avail = max(mem_total - hugetlb - os_reserve - server_processes, 0)
    if cgroup_limit is None:
        return host_avail, (f"min(MemAvailable {fmt_gib(host_avail)}, no cgroup limit) "
                            "(mem_cache/host_memory.py: available_host_memory_bytes)")
    if guard.kind == "cgroup-bounded-cache-charged":
        headroom = max(cgroup_limit - server_processes - weights_read, 0)
        return min(host_avail, headroom), (
            f"min(MemAvailable {fmt_gib(host_avail)}, cgroup headroom {fmt_gib(cgroup_limit)} limit - "
            f"{fmt_gib(server_processes)} server processes - {fmt_gib(weights_read)} weights read, their page "
            f"cache charged, not credited = {fmt_gib(headroom)}) (mem_cache/host_memory.py: available_host_memory_bytes)")
    headroom = max(cgroup_limit - server_processes, 0)
    return min(host_avail, headroom), (
        f"min(MemAvailable {fmt_gib(host_avail)}, cgroup headroom {fmt_gib(cgroup_limit)} limit - "
        f"{fmt_gib(server_processes)} server processes, page cache credited = {fmt_gib(headroom)}) "
        "(mem_cache/host_memory.py: available_host_memory_bytes)")


def auto_size_pick(release: str | None, available: int, ranks: int, device_bytes: int,
                   buffer_only: bool = False) -> tuple[float, int] | None:
    """What ``release``'s HiCache auto-size would pick (only when neither ``--hicache-ratio`` nor
    ``--hicache-size`` is given; escha renders one of them, so this is shown beside the plan):
    ``(ratio, budget per rank in bytes)``, or None for a release without auto-size.

    ``mem_cache/hicache_auto_size.py: auto_size_hicache``: budget = int(((available - reserve)
    // ranks) x fraction), ratio = min(default ratio, budget x (1 - slack) / device bytes of
    the pools with a host mirror); the MIN all-reduce makes it one ratio for the ranks (all
    read the same modelled host here). ``device_bytes``: per rank. A ratio <= 0 is SGLang's
    "No host memory is left for HiCache after the 10 GiB reserve".
    """
    from ..sglang.releases import load_release

    guard = load_release(release).host_guard
    auto = guard.auto_size
    if auto is None or device_bytes <= 0:
        return None
    budget = int(((available - guard.reserve_bytes) // max(ranks, 1)) * auto.fraction_default)
    start = auto.default_ratio_buffer_only if buffer_only else auto.default_ratio
    return min(start, budget * (1 - auto.allocation_slack) / device_bytes), budget
