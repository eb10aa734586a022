"""The memory planner: ``plan(profile, host) -> Plan``, pure (no I/O, no clock, no environment).

``plan()`` runs an ordered list of named steps (``STEPS``); each reads and fills one working
context and records its decisions with a reason, so ``plan`` can say why every value is what
it is. The steps, in dependency order:

1. ``model_shapes``      per-rank layers, KV heads, mamba bytes per slot (``arch.rank_shapes``)
2. ``device_pools``      device KV and mamba pools, INT2 arena (``kv``; SGLang sizing when unset)
3. ``device_budget``     weights + pools against VRAM x mem_fraction_static (``device``)
4. ``pinned_budget``     the safety policy (memory base = MemTotal less huge pages, or the
                         cgroup limit) and doctor's pinned ceiling; which of them binds
5. ``runtime_checks``    the stock and patched host-memory checks (``checks``)
6. ``safe_ratio``        the largest safe ratio (0.001 grid, not capped) and the recommended
                         one (0.05 grid, >= 64 MiB headroom under the binding constraint,
                         capped by ``hicache.max_ratio``)
7. ``choose_hicache``    the ratio or size to launch with, or HiCache off, and the host allocator
8. ``host_pools``        host pools and pinned totals at that choice (``pools``)
9. ``validate``          configuration rules naming their field (``validate``)
10. ``verdict``          ok / unsafe / hicache_off with the reasons

Numbers come from SGLang 0.5.19's own formulas (each module cites its file and function) and
from the profile's safety policy; no threshold is tuned to a test.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..capabilities import SERIES_CAPABILITIES
from ..arch import ModelArch, ModelDirFacts, RankShapes, arch_mismatch, rank_shapes
from ..gpu_facts import peer_access, tp_gpu_indices
from ..host import HostFacts
from ..profile import Profile
from ..releases import default_release, load_release, release_findings
from ..runtime.hooks.host_alloc import PINNED_MAX_BYTES
from ..units import GB, MiB, fmt_gb, fmt_gib, fmt_gib_gb, fmt_mib
from . import kv as kvmod
from .checks import auto_size_pick, guard_available, patched_check, stock_check
from .device import sglang_default_mem_fraction, sglang_min_reserved_mib, sglang_reserved_mib
from .pools import (DevicePools, HostPools, host_buffers, host_pools_at_ratio, host_pools_at_size,
                    pinned_buffers)
from .result import (AutoSizeCheck, HostGuardView, Budget, Decision, DevicePlan, Finding, HiCachePlan, HostBuffer, KvDtypeRow,
                     PerRank, Plan, RuntimeCheck, SafetyPolicy)
from .validate import l3_host_bytes, resolved_mamba_strategy, validate

__all__ = ["plan", "Plan", "STEPS"]

#: Grid of ``max_safe_ratio``: 0.001 (the reference box's answer is 1.480, "just under 1.481").
SAFE_RATIO_GRID = 1000
#: SGLang 0.5.19's slots per request with extra_buffer + overlap (kv_cache_configurator.py).
MAMBA_SLOTS_PER_REQUEST = 5
#: ``--mamba-full-memory-ratio`` default (0.9): share of the rest given to mamba state.
MAMBA_FULL_MEMORY_RATIO = 0.9


@dataclass
class _Ctx:
    profile: Profile
    host: HostFacts
    arch: ModelArch
    weights_bytes: int
    weights_source: str
    capabilities: frozenset[str]
    ratio_override: float | None
    size_override: int | None
    hicache_source: str | None = None
    model_dir: ModelDirFacts | None = None
    release: str = ""  # the SGLang release planned (releases/VERSION)
    release_source: str = ""
    decisions: list[Decision] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    # filled by steps
    shapes: RankShapes | None = None
    page_size: int = 1
    dev: DevicePools | None = None
    device_kv_per_token: int = 0
    int2_hp_bytes: int = 0
    req_to_token_bytes: int = 0
    device: DevicePlan | None = None
    budget: Budget | None = None
    ceiling: int | None = None
    a_runtime: int = 0
    a_guard: int = 0  # what the release's stock host guard reads as available (checks.guard_available)
    a_guard_detail: str = ""
    stock_reserve: int = 0
    patched_reserve: int = 0
    runtime_applies: str = "stock"
    max_safe_ratio: float | None = None
    recommended_ratio: float | None = None
    max_safe_size_gb: int | None = None
    hicache: HiCachePlan | None = None
    hicache_off_reason: str | None = None
    unsafe: list[str] = field(default_factory=list)  # reasons that make the verdict unsafe
    pools: HostPools | None = None
    runtime_check: RuntimeCheck | None = None
    findings: list[Finding] = field(default_factory=list)
    verdict: str = "ok"
    short_now_bytes: int | None = None  # what the live host lacks now (MemAvailable), if anything

    @property
    def ranks(self) -> int:
        return self.profile.runtime.tp_size

    def decide(self, step: str, rule: str, value: object, reason: str) -> None:
        self.decisions.append(Decision(step=step, rule=rule, value=value, reason=reason))


# --------------------------------------------------------------------------- steps


def step_model_shapes(c: _Ctx) -> None:
    c.shapes = rank_shapes(c.arch, c.ranks)
    s = c.shapes
    c.decide("model_shapes", "layer typing", {"full_attention": s.full_layers, "linear": s.linear_layers},
             "layer l is full attention iff (l+1) % full_attention_interval == 0 (Qwen3NextConfig)"
             if c.arch.is_hybrid else "every layer is full attention")
    c.decide("model_shapes", "kv heads per rank", s.kv_heads_per_rank,
             f"max(1, {c.arch.num_key_value_heads} // tp {c.ranks}) (ModelConfig.get_num_kv_heads)")
    if s.mamba_bytes_per_slot:
        c.decide("model_shapes", "mamba bytes per slot", s.mamba_bytes_per_slot,
                 f"{s.linear_layers} GDN layers x (conv {s.mamba_conv_bytes_per_layer} + temporal "
                 f"{s.mamba_temporal_bytes_per_layer}) B (Mamba2StateShape.create)")


def _host_kv_buffers_per_token(c: _Ctx, dtype: str) -> tuple[tuple[str, int], ...]:
    """The INT2 host pool's three allocations per token: packed codes (K and V in one buffer, as
    ``MHATokenToKVPoolHost.init_kv_buffer``) and K, V scales/zeros (``host_k_sz``/``host_v_sz``);
    ``()`` for the other dtypes (one K-and-V buffer, ``pools.host_buffers``)."""
    if dtype != "int2":
        return ()
    i2 = c.profile.runtime.kv_cache.int2
    codes, sz = kvmod.int2_parts(c.shapes, i2.group_size, i2.scale_dtype)
    layers = c.shapes.full_layers
    return (("host KV codes buffer (K and V)", layers * 2 * codes),
            ("host K scales/zeros buffer", layers * sz), ("host V scales/zeros buffer", layers * sz))


def step_device_pools(c: _Ctx) -> None:
    rt, s = c.profile.runtime, c.shapes
    i2 = rt.kv_cache.int2
    dtype = kvmod.normalize_kv_dtype(rt.kv_cache.dtype)
    c.page_size = rt.page_size or (4 * 2 if dtype == "int2" else 1)
    c.device_kv_per_token = kvmod.device_bytes_per_token(s, dtype, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
    host_per_token = kvmod.host_bytes_per_token(s, dtype, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
    per_slot = s.mamba_bytes_per_slot
    tokens, slots = rt.max_total_tokens, rt.max_mamba_cache_size if c.arch.is_hybrid else 0
    if tokens is None or (c.arch.is_hybrid and slots is None):
        # SGLang sizes what the profile leaves unset from the static budget
        # (KVCacheConfigurator._handle_max_mamba_cache, DefaultPoolConfigurator.calculate_pool_sizes).
        rest = _static_budget(c) - c.weights_bytes
        if c.arch.is_hybrid and slots is None:
            r = MAMBA_FULL_MEMORY_RATIO
            slots = max(int((rest * r / (1 + r) - per_slot) // per_slot), 0)
            c.decide("device_pools", "mamba slots (SGLang auto)", slots,
                     f"rest x {r}/(1+{r}) // {per_slot} B per slot - 1 (KVCacheConfigurator._handle_max_mamba_cache)")
        if c.arch.is_hybrid:
            rest -= (slots + 1) * per_slot
        if tokens is None:
            tokens = max(rest, 0) // c.device_kv_per_token // c.page_size * c.page_size
            c.decide("device_pools", "device KV tokens (SGLang auto)", tokens,
                     f"rest {fmt_gb(max(rest, 0))} // {c.device_kv_per_token} B per token, floored to the page")
    else:
        c.decide("device_pools", "device KV tokens", tokens, "runtime.max_total_tokens")
        if slots:
            c.decide("device_pools", "device mamba slots", slots, "runtime.max_mamba_cache_size")
    c.dev = DevicePools(
        kv_tokens=tokens, kv_bytes=(tokens + c.page_size) * c.device_kv_per_token, kv_page_size=c.page_size,
        mamba_slots=slots or 0, mamba_bytes=((slots or 0) + 1) * per_slot if slots else 0,
        mamba_bytes_per_slot=per_slot, host_kv_bytes_per_token=host_per_token or c.device_kv_per_token,
        host_kv_buffers_per_token=_host_kv_buffers_per_token(c, dtype),
        mamba_layers=s.linear_layers if per_slot else 0,
        mamba_conv_bytes_per_layer=s.mamba_conv_bytes_per_layer,
        mamba_temporal_bytes_per_layer=s.mamba_temporal_bytes_per_layer,
    )
    mrr = rt.max_running_requests or max((slots or 0) // MAMBA_SLOTS_PER_REQUEST, 1)
    if dtype == "int2":
        c.int2_hp_bytes = kvmod.int2_hp_arena_bytes(
            s, prefix_tokens=i2.prefix_tokens, recent_tokens=i2.recent_tokens, page_size=c.page_size,
            max_running_requests=mrr, hp_dtype=i2.hp_dtype)
        c.decide("device_pools", "INT2 high-precision arena", c.int2_hp_bytes,
                 f"({i2.prefix_tokens} sink + {mrr} requests x ({i2.recent_tokens} + {c.page_size} - 1)) "
                 f"slots x {s.full_layers} layers x K,V x {s.kv_heads_per_rank} heads x {s.head_dim} x {i2.hp_dtype}")
    if rt.context_length:
        # ReqToTokenPool: (max_running_requests + 1) x context_len x int32 (memory_pool.py)
        c.req_to_token_bytes = (mrr + 1) * rt.context_length * 4


def _free_before_weights(c: _Ctx) -> tuple[int, int, int, int]:
    hw, sf = c.profile.hardware, c.profile.safety
    hidden = sf.wsl2_hidden_vram_per_gpu if c.host.platform == "wsl2" else 0
    free = hw.gpu_vram - hidden - sf.cuda_context_per_gpu
    return hw.gpu_vram, hidden, sf.cuda_context_per_gpu, free


def _mem_fraction(c: _Ctx) -> tuple[float, str, float]:
    rt = c.profile.runtime
    default = sglang_default_mem_fraction(
        c.profile.hardware.gpu_vram, c.ranks, chunked_prefill=rt.chunked_prefill_size,
        decode_max_bs=rt.cuda_graph_max_bs, prefill_graphs=not rt.disable_prefill_cuda_graph,
        release=c.release, max_running_requests=rt.max_running_requests)
    if rt.mem_fraction_static is not None:
        return rt.mem_fraction_static, "runtime.mem_fraction_static", default
    drop = c.profile.safety.wsl2_mem_fraction_drop
    cc = c.profile.hardware.compute_capability or ""
    if c.host.platform == "wsl2" and cc.startswith("12.") and drop > 0:
        return (round(default - drop, 3),
                f"SGLang's default for this card ({default}) minus safety.wsl2_mem_fraction_drop {drop:g}: under WSL2 "
                f"on sm_{cc.replace('.', '')} the device overhead is larger (microsoft/WSL#40401, #41176)", default)
    return default, "SGLang's default for this card (memory_hook.py: handle_gpu_memory_settings)", default


def _static_budget(c: _Ctx) -> int:
    _, _, _, free = _free_before_weights(c)
    mfs, _, _ = _mem_fraction(c)
    return int(free * mfs)


def step_device_budget(c: _Ctx) -> None:
    rt = c.profile.runtime
    vram, hidden, ctx, free = _free_before_weights(c)
    mfs, mfs_source, default = _mem_fraction(c)
    static = int(free * mfs)
    # SGLang sizes the KV and mamba pools from what the weights leave of the static budget
    # (kv_cache_configurator.py: _profile_available_bytes); the request-to-token table is
    # allocated beside them, out of the room the fraction leaves (memory_pool.py: ReqToTokenPool).
    need = c.weights_bytes + c.dev.kv_bytes + c.dev.mamba_bytes + c.int2_hp_bytes
    reserved = int(sglang_reserved_mib(vram // MiB, c.ranks, chunked_prefill=rt.chunked_prefill_size,
                                       decode_max_bs=rt.cuda_graph_max_bs,
                                       prefill_graphs=not rt.disable_prefill_cuda_graph, release=c.release,
                                       max_running_requests=rt.max_running_requests) * MiB)
    room = free - static - c.req_to_token_bytes
    # SGLang fits tokens x bytes-per-token into the budget and allocates one padding page on top
    # (memory_pool.py: buffers of tokens + page_size rows), so the page is not budgeted
    budgeted = need - c.page_size * c.device_kv_per_token
    c.device = DevicePlan(
        vram_bytes=vram, hidden_bytes=hidden, cuda_context_bytes=ctx, free_before_weights_bytes=free,
        mem_fraction_static=mfs, mem_fraction_static_source=mfs_source,
        sglang_default_mem_fraction_static=default, sglang_reserved_bytes=reserved,
        static_budget_bytes=static, static_need_bytes=need, activation_room_bytes=room, fits=budgeted <= static,
    )
    # one unit (GiB) for every term and the result; the WSL2 term only where WSL2 hides memory
    wsl2_term = f" - {fmt_gib(hidden)} hidden by WSL2" if c.host.platform == "wsl2" else ""
    c.decide("device_budget", "static budget", static,
             f"({fmt_gib(vram)} VRAM{wsl2_term} - {fmt_gib(ctx)} CUDA context) x "
             f"mem_fraction_static {mfs} ({mfs_source}) = {fmt_gib_gb(static)}")
    c.decide("device_budget", "weights per rank", c.weights_bytes, c.weights_source)
    if not c.device.fits:
        c.unsafe.append(
            f"device: weights {fmt_gb(c.weights_bytes)} + KV pool {fmt_gb(c.dev.kv_bytes)} + mamba pool "
            f"{fmt_gb(c.dev.mamba_bytes)} + other {fmt_gb(c.int2_hp_bytes)} = "
            f"{fmt_gb(need)} per rank exceed the static budget {fmt_gb(static)}: lower "
            "runtime.max_total_tokens or max_mamba_cache_size, or raise runtime.mem_fraction_static")
    floor = int(sglang_min_reserved_mib(c.ranks) * MiB)
    if room < floor:
        c.unsafe.append(
            f"device: mem_fraction_static {mfs} leaves {fmt_gb(room)} per GPU for activations, CUDA graphs "
            f"and NCCL, below the {fmt_gb(floor)} SGLang keeps even when it sizes the pool after graph "
            "capture (memory_hook.py: handle_gpu_memory_settings): the first long prefill would run out of "
            f"memory; lower runtime.mem_fraction_static (SGLang's default here is {default})")
    elif room < reserved:
        c.warnings.append(
            f"device: mem_fraction_static {mfs} leaves {fmt_gb(room)} per GPU for activations and CUDA "
            f"graphs; SGLang's own estimate is {fmt_gb(reserved)} (its default fraction would be {default}). "
            f"Above SGLang's {fmt_gb(floor)} floor, so not refused; if a long prefill runs out of memory, "
            "lower runtime.mem_fraction_static (docs/planner.md, \"Device headroom\")")


#: Upper end of the ``max_safe_ratio`` search: a bound, not a policy (no host pool is that big).
MAX_RATIO_SEARCH = 1024.0

WSL2_MEMORY_ADVICE = (
    "under WSL2 this memory is the VM's: raise memory= under [wsl2] in %UserProfile%\\.wslconfig "
    "(default half the Windows RAM) and restart the VM with `wsl --shutdown`")
WSL2_CEILING_ADVICE = (
    "under WSL2 the pinned ceiling is the GPU paravirtualisation's, not the locked-memory limit: "
    "--ulimit memlock=-1 does not lift it (microsoft/WSL#8447); lower the ratio")


def step_pinned_budget(c: _Ctx) -> None:
    h, sf = c.host, c.profile.safety
    base, base_src, base_kind = h.memory_base()
    procs = c.ranks * sf.server_process_per_rank
    store = l3_host_bytes(c.profile)  # an L3 store's host memory on this box (Mooncake's segment)
    reserves = procs + sf.os_reserve + sf.page_cache_floor + store
    budget = max(base - reserves, 0)
    store_term = f" - {fmt_gib(store)} Mooncake global segment" if store else ""
    c.ceiling = h.pinned_ceiling_bytes if h.pinned_ceiling_reached else None
    share = budget // max(c.ranks, 1)
    binding = "ceiling" if c.ceiling is not None and c.ceiling < share else base_kind
    if binding == "ceiling":
        detail = (f"the {fmt_gb(c.ceiling)} pinned ceiling per rank `escha-deploy doctor` measured, below the "
                  f"pinned budget's {fmt_gb(share)} per rank")
    else:
        # the formula's terms are GiB, so is its result; the GB figure follows for SGLang's flags
        detail = (f"the pinned budget {base_src} - {c.ranks} x {fmt_gib(sf.server_process_per_rank)} "
                  f"server processes - {fmt_gib(sf.os_reserve)} OS - {fmt_gib(sf.page_cache_floor)} page-cache floor"
                  f"{store_term} = {fmt_gib_gb(budget)}")
    c.budget = Budget(
        memory_base_bytes=base, memory_base_source=base_src, memory_base_kind=base_kind, hugetlb_bytes=h.hugetlb_bytes,
        server_processes_bytes=procs, os_reserve_bytes=sf.os_reserve, page_cache_floor_bytes=sf.page_cache_floor,
        pinned_budget_bytes=budget, pinned_ceiling_bytes=c.ceiling, available_now_bytes=h.available_now_bytes,
        reserves_exceed_base=reserves > base, binding=binding, binding_detail=detail, l3_store_bytes=store,
    )
    c.decide("pinned_budget", "pinned budget", budget,
             f"{base_src} - {c.ranks} x {fmt_gib(sf.server_process_per_rank)} server processes - "
             f"{fmt_gib(sf.os_reserve)} OS - {fmt_gib(sf.page_cache_floor)} page-cache floor (safety policy)"
             f"{store_term} = {fmt_gib_gb(budget)}")
    c.decide("pinned_budget", "binding constraint", binding, detail)
    if reserves > base:
        c.unsafe.append(
            f"host: the safety policy's own reserves ({c.ranks} x {fmt_gib(sf.server_process_per_rank)} server "
            f"processes + {fmt_gib(sf.os_reserve)} OS + {fmt_gib(sf.page_cache_floor)} page-cache floor"
            f"{store_term.replace(' - ', ' + ')} = "
            f"{fmt_gib_gb(reserves)}) exceed the memory the server can have, {base_src}: "
            "the server does not fit even without HiCache; "
            + (WSL2_MEMORY_ADVICE if h.platform == "wsl2" and base_kind == "ram" else
               "raise the container's memory limit" if base_kind == "cgroup" else "use a host with more memory"))
    # MemAvailable when the pools are built: the base less the OS and the server processes.
    c.a_runtime = max(base - sf.os_reserve - procs, 0)
    c.a_guard, c.a_guard_detail = guard_available(
        c.release, c.a_runtime, mem_total=h.mem_total_bytes, hugetlb=h.hugetlb_bytes,
        cgroup_limit=h.cgroup_limit_bytes, os_reserve=sf.os_reserve, server_processes=procs)
    c.stock_reserve = load_release(c.release).host_guard.reserve_bytes
    c.patched_reserve = max(c.a_runtime - budget, 0)
    c.runtime_applies = "patched" if "hicache-host-reserve-env" in c.capabilities else "stock"
    c.decide("pinned_budget", "reserve for the patched runtime", c.patched_reserve,
             f"ESCHA_HICACHE_HOST_RESERVE_BYTES = modelled MemAvailable {fmt_gib(c.a_runtime)} - pinned budget "
             f"{fmt_gib(budget)} = {fmt_gib_gb(c.patched_reserve)}, so the runtime's own check agrees with this budget")
    if c.ceiling is not None:
        c.decide("pinned_budget", "pinned ceiling per rank", c.ceiling, "measured by `escha-deploy doctor`")
    elif h.platform == "wsl2" and c.profile.hicache.enabled:
        c.warnings.append(
            "WSL2 limits pinned memory and the ceiling on this box is unmeasured (reports range from about "
            "0.5 GB to several GB): run `escha-deploy doctor` there to measure it (with the plan's --profile, "
            "its ladder aims at the planned pools)")


def _first_failure(c: _Ctx, pools: HostPools) -> str | None:
    """The first constraint these pools break, named with its number and source; None if none."""
    b = c.budget
    if c.ranks * pools.pinned_bytes > b.pinned_budget_bytes:
        what = ("the cgroup" if b.memory_base_kind == "cgroup" else "the RAM") + " budget: "
        return what + (f"pinned {fmt_gib_gb(c.ranks * pools.pinned_bytes)} > the pinned budget "
                       f"{fmt_gib_gb(b.pinned_budget_bytes)}, that is {b.memory_base_source} - server processes - "
                       "OS - page-cache floor")
    if c.ceiling is not None and pools.pinned_bytes > c.ceiling:
        return (f"the pinned ceiling: {fmt_gb(pools.pinned_bytes)} per rank > the {fmt_gb(c.ceiling)} "
                "per-rank ceiling `escha-deploy doctor` measured")
    too_big = _pinned_buffer_over_limit(c, pools)
    if too_big is not None:
        name, nbytes = too_big
        return (f"the pinned allocation limit: the {name} is {nbytes:,} B, above {PINNED_MAX_BYTES:,} B (4 GiB) "
                "for one cudaHostAlloc buffer (sglang#7666)")
    if c.runtime_applies == "stock":
        ok, why = stock_check(c.a_guard, c.ranks, pools.kv_bytes, pools.mamba_bytes, c.stock_reserve)
    else:
        ok, why = patched_check(c.a_runtime, c.ranks, pools.kv_bytes, pools.mamba_bytes, c.patched_reserve)
    return None if ok else f"the {c.runtime_applies} runtime's own check: {why}"


def _planned_allocator(c: _Ctx) -> str | None:
    """The host allocator the launch will set (``ESCHA_HICACHE_HOST_ALLOCATOR``), or None when
    the runtime lacks hicache-host-allocator: doctor's store probe, else ``pinned`` on WSL2
    (sglang#40232) and ``auto`` elsewhere."""
    if "hicache-host-allocator" not in c.capabilities:
        return None
    return c.host.host_allocator or ("pinned" if c.host.platform == "wsl2" else "auto")


def _counting_allocator(c: _Ctx) -> tuple[str, str]:
    """The allocator that will pin the host pools, ``pinned`` or ``register``, and why: the
    launch's ``ESCHA_HICACHE_HOST_ALLOCATOR`` (``_planned_allocator``), ``auto`` resolved as the
    hook resolves it (pinned where registered memory is not device-mappable: WSL2), or stock
    SGLang 0.5.19's mmap + cudaHostRegister without hicache-host-allocator."""
    planned = _planned_allocator(c)
    if planned is None:
        return "register", "stock SGLang 0.5.19 (pool_host/common.py: alloc_with_host_register)"
    if planned == "auto":
        return ("pinned", "auto on WSL2") if c.host.platform == "wsl2" else (
            "register", "auto: registered memory is device-mappable off WSL2")
    why = "doctor's store probe" if c.host.host_allocator else "WSL2 (sglang#40232)"
    return planned, f"ESCHA_HICACHE_HOST_ALLOCATOR={planned}: {why}"


def _pinned_buffer_over_limit(c: _Ctx, pools: HostPools) -> tuple[str, int] | None:
    """The first single host buffer above ``PINNED_MAX_BYTES`` when the allocator is pinned.

    The runtime hook (``runtime/hooks/host_alloc.py: resolve``) refuses any one cudaHostAlloc
    buffer above 4 GiB with ``PinnedAllocationTooLarge`` (sglang#7666: one pinned allocation
    above about 4 GB failed with "CUDA error: invalid argument"); ``auto`` resolves to
    register off WSL2, where the limit does not apply. Buffers from ``pools.host_buffers``."""
    if _planned_allocator(c) != "pinned":
        return None
    return next(((n, b) for n, b in host_buffers(c.dev, pools) if b > PINNED_MAX_BYTES), None)


def _pool_fits(c: _Ctx, pools: HostPools) -> bool:
    return _first_failure(c, pools) is None


def _headroom(c: _Ctx, pools: HostPools) -> int:
    """Room left under the binding constraint: the budget less the pinned total, or the
    ceiling less the per-rank pools when the ceiling binds."""
    room = c.budget.pinned_budget_bytes - c.ranks * pools.pinned_bytes
    if c.ceiling is not None:
        room = min(room, c.ceiling - pools.pinned_bytes)
    return room


def _platform_advice(c: _Ctx) -> str:
    """WSL2 advice for the constraint that binds ('' off WSL2 or when a cgroup binds)."""
    if c.host.platform != "wsl2":
        return ""
    if c.budget.binding == "ceiling":
        return WSL2_CEILING_ADVICE
    if c.budget.binding == "ram":
        return WSL2_MEMORY_ADVICE
    return ""


def step_runtime_checks(c: _Ctx) -> None:
    """Only records the rule; the checks run on the chosen pools in ``host_pools``."""
    c.decide("runtime_checks", "runtime check that applies", c.runtime_applies,
             "the runtime has hicache-host-reserve-env" if c.runtime_applies == "patched"
             else f"stock {c.release} (no hicache-host-reserve-env capability): {c.a_guard_detail}")


def step_safe_ratio(c: _Ctx) -> None:
    hc = c.profile.hicache
    if not hc.enabled:
        return
    # The true largest safe ratio, not limited by hicache.max_ratio (that caps the recommendation
    # only): double from the cap until a ratio does not fit, then bisect.
    top_ratio = max(hc.max_ratio, 1.0)
    while top_ratio < MAX_RATIO_SEARCH and _pool_fits(c, host_pools_at_ratio(c.dev, top_ratio)):
        top_ratio *= 2
    top = int(round(min(top_ratio, MAX_RATIO_SEARCH) * SAFE_RATIO_GRID))
    ks = range(1, top + 1)
    # pinned bytes never shrink as the ratio grows, so "fits" is monotonic: bisect the grid.
    first_bad = bisect.bisect_left(ks, True, key=lambda k: not _pool_fits(c, host_pools_at_ratio(c.dev, k / SAFE_RATIO_GRID)))
    c.max_safe_ratio = ks[first_bad - 1] / SAFE_RATIO_GRID if first_bad > 0 else None
    step = c.profile.safety.ratio_step
    headroom = c.profile.safety.recommend_headroom
    n = int(round(hc.max_ratio / step))

    def leaves_headroom(i: int) -> bool:
        pools = host_pools_at_ratio(c.dev, round(i * step, 6))
        return _pool_fits(c, pools) and _headroom(c, pools) >= headroom

    # monotonic for the same reason: bisect, so the search takes log2(n) + 1 steps whatever
    # ratio_step and max_ratio say (at most 18 with the profile's bounds)
    steps = range(1, n + 1)
    first_short = bisect.bisect_left(steps, True, key=lambda i: not leaves_headroom(i))
    best = round(steps[first_short - 1] * step, 6) if first_short > 0 else None
    c.recommended_ratio = best
    if c.max_safe_ratio is not None:
        c.decide("safe_ratio", "largest safe ratio", c.max_safe_ratio,
                 f"largest on a 1/{SAFE_RATIO_GRID} grid whose pinned total fits {fmt_gb(c.budget.pinned_budget_bytes)}"
                 + (f" and the {fmt_gb(c.ceiling)} per-rank ceiling" if c.ceiling else "")
                 + (f", each pinned buffer within {PINNED_MAX_BYTES:,} B (4 GiB, sglang#7666)"
                    if _planned_allocator(c) == "pinned" else "")
                 + f" and the {c.runtime_applies} runtime check")
    if best is not None:
        pinned = c.ranks * host_pools_at_ratio(c.dev, best).pinned_bytes
        c.decide("safe_ratio", "recommended ratio", best,
                 f"largest on a {step} grid leaving >= {fmt_mib(headroom)} headroom under {c.budget.binding_detail}: "
                 f"pins {fmt_gb(pinned)}, {fmt_mib(_headroom(c, host_pools_at_ratio(c.dev, best)))} left "
                 f"(capped at hicache.max_ratio {hc.max_ratio})")
    if hc.hicache_size or c.size_override:
        top_gb = max(int(c.budget.pinned_budget_bytes // GB // max(c.ranks, 1)) + 1, 1)
        sizes = range(1, top_gb + 1)
        first_bad = bisect.bisect_left(sizes, True, key=lambda g: not _pool_fits(c, host_pools_at_size(c.dev, g)))
        c.max_safe_size_gb = sizes[first_bad - 1] if first_bad > 0 else None


def step_choose_hicache(c: _Ctx) -> None:
    hc = c.profile.hicache
    if not hc.enabled:
        c.hicache = HiCachePlan(enabled=False, ratio=None, size_gb=None, requested="disabled in the profile"
                                + (f" ({c.hicache_source})" if c.hicache_source else ""))
        return
    size = c.size_override if c.size_override is not None else (hc.hicache_size or None)
    ratio_req = c.ratio_override if c.ratio_override is not None else hc.hicache_ratio
    # the label names where the value came from: the option, else the profile's (file:line or
    # --set, as the caller knows it); a profile size wins over --ratio, so it keeps the profile's
    if c.size_override is not None:
        requested = f"hicache_size {size} GB per rank (--hicache-size)"
    elif size:
        requested = f"hicache_size {size} GB per rank" + (f" ({c.hicache_source})" if c.hicache_source else "")
    elif c.ratio_override is not None:
        requested = f"hicache_ratio {ratio_req} (--ratio)"
    else:
        requested = f"hicache_ratio {ratio_req}" + (f" ({c.hicache_source})" if c.hicache_source else "")
    allocator = None
    if c.host.platform == "wsl2":
        if "hicache-host-allocator" in c.capabilities:
            allocator = _planned_allocator(c)
            c.decide("choose_hicache", "host allocator", allocator,
                     "WSL2: a kernel cannot store to cudaHostRegister'ed memory (sglang#40232); "
                     "cudaHostAlloc (pinned) memory is device-mappable"
                     + (" (doctor's store probe)" if c.host.host_allocator else ""))
        else:
            c.hicache_off_reason = (
                "WSL2: the runtime registers host pools with cudaHostRegister, which a kernel cannot store "
                "to there (illegal memory access, sglang#40232); it needs hicache-host-allocator")
    else:
        if "hicache-host-allocator" in c.capabilities:
            allocator = _planned_allocator(c)
            c.decide("choose_hicache", "host allocator", allocator,
                     "doctor's store probe" if c.host.host_allocator else
                     "auto: the patch picks cudaHostAlloc where registered memory is not device-mappable")
    ratio: float | None = None
    if size:
        c.decide("choose_hicache", "hicache_size", size, requested)
    elif ratio_req == "auto":
        if c.recommended_ratio is not None and c.recommended_ratio >= hc.min_ratio:
            ratio = c.recommended_ratio
            c.decide("choose_hicache", "hicache_ratio", ratio, "auto: the recommended ratio")
        elif c.hicache_off_reason is None:
            at_min = host_pools_at_ratio(c.dev, hc.min_ratio)
            why = _first_failure(c, at_min) or (
                f"{fmt_mib(_headroom(c, at_min))} would be left under {c.budget.binding_detail}, less than the "
                f"{fmt_mib(c.profile.safety.recommend_headroom)} headroom")
            advice = _platform_advice(c)
            c.hicache_off_reason = (
                f"no ratio >= hicache.min_ratio {hc.min_ratio} fits: at {hc.min_ratio}, {why}"
                + (f" (largest safe {c.max_safe_ratio})" if c.max_safe_ratio else "")
                + (f"; {advice}" if advice else ""))
    else:
        ratio = float(ratio_req)
        c.decide("choose_hicache", "hicache_ratio", ratio, requested)
    if c.hicache_off_reason and (ratio_req == "auto" and not size):
        c.hicache = HiCachePlan(enabled=False, ratio=None, size_gb=None, requested=requested)
        c.decide("choose_hicache", "HiCache", "off", c.hicache_off_reason)
        return
    if c.hicache_off_reason:  # an explicit request that cannot run here
        c.unsafe.append(c.hicache_off_reason)
    if c.arch.is_hybrid:
        runtime = ("stock SGLang 0.5.19" if not c.capabilities & set(SERIES_CAPABILITIES) else
                   "SGLang 0.5.19 with this series, which does not change the hybrid restore path")
        c.warnings.append(
            f"hicache: on this runtime ({runtime}) host-tier hits for a hybrid GDN model may be inert (the unified "
            "cache prunes mamba state on device eviction, so nothing loads back: sglang#33713) or restore wrong "
            "state (a fluent, wrong answer with full cached_tokens: sglang#39830); run `escha-deploy up --canary` "
            "to prove a prefix restored from host RAM answers as it did the first time")
    c.hicache = HiCachePlan(
        enabled=True, ratio=None if size else ratio, size_gb=size, requested=requested,
        mem_layout=hc.hicache_mem_layout, io_backend=hc.hicache_io_backend,
        storage_backend=hc.hicache_storage_backend, host_allocator=allocator,
    )


def step_host_pools(c: _Ctx) -> None:
    h = c.hicache
    if not h.enabled:
        c.pools = HostPools(0, 0, 0, 0)
        return
    c.pools = host_pools_at_size(c.dev, h.size_gb) if h.size_gb else host_pools_at_ratio(c.dev, h.ratio)
    p = c.pools
    how = f"--hicache-size {h.size_gb}" if h.size_gb else f"--hicache-ratio {h.ratio}"
    c.decide("host_pools", "host KV pool", p.kv_bytes,
             f"{how}: {p.kv_tokens:,} tokens (page-rounded, +1 page) x {c.dev.host_kv_bytes_per_token} B")
    if p.mamba_slots:
        c.decide("host_pools", "host mamba pool", p.mamba_bytes,
                 f"{how}: {p.mamba_slots} slots (+1) x {c.dev.mamba_bytes_per_slot} B")
    total = c.ranks * p.pinned_bytes
    budget = c.budget.pinned_budget_bytes
    c.budget = c.budget.model_copy(update={"headroom_bytes": _headroom(c, p)})
    hint = ((f"; use a ratio <= {c.max_safe_ratio}" if c.max_safe_ratio and not h.size_gb else "")
            + (f"; use hicache_size <= {c.max_safe_size_gb}" if c.max_safe_size_gb and h.size_gb else ""))
    if total > budget:
        c.unsafe.append(
            f"pinned {fmt_gb(total)} ({c.ranks} ranks x (KV {fmt_gb(p.kv_bytes)} + mamba {fmt_gb(p.mamba_bytes)})) "
            f"exceeds {c.budget.binding_detail if c.budget.binding != 'ceiling' else f'the pinned budget {fmt_gb(budget)}'}: "
            "pinned pages cannot be paged out, so the box would swap (ratio 2 pinned 10.3 GB on a 16 GiB WSL2 VM "
            "and its page cache fell to 589 MB)" + hint
            + (f"; {WSL2_MEMORY_ADVICE}" if c.host.platform == "wsl2" and c.budget.memory_base_kind == "ram" else ""))
    if c.ceiling is not None and p.pinned_bytes > c.ceiling:
        c.unsafe.append(f"each rank pins {fmt_gb(p.pinned_bytes)}, above the {fmt_gb(c.ceiling)} pinned ceiling per "
                        "rank `escha-deploy doctor` measured" + hint
                        + (f"; {WSL2_CEILING_ADVICE}" if c.host.platform == "wsl2" else ""))
    too_big = _pinned_buffer_over_limit(c, p)
    if too_big is not None:
        name, nbytes = too_big
        field_ = (f"hicache.hicache_size: at {h.size_gb} GB per rank" if h.size_gb
                  else f"hicache.hicache_ratio: at {h.ratio}")
        why = ("doctor's store probe picked pinned" if c.host.host_allocator == "pinned"
               else "WSL2: cudaHostRegister'ed memory is not device-mappable, sglang#40232")
        c.unsafe.append(
            f"{field_} the {name} is {nbytes:,} B ({nbytes / 2**30:.2f} GiB), above "
            f"the {PINNED_MAX_BYTES:,} B (4 GiB) limit on one pinned (cudaHostAlloc) allocation, which the host "
            f"allocator ({why}) enforces because one pinned allocation above about 4 GB failed with \"CUDA error: "
            "invalid argument\" (sglang#7666); the server would stop at startup, after the weights load, with "
            "PinnedAllocationTooLarge" + hint)
    if p.kv_tokens <= c.dev.kv_tokens:
        c.warnings.append(f"hicache: the host KV pool ({p.kv_tokens:,} tokens) is not larger than the device pool "
                          f"({c.dev.kv_tokens:,}); L2 cache effectiveness is reduced (SGLang's own warning)")
    # The runtime's own checks on these pools.
    s_ok, s_why = stock_check(c.a_guard, c.ranks, p.kv_bytes, p.mamba_bytes, c.stock_reserve)
    p_ok, p_why = patched_check(c.a_runtime, c.ranks, p.kv_bytes, p.mamba_bytes, c.patched_reserve)
    c.runtime_check = RuntimeCheck(
        stock="accept" if s_ok else "refuse", patched="accept" if p_ok else "refuse",
        applies=c.runtime_applies, available_bytes=c.a_runtime, stock_reserve_bytes=c.stock_reserve,
        patched_reserve_bytes=c.patched_reserve, stock_detail=s_why, patched_detail=p_why,
        release=c.release, guard_kind=load_release(c.release).host_guard.kind,
        stock_available_detail=c.a_guard_detail)
    applied_ok = p_ok if c.runtime_applies == "patched" else s_ok
    if not applied_ok:
        c.unsafe.append(f"the {c.runtime_applies} runtime's host-memory check would refuse at startup: "
                                + (p_why if c.runtime_applies == "patched" else s_why))
    if h.storage_backend == "file" and not c.host.l3_checked:
        cap = c.profile.hicache.storage_max_size
        need = f"and have {fmt_gb(cap)} free (l3.max_size) " if cap else ""
        c.warnings.append(f"hicache.l3.dir: {c.profile.hicache.storage_dir} was not checked (this plan describes "
                          f"another host): there it must exist, be writable {need}where it is mounted")
    if c.host.available_now_bytes is not None:
        need = total + c.budget.server_processes_bytes + c.budget.os_reserve_bytes
        if c.host.available_now_bytes < need:
            c.short_now_bytes = need - c.host.available_now_bytes
            c.warnings.append(f"host: only {fmt_gb(c.host.available_now_bytes)} is available now, less than the "
                              f"{fmt_gb(need)} this plan needs: other processes already hold the room")


def _auto_size(c: _Ctx) -> AutoSizeCheck | None:
    """What the release's auto-size would pick on this box (None: the release has none)."""
    device = c.dev.kv_bytes + c.dev.mamba_bytes
    picked = auto_size_pick(c.release, c.a_guard, c.ranks, device,
                            buffer_only=c.profile.hicache.hicache_host_memory_mode == "buffer_only")
    if picked is None:
        return None
    ratio, budget = picked
    auto = load_release(c.release).host_guard.auto_size
    if ratio <= 0:
        return AutoSizeCheck(fraction=auto.fraction_default, budget_per_rank_bytes=budget, device_bytes=device,
                             ratio=round(ratio, 3), refused=True,
                             detail="\"No host memory is left for HiCache after the 10 GiB reserve\" (hicache_auto_size.py)")
    pools = host_pools_at_ratio(c.dev, ratio)
    fits = pools.kv_bytes <= budget and pools.mamba_bytes <= budget - pools.kv_bytes
    return AutoSizeCheck(
        fraction=auto.fraction_default, budget_per_rank_bytes=budget, device_bytes=device, ratio=round(ratio, 3),
        host_kv_bytes=pools.kv_bytes, host_mamba_bytes=pools.mamba_bytes, refused=not fits,
        detail=(f"(({fmt_gib(c.a_guard)} - {fmt_gib(c.stock_reserve)} reserve) "
                f"// {c.ranks}) x {auto.fraction_default} = {fmt_gib_gb(budget)} per rank; ratio min({auto.default_ratio}, "
                f"{fmt_gib(budget)} x {1 - auto.allocation_slack:g} / {fmt_gib(device)} device) = {ratio:.3f}; "
                f"pools {fmt_gib_gb(pools.kv_bytes + pools.mamba_bytes)} booked against the one snapshot "
                f"({'fit' if fits else 'do not fit'})"))


def step_validate(c: _Ctx) -> None:
    c.findings = validate(c.profile, c.arch, c.capabilities, page_size=c.page_size, mamba_slots=c.dev.mamba_slots,
                          model_dir=c.model_dir)
    images = [("container.image", c.profile.container.image), ("runtime.base_image", c.profile.runtime.base_image)]
    c.findings += [Finding(severity=sev, field=f, message=m) for sev, f, m in
                   release_findings(c.profile.runtime.needs, SERIES_CAPABILITIES, images, c.release, c.release_source)]


def step_verdict(c: _Ctx) -> None:
    errors = [f"{f.field}: {f.message}" for f in c.findings if f.severity == "error"]
    c.warnings.extend(f"{f.field}: {f.message}" for f in c.findings if f.severity == "warning")
    if errors or c.unsafe:
        c.verdict = "unsafe"
        c.reasons = errors + c.unsafe
    elif c.profile.hicache.enabled and not c.hicache.enabled:
        c.verdict = "hicache_off"
        c.reasons = [f"HiCache off: {c.hicache_off_reason}; the server is launchable without it"]
    else:
        c.verdict = "ok"
        if c.hicache.enabled:
            pinned = c.ranks * c.pools.pinned_bytes
            spare = c.budget.headroom_bytes
            room = fmt_gb(spare) if spare >= GB else fmt_mib(spare)
            if c.budget.binding == "ceiling":
                first = (f"each rank pins {fmt_gb(c.pools.pinned_bytes)}, under {c.budget.binding_detail}, "
                         f"with {room} to spare (pinned total {fmt_gb(pinned)})")
            else:
                first = f"pinned {fmt_gb(pinned)} fits {c.budget.binding_detail} with {room} to spare"
            c.reasons = [first + f"; the {c.runtime_applies} runtime's own check accepts it"]
            advice = _platform_advice(c)
            hc = c.profile.hicache
            limited = (c.hicache.ratio is not None and c.recommended_ratio is not None
                       and c.hicache.ratio == c.recommended_ratio and c.recommended_ratio < hc.max_ratio)
            nxt = (_pinned_buffer_over_limit(c, host_pools_at_ratio(c.dev, round(c.hicache.ratio + c.profile.safety.ratio_step, 6)))
                   if limited else None)
            if nxt is not None:
                c.reasons.append(f"the ratio is limited by the {PINNED_MAX_BYTES:,} B (4 GiB) limit on one pinned "
                                 f"(cudaHostAlloc) allocation (sglang#7666): one step higher, the {nxt[0]} would be "
                                 f"{nxt[1]:,} B; not by hicache.max_ratio {hc.max_ratio}")
            elif advice and limited:
                c.reasons.append(f"the ratio is limited by {c.budget.binding_detail}, not by hicache.max_ratio "
                                 f"{hc.max_ratio}; {advice}")
        else:
            c.reasons = ["HiCache is disabled in the profile; the device pools fit"]


STEPS: tuple[tuple[str, Callable[[_Ctx], None]], ...] = (
    ("model_shapes", step_model_shapes),
    ("device_pools", step_device_pools),
    ("device_budget", step_device_budget),
    ("pinned_budget", step_pinned_budget),
    ("runtime_checks", step_runtime_checks),
    ("safe_ratio", step_safe_ratio),
    ("choose_hicache", step_choose_hicache),
    ("host_pools", step_host_pools),
    ("validate", step_validate),
    ("verdict", step_verdict),
)


def _comparison(c: _Ctx) -> list[KvDtypeRow]:
    i2 = c.profile.runtime.kv_cache.int2
    rows = []
    for dt in ("bf16", "fp8_e4m3", "int2"):
        dev = kvmod.device_bytes_per_token(c.shapes, dt, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
        host = kvmod.host_bytes_per_token(c.shapes, dt, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
        rows.append(KvDtypeRow(dtype=dt, device_bytes_per_token=dev, host_bytes_per_token=host,
                               device_pool_bytes=(c.dev.kv_tokens + c.page_size) * dev, tokens_per_gb=GB // dev))
    return rows


def _host_buffer_rows(c: _Ctx) -> list[HostBuffer]:
    """Each host allocation of the chosen pools with the bytes its allocator pins."""
    if not c.hicache.enabled:
        return []
    allocator, why = _counting_allocator(c)
    return [HostBuffer(name=b.name, requested_bytes=b.requested_bytes, pinned_bytes=b.pinned_bytes,
                       allocator=b.allocator, allocator_source=why, source=b.source)
            for b in pinned_buffers(c.pools, allocator)]


def profile_weights_per_rank(profile: Profile) -> tuple[int, str]:
    """Weight bytes per rank from the profile's estimate (no model folder) and its source:
    ``model.weights_total`` / ``runtime.tp_size``, or ``model.weights_per_rank`` as written
    (the profile rule ``one-weights-estimate`` makes one of them set)."""
    m, tp = profile.model, profile.runtime.tp_size
    if m.weights_total is not None:
        return m.weights_total // tp, f"model.weights_total {fmt_gb(m.weights_total)} / tp {tp} (profile estimate)"
    return int(m.weights_per_rank or 0), "model.weights_per_rank (profile estimate)"


def _host_hit_cost(c: _Ctx):
    """``restore_cost.host_hit_cost`` for the chosen pools; None with HiCache off."""
    if not c.hicache.enabled:
        return None
    from .restore_cost import host_hit_cost

    h = c.host
    origin = {"facts": "the facts file's findings", "live": "this host's saved findings"}.get(h.source, h.source)
    if h.prefill_tokens_per_s:
        rate, src = h.prefill_tokens_per_s, h.prefill_source or "`escha-deploy bench` on this box"
    elif c.profile.hicache.prefill_tokens_per_s:
        rate, src = c.profile.hicache.prefill_tokens_per_s, "hicache.prefill_tokens_per_s (the profile)"
    else:
        rate, src = None, None
    return host_hit_cost(host_kv_bytes_per_token=c.dev.host_kv_bytes_per_token,
                         mamba_slot_bytes=c.dev.mamba_bytes_per_slot if c.dev.mamba_slots else 0,
                         context_length=c.profile.runtime.context_length, bandwidth=h.restore_bandwidth,
                         bandwidth_origin=origin, prefill_tokens_per_s=rate, prefill_source=src)


def plan(profile: Profile, host: HostFacts, *, model_dir: ModelDirFacts | None = None,
         ratio: float | None = None, hicache_size_gb: int | None = None,
         capabilities: frozenset[str] | set[str] | None = None, hicache_source: str | None = None,
         release: str | None = None, release_source: str = "") -> Plan:
    """Plan ``profile`` on ``host``: every byte the runtime will allocate, its own checks, the
    safe HiCache ratio and a verdict with reasons.

    ``model_dir``: facts read from the model folder (``arch.read_model_dir``); they replace the
    profile's architecture and weights estimate. ``ratio``/``hicache_size_gb``: command-line
    overrides (``--ratio``, ``--hicache-size``; GB = 1e9 per rank). ``hicache_source``: where the
    profile's deciding HiCache key (``enabled: false``, else ``hicache_size`` > 0, else
    ``hicache_ratio``) was set, ``file:line`` or ``--set key``, for the plan's label. ``capabilities``: what the
    target runtime provides; default: what the profile needs (the image built for it).
    ``release``: the SGLang release planned (``releases.choose_release``; default: the default
    release): its host guard, memory defaults and parser; ``release_source`` where it came from.
    Pure: no I/O (the release's committed data is read once per process). Raises nothing for unsafe plans; see ``Plan.verdict``.
    """
    caps = frozenset(profile.runtime.needs if capabilities is None else capabilities)
    arch = model_dir.arch if model_dir and model_dir.arch else profile.model.architecture
    if profile.runtime.mamba_ssm_dtype:
        arch = arch.model_copy(update={"mamba_ssm_dtype": profile.runtime.mamba_ssm_dtype})
    if model_dir and model_dir.safetensors_bytes:
        weights = model_dir.safetensors_bytes // profile.runtime.tp_size
        wsrc = f"safetensors in {model_dir.path}: {fmt_gb(model_dir.safetensors_bytes)} / tp {profile.runtime.tp_size}"
    else:
        weights, wsrc = profile_weights_per_rank(profile)
    c = _Ctx(profile=profile, host=host, arch=arch, weights_bytes=weights, weights_source=wsrc,
             capabilities=caps, ratio_override=ratio, size_override=hicache_size_gb,
             hicache_source=hicache_source, model_dir=model_dir, release=release or default_release(),
             release_source=release_source or "the default release")
    if model_dir and model_dir.arch:
        # the folder's config.json wins (it is what SGLang loads), but a profile written for
        # another model then plans a model nobody declared: say so, naming both
        mismatch = arch_mismatch(model_dir.arch, profile.model.architecture)
        if mismatch:
            c.warnings.append(
                f"model: the architecture comes from the model folder's config.json "
                f"({Path(model_dir.path) / 'config.json'}): {mismatch}; every size "
                "in this plan is for the folder's model: point the profile at the model it was written "
                "for, or use a profile written for this one")
    for _, step in STEPS:
        step(c)
    strategy, why = resolved_mamba_strategy(profile, arch)
    if why:
        c.decide("launch", "mamba radix cache strategy", f"--mamba-radix-cache-strategy {strategy}", why)
    p = c.pools
    sf = profile.safety
    peers = peer_access(host.gpus, tp_gpu_indices(profile.runtime.tp_size, profile.container.gpus), host.platform)
    car_off, p2p_off = _peer_decisions(c, profile, host.platform, peers)
    return Plan(
        host_hit_cost=_host_hit_cost(c),
        profile=profile.name, sglang_release=c.release, sglang_release_source=release_source, tp_size=c.ranks, platform=host.platform, host_source=host.source,
        hybrid=arch.is_hybrid, kv_cache_dtype=profile.runtime.kv_cache.dtype, page_size=c.page_size,
        hicache=c.hicache,
        per_rank=PerRank(
            device_kv_tokens=c.dev.kv_tokens, device_kv_bytes=c.dev.kv_bytes,
            device_kv_bytes_per_token=c.device_kv_per_token, device_mamba_slots=c.dev.mamba_slots,
            device_mamba_bytes=c.dev.mamba_bytes, mamba_bytes_per_slot=c.dev.mamba_bytes_per_slot,
            device_int2_hp_bytes=c.int2_hp_bytes, device_req_to_token_bytes=c.req_to_token_bytes,
            weights_bytes=c.weights_bytes, host_kv_tokens=p.kv_tokens, host_kv_bytes=p.kv_bytes,
            host_kv_bytes_per_token=c.dev.host_kv_bytes_per_token if c.hicache.enabled else None,
            host_mamba_slots=p.mamba_slots, host_mamba_bytes=p.mamba_bytes, pinned_bytes=p.pinned_bytes,
            host_buffers=_host_buffer_rows(c)),
        pinned_total_bytes=c.ranks * p.pinned_bytes,
        budget=c.budget,
        max_safe_ratio=c.max_safe_ratio if profile.hicache.enabled else None,
        short_now_bytes=c.short_now_bytes,
        recommended_ratio=c.recommended_ratio if c.hicache.enabled else None,  # none when the plan turned it off
        ratio_cap=profile.hicache.max_ratio if profile.hicache.enabled else None,
        runtime_check=c.runtime_check,
        host_guard=HostGuardView(
            release=c.release, kind=load_release(c.release).host_guard.kind, reserve_bytes=c.stock_reserve,
            available_bytes=c.a_guard, available_detail=c.a_guard_detail,
            share_per_rank_bytes=(c.a_guard - c.stock_reserve) // max(c.ranks, 1),
            auto_size=_auto_size(c) if profile.hicache.enabled else None),
        device=c.device,
        kv_dtype_comparison=_comparison(c),
        capabilities=sorted(caps),
        safety_policy=SafetyPolicy(
            server_process_per_rank_bytes=sf.server_process_per_rank, os_reserve_bytes=sf.os_reserve,
            page_cache_floor_bytes=sf.page_cache_floor, recommend_headroom_bytes=sf.recommend_headroom,
            ratio_step=sf.ratio_step, max_ratio=profile.hicache.max_ratio, min_ratio=profile.hicache.min_ratio,
        ),
        findings=c.findings, verdict=c.verdict, reasons=c.reasons, warnings=c.warnings, decisions=c.decisions,
        peer_access=peers, mamba_radix_cache_strategy=strategy,
        custom_all_reduce_disabled=car_off, nccl_p2p_disabled=p2p_off,
    )


def _peer_decisions(c, profile: Profile, platform: str, peers) -> tuple[bool, bool]:
    """``(--disable-custom-all-reduce, NCCL_P2P_DISABLE=1)`` for this plan, each decided once
    here and rendered by ``flags`` as decided (the decision line says the same as the argv).

    Custom all-reduce maps each rank's buffers into the others through CUDA IPC and needs peer
    access (sgl-project/sglang#4814): off for TP >= 2 unless NVML facts prove it between every
    pair of TP GPUs. NCCL's P2P transport is off under WSL2 and where NVML shows the TP GPUs
    without peer access (microsoft/WSL#12467, NVIDIA/nccl#1637); without NVML facts NCCL detects
    P2P itself. ``runtime.disable_custom_all_reduce`` and ``container.nccl_p2p_disable`` win."""
    tp = profile.runtime.tp_size
    set_car = profile.runtime.disable_custom_all_reduce
    if tp < 2:
        car = False
    elif set_car is not None:
        car = set_car
        if car:
            c.decide("launch", "custom all-reduce off", "--disable-custom-all-reduce",
                     "runtime.disable_custom_all_reduce: true")
    else:
        car = not peers.proven
        if car:
            c.decide("launch", "custom all-reduce needs proven peer access", "--disable-custom-all-reduce",
                     peers.detail)
    set_p2p = profile.container.nccl_p2p_disable
    if set_p2p is not None:
        p2p = set_p2p
    else:
        p2p = tp >= 2 and (platform == "wsl2" or (peers is not None and peers.denied))
    return car, p2p
