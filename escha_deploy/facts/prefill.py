"""The last cold prefill ``bench`` measured on this box (``LastPrefill``), a planner input for
host_hit_cost (what a host-tier hit saves is a recompute at this rate). Pure: no I/O;
``findings.load_last_prefill`` reads it back, ``bench.last`` writes it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..profile.models import MIN_PREFILL_TOKENS_PER_S, Number


class LastPrefill(BaseModel):
    """One cold prefill: tokens/s = (prompt_tokens - cached) / time to first token."""

    model_config = ConfigDict(extra="ignore")
    created_at: str = Field(description="ISO 8601 UTC time bench finished")
    url: str = Field(description="the server bench measured")
    model: str
    hicache: bool | None = Field(description="the server had HiCache on (None: unknown)")
    prompt_tokens: int
    tokens_per_s: Number = Field(ge=MIN_PREFILL_TOKENS_PER_S, le=1e9, description="tokens/s; the profile key "
                                 "hicache.prefill_tokens_per_s's bounds (a file below the floor is not read)")

    @property
    def source(self) -> str:
        """Where the rate came from, one line: the command, when, the prompt's size, model and server."""
        hc = {True: "HiCache on", False: "HiCache off", None: "HiCache unknown"}[self.hicache]
        return (f"`escha-deploy bench` on this box at {self.created_at[:16]} UTC: {self.prompt_tokens:,}-token cold "
                f"prefill of {self.model} at {self.url} ({hc})")
