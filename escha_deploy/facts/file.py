"""The facts file's models (pure: no I/O): ``FactsFile`` with its ``host`` section
(``HostSection``: what the server's kernel reports), doctor's ``findings``
(``facts.findings.DoctorFindings``), one ``GpuRecord`` per GPU and the optional ``runtime``
(``facts.runtime.RuntimeFacts``). The GPU records are ``facts.gpus``'s, the same shape an NVML
inventory holds. ``factsfile`` reads and writes the file. Bytes are ``int``; types are strict (JSON's
own: an int is no string, no bool, no float).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from .findings import DoctorFindings
from .gpus import (MAX_FACT_BYTES, GpuIndexKey, GpuInventory, GpuRecord,  # noqa: F401 (re-exported)
                   inventory_from_records, records_from_inventory)
from .host import HostFacts, Platform
from .runtime import RuntimeFacts

#: The facts-file schema this escha-deploy reads and writes.
FACTS_SCHEMA_VERSION = 1


# HostSection and FactsFile are defer_build (pydantic ``ConfigDict.defer_build``): the
# facts-file validators are built only when a facts file is read or written. ``GpuRecord`` (the
# launch spec's GPU records too) is ``facts.gpus``'s, so a launch spec imports none of this.
class HostSection(BaseModel):
    """What the server's Linux kernel reports (``/proc/meminfo``, the cgroup files). Under
    WSL2 ``mem_total_bytes`` is the VM's MemTotal, not the Windows host's RAM."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, strict=True)
    platform: Literal["linux", "wsl2"]
    mem_total_bytes: StrictInt = Field(gt=0, le=MAX_FACT_BYTES, description="MemTotal (bytes)")
    hugetlb_bytes: StrictInt = Field(default=0, ge=0, le=MAX_FACT_BYTES,
                                     description="memory reserved as huge pages (bytes)")
    cgroup_limit_bytes: StrictInt | None = Field(
        default=None, gt=0, le=MAX_FACT_BYTES, description="the server's cgroup memory limit (bytes); null: none")
    host_id: StrictStr = Field(default="", description="host.host_id() of the described machine (not planned on)")
    # what a doctor report also says about the box (fleet's multi-node check reads it); left out
    # of the JSON when unknown, so a file without it reads and writes as before
    wsl_networking_mode: StrictStr | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="`wslinfo --networking-mode` (nat, mirrored, ...); null: not WSL2 or unknown")


def iso_time(value: str | None) -> str | None:
    """``value`` when it is an ISO 8601 date and time (``datetime.fromisoformat``, what
    ``facts.json`` writes: ``2026-12-07T10:00:00+00:00``) or None; else ``ValueError`` naming
    the shape (``yesterday`` said when the file was written no better than nothing)."""
    import datetime as _dt

    if value is None:
        return None
    try:
        _dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"expected an ISO 8601 date and time such as 2026-12-07T10:00:00+00:00 "
                         f"(got {value[:40]!r})") from None
    return value


class FactsFile(BaseModel):
    """The facts file (schema version ``FACTS_SCHEMA_VERSION``). ``escha_version`` and
    ``created_at`` say who wrote it and when; they are not facts and are not digested."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, strict=True)
    schema_version: int = FACTS_SCHEMA_VERSION
    escha_version: StrictStr | None = Field(default=None, description="the escha-deploy that wrote it")
    created_at: StrictStr | None = Field(default=None, description="ISO 8601 UTC time it was written")
    host: HostSection
    findings: DoctorFindings | None = Field(default=None, description="doctor's findings for this host")
    gpus: list[GpuRecord] = Field(default_factory=list, description="one record per GPU (NVML)")
    runtime: RuntimeFacts | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the box's runtime: SGLang release, capabilities, server image, each with its source "
        "(null or absent: not described)")

    @field_validator("created_at")
    @classmethod
    def _iso_time(cls, value: str | None) -> str | None:
        return iso_time(value)

    @field_validator("gpus")
    @classmethod
    def _one_record_per_index(cls, gpus: list[GpuRecord]) -> list[GpuRecord]:
        seen: set[int] = set()
        for g in gpus:
            if g.index in seen:
                raise ValueError(f"GPU index {g.index} is listed twice; one record per GPU")
            seen.add(g.index)
        return gpus

    def host_facts(self, *, platform: Platform | None = None, l3_checked: bool = False) -> HostFacts:
        """The planner's ``HostFacts`` of the host this file describes (source ``facts``): the
        host section, the findings' pinned ceiling, allocator and restore bandwidth, and the GPUs
        (``inventory_from_records``). ``platform`` overrides the file's (``--wsl2``/``--linux``);
        ``l3_checked``: the L3 directory was checked on the machine that plans (not a fact of the
        file)."""
        f = self.findings
        return HostFacts(
            source="facts", platform=platform or self.host.platform, mem_total_bytes=self.host.mem_total_bytes,
            hugetlb_bytes=self.host.hugetlb_bytes, cgroup_limit_bytes=self.host.cgroup_limit_bytes,
            host_id=self.host.host_id, pinned_ceiling_bytes=f.pinned_ceiling_bytes if f else None,
            pinned_ceiling_reached=f.pinned_ceiling_reached if f else False,
            host_allocator=f.host_allocator if f else None,
            nccl_env=dict(f.nccl_env) if f and f.nccl_smoke_ok else {},
            restore_bandwidth=f.restore_bandwidth if f else None, l3_checked=l3_checked,
            gpus=inventory_from_records(list(self.gpus)))

    @classmethod
    def from_host(cls, host: HostFacts, findings: DoctorFindings | None, gpus: Sequence[GpuRecord] = (), *,
                  escha_version: str | None = None, created_at: str | None = None,
                  runtime: RuntimeFacts | None = None) -> FactsFile:
        """The facts file describing ``host`` with ``findings``, ``gpus`` and ``runtime``;
        MemAvailable, cgroup usage and free disk are left out: they are readings of a moment,
        stale by the next start. ``escha_version``/``created_at``: who wrote it and when."""
        return cls(escha_version=escha_version, created_at=created_at,
                   host=HostSection(platform=host.platform, mem_total_bytes=host.mem_total_bytes,
                                    hugetlb_bytes=host.hugetlb_bytes, cgroup_limit_bytes=host.cgroup_limit_bytes,
                                    host_id=host.host_id),
                   findings=findings, gpus=list(gpus), runtime=runtime)


def facts_json_schema() -> dict[str, Any]:
    """The JSON schema of a facts file (schema version ``FACTS_SCHEMA_VERSION``), generated from
    the models: ``escha_deploy/catalog/facts.schema.json`` (``scripts/gen_facts_schema.py``) for
    hand-written files, editors and other tools. The loader checks more than the schema says
    (one record per GPU index, a release's source, a doctor report's conversion)."""
    schema = FactsFile.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema,
            "title": f"escha-deploy facts file, schema version {FACTS_SCHEMA_VERSION}"}
