"""The plan's figures ``status`` puts beside what the server does (pure).

Written by native ``serve`` into its state file and by ``up`` next to the launch spec
(``<cache>/launch/CONTAINER.plan.json``), so ``status`` compares without planning again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.profile.thresholds import Thresholds

if TYPE_CHECKING:  # importing the planner costs 0.3 s at start-up; status needs only the model
    from escha_deploy.planner.result import Plan


class PlanView(BaseModel):
    """Per rank unless named a total; bytes are bytes (GB = 1e9 when printed)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    profile: str
    plan_digest: str = ""
    tp_size: int
    hicache_enabled: bool
    hybrid: bool = False
    host_kv_tokens: int = Field(0, description="planned host KV pool, tokens per rank")
    host_kv_bytes: int = Field(0, description="planned host KV pool, bytes per rank")
    host_mamba_slots: int = 0
    host_mamba_bytes: int = 0
    server_processes_bytes: int = Field(0, description="all ranks")
    os_reserve_bytes: int = 0
    page_cache_floor_bytes: int = Field(0, description="page cache the plan keeps free of pinned pools")
    memory_base_bytes: int = 0
    h2d_bytes_per_s: float | None = Field(None, description="measured host -> device bandwidth per rank (B/s)")
    h2d_source: str = Field("not measured", description="where the bandwidth comes from")
    prefill_tokens_per_s: float | None = Field(None, description="cold prefill rate (tokens/s)")
    prefill_source: str = Field("not known", description="where the prefill rate comes from")
    thresholds: Thresholds = Field(default_factory=Thresholds, description="the profile's watch section")


def plan_view(plan: Plan, plan_digest: str = "", watch=None) -> PlanView:
    """The figures of a ``Plan`` and the profile's ``watch`` thresholds (``Profile.watch``).
    The measured host -> device bandwidth and the prefill rate are the plan's restore-cost
    inputs (``Plan.host_hit_cost``: doctor's restore probe; bench's last cold prefill, else
    ``hicache.prefill_tokens_per_s``), None where the plan has none."""
    pr = plan.per_rank
    hit = plan.host_hit_cost
    gbps = next((r.load_gbps for r in hit.rows if r.load_gbps), None) if hit else None
    return PlanView(profile=plan.profile, plan_digest=plan_digest, tp_size=plan.tp_size,
                    hicache_enabled=plan.hicache.enabled, hybrid=plan.hybrid,
                    host_kv_tokens=pr.host_kv_tokens, host_kv_bytes=pr.host_kv_bytes,
                    host_mamba_slots=pr.host_mamba_slots, host_mamba_bytes=pr.host_mamba_bytes,
                    server_processes_bytes=plan.budget.server_processes_bytes,
                    os_reserve_bytes=plan.budget.os_reserve_bytes,
                    page_cache_floor_bytes=plan.budget.page_cache_floor_bytes,
                    memory_base_bytes=plan.budget.memory_base_bytes,
                    h2d_bytes_per_s=gbps * 1e9 if gbps else None,
                    h2d_source=hit.load_source if hit else "not measured",
                    prefill_tokens_per_s=hit.prefill_tokens_per_s if hit else None,
                    prefill_source=hit.prefill_source if hit else "not known",
                    thresholds=Thresholds(**watch.model_dump()) if watch is not None else Thresholds())
