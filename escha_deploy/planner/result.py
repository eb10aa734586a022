"""The plan's result models: every byte figure per rank and in total, the runtime's own checks,
the safe ratio, the verdict with reasons, and each step's decisions with their reason.

These are plain data (JSON via ``model_dump(mode="json")``); ``plan --format json`` prints them.
Bytes are ``int``; ratios are floats; GB in names means 1e9 bytes.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every string annotation
# of these models at class creation (typing._eval_type), about half of this module's import
# time, on every command that plans (docs/performance.md).

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.facts.provenance import FactSource
from escha_deploy.facts.gpu_rules import PeerAccess

Verdict = Literal["ok", "unsafe", "hicache_off"]
CheckResult = Literal["accept", "refuse"]


class Decision(BaseModel):
    """One planner step's decision: which rule set which value, and why."""

    model_config = ConfigDict(frozen=True)
    step: str
    rule: str
    value: object = None
    reason: str


class KvDtypeRow(BaseModel):
    """Bytes one token costs per rank in one KV dtype, and what that buys."""

    dtype: str
    device_bytes_per_token: int
    host_bytes_per_token: int | None = Field(description="None: HiCache cannot mirror this dtype")
    device_pool_bytes: int = Field(description="at the profile's device pool size, padding page included")
    tokens_per_gb: int = Field(description="device tokens per GB (1e9 B)")


class HostBuffer(BaseModel):
    """One host allocation per rank (``planner/pools.py: pinned_buffers``): the bytes SGLang
    requests and the bytes the chosen allocator pins, with the rule's source."""

    name: str
    requested_bytes: int = Field(description="prod(dims) x itemsize, as the host pool asks")
    pinned_bytes: int = Field(description="what the allocator pins: the request rounded up to the 4 KiB page "
                              "(runtime/hooks/host_alloc.py: pinned_bytes)")
    allocator: Literal["pinned", "register"] = Field(description="pinned: one cudaHostAlloc of the exact size; "
                                                     "register: mmap + cudaHostRegister")
    allocator_source: str = Field(description="why this allocator: the launch's ESCHA_HICACHE_HOST_ALLOCATOR, "
                                  "doctor's store probe, or stock SGLang")
    source: str = Field(description="the rule the pinned bytes follow")


class PerRank(BaseModel):
    """Per TP rank (one GPU, one scheduler process)."""

    device_kv_tokens: int
    device_kv_bytes: int = Field(description="(tokens + page_size) x device bytes per token")
    device_kv_bytes_per_token: int
    device_mamba_slots: int = 0
    device_mamba_bytes: int = Field(0, description="(slots + 1) x bytes per slot")
    mamba_bytes_per_slot: int = 0
    device_int2_hp_bytes: int = Field(0, description="INT2's bf16 sink + recent-window arena")
    device_req_to_token_bytes: int = 0
    weights_bytes: int
    draft_weights_bytes: int = Field(0, description="the speculative draft's weights per rank (0: none counted)")
    device_draft_kv_bytes: int = Field(0, description="the draft's KV pool: (tokens + page_size) x "
                                       "draft_kv_bytes_per_token (0: none counted)")
    draft_kv_bytes_per_token: int = Field(0, description="bytes the draft's layers add to each token's KV cell "
                                          "(SGLang's scaled cell less the target's)")
    device_mamba_intermediate_bytes: int = Field(
        0, description="mamba states SGLang keeps per draft token per request under speculation on a hybrid "
        "model, out of the KV budget (kv_cache_configurator.py: _handle_max_mamba_cache); 0 otherwise")
    host_kv_tokens: int = 0
    host_kv_bytes: int = 0
    host_kv_bytes_per_token: int | None = Field(None, description="the host KV pool's bytes per token, a packed "
                                                "speculative draft's layers included (pool_host/mha.py)")
    host_draft_kv_tokens: int = Field(0, description="a speculative draft's sidecar host KV pool, tokens (0: none)")
    host_draft_kv_bytes: int = Field(0, description="a speculative draft's sidecar host KV pool, bytes (0: none)")
    host_mamba_slots: int = 0
    host_mamba_bytes: int = 0
    pinned_bytes: int = Field(0, description="the sum of host_buffers' pinned_bytes")
    host_buffers: list[HostBuffer] = Field(default_factory=list, description="each host allocation, requested "
                                           "and pinned bytes; empty with HiCache off")


class HiCachePlan(BaseModel):
    enabled: bool
    ratio: float | None = Field(description="--hicache-ratio to pass; None when sized by GB or off")
    size_gb: int | None = Field(description="--hicache-size (GB = 1e9, per rank); None when by ratio")
    requested: str = Field(description="what the profile or command line asked for")
    mem_layout: str | None = None
    io_backend: str | None = None
    storage_backend: str | None = None
    host_allocator: str | None = Field(None, description="ESCHA_HICACHE_HOST_ALLOCATOR for the patched runtime")
    host_reserve_bytes: int | None = Field(None, description="ESCHA_HICACHE_HOST_RESERVE_BYTES for the patched "
                                           "runtime (bytes; runtime_check.patched_reserve_bytes); None: stock runtime")
    host_mamba_slots: int | None = Field(None, description="ESCHA_HICACHE_HOST_MAMBA_SLOTS for a runtime with "
                                         "patch 0004 (host mamba states per rank); None: SGLang's device slots x ratio")


class Budget(BaseModel):
    """The pinned budget of the safety policy: the memory the server can have, less the
    server processes, the OS and a page-cache floor; and which constraint limits the pools.

    ``binding`` is what limits the host pools first: ``ram`` (the budget from MemTotal less
    huge pages), ``cgroup`` (the budget from the container's memory limit) or ``ceiling``
    (doctor's measured per-process pinned ceiling, when below the budget's per-rank share).
    """

    memory_base_bytes: int = Field(description="MemTotal less huge pages, or the cgroup limit when lower")
    memory_base_source: str
    memory_base_kind: Literal["ram", "cgroup"] = "ram"
    hugetlb_bytes: int = Field(0, description="huge pages subtracted from MemTotal")
    server_processes_bytes: int = Field(description="ranks x server_process_per_rank")
    l3_store_bytes: int = Field(0, description="host memory an L3 store takes on this box beside the pools "
                                "(Mooncake's global segment, all ranks); subtracted from the budget")
    os_reserve_bytes: int
    page_cache_floor_bytes: int
    pinned_budget_bytes: int
    pinned_ceiling_bytes: int | None = Field(None, description="doctor's measured per-process ceiling, when real")
    headroom_bytes: int | None = Field(None, description="room left under the binding constraint at the chosen "
                                       "setting: budget - pinned total, or ceiling - pinned per rank")
    available_now_bytes: int | None = None
    reserves_exceed_base: bool = Field(False, description="server processes + OS + page-cache floor > memory base")
    binding: Literal["ram", "cgroup", "ceiling"] = "ram"
    binding_detail: str = Field("", description="the binding constraint with its number and source")


class AutoSizeCheck(BaseModel):
    """What the release's HiCache auto-size (0.5.21+, sglang#40135) would pick for the same box
    if neither ``--hicache-ratio`` nor ``--hicache-size`` were given (escha renders one, so it
    does not run): ``mem_cache/hicache_auto_size.py: auto_size_hicache``. Bytes per rank."""

    fraction: float = Field(description="--hicache-host-memory-fraction default")
    budget_per_rank_bytes: int = Field(description="int(((available - reserve) // ranks) x fraction)")
    device_bytes: int = Field(description="device bytes per rank of the pools with a host mirror (KV, mamba)")
    ratio: float = Field(description="min(default ratio, budget x (1 - slack) / device bytes)")
    host_kv_bytes: int = 0
    host_mamba_bytes: int = 0
    refused: bool = Field(description="ratio <= 0: 'No host memory is left for HiCache after the 10 GiB reserve'")
    detail: str = ""


class HostGuardView(BaseModel):
    """The planned release's own host guard on this box, whatever HiCache setting is chosen:
    what it reads as available (bytes, when the pools are built), its reserve, and what its
    auto-size (0.5.21+) would pick. Sources: ``releases/VERSION/facts.yaml: host_guard``."""

    release: str
    kind: str = Field(description="per-pool-available (0.5.19, 0.5.20), cgroup-bounded-cache-charged (0.5.21) or "
                      "cgroup-bounded (0.5.23)")
    reserve_bytes: int
    available_bytes: int
    available_detail: str
    share_per_rank_bytes: int = Field(description="(available - reserve) // ranks: one reading, one pool")
    auto_size: AutoSizeCheck | None = None


class RuntimeCheck(BaseModel):
    """SGLang's own host-memory check before it allocates host pools.

    ``stock``: the release's ``host_memory_budget_bytes()`` (available - 10 GiB) // ranks, read
    by every rank at every pool, in its worst rank ordering (a late rank counts its peers' pools
    twice, sglang#38156); available is psutil's (0.5.19) or bounded by the cgroup (0.5.21+). ``patched``: our series' reading once per TP group before any rank
    pins, with the configurable reserve.
    """

    stock: CheckResult | None
    patched: CheckResult | None
    applies: Literal["stock", "patched"] = Field(description="which one the target runtime runs")
    available_bytes: int = Field(description="MemAvailable modelled at pool-building time")
    stock_reserve_bytes: int
    patched_reserve_bytes: int = Field(description="ESCHA_HICACHE_HOST_RESERVE_BYTES to hand over")
    stock_detail: str = ""
    patched_detail: str = ""
    release: str = Field("", description="the SGLang release whose stock check this is")
    guard_kind: str = Field("", description="the release's host guard (releases/VERSION/facts.yaml host_guard.kind)")
    stock_available_detail: str = ""


class DevicePlan(BaseModel):
    vram_bytes: int
    hidden_bytes: int = Field(description="VRAM WSL2 keeps hidden (0 on Linux)")
    cuda_context_bytes: int
    free_before_weights_bytes: int
    mem_fraction_static: float
    mem_fraction_static_source: str
    sglang_default_mem_fraction_static: float
    sglang_reserved_bytes: int = Field(description="SGLang's activation + CUDA-graph estimate")
    static_budget_bytes: int = Field(description="free_before_weights x mem_fraction_static")
    static_need_bytes: int = Field(description="weights + device pools (a counted speculative draft's included) "
                                   "+ the multimodal reservation")
    mm_reservation_bytes: int = Field(0, description="what SGLang reserves out of the KV budget for a multimodal "
                                      "model (kv_cache_configurator.py: mm_runtime_reservation_gb); 0: none or no "
                                      "model folder to say")
    activation_room_bytes: int
    fits: bool
    compute_capability: str | None = Field(None, description="the card's compute capability the plan judged "
                                           "(hardware.compute_capability, e.g. \"12.0\"); None when unknown")


class HostFit(BaseModel):
    """Where an unsafe plan would fit as the profile stands (``planner.fit.host_fit``).

    ``assumed_mem_total_bytes``/``assumed_platform``: the host the profile says it was sized for
    (``hardware.host_ram``, ``hardware.platform``; None/"any" when it does not say);
    ``mem_total_bytes``: the host planned; ``fits_from_mem_total_bytes``: the smallest MemTotal
    (on a 1 GiB grid, same platform, no cgroup limit) with which the same profile plans ``ok``;
    None when no memory size up to ``FIT_SEARCH_MAX_BYTES`` does (the reasons are not about
    memory). ``line``: the sentence ``plan`` prints."""

    model_config = ConfigDict(frozen=True)

    assumed_mem_total_bytes: int | None
    assumed_platform: str
    mem_total_bytes: int
    fits_from_mem_total_bytes: int | None
    line: str


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)
    severity: Literal["error", "warning"]
    field: str
    message: str


class SafetyPolicy(BaseModel):
    """The safety policy the plan applied (the profile's ``safety`` section plus the HiCache
    ratio bounds), in the units the planner used: bytes per rank or in total, ratios as floats."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    server_process_per_rank_bytes: int = Field(description="host memory one rank uses outside the pinned pools")
    os_reserve_bytes: int = Field(description="kept for the OS, Docker and escha-deploy")
    page_cache_floor_bytes: int = Field(description="page cache kept free of pinned pools")
    recommend_headroom_bytes: int = Field(description="headroom the recommended ratio leaves")
    ratio_step: float = Field(description="grid of the recommended ratio")
    max_ratio: float = Field(description="hicache.max_ratio")
    min_ratio: float = Field(description="hicache.min_ratio")


class HostHitRow(BaseModel):
    """One prefix length: the load-back from host RAM against recomputing it (``restore_cost``)."""

    prefix_tokens: int = Field(description="capped at the context length")
    load_bytes_per_rank: int = Field(description="tokens x host KV bytes per token + one mamba slot (hybrid)")
    load_gbps: float | None = Field(None, description="the measured host -> device GB/s (1e9) used; None: not measured")
    load_s: float | None = Field(None, description="seconds to load it back; None: not measured")
    recompute_s: float | None = Field(None, description="seconds to prefill it again; None: rate not known")


class HostHitCost(BaseModel):
    """What a host-tier hit costs per rank: ``rows`` for 1,000, 8,000 and 32,000-token prefixes,
    each figure's source (``load_source``, ``prefill_source``: 'not measured'/'not known' when absent)."""

    rows: list[HostHitRow]
    load_source: str
    prefill_tokens_per_s: float | None = None
    prefill_source: str
    bytes_rule: str


class ReachRow(BaseModel):
    """One host-pool split against the plan's workload (``planner.reach``): which prefixes come
    back on the second pass, per rank. ``verdict``: ``all`` / ``none`` / ``not_guaranteed``;
    ``restored`` of ``prefixes`` at ``restore_tokens`` tokens each (up to ``restore_tokens_max``);
    the pools (tokens, slots, pinned bytes, padding included) and what both passes need."""

    config: str
    host_kv_tokens: int
    host_mamba_slots: int
    pinned_bytes_per_rank: int
    verdict: Literal["all", "none", "not_guaranteed"]
    restored: int
    prefixes: int
    prefix_tokens: int
    restore_tokens: int
    restore_tokens_max: int
    states_needed: int
    kv_tokens_needed: int
    why: str


class Fix(BaseModel):
    """The change one of the plan's reasons or warnings names, as data: ``--set KEY=VALUE`` on
    the same command (``escha-deploy plan -p PROFILE --set KEY=VALUE``) removes that line
    (``problem``, the reason's or warning's text as the plan says it) without a new refusal.
    A line whose change cannot remove it says why in its own text and carries no fix."""

    model_config = ConfigDict(frozen=True)

    problem: str = Field(description="the reason or warning this fix answers, word for word")
    key: str = Field(description="the profile key to change, as --set takes it (e.g. runtime.mem_fraction_static)")
    value: str = Field(description="its new value, as --set takes it")

    def set_item(self) -> str:
        """``KEY=VALUE``, as ``--set`` takes it."""
        return f"{self.key}={self.value}"


class Plan(BaseModel):
    profile: str
    sglang_release: str = Field(description="the SGLang release planned (its guard, defaults and flags)")
    sglang_release_source: str = Field("", description="where the release came from")
    tp_size: int
    platform: Literal["linux", "wsl2"]
    host_source: Literal["live", "described", "saved", "facts"]
    hybrid: bool
    kv_cache_dtype: str
    page_size: int
    hicache: HiCachePlan
    per_rank: PerRank
    pinned_total_bytes: int
    budget: Budget
    max_safe_ratio: float | None = Field(description="the largest ratio (0.001 grid) whose pools fit every constraint; "
                                         "not limited by hicache.max_ratio")
    recommended_ratio: float | None = Field(description="the ratio auto picks: the largest safe ratio less "
                                            "headroom, on the ratio grid; null when HiCache is off in this plan")
    ratio_cap: float | None = Field(None, description="hicache.max_ratio: the most the recommendation will pick")
    runtime_check: RuntimeCheck | None
    host_guard: HostGuardView | None = None
    device: DevicePlan
    kv_dtype_comparison: list[KvDtypeRow]
    capabilities: list[str] = Field(description="capabilities the plan assumes the runtime has")
    safety_policy: SafetyPolicy
    findings: list[Finding]
    verdict: Verdict
    reasons: list[str]
    warnings: list[str]
    fixes: list[Fix] = Field(
        default_factory=list, exclude_if=lambda v: not v,
        description="the change each reason or warning names, as data (key and value for --set): following "
        "one removes its line without a new refusal; absent: no line names a change that does")
    short_now_bytes: int | None = Field(
        None, description="a live host's MemAvailable now falls this many bytes short of what the plan needs "
        "(pinned pools + server processes + OS reserve); the verdict stays, the line says it; null: enough, "
        "or not measured (a described host)")
    decisions: list[Decision]
    mamba_radix_cache_strategy: str | None = Field(
        None, description="--mamba-radix-cache-strategy to render on a hybrid model (null: leave SGLang's auto); "
        "validate.resolved_mamba_strategy decides it")
    peer_access: PeerAccess | None = Field(
        None, description="peer access between the TP GPUs, from NVML facts; decides --disable-custom-all-reduce "
        "and NCCL_P2P_DISABLE")
    custom_all_reduce_disabled: bool = Field(
        False, description="render --disable-custom-all-reduce: TP >= 2 without proven peer access "
        "(sgl-project/sglang#4814), or as runtime.disable_custom_all_reduce says")
    nccl_p2p_disabled: bool = Field(
        False, description="set NCCL_P2P_DISABLE=1: TP >= 2 under WSL2 or where NVML shows no peer access "
        "(microsoft/WSL#12467, NVIDIA/nccl#1637), or as container.nccl_p2p_disable says")
    nccl_env: dict[str, str] = Field(
        default_factory=dict, exclude_if=lambda v: not v,
        description="NCCL variables beyond NCCL_P2P_DISABLE that doctor's all-reduce smoke test passed with "
        "(e.g. NCCL_SHM_DISABLE=1), rendered into the server's environment; absent: none")
    plan_digest: str | None = Field(
        None, description="sha256 of the container launch this plan renders (profile, fact values, argv, env: "
        "launch_spec.launch_digest), the digest `up --dry-run`, `serve --print` and the container label carry; "
        "filled where the facts were gathered (pipeline.decide)")
    host_tier_reach: list[ReachRow] = Field(default_factory=list, description=(
        "the workload's second pass (hicache.workload / --workload) against the chosen host pools and the "
        "other split (stock or patch 0004's): planner/reach.py"))
    host_hit_cost: HostHitCost | None = Field(
        None, description="load-back of a cached prefix from host RAM vs recompute (planner/restore_cost.py); "
        "None with HiCache off")
    weights_source: Literal["headers", "file sizes", "estimate"] = Field(
        "estimate", description="what fed the weights in the device budget: the model folder's safetensors headers "
        "(tensor bytes, dtype x shape), its safetensors file sizes (a header that could not be read so), or the "
        "profile's estimate (model.weights_total; no folder here)")
    weights_source_detail: str = Field("", description="the weights' source in words, with its figures")
    model_pin: str = Field("", description="whether the weights are pinned: 'pinned REPO@COMMIT (lock file)' "
                           "once `model pull` wrote escha-model.lock.json beside them, else 'unpinned (why)'; "
                           "filled where the facts were gathered (pipeline.decide)")
    host_fit: HostFit | None = Field(
        None, description="an unsafe plan: the host the profile was sized for (hardware.host_ram) and the smallest "
        "MemTotal with which it fits as it is (planner.fit); null for a safe plan")
    fact_sources: list[FactSource] = Field(
        default_factory=list, description="where each host fact the plan read came from, with its kind of source "
        "(proc, cgroup, nvml, facts_file, findings, ...): pipeline.gather's; not digested")

    def refusal_lines(self) -> list[str]:
        """What refuses an unsafe plan, one ``plan: REASON`` line per reason (``plan: unsafe``
        when it has none): the lines ``up``, ``serve`` and ``compose --facts`` refuse with."""
        return [f"plan: {r}" for r in self.reasons] or ["plan: unsafe"]

    l3_disk: "L3Disk | None" = Field(
        None, description="the file L3 store's disk: each owning rank's cap x the ranks that keep their own files "
        "+ the watermark, and the folder's filesystem and fill where read (planner.disk); None without a file L3")

    argv_check: "ArgvCheck | None" = Field(
        None, description="the rendered argv checked against the runtime's flag catalog (filled by the CLI)")


class ArgvCheck(BaseModel):
    """The rendered SGLang argv, checked against the 0.5.19 flag catalog: flags a capability
    declares (e.g. int2-kv's ``--kv-cache-quant-group-size``) are ``declared``, not verified."""

    verified: int = Field(description="flags the real parser's catalog accepts")
    declared: list[str] = Field(description="'--flag value (capability)' accepted as declared")
    errors: list[str]


from .disk import L3Disk  # noqa: E402  (Plan names it; disk.py imports nothing of this module)

Plan.model_rebuild()
