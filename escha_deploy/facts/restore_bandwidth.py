"""The restore bandwidth doctor measures (``doctor/restore_probe.py``): saved in its findings,
read by ``plan``'s host_hit_cost (``planner/restore_cost.py``). Its own module so that a plan of a
described host, which reads no findings, does not import ``findings``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RestoreBandwidth(BaseModel):
    """doctor's restore-bandwidth probe (``doctor/restore_probe.py``): GB/s (1e9 B/s) of a
    host -> device load-back and a device -> host backup, at ``bytes`` and at one page."""

    model_config = ConfigDict(extra="ignore", defer_build=True)
    method: str = Field(description="what was timed, e.g. a pinned copy_ or SGLang's kernel io backend")
    bytes: int
    load_gbps: float = Field(gt=0, description="host -> device at `bytes`")
    backup_gbps: float = Field(gt=0, description="device -> host at `bytes`")
    page_bytes: int | None = None
    page_load_gbps: float | None = None
    page_backup_gbps: float | None = None
    device: str | None = None
