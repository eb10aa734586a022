"""Doctor's findings as a model: what ``doctor`` measured on a host (store probe, pinned ceiling,
host allocator, NCCL smoke test, restore bandwidth), saved for ``plan`` and ``up`` and carried
by a facts file's ``findings``. Pure: no I/O (``findings.load_findings``/``save_findings`` read
and write them).

Read leniently (unknown keys ignored) so an older or newer escha-deploy can still read saved
findings; user-facing models are strict, stored data is not.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..facts.restore_bandwidth import RestoreBandwidth

SCHEMA_VERSION = 1
#: The names ``nccl_env`` may hold: NCCL's variables (NCCL docs, "Environment Variables").
NCCL_VAR = re.compile(r"NCCL_[A-Z0-9_]+")
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
    """One host's findings (``host_id``), with when the probes ran (``created_at``, ISO 8601
    UTC). Bytes are ``int``."""

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
    nccl_env: dict[str, str] = Field(
        default_factory=dict, description="the NCCL environment the all-reduce smoke test first passed with "
        "(NCCL_* variables only, e.g. NCCL_P2P_DISABLE=1); the launch renders it")
    nccl_smoke_ok: bool | None = Field(
        default=None, description="the all-reduce smoke test passed with nccl_env (None: not run)"
    )
    checks: list[dict[str, Any]] = Field(default_factory=list, description="the doctor report's checks")
    restore_bandwidth: RestoreBandwidth | None = Field(
        default=None, description="host <-> device GB/s the restore probe measured (plan's host_hit_cost)")
    driver_version: str | None = Field(
        default=None, description="the NVIDIA driver the probes ran under (nvmlSystemGetDriverVersion; None: "
        "unknown, as in findings saved before it was recorded): findings older than a driver change are stale")

    @field_validator("nccl_env")
    @classmethod
    def _only_nccl_variables(cls, env: dict[str, str]) -> dict[str, str]:
        """The launch renders these into the server's environment: only NCCL's own variables
        (``NCCL_*``, NCCL docs "Environment Variables"), never another program's."""
        for name in env:
            if not NCCL_VAR.fullmatch(name):
                raise ValueError(f"{name!r} is not an NCCL variable (NCCL_ followed by capitals, digits, _)")
        return env

    def age(self, now: _dt.datetime | None = None) -> _dt.timedelta:
        """How long ago the probes ran (``now`` default: the current UTC time)."""
        now = now or _dt.datetime.now(_dt.timezone.utc)
        return now - _dt.datetime.fromisoformat(self.created_at)

    def driver_changed(self, driver_now: str | None) -> str | None:
        """Why these findings are stale for the driver loaded now (``driver_now``, NVML's), or
        None: a driver change (an update, a downgrade) can change what pins, registers and
        passes NCCL's transports, so what was measured under another driver is not a fact of
        this one. Unknown on either side (None) is not a change."""
        if self.driver_version and driver_now and self.driver_version != driver_now:
            return (f"measured under NVIDIA driver {self.driver_version}, and driver {driver_now} is loaded now: "
                    "stale; `escha-deploy doctor --fresh` measures again")
        return None

    def is_fresh(self, now: _dt.datetime | None = None, driver_now: str | None = None) -> bool:
        """Younger than ``MAX_AGE`` (one day) and measured under the driver loaded now
        (``driver_now``; None: not compared): ``plan`` and ``up`` use them without asking again."""
        return self.age(now) < MAX_AGE and self.driver_changed(driver_now) is None
