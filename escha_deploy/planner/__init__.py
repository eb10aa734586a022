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
                         capped by ``hicache.max_ratio``): ``search.search_safe`` over the
                         host constraints (``constraints``) that ``host_pools`` refuses by
7. ``choose_hicache``    the ratio or size to launch with, or HiCache off, and the host allocator
8. ``host_pools``        host pools and pinned totals at that choice (``pools``)
9. ``validate``          configuration rules naming their field (``validate``)
10. ``verdict``          ok / unsafe / hicache_off with the reasons
11. ``launch_values``    the launch values beyond the pools: mamba radix strategy, custom
                         all-reduce, NCCL P2P (``flags`` only renders what the plan decided)

Numbers come from SGLang 0.5.19's own formulas (each module cites its file and function) and
from the profile's safety policy; no threshold is tuned to a test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Generic, Literal, TypeVar, overload

from ..sglang.capabilities import SERIES_CAPABILITIES
from ..utils.errors import BadInput
from ..sglang.arch import DraftFacts, ModelArch, ModelDirFacts, RankShapes, arch_mismatch, rank_shapes
from ..facts.gpu_rules import PeerAccess, peer_access, tp_gpu_indices
from ..facts.host import HostFacts
from ..profile import Profile, key_env, key_flag
from ..profile.models import normalize_kv_dtype
from ..profile.rules import speculative_algorithm
from ..sglang.releases import default_release, load_release, release_findings, series_releases
from ..utils.units import GB, MiB, fmt_gb, fmt_gib, fmt_gib_gb, fmt_mib
from . import kv as kvmod
from .draft import (INTERMEDIATE_SOURCE, KV_SOURCE, DraftCount, DraftHost, SpecShape, draft_count, draft_host,
                    intermediate_mamba, mamba_slots_with_speculation, scaled_cell, spec_shape)
from .checks import auto_size_pick, guard_available, patched_check, stock_check
from .constraints import (WSL2_MEMORY_ADVICE, HostConstraint, HostView, binding_constraint, bounds,
                          breaches, buffer_over_limit, first_breach, host_constraints)
from .device import sglang_default_mem_fraction, sglang_min_reserved_mib, sglang_reserved_mib
from .pools import PINNED_MAX_BYTES, DevicePools, HostPools, host_pools_at_ratio, host_pools_at_size, pinned_buffers
from .disk import L3Disk
from .search import SAFE_RATIO_GRID, SafeRatios, headroom, search_safe
from .reach import Reach, Workload, needs as reach_needs, parse_workload, reach
from .result import (AutoSizeCheck, CheckResult, HostGuardView, Budget, Decision, DevicePlan, Finding, HiCachePlan, Fix, HostBuffer, HostHitCost, KvDtypeRow,
                     PerRank, Plan, ReachRow, RuntimeCheck, SafetyPolicy, Verdict)
from .validate import l3_host_bytes, mamba_slots_per_request, resolved_mamba_strategy, validate

__all__ = ["plan", "Plan", "PlanInputs", "STEPS", "StepOrderError"]

_T = TypeVar("_T")

#: SGLang 0.5.19's slots per request with extra_buffer + overlap (kv_cache_configurator.py).
MAMBA_SLOTS_PER_REQUEST = 5
#: ``--mamba-full-memory-ratio`` default (0.9): share of the rest given to mamba state.
MAMBA_FULL_MEMORY_RATIO = 0.9


@dataclass(frozen=True)
class DeviceSizing:
    """What ``step_device_pools`` decides beside the device pools, per rank: ``page_size``
    (tokens; the profile's, else 8 for INT2 and 1 otherwise), ``device_kv_per_token`` (bytes),
    ``int2_hp_bytes`` (INT2's high-precision sink + recent-window arena, bytes; 0 otherwise),
    ``req_to_token_bytes`` (``ReqToTokenPool``: (max_running_requests + 1) x context x 4 B;
    0 without a context length), ``draft_kv_per_token`` (bytes the draft's layers add to the
    target's cell: ``draft.scaled_cell`` less the cell; 0 without a counted draft) and
    ``draft_kv_bytes`` ((tokens + page_size) x that: the draft's pool at the target's tokens);
    ``mamba_intermediate_bytes``: the mamba states SGLang keeps per draft token per request under
    speculation on a hybrid model (``draft.intermediate_mamba``; 0 otherwise)."""

    page_size: int
    device_kv_per_token: int
    int2_hp_bytes: int
    req_to_token_bytes: int
    draft_kv_per_token: int = 0
    draft_kv_bytes: int = 0
    mamba_intermediate_bytes: int = 0


@dataclass(frozen=True)
class LaunchValues:
    """The launch values decided beyond the pools (``step_launch_values``): the mamba radix
    cache strategy to render (None: not rendered), peer access among the TP GPUs (NVML facts),
    and whether ``--disable-custom-all-reduce`` and ``NCCL_P2P_DISABLE=1`` are rendered."""

    mamba_strategy: str | None
    peers: PeerAccess
    custom_all_reduce_off: bool
    nccl_p2p_off: bool
    nccl_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanInputs:
    """What ``plan()`` was given, resolved once before the steps run (frozen: no step changes
    them): the profile and the host facts; ``arch`` the architecture planned (the model
    folder's config.json, else the profile's, with ``runtime.mamba_ssm_dtype`` applied);
    ``weights_bytes`` per rank and where that came from; ``capabilities`` the runtime's;
    ``ratio_override`` / ``size_override`` (``--ratio``, ``--hicache-size`` GB = 1e9 per rank);
    ``hicache_source`` where the profile's deciding HiCache key was set; ``model_dir`` the
    model folder's facts; ``release`` the SGLang release planned and ``release_source``;
    ``draft`` what the plan counts of a speculative-decoding draft (``draft.draft_count``);
    ``spec`` the speculative configuration SGLang resolves (``draft.spec_shape``); ``draft_host``
    how HiCache mirrors the draft's KV in host memory (``draft.draft_host``)."""

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
    draft: DraftCount = DraftCount()  # what of the speculative draft is counted (planner.draft)
    spec: SpecShape = SpecShape()  # the speculative configuration SGLang resolves (planner.draft)
    draft_host: DraftHost = DraftHost()  # how HiCache mirrors the draft's KV (planner.draft)
    workload: Workload | None = None  # --workload, else hicache.workload: what the host tier should bring back
    workload_source: str = ""


class StepOrderError(RuntimeError):
    """A step read a value that the step producing it has not set yet (``STEPS`` out of order)."""


class _Output(Generic[_T]):
    """One step's output on ``_Ctx``, typed as set: reading it before the step that sets it
    raises ``StepOrderError`` naming that step (the value lives in the instance's dict)."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _Output[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...

    def __get__(self, obj: object | None, owner: type) -> _Output[_T] | _T:
        if obj is None:
            return self
        if self.name not in obj.__dict__:
            raise StepOrderError(f"planner: {self.name} is read before the {self.step} step sets it")
        value: _T = obj.__dict__[self.name]
        return value

    def __set__(self, obj: object, value: _T) -> None:
        obj.__dict__[self.name] = value


@dataclass
class _Ctx:
    """The working context of one ``plan()`` call: its inputs (``inp``, frozen), the notes every
    step adds (``decisions``, ``warnings``, ``unsafe``) and each step's outputs. An output read
    before the step that sets it raises ``StepOrderError`` naming that step, so each output
    below is typed as set (its step, in brackets):

    - ``shapes`` [model_shapes]; ``dev`` (``pools.DevicePools``), ``sizing``
      (``DeviceSizing``) [device_pools]; ``device`` [device_budget];
    - ``budget``, ``view`` (the box as the host constraints read it: ceiling, modelled
      MemAvailable, each check's reserve, which check applies), ``a_guard_detail``,
      ``constraints`` [pinned_budget];
    - ``safe`` (``search.SafeRatios``) [safe_ratio];
      ``hicache``, ``hicache_off_reason`` [choose_hicache]; ``pools``, ``runtime_check``,
      ``short_now_bytes`` and the budget's headroom [host_pools]; ``findings`` [validate];
      ``verdict``, ``reasons`` [verdict]; ``launch`` (``LaunchValues``) [launch_values].
    """

    inp: PlanInputs
    decisions: list[Decision] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)  # reasons that make the verdict unsafe
    fixes: list[Fix] = field(default_factory=list)  # the change a reason or warning names, as data
    # filled by steps
    a_guard_detail: str = ""
    constraints: tuple[HostConstraint, ...] = ()  # the host constraints of this release
    safe: SafeRatios = SafeRatios(None, None, None)  # none searched with HiCache off
    hicache_off_reason: str | None = None
    runtime_check: RuntimeCheck | None = None
    findings: list[Finding] = field(default_factory=list)
    verdict: Verdict = "ok"
    short_now_bytes: int | None = None  # what the live host lacks now (MemAvailable), if anything
    l3_disk: L3Disk | None = None  # the file L3 store's disk [host_pools]; None without one
    mm_reservation: int = 0  # bytes per rank SGLang reserves for multimodal allocations [device_pools]
    workload_sized: bool = False  # host_mamba_slots auto sized the host mamba pool for the workload [host_mamba]
    workload_ratio: float | None = None  # the ratio whose host KV holds that workload [host_mamba]
    workload_fitted: Workload | None = None  # the workload's prefixes that fit the budget [host_mamba]
    shapes = _Output[RankShapes]("model_shapes")
    dev = _Output[DevicePools]("device_pools")
    sizing = _Output[DeviceSizing]("device_pools")
    device = _Output[DevicePlan]("device_budget")
    budget = _Output[Budget]("pinned_budget")
    view = _Output[HostView]("pinned_budget")
    hicache = _Output[HiCachePlan]("choose_hicache")
    pools = _Output[HostPools]("host_pools")
    launch = _Output[LaunchValues]("launch_values")

    @staticmethod
    def _need(value: _T | None, name: str, step: str) -> _T:
        if value is None:
            raise StepOrderError(f"planner: {name} is read before the {step} step sets it")
        return value

    @property
    def ranks(self) -> int:
        return self.inp.profile.runtime.tp_size

    def decide(self, step: str, rule: str, value: object, reason: str) -> None:
        self.decisions.append(Decision(step=step, rule=rule, value=value, reason=reason))

    def fix(self, problem: str, key: str, value: object) -> str:
        """Record that ``--set key=value`` answers ``problem`` (a reason or warning); returns it."""
        self.fixes.append(Fix(problem=problem, key=key, value=f"{value:g}" if isinstance(value, float) else str(value)))
        return problem


# --------------------------------------------------------------------------- steps


def step_model_shapes(c: _Ctx) -> None:
    c.shapes = rank_shapes(c.inp.arch, c.ranks)
    s = c.shapes
    c.decide("model_shapes", "layer typing", {"full_attention": s.full_layers, "linear": s.linear_layers},
             "layer l is full attention iff (l+1) % full_attention_interval == 0 (Qwen3NextConfig)"
             if c.inp.arch.is_hybrid else "every layer is full attention")
    c.decide("model_shapes", "kv heads per rank", s.kv_heads_per_rank,
             f"max(1, {c.inp.arch.num_key_value_heads} // tp {c.ranks}) (ModelConfig.get_num_kv_heads)")
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
    i2 = c.inp.profile.runtime.kv_cache.int2
    codes, sz = kvmod.int2_parts(c.shapes, i2.group_size, i2.scale_dtype)
    layers = c.shapes.full_layers
    return (("host KV codes buffer (K and V)", layers * 2 * codes),
            ("host K scales/zeros buffer", layers * sz), ("host V scales/zeros buffer", layers * sz))


def _draft_host_per_token(c: _Ctx, dtype: str, host_kv: int) -> tuple[int, int]:
    """``(packed, sidecar)``: the host KV bytes per token per rank a speculative draft adds with
    HiCache on (``draft.draft_host``), packed into the target's host pool (its layers at the
    target's width: ``pool_host/mha.py: get_size_per_token``, ``head_dim x head_num x (target +
    draft layers) x itemsize x 2``) or in a sidecar pool of the draft's own geometry at the
    target's itemsize; ``(0, 0)`` without one. INT2's host pool (the fork's) is not mirrored."""
    h, s = c.inp.draft_host, c.shapes
    if not h.mode:
        return 0, 0
    if dtype == "int2":
        return 0, 0
    per_layer = host_kv // max(s.full_layers, 1)
    itemsize = per_layer // max(2 * s.kv_heads_per_rank * s.head_dim, 1)
    if h.mode == "packed":
        packed = h.layers * per_layer
        c.decide("device_pools", "draft host KV per token (packed)", packed,
                 f"{h.layers} draft layer(s) x {per_layer} B beside the target's {s.full_layers} layers: "
                 f"{host_kv + packed} B per token ({h.source})")
        return packed, 0
    sidecar = h.layers * 2 * h.kv_heads * h.head_dim * itemsize
    c.decide("device_pools", "draft host KV per token (sidecar)", sidecar,
             f"{h.layers} layers x K,V x {h.kv_heads} heads x {h.head_dim} x {itemsize} B ({h.source})")
    return 0, sidecar


def step_device_pools(c: _Ctx) -> None:
    rt, s = c.inp.profile.runtime, c.shapes
    i2 = rt.kv_cache.int2
    dtype = normalize_kv_dtype(rt.kv_cache.dtype)
    int2_hp_bytes = req_to_token_bytes = 0
    page_size = rt.page_size or (4 * 2 if dtype == "int2" else 1)
    device_kv_per_token = kvmod.device_bytes_per_token(s, dtype, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
    host_per_token = kvmod.host_bytes_per_token(s, dtype, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
    # the draft's layers scale the cell SGLang sizes the target's tokens by (planner.draft)
    d = c.inp.draft
    cell = scaled_cell(device_kv_per_token, s.full_layers, d.layers,
                       load_release(c.inp.release).draft_kv_cell.rounding)
    draft_per_token = cell - device_kv_per_token
    if draft_per_token:
        c.decide("device_pools", "draft KV per token", draft_per_token,
                 f"{device_kv_per_token} B x (1 + {d.layers} draft layers / {s.full_layers} KV layers), rounded down "
                 f"as SGLang {c.inp.release} does = {cell} B "
                 f"less the target's {device_kv_per_token} B ({KV_SOURCE}; draft layers: {d.layers_source})")
    per_slot = s.mamba_bytes_per_slot
    tokens, slots = rt.max_total_tokens, rt.max_mamba_cache_size if c.inp.arch.is_hybrid else 0
    spec = c.inp.spec
    # speculation on a hybrid model: SGLang keeps a mamba state per draft token per request
    # (planner.draft.intermediate_mamba); ReplaySSM drops them (kv_cache_configurator.py)
    spec_d = (spec.num_draft_tokens if c.inp.arch.is_hybrid and per_slot
              and "--enable-linear-replayssm-spec" not in rt.extra_args else 0)
    ratio = mamba_slots_per_request(resolved_mamba_strategy(c.inp.profile, c.inp.arch)[0]
                                    or rt.mamba_radix_cache_strategy, rt.disable_radix_cache)
    intermediate = 0
    # SGLang sizes what the profile leaves unset from the static budget
    # (KVCacheConfigurator._handle_max_mamba_cache, DefaultPoolConfigurator.calculate_pool_sizes);
    # the draft's weights are loaded by then and come out of it too (planner.draft).
    rest = _static_budget(c) - c.inp.weights_bytes - d.weights_bytes
    # a multimodal model's embedding cache (and GPU feature-transport pools) come out before the
    # pools are sized (kv_cache_configurator.py: mm_runtime_reservation_gb); only a model folder says
    c.mm_reservation = _mm_reservation(c)
    if c.mm_reservation:
        rest -= c.mm_reservation
    if c.inp.arch.is_hybrid and slots is None and not per_slot:
        # no linear-attention layer (full_attention_interval 1): no state to size slots by;
        # SGLang asserts one above 0 bytes and stops (validate names the key)
        slots = 0
        c.decide("device_pools", "mamba slots (SGLang auto)", slots,
                 "no linear-attention layer: 0 B of mamba state per slot (KVCacheConfigurator._handle_max_mamba_cache "
                 "asserts it is above 0)")
    elif c.inp.arch.is_hybrid and slots is None:
        r = MAMBA_FULL_MEMORY_RATIO
        if rt.disable_radix_cache and spec.max_running_requests:
            slots = spec.max_running_requests
            c.decide("device_pools", "mamba slots (SGLang auto)", slots,
                     "max_running_requests with the radix cache off (KVCacheConfigurator._handle_max_mamba_cache)")
        elif spec_d:
            slots = max(mamba_slots_with_speculation(rest, per_slot, spec_d, ratio, r), 0)
            c.decide("device_pools", "mamba slots (SGLang auto)", slots,
                     f"int((rest x {r}/(1+{r}) - {per_slot} B x (1 + {spec_d})) // ({per_slot} B x (1 + {spec_d}/"
                     f"{ratio}))): the slots solved jointly with {spec_d} intermediate states per request "
                     "(KVCacheConfigurator._handle_max_mamba_cache)")
        else:
            slots = max(int((rest * r / (1 + r) - per_slot) // per_slot), 0)
            c.decide("device_pools", "mamba slots (SGLang auto)", slots,
                     f"rest x {r}/(1+{r}) // {per_slot} B per slot - 1 (KVCacheConfigurator._handle_max_mamba_cache)")
    if spec_d and slots:
        mrr_spec = spec.max_running_requests or 0
        reqs = slots if rt.disable_radix_cache and rt.max_mamba_cache_size is None else min(mrr_spec, slots // ratio)
        intermediate = intermediate_mamba(per_slot, reqs, spec_d)
        c.decide("device_pools", "intermediate mamba states per rank", intermediate,
                 f"{per_slot} B x ({reqs} requests + 1) x {spec_d} draft tokens ({spec.source}); requests: "
                 f"min(max_running_requests {mrr_spec} ({spec.mrr_source}), {slots} slots // {ratio} per request) "
                 f"({INTERMEDIATE_SOURCE})")
    if c.inp.arch.is_hybrid:
        rest -= ((slots or 0) + 1) * per_slot + intermediate
        if rest <= 0 and intermediate:
            c.unsafe.append(
                f"device: SGLang takes the mamba pool ({slots} slots + 1) x {per_slot:,} B = "
                f"{((slots or 0) + 1) * per_slot:,} B"
                + f" and {intermediate:,} B of intermediate states ({spec_d} draft tokens per request)"
                + f" from the {rest + ((slots or 0) + 1) * per_slot + intermediate:,} B the weights leave of the "
                f"static budget: nothing is left for the KV cache, and it stops with \"Loaded weights leave no GPU "
                f"memory for the KV cache\" (kv_cache_configurator.py: _profile_available_bytes); lower "
                "runtime.max_mamba_cache_size, runtime.max_running_requests or the draft tokens "
                "(runtime.speculative), or raise runtime.mem_fraction_static")
    if tokens is None or (c.inp.arch.is_hybrid and rt.max_mamba_cache_size is None):
        if tokens is None:
            tokens = max(rest, 0) // cell // page_size * page_size
            c.decide("device_pools", "device KV tokens (SGLang auto)", tokens,
                     f"rest {fmt_gb(max(rest, 0))} // {cell} B per token"
                     + (" (target + draft)" if draft_per_token else "") + ", floored to the page")
    else:
        c.decide("device_pools", "device KV tokens", tokens, "runtime.max_total_tokens")
        if slots:
            c.decide("device_pools", "device mamba slots", slots, "runtime.max_mamba_cache_size")
    if rt.max_total_tokens is not None and cell > 0:  # a 0 B cell (no KV layer) has nothing to cap
        tokens = _cap_fixed_tokens(c, tokens, max(rest, 0) // cell // page_size * page_size, cell,
                                   drafted=bool(d.weights_bytes or draft_per_token))
    if rt.min_total_tokens is not None and tokens < rt.min_total_tokens:
        how = (f"caps runtime.max_total_tokens {rt.max_total_tokens:,} at" if rt.max_total_tokens is not None
               and tokens < rt.max_total_tokens else "sizes it at")
        c.unsafe.append(
            f"runtime.min_total_tokens: SGLang {how} {tokens:,} tokens, what the static budget holds beside the "
            f"weights{', the draft' if d.weights_bytes or draft_per_token else ''}"
            f"{' and the mamba pool' if c.inp.arch.is_hybrid else ''} "
            f"(kv_cache_configurator.py: _apply_token_constraints), below the {rt.min_total_tokens:,} this profile "
            "needs; lower what shares the budget or raise runtime.mem_fraction_static")
    host_kv = host_per_token or device_kv_per_token
    packed, sidecar = _draft_host_per_token(c, dtype, host_kv)
    dev = DevicePools(
        kv_tokens=tokens, kv_bytes=(tokens + page_size) * device_kv_per_token, kv_page_size=page_size,
        mamba_slots=slots or 0, mamba_bytes=((slots or 0) + 1) * per_slot if slots else 0,
        mamba_bytes_per_slot=per_slot, host_kv_bytes_per_token=host_kv + packed, draft_host_bytes_per_token=sidecar,
        host_kv_buffers_per_token=_host_kv_buffers_per_token(c, dtype),
        mamba_layers=s.linear_layers if per_slot else 0,
        mamba_conv_bytes_per_layer=s.mamba_conv_bytes_per_layer,
        mamba_temporal_bytes_per_layer=s.mamba_temporal_bytes_per_layer,
        draft_host_capacity=load_release(c.inp.release).draft_host_pool.capacity,
    )
    if rt.max_running_requests:
        mrr = rt.max_running_requests
    elif spec.max_running_requests:  # SGLang's 48 under speculation, capped as resolve_max_num_reqs caps it
        mrr = min(spec.max_running_requests, max((slots or 0) // ratio, 1) if c.inp.arch.is_hybrid
                  else max(tokens // 2, 1))
    else:
        mrr = max((slots or 0) // MAMBA_SLOTS_PER_REQUEST, 1)
    # the mixed HP+INT2 window's arena exists only where the fork builds it: the variable set and no
    # speculative decoding (OSCAR-derived model_executor/pool_configurator.py: _compute_cell_size);
    # on a hybrid model validate refuses the key (the fork never builds it there)
    if dtype == "int2" and i2.mixed_windows and rt.speculative is None:
        int2_hp_bytes = kvmod.int2_hp_arena_bytes(
            s, prefix_tokens=i2.prefix_tokens, recent_tokens=i2.recent_tokens, page_size=page_size,
            max_running_requests=mrr, hp_dtype=i2.hp_dtype)
        c.decide("device_pools", "INT2 high-precision arena", int2_hp_bytes,
                 f"({i2.prefix_tokens} sink + {mrr} requests x ({i2.recent_tokens} + {page_size} - 1)) "
                 f"slots x {s.full_layers} layers x K,V x {s.kv_heads_per_rank} heads x {s.head_dim} x {i2.hp_dtype}")
    if rt.context_length:
        # ReqToTokenPool: (max_running_requests + 1) x context_len x int32 (memory_pool.py)
        req_to_token_bytes = (mrr + 1) * rt.context_length * 4
    c.dev = dev
    c.sizing = DeviceSizing(page_size=page_size, device_kv_per_token=device_kv_per_token,
                            int2_hp_bytes=int2_hp_bytes, req_to_token_bytes=req_to_token_bytes,
                            draft_kv_per_token=draft_per_token, draft_kv_bytes=(tokens + page_size) * draft_per_token,
                            mamba_intermediate_bytes=intermediate)


def _cap_fixed_tokens(c: _Ctx, tokens: int, profiled: int, cell: int, drafted: bool) -> int:
    """The device KV tokens SGLang uses for a fixed ``runtime.max_total_tokens``: the smaller of it
    and what the budget holds once the weights, the draft and the mamba pool are out of it
    (``profiled``, the figure SGLang's configurator sizes when the key is unset), with SGLang's
    warning as the plan's (``mem_cache/kv_cache_configurator.py: _apply_token_constraints``:
    "max_total_tokens=N is larger than the profiled value M. Use the profiled value instead.").
    A budget that holds no token stays as it was: SGLang stops there ("Not enough memory",
    ``model_executor/pool_configurator.py``) and the device budget refuses it."""
    if tokens <= profiled or profiled <= 0:
        return tokens
    rt = c.inp.profile.runtime
    parts = ["the weights", *(["the draft"] if drafted else []), *(["the mamba pool"] if c.inp.arch.is_hybrid else [])]
    sharers = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    c.decide("device_pools", "device KV tokens (capped as SGLang caps them)", profiled,
             f"runtime.max_total_tokens {tokens:,} is larger than the {profiled:,} tokens of {cell:,} B that the "
             f"static budget holds beside {sharers}: SGLang uses the profiled value "
             "(kv_cache_configurator.py: _apply_token_constraints)")
    ctx = rt.context_length
    lower = ", ".join(x for x in ("the draft" if drafted else "",
                                  "runtime.max_mamba_cache_size" if c.inp.arch.is_hybrid else "") if x)
    c.warnings.append(
        f"runtime.max_total_tokens: {tokens:,} tokens do not fit the device budget beside {sharers}; "
        f"SGLang caps the pool at the profiled {profiled:,} tokens and warns "
        "\"max_total_tokens=... is larger than the profiled value\" (kv_cache_configurator.py: "
        f"_apply_token_constraints), so the plan and the argv use {profiled:,}"
        + (f"; a request longer than {profiled - 1:,} tokens is refused (runtime.context_length {ctx:,}; "
           "managers/tp_worker.py: max_req_len)" if ctx and ctx >= profiled else "")
        + "; to keep the size, " + (f"lower what shares the budget ({lower}) or " if lower else "")
        + "raise runtime.mem_fraction_static")
    return profiled


def _free_before_weights(c: _Ctx) -> tuple[int, int, int, int]:
    hw, sf = c.inp.profile.hardware, c.inp.profile.safety
    hidden = sf.wsl2_hidden_vram_per_gpu if c.inp.host.platform == "wsl2" else 0
    free = hw.gpu_vram - hidden - sf.cuda_context_per_gpu
    return hw.gpu_vram, hidden, sf.cuda_context_per_gpu, free


def _mem_fraction(c: _Ctx) -> tuple[float, str, float]:
    rt = c.inp.profile.runtime
    default = sglang_default_mem_fraction(
        c.inp.profile.hardware.gpu_vram, c.ranks, chunked_prefill=rt.chunked_prefill_size,
        decode_max_bs=rt.cuda_graph_max_bs, prefill_graphs=not rt.disable_prefill_cuda_graph,
        release=c.inp.release, max_running_requests=rt.max_running_requests)
    if rt.mem_fraction_static is not None:
        return rt.mem_fraction_static, "runtime.mem_fraction_static", default
    drop = c.inp.profile.safety.wsl2_mem_fraction_drop
    cc = c.inp.profile.hardware.compute_capability or ""
    if c.inp.host.platform == "wsl2" and cc.startswith("12.") and drop > 0:
        return (round(default - drop, 3),
                f"SGLang's default for this card ({default}) minus safety.wsl2_mem_fraction_drop {drop:g}: under WSL2 "
                f"on sm_{cc.replace('.', '')} the device overhead is larger (microsoft/WSL#40401, #41176)", default)
    return default, "SGLang's default for this card (memory_hook.py: handle_gpu_memory_settings)", default


def _static_budget(c: _Ctx) -> int:
    _, _, _, free = _free_before_weights(c)
    mfs, _, _ = _mem_fraction(c)
    return int(free * mfs)


def _mm_reservation(c: _Ctx) -> int:
    """Bytes per rank SGLang reserves for multimodal allocations out of the KV budget
    (``sglang.multimodal.reservation``), from the model folder's config.json; 0 without a folder
    (the profile's architecture names no ``architectures``) or for a text-only model."""
    md = c.inp.model_dir
    if md is None or not md.architectures:
        return 0
    from ..sglang.multimodal import reservation

    r = reservation(md.architectures, text_subconfig=md.text_subconfig, vision_or_audio=bool(md.media_configs),
                    both_vision_and_audio=len(md.media_configs) == 2, language_model_only=md.language_model_only,
                    extra_args=list(c.inp.profile.runtime.extra_args or []), release=c.inp.release)
    if r.bytes:
        c.decide("device_pools", "multimodal reservation per rank", r.bytes, f"{r.why} ({r.source})")
    return r.bytes


#: The capability of patch 0004 (runtime_patches/0004-hicache-host-mamba-slots.patch).
HOST_MAMBA_CAPABILITY = "hicache-host-mamba-slots"


def planned_chunk(c: _Ctx) -> int:
    """Chunked prefill (tokens) the server runs with: ``runtime.chunked_prefill_size``, else the
    release's default for this card (``device.tier_defaults``, SGLang's
    ``handle_gpu_memory_settings``)."""
    from .device import tier_defaults

    rt = c.inp.profile.runtime
    if rt.chunked_prefill_size is not None and rt.chunked_prefill_size <= 0:
        return 1 << 40  # -1: chunked prefill off, one chunk per prompt (SGLang's server_args)
    if rt.chunked_prefill_size:
        return int(rt.chunked_prefill_size)
    return tier_defaults(c.inp.profile.hardware.gpu_vram // MiB, c.ranks, c.inp.release)[0]


def step_host_mamba(c: _Ctx) -> None:
    """The host mamba pool's state count under patch 0004 (``hicache.host_mamba_slots``): an
    explicit count, or ``auto``: the states ``hicache.workload``'s two passes take
    (``reach.needs``), for as many of its prefixes as fit the pinned budget with the host KV
    they need (``workload_fit``); set on ``c.dev`` (and the host view) so every host pool,
    constraint and search after this step sees it. Nothing for a dense model, HiCache off or
    the key unset. Raises ``BadInput`` (one line naming the key) for a count on a runtime
    without the capability."""
    hc = c.inp.profile.hicache
    want = hc.host_mamba_slots
    if want is None or not hc.enabled or not c.dev.mamba_slots:
        return
    if HOST_MAMBA_CAPABILITY not in c.inp.capabilities:
        if want == "auto":
            said = (f"the runtime lacks {HOST_MAMBA_CAPABILITY} (patch 0004), so SGLang's device slots x ratio "
                    "sizes the host mamba pool")
            w = c.inp.workload
            if w is not None and (hc.hicache_size or workload_fit(c, w, c.dev) is not None):
                # the host tier's rows say it (planner/reach.py: the planned stock split beside
                # patch 0004's, "which this runtime lacks"): a decision, not a second warning
                c.decide("host_mamba", "host mamba slots", "device slots x ratio", f"auto: {said}")
            else:
                c.warnings.append(f"hicache.host_mamba_slots auto: {said}")
            return
        raise BadInput(f"hicache.host_mamba_slots {want}: the runtime lacks the capability {HOST_MAMBA_CAPABILITY} "
                       "(patch 0004 of escha-deploy's series, which reads ESCHA_HICACHE_HOST_MAMBA_SLOTS); "
                       "build the runtime with the series or remove the key")
    if want == "auto":
        w = c.inp.workload
        if w is None:
            c.warnings.append("hicache.host_mamba_slots auto: no workload (hicache.workload or --workload "
                              "COUNTxTOKENS), so SGLang's device slots x ratio sizes the host mamba pool")
            return
        chunk = planned_chunk(c)
        fit = workload_fit(c, w, c.dev)
        if fit is None:
            c.warnings.append(f"hicache.host_mamba_slots auto: not even 1 of {w.label()} fits the pinned budget "
                              "with its host KV and mamba states; SGLang's device slots x ratio sizes the host pools")
            return
        wn, slots, ratio = fit
        c.workload_ratio, c.workload_fitted = ratio, wn
        why = (f"auto: {wn.label()} asked twice at chunked prefill {chunk:,} leaves {slots:,} mamba states "
               f"(one per prefill chunk, planner/reach.py) ({c.inp.workload_source})")
        if wn.prefixes < w.prefixes:
            why += f"; {wn.prefixes} of the workload's {w.prefixes} prefixes fit the pinned budget"
            c.warnings.append(f"hicache.workload {w.label()}: {wn.prefixes} of its {w.prefixes} prefixes fit the pinned "
                              f"budget with their host KV and mamba states ({slots:,} states); the host tier is "
                              "sized for those")
    else:
        slots, why = int(want), "hicache.host_mamba_slots (the profile)"
    c.dev = replace(c.dev, host_mamba_slots=slots)
    c.view = replace(c.view, dev=c.dev)
    c.workload_sized = want == "auto"
    c.decide("host_mamba", "host mamba states (ESCHA_HICACHE_HOST_MAMBA_SLOTS)", slots, why)


def workload_fit(c: _Ctx, w: Workload, dev: DevicePools) -> tuple[Workload, int, float] | None:
    """The most of ``w``'s prefixes (``n <= w.prefixes``) whose two passes fit the pinned budget
    under patch 0004, with ``safety.recommend_headroom`` left: ``(workload of n, host mamba
    states, ratio)``, the ratio ``workload_ratio``'s (at least ``hicache.min_ratio``); None when
    not even one prefix fits. Bisects n (the pinned bytes grow with it)."""
    import bisect

    chunk, rec = planned_chunk(c), c.inp.profile.safety.recommend_headroom

    def at(n: int) -> tuple[Workload, int, float, bool]:
        wn = replace(w, prefixes=n)
        slots = reach_needs(wn, chunk)[2]
        d = replace(dev, host_mamba_slots=slots)
        ratio = workload_ratio(c, wn, d)
        if ratio is None:
            return wn, slots, 0.0, False
        pools = host_pools_at_ratio(d, ratio)
        v = replace(c.view, dev=d)
        ok = first_breach(v, pools, c.constraints) is None and headroom(v, pools, c.constraints) >= rec
        return wn, slots, ratio, ok

    ns = range(1, w.prefixes + 1)
    first_bad = bisect.bisect_left(ns, True, key=lambda n: not at(n)[3])
    if first_bad == 0:
        return None
    wn, slots, ratio, _ = at(ns[first_bad - 1])
    return wn, slots, ratio


def workload_ratio(c: _Ctx, w: Workload, dev: DevicePools) -> float | None:
    """The smallest ratio on the ``safety.ratio_step`` grid, at least ``hicache.min_ratio``, whose
    host KV pool holds both passes of ``w`` (``reach.needs``' KV tokens plus the padding page):
    what ``hicache_ratio: auto`` picks when patch 0004 sized the mamba pool for the workload,
    leaving the rest of the pinned budget unpinned. None when no ratio up to the search's bound
    (``search.MAX_RATIO_SEARCH``) holds them (an empty device pool, say)."""
    from .search import MAX_RATIO_SEARCH

    step = c.inp.profile.safety.ratio_step
    kv_needed = reach_needs(w, planned_chunk(c))[3] + dev.kv_page_size
    if dev.kv_tokens <= 0 or kv_needed / dev.kv_tokens > MAX_RATIO_SEARCH:
        return None
    k = max(1, int(kv_needed / dev.kv_tokens / step))
    for _ in range(4):  # int() and the page floor leave it at most a step or two short
        if host_pools_at_ratio(dev, round(k * step, 6)).kv_tokens >= kv_needed:
            return max(round(k * step, 6), c.inp.profile.hicache.min_ratio)
        k += 1
    return None


def step_device_budget(c: _Ctx) -> None:
    rt = c.inp.profile.runtime
    vram, hidden, ctx, free = _free_before_weights(c)
    mfs, mfs_source, default = _mem_fraction(c)
    static = int(free * mfs)
    drop = c.inp.profile.safety.wsl2_mem_fraction_drop
    cc = c.inp.profile.hardware.compute_capability or ""
    # _mem_fraction lowers only SGLang's default; a fraction the profile sets is taken as is
    wsl2_target = (round(default - drop, 3) if rt.mem_fraction_static is not None and c.inp.host.platform == "wsl2"
                   and cc.startswith("12.") and drop > 0 and mfs > round(default - drop, 3) else None)
    # SGLang sizes the KV and mamba pools from what the weights leave of the static budget
    # (kv_cache_configurator.py: _profile_available_bytes); the request-to-token table is
    # allocated beside them, out of the room the fraction leaves (memory_pool.py: ReqToTokenPool).
    draft_weights, draft_kv = c.inp.draft.weights_bytes, c.sizing.draft_kv_bytes
    need = (c.inp.weights_bytes + c.dev.kv_bytes + c.dev.mamba_bytes + c.sizing.int2_hp_bytes
            + draft_weights + draft_kv + c.sizing.mamba_intermediate_bytes + c.mm_reservation)
    reserved = int(sglang_reserved_mib(vram // MiB, c.ranks, chunked_prefill=rt.chunked_prefill_size,
                                       decode_max_bs=rt.cuda_graph_max_bs,
                                       prefill_graphs=not rt.disable_prefill_cuda_graph, release=c.inp.release,
                                       max_running_requests=rt.max_running_requests) * MiB)
    room = free - static - c.sizing.req_to_token_bytes
    # SGLang fits tokens x bytes-per-token into the budget and allocates one padding page on top
    # (memory_pool.py: buffers of tokens + page_size rows), so the page is not budgeted
    budgeted = need - c.sizing.page_size * (c.sizing.device_kv_per_token + c.sizing.draft_kv_per_token)
    c.device = DevicePlan(
        vram_bytes=vram, hidden_bytes=hidden, cuda_context_bytes=ctx, free_before_weights_bytes=free,
        compute_capability=c.inp.profile.hardware.compute_capability,
        mem_fraction_static=mfs, mem_fraction_static_source=mfs_source,
        sglang_default_mem_fraction_static=default, sglang_reserved_bytes=reserved,
        static_budget_bytes=static, static_need_bytes=need, activation_room_bytes=room, fits=budgeted <= static,
        mm_reservation_bytes=c.mm_reservation,
    )
    # one unit (GiB) for every term and the result; the WSL2 term only where WSL2 hides memory
    wsl2_term = f" - {fmt_gib(hidden)} hidden by WSL2" if c.inp.host.platform == "wsl2" else ""
    c.decide("device_budget", "static budget", static,
             f"({fmt_gib(vram)} VRAM{wsl2_term} - {fmt_gib(ctx)} CUDA context) x "
             f"mem_fraction_static {mfs} ({mfs_source}) = {fmt_gib_gb(static)}")
    c.decide("device_budget", "weights per rank", c.inp.weights_bytes, c.inp.weights_source)
    if draft_weights:
        c.decide("device_budget", "draft weights per rank", draft_weights, c.inp.draft.weights_source)
    if draft_kv:
        c.decide("device_budget", "draft KV pool per rank", draft_kv,
                 f"({c.dev.kv_tokens:,} tokens + {c.sizing.page_size}) x {c.sizing.draft_kv_per_token} B: the draft "
                 "worker reuses the target's token count (kv_cache_configurator.py: KVCacheConfigurator.configure)")
    drafted = (f" + draft weights {fmt_gb(draft_weights)} + draft KV {fmt_gb(draft_kv)}"
               if draft_weights or draft_kv else "")
    if c.sizing.mamba_intermediate_bytes:
        drafted += f" + intermediate mamba states {fmt_gb(c.sizing.mamba_intermediate_bytes)}"
    if c.mm_reservation:
        drafted += f" + multimodal reservation {fmt_gb(c.mm_reservation)}"
    floor = int(sglang_min_reserved_mib(c.ranks) * MiB)
    # the fraction's bounds for these pools, on SGLang's 0.001 grid: the lowest whose static budget
    # holds them as planned, the highest that leaves SGLang's floor, and the highest that leaves
    # its own estimate of activations and CUDA graphs (memory_hook.py: handle_gpu_memory_settings)
    lowest = math.ceil(budgeted / max(free, 1) * 1000) / 1000
    below_floor = math.floor((free - c.sizing.req_to_token_bytes - floor) / max(free, 1) * 1000) / 1000
    below_estimate = math.floor((free - c.sizing.req_to_token_bytes - reserved) / max(free, 1) * 1000) / 1000
    if not c.device.fits:
        raise_to = (f"raise runtime.mem_fraction_static to {lowest:g}" if lowest <= below_floor else
                    f"runtime.mem_fraction_static cannot hold them: {lowest:g} would leave less than SGLang's "
                    f"{fmt_gb(floor)} floor (memory_hook.py: handle_gpu_memory_settings)")
        text = (f"device: weights {fmt_gb(c.inp.weights_bytes)} + KV pool {fmt_gb(c.dev.kv_bytes)} + mamba pool "
                f"{fmt_gb(c.dev.mamba_bytes)} + other {fmt_gb(c.sizing.int2_hp_bytes)}{drafted} = "
                f"{fmt_gb(need)} per rank exceed the static budget {fmt_gb(static)}: lower "
                f"runtime.max_total_tokens or max_mamba_cache_size, or {raise_to}"
                + (" (SGLang counts the draft's weights too: kv_cache_configurator.py: "
                   "KVCacheConfigurator._profile_available_bytes)" if draft_weights or draft_kv else ""))
        c.unsafe.append(c.fix(text, "runtime.mem_fraction_static", lowest) if lowest <= below_floor else text)
    keep = (f"the weights and device pools as planned ({fmt_gb(budgeted)}) need at least {lowest:g} of the "
            f"{fmt_gb(free)} free before the weights")
    if room < floor:
        c.unsafe.append(
            f"device: mem_fraction_static {mfs} leaves {fmt_gb(room)} per GPU for activations, CUDA graphs "
            f"and NCCL, below the {fmt_gb(floor)} SGLang keeps even when it sizes the pool after graph "
            "capture (memory_hook.py: handle_gpu_memory_settings): the first long prefill would run out of "
            f"memory; lower runtime.mem_fraction_static (SGLang's default here is {default})")
    short = (f"it leaves {fmt_gb(room)} per GPU for activations and CUDA graphs, under SGLang's own estimate "
             f"{fmt_gb(reserved)} (its default fraction would be {default}) but above its {fmt_gb(floor)} floor, so "
             "not refused (docs/planner.md, \"Device headroom\")") if floor <= room < reserved else ""
    if wsl2_target is not None:
        # one line for the fraction: the WSL2 target and, where it applies, the headroom
        head = (f"runtime.mem_fraction_static {mfs:g} is above the {wsl2_target:g} this plan would use under WSL2 "
                f"(SGLang's default {default:g} minus safety.wsl2_mem_fraction_drop {drop:g}): the Windows side keeps "
                "a hidden share of each GPU, and allocations past it fail as 'CUDA driver error: device not ready' "
                "(microsoft/WSL#41176: 0.88 failed, 0.80 worked)" + (f"; {short}" if short else ""))
        if lowest <= wsl2_target:
            c.warnings.append(c.fix(f"{head}; lower it to {wsl2_target:g} ({keep})",
                                    "runtime.mem_fraction_static", wsl2_target))
        else:
            c.warnings.append(f"{head}; it cannot go down to {wsl2_target:g} as this profile stands: {keep}; "
                              "smaller device pools (runtime.max_total_tokens, runtime.max_mamba_cache_size) "
                              "or smaller weights would let it")
    elif short:
        if lowest <= below_estimate:
            c.warnings.append(c.fix(f"device: mem_fraction_static {mfs}: {short}; lower runtime.mem_fraction_static to "
                                    f"{below_estimate:g} to leave it ({keep})",
                                    "runtime.mem_fraction_static", below_estimate))
        else:
            c.warnings.append(f"device: mem_fraction_static {mfs}: {short}; lowering it cannot leave SGLang's estimate "
                              f"as this profile stands: {keep}, which leaves at most "
                              f"{fmt_gb(free - c.sizing.req_to_token_bytes - int(free * lowest))}; smaller device "
                              "pools (runtime.max_total_tokens, runtime.max_mamba_cache_size) would")



def step_pinned_budget(c: _Ctx) -> None:
    h, sf = c.inp.host, c.inp.profile.safety
    base, base_src, base_kind = h.memory_base()
    procs = c.ranks * sf.server_process_per_rank
    store = l3_host_bytes(c.inp.profile)  # an L3 store's host memory on this box (Mooncake's segment)
    reserves = procs + sf.os_reserve + sf.page_cache_floor + store
    budget = max(base - reserves, 0)
    store_term = f" - {fmt_gib(store)} Mooncake global segment" if store else ""
    ceiling = h.pinned_ceiling_bytes if h.pinned_ceiling_reached else None
    share = budget // max(c.ranks, 1)
    binding: Literal["ram", "cgroup", "ceiling"] = "ceiling" if ceiling is not None and ceiling < share else base_kind
    if binding == "ceiling" and ceiling is not None:
        detail = (f"the {fmt_gb(ceiling)} pinned ceiling per rank `escha-deploy doctor` measured, below the "
                  f"pinned budget's {fmt_gb(share)} per rank")
    else:
        # the formula's terms are GiB, so is its result; the GB figure follows for SGLang's flags
        detail = (f"the pinned budget {base_src} - {c.ranks} x {fmt_gib(sf.server_process_per_rank)} "
                  f"server processes - {fmt_gib(sf.os_reserve)} OS - {fmt_gib(sf.page_cache_floor)} page-cache floor"
                  f"{store_term} = {fmt_gib_gb(budget)}")
    c.budget = Budget(
        memory_base_bytes=base, memory_base_source=base_src, memory_base_kind=base_kind, hugetlb_bytes=h.hugetlb_bytes,
        server_processes_bytes=procs, os_reserve_bytes=sf.os_reserve, page_cache_floor_bytes=sf.page_cache_floor,
        pinned_budget_bytes=budget, pinned_ceiling_bytes=ceiling, available_now_bytes=h.available_now_bytes,
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
    a_runtime = max(base - sf.os_reserve - procs, 0)
    a_guard, c.a_guard_detail = guard_available(
        c.inp.release, a_runtime, mem_total=h.mem_total_bytes, hugetlb=h.hugetlb_bytes,
        cgroup_limit=h.cgroup_limit_bytes, os_reserve=sf.os_reserve, server_processes=procs,
        weights_read=(c.inp.weights_bytes + c.inp.draft.weights_bytes) * c.ranks)
    stock_reserve = load_release(c.inp.release).host_guard.reserve_bytes
    patched_reserve = max(a_runtime - budget, 0)
    runtime_applies: Literal["stock", "patched"] = "patched" if "hicache-host-reserve-env" in c.inp.capabilities else "stock"
    c.decide("pinned_budget", "reserve for the patched runtime", patched_reserve,
             f"ESCHA_HICACHE_HOST_RESERVE_BYTES = modelled MemAvailable {fmt_gib(a_runtime)} - pinned budget "
             f"{fmt_gib(budget)} = {fmt_gib_gb(patched_reserve)}, so the runtime's own check agrees with this budget")
    c.view = HostView(
        ranks=c.ranks, platform=h.platform, budget=c.budget, ceiling=ceiling, allocator=_planned_allocator(c),
        allocator_why=("doctor's store probe picked pinned" if h.host_allocator == "pinned"
                       else "WSL2: cudaHostRegister'ed memory is not device-mappable, sglang#40232"),
        runtime_applies=runtime_applies, a_guard=a_guard, a_runtime=a_runtime,
        stock_reserve=stock_reserve, patched_reserve=patched_reserve, dev=c.dev)
    c.constraints = host_constraints(load_release(c.inp.release).host_guard.kind)
    if ceiling is not None:
        c.decide("pinned_budget", "pinned ceiling per rank", ceiling, "measured by `escha-deploy doctor`")
    elif h.platform == "wsl2" and c.inp.profile.hicache.enabled:
        c.warnings.append(
            "WSL2 limits pinned memory and the ceiling on this box is unmeasured (reports range from about "
            "0.5 GB to several GB): run `escha-deploy doctor` there to measure it (with the plan's --profile, "
            "its ladder aims at the planned pools)")


def _first_failure(c: _Ctx, pools: HostPools) -> str | None:
    """The first host constraint these pools break, named with its number and source; None if none."""
    b = first_breach(c.view, pools, c.constraints)
    return None if b is None else b.message


def _planned_allocator(c: _Ctx) -> str | None:
    """The host allocator the launch will set (``ESCHA_HICACHE_HOST_ALLOCATOR``), or None when
    the runtime lacks hicache-host-allocator: doctor's store probe, else ``pinned`` on WSL2
    (sglang#40232) and ``auto`` elsewhere."""
    if "hicache-host-allocator" not in c.inp.capabilities:
        return None
    return c.inp.host.host_allocator or ("pinned" if c.inp.host.platform == "wsl2" else "auto")


def _counting_allocator(c: _Ctx) -> tuple[str, str]:
    """The allocator that will pin the host pools, ``pinned`` or ``register``, and why: the
    launch's ``ESCHA_HICACHE_HOST_ALLOCATOR`` (``_planned_allocator``), ``auto`` resolved as the
    hook resolves it (pinned where registered memory is not device-mappable: WSL2), or
    stock SGLang's mmap + cudaHostRegister (the planned release's) without hicache-host-allocator."""
    planned = _planned_allocator(c)
    if planned is None:
        return "register", f"stock SGLang {c.inp.release} (pool_host/common.py: alloc_with_host_register)"
    if planned == "auto":
        return ("pinned", "auto on WSL2") if c.inp.host.platform == "wsl2" else (
            "register", "auto: registered memory is device-mappable off WSL2")
    why = "doctor's store probe" if c.inp.host.host_allocator else "WSL2 (sglang#40232)"
    return planned, f"ESCHA_HICACHE_HOST_ALLOCATOR={planned}: {why}"


def _platform_advice(c: _Ctx) -> str:
    """How to lift the constraint that binds on this platform ('' off WSL2 or when a cgroup binds)."""
    return binding_constraint(c.view).advice(c.view)


def _series_missing(c: _Ctx) -> bool:
    """Whether the profile needs our patch series on a release it does not exist for
    (``releases.series_releases``): needs no runtime of that release can meet, which
    ``releases.release_findings`` refuses (the plan is unsafe). The plan's runtime-check table
    and its warnings then describe that release's stock runtime, the one that can run there;
    a runtime that says it has the series (an image's description) is taken at its word."""
    return c.inp.release not in series_releases() and bool(set(c.inp.profile.runtime.needs) & set(SERIES_CAPABILITIES))


def _no_series(c: _Ctx) -> str:
    """Why the patched check is not the planned release's: the series does not exist for it."""
    return f"our patch series exists for SGLang {', '.join(series_releases())}; there is none for {c.inp.release}"


def step_runtime_checks(c: _Ctx) -> None:
    """Only records the rule; the checks run on the chosen pools in ``host_pools``."""
    c.decide("runtime_checks", "runtime check that applies", c.view.runtime_applies,
             "the runtime has hicache-host-reserve-env" if c.view.runtime_applies == "patched"
             else f"stock {c.inp.release} (no hicache-host-reserve-env capability): {c.a_guard_detail}")


def step_safe_ratio(c: _Ctx) -> None:
    """The largest safe ratio and size and the recommended ratio (``search.search_safe`` over
    this box's host constraints)."""
    hc = c.inp.profile.hicache
    if not hc.enabled:
        return
    sf = c.inp.profile.safety
    found = search_safe(c.view, c.constraints, max_ratio=hc.max_ratio, ratio_step=sf.ratio_step,
                        recommend_headroom=sf.recommend_headroom, by_size=bool(hc.hicache_size or c.inp.size_override))
    c.safe = found
    if c.safe.max_safe_ratio is not None:
        kept = bounds(c.view, c.constraints)
        c.decide("safe_ratio", "largest safe ratio", c.safe.max_safe_ratio,
                 f"largest on a 1/{SAFE_RATIO_GRID} grid within " + ", ".join(kept[:-1]) + f" and {kept[-1]}")
    best = c.safe.recommended_ratio
    if best is not None:
        at_best = host_pools_at_ratio(c.dev, best)
        c.decide("safe_ratio", "recommended ratio", best,
                 f"largest on a {sf.ratio_step} grid leaving >= {fmt_mib(sf.recommend_headroom)} headroom under "
                 f"{c.budget.binding_detail}: pins {fmt_gb(c.ranks * at_best.pinned_bytes)}, "
                 f"{fmt_mib(headroom(c.view, at_best, c.constraints))} left (capped at hicache.max_ratio {hc.max_ratio})")


def step_choose_hicache(c: _Ctx) -> None:
    hc = c.inp.profile.hicache
    if not hc.enabled:
        c.hicache = HiCachePlan(enabled=False, ratio=None, size_gb=None, requested="disabled in the profile"
                                + (f" ({c.inp.hicache_source})" if c.inp.hicache_source else ""))
        return
    size = c.inp.size_override if c.inp.size_override is not None else (hc.hicache_size or None)
    ratio_req = c.inp.ratio_override if c.inp.ratio_override is not None else hc.hicache_ratio
    # the label names where the value came from: the option, else the profile's (file:line or
    # --set, as the caller knows it); a profile size wins over --ratio, so it keeps the profile's
    if c.inp.size_override is not None:
        requested = f"hicache_size {size} GB per rank (--hicache-size)"
    elif size:
        requested = f"hicache_size {size} GB per rank" + (f" ({c.inp.hicache_source})" if c.inp.hicache_source else "")
    elif c.inp.ratio_override is not None:
        requested = f"hicache_ratio {ratio_req} (--ratio)"
    else:
        requested = f"hicache_ratio {ratio_req}" + (f" ({c.inp.hicache_source})" if c.inp.hicache_source else "")
    allocator = None
    if c.inp.host.platform == "wsl2":
        if "hicache-host-allocator" in c.inp.capabilities:
            allocator = _planned_allocator(c)
            c.decide("choose_hicache", "host allocator", allocator,
                     "WSL2: a kernel cannot store to cudaHostRegister'ed memory (sglang#40232); "
                     "cudaHostAlloc (pinned) memory is device-mappable"
                     + (" (doctor's store probe)" if c.inp.host.host_allocator else ""))
        else:
            c.hicache_off_reason = (
                "WSL2: the runtime registers host pools with cudaHostRegister, which a kernel cannot store "
                "to there (illegal memory access, sglang#40232); it needs hicache-host-allocator")
    else:
        if "hicache-host-allocator" in c.inp.capabilities:
            allocator = _planned_allocator(c)
            c.decide("choose_hicache", "host allocator", allocator,
                     "doctor's store probe" if c.inp.host.host_allocator else
                     "auto: the patch picks cudaHostAlloc where registered memory is not device-mappable")
    ratio: float | None = None
    if size:
        c.decide("choose_hicache", "hicache_size", size, requested)
    elif ratio_req == "auto":
        fit = c.workload_ratio if c.workload_sized else None
        if fit is not None and c.safe.recommended_ratio is not None and fit <= c.safe.recommended_ratio:
            ratio = fit
            c.decide("choose_hicache", "hicache_ratio", ratio,
                     f"auto: the smallest ratio whose host KV holds the workload's prefixes asked twice "
                     f"(host mamba sized apart by patch 0004; the recommended {c.safe.recommended_ratio} would pin "
                     "host KV those prefixes' states cannot use)")
        elif c.safe.recommended_ratio is not None and c.safe.recommended_ratio >= hc.min_ratio:
            ratio = c.safe.recommended_ratio
            c.decide("choose_hicache", "hicache_ratio", ratio, "auto: the recommended ratio"
                     + (f" (the workload's {fit} does not fit the pinned budget)" if fit is not None else ""))
        elif c.hicache_off_reason is None:
            at_min = host_pools_at_ratio(c.dev, hc.min_ratio)
            why = _first_failure(c, at_min) or (
                f"{fmt_mib(headroom(c.view, at_min, c.constraints))} would be left under {c.budget.binding_detail}, less than the "
                f"{fmt_mib(c.inp.profile.safety.recommend_headroom)} headroom")
            advice = _platform_advice(c)
            c.hicache_off_reason = (
                f"no ratio >= hicache.min_ratio {hc.min_ratio} fits: at {hc.min_ratio}, {why}"
                + (f" (largest safe {c.safe.max_safe_ratio})" if c.safe.max_safe_ratio else "")
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
    if c.inp.arch.is_hybrid:
        runtime = (f"stock SGLang {c.inp.release}" if not c.inp.capabilities & set(SERIES_CAPABILITIES) else
                   f"stock SGLang {c.inp.release}: {_no_series(c)}" if _series_missing(c) else
                   f"SGLang {c.inp.release} with this series, whose patch 0004 sizes the host mamba pool; the "
                   "restore path is SGLang's" if HOST_MAMBA_CAPABILITY in c.inp.capabilities else
                   f"SGLang {c.inp.release} with this series, which does not change the hybrid restore path")
        rt, hc0 = c.inp.profile.runtime, c.inp.profile.hicache
        inert = hybrid_host_hits_inert(c.inp.release, rt.mamba_radix_cache_strategy, rt.page_size or 1,
                                       hc0.hicache_write_policy, list(rt.extra_args or []),
                                       speculative_algorithm(c.inp.profile))
        c.warnings.append(
            f"hicache: on this runtime ({runtime}) host-tier hits for a hybrid GDN model "
            + (f"may be inert (sglang#33713: {'; '.join(inert)}) or " if inert else "can ")
            + "restore wrong state (a fluent, wrong answer with full cached_tokens: sglang#39830); run "
            "`escha-deploy up --canary` to prove a prefix restored from host RAM answers as it did the first time")
    c.hicache = HiCachePlan(
        enabled=True, ratio=None if size else ratio, size_gb=size, requested=requested,
        mem_layout=hc.hicache_mem_layout, io_backend=hc.hicache_io_backend,
        storage_backend=hc.hicache_storage_backend, host_allocator=allocator,
        host_mamba_slots=c.dev.host_mamba_slots,
    )


def hybrid_host_hits_inert(release: str, strategy: str, page_size: int, write_policy: str,
                           extra_args: list[str], speculative: str | None = None) -> list[str]:
    """Why host-tier hits of a hybrid model may be inert in this configuration, one reason per
    way it departs from the configuration a real server of ``release`` loaded back (its release
    data's ``hybrid_host_hits_loaded_back``; a release with none was not tried); empty: that
    configuration. Reasons read in SGLang 0.5.19's code say where; the others say they were not tried.

    - ``auto`` resolves to ``extra_buffer`` when the overlap scheduler is on or the page is > 1,
      else ``no_buffer`` (``arg_groups/overrides.py``, the ``mamba_radix_cache_strategy``
      resolution);
    - ``no_buffer`` keeps a mamba state only at the end of each request's own sequence
      (``mem_cache/unified_cache/components/mamba_component.py: prepare_for_caching_req``); the
      state at a shared prefix's branching point is tracked only by the extra buffer
      (``managers/schedule_batch.py``, ``mamba_branching_seqlen``), so a later request sharing
      only the prefix finds no state to resume from, on device or host;
    - ``write_back``: a new branching state reaches the host by write-through only ("write-back
      eviction may discard the device-only state", ``mamba_component.py``).
    - ``speculative``: the algorithm SGLang runs (``runtime.speculative.algorithm``, upper case as
      ``profile.rules.speculative_algorithm`` reads it; None: none), which the loaded-back run had
      not set.
    """
    out = []
    seen = load_release(release).hybrid_host_hits_loaded_back
    if seen is None:
        out.append(f"SGLang {release} was not tried on a real server")
    overlap_off = "--disable-overlap-schedule" in extra_args
    resolved = strategy if strategy != "auto" else (
        "extra_buffer" if (not overlap_off or page_size > 1) else "no_buffer")
    if resolved == "no_buffer":
        out.append("mamba_radix_cache_strategy no_buffer" + (" (auto, with the overlap scheduler off)"
                                                               if strategy == "auto" else "")
                   + " keeps a mamba state only at the end of each request, never at a shared "
                   "prefix's branching point (mamba_component.py: prepare_for_caching_req)")
    elif seen is not None and resolved != seen.strategy:
        out.append(f"mamba_radix_cache_strategy {resolved} was not tried on a real server")
    if seen is not None and page_size != seen.page_size:
        out.append(f"page size {page_size} was not tried on a real server")
    if write_policy == "write_back":
        out.append("under write_back a new branching state reaches the host only by write-through "
                   "(mamba_component.py: write-back eviction may discard it)")
    elif seen is not None and write_policy != seen.write_policy:
        out.append(f"hicache_write_policy {write_policy} was not tried on a real server")
    if speculative:
        out.append(f"speculative decoding ({speculative}) with a hybrid host tier was not tried on a real server")
    return out


def step_host_pools(c: _Ctx) -> None:
    h = c.hicache
    if not h.enabled:
        c.pools = HostPools(0, 0, 0, 0)
        return
    c.pools = (host_pools_at_size(c.dev, h.size_gb) if h.size_gb else
               host_pools_at_ratio(c.dev, c._need(h.ratio, "hicache.ratio", "choose_hicache")))
    p = c.pools
    how = f"--hicache-size {h.size_gb}" if h.size_gb else f"--hicache-ratio {h.ratio}"
    c.decide("host_pools", "host KV pool", p.kv_bytes,
             f"{how}: {p.kv_tokens:,} tokens (page-rounded, +1 page) x {c.dev.host_kv_bytes_per_token} B")
    if p.mamba_slots:
        c.decide("host_pools", "host mamba pool", p.mamba_bytes,
                 f"{how}: {p.mamba_slots} slots (+1) x {c.dev.mamba_bytes_per_slot} B")
    if p.draft_kv_tokens:
        rule = load_release(c.inp.release).draft_host_pool
        sized = ("host_token_capacity = the target host pool's tokens, no padding page of its own"
                 if rule.capacity == "shared" else "at the target host pool's tokens (page-rounded, +1 page)")
        c.decide("host_pools", "host draft KV pool (sidecar)", p.draft_kv_bytes,
                 f"{p.draft_kv_tokens:,} tokens ({sized}, SGLang {c.inp.release}: {rule.source}) "
                 f"x {c.dev.draft_host_bytes_per_token} B")
    total = c.ranks * p.pinned_bytes
    c.budget = c.budget.model_copy(update={"headroom_bytes": headroom(c.view, p, c.constraints)})
    hint = ((f"; use a ratio <= {c.safe.max_safe_ratio}" if c.safe.max_safe_ratio and not h.size_gb else "")
            + (f"; use hicache_size <= {c.safe.max_safe_size_gb}" if c.safe.max_safe_size_gb and h.size_gb else ""))
    at = f"hicache.hicache_size: at {h.size_gb} GB per rank" if h.size_gb else f"hicache.hicache_ratio: at {h.ratio}"
    for b in breaches(c.view, p, c.constraints):
        text = f"{at} {b.message}{hint}" + (f"; {b.advice}" if b.advice else "")
        if c.safe.max_safe_size_gb and h.size_gb:
            c.fix(text, "hicache.hicache_size", c.safe.max_safe_size_gb)
        elif c.safe.max_safe_ratio and not h.size_gb:
            c.fix(text, "hicache.hicache_ratio", c.safe.max_safe_ratio)
        c.unsafe.append(text)
    if p.kv_tokens <= c.dev.kv_tokens:
        c.warnings.append(f"hicache: the host KV pool ({p.kv_tokens:,} tokens) is not larger than the device pool "
                          f"({c.dev.kv_tokens:,}); L2 cache effectiveness is reduced (SGLang's own warning)")
    # The runtime's own checks on these pools.
    kv_host = p.kv_bytes + p.draft_kv_bytes  # a draft's sidecar pool is checked as the KV pool is
    s_ok, s_why = stock_check(c.view.a_guard, c.ranks, kv_host, p.mamba_bytes, c.view.stock_reserve)
    p_ok, p_why = patched_check(c.view.a_runtime, c.ranks, kv_host, p.mamba_bytes, c.view.patched_reserve)
    patched: CheckResult | None = "accept" if p_ok else "refuse"
    applies = c.view.runtime_applies
    if _series_missing(c):  # no patched runtime of this release to run its check: the stock one runs
        patched, p_why, applies = None, _no_series(c), "stock"
    c.runtime_check = RuntimeCheck(
        stock="accept" if s_ok else "refuse", patched=patched,
        applies=applies, available_bytes=c.view.a_runtime, stock_reserve_bytes=c.view.stock_reserve,
        patched_reserve_bytes=c.view.patched_reserve, stock_detail=s_why, patched_detail=p_why,
        release=c.inp.release, guard_kind=load_release(c.inp.release).host_guard.kind,
        stock_available_detail=c.a_guard_detail)
    if "hicache-host-reserve-env" in c.inp.capabilities:
        # the patched runtime reads its reserve from the environment; the stock one has its 10 GiB
        c.hicache = h = h.model_copy(update={"host_reserve_bytes": c.view.patched_reserve})
    if h.storage_backend == "file":
        from .disk import describe, l3_disk

        hc = c.inp.profile.hicache
        c.l3_disk, unsafe = l3_disk(
            release=c.inp.release, tp_size=c.ranks, mla=bool(c.inp.model_dir and c.inp.model_dir.kv_rank_replicated),
            hybrid=c.inp.arch.is_hybrid, cap=hc.storage_max_size, min_free=hc.storage_min_free,
            page_bytes=c.sizing.page_size * c.dev.host_kv_bytes_per_token, reading=c.inp.host.l3_dir)
        c.unsafe += unsafe
        c.decide("host_pools", "file L3 disk", fmt_gb(c.l3_disk.need_bytes) if c.l3_disk.need_bytes else "no cap",
                 describe(c.l3_disk))
        if not c.inp.host.l3_checked:
            need = f"and have {fmt_gb(c.l3_disk.need_bytes)} free or in the store's own files " \
                if c.l3_disk.need_bytes else ""
            c.warnings.append(f"hicache.l3.dir: {hc.storage_dir} was not checked (this plan describes "
                              f"another host): there it must exist, be writable {need}where it is mounted")
    if c.inp.host.available_now_bytes is not None:
        need_bytes = total + c.budget.server_processes_bytes + c.budget.os_reserve_bytes
        if c.inp.host.available_now_bytes < need_bytes:
            c.short_now_bytes = need_bytes - c.inp.host.available_now_bytes
            c.warnings.append(f"host: only {fmt_gb(c.inp.host.available_now_bytes)} is available now, less than the "
                              f"{fmt_gb(need_bytes)} this plan needs: other processes already hold the room")


def _auto_size(c: _Ctx) -> AutoSizeCheck | None:
    """What the release's auto-size would pick on this box (None: the release has none)."""
    device = c.dev.kv_bytes + c.dev.mamba_bytes
    picked = auto_size_pick(c.inp.release, c.view.a_guard, c.ranks, device,
                            buffer_only=c.inp.profile.hicache.hicache_host_memory_mode == "buffer_only")
    auto = load_release(c.inp.release).host_guard.auto_size
    if picked is None or auto is None:
        return None
    ratio, budget = picked
    if ratio <= 0:
        return AutoSizeCheck(fraction=auto.fraction_default, budget_per_rank_bytes=budget, device_bytes=device,
                             ratio=round(ratio, 3), refused=True,
                             detail="\"No host memory is left for HiCache after the 10 GiB reserve\" (hicache_auto_size.py)")
    pools = host_pools_at_ratio(c.dev, ratio)
    fits = pools.kv_bytes <= budget and pools.mamba_bytes <= budget - pools.kv_bytes
    return AutoSizeCheck(
        fraction=auto.fraction_default, budget_per_rank_bytes=budget, device_bytes=device, ratio=round(ratio, 3),
        host_kv_bytes=pools.kv_bytes, host_mamba_bytes=pools.mamba_bytes, refused=not fits,
        detail=(f"(({fmt_gib(c.view.a_guard)} - {fmt_gib(c.view.stock_reserve)} reserve) "
                f"// {c.ranks}) x {auto.fraction_default} = {fmt_gib_gb(budget)} per rank; ratio min({auto.default_ratio}, "
                f"{fmt_gib(budget)} x {1 - auto.allocation_slack:g} / {fmt_gib(device)} device) = {ratio:.3f}; "
                f"pools {fmt_gib_gb(pools.kv_bytes + pools.mamba_bytes)} booked against the one snapshot "
                f"({'fit' if fits else 'do not fit'})"))


def step_validate(c: _Ctx) -> None:
    c.findings = validate(c.inp.profile, c.inp.arch, c.inp.capabilities, page_size=c.sizing.page_size, mamba_slots=c.dev.mamba_slots,
                          draft=c.inp.draft,
                          model_dir=c.inp.model_dir, release=load_release(c.inp.release))
    # the speculative configuration: what SGLang's resolution refuses, and what of the draft's
    # host KV or intermediate states this plan cannot size (planner.draft)
    c.findings += [Finding(severity="error", field=k, message=m) for k, m in c.inp.spec.problems]
    if c.inp.draft_host.not_counted:
        c.findings.append(Finding(severity="warning", field="runtime.speculative.algorithm",
                                  message=c.inp.draft_host.not_counted))
    alg = c.inp.draft.algorithm
    if alg and c.inp.arch.is_hybrid and not c.inp.spec.num_draft_tokens and not c.inp.spec.problems:
        c.findings.append(Finding(severity="warning", field="runtime.speculative.algorithm", message=(
            f"{alg} on a hybrid model: SGLang keeps intermediate mamba states per draft token (kv_cache_configurator.py: "
            f"_handle_max_mamba_cache) from {alg}'s own draft length, which this plan does not mirror: set "
            "runtime.speculative.num_draft_tokens, or leave device headroom")))
    rt, box = c.inp.profile.runtime, c.inp.profile.container
    images = [("container.image", box.image), ("runtime.base_image", rt.base_image)]
    unset = [f for f, given in (("container.image", "image" in box.model_fields_set),
                                ("runtime.base_image", "base_image" in rt.model_fields_set)) if not given]
    c.findings += [Finding(severity=sev, field=f, message=m) for sev, f, m in
                   release_findings(rt.needs, SERIES_CAPABILITIES, images, c.inp.release, c.inp.release_source, unset)]


def step_verdict(c: _Ctx) -> None:
    errors = [f"{f.field}: {f.message}" for f in c.findings if f.severity == "error"]
    c.warnings.extend(f"{f.field}: {f.message}" for f in c.findings if f.severity == "warning")
    if errors or c.unsafe:
        c.verdict = "unsafe"
        c.reasons = errors + c.unsafe
    elif c.inp.profile.hicache.enabled and not c.hicache.enabled:
        c.verdict = "hicache_off"
        c.reasons = [f"HiCache off: {c.hicache_off_reason}; the server is launchable without it"]
    else:
        c.verdict = "ok"
        if c.hicache.enabled:
            pinned = c.ranks * c.pools.pinned_bytes
            spare = c._need(c.budget.headroom_bytes, "budget.headroom_bytes", "host_pools")
            room = fmt_gb(spare) if spare >= GB else fmt_mib(spare)
            if c.budget.binding == "ceiling":
                first = (f"each rank pins {fmt_gb(c.pools.pinned_bytes)}, under {c.budget.binding_detail}, "
                         f"with {room} to spare (pinned total {fmt_gb(pinned)})")
            else:
                first = f"pinned {fmt_gb(pinned)} fits {c.budget.binding_detail} with {room} to spare"
            c.reasons = [first + f"; the {c.view.runtime_applies} runtime's own check accepts it"]
            advice = _platform_advice(c)
            hc = c.inp.profile.hicache
            chosen = c.hicache.ratio
            limited = (chosen is not None and c.safe.recommended_ratio is not None
                       and chosen == c.safe.recommended_ratio and c.safe.recommended_ratio < hc.max_ratio)
            nxt = (buffer_over_limit(c.view, host_pools_at_ratio(c.dev, round(chosen + c.inp.profile.safety.ratio_step, 6)))
                   if limited and chosen is not None else None)
            if nxt is not None:
                c.reasons.append(f"the ratio is limited by the {PINNED_MAX_BYTES:,} B (4 GiB) limit on one pinned "
                                 f"(cudaHostAlloc) allocation (sglang#7666): one step higher, the {nxt[0]} would be "
                                 f"{nxt[1]:,} B; not by hicache.max_ratio {hc.max_ratio}")
            elif advice and limited:
                # the budget's terms are the first reason's: said once
                limit = (c.budget.binding_detail if c.budget.binding == "ceiling"
                         else f"the pinned budget {fmt_gib_gb(c.budget.pinned_budget_bytes)}")
                c.reasons.append(f"the ratio is limited by {limit}, not by hicache.max_ratio {hc.max_ratio}; {advice}")
        else:
            c.reasons = ["HiCache is disabled in the profile; the device pools fit"]



def step_launch_values(c: _Ctx) -> None:
    """The launch values the plan decides beyond the pools, each once, here; ``flags`` renders
    them as decided (the decision line says what the argv and env say):

    - ``--mamba-radix-cache-strategy``: ``validate.resolved_mamba_strategy`` (SGLang's own
      default when the profile leaves it unset);
    - ``--disable-custom-all-reduce``: custom all-reduce maps each rank's buffers into the
      others through CUDA IPC and needs peer access (sgl-project/sglang#4814): off for TP >= 2
      unless NVML facts prove it between every pair of TP GPUs;
      ``runtime.disable_custom_all_reduce`` wins;
    - ``NCCL_P2P_DISABLE=1``: NCCL's P2P transport is off under WSL2 and where NVML shows the TP
      GPUs without peer access (microsoft/WSL#12467, NVIDIA/nccl#1637); without NVML facts NCCL
      detects P2P itself; ``container.nccl_p2p_disable`` wins;
    - what doctor's all-reduce smoke test found (``HostFacts.nccl_env``, the environment it first
      passed with): every variable of it is rendered (``Plan.nccl_env``), and where it passed only
      with ``NCCL_P2P_DISABLE=1`` both P2P decisions follow it, whatever NVML says of peer
      access: NVML can call a pair P2P-capable that an IOMMU or PCIe ACS keeps from working
      (vllm#51513), and custom all-reduce needs the same peer mappings (sgl-project/sglang#4814).
      The profile's keys still win, with a warning.
    """
    profile, platform = c.inp.profile, c.inp.host.platform
    strategy, why = resolved_mamba_strategy(profile, c.inp.arch)
    if why:
        c.decide("launch", "mamba radix cache strategy", f"--mamba-radix-cache-strategy {strategy}", why)
    tp = profile.runtime.tp_size
    peers = peer_access(c.inp.host.gpus, tp_gpu_indices(tp, profile.container.gpus), platform)
    set_car = profile.runtime.disable_custom_all_reduce
    p2p_var = key_env("container.nccl_p2p_disable")
    found = dict(c.inp.host.nccl_env) if tp >= 2 else {}
    found_p2p_off = found.get(p2p_var) == "1"
    smoke = (f"doctor's all-reduce smoke test passed only with {p2p_var}=1 on these GPUs "
             "(NVML's peer access is not enough behind an IOMMU or PCIe ACS: vllm#51513)")
    if tp < 2:
        car = False
    elif set_car is not None:
        car = set_car
        if car:
            c.decide("launch", "custom all-reduce off", key_flag("runtime.disable_custom_all_reduce"),
                     "runtime.disable_custom_all_reduce: true")
        elif found_p2p_off:
            c.warnings.append(f"runtime.disable_custom_all_reduce: false keeps custom all-reduce on although {smoke}")
    else:
        car = not peers.proven or found_p2p_off
        if car:
            c.decide("launch", "custom all-reduce needs proven peer access",
                     key_flag("runtime.disable_custom_all_reduce"),
                     peers.detail if not peers.proven else f"{smoke}; custom all-reduce maps buffers across "
                     "GPUs through CUDA IPC (sgl-project/sglang#4814)")
    set_p2p = profile.container.nccl_p2p_disable
    if set_p2p is not None:
        p2p = set_p2p
        if not p2p and found_p2p_off:
            c.warnings.append(f"container.nccl_p2p_disable: false keeps NCCL's P2P transport on although {smoke}")
    else:
        p2p = tp >= 2 and (platform == "wsl2" or (peers is not None and peers.denied) or found_p2p_off)
    # the rest of what the smoke test passed with (NCCL_SHM_DISABLE=1 after P2P off alone failed)
    rest = {k: v for k, v in sorted(found.items()) if k != p2p_var}
    c.launch = LaunchValues(mamba_strategy=strategy, peers=peers, custom_all_reduce_off=car, nccl_p2p_off=p2p,
                            nccl_env=rest)
    if p2p:
        c.decide("launch", "NCCL P2P transport off", f"{p2p_var}=1",
                 "container.nccl_p2p_disable: true" if set_p2p else
                 "WSL2: NCCL's P2P transport hangs or fails there (microsoft/WSL#12467)" if platform == "wsl2" else
                 f"{peers.detail} (NVIDIA/nccl#1637)" if peers is not None and peers.denied else smoke)
    for k, v in rest.items():
        c.decide("launch", "NCCL setting doctor found", f"{k}={v}",
                 "doctor's all-reduce smoke test passed only with it (docs/doctor.md)")


STEPS: tuple[tuple[str, Callable[[_Ctx], None]], ...] = (
    ("model_shapes", step_model_shapes),
    ("device_pools", step_device_pools),
    ("device_budget", step_device_budget),
    ("pinned_budget", step_pinned_budget),
    ("host_mamba", step_host_mamba),
    ("runtime_checks", step_runtime_checks),
    ("safe_ratio", step_safe_ratio),
    ("choose_hicache", step_choose_hicache),
    ("host_pools", step_host_pools),
    ("validate", step_validate),
    ("verdict", step_verdict),
    ("launch_values", step_launch_values),
)


def _comparison(c: _Ctx) -> list[KvDtypeRow]:
    i2 = c.inp.profile.runtime.kv_cache.int2
    rows = []
    for dt in ("bf16", "fp8_e4m3", "int2"):
        dev = kvmod.device_bytes_per_token(c.shapes, dt, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
        if not dev:  # INT2 packs 4 codes a byte: a head_dim below 4 has no INT2 row (validate says why)
            continue
        host = kvmod.host_bytes_per_token(c.shapes, dt, group_size=i2.group_size, scale_dtype=i2.scale_dtype)
        rows.append(KvDtypeRow(dtype=dt, device_bytes_per_token=dev, host_bytes_per_token=host,
                               device_pool_bytes=(c.dev.kv_tokens + c.sizing.page_size) * dev, tokens_per_gb=GB // dev))
    return rows


def _host_buffer_rows(c: _Ctx) -> list[HostBuffer]:
    """Each host allocation of the chosen pools with the bytes its allocator pins."""
    if not c.hicache.enabled:
        return []
    allocator, why = _counting_allocator(c)
    return [HostBuffer(name=b.name, requested_bytes=b.requested_bytes, pinned_bytes=b.pinned_bytes,
                       allocator=b.allocator, allocator_source=why, source=b.source)
            for b in pinned_buffers(c.pools, allocator)]


def _reach_row(c: _Ctx, label: str, pools: HostPools, w: Workload, chunk: int, strategy: str) -> ReachRow:
    r: Reach = reach(w, chunk=chunk, host_kv_tokens=max(pools.kv_tokens - c.sizing.page_size, 0),
                     host_mamba_slots=max(pools.mamba_slots - 1, 0),
                     write_policy=c.inp.profile.hicache.hicache_write_policy, strategy=strategy)
    return ReachRow(config=label, host_kv_tokens=pools.kv_tokens, host_mamba_slots=pools.mamba_slots,
                    pinned_bytes_per_rank=pools.pinned_bytes, verdict=r.verdict, restored=r.restored,
                    prefixes=w.prefixes, prefix_tokens=w.prefix_tokens, restore_tokens=r.restore_tokens, restore_tokens_max=r.restore_tokens_max,
                    states_needed=r.states_needed, kv_tokens_needed=r.kv_tokens_needed, why=r.why)


def _host_tier_reach(c: _Ctx) -> list[ReachRow]:
    """The workload's second pass against the chosen host pools and, beside it, the other split:
    SGLang's own (device slots x ratio) when patch 0004 sized the mamba pool, else the count 0004
    would set (``reach.needs``). Empty: a dense model, HiCache off or no workload."""
    w = c.inp.workload
    if w is None or not c.hicache.enabled or not c.dev.mamba_slots:
        return []
    chunk = planned_chunk(c)
    strategy = c.launch.mamba_strategy or "extra_buffer"
    h = c.hicache

    def at(dev: DevicePools) -> HostPools:
        return host_pools_at_size(dev, h.size_gb) if h.size_gb else host_pools_at_ratio(dev, float(h.ratio or 0))

    how = f"--hicache-size {h.size_gb}" if h.size_gb else f"--hicache-ratio {h.ratio:g}"
    sf, hc = c.inp.profile.safety, c.inp.profile.hicache

    def recommended(dev: DevicePools) -> float | None:
        return search_safe(replace(c.view, dev=dev), c.constraints, max_ratio=hc.max_ratio, ratio_step=sf.ratio_step,
                           recommend_headroom=sf.recommend_headroom, by_size=False).recommended_ratio

    if c.dev.host_mamba_slots is not None:
        wn = c.workload_fitted or w
        rows = [_reach_row(c, f"planned: {how}, {c.dev.host_mamba_slots:,} host mamba states (patch 0004)"
                           + (f", sized for {wn.prefixes} of the {w.prefixes} prefixes" if wn != w else ""),
                           c.pools, wn, chunk, strategy)]
        stock = replace(c.dev, host_mamba_slots=None)
        r = recommended(stock) if not h.size_gb and hc.hicache_ratio == "auto" else None
        pools = host_pools_at_ratio(stock, r) if r is not None else at(stock)
        rows.append(_reach_row(c, f"stock: --hicache-ratio {r:g} (its recommended), device slots x ratio" if r is not None
                               else f"stock: {how}, device slots x ratio", pools, wn, chunk, strategy))
        return rows
    rows = [_reach_row(c, f"planned: {how}, device slots x ratio (stock split)", c.pools, w, chunk, strategy)]
    have = HOST_MAMBA_CAPABILITY in c.inp.capabilities
    note = "; set hicache.host_mamba_slots: auto)" if have else ", which this runtime lacks)"
    fit = workload_fit(c, w, c.dev) if not h.size_gb else None
    if fit is not None:
        wn, need, ratio = fit
        part = f", sized for {wn.prefixes} of the {w.prefixes} prefixes" if wn != w else ""
        rows.append(_reach_row(c, f"--hicache-ratio {ratio:g} with {need:,} host mamba states{part} (patch 0004{note}",
                               host_pools_at_ratio(replace(c.dev, host_mamba_slots=need), ratio), wn, chunk, strategy))
    elif h.size_gb:
        need = reach_needs(w, chunk)[2]
        rows.append(_reach_row(c, f"{how} with {need:,} host mamba states (patch 0004{note}",
                               at(replace(c.dev, host_mamba_slots=need)), w, chunk, strategy))
    return rows


def profile_weights_per_rank(profile: Profile) -> tuple[int, str]:
    """Weight bytes per rank from the profile's estimate (no model folder) and its source:
    ``model.weights_total`` / ``runtime.tp_size``, or ``model.weights_per_rank`` as written
    (the profile rule ``one-weights-estimate`` makes one of them set)."""
    m, tp = profile.model, profile.runtime.tp_size
    if m.weights_total is not None:
        return m.weights_total // tp, f"model.weights_total {fmt_gb(m.weights_total)} / tp {tp} (profile estimate)"
    return int(m.weights_per_rank or 0), "model.weights_per_rank (profile estimate)"


def _host_hit_cost(c: _Ctx) -> HostHitCost | None:
    """``restore_cost.host_hit_cost`` for the chosen pools; None with HiCache off."""
    if not c.hicache.enabled:
        return None
    from .restore_cost import host_hit_cost

    h = c.inp.host
    origin = {"facts": "the facts file's findings", "live": "this host's saved findings"}.get(h.source, h.source)
    served = served_model(c.inp.profile)
    note = None
    if h.prefill_tokens_per_s and h.prefill_model == served:
        rate, src = h.prefill_tokens_per_s, h.prefill_source or "`escha-deploy bench` on this box"
    else:
        if h.prefill_tokens_per_s:
            note = (f"bench's last cold prefill measured {h.prefill_model or 'an unnamed model'}, not this profile's "
                    f"{served}: not used")
        if c.inp.profile.hicache.prefill_tokens_per_s:
            rate, src = c.inp.profile.hicache.prefill_tokens_per_s, "hicache.prefill_tokens_per_s (the profile)"
        else:
            rate, src = None, None
    return host_hit_cost(host_kv_bytes_per_token=c.dev.host_kv_bytes_per_token,
                         mamba_slot_bytes=c.dev.mamba_bytes_per_slot if c.dev.mamba_slots else 0,
                         context_length=c.inp.profile.runtime.context_length, bandwidth=h.restore_bandwidth,
                         bandwidth_origin=origin, prefill_tokens_per_s=rate, prefill_source=src, prefill_note=note)


def served_model(profile: Profile) -> str:
    """The model name the profile's server answers to (``/model_info``'s served_model_name, what
    ``bench`` records): ``model.served_model_name``, else ``model.path``, as SGLang defaults it
    (SGLang 0.5.19 sglang/srt/arg_groups/serving_hook.py:handle_missing_default_values)."""
    return profile.model.served_model_name or profile.model.path


def plan(profile: Profile, host: HostFacts, *, model_dir: ModelDirFacts | None = None,
         ratio: float | None = None, hicache_size_gb: int | None = None,
         capabilities: frozenset[str] | set[str] | None = None, hicache_source: str | None = None,
         release: str | None = None, release_source: str = "", draft: DraftFacts | None = None,
         workload: Workload | None = None) -> Plan:
    """Plan ``profile`` on ``host``: every byte the runtime will allocate, its own checks, the
    safe HiCache ratio and a verdict with reasons.

    ``model_dir``: facts read from the model folder (``arch.read_model_dir``); they replace the
    profile's architecture and weights estimate. ``draft``: facts read from ``model.draft``'s
    folder (``arch.read_draft_dir``): the draft's weights and KV are counted
    (``draft.draft_count``). ``ratio``/``hicache_size_gb``: command-line
    overrides (``--ratio``, ``--hicache-size``; GB = 1e9 per rank). ``hicache_source``: where the
    profile's deciding HiCache key (``enabled: false``, else ``hicache_size`` > 0, else
    ``hicache_ratio``) was set, ``file:line`` or ``--set key``, for the plan's label. ``capabilities``: what the
    target runtime provides; default: what the profile needs (the image built for it).
    ``release``: the SGLang release planned (``releases.choose_release``; default: the default
    release): its host guard, memory defaults and parser; ``release_source`` where it came from.
    ``workload``: what the host tier should bring back (``--workload``; default the profile's
    ``hicache.workload``): ``Plan.host_tier_reach`` and ``hicache.host_mamba_slots: auto``.
    Pure: no I/O (the release's committed data is read once per process). Raises nothing for unsafe plans; see ``Plan.verdict``.
    """
    caps = frozenset(profile.runtime.needs if capabilities is None else capabilities)
    arch = model_dir.arch if model_dir and model_dir.arch else profile.model.architecture
    if profile.runtime.mamba_ssm_dtype:
        arch = arch.model_copy(update={"mamba_ssm_dtype": profile.runtime.mamba_ssm_dtype})
    counted = draft_count(profile, draft)
    if model_dir and model_dir.tensor_bytes:
        # the headers' tensor bytes, MTP tensors apart: the target skips them (qwen3_5.py, qwen3_next.py:
        # load_weights), and a NEXTN draft of the model's own folder counts them as its weights
        total, tp = model_dir.tensor_bytes, profile.runtime.tp_size
        mtp = f"; MTP tensors apart: {fmt_gb(model_dir.mtp_tensor_bytes)}" if model_dir.mtp_tensor_bytes else ""
        wsrc = (f"safetensors headers in {model_dir.path}: {fmt_gb(total)} of tensors (dtype x shape{mtp}) / tp {tp}")
        weights = total // tp
    elif model_dir and model_dir.safetensors_bytes:
        total, tp = model_dir.safetensors_bytes, profile.runtime.tp_size
        wsrc = f"safetensors in {model_dir.path}: {fmt_gb(total)} / tp {tp}"
        if draft is not None and draft.own_folder and counted.weights_bytes and draft.weights_bytes:
            # the target skips the MTP tensors its draft loads (qwen3_5.py, qwen3_next.py: load_weights)
            total -= draft.weights_bytes
            if total <= 0:  # the headers are checked against their files (arch._tensor_problem)
                raise BadInput(f"model.draft.host_dir: the MTP tensors' {draft.weights_bytes:,} bytes are "
                               f"not less than all the safetensors bytes of {model_dir.path} "
                               f"({model_dir.safetensors_bytes:,}); the folder changed while read?")
            wsrc = (f"safetensors in {model_dir.path} less its MTP tensors (the draft's; the target skips them: "
                    f"qwen3_5.py load_weights): {fmt_gb(total)} / tp {tp}")
        weights = total // tp
    else:
        weights, wsrc = profile_weights_per_rank(profile)
    inp = PlanInputs(profile=profile, host=host, arch=arch, weights_bytes=weights, weights_source=wsrc,
                     capabilities=caps, ratio_override=ratio, size_override=hicache_size_gb,
                     hicache_source=hicache_source, model_dir=model_dir, release=release or default_release(),
                     release_source=release_source or "the default release", draft=counted,
                     spec=spec_shape(profile), draft_host=draft_host(profile, draft),
                     workload=workload or (parse_workload(profile.hicache.workload) if profile.hicache.workload else None),
                     workload_source="--workload" if workload else "hicache.workload")
    c = _Ctx(inp)
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
    p = c.pools
    sf = profile.safety
    return Plan(
        weights_source=("headers" if model_dir and model_dir.tensor_bytes else
                        "file sizes" if model_dir and model_dir.safetensors_bytes else "estimate"),
        weights_source_detail=wsrc + (f" (the headers: {model_dir.header_note})"
                                      if model_dir and model_dir.header_note and not model_dir.tensor_bytes else ""),
        host_hit_cost=_host_hit_cost(c),
        host_tier_reach=_host_tier_reach(c),
        profile=profile.name, sglang_release=c.inp.release, sglang_release_source=release_source, tp_size=c.ranks, platform=host.platform, host_source=host.source,
        hybrid=arch.is_hybrid, kv_cache_dtype=profile.runtime.kv_cache.dtype, page_size=c.sizing.page_size,
        hicache=c.hicache,
        per_rank=PerRank(
            device_kv_tokens=c.dev.kv_tokens, device_kv_bytes=c.dev.kv_bytes,
            device_kv_bytes_per_token=c.sizing.device_kv_per_token, device_mamba_slots=c.dev.mamba_slots,
            device_mamba_bytes=c.dev.mamba_bytes, mamba_bytes_per_slot=c.dev.mamba_bytes_per_slot,
            device_int2_hp_bytes=c.sizing.int2_hp_bytes, device_req_to_token_bytes=c.sizing.req_to_token_bytes,
            weights_bytes=c.inp.weights_bytes, draft_weights_bytes=c.inp.draft.weights_bytes,
            device_draft_kv_bytes=c.sizing.draft_kv_bytes, draft_kv_bytes_per_token=c.sizing.draft_kv_per_token,
            device_mamba_intermediate_bytes=c.sizing.mamba_intermediate_bytes,
            host_draft_kv_tokens=p.draft_kv_tokens, host_draft_kv_bytes=p.draft_kv_bytes,
            host_kv_tokens=p.kv_tokens, host_kv_bytes=p.kv_bytes,
            host_kv_bytes_per_token=c.dev.host_kv_bytes_per_token if c.hicache.enabled else None,
            host_mamba_slots=p.mamba_slots, host_mamba_bytes=p.mamba_bytes, pinned_bytes=p.pinned_bytes,
            host_buffers=_host_buffer_rows(c)),
        pinned_total_bytes=c.ranks * p.pinned_bytes,
        budget=c.budget,
        max_safe_ratio=c.safe.max_safe_ratio if profile.hicache.enabled else None,
        short_now_bytes=c.short_now_bytes,
        recommended_ratio=c.safe.recommended_ratio if c.hicache.enabled else None,  # none when the plan turned it off
        ratio_cap=profile.hicache.max_ratio if profile.hicache.enabled else None,
        runtime_check=c.runtime_check,
        host_guard=HostGuardView(
            release=c.inp.release, kind=load_release(c.inp.release).host_guard.kind, reserve_bytes=c.view.stock_reserve,
            available_bytes=c.view.a_guard, available_detail=c.a_guard_detail,
            share_per_rank_bytes=(c.view.a_guard - c.view.stock_reserve) // max(c.ranks, 1),
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
        fixes=[f for f in c.fixes if f.problem in c.reasons or f.problem in c.warnings],
        peer_access=c.launch.peers, mamba_radix_cache_strategy=c.launch.mamba_strategy,
        custom_all_reduce_disabled=c.launch.custom_all_reduce_off, nccl_p2p_disabled=c.launch.nccl_p2p_off,
        l3_disk=c.l3_disk, nccl_env=c.launch.nccl_env,
    )

