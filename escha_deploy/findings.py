"""Doctor findings: what ``doctor`` measured on this host, saved for ``plan`` and ``up``.

Saved as JSON at ``paths.doctor_findings_path()`` with the time and a host id. Read back through
a lenient path (unknown keys ignored) so an older or newer escha-deploy can still read it;
user-facing models are strict, stored data is not.

Used by the planner: ``pinned_ceiling_bytes`` (the largest pinned allocation that worked in one
process, which caps each rank's host pools under WSL2) and ``host_allocator`` (the allocator the
host-mapped store probe picked for the patched runtime). Plans made with ``--host-ram`` ignore
the findings (they describe another box).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .restore_bandwidth import RestoreBandwidth  # re-exported: the findings carry it

SCHEMA_VERSION = 1
MAX_AGE = _dt.timedelta(days=1)


class StoreProbeResult(BaseModel):
    """One case of the host-mapped store probe: can a GPU kernel store into this memory?"""

    # defer_build: the validator is built when findings are first read or written, not when a
    # plan of a described host imports this module (pydantic ``ConfigDict.defer_build``)
    model_config = ConfigDict(extra="ignore", defer_build=True)
    case: str = Field(description="device, torch_pinned, host_register_flags_0..3, pageable")
    ok: bool
    error: str | None = None
    method: str | None = Field(default=None, description="cupy (raw kernel) or torch (an elementwise kernel through "
                               "__cuda_array_interface__)")
    ran: bool = Field(default=True, description="False: the case could not run in that Python (torch or numpy "
                      "missing, no CUDA device visible to torch); its answer is unknown, never a failure")


class DoctorFindings(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    schema_version: int = SCHEMA_VERSION
    created_at: str = Field(description="ISO 8601 UTC time the probes ran")
    host_id: str = Field(description="host.host_id() of the machine that ran the probes")
    platform: Literal["linux", "wsl2"] | None = None
    store_probe: list[StoreProbeResult] = Field(default_factory=list)
    host_allocator: Literal["register", "pinned"] | None = Field(
        default=None,
        description="allocator the store probe picked: register when cudaHostRegister memory "
        "takes kernel stores, else pinned (cudaHostAlloc)",
    )
    pinned_ceiling_bytes: int | None = Field(
        default=None, description="largest pinned allocation (bytes) that worked in one process"
    )
    pinned_ceiling_reached: bool = Field(
        default=False,
        description="True when a larger pin failed (a real ceiling); False when the probe "
        "stopped at its target size without failing",
    )
    pinned_ceiling_target_bytes: int | None = Field(
        default=None, description="the target the pinned ladder stopped at when no pin failed"
    )
    pinned_ceiling_allocator: Literal["register", "pinned"] | None = None
    device_attributes: dict[str, int] = Field(
        default_factory=dict, description="cudaDevAttr values read by the store probe "
        "(CanUseHostPointerForRegisteredMem, ...)"
    )
    nccl_env: dict[str, str] = Field(default_factory=dict)
    nccl_smoke_ok: bool | None = Field(
        default=None, description="the all-reduce smoke test passed with nccl_env (None: not run)"
    )
    checks: list[dict] = Field(default_factory=list, description="the doctor report's checks")
    restore_bandwidth: RestoreBandwidth | None = Field(
        default=None, description="host <-> device GB/s the restore probe measured (plan's host_hit_cost)")

    def age(self, now: _dt.datetime | None = None) -> _dt.timedelta:
        now = now or _dt.datetime.now(_dt.timezone.utc)
        return now - _dt.datetime.fromisoformat(self.created_at)

    def is_fresh(self, now: _dt.datetime | None = None) -> bool:
        return self.age(now) < MAX_AGE


def load_findings(path: Path, host_id: str | None = None) -> DoctorFindings | None:
    """Read findings from ``path``; ``None`` when absent, unreadable, or from another host."""
    from .errors import BadInput
    from .jsonio import read_json

    try:
        data = read_json(path, "doctor's saved findings")
        findings = DoctorFindings.model_validate(data)
    except (BadInput, ValueError):
        return None
    if host_id is not None and findings.host_id != host_id:
        return None
    return findings


def save_findings(findings: DoctorFindings, path: Path) -> None:
    """Write findings atomically (write a temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(findings.model_dump_json(indent=2))
    tmp.replace(path)
